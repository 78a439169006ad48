"""Sweeps have a wall-time budget (SPECVIZ_SWEEP_SECONDS): they stop cleanly with the points they
finished and say why.  Tiny pair; the budget's clock (service._now) is the test's, so what is
measured does not depend on how busy the machine is."""

from __future__ import annotations

import pytest

from specviz.models import TINY_PRESET
from specviz.serving import service
from specviz.serving.sweep_budget import SWEEP_SECONDS, sweep_budget, sweep_seconds, within
from specviz.ui import tabs
from specviz.ui.form import RunForm
from specviz.ui.frames import SKIP


class Clock:
    """service._now for the test: moves only when told (`tick` per reading, or `advance`)."""

    def __init__(self, tick: float = 0.0):
        self.t, self.tick, self.reads = 0.0, tick, 0

    def __call__(self) -> float:
        self.t += self.tick
        self.reads += 1
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(service, "_now", c)
    return c


def per_step(clock: Clock, seconds: float = 100):
    """A progress callback that moves the clock once per step the sweep reports (not for the
    pair's loading messages, which come before the sweep's budget starts)."""
    steps = ("standard decoding", "baseline", "γ =", "ε =", "verify time")
    return lambda frac, desc: clock.advance(seconds) if desc.startswith(steps) else None


def measured_gammas(frame) -> list[int]:
    fig = frame.gamma_plot
    (trace,) = [t for t in fig.data if t.name and t.name.startswith("measured")]
    return list(trace.x)


def form(**kw) -> RunForm:
    return RunForm(**{"preset": TINY_PRESET, "prompt": "a b c a b c", "max_new_tokens": 8, **kw})


def test_gamma_sweep_stops_at_its_time_limit_and_keeps_its_points(clock, monkeypatch):
    """Each progress report moves the clock 100 s; with a 250 s budget the baseline and γ = 1
    finish (clock at 300 s), and γ = 2 never starts."""
    monkeypatch.setenv("SPECVIZ_SWEEP_SECONDS", "250")
    frames = list(tabs.sweep("gamma", form(), progress=per_step(clock)))
    final = frames[-1]
    assert "time limit reached" in final.status and "250 s per sweep" in final.status
    assert "1 point(s) it finished" in final.status and "SPECVIZ_SWEEP_SECONDS" in final.status
    assert measured_gammas(final) == [1]  # the finished point stays on the plot
    assert final.eps_plot is SKIP
    assert not any("γ = 2" in f.status for f in frames)


def test_a_decode_in_progress_stops_at_the_limit_and_is_dropped(clock, monkeypatch):
    """One second per clock reading (the engine reads it before every round): a 40 s budget lets
    the 32-token baseline finish (33 readings) and runs out inside γ = 1, which needs at least 16
    rounds; that point is cut short, so it is not shown."""
    clock.tick = 1.0
    monkeypatch.setenv("SPECVIZ_SWEEP_SECONDS", "40")
    frames = list(tabs.sweep("gamma", form(max_new_tokens=32)))
    assert any("baseline:" in f.status for f in frames)
    assert "time limit reached" in frames[-1].status and "0 point(s)" in frames[-1].status
    assert not any("γ = 1:" in f.status for f in frames)
    assert clock.reads <= 40 + 2  # it stopped at the first round past the deadline, not after the point


def test_epsilon_sweep_has_the_same_limit(clock, monkeypatch):
    monkeypatch.setenv("SPECVIZ_SWEEP_SECONDS", "250")
    frames = list(tabs.sweep("epsilon", form(), progress=per_step(clock)))
    # reports: start (100 s), ε = 0 OPT (200 s), ε = 0 UNO (300 s); ε = 0.05 never starts
    assert "time limit reached" in frames[-1].status and "2 point(s)" in frames[-1].status
    assert frames[-1].eps_plot is not SKIP and frames[-1].pareto is not SKIP
    assert not any("ε = 0.05" in f.status for f in frames)


def test_tree_sweep_stops_between_sizes(clock, monkeypatch):
    monkeypatch.setenv("SPECVIZ_SWEEP_SECONDS", "250")
    frames = list(tabs.tree_sweep(form(), progress=per_step(clock)))
    plots = [f.tree_plot for f in frames if f.tree_plot is not SKIP]
    assert list(plots[-1].data[0].x) == [1, 2, 4]  # checked at 100 s and 200 s; at 300 s it stops
    assert "time limit reached" in frames[-1].status and "3 point(s)" in frames[-1].status


def test_a_sweep_that_finished_is_not_called_cut_short(clock, monkeypatch):
    """The deadline passes during the last size: nothing was stopped, so no time-limit message."""
    monkeypatch.setenv("SPECVIZ_SWEEP_SECONDS", "650")
    frames = list(tabs.tree_sweep(form(), progress=per_step(clock)))
    assert clock.t == 700 and "7 sizes measured" in frames[-1].status  # the deadline passed at 650 s
    assert not any("time limit" in str(f.status) for f in frames)


def test_within_checks_before_each_step_but_the_first(clock):
    budget = sweep_budget(2.5)  # deadline at 2.5 s
    done = []
    for step in within("abcdef", budget):
        done.append(step)
        clock.advance(1)
    assert done == ["a", "b", "c"] and budget.ran_out
    clock.t = 0
    assert list(within("xy", sweep_budget(10))) == ["x", "y"]


def test_sweep_budget_env(monkeypatch):
    monkeypatch.delenv("SPECVIZ_SWEEP_SECONDS", raising=False)
    assert sweep_seconds() == SWEEP_SECONDS == 600
    monkeypatch.setenv("SPECVIZ_SWEEP_SECONDS", "90")
    assert sweep_seconds() == 90 and sweep_budget().seconds == 90
    for bad in ("0", "-5", "nan", "inf", "later"):
        monkeypatch.setenv("SPECVIZ_SWEEP_SECONDS", bad)
        assert sweep_seconds() == 600


# ---- the drafter shoot-out has the same limit ------------------------------------------------


def shootout_frames(clock: Clock, when: str, seconds: float = 100):
    """The shoot-out on the tiny pair, the clock moving `seconds` at each report of a drafter
    starting ("… (k/5)…", when="start") or finishing ("…: x tok/s", when="done")."""
    from specviz.ui import shootout_ui

    def progress(frac, desc):
        if (when == "start" and desc.endswith(")…")) or (when == "done" and desc.endswith("tok/s")):
            clock.advance(seconds)
    return list(shootout_ui.shootout(form(gamma=2), progress=progress))


def test_the_shootout_stops_between_drafters_at_its_time_limit(clock, monkeypatch):
    """The clock moves 100 s as each run finishes; each round runs standard decoding first: standard
    (100 s), the draft model (200 s) and prompt lookup (300 s) finish; the budget (250 s) is checked
    before the tree, which never starts."""
    from specviz.serving.replay import GATE

    monkeypatch.setenv("SPECVIZ_SWEEP_SECONDS", "250")
    frames = shootout_frames(clock, "done")
    final = frames[-1]
    assert not GATE.lock.locked()
    assert "time limit reached" in final.status and "250 s per sweep" in final.status
    assert "3 point(s) it finished" in final.status and "done:" not in final.status
    assert not any("token tree" in str(f.status) for f in frames)
    runs = final.shootout_runs  # the finished runs stay, to show on the Live tab
    assert [k.split(" (")[0] for k in runs] == ["draft model", "prompt lookup"]
    table = [f.shootout_table for f in frames if f.shootout_table is not SKIP][-1]
    assert 'data-rows="3"' in table


def test_a_drafter_cut_short_by_the_limit_is_dropped(clock, monkeypatch):
    """The clock moves 100 s as each run starts: the tree starts at 400 s (after standard decoding, the
    draft model and prompt lookup), past the 350 s budget, so its decode stops at its first round and is
    not a row; the three before it are."""
    monkeypatch.setenv("SPECVIZ_SWEEP_SECONDS", "350")
    frames = shootout_frames(clock, "start")
    assert any("token tree" in str(f.status) and "(4/6, repeat 1/3)…" in str(f.status) for f in frames)  # it started
    assert not any("token tree" in str(f.status) and "tok/s" in str(f.status) for f in frames)  # never finished
    assert "time limit reached" in frames[-1].status and "3 point(s)" in frames[-1].status
    assert [k.split(" (")[0] for k in frames[-1].shootout_runs] == ["draft model", "prompt lookup"]
    assert 'data-rows="4"' not in "".join(f.shootout_table for f in frames if f.shootout_table is not SKIP)


def test_a_shootout_that_finished_is_not_called_cut_short(clock, monkeypatch):
    """Three rounds of six starts, but the learned head (no head for the tiny target) is not tried again."""
    monkeypatch.setenv("SPECVIZ_SWEEP_SECONDS", "2000")
    frames = shootout_frames(clock, "start")
    assert clock.t == 100 * (6 + 5 + 5) and "done: 5 of 6 ran" in frames[-1].status
    assert "median of 3 repeats each" in frames[-1].status
    assert not any("time limit" in str(f.status) for f in frames)
