"""Two decoding runs advanced in alternation, so both see the same machine.

A race timed as two runs one after the other compares two different machines whenever the load
changes between them (a neighbour's job, a video call, 30 browsers on a workshop server): on a busy
2-core CPU the same race measured 5.13× and 0.79×.  Interleaved, the speculative and the standard
run share every moment of background load, and each engine's `Clock` keeps the time the other run
spends out of its own readings (`Clock.hold`), so each run's trace still times only itself.

The rule is to pull the next event from the run that is behind: both runs then cover the same
stretch of the machine's time, pass by pass, until one of them ends.  The tokens are those of the
runs made separately (each run owns its caches, generator and clock).

"Behind" is best counted in each event's *expected* cost (the probe's price of the pass it
reports: ``cost``), not in its measured time.  Balancing measured times feeds the load back into
the schedule -- a run whose pass was stretched by a neighbour gets its next turn later, so which
run meets the next busy stretch depends on the last one -- and under a load switching every few
seconds that bias alone moved the speedup by -6 % to +36 % in a simulation (and the AVX2 EPYC's
switching races came out 0.86-1.11×); a schedule fixed by the passes' prices cannot correlate with
the load (±5 % in the same simulation).  Without prices, measured time is the fallback.

No models, no UI: plain generators of engine events (specviz.core.engine.Event).
"""

from __future__ import annotations

import time
from typing import Callable, Iterator, TypeVar

E = TypeVar("E")


def interleave(streams: dict[str, Iterator[E]], now: Callable[[], float] = time.perf_counter,
               cost: Callable[[str, E, float], float] | None = None) -> Iterator[tuple[str, E]]:
    """Yield (name, event) from every stream until all are exhausted, always advancing the stream
    that is behind (ties: the first named).

    Behind: the least ``cost(name, event, seconds)`` summed over its events so far -- what producing
    the event should have cost, load-independent -- or, without ``cost``, the least time spent inside
    its own ``next()`` (its own run's time: its clock pauses while another stream runs)."""
    spent = {name: 0.0 for name in streams}
    live = dict(streams)
    while live:
        name = min(live, key=lambda n: spent[n])
        t = now()
        try:
            event = next(live[name])
        except StopIteration:
            del live[name]
            continue
        took = now() - t
        spent[name] += took if cost is None else cost(name, event, took)
        yield name, event


def in_turn(streams: dict[str, Iterator[E]]) -> Iterator[tuple[str, E]]:
    """Yield (name, event) from each stream to its end, one after the other in the order given (a
    sequential race: where the two runs cannot both be alive)."""
    for name, stream in streams.items():
        for event in stream:
            yield name, event


__all__ = ["in_turn", "interleave"]
