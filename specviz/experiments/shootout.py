"""The drafter shoot-out: one prompt and one set of settings, run with every drafter, then
standard decoding, with the numbers that compare them.  Plain generators, no UI.

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
from ..drafters import DRAFTERS
from ..models import ModelError
from ..serving.service import describe_error
from ..serving.sweep_budget import within
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
    trace: Any = field(default=None, repr=False, compare=False)  # the run's Trace (kept, not serialised)

    def as_dict(self) -> dict[str, Any]:
        """The metrics as plain JSON values (the recording's row), without the trace."""
        return {k: v for k, v in self.__dict__.items() if k != "trace"}


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
        if key == "model":
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


def compare(rows: list[Row]) -> list[Row]:
    """Fill speedup and same_text against the standard row (once it has run)."""
    std = next((r for r in rows if r.key == STANDARD and not r.error and r.trace is not None), None)
    if std is None or not std.tokens_per_s:
        return rows
    std_ids = [t.id for t in std.trace.tokens]
    for r in rows:
        if r.error or r.trace is None:
            continue
        r.speedup = (r.tokens_per_s or 0.0) / std.tokens_per_s
        r.same_text = [t.id for t in r.trace.tokens] == std_ids
    return rows


def run(req: Any, contenders: list[Contender] | None = None,
        should_stop: Callable[[], bool] = lambda: False) -> Iterator[tuple[float, str, list[Row]]]:
    """Run each contender in turn on the request's pair and prompt.  Yields (fraction done,
    message, rows so far) before each run and after it; the rows end with standard decoding,
    and the speedups are filled in once it has run.

    `should_stop` (the sweep's time budget, specviz.serving.sweep_budget) is checked before each
    contender but the first and passed to the decodes: a run it cuts short is dropped (its
    numbers are not comparable with the others') and the shoot-out ends with the rows it finished."""
    contenders = contenders if contenders is not None else lineup(req.settings)
    rows: list[Row] = []
    n = len(contenders)
    # Untimed first: the first drafter would otherwise pay the pair's one-time costs (see warm_up).
    yield 0.0, WARMING_UP, rows
    warm_up(req, [c.settings for c in contenders if c.key != STANDARD])
    for k, c in enumerate(within(contenders, should_stop)):
        yield k / n, f"{c.label} ({k + 1}/{n})…", rows
        try:
            if c.key == STANDARD:
                tr = standard_decode(req.pair, req.prompt_ids, c.settings, prompt=req.prompt, should_stop=should_stop)
            else:
                tr = speculative_decode(req.pair, req.prompt_ids, c.settings, prompt=req.prompt,
                                        should_stop=should_stop)
            if tr.stop_reason == "stopped":  # cut short (the budget): not a result
                return
            row = _row(c, tr)
            msg = f"{c.label}: {row.tokens_per_s:.2f} tok/s"
        except (ModelError, SettingsError) as exc:  # cannot run for this pair: say why, go on
            row, msg = Row(c.key, c.label, policy=c.settings.policy, error=str(exc)), f"{c.label}: did not run"
        except Exception as exc:  # a failure in one drafter should not lose the others' results
            log.exception("shoot-out: %s failed", c.key)
            row, msg = Row(c.key, c.label, policy=c.settings.policy, error=describe_error(exc)), f"{c.label}: failed"
        rows.append(row)
        yield (k + 1) / n, msg, compare(rows)
