"""Sweeps and the shoot-out repeat their runs round-robin with standard decoding and report the spread:
the order the configurations were advanced in, each repeat's speedup against its own round's baseline,
a point's median and range from its repeats, the timing judge's flags, error bars and ranges in the
figures and the table, and older recordings (one run a point, no range) still loading and drawing.

Synthetic traces with chosen timings (the fake clocks) where the numbers are asserted; the tiny pair
where the real decoders run."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from specviz.core.settings import DecodeSettings
from specviz.experiments import recorded, repeats, shootout, sweeps
from specviz.experiments.repeats import Spread, combine, round_robin
from specviz.models.tiny import build_tiny_pair
from specviz.serving.service import prepare
from specviz.ui import shootout_ui
from specviz.views import shootout as SV
from specviz.views import sweep_plots as SP
from tests.synthetic import make_std_trace, make_trace

STEP = 0.05  # the standard step of round 1; later rounds' baselines run slower (see Decodes)


class Decodes:
    """The sweeps' and the shoot-out's decoders replaced by synthetic traces, logging what was advanced.

    Round k's standard run steps at STEP × (1, 2, 1.5)[k]: a machine whose load changes between rounds.
    A speculative run's trace has fixed timings, so its tok/s is the same every round and each repeat's
    speedup differs only by its own round's baseline."""

    SLOWDOWN = (1.0, 2.0, 1.5)

    def __init__(self, monkeypatch, flag=lambda spec, std: False):
        self.calls: list[tuple] = []
        self.stds = 0
        self.flag = flag
        for mod in (sweeps, shootout):
            monkeypatch.setattr(mod, "standard_decode", self.standard)
            monkeypatch.setattr(mod, "speculative_decode", self.speculative)
        for mod in (sweeps, shootout):  # no pair to build drafters for (where the engine is handed one)
            monkeypatch.setattr(mod, "make_drafter", lambda pair, settings: None)
        monkeypatch.setattr(sweeps, "noisy", self.noisy)
        monkeypatch.setattr(shootout, "noisy", self.noisy)

    def timed(self) -> list[tuple]:
        return [c for c in self.calls if c[1] != sweeps.WARMUP_TOKENS]

    def standard(self, pair, ids, settings, **kw):
        self.calls.append(("standard", settings.max_new_tokens))
        if settings.max_new_tokens == sweeps.WARMUP_TOKENS:
            return make_std_trace(step=STEP)
        k = self.stds
        self.stds += 1
        return make_std_trace(step=STEP * self.SLOWDOWN[k % len(self.SLOWDOWN)])

    def speculative(self, pair, ids, settings, **kw):
        self.calls.append(("speculative", settings.max_new_tokens, settings.drafter, settings.gamma,
                           settings.epsilon, settings.variant))
        return replace(make_trace(gamma=settings.gamma, draft_token_s=0.01, verify_s=0.12), settings=settings)

    def noisy(self, spec, std, prices=None):
        return self.flag(spec, std)


def request(**kw) -> SimpleNamespace:
    return SimpleNamespace(pair=None, prompt_ids=[1, 2, 3], prompt="p",
                           settings=DecodeSettings(gamma=4, max_new_tokens=48, **kw))


# ---- the order ------------------------------------------------------------------------------------


def test_round_robin_takes_every_key_once_per_round():
    assert list(round_robin("ABC", 2)) == [(0, "A"), (0, "B"), (0, "C"), (1, "A"), (1, "B"), (1, "C")]
    with pytest.raises(ValueError):
        list(round_robin("AB", 0))
    checks = []

    def budget():  # spent after the 4th step started: the 5th never does
        checks.append(1)
        return len(checks) >= 4

    assert list(round_robin("ABC", 3, budget)) == [(0, "A"), (0, "B"), (0, "C"), (1, "A")]


def test_the_gamma_sweep_runs_round_robin_with_its_baseline_first_in_every_round(monkeypatch):
    log = Decodes(monkeypatch)
    steps = list(sweeps.gamma_sweep(request(), gammas=(1, 3), repeats=3))
    advanced = [("std",) if c[0] == "standard" else ("γ", c[3]) for c in log.timed()]
    assert advanced == [("std",), ("γ", 1), ("γ", 3)] * 3
    said = [m for _, m, _ in steps if m.startswith("γ = 1")]
    assert len(said) == 3 and [m.rsplit(" (", 1)[1] for m in said] == ["repeat 1/3)", "repeat 2/3)", "repeat 3/3)"]
    assert [len(points) for _, m, points in steps if m.startswith("γ =")][-1] == 3  # the baseline and two γ
    assert steps[-1][0] == pytest.approx(1.0)


def test_the_epsilon_sweep_runs_round_robin_too(monkeypatch):
    log = Decodes(monkeypatch)
    list(sweeps.epsilon_sweep(request(), epsilons=(0.0, 0.4), repeats=2))
    advanced = [("std",) if c[0] == "standard" else (c[4], c[5]) for c in log.timed()]
    assert advanced == [("std",), (0.0, "opt"), (0.0, "uno"), (0.4, "opt"), (0.4, "uno")] * 2


def test_the_shootout_runs_round_robin_and_does_not_retry_a_drafter_that_cannot_run(monkeypatch):
    log = Decodes(monkeypatch)
    real = log.speculative

    def speculative(pair, ids, settings, **kw):
        if settings.drafter == "prompt-lookup":
            from specviz.core.settings import SettingsError
            log.calls.append(("speculative", settings.max_new_tokens, settings.drafter))
            raise SettingsError("not for this pair")
        return real(pair, ids, settings, **kw)

    monkeypatch.setattr(shootout, "speculative_decode", speculative)
    line = [c for c in shootout.lineup(request().settings) if c.key in ("model", "prompt-lookup", "tree", "standard")]
    steps = list(shootout.run(request(), line, repeats=3))
    advanced = [c[0] if c[0] == "standard" else c[2] for c in log.timed()]
    assert advanced == ["standard", "model", "prompt-lookup", "tree"] + ["standard", "model", "tree"] * 2
    rows = steps[-1][2]
    assert [r.key for r in rows] == ["model", "prompt-lookup", "tree", "standard"]  # the table's order
    by = {r.key: r for r in rows}
    assert by["prompt-lookup"].error == "not for this pair" and by["prompt-lookup"].repeats is None
    assert by["model"].repeats == by["tree"].repeats == by["standard"].repeats == 3
    assert by["standard"].speedup == 1.0 and by["standard"].speedup_lo is None  # 1× by definition: no range
    assert steps[-1][1] == "3 of 4 ran, 3 repeats each" and steps[-1][0] == 1.0


# ---- the spread ----------------------------------------------------------------------------------


def test_a_spread_is_the_median_and_range_of_the_repeats():
    s = Spread.of([3.0, None, 1.0, 2.5])
    assert (s.median, s.lo, s.hi, s.n) == (2.5, 1.0, 3.0, 3)
    assert Spread.of([None]) is None and Spread.of([]) is None
    assert Spread.of([1.0, 2.0]).median == 1.5
    assert s.fields("speedup") == {"speedup": 2.5, "speedup_lo": 1.0, "speedup_hi": 3.0}
    point = combine([{"gamma": 2, "speedup": 1.2, "edit_distance": 0}, {"gamma": 2, "speedup": 0.9, "edit_distance": 0},
                     {"gamma": 2, "speedup": 1.1, "edit_distance": 0}], ("speedup",), ("speedup",), [False, True, True])
    assert point == {"gamma": 2, "speedup": 1.1, "edit_distance": 0, "speedup_lo": 0.9, "speedup_hi": 1.2,
                     "repeats": 3, "noisy": 2}


def test_each_repeats_speedup_is_divided_by_its_own_rounds_baseline(monkeypatch):
    """The baselines of rounds 1-3 step at 1, 2 and 1.5 × STEP; the speculative runs are the same every
    round.  So the repeats' speedups are r, 2r and 1.5r (r the first round's): the median 1.5r, the
    range r-2r; a sweep that divided by one baseline would have no spread at all."""
    Decodes(monkeypatch)
    points = list(sweeps.gamma_sweep(request(), gammas=(4,), repeats=3))[-1][2]
    base, point = points
    spec_tps = make_trace(gamma=4, draft_token_s=0.01, verify_s=0.12).summary().tokens_per_s
    std_tps = [make_std_trace(step=STEP * k).summary().tokens_per_s for k in Decodes.SLOWDOWN]
    ratios = sorted(spec_tps / t for t in std_tps)
    assert point["gamma"] == 4 and point["repeats"] == 3 and point["noisy"] == 0
    assert point["speedup"] == pytest.approx(ratios[1])
    assert (point["speedup_lo"], point["speedup_hi"]) == (pytest.approx(ratios[0]), pytest.approx(ratios[2]))
    assert point["tokens_per_s"] == point["tokens_per_s_lo"] == point["tokens_per_s_hi"] == pytest.approx(spec_tps)
    assert base["gamma"] == 0 and base["repeats"] == 3
    assert base["tokens_per_s"] == pytest.approx(sorted(std_tps)[1])
    assert (base["tokens_per_s_lo"], base["tokens_per_s_hi"]) == (pytest.approx(min(std_tps)), pytest.approx(max(std_tps)))
    assert "speedup" not in base  # the baseline is not a point of the speedup curve
    recorded.GammaRow.model_validate(point)  # what the recording keeps
    recorded.GammaRow.model_validate(base)


def test_the_shootout_rows_spread_and_keep_their_median_repeats_trace_with_its_own_baseline(monkeypatch):
    Decodes(monkeypatch)
    line = [c for c in shootout.lineup(request().settings) if c.key in ("model", "standard")]
    rows = list(shootout.run(request(), line, repeats=3))[-1][2]
    model, std = rows
    spec_tps = make_trace(gamma=4, draft_token_s=0.01, verify_s=0.12).summary().tokens_per_s
    ratios = sorted(spec_tps / make_std_trace(step=STEP * k).summary().tokens_per_s for k in Decodes.SLOWDOWN)
    assert model.speedup == pytest.approx(ratios[1])
    assert (model.speedup_lo, model.speedup_hi) == (pytest.approx(ratios[0]), pytest.approx(ratios[2]))
    # The kept trace's partner is the baseline of its own round (the 1.5 × STEP one, third round).
    assert model.baseline.rounds[0].t_verify == pytest.approx(STEP * 1.5)
    assert model.trace.summary().tokens_per_s / model.baseline.summary().tokens_per_s == pytest.approx(model.speedup)
    assert std.tokens_per_s_lo < std.tokens_per_s < std.tokens_per_s_hi and std.same_text is True
    assert "baseline" not in model.as_dict() and "trace" not in model.as_dict()
    recorded.ShootoutRow.model_validate(model.as_dict())


def test_repeats_the_timing_judge_flags_are_counted(monkeypatch):
    """The judge (mocked here: the second round's runs are flagged) marks points, not whole sweeps."""
    def flag(spec, std):
        return std is not None and std.rounds[0].t_verify == pytest.approx(STEP * 2)

    Decodes(monkeypatch, flag=flag)
    points = list(sweeps.gamma_sweep(request(), gammas=(2, 5), repeats=3))[-1][2]
    assert [p["noisy"] for p in points if p["gamma"] > 0] == [1, 1]
    assert all(p["repeats"] == 3 for p in points)


def test_the_timing_judge_flags_a_repeat_whose_passes_scattered():
    clean = make_std_trace(step=0.11)
    busy = make_std_trace(step=0.11)
    for r in busy.rounds[::3]:  # every third step stretched by other work
        r.t_verify = 0.5
    assert not repeats.noisy(None, clean) and repeats.noisy(None, busy)
    spec = make_trace(draft_token_s=0.01, verify_s=0.12)
    assert repeats.noisy(spec, busy) and spec.timing is not None and not spec.timing.reliable
    assert spec.timing.how == "sequential"


def test_the_tiny_pairs_gamma_sweep_and_shootout_advance_round_robin(monkeypatch):
    """The real decoders on the tiny pair, wrapped to log which configuration was advanced."""
    pair = build_tiny_pair()
    req = prepare(pair, "a b a b a b a", max_new_tokens=8, gamma=3)
    order = []
    for mod in (sweeps, shootout):
        spec, std = mod.speculative_decode, mod.standard_decode

        def logged_spec(pair, ids, settings, _f=spec, _m=mod, **kw):
            if settings.max_new_tokens != sweeps.WARMUP_TOKENS:
                order.append(settings.gamma if _m is sweeps else settings.drafter)
            return _f(pair, ids, settings, **kw)

        def logged_std(pair, ids, settings, _f=std, **kw):
            if settings.max_new_tokens != sweeps.WARMUP_TOKENS:
                order.append("standard")
            return _f(pair, ids, settings, **kw)

        monkeypatch.setattr(mod, "speculative_decode", logged_spec)
        monkeypatch.setattr(mod, "standard_decode", logged_std)
    points = list(sweeps.gamma_sweep(req, gammas=(1, 2), repeats=2))[-1][2]
    assert order == ["standard", 1, 2, "standard", 1, 2]
    assert [p["gamma"] for p in points] == [0, 1, 2] and all(p["repeats"] == 2 for p in points)
    for p in points[1:]:
        assert p["speedup_lo"] <= p["speedup"] <= p["speedup_hi"]
    order.clear()
    line = [c for c in shootout.lineup(req.settings) if c.key in ("model", "tree", "standard")]
    rows = list(shootout.run(req, line, repeats=2))[-1][2]
    assert order == ["standard", "model", "tree"] * 2
    assert [r.key for r in rows] == ["model", "tree", "standard"]
    assert all(r.repeats == 2 and r.same_text for r in rows)


# ---- the figures and the table ------------------------------------------------------------------


GAMMA_ROWS = [
    {"gamma": 1, "speedup": 1.1, "speedup_lo": 1.0, "speedup_hi": 1.3, "alpha": 0.7, "c": 0.1, "repeats": 3, "noisy": 0},
    {"gamma": 2, "speedup": 1.4, "speedup_lo": 1.2, "speedup_hi": 1.5, "alpha": 0.7, "c": 0.1, "repeats": 3, "noisy": 1},
]


def measured(fig):
    (trace,) = [t for t in fig.data if t.name and t.name.startswith("measured")]
    return trace


def test_the_gamma_plot_draws_the_spread_as_asymmetric_error_bars_and_rings_flagged_points():
    fig = SP.gamma_sweep_plot(GAMMA_ROWS)
    m = measured(fig)
    assert m.error_y.symmetric is False and m.error_y.type == "data"
    assert list(m.error_y.array) == pytest.approx([0.2, 0.1]) and list(m.error_y.arrayminus) == pytest.approx([0.1, 0.2])
    assert "median of 3" in m.name.replace("<br>", " ") and "range 1.00–1.30×" in m.text[0]
    (ring,) = [t for t in fig.data if t.name == "timings flagged noisy"]
    assert list(ring.x) == [2] and list(ring.y) == [1.4] and "1 of 3" in ring.text[0]


def test_the_epsilon_plot_draws_error_bars_on_the_speedup_panel():
    rows = [{"epsilon": e, "variant": "opt", "alpha": 0.5, "speedup": 1.0 + e, "speedup_lo": 0.9 + e,
             "speedup_hi": 1.2 + e, "mean_bias": 0.0, "repeats": 2, "noisy": int(e > 0)} for e in (0.0, 0.5)]
    fig = SP.epsilon_sweep_plot(rows)
    (speed,) = [t for t in fig.data if t.name == "speedup (OPT)"]
    assert list(speed.error_y.array) == pytest.approx([0.2, 0.2]) and list(speed.error_y.arrayminus) == pytest.approx([0.1, 0.1])
    (alpha,) = [t for t in fig.data if t.name == "alpha (OPT)"]
    assert alpha.error_y.array is None  # α is the same every repeat (same seed): no bars
    (ring,) = [t for t in fig.data if t.name == "timings flagged noisy (OPT)"]
    assert list(ring.x) == [0.5]


def test_the_shootout_table_shows_ranges_and_marks_flagged_rows():
    rows = [{"key": "model", "label": "draft model", "policy": "confidence", "alpha": 0.8, "tokens_per_s": 6.0,
             "tokens_per_s_lo": 5.5, "tokens_per_s_hi": 6.25, "speedup": 1.23, "speedup_lo": 1.18, "speedup_hi": 1.27,
             "repeats": 3, "noisy": 1, "same_text": True},
            {"key": "standard", "label": "standard decoding", "tokens_per_s": 4.9, "tokens_per_s_lo": 4.8,
             "tokens_per_s_hi": 5.0, "speedup": 1.0, "repeats": 3, "noisy": 0, "same_text": True}]
    table = SV.table_html(rows, "cap")
    assert "1.23× (1.18–1.27)" in table and "6.00 (5.50–6.25)" in table and "4.90 (4.80–5.00)" in table
    assert 'data-key="model" data-noisy="1"' in table and SV.NOISY in table and "1 of 3 repeats" in table
    assert '<tr data-key="standard">' in table and "1.00×<" in table  # no range: 1× by definition
    assert "median of 3 repeats" in table
    fig = SV.chart(rows)
    (speed,) = [t for t in fig.data if t.name == "speedup"]
    assert list(speed.error_x.array) == pytest.approx([0.04, 0.0]) and list(speed.error_x.arrayminus) == pytest.approx([0.05, 0.0])
    assert speed.customdata[0] == "1.23× (1.18–1.27)"
    (tps,) = [t for t in fig.data if t.name == "tok/s"]
    assert list(tps.error_x.array) == pytest.approx([0.25, 0.1])


# ---- recordings, old and new --------------------------------------------------------------------


OLD = {"schema": "specviz.sweeps", "version": 1, "machine": "some CPU (cpu)", "date": "2026-11-20T10:00:00+00:00",
       "models": {"draft": "d", "target": "t"}, "prompt": "p", "settings": {"max_new_tokens": 48, "temperature": 0.0},
       "gamma": [{"gamma": 0, "tokens_per_s": 4.0},
                 {"gamma": 2, "tokens_per_s": 5.0, "speedup": 1.25, "alpha": 0.7, "c": 0.1, "v": 1.2,
                  "theoretical_speedup": 1.4}],
       "epsilon": [{"epsilon": 0.0, "variant": "opt", "speedup": 1.2, "tokens_per_s": 4.8, "edit_distance": 0}],
       "shootout": [{"key": "model", "label": "draft model", "tokens_per_s": 5.0, "speedup": 1.25},
                    {"key": "standard", "label": "standard decoding", "tokens_per_s": 4.0, "speedup": 1.0}]}


def test_an_old_recording_without_spread_still_loads_and_draws_without_error_bars(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps(OLD), encoding="utf-8")
    rec = recorded.load(path)
    assert rec.repeats is None and rec.gamma[1].speedup_lo is None and rec.shootout[0].repeats is None
    frame = shootout_ui.recorded_frame(path)
    assert "Showing results recorded on some CPU" in frame.status and "repeats" not in frame.status
    m = measured(frame.gamma_plot)
    assert list(m.y) == [1.25] and m.error_y.array is None
    assert not [t for t in frame.gamma_plot.data if t.name == "timings flagged noisy"]
    assert "1.25×<" in frame.shootout_table and "(" not in frame.shootout_table.split("1.25×")[1][:3]
    assert "median of" not in frame.shootout_table


def test_the_shipped_recording_still_loads():
    rec = recorded.load()
    assert rec.gamma and rec.shootout
    assert measured(shootout_ui.recorded_frame().gamma_plot).y  # drawn, with or without a spread


def test_a_recording_with_repeats_round_trips_and_draws_its_spread(monkeypatch, tmp_path):
    Decodes(monkeypatch)
    req = request()
    gamma = list(sweeps.gamma_sweep(req, gammas=(2, 4), repeats=3))[-1][2]
    eps = list(sweeps.epsilon_sweep(req, epsilons=(0.0, 0.2), repeats=3))[-1][2]
    rows = list(shootout.run(req, [c for c in shootout.lineup(req.settings) if c.key in ("model", "standard")],
                             repeats=3))[-1][2]
    rec = recorded.Recorded(schema="specviz.sweeps", version=recorded.VERSION, machine="m (cpu)", date="2026-11-27",
                            repeats=3, models={"draft": "d", "target": "t"}, prompt="p", settings=req.settings.as_dict(),
                            gamma=gamma, epsilon=eps, shootout=[r.as_dict() for r in rows])
    path = tmp_path / "sweeps.json"
    path.write_text(rec.to_json(), encoding="utf-8")
    back = recorded.load(path)
    assert back.repeats == 3 and all(r.repeats == 3 for r in back.gamma + back.epsilon)
    assert back.gamma[1].speedup_lo <= back.gamma[1].speedup <= back.gamma[1].speedup_hi
    frame = shootout_ui.recorded_frame(path)
    assert "median of 3 repeats run round-robin" in frame.status
    assert measured(frame.gamma_plot).error_y.array is not None
    assert "median of 3 repeats" in frame.shootout_table and "× (" in frame.shootout_table


def test_the_shipped_epsilon_sweep_shows_what_epsilon_does():
    """The recorded ε sweep samples where α < 1, so α and the bias visibly rise with ε (a greedy sweep at
    α = 1 showed nothing: bias 0 and TV 0 at every ε), and it was measured with repeats on a named machine."""
    rec = recorded.load(recorded.DEFAULT_PATH)
    assert (rec.epsilon_settings or rec.settings).get("temperature", 0) > 0
    assert rec.repeats and rec.repeats >= 3 and "AVX" in rec.machine  # the probe's label: CPU and ISA
    for variant in ("opt", "uno"):
        rows = sorted((r for r in rec.epsilon if r.variant == variant), key=lambda r: r.epsilon)
        assert len(rows) >= 4
        alphas, biases = [r.alpha for r in rows], [r.mean_bias for r in rows]
        assert alphas[0] < 1 and alphas[-1] > alphas[0] + 0.1
        assert all(b >= a - 1e-3 for a, b in zip(alphas, alphas[1:])), alphas
        assert biases[-1] > biases[0] + 0.1 and all(b >= a - 1e-3 for a, b in zip(biases, biases[1:])), biases
        assert all(r.speedup_lo is not None and r.speedup_lo <= r.speedup <= r.speedup_hi for r in rows)
