"""The probe's "is the machine busy" never counts the app's own start-up work (issue 55): its conversion, its
page, its kernel's compiler (a child process) -- only other programs' CPU; and it is asked over the probe's own
window too, against the cores the probe's threads leave free (issue 65; the probe itself: test_probe_busy.py)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

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


# ---- over a measurement: the probe's window (issue 65) -------------------------------------------------------------


def test_other_work_is_judged_against_the_cores_the_measurement_leaves_free():
    # on 2 cores both threads measure: half a core of other work already took cores they needed
    assert busy.limit(2, 2) == 0.5 and not busy.crowded(0.4, 2, 2) and busy.crowded(0.6, 2, 2)
    # one thread of two leaves a core free: the same rule as before a probe (3/4 of the cores)
    assert busy.limit(1, 2) == 1.5 and not busy.crowded(1.4, 1, 2) and busy.crowded(1.6, 1, 2)
    # many cores, few threads: never more than 3/4 of the cores (memory bandwidth, turbo are shared too)
    assert busy.limit(1, 16) == 12.0 and busy.limit(16, 16) == 0.5 and busy.limit(8, 16) == 8.5
    assert busy.limit(1, 1) == 0.5 and busy.limit(64, 2) == 0.5  # more threads than cores: every core used


def test_a_watch_counts_other_work_over_the_window_not_the_apps_own():
    clock = Clock()
    counters = {"all": 100.0, "own": 10.0}
    watch = busy.Watch(read=lambda: counters["all"], own=lambda: counters["own"], clock=clock, cores=2)
    clock.t, counters["all"], counters["own"] = 4.0, 100.0 + 4 * 1.95, 10.0 + 4 * 1.9  # the probe on both cores
    assert watch.verdict(2) is None and watch.reading()["other_cores"] == pytest.approx(0.05)
    clock.t, counters["all"], counters["own"] = 8.0, counters["all"] + 4 * 2.0, counters["own"] + 4 * 0.6
    why = watch.verdict(2)  # the last 4 s: hogs took 1.4 cores; over the 8 s window 0.725
    assert why is not None and why["other_cores"] == pytest.approx(0.72, abs=0.01) and why["limit"] == 0.5
    assert why["threads"] == 2 and why["cores"] == 2 and why["seconds"] == 8.0 and why["how"] == "/proc/stat"


def test_without_proc_stat_a_watch_reads_the_load_average_less_its_own_work():
    clock = Clock()
    own = {"s": 0.0}
    watch = busy.Watch(read=lambda: None, own=lambda: own["s"], clock=clock, cores=2, loadavg=lambda: (3.0, 1, 1))
    clock.t, own["s"] = 2.0, 2.0  # one core's worth of its own
    why = watch.verdict(2)
    assert why is not None and why["other_cores"] == 2.0 and why["how"] == "load average"
    quiet = busy.Watch(read=lambda: None, own=lambda: own["s"], clock=clock, cores=2, loadavg=lambda: (1.2, 1, 1))
    clock.t, own["s"] = 4.0, 4.0
    assert quiet.verdict(2) is None


def test_a_pinned_process_reads_its_own_cores_only(monkeypatch, tmp_path):
    """In a container pinned to some cores, work on the others takes nothing from it."""
    stat = tmp_path / "stat"
    stat.write_text("cpu  400 0 0 400 0 0 0 0 0 0\ncpu0 100 0 0 100 0 0 0 0 0 0\ncpu1 300 0 0 100 0 0 0 0 0 0\n"
                    "cpu2 0 0 0 200 0 0 0 0 0 0\nintr 1 2 3\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: real_open(stat if path == "/proc/stat" else path, *a, **k))
    monkeypatch.setattr(busy.os, "sysconf", lambda name: 100)
    monkeypatch.setattr(busy, "usable_cpus", lambda: frozenset({0, 1, 2}))
    assert busy.all_cpu_seconds() == 4.0  # every core: the first line
    monkeypatch.setattr(busy, "usable_cpus", lambda: frozenset({0, 2}))
    assert busy.all_cpu_seconds() == 1.0  # cpu0 and cpu2 only
    assert busy.core_count() == 2


def test_the_strict_check_after_a_flagged_probe(monkeypatch):
    """Where the last probe was flagged, a start measures again only where the cores its threads need are free."""
    from specviz.hardware import quiet

    monkeypatch.setattr(busy, "machine_busy", lambda *a, **k: False)  # int8.machine_busy stays this machine's
    monkeypatch.setattr(busy, "core_count", lambda: 2)
    monkeypatch.setattr(busy, "recent_other", lambda: 0.8)  # under 3/4 of 2 cores, but crowding 2 threads
    assert quiet.stated() is None
    assert not quiet.busy_before() and quiet.busy_before(strict_threads=2) and not quiet.busy_before(strict_threads=1)
    monkeypatch.setattr(busy, "recent_other", lambda: 0.1)
    assert not quiet.busy_before(strict_threads=2)
