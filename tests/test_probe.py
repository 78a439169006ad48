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


def test_a_curve_never_dips_a_pass_over_more_tokens_costs_at_least_one_over_fewer(monkeypatch):
    """A point under an earlier one is noise (a 2-token pass that costs a step within it): raised to that one, in
    the timer's curve and in any probe read back (a cached one from before), so no page says a verify pass costs
    0.91 one-token steps and no policy plans with it."""
    from specviz.hardware.curves import monotone
    from specviz.hardware.probe import Probe, VerifyTimer

    assert monotone({4: 94.9, 1: 77.3, 2: 70.6, 6: 161.7}) == {1: 77.3, 2: 77.3, 4: 94.9, 6: 161.7}
    timer = object.__new__(VerifyTimer)
    seconds = iter([0.5, 0.5, 0.0773, 0.0706, 0.080])
    monkeypatch.setattr(VerifyTimer, "_pass", lambda self, k: next(seconds))
    assert timer.curve((1, 2)) == {1: 77.3, 2: 77.3}
    cached = {"machine": {"threads": 2}, "model": "m", "draft_ms": 23.4, "alpha": 0.8, "choice": "int8",
              "curves": {"int8": {"1": 77.3, "2": 70.6, "4": 94.9}},
              "predicted": {"int8": {"gamma": 1, "rate": 19.2, "standard": 12.9}},  # priced on the dip
              "one_thread": {"curve": {"1": 120.0, "2": 110.0}, "draft_ms": 40.0}}
    probe = Probe.from_dict(cached)
    assert probe.curves["int8"] == {1: 77.3, 2: 77.3, 4: 94.9} and probe.verify_factor("int8", 2) == 1.0
    assert probe.predicted["int8"]["rate"] < 19.0 and probe.choice == "int8"  # priced again on the raised curve
    assert probe.costs("int8", threads=1)[0] == {1: 120.0, 2: 120.0}
    assert Probe.from_dict(probe.as_dict()).curves == probe.curves
