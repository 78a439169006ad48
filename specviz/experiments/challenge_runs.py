"""What the workshop challenges check: a learner's run (a speculative trace and the standard run it raced),
a check's verdict, what a check may need beyond the runs, and the readings every check shares.

Pure Python over traces (no Gradio, no models, no torch).  The checks are in
`specviz.experiments.challenge_checks`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ..theory.figures import run_figures
from ..theory.timing import flagged
from ..trace import Trace

MIN_ROUNDS = 3  # a timed race needs a few rounds to say anything
DRAFTER_WORDS = {"model": "draft model", "prompt-lookup": "prompt lookup", "tree": "token tree",
                 "speculator": "learned head", "hybrid": "draft model + prompt lookup"}
CLEAN_ENDS = ("eos", "max_new_tokens")  # a run that ran to its end (not stopped, cut by time, failed)


@dataclass(frozen=True, kw_only=True)
class Run:
    """One run a learner made: the speculative trace and the standard run it raced (None when absent)."""

    spec: Trace | None
    std: Trace | None = None


@dataclass(frozen=True, kw_only=True)
class Verdict:
    passed: bool
    message: str


@dataclass(frozen=True, kw_only=True)
class Given:
    """What a check may need beyond the runs: the machine challenge's answer (a key of MACHINE_BANDS) and
    this machine's probed verify-cost curves, {(preset, execution): {tokens fed: ms}}, when known."""

    answer: str | None = None
    probe_curves: Mapping[tuple[str, str], Mapping[int, float]] = field(default_factory=dict)


# ---- reading runs -------------------------------------------------------------------------------


def speculative(runs: Sequence[Run]) -> list[Run]:
    """The runs with a speculative trace that has rounds, newest first."""
    return [r for r in reversed(list(runs)) if r.spec is not None and r.spec.kind == "speculative" and r.spec.rounds]


def describe(run: Run) -> str:
    """A run in a few words: “Explain in three…” (draft model, γ = 5, T = 0.7)."""
    spec = run.spec
    s = spec.settings
    prompt = " ".join(spec.prompt.split())
    prompt = prompt if len(prompt) <= 28 else prompt[:27] + "…"
    what = DRAFTER_WORDS.get(s.drafter, s.drafter)
    if s.drafter == "tree":
        what += f" M = {s.branches}, ≤ {s.tree_nodes} nodes, depth"
    extra = f", ε = {s.epsilon:g}" if s.epsilon else ""
    return f"“{prompt}” ({what} γ = {s.gamma}, T = {s.temperature:g}{extra})"


def speedup(run: Run) -> float | None:
    """The speedup the race's headline quotes (specviz.theory.figures: speculative tok/s ÷ standard tok/s), None
    without a standard run.  A race whose timings were flagged (specviz.theory.timing: the machine was busy) is
    judged by its count-based speedup instead, or not at all when it has none: its clocks are never credited."""
    return run_figures(run.spec, run.std).speedup if run.std is not None else None


def count_based(run: Run) -> str:
    """What the messages add after a flagged race's speedup."""
    return " (count-based: the machine was busy during that race, so its clocks were not used)" \
        if flagged(run.spec) else ""


def not_timed(runs: Sequence[Run], what: str) -> Verdict:
    """No race to judge: say so, and say it plainly when the only races there are were flagged."""
    busy = [r for r in speculative(runs) if flagged(r.spec) and r.std is not None and len(r.spec.rounds) >= MIN_ROUNDS]
    if busy:
        t = busy[0].spec.timing
        return Verdict(passed=False, message=(
            f"Your race {describe(busy[0])} was timed while the machine was busy (timings ±{t.spread:.0%}: {t.why}), "
            "so it cannot be credited. Run it again when the machine is quieter."))
    return none_yet(what)


def raced(runs: Sequence[Run]) -> list[Run]:
    """Speculative runs with a standard run, both run to their end, with a few rounds: newest first."""
    return [r for r in speculative(runs) if r.std is not None and r.std.rounds and speedup(r) is not None
            and r.spec.stop_reason in CLEAN_ENDS and r.std.stop_reason in CLEAN_ENDS
            and len(r.spec.rounds) >= MIN_ROUNDS]


def is_chain(spec: Trace) -> bool:
    return spec.settings.drafter != "tree" and all(r.tree is None for r in spec.rounds)


def none_yet(what: str) -> Verdict:
    return Verdict(passed=False, message=f"None of your runs {what} yet.")


def tokens_text(x: float) -> str:
    """Tokens fed, as the messages write them: 6, 5.3."""
    return f"{x:.1f}".removesuffix(".0")


__all__ = ["CLEAN_ENDS", "DRAFTER_WORDS", "MIN_ROUNDS", "Given", "Run", "Verdict", "describe", "is_chain",
           "none_yet", "raced", "speculative", "speedup", "tokens_text"]
