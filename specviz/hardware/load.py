"""What the machine can serve now: the threads a race runs with, and whether its two runs can interleave.

On an oversubscribed CPU a forward pass split over every core waits at each of its many barriers for
a thread the OS preempted; the draft (many small ops) suffers most, so c balloons and a race teaches
that speculation loses (measured on a 2-core EPYC with three CPU hogs beside the app: 0.79× with two
threads, 1.58× with one, against 1.81× / 1.63× idle).  So before a race the job reads how busy the
CPU is -- the share of the cores other work used over a short window, while this job waits -- and
runs both runs with one thread when the cores it would need are taken, all of them otherwise.

SPECVIZ_THREADS fixes the count (an operator who knows the machine); on a GPU nothing is changed.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

# Other work using at least this many cores (of this process's threads' worth) means a busy machine.
BUSY_CORES = 0.5
WINDOW_S = 0.2  # how long the CPU is watched before a race


def _cpu_busy_seconds() -> float | None:
    """Seconds of CPU time all cores spent busy since boot (Linux /proc/stat), None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return None
    ticks = [int(x) for x in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def busy_cores(window_s: float = WINDOW_S, read: Callable[[], float | None] = _cpu_busy_seconds,
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


def choose_threads(cores: int, busy: float | None) -> int:
    """Every core when the machine is quiet (or its load unknown); one when other work takes cores."""
    if busy is None or cores <= 1:
        return max(1, cores)
    return 1 if busy >= BUSY_CORES else cores


def _fixed() -> int | None:
    value = os.environ.get("SPECVIZ_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


@dataclass(frozen=True)
class ThreadChoice:
    count: int | None  # torch threads both runs use (None: not chosen, on a GPU)
    busy: float | None = None  # cores' worth of CPU other work used just before (None: not measured)


@contextlib.contextmanager
def race_threads(pair: Any, measure: Callable[[], float | None] = busy_cores,
                 fixed: int | None = None) -> Iterator[ThreadChoice]:
    """Run the block with the thread count chosen for this moment; yields the choice (count None on a
    GPU, where the threads do not time the models).  ``fixed``: this count instead (0: the process's
    own).  The process's count is restored afterwards."""
    device = getattr(pair, "device", None)
    if getattr(device, "type", "cpu") != "cpu":
        yield ThreadChoice(None)
        return
    before = torch.get_num_threads()
    busy = None
    if fixed is not None:
        chosen = fixed or before
    else:
        busy = measure()
        chosen = _fixed() or choose_threads(before, busy)
    torch.set_num_threads(chosen)
    try:
        yield ThreadChoice(chosen, None if busy is None else round(busy, 2))
    finally:
        torch.set_num_threads(before)


def race_can_interleave(pair: Any) -> bool:
    """Whether a race's two runs can be alive at once: not when the target's compiled steps own one
    static cache (models.compiled: the GPU's graphs), which the standard run would then miss and run
    eagerly -- a different execution from the speculative run's."""
    from ..models.compiled import steps_of

    return steps_of(getattr(pair, "target", None)) is None


__all__ = ["BUSY_CORES", "WINDOW_S", "ThreadChoice", "busy_cores", "choose_threads", "race_can_interleave", "race_threads"]
