"""Two decoding runs advanced in alternation, so both see the same machine.

A race timed as two runs one after the other compares two different machines whenever the load
changes between them (a neighbour's job, a video call, 30 browsers on a workshop server): on a busy
2-core CPU the same race measured 5.13× and 0.79×.  Interleaved, the speculative and the standard
run share every moment of background load, and each engine's `Clock` keeps the time the other run
spends out of its own readings (`Clock.hold`), so each run's trace still times only itself.

The rule is to pull the next event from the run whose own clock is behind: both runs then cover
the same stretch of wall time, pass by pass, until one of them ends.  The tokens are those of the
runs made separately (each run owns its caches, generator and clock).

No models, no UI: plain generators of engine events (specviz.core.engine.Event).
"""

from __future__ import annotations

import time
from typing import Callable, Iterator, TypeVar

E = TypeVar("E")


def interleave(streams: dict[str, Iterator[E]], now: Callable[[], float] = time.perf_counter) -> Iterator[tuple[str, E]]:
    """Yield (name, event) from every stream until all are exhausted, always advancing the stream
    that has spent the least time inside its own ``next()`` so far (ties: the first named).

    The time a stream spends producing an event is its own run's time (its clock pauses while the
    event is held, i.e. while another stream runs), so "least time" is "whose clock is behind"."""
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
        finally:
            spent[name] += now() - t
        yield name, event


def in_turn(streams: dict[str, Iterator[E]]) -> Iterator[tuple[str, E]]:
    """Yield (name, event) from each stream to its end, one after the other in the order given (a
    sequential race: where the two runs cannot both be alive)."""
    for name, stream in streams.items():
        for event in stream:
            yield name, event


__all__ = ["in_turn", "interleave"]
