"""Repeats of a sweep's runs, taken round-robin, and the spread they show.  No models, no UI.

A sweep timed as "every repeat of γ = 1, then every repeat of γ = 2, …" compares moments, not
configurations: a neighbour's job that starts halfway makes the later γ look slow.  So the sweeps and
the shoot-out run **round-robin**: standard decoding, then every configuration once (round 1), then
standard decoding and every configuration again (round 2), and so on.  Background load then falls
on every configuration alike, and each round's speedups are divided by that round's own standard
run (measured moments before them), not by a baseline from minutes earlier.  The baseline goes first
in each round so that a round cut short by the sweep's time budget still has its baseline.

One run is alive at a time (whole runs alternate, not passes as in specviz.core.race.interleave):
a dozen configurations alive at once would hold a dozen KV caches, and a target whose compiled
steps own one static cache (the GPU's graphs) cannot hold two runs at all.

A point then reports the median of its repeats with their range (min–max: with three repeats an
interquartile range says nothing more), `Spread`, and how many of its repeats the timing judge
(specviz.theory.timing.assess_race) flagged as disturbed.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

from ..serving.sweep_budget import within

K = TypeVar("K")
REPEATS = 3  # recorded and command-line sweeps, and the page's shoot-out: the median of three, with their range
# The page's γ and ε sweeps: a round of 13 or 15 runs of 64 tokens on the default pair takes 2-3 minutes on a
# 2-core CPU, and a sweep's budget is 10 minutes (SPECVIZ_SWEEP_SECONDS) shared with a room; a budget that
# runs out in a later round leaves every point with the repeats it finished.
PAGE_SWEEP_REPEATS = 2


@dataclass(frozen=True)
class Spread:
    """The median of a point's repeats and their range (lo = min, hi = max) over n repeats."""

    median: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float | None]) -> "Spread | None":
        """From the repeats' values (None: a repeat without one, left out); None when there are none."""
        xs = [float(v) for v in values if v is not None]
        if not xs:
            return None
        return cls(statistics.median(xs), min(xs), max(xs), len(xs))

    def fields(self, key: str) -> dict[str, float]:
        """The point's fields for this metric: key (the median), key_lo and key_hi (the range)."""
        return {key: self.median, f"{key}_lo": self.lo, f"{key}_hi": self.hi}


def round_robin(keys: Sequence[K], repeats: int, should_stop: Callable[[], bool] = lambda: False,
                ) -> Iterator[tuple[int, K]]:
    """(repeat, key) for every key of every repeat, round by round: (0, A), (0, B), (1, A), (1, B) …

    `should_stop` (the sweep's budget) is checked before each step but the first, like
    serving.sweep_budget.within: a budget that runs out in round 3 leaves every point with two repeats."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1 (got {repeats})")
    yield from within([(r, k) for r in range(repeats) for k in keys], should_stop)


def noisy(spec: Any, std: Any, prices: Any = None) -> bool:
    """Whether the timing judge finds this repeat's clocks disturbed: a speculative run against the
    standard run of its round, or (spec None) the standard run alone, whose own passes scattered beyond
    theory.timing.SPREAD_MAX.  Stores the verdict on the speculative trace (`Trace.timing`, "sequential":
    the two ran one after the other), so a run shown on the Live tab says it too."""
    from ..theory.timing import SPREAD_MAX, assess_race, flagged

    if spec is None:
        if std is None:
            return False
        t = assess_race(std, None, how="alone", prices=prices)
        return t.judged and t.spread > SPREAD_MAX
    spec.timing = assess_race(spec, std, how="sequential" if std is not None else "alone", prices=prices)
    return flagged(spec)


def median_of(rows: Sequence[dict[str, Any]], key: str) -> Any:
    """The median of a field over the repeats (None where no repeat has it)."""
    s = Spread.of(r.get(key) for r in rows)
    return None if s is None else s.median


def combine(rows: Sequence[dict[str, Any]], timed: Sequence[str], spread: Sequence[str], flags: Sequence[bool],
            ) -> dict[str, Any]:
    """One point from its repeats' rows (each a dict of the same keys): the first repeat's values
    (counts and texts: the same seed gives the same tokens every repeat), the medians of the `timed`
    fields, the range of the `spread` fields (key_lo, key_hi), `repeats` and `noisy` (repeats flagged)."""
    out = dict(rows[0])
    for key in timed:
        if key in out:
            out[key] = median_of(rows, key)
    for key in spread:
        s = Spread.of(r.get(key) for r in rows)
        if s is not None:
            out.update(s.fields(key))
    out["repeats"] = len(rows)
    out["noisy"] = sum(bool(f) for f in flags)
    return out


__all__ = ["PAGE_SWEEP_REPEATS", "REPEATS", "Spread", "combine", "median_of", "noisy", "round_robin"]
