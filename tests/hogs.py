"""CPU hogs for the tests of the probe's busy watch: pure-Python busy loops in processes of their own.

They must be *other* processes to the test: specviz counts its own process's children and descendants as its own
work (specviz.models.busy.own_cpu_seconds: the kernel's compiler), so a ``multiprocessing`` child would be the
probe's own load.  A launcher forks them, detaches them (a session of their own, stdio on /dev/null) and exits at
once: they are then init's children, not the test's, and each ends by itself after ``seconds`` if it is not
killed first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import Iterator

LAUNCHER = """
import os, sys, time
n, seconds = int(sys.argv[1]), float(sys.argv[2])
pids = []
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        end = time.time() + seconds
        while time.time() < end:
            pass
        os._exit(0)
    pids.append(pid)
print(" ".join(map(str, pids)), flush=True)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def cpu_hogs(n: int, seconds: float = 60.0) -> Iterator[list[int]]:
    """``n`` busy loops running beside the block (their pids), killed after it."""
    out = subprocess.run([sys.executable, "-c", LAUNCHER, str(n), str(seconds)], capture_output=True, text=True,
                         check=True, timeout=30)
    pids = [int(p) for p in out.stdout.split()]
    try:
        time.sleep(0.2)  # running before the block starts
        yield pids
    finally:
        for pid in pids:  # only the processes started here, by their ids
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
