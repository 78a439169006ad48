"""One truth per quantity: a run's derived figures, computed once, read by every panel.

A race (a speculative run and the standard run it raced) gives the page a handful of derived numbers:
the verify factor v, the draft cost c, the acceptance α, its speedup twice (by the wall clock and by
counts priced at the probe's costs) with the rule that picks the one to trust, and the best γ under the
costs it quotes.  Each panel used to compute its own (the headline quoted the probe's v = 2.6 for a busy
race while the metrics table gave the race's own 2.4 and the Theory tab 2.38, the Theory marker the wall
clock's 0.83× beside a headline's count-based 0.87×); now `run_figures` computes them and the headline,
the metrics table, the speedup bars, the Theory tab, This machine, the challenges, the class point and the
exported page all read them.

The rule (specviz.theory.timing): a race whose clocks held quotes what they measured (v, c, the wall
clock's speedup); a race whose clocks were flagged quotes the probe's v and c for its passes and its
count-based speedup (none when it has no count-based one: its clocks are never quoted).  A race cut short
by Stop (or a closed page) gives no speedup: its two sides stopped at different points of their texts.

No UI and no models: plain functions of traces.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from ..core.settings import GAMMA_MAX
from ..trace import Trace, theoretical_speedup
from ..trace.timing import Timing
from .costs import RaceCosts, race_costs, steps
from .timing import flagged

# Best γ is sought over the draft lengths the page's constant policy may run (the Theory tab's γ axis).
BEST_GAMMA_MAX = GAMMA_MAX
CUT = ("stopped",)  # stop reasons of a race cut short: no speedup
# How the Theory tab's sliders hold a run's α, c and v: (low, high, decimals).  A run's best γ is taken at these
# values, so "Use last run" puts the sliders where the run's γ* is the sliders' γ* (near its optimum Thm 3.8 is
# flat: α = 0.963 gave γ* = 14 and the slider's 0.96 gave 13).
THEORY_POINT = {"alpha": (0.0, 0.99, 2), "c": (0.0, 1.0, 3), "v": (0.5, 8.0, 2)}


def theory_point(name: str, x: float) -> float:
    """A run's α, c or v as the Theory tab's slider holds it (clamped to its range, rounded to its step)."""
    lo, hi, decimals = THEORY_POINT[name]
    return round(min(max(float(x), lo), hi), decimals)


def best_gamma(alpha: float | None, c: float | None, v: float | None = 1.0) -> tuple[int, float] | None:
    """(γ*, its expected speedup): Thm 3.8 with verify factor v maximised over γ = 1…BEST_GAMMA_MAX;
    None when α or c is unknown (v unknown counts as the textbook's 1).  The Theory tab's note and star, the
    "Last run" line and This machine's sentence on the last run all take it from here."""
    if alpha is None or c is None:
        return None
    a, cc, vv = min(max(float(alpha), 0.0), 1.0), max(float(c), 0.0), float(v) if v else 1.0
    # specviz.theory.formulas.optimal_gamma's search (ties keep the smaller γ), without its torch import
    best_g, best_s = 1, theoretical_speedup(a, 1, cc, vv) or 0.0
    for g in range(2, BEST_GAMMA_MAX + 1):
        s = theoretical_speedup(a, g, cc, vv) or 0.0
        if s > best_s * (1 + 1e-12):
            best_g, best_s = g, s
    return best_g, best_s


@dataclass(frozen=True)
class RunFigures:
    """A run's derived quantities, as every panel quotes them."""

    costs: RaceCosts | None  # the race's own clocks (specviz.theory.costs.race_costs)
    quoted: RaceCosts | None  # the cost model the page quotes: ``costs``, or at the probe's v and c when flagged
    clock: float | None  # speculative tok/s ÷ standard tok/s, by the wall clock
    counts: float | None  # the count-based speedup (the race's counts at the probe's costs), when it has one
    flagged: bool  # the race's clocks were found unreliable (specviz.theory.timing)
    cut: bool  # a side was stopped before its end (Stop, a closed page)
    timing: Timing | None = None  # the race's assessment (its limit's v and c among them)

    @property
    def alpha(self) -> float | None:
        return self.costs.alpha if self.costs is not None else None

    @property
    def v(self) -> float | None:
        """The verify factor the page quotes (standard steps a verify pass costs); None: unknown."""
        return self.quoted.v if self.quoted is not None else None

    @property
    def v_measured(self) -> float | None:
        """The race's own clocks' v (differs from ``v`` only for a flagged race)."""
        return self.costs.v if self.costs is not None else None

    @property
    def v_source(self) -> Literal["measured", "probed"] | None:
        """Where the quoted v comes from: this race's clocks, or this machine's probe (a flagged race)."""
        if self.v is None:
            return None
        return "probed" if self.flagged else "measured"

    @property
    def c(self) -> float | None:
        """A draft token's cost: per standard step when a standard run measured one, else per verify pass."""
        q = self.quoted
        if q is None:
            return None
        return q.c if q.t_step else q.c_verify

    @property
    def c_per_step(self) -> bool:
        """Whether ``c`` is per standard step (else per verify pass: no standard run)."""
        return self.quoted is not None and bool(self.quoted.t_step)

    @property
    def speedup(self) -> float | None:
        """The speedup the page quotes and judges by: the wall clock's, or the count-based one for a flagged
        race (None when it has none, or when the race was cut short)."""
        if self.cut:
            return None
        return self.counts if self.flagged else self.clock

    @property
    def speedup_by(self) -> Literal["clock", "counts"] | None:
        if self.speedup is None:
            return None
        return "counts" if self.flagged else "clock"

    @property
    def best(self) -> tuple[int, float] | None:
        """(γ*, expected speedup) under the quoted α, c and v (v unknown: the textbook's 1), taken at the values
        the Theory tab's sliders hold them at (`theory_point`), so that tab's γ* is this one."""
        if self.alpha is None or self.c is None:
            return None
        return best_gamma(theory_point("alpha", self.alpha), theory_point("c", self.c),
                          theory_point("v", self.v) if self.v is not None else None)

    @property
    def textbook(self) -> float | None:
        return self.quoted.textbook if self.quoted is not None else None

    @property
    def limit(self) -> tuple[float, float, float] | None:
        """(speedup, v, c) of Thm 3.8 at this machine's limit: this race's α and γ, its verify passes at the
        roofline and the draft at its bandwidth bound (Trace.timing's v_limit, c_limit); None where unmeasured."""
        timing, q = self.timing, self.quoted
        if timing is None or q is None or timing.v_limit is None or timing.c_limit is None:
            return None
        speedup = theoretical_speedup(q.alpha, q.gamma, timing.c_limit, timing.v_limit)
        return None if speedup is None else (speedup, timing.v_limit, timing.c_limit)

    @property
    def with_verify(self) -> float | None:
        return self.quoted.with_verify if self.quoted is not None else None

    def v_text(self) -> str:
        """v as every panel writes it: '2.6', '1.08' (standard steps); '' when unknown."""
        return steps(self.v) if self.v is not None else ""

    def speedup_text(self) -> str:
        """The quoted speedup as the page writes it: '1.13×', '≈0.87×' (count-based); '' when none."""
        sp = self.speedup
        if sp is None:
            return ""
        return f"{'≈' if self.speedup_by == 'counts' else ''}{sp:.2f}×"


def clock_speedup(spec: Trace | None, std: Trace | None) -> float | None:
    """The wall clock's speedup: speculative tokens/s ÷ standard tokens/s (None when either is missing)."""
    if spec is None or std is None:
        return None
    s, t = spec.summary().tokens_per_s or 0.0, std.summary().tokens_per_s or 0.0
    return s / t if s > 0 and t > 0 else None


def run_figures(spec: Trace | None, std: Trace | None = None) -> RunFigures:
    """The figures of a speculative run and (when given) the standard run it raced.  Never raises; a run
    without rounds, or no run, gives figures whose every quantity is None."""
    rc = race_costs(spec, std)
    clock = clock_speedup(spec, std)
    busy = flagged(spec)
    timing = spec.timing if spec is not None else None
    counts = timing.predicted if timing is not None else None
    quoted = rc
    if busy and rc is not None:
        # The flagged race's own clocks are not quoted: its verify pass and draft token at the probe's prices.
        t_step = rc.t_step
        quoted = replace(rc, measured=counts,
                         t_verify=timing.v_probe * t_step if t_step and timing.v_probe is not None else None,
                         t_draft_token=(timing.c_probe * t_step if t_step and timing.c_probe is not None
                                        else rc.t_draft_token))
    cut = any(t is not None and t.stop_reason in CUT for t in (spec, std))
    return RunFigures(costs=rc, quoted=quoted, clock=clock, counts=counts, flagged=busy, cut=cut, timing=timing)


__all__ = ["BEST_GAMMA_MAX", "THEORY_POINT", "RunFigures", "best_gamma", "clock_speedup", "run_figures", "theory_point"]
