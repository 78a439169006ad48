"""Export -> load round-trips: a loaded recording replays exactly what was recorded, with no model."""

from __future__ import annotations

import json

import pytest

from specviz.core.engine import standard_decode
from specviz.core.settings import DecodeSettings
from specviz.models.tiny import build_tiny_pair
from specviz.trace import TraceError, load_recording, recording_to_json
from specviz.views import html as V
from specviz.views import plots as P
from specviz.views import race_plots as RP
from specviz.views import theory_plots as TP
from tests.drafted import speculative_decode


@pytest.fixture(scope="module")
def race():
    pair = build_tiny_pair(vocab_size=40, seed=3)
    s = DecodeSettings(gamma=4, temperature=0.8, top_p=0.95, max_new_tokens=40, seed=11)
    ids = [5, 6, 7, 8]
    return speculative_decode(pair, ids, s, prompt="a <b>prompt</b>"), standard_decode(pair, ids, s, prompt="a <b>prompt</b>")


def test_round_trip_gives_identical_animation_and_numbers(race):
    spec, std = race
    text = recording_to_json(spec, std)
    spec2, std2 = load_recording(text)
    assert spec2.to_dict() == spec.to_dict() and std2.to_dict() == std.to_dict()
    assert spec2.summary() == spec.summary()
    # The animation, step mode, race replay and every plot render identically.
    assert V.rounds_html(spec2) == V.rounds_html(spec)
    for i, rnd in enumerate(spec.rounds):
        assert V.round_html(spec2.rounds[i], spec2.gamma) == V.round_html(rnd, spec.gamma)
        assert V.narrate(spec2.rounds[i], spec2) == V.narrate(rnd, spec)
    for t in (0.0, spec.t_total / 2, max(spec.t_total, std.t_total)):
        assert V.race_html(spec2, std2, at_time=t) == V.race_html(spec, std, at_time=t)
    assert V.metrics_html(spec2.summary(), gamma=4) == V.metrics_html(spec.summary(), gamma=4)
    for make in (P.acceptance_by_position, P.tokens_per_round_hist, P.round_times, TP.theorem1_plot):
        assert make(spec2).to_json() == make(spec).to_json()
    for make in (RP.tokens_vs_time, RP.speedup_bars):
        assert make(spec2, std2).to_json() == make(spec, std).to_json()
    # A second export is byte-identical to the first.
    assert recording_to_json(spec2, std2) == text


def test_bare_trace_loads_too(race):
    spec, std = race
    s, t = load_recording(spec.to_json())
    assert t is None and s.to_dict() == spec.to_dict()
    s, t = load_recording(std.to_json().encode())
    assert s is None and t.to_dict() == std.to_dict()


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(schema="other"), "not a specviz recording"),
    (lambda d: d["speculative"].update(kind="standard"), "not a speculative trace"),
    (lambda d: d["speculative"]["rounds"][0]["positions"][0].update(u=2.5), "not a probability"),
    (lambda d: d["speculative"]["rounds"][0].update(emitted=[{"id": 1, "text": "x", "origin": "magic"}]), "origin"),
    (lambda d: d.update(version=99), "version"),
])
def test_bad_recordings_are_refused_clearly(race, mutate, message):
    doc = json.loads(recording_to_json(*race))
    mutate(doc)
    with pytest.raises(TraceError, match=message):
        load_recording(json.dumps(doc))
