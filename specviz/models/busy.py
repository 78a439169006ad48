"""Whether *other* work keeps the cores busy: the app's own start-up work never counts.

The probe (:mod:`specviz.hardware.probe`) and the int8 draft's timing measure only on a quiet machine.  They used
to ask the 1-minute load average, which counts every runnable thread -- the app's own conversion of its models,
its kernel's compiler, its page's build -- and remembers them for a minute: the first start judged the machine
busy by its own work and recorded no probe (issue 55).  Here the CPU time the cores this process may run on spent
over a short window (Linux ``/proc/stat``) is read, minus what this process and its children (the kernel's
compiler) spent in the same window: what is left is other programs' work (and, in a VM, the time the hypervisor
gave the vCPUs to others: ``steal``).  Where ``/proc/stat`` cannot be read, the load average decides, as before.

Two questions are asked with it:

- *before* measuring (:func:`machine_busy`): other work over 0.3 s, this process idle, above 3/4 of the cores;
- *while* measuring (:class:`Watch`, issue 65): other work over the measurement's own window, this process
  busy.  A reading taken at one moment misses load that starts a second later: a probe whose first 0.3 s were
  quiet was recorded with T(1) = 1,420 ms (51.4 ms quiet) while the test suite ran beside it.  Over the window
  the measurement takes its own share of the cores, so other work is judged against what the measurement
  leaves free (:func:`crowded`): more than ``MARGIN`` cores' worth beyond the cores its threads do not use
  means its threads waited for cores.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

WINDOW_S = 0.3  # how long the CPU is watched
BUSY_SHARE = 0.75  # other work on more than this share of the cores: busy (the load-average rule's threshold)
KEEP_S = 2.0  # a reading this fresh is reused (the loader asks several times in a row)
# While measuring on ``threads`` threads: other work beyond the cores those threads leave free, by more than
# this many cores' worth, took cores the threads needed (on 2 cores, both used: half a core of other work).
MARGIN = 0.5

_LAST: list[tuple[float, float]] = []  # (monotonic time, other cores) of the last reading
_GUARD = threading.Lock()


def usable_cpus() -> frozenset[int] | None:
    """The CPUs this process may run on (None where the platform does not say)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def core_count() -> int:
    """How many cores this process may run on."""
    mine = usable_cpus()
    return len(mine) if mine else (os.cpu_count() or 1)


def _busy_seconds(fields: list[str]) -> float:
    ticks = [int(x) for x in fields[:8]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return sum(ticks) - idle


def all_cpu_seconds() -> float | None:
    """Seconds of CPU the cores this process may run on spent busy since boot (``/proc/stat``), None elsewhere.
    All cores (the first line) unless the process is pinned to some (a container's cpuset): then theirs only,
    as work on cores it cannot use takes nothing from it."""
    try:
        with open("/proc/stat") as f:
            lines = [line.split() for line in f if line.startswith("cpu")]
    except OSError:
        return None
    if not lines:
        return None
    per_cpu = {int(parts[0][3:]): parts[1:] for parts in lines[1:] if parts[0][3:].isdigit()}
    mine = usable_cpus()
    if mine is None or not per_cpu or set(per_cpu) <= mine:
        ticks = _busy_seconds(lines[0][1:])
    else:
        ticks = sum(_busy_seconds(per_cpu[c]) for c in mine if c in per_cpu)
    return ticks / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds of this process, its finished children, and its live descendants (a compiler running now)."""
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            try:
                c = child.cpu_times()
                total += c.user + c.system
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
    except Exception:  # noqa: BLE001 -- no psutil: finished children only
        pass
    return total


def other_cores(window_s: float = WINDOW_S, read: Callable[[], float | None] = all_cpu_seconds,
                own: Callable[[], float] = own_cpu_seconds, sleep: Callable[[float], None] = time.sleep,
                clock: Callable[[], float] = time.monotonic) -> float | None:
    """Cores' worth of CPU other processes used over ``window_s`` (None: unknown here)."""
    a, mine_a, t0 = read(), own(), clock()
    sleep(window_s)
    b, mine_b, took = read(), own(), clock() - t0
    if a is None or b is None or took <= 0:
        return None
    return max(0.0, ((b - a) - (mine_b - mine_a)) / took)


def machine_busy(cores: int | None = None, measure: Callable[[], float | None] = other_cores) -> bool:
    """Other processes keep the cores busy: their work over a short window takes more than 3/4 of the cores.
    This process's own work (loading, converting, compiling its kernel) is not counted."""
    cores = cores or core_count()
    now = time.monotonic()
    with _GUARD:
        fresh = _LAST[0][1] if _LAST and now - _LAST[0][0] < KEEP_S and measure is other_cores else None
    other = fresh if fresh is not None else measure()
    if other is None:
        try:
            return os.getloadavg()[0] > BUSY_SHARE * cores
        except (AttributeError, OSError):  # no load average on this platform
            return False
    if measure is other_cores:
        with _GUARD:
            _LAST[:] = [(time.monotonic(), other)]
    return other > BUSY_SHARE * cores


def recent_other() -> float | None:
    """The other work :func:`machine_busy` read within the last ``KEEP_S`` seconds (None: no such reading)."""
    with _GUARD:
        return _LAST[0][1] if _LAST and time.monotonic() - _LAST[0][0] < KEEP_S else None


def limit(threads: int, cores: int) -> float:
    """The most other work (cores' worth) a measurement on ``threads`` threads of ``cores`` cores tolerates:
    the cores its threads leave free, plus ``MARGIN``; never more than :func:`machine_busy`'s 3/4 of the cores
    (one thread on 16 cores still suffers from 15 cores of other work: memory bandwidth, turbo)."""
    free = max(0, cores - max(1, threads))
    return min(BUSY_SHARE * cores, free + MARGIN) if cores > 1 else MARGIN


def crowded(other: float, threads: int, cores: int) -> bool:
    """Whether ``other`` cores' worth of other work, read while a measurement ran on ``threads`` threads, took
    cores it needed (:func:`limit`).  On 2 cores with both threads in use: more than half a core.  Read over the
    probe of the tiny test model on both threads of a 2-core VM: 1.3-1.8 cores beside three CPU hogs (its T(1)
    1 -> 2-50 ms), 0.08 on a quiet machine."""
    return other > limit(threads, cores)


@dataclass
class Watch:
    """Other processes' CPU over a measurement, from its start (the object's creation) to :meth:`verdict`: the
    ``/proc/stat`` counters of the cores this process may use, minus this process's own CPU (and its
    children's), over the wall time between.  The measurement runs meanwhile, so other work is what it could
    not use: judged by :func:`crowded` against the threads it measured on."""

    read: Callable[[], float | None] = field(default=all_cpu_seconds, repr=False)
    own: Callable[[], float] = field(default=own_cpu_seconds, repr=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    cores: int = field(default_factory=core_count)
    loadavg: Callable[[], tuple[float, float, float]] = field(default=lambda: os.getloadavg(), repr=False)
    _start: tuple[float, float | None, float] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._start = (self.clock(), self.read(), self.own())

    def reading(self) -> dict:
        """{"seconds", "other_cores", "own_cores", "cores", "how"} since the start (other_cores None: unknown)."""
        t0, all0, own0 = self._start
        took, total, mine = self.clock() - t0, self.read(), self.own()
        own_cores = (mine - own0) / took if took > 0 else 0.0
        other: float | None = None
        how = "/proc/stat"
        if all0 is not None and total is not None and took > 0:
            other = max(0.0, ((total - all0) - (mine - own0)) / took)
        else:  # no /proc/stat: the 1-minute load average less this process's own share (a rough stand-in)
            how = "load average"
            try:
                other = max(0.0, self.loadavg()[0] - own_cores)
            except (AttributeError, OSError):
                other = None
        return {"seconds": round(took, 2), "other_cores": None if other is None else round(other, 2),
                "own_cores": round(own_cores, 2), "cores": self.cores, "how": how}

    def verdict(self, threads: int) -> dict | None:
        """None where the measurement had the cores it needed (or nothing could tell); otherwise why not: the
        reading with the ``threads`` it ran on and the ``limit`` it passed."""
        r = self.reading()
        other = r["other_cores"]
        if other is None or not crowded(other, threads, self.cores):
            return None
        return {**r, "threads": threads, "limit": round(limit(threads, self.cores), 2)}


@dataclass
class Stated:
    """A watch that watches nothing: a caller (a test, an operator's command) states whether the machine is busy
    with ``busy()``, asked at the verdict; a stated machine is not measured twice."""

    busy: Callable[[], bool]

    def verdict(self, threads: int) -> dict | None:
        return {"stated": True, "threads": threads} if self.busy() else None
