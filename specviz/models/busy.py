"""Whether *other* work keeps the cores busy: the app's own start-up work never counts.

The probe (:mod:`specviz.hardware.probe`) and the int8 draft's timing measure only on a quiet machine.  They used
to ask the 1-minute load average, which counts every runnable thread -- the app's own conversion of its models,
its kernel's compiler, its page's build -- and remembers them for a minute: the first start judged the machine
busy by its own work and recorded no probe (issue 55).  Here the CPU time all cores spent over a short window
(Linux ``/proc/stat``) is read, minus what this process and its children (the kernel's compiler) spent in the same
window: what is left is other programs' work.  Where ``/proc/stat`` cannot be read, the load average decides, as
before.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

WINDOW_S = 0.3  # how long the CPU is watched
BUSY_SHARE = 0.75  # other work on more than this share of the cores: busy (the load-average rule's threshold)
KEEP_S = 2.0  # a reading this fresh is reused (the loader asks several times in a row)

_LAST: list[tuple[float, float]] = []  # (monotonic time, other cores) of the last reading
_GUARD = threading.Lock()


def all_cpu_seconds() -> float | None:
    """Seconds of CPU all cores spent busy since boot (``/proc/stat``), None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return None
    ticks = [int(x) for x in fields[:8]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


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
    cores = cores or os.cpu_count() or 1
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
