"""Whether this machine is quiet enough to time the target: before a probe, and over it (issue 65).

Before (:func:`busy_before`): other processes' CPU over 0.3 s, this process idle, above 3/4 of the cores
(:func:`specviz.models.int8.machine_busy`, the rule the int8 draft's timing asks too).  Where the last probe of
this target was flagged busy, a start measures again only where the stricter rule the probe was flagged by
(:func:`specviz.models.busy.crowded`) finds the cores free: a machine whose steady load flagged one probe is not
probed, and flagged, on every start.

Over the probe (:func:`watch`): other processes' CPU over the probe's own window (:class:`specviz.models.busy.Watch`).

A caller may state the machine instead (``busy=lambda: False``: a test, or the probe's command line); so may a
test that replaces ``int8.machine_busy`` (:func:`stated`).  A stated machine is not watched: its ``busy()``
answers for the window too, so that a test's verdict never depends on what else the test machine runs.
"""

from __future__ import annotations

from typing import Callable

from ..models import busy as _busy


def stated() -> Callable[[], bool] | None:
    """``int8.machine_busy`` where something replaced it (a test's stated machine), else None."""
    from ..models import int8

    fn = int8.machine_busy
    genuine = getattr(fn, "__module__", None) == int8.__name__ and getattr(fn, "__name__", None) == "machine_busy"
    return None if genuine else fn


def busy_before(strict_threads: int | None = None) -> bool:
    """Whether other processes keep the cores busy now (nothing is measured then).  ``strict_threads``: also where
    their work would crowd a measurement on that many threads (:func:`specviz.models.busy.crowded`): asked before
    measuring again where the last probe was flagged."""
    from ..models import int8

    fn = stated()
    if fn is not None:
        return bool(fn())
    if int8.machine_busy():
        return True
    if strict_threads is None:
        return False
    other = _busy.recent_other()
    if other is None:
        other = _busy.other_cores()
    return other is not None and _busy.crowded(other, strict_threads, _busy.core_count())


def watch(busy: Callable[[], bool] | None = None) -> _busy.Watch | _busy.Stated:
    """What watches a probe from now on: the caller's stated ``busy`` (or a test's ``int8.machine_busy``), else
    this machine's CPU counters."""
    fn = busy or stated()
    return _busy.Stated(fn) if fn is not None else _busy.Watch()


__all__ = ["busy_before", "stated", "watch"]
