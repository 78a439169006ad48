"""The drafter shoot-out: one prompt and one set of settings, run with every drafter, then
standard decoding, with the numbers that compare them.  Plain generators, no UI.

Every contender runs `repeats` times, round-robin with standard decoding (specviz.experiments.repeats);
a row reports the median of its repeats with their range.

Every drafter runs exactly (ε = 0, Decoding-OPT), with the form's prompt, γ, temperature, top-p,
token budget and seed, so the texts are comparable and only the drafting differs:

- the draft model as a chain, under CHAIN_POLICY (confidence: the best policy in the README's
  benchmark on this CPU, and transformers' own default rule);
- prompt lookup and the learned head under the constant policy (their drafts cost next to
  nothing, so there is no cost to save by stopping early; the head drafts at most 4 anyway);
- the draft model's token tree with the default tree settings under TREE_POLICY (adaptive: on
  this CPU it grows deep, narrow trees where the draft is sure and adds siblings where it is not,
  and beat every chain policy on the low-acceptance prompts; see the README).

A drafter that cannot run for the loaded pair (the learned head has weights for one target only)
gets a row that says why instead of ending the shoot-out.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

from ..core.engine import speculative_decode, standard_decode
from ..core.settings import GAMMA_MAX, DecodeSettings, SettingsError
from ..drafters import DRAFTERS, make_drafter
from ..models import ModelError
from ..serving.service import describe_error, probe_prices
from .repeats import REPEATS, Spread, noisy, round_robin
from .sweeps import WARMING_UP, warm_up

log = logging.getLogger("specviz.shootout")
CHAIN_POLICY = "confidence"  # the draft model's policy in the shoot-out (say so wherever it is shown)
TREE_POLICY = "adaptive"  # the token tree's policy in the shoot-out (shown in its label and row)
STANDARD = "standard"


@dataclass(frozen=True)
class Contender:
    """One line of the shoot-out: a drafter and the settings it runs with."""

    key: str  # a drafter name (specviz.drafters.DRAFTERS), or "standard"
    label: str  # what the table calls it
    settings: DecodeSettings


@dataclass
class Row:
    """One contender's result: the metrics (None where they do not apply), or why it did not run."""

    key: str
    label: str
    policy: str = ""
    alpha: float | None = None  # accepted / verified drafts
    mean_accepted_length: float | None = None  # tokens per target pass (1 + accepted / rounds)
    c: float | None = None  # drafting time per draft token ÷ a target forward pass
    tokens_per_s: float | None = None
    speedup: float | None = None  # tok/s ÷ standard decoding's tok/s
    mean_draft_length: float | None = None
    tokens: int | None = None
    target_forwards: int | None = None
    same_text: bool | None = None  # the same tokens as standard decoding (greedy: should be, up to rounding)
    error: str = ""  # why this contender did not run ("" when it ran)
    # Over the repeats (tokens_per_s, speedup and c are then their medians): the range of tok/s and of the
    # speedup (min, max), how many repeats ran, and how many of them the timing judge flagged.
    tokens_per_s_lo: float | None = None
    tokens_per_s_hi: float | None = None
    speedup_lo: float | None = None
    speedup_hi: float | None = None
    repeats: int | None = None
    noisy: int | None = None
    trace: Any = field(default=None, repr=False, compare=False)  # the median repeat's Trace (kept, not serialised)
    baseline: Any = field(default=None, repr=False, compare=False)  # the standard Trace of that repeat's round

    def as_dict(self) -> dict[str, Any]:
        """The metrics as plain JSON values (the recording's row), without the traces."""
        return {k: v for k, v in self.__dict__.items() if k not in ("trace", "baseline")}


def cost_ratio(trace: Any) -> float | None:
    """c: a draft token's cost in target forward passes.  From the draft forward passes when the
    drafter has them; a drafter with none (prompt lookup) is charged its drafting time per drafted
    token instead, which is what γ·c stands for in Leviathan et al.'s Thm 3.8."""
    s = trace.summary() if trace else None
    if s is None:
        return None
    if s.c is not None:
        return s.c
    drafted, t_target = s.drafted or 0, s.t_target_forward
    if drafted and t_target:
        return sum(r.t_draft for r in trace.rounds) / drafted / t_target
    return None


def lineup(base: DecodeSettings) -> list[Contender]:
    """The contenders for the form's settings: every drafter in DRAFTERS, then standard decoding."""
    common = replace(base, epsilon=0.0, variant="opt")  # exact for all: only the drafting differs
    fixed_gamma = min(base.gamma, GAMMA_MAX)  # the constant policy's range
    out = []
    for key, (label, _) in DRAFTERS.items():
        if key in ("model", "hybrid"):
            s = replace(common, drafter=key, policy=CHAIN_POLICY)
            label = f"{label} ({CHAIN_POLICY}, τ = {s.tau:g})"
        elif key == "tree":
            d = DecodeSettings()  # the default tree: mode, branches and node budget
            s = replace(common, drafter=key, policy=TREE_POLICY, branches=d.branches, tree_nodes=d.tree_nodes,
                        tree_mode=d.tree_mode)
            label = f"{label} ({d.tree_mode}, M = {d.branches}, ≤ {d.tree_nodes} nodes, {TREE_POLICY})"
        else:
            s = replace(common, drafter=key, policy="constant", gamma=fixed_gamma)
        out.append(Contender(key, label, s))
    out.append(Contender(STANDARD, "standard decoding", replace(common, policy="constant", gamma=fixed_gamma)))
    return out


def _row(c: Contender, trace: Any) -> Row:
    s = trace.summary()
    row = Row(c.key, c.label, policy="" if c.key == STANDARD else c.settings.policy, tokens=s.tokens,
              tokens_per_s=s.tokens_per_s, target_forwards=s.target_forwards, trace=trace)
    if c.key == STANDARD:
        row.mean_accepted_length, row.speedup = 1.0, 1.0  # one token per target pass, by definition
    else:
        row.alpha, row.mean_accepted_length = s.alpha, s.mean_accepted_length
        row.mean_draft_length, row.c = s.mean_draft_length, cost_ratio(trace)
    return row


def compare(rows: list[Row], std: Row | None = None) -> list[Row]:
    """Fill speedup and same_text against the standard row (`std`, else the rows' own, once it has run)."""
    std = std or next((r for r in rows if r.key == STANDARD and not r.error and r.trace is not None), None)
    if std is None or std.error or std.trace is None or not std.tokens_per_s:
        return rows
    std_ids = [t.id for t in std.trace.tokens]
    for r in rows:
        if r.error or r.trace is None:
            continue
        r.speedup = (r.tokens_per_s or 0.0) / std.tokens_per_s
        r.same_text = [t.id for t in r.trace.tokens] == std_ids
        r.baseline = std.trace
    return rows


def combine(reps: list[Row], flags: list[bool]) -> Row:
    """One contender's row from its repeats: the median repeat's row (by speedup, else tok/s; of an even
    number the lower one), with the medians of tok/s, speedup and c, their range, and the repeats flagged.
    The kept trace is that repeat's, with the standard run of its own round (`baseline`)."""
    ran = [r for r in reps if not r.error]
    if not ran:  # it did not run: the row that says why
        return reps[0]
    key = (lambda r: r.speedup) if all(r.speedup is not None for r in ran) else (lambda r: r.tokens_per_s or 0.0)
    row = replace(sorted(ran, key=key)[(len(ran) - 1) // 2])
    for name in ("tokens_per_s", "speedup", "c"):
        s = Spread.of(getattr(r, name) for r in ran)
        setattr(row, name, None if s is None else s.median)
        if s is not None and name != "c" and not (row.key == STANDARD and name == "speedup"):
            setattr(row, f"{name}_lo", s.lo)
            setattr(row, f"{name}_hi", s.hi)
    same = [r.same_text for r in ran]
    row.same_text = None if any(x is None for x in same) else all(same)
    row.repeats, row.noisy = len(ran), sum(bool(f) for f in flags)
    return row


def run(req: Any, contenders: list[Contender] | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        repeats: int = REPEATS) -> Iterator[tuple[float, str, list[Row]]]:
    """Run every contender `repeats` times on the request's pair and prompt, round-robin
    (specviz.experiments.repeats): standard decoding, then each drafter, then all again.  Each
    repeat's speedup is divided by its own round's standard run; a row is the median of its
    repeats with their range.  Yields (fraction done, message, rows so far) before each run and after
    it; the rows are in the contenders' order (standard decoding last).

    A contender that cannot run (ModelError, SettingsError) or fails gets a row that says why and is
    not tried again.  `should_stop` (the sweep's time budget, specviz.serving.sweep_budget) is
    checked before each run but the first and passed to the decodes: a run it cuts short is dropped
    (its numbers are not comparable with the others') and the shoot-out ends with the repeats it
    finished."""
    contenders = contenders if contenders is not None else lineup(req.settings)
    order = sorted(contenders, key=lambda c: c.key != STANDARD)  # the baseline first in every round
    reps: dict[str, list[Row]] = {c.key: [] for c in contenders}
    flags: dict[str, list[bool]] = {c.key: [] for c in contenders}
    failed: set[str] = set()
    std_of: dict[int, Row] = {}
    prices = probe_prices(getattr(req, "pair", None))
    n, total = len(contenders), len(contenders) * repeats

    def rows() -> list[Row]:
        return [combine(reps[c.key], flags[c.key]) for c in contenders if reps[c.key]]

    # Untimed first: the first drafter would otherwise pay the pair's one-time costs (see warm_up).
    yield 0.0, WARMING_UP, []
    warm_up(req, [c.settings for c in contenders if c.key != STANDARD])
    for i, (r, c) in enumerate(round_robin(order, repeats, should_stop)):
        if c.key in failed:
            continue
        k = order.index(c)
        rep = f", repeat {r + 1}/{repeats}" if repeats > 1 else ""
        yield i / total, f"{c.label} ({k + 1}/{n}{rep})…", rows()
        try:
            if c.key == STANDARD:
                tr = standard_decode(req.pair, req.prompt_ids, c.settings, prompt=req.prompt, should_stop=should_stop)
            else:
                tr = speculative_decode(req.pair, req.prompt_ids, c.settings, prompt=req.prompt,
                                        drafter=make_drafter(req.pair, c.settings), should_stop=should_stop)
            if tr.stop_reason == "stopped":  # cut short (the budget): not a result
                return
            row = _row(c, tr)
            msg = f"{c.label}: {row.tokens_per_s:.2f} tok/s"
        except (ModelError, SettingsError) as exc:  # cannot run for this pair: say why, go on
            row, msg = Row(c.key, c.label, policy=c.settings.policy, error=str(exc)), f"{c.label}: did not run"
        except Exception as exc:  # a failure in one drafter should not lose the others' results
            log.exception("shoot-out: %s failed", c.key)
            row, msg = Row(c.key, c.label, policy=c.settings.policy, error=describe_error(exc)), f"{c.label}: failed"
        if row.error:
            failed.add(c.key)
            if reps[c.key]:  # it ran before: keep the repeats it finished
                yield (i + 1) / total, msg, rows()
                continue
        if c.key == STANDARD:
            row.same_text = None if row.error else True  # standard decoding's own text, by definition
            std_of[r] = row
            flags[c.key].append(not row.error and noisy(None, row.trace, prices))
        elif not row.error:
            compare([row], std_of.get(r))
            flags[c.key].append(noisy(row.trace, row.baseline, prices))
        reps[c.key].append(row)
        yield (i + 1) / total, msg, rows()
    ran = sum(1 for c in contenders if any(not r.error for r in reps[c.key]))
    yield 1.0, f"{ran} of {n} ran" + (f", {repeats} repeats each" if repeats > 1 else ""), rows()
