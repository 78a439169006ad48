"""Deep links (specviz.ui.links): what a URL may name, what it cannot, and the link step mode writes."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qs

import pytest

from specviz.trace import load_recording
from specviz.ui import links

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = json.loads((ROOT / "assets" / "examples.json").read_text(encoding="utf-8"))
RECORDINGS = sorted((ROOT / "assets" / "traces").glob("*.json"))


def parse(**params):
    return links.parse_link(params, examples=EXAMPLES, recordings=RECORDINGS)


def test_a_recording_an_example_and_a_round():
    link = parse(recording=RECORDINGS[0].stem, round="7")
    assert link.recording == RECORDINGS[0] and link.round == 7 and not link.notes
    assert parse(recording=RECORDINGS[0].name).recording == RECORDINGS[0]  # with .json too
    by_place = parse(example="2", step="3")  # an example opens its shipped recording
    assert by_place.example is EXAMPLES[1] and by_place.round == 3
    assert load_recording(by_place.recording.read_bytes())[0].prompt == EXAMPLES[1]["prompt"]
    assert parse(example=EXAMPLES[0]["label"].upper()).example is EXAMPLES[0]


@pytest.mark.parametrize("params, note", [
    ({"recording": "../../etc/passwd"}, "no recording named"),
    ({"example": "<script>alert(1)</script>"}, "no example"),
    ({"example": "0"}, "no example"),
    ({"round": "-3"}, "not a round number"),
    ({"round": "1e9"}, "not a round number"),
    ({"round": "9" * 400}, "not a round number"),
    ({"step": "٣"}, "not a round number"),  # a digit, but not an ASCII one
])
def test_hostile_values_are_ignored_with_a_short_plain_note(params, note):
    link = links.parse_link(params, examples=EXAMPLES, recordings=RECORDINGS)
    assert link.recording is None and link.round is None and note in link.note
    assert len(link.note) < 120 and "<" not in link.note and "/etc" not in link.note.replace("../../etc/passwd", "")


def test_unknown_keys_lists_and_nothing_at_all():
    assert links.parse_link(None, examples=EXAMPLES, recordings=RECORDINGS) == links.Link()
    assert parse(theme="dark", foo="bar") == links.Link()
    assert links.parse_link({"round": ["4", "5"]}, examples=EXAMPLES, recordings=RECORDINGS).round == 4


def test_the_link_names_the_recording_shown_else_its_example():
    spec, _ = load_recording(RECORDINGS[0].read_bytes())
    q = parse_qs(links.link_query(spec, 4, examples=EXAMPLES, recordings=RECORDINGS))
    assert q == {"recording": [RECORDINGS[0].stem], "round": ["4"]}
    spec.rounds = spec.rounds[:-1]  # not the recorded run any more: its example instead
    q = parse_qs(links.link_query(spec, "x", examples=EXAMPLES, recordings=RECORDINGS))
    idx = next(i for i, e in enumerate(EXAMPLES, 1) if e["prompt"] == spec.prompt)
    assert q == {"example": [str(idx)], "round": ["1"]}
    assert links.link_query(None, 2, examples=EXAMPLES, recordings=RECORDINGS) == "round=2"


def test_open_link_steps_to_the_round_and_says_what_it_ignored():
    frame = links.open_link(parse(recording=RECORDINGS[1].stem, round="2"), RECORDINGS)
    assert frame.step.value == 2 and frame.state.get("spec").prompt == load_recording(
        RECORDINGS[1].read_bytes())[0].prompt
    far = links.open_link(parse(recording=RECORDINGS[1].stem, round="999"), RECORDINGS)
    n = len(far.state.get("spec").rounds)
    assert far.step.value == n and "past the last round" in far.status
    bad = links.open_link(parse(recording="nope"), RECORDINGS)
    assert "link ignored: no recording named" in bad.status and RECORDINGS[0].stem in bad.status


def test_a_loaded_recording_puts_its_prompt_and_settings_back_in_the_form():
    from specviz.core.settings import DecodeSettings
    from specviz.ui.form import FORM_FROM_TRACE, RunForm, form_values

    spec, _ = load_recording((ROOT / "assets" / "traces" / "3-translation-sampled.json").read_bytes())
    values = form_values(spec)
    assert values["gamma"] == 4 and values["temperature"] == 0.7 and values["prompt"].startswith("Translate")
    assert set(values) == set(FORM_FROM_TRACE) and set(FORM_FROM_TRACE) <= set(RunForm.__dataclass_fields__)
    # the form, filled so, asks for exactly the recorded run
    settings = RunForm(**values).check().settings
    assert settings == DecodeSettings.from_dict(spec.settings.as_dict())
    assert form_values(None) == {}


def test_examples_and_recordings_share_one_numbering():
    """?example=N opens recording N-…: the examples list is in the recordings' order."""
    for rec in RECORDINGS:
        number = rec.stem.split("-", 1)[0]
        link = parse(example=number)
        assert link.recording == rec, (number, link.recording)
        assert link.example is EXAMPLES[int(number) - 1]
