"""The benchmark's numbers and tables: a timed run (`Run`), the statistics over repeats and prompts
(`metrics`, `summarise`: medians with their spread, α, γ̄, c, the verify pass's extra cost, Thm 3.8),
and the text tables `python -m specviz.cli.bench` prints.  No models here: `bench.py` times the runs.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

from ..core.rules import RULES
from .bench_hf import HF_CONFIGS

LLAMACPP = "llamacpp"  # the configuration name of specviz.cli.bench_llamacpp's runs


@dataclass
class Run:
    """One timed run of one configuration; the sums add up over prompts (see `merge`)."""

    tokens: int = 0
    seconds: float = 0.0
    decode_tokens: int = 0  # after the first round (transformers runs: all tokens, the whole call)
    decode_seconds: float = 0.0
    steps: int = 0  # standard: one-token decode steps, and their total time
    step_seconds: float = 0.0
    rounds: int = 0  # speculative: rounds, drafted / verified / accepted tokens, timings
    drafted: int = 0
    verified: int = 0
    accepted: int = 0
    draft_forwards: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0  # passes that fed only the round's tokens (not the prompt too)
    verify_rounds: int = 0
    tracing_seconds: float = 0.0
    stops: dict[str, int] = field(default_factory=dict)  # why drafting stopped, per round
    # Σ over rounds of each rule's exact expected kept tokens of the round's draft (specviz.core.rules),
    # and the rounds that kept the numbers for it: "same draft, three rules", from one run
    expected: dict[str, float] = field(default_factory=dict)
    expected_rounds: int = 0
    ids: list[int] = field(default_factory=list)

    @property
    def first_apart(self) -> bool:
        """Whether the run timed its first token (its prompt's pass; a speculative run's first round) apart:
        specviz's and llama.cpp's runs do, transformers' do not (decode_seconds is the whole call)."""
        return self.decode_seconds < self.seconds


def merge(runs: list[Run]) -> Run:
    """Sum runs (one per prompt): total tokens / total time is then the aggregate rate."""
    out = Run()
    for r in runs:
        for f in dataclasses.fields(Run):
            if f.name in ("stops", "expected"):
                mine = getattr(out, f.name)
                for k, v in getattr(r, f.name).items():
                    mine[k] = mine.get(k, 0) + v
            elif f.name != "ids":
                setattr(out, f.name, getattr(out, f.name) + getattr(r, f.name))
    return out


@dataclass
class Spread:
    median: float
    min: float
    max: float

    @classmethod
    def of(cls, values: list[float]) -> "Spread | None":
        return cls(statistics.median(values), min(values), max(values)) if values else None


def _rate(n: float, t: float) -> float:
    return n / t if t > 0 else 0.0


def thm38(alpha: float | None, gamma: float, c: float | None, verify: float = 1.0) -> float | None:
    """Leviathan et al. Thm 3.8: (1 − α^(γ+1)) / ((1 − α)(γc + 1)), with γ the mean draft length run.
    verify: the verify pass's cost in standard steps (the theorem assumes 1)."""
    if alpha is None or c is None or gamma <= 0:
        return None
    tokens = gamma + 1.0 if alpha >= 1.0 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return tokens / (gamma * c + verify)


def first_diff(a: list[int], b: list[int]) -> int | None:
    """0-based position of the first differing token, or None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def metrics(runs: list[Run], std: list[Run], hf_plain: list[Run] | None, greedy: bool) -> dict[str, Any]:
    """One configuration's numbers from its repeats, each paired with the standard run of the same repeat."""
    out: dict[str, Any] = {
        "tokens": runs[0].tokens,
        "tok_s": Spread.of([_rate(r.tokens, r.seconds) for r in runs]),
        "speedup": Spread.of([_rate(r.tokens, r.seconds) / _rate(s.tokens, s.seconds) for r, s in zip(runs, std)]),
    }
    if all(r.first_apart for r in runs):
        out["decode_tok_s"] = Spread.of([_rate(r.decode_tokens, r.decode_seconds) for r in runs])
        out["first_token_share"] = 1 - sum(r.decode_seconds for r in runs) / sum(r.seconds for r in runs)
    if hf_plain is not None:  # transformers' assisted generate against its own plain generate
        out["speedup_vs_hf_plain"] = Spread.of([_rate(r.tokens, r.seconds) / _rate(h.tokens, h.seconds)
                                                for r, h in zip(runs, hf_plain)])
    if greedy:
        diffs = [first_diff(r.ids, s.ids) for r, s in zip(runs, std)]
        out["greedy_equal"] = all(d is None for d in diffs)
        out["first_diff"] = next((d for d in diffs if d is not None), None)
    if not runs[0].rounds:  # not a speculative run
        return out
    tot = merge(runs)
    alpha = tot.accepted / tot.verified if tot.verified else None
    gbar = tot.drafted / tot.rounds
    # c: draft cost per forward (per drafted token for a drafter without forwards) over the
    # standard run's mean one-token decode step, both from the same repeat.
    c, verify = [], []
    for r, s in zip(runs, std):
        step = s.step_seconds / max(s.steps, 1)
        per = r.draft_seconds / (r.draft_forwards or r.drafted) if (r.draft_forwards or r.drafted) else 0.0
        c.append(per / step)
        verify.append(r.verify_seconds / max(r.verify_rounds, 1) / step - 1)
    c_med, v_med = statistics.median(c), statistics.median(verify)
    out.update(
        decode_speedup=Spread.of([_rate(r.decode_tokens, r.decode_seconds) / _rate(s.decode_tokens, s.decode_seconds)
                                  for r, s in zip(runs, std)]),
        alpha=alpha,
        mean_draft_length=gbar,
        mean_accepted_length=1 + tot.accepted / tot.rounds,
        # each rule's expected accepted length on the drafts this run made (exact given each draft;
        # rounds that drafted nothing count as 1): "same draft, three rules"
        same_draft_mal={rule: 1 + e / tot.rounds for rule, e in tot.expected.items()} or None,
        c=Spread.of(c),
        verify_extra=Spread.of(verify),
        theory=thm38(alpha, gbar, c_med),
        theory_with_verify=thm38(alpha, gbar, c_med, 1 + v_med),
        draft_stops=dict(sorted(tot.stops.items(), key=lambda kv: -kv[1])),
        tracing_overhead=tot.tracing_seconds / tot.seconds if tot.seconds else None,
    )
    return out


def summarise(runs: dict[str, list[Run]], greedy: bool) -> dict[str, dict[str, Any]]:
    std, plain = runs["standard"], runs.get("hf_plain")
    # standard_bf16 runs another model (the target in bf16): its text is not expected to match
    return {cfg: metrics(rs, std, plain if cfg in ("hf_same", "hf_default") else None,
                         greedy and cfg not in ("standard", BF16_BASELINE))
            for cfg, rs in runs.items()}


# ---- the benchmark ----------------------------------------------------------------


BF16_BASELINE = "standard_bf16"


def run_json(r: Run) -> dict[str, Any]:
    d: dict[str, Any] = {"tokens": r.tokens, "seconds": r.seconds, "tok_s": _rate(r.tokens, r.seconds)}
    if r.first_apart:
        d["decode_tok_s"] = _rate(r.decode_tokens, r.decode_seconds)
    if r.rounds:
        d["draft_stops"] = r.stops
    return d


# ---- tables -----------------------------------------------------------------------


def _num(v: Any, fmt: str = "{:.2f}", suffix: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, Spread):
        return f"{fmt.format(v.median)}{suffix} [{fmt.format(v.min)}-{fmt.format(v.max)}]"
    return fmt.format(v) + suffix


def _greedy(m: dict[str, Any]) -> str:
    if "greedy_equal" not in m:
        return "-"
    if "greedy_equal_prompts" in m:  # an aggregate: on how many prompts the text matched
        return "yes" if m["greedy_equal"] else f"{m['greedy_equal_prompts']}"
    return "yes" if m["greedy_equal"] else f"no@{m['first_diff']}"


def _stops(m: dict[str, Any]) -> str:
    return " ".join(f"{k}:{v}" for k, v in m.get("draft_stops", {}).items())


SPEC_COLUMNS: list[tuple[str, Callable[[dict], str]]] = [
    ("spec tok/s", lambda m: _num(m["tok_s"])),
    ("speedup", lambda m: _num(m["speedup"], suffix="x")),
    ("decode", lambda m: _num(m["decode_speedup"].median, suffix="x")),
    ("theory", lambda m: _num(m["theory"], suffix="x")),
    ("w/ verify", lambda m: _num(m["theory_with_verify"], suffix="x")),
    ("alpha", lambda m: _num(m["alpha"])),
    ("γ̄", lambda m: _num(m["mean_draft_length"])),
    ("c", lambda m: _num(m["c"].median, "{:.3f}")),
    ("verify+", lambda m: _num(m["verify_extra"].median, "{:+.0%}")),
    ("greedy=", _greedy),
]


LEGEND = [
    "decode: speedup after the first round (which also reads the prompt); theory: Thm 3.8 from alpha, the mean draft length run (γ̄) "
    "and c; w/ verify: the same with the measured verify cost",
    "c: draft forward / standard one-token step; verify+: the verify pass's extra time over that step; "
    "values: median [min-max] over the repeats; ALL = total tokens / total time",
]


def table(rows: list[tuple[str, list[str]]], headers: list[str]) -> str:
    widths = [max(len(h), *(len(cells[i]) for _, cells in rows)) for i, h in enumerate(headers)]
    name_w = max(6, *(len(name) for name, _ in rows))

    def line(name: str, cells: list[str]) -> str:
        return "  ".join([name.ljust(name_w)] + [c.rjust(w) for c, w in zip(cells, widths)])

    out = [line("", headers), "-" * len(line("", headers))]
    out += [line(name, cells) for name, cells in rows]
    return "\n".join(out)


def prompt_table(prompts: list[dict[str, Any]], agg: dict[str, Any], spec: str, hf: list[str]) -> str:
    headers = ["std tok/s"] + [h for h, _ in SPEC_COLUMNS] + [f"{h} tok/s (x std)" for h in hf]
    rows = []
    for name, m in [(p["name"][:24], p["configs"]) for p in prompts] + [("ALL", agg)]:
        cells = [_num(m["standard"]["tok_s"])] + [f(m[spec]) for _, f in SPEC_COLUMNS]
        cells += [f"{_num(m[h]['tok_s'])} ({_num(m[h]['speedup'].median, suffix='x')})" for h in hf]
        rows.append((name, cells))
    return table(rows, headers)


def _label(config: str) -> str:
    return config.removeprefix("spec-").replace("chain-", "chain ")


def _same_draft(m: dict[str, Any]) -> str:
    e = m.get("same_draft_mal") or {}
    return "/".join(f"{e[r]:.2f}" for r in RULES) if set(e) == set(RULES) else "-"


def policy_table(agg: dict[str, Any], configs: list[str]) -> str:
    """One row per speculative configuration ("spec-…", "chain-…")."""
    headers = [h for h, _ in SPEC_COLUMNS] + ["MAL", "same draft " + "/".join(RULES), "draft stops"]
    rows = [(_label(c), [f(agg[c]) for _, f in SPEC_COLUMNS] + [_num(agg[c]["mean_accepted_length"]),
                                                                 _same_draft(agg[c]), _stops(agg[c])])
            for c in configs]
    return table(rows, headers)


def rate_table(prompts: list[dict[str, Any]], agg: dict[str, Any], configs: list[str]) -> str:
    """tok/s (median) of every configuration on every prompt: who wins where."""
    rows = [(name, [_num(m[c]["tok_s"]) for c in configs])
            for name, m in [(p["name"][:24], p["configs"]) for p in prompts] + [("ALL", agg)]]
    return table(rows, [_label(c) for c in configs])


def baseline_lines(agg: dict[str, Any]) -> list[str]:
    out = [f"standard (specviz): {_num(agg['standard']['tok_s'])} tok/s"]
    best = max((c for c in agg if c.startswith(("spec-", "chain-"))), key=lambda c: agg[c]["tok_s"].median,
               default=None)  # the best speculative configuration, which the baselines below are set against
    if BF16_BASELINE in agg:
        bf16 = agg[BF16_BASELINE]["tok_s"].median
        out.append(f"{BF16_BASELINE} (the target in bf16): {_num(agg[BF16_BASELINE]['tok_s'])} tok/s; standard on the "
                   f"chosen execution is {agg['standard']['tok_s'].median / bf16:.2f}x it"
                   + (f", the best speculative configuration ({_label(best)}) {agg[best]['tok_s'].median / bf16:.2f}x"
                      if best else ""))
    if LLAMACPP in agg:
        lc = agg[LLAMACPP]["tok_s"].median
        out.append(f"{LLAMACPP} (plain decoding of the same GGUF): {_num(agg[LLAMACPP]['tok_s'])} tok/s; specviz's "
                   f"standard is {agg['standard']['tok_s'].median / lc:.2f}x it"
                   + (f", its best speculative configuration ({_label(best)}) {agg[best]['tok_s'].median / lc:.2f}x"
                      if best else "")
                   + (f"; greedy text equal to specviz's standard on {agg[LLAMACPP]['greedy_equal_prompts']} prompts"
                      if "greedy_equal_prompts" in agg[LLAMACPP] else ""))
        if best and all("decode_tok_s" in agg[c] for c in (LLAMACPP, "standard", best)):
            lc_dec = agg[LLAMACPP]["decode_tok_s"].median
            out.append(f"after the prompt's pass (the first token; a speculative run's first round, which also drafts and "
                       f"verifies: {agg[LLAMACPP]['first_token_share']:.0%} of llama.cpp's time, "
                       f"{agg['standard']['first_token_share']:.0%} of standard's, "
                       f"{agg[best]['first_token_share']:.0%} of {_label(best)}'s): {LLAMACPP} "
                       f"{_num(agg[LLAMACPP]['decode_tok_s'])} tok/s; specviz's standard "
                       f"{agg['standard']['decode_tok_s'].median / lc_dec:.2f}x it, {_label(best)} "
                       f"{agg[best]['decode_tok_s'].median / lc_dec:.2f}x")
    for h in HF_CONFIGS:
        if h in agg:
            vs = f", {_num(agg[h]['speedup_vs_hf_plain'], suffix='x')} vs hf_plain" if h != "hf_plain" else ""
            out.append(f"{h}: {_num(agg[h]['tok_s'])} tok/s, {_num(agg[h]['speedup'], suffix='x')} vs standard{vs}"
                       + (f", greedy= {_greedy(agg[h])}" if "greedy_equal" in agg[h] else ""))
    return out


# ---- command line -----------------------------------------------------------------
