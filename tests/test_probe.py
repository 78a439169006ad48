"""The probe's timer (specviz.hardware.probe.VerifyTimer): how it times a curve."""

from __future__ import annotations


def test_the_probes_timer_passes_every_length_in_turn_and_keeps_each_ones_fastest(monkeypatch):
    """A machine whose speed drifts while it is probed moves every point of the curve alike: the lengths are
    timed round by round (after one warm-up pass each), not one length's repeats after another's."""
    from specviz.hardware.probe import VerifyTimer

    timer = object.__new__(VerifyTimer)  # no model: the passes are recorded, their seconds made up
    order: list[int] = []
    seconds = iter([0.5, 0.5, 0.5, 0.09, 0.10, 0.12, 0.08, 0.11, 0.13])
    monkeypatch.setattr(VerifyTimer, "_pass", lambda self, k: order.append(k) or next(seconds))
    assert timer.curve((1, 2, 4), reps=2) == {1: 80.0, 2: 100.0, 4: 120.0}
    assert order == [1, 2, 4, 1, 2, 4, 1, 2, 4]  # warm-ups, then two rounds
    order.clear()
    seconds = iter([0.5, 0.5, 0.09, 0.2, 0.08])
    # the step is timed at least twice; a known point is not timed again
    assert timer.curve((1, 4, 8), known={8: 300.0}) == {1: 80.0, 4: 200.0, 8: 300.0}
    assert order == [1, 4, 1, 4, 1]
