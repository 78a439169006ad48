"""What the machine can serve now: the threads a race runs with, and whether its two runs can interleave.

On an oversubscribed CPU a forward pass split over every core waits at each of its many barriers for
a thread the OS preempted; the draft (many small ops) suffers most, so c balloons and a race teaches
that speculation loses (measured on a 2-core EPYC with three CPU hogs beside the app: 0.79× with two
threads, 1.58× with one, against 1.81× / 1.63× idle; on the AVX2 EPYC the speculative run made 1.94
tokens/s with one thread against 1.08 with two).  With one thread per model every pass is stretched by
the same share of a core, so the two runs' ratio holds whatever the load does.

So the race's threads are chosen for the moment (:func:`race_threads`):

- before the race the job reads how busy the CPU is -- the cores' worth of CPU other work used over
  a short window while this job waits (/proc/stat) -- and remembers it;
- both runs get one thread when other work takes half a core or more now, or did within the last
  ``STICKY_S`` seconds (a load that comes and goes, a video call, a neighbour's job between its
  requests, would otherwise give every other race a different thread count); every core otherwise;
- during the race (:meth:`ThreadControl.check`, between events) the other work is read again -- the
  CPU all cores spent minus this process's own -- and remembered, and a race that started on every
  core drops to one thread, for both runs at once, when other work arrives.  The trace names both
  counts.

SPECVIZ_THREADS fixes the count (an operator who knows the machine); on a GPU nothing is changed.
The probe times each model at one thread as well as on every core (hardware.probe), so a race run on
one thread is priced by that curve.
"""

from __future__ import annotations

import collections
import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from ..models.busy import all_cpu_seconds

# Other work using at least this many cores (of this process's threads' worth) means a busy machine.
BUSY_CORES = 0.5
WINDOW_S = 0.2  # how long the CPU is watched before a race
STICKY_S = 30.0  # a busy reading this recent still means one thread
CHECK_S = 1.0  # during a race, the other work is read at most this often (over at least this long)


def busy_cores(window_s: float = WINDOW_S, read: Callable[[], float | None] = all_cpu_seconds,
               sleep: Callable[[float], None] = time.sleep) -> float | None:
    """Cores' worth of CPU other work used over ``window_s`` while the caller sleeps (None: unknown).
    The caller's own threads are idle then, so whatever runs is competition: other programs, other
    sessions' work in this server (an export, a page being drawn)."""
    a = read()
    t0 = time.monotonic()
    sleep(window_s)
    b = read()
    took = time.monotonic() - t0
    if a is None or b is None or took <= 0:
        return None
    return max(0.0, (b - a) / took)


class History:
    """Recent readings of other work (monotonic time, cores' worth), for the sticky choice."""

    def __init__(self, keep_s: float = STICKY_S, clock: Callable[[], float] = time.monotonic):
        self.keep_s, self.clock = keep_s, clock
        self._readings: collections.deque[tuple[float, float]] = collections.deque(maxlen=256)

    def add(self, busy: float | None) -> None:
        if busy is not None:
            self._readings.append((self.clock(), busy))

    def busy_lately(self) -> float | None:
        """The most other work any reading of the last ``keep_s`` seconds saw (None: no reading)."""
        now = self.clock()
        recent = [b for t, b in self._readings if now - t <= self.keep_s]
        return max(recent) if recent else None

    def clear(self) -> None:
        self._readings.clear()


HISTORY = History()


def choose_threads(cores: int, busy: float | None, lately: float | None = None) -> int:
    """Every core when the machine is quiet (or its load unknown); one when other work takes cores
    now or did lately."""
    if cores <= 1:
        return max(1, cores)
    seen = [b for b in (busy, lately) if b is not None]
    return 1 if seen and max(seen) >= BUSY_CORES else cores


def _fixed() -> int | None:
    value = os.environ.get("SPECVIZ_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


@dataclass
class ThreadControl:
    """The race's thread count: chosen before it (``start``), maybe dropped to one during it (``count``).

    ``check()`` between events reads the other work since the last reading (at most every ``CHECK_S``)
    and, when the count may still change, drops it to one thread while other work takes cores."""

    start: int | None  # torch threads both runs began with (None: not chosen, on a GPU)
    busy: float | None = None  # cores' worth of CPU other work used just before (None: not measured)
    count: int | None = None  # the count now (== start unless dropped)
    busy_during: float | None = None  # the most other work seen during the race (None: not read)
    may_drop: bool = False  # a race on every core may drop to one thread
    watch: bool = False  # read the other work during the race (kept in the history: the next race's choice)
    read: Callable[[], float | None] = field(default=all_cpu_seconds, repr=False)
    own: Callable[[], float] = field(default=time.process_time, repr=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    history: History = field(default=HISTORY, repr=False)
    _last: tuple[float, float, float] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.count is None:
            self.count = self.start
        if self.may_drop or self.watch:
            self._mark()

    def _mark(self) -> None:
        total = self.read()
        self._last = None if total is None else (self.clock(), total, self.own())

    def check(self) -> bool:
        """Read the other work since the last reading; True when the count was just dropped to one."""
        if self._last is None:
            return False
        t0, total0, own0 = self._last
        took = self.clock() - t0
        if took < CHECK_S:
            return False
        total, own = self.read(), self.own()
        if total is None:
            self._last = None
            return False
        other = max(0.0, ((total - total0) - (own - own0)) / took)
        self._last = (self.clock(), total, own)
        self.history.add(other)
        self.busy_during = round(max(other, self.busy_during or 0.0), 2)
        if self.may_drop and self.count is not None and self.count > 1 and other >= BUSY_CORES:
            self.count = 1
            torch.set_num_threads(1)
            return True
        return False


@contextlib.contextmanager
def race_threads(pair: Any, measure: Callable[[], float | None] = busy_cores,
                 fixed: int | None = None, history: History = HISTORY) -> Iterator[ThreadControl]:
    """Run the block with the thread count chosen for this moment; yields the control (start None on a
    GPU, where the threads do not time the models).  ``fixed``: this count instead, never changed
    (0: the process's own).  The process's count is restored afterwards."""
    device = getattr(pair, "device", None)
    if getattr(device, "type", "cpu") != "cpu":
        yield ThreadControl(None)
        return
    before = torch.get_num_threads()
    busy = None
    if fixed is not None:
        chosen = fixed or before
    else:
        busy = measure()
        lately = history.busy_lately()
        history.add(busy)
        chosen = _fixed() or choose_threads(before, busy, lately)
    torch.set_num_threads(chosen)
    try:
        # Watched whatever the count: a long one-thread race under a load that comes and goes keeps the history
        # fresh, so the next race does not start on every core in a quiet second (the AVX2 EPYC's switching
        # condition did once, 30 s after its last reading).
        yield ThreadControl(chosen, None if busy is None else round(busy, 2), history=history,
                            may_drop=fixed is None and _fixed() is None and chosen > 1, watch=fixed is None)
    finally:
        torch.set_num_threads(before)


def race_can_interleave(pair: Any) -> bool:
    """Whether a race's two runs can be alive at once: not when the target's compiled steps own one
    static cache (models.compiled: the GPU's graphs), which the standard run would then miss and run
    eagerly -- a different execution from the speculative run's.  The int8 target's lean steps give each
    run a cache of its own (models.lean, ``runs_apart``): its races interleave."""
    from ..models.compiled import steps_of

    steps = steps_of(getattr(pair, "target", None))
    return steps is None or steps.runs_apart


__all__ = ["BUSY_CORES", "CHECK_S", "HISTORY", "STICKY_S", "WINDOW_S", "History", "ThreadControl", "busy_cores",
           "choose_threads", "race_can_interleave", "race_threads"]
