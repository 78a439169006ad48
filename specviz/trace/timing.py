"""How a race was timed and how far its clocks can be trusted (`Trace.timing`; absent in old recordings).

Filled in by the race (specviz.serving.service.race, with specviz.theory.timing.assess_race) and
stored on both traces of a race: a recording keeps what the page said about its timings.

    how          "interleaved" (the two runs advanced in alternation, sharing the machine's load),
                 "sequential" (one after the other: a target whose compiled steps hold one run at a
                 time) or "alone" (no standard run)
    threads      torch threads both runs started with (chosen for the moment: 1 on a busy CPU); None: not
                 chosen
    threads_end  the count both runs ended with when other work arrived during the race and it dropped
                 to one (specviz.hardware.load.ThreadControl); None: unchanged
    busy         cores' worth of CPU other work used just before the race (what chose the threads); None:
                 not measured
    busy_during  the most other work a reading during the race saw (cores' worth); None: not read
    judged       False: the runs were too short to judge (under theory.timing.MIN_JUDGED_S: a tiny model's
                 passes, where Python's overhead makes the scatter); nothing below is measured then
    spread       relative uncertainty of the speedup from the passes' own scatter (0.35 = ±35 %)
    spread_spec, spread_std
                 the same for each run's tokens/s
    reliable     False: the clocks were disturbed (the spread is too large, a cost came out impossible,
                 or the counts priced by the probe disagree beyond the spread); the page says so and
                 nothing is cached or credited
    why          one plain sentence: what disturbed the timings ("" when reliable)
    predicted    the count-based speedup: this race's own counts (draft passes, verify passes and the
                 tokens each fed, standard steps) priced with the probe's measured costs; None without
                 a probe for this execution
    slowdown     the standard run's median step ÷ the probe's one-token step (1.9: the machine ran
                 passes 1.9× slower than when it was probed); None when not comparable
    v_probe, c_probe
                 the verify factor and draft cost the probe's curve gives for this race's passes
                 (what the "why" sentence uses when the race's own are not reliable)
    v_limit, c_limit
                 the same at this machine's limit: the race's verify passes at the roofline (the weights at the
                 copy bandwidth, or the tokens' multiply-adds at the int8 peak) over its one-token step, the draft
                 at its bandwidth bound; None where the probe measured neither
"""

from __future__ import annotations

from dataclasses import dataclass

RACE_HOWS = ("interleaved", "sequential", "alone")


@dataclass(frozen=True, kw_only=True)
class Timing:
    how: str = "interleaved"
    threads: int | None = None
    threads_end: int | None = None
    busy: float | None = None
    busy_during: float | None = None
    judged: bool = True
    spread: float = 0.0
    spread_spec: float = 0.0
    spread_std: float = 0.0
    reliable: bool = True
    why: str = ""
    predicted: float | None = None
    slowdown: float | None = None
    v_probe: float | None = None
    c_probe: float | None = None
    v_limit: float | None = None
    c_limit: float | None = None


__all__ = ["RACE_HOWS", "Timing"]
