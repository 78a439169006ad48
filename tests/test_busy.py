"""The probe's "is the machine busy" never counts the app's own start-up work (issue 55): its conversion, its
page, its kernel's compiler (a child process) -- only other programs' CPU."""

from __future__ import annotations

import subprocess
import sys
import time

from specviz.models import busy, int8


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def readings(all_cores: float, own_cores: float):
    """Fake counters over a window: all cores' busy CPU grows by ``all_cores`` a second, this process's by ``own_cores``."""
    clock = Clock()
    return dict(read=lambda: 100.0 + all_cores * clock.t, own=lambda: 10.0 + own_cores * clock.t,
                sleep=clock.sleep, clock=clock)


def test_the_apps_own_work_is_not_other_load():
    # both cores busy, all of it this process's (a conversion and a compiler): nothing else runs
    other = busy.other_cores(0.5, **readings(all_cores=2.0, own_cores=2.0))
    assert other == 0.0
    assert not busy.machine_busy(2, measure=lambda: other)


def test_other_programs_are():
    other = busy.other_cores(0.5, **readings(all_cores=2.0, own_cores=0.2))
    assert abs(other - 1.8) < 1e-9
    assert busy.machine_busy(2, measure=lambda: other)
    assert not busy.machine_busy(2, measure=lambda: 1.0)  # one core of other work on two: not 3/4 of them


def test_without_proc_stat_the_load_average_decides(monkeypatch):
    monkeypatch.setattr(busy.os, "getloadavg", lambda: (5.0, 5.0, 5.0))
    assert busy.machine_busy(2, measure=lambda: None)
    monkeypatch.setattr(busy.os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    assert not busy.machine_busy(2, measure=lambda: None)


def test_a_child_process_counts_as_own_work():
    """A compiler started by this process (the kernel's build) is this process's work while it runs."""
    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 30: pass"])
    try:
        time.sleep(0.3)
        before = busy.own_cpu_seconds()
        time.sleep(1.0)
        assert busy.own_cpu_seconds() - before > 0.05  # the spinning child's CPU (a share of a core, even on a busy machine)
    finally:
        child.kill()
        child.wait()


def test_int8_asks_the_same_rule(monkeypatch):
    monkeypatch.setattr(busy, "machine_busy", lambda *a, **k: True)
    assert int8.machine_busy()
    monkeypatch.setattr(busy, "machine_busy", lambda *a, **k: False)
    assert not int8.machine_busy()
