"""What the page shows for chain and tree runs, and the parts of presenter mode a unit test can see
(issue 22, parts 3 and 5).  The browser checks are in tests/test_present_browser.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specviz.core import engine
from specviz.core.settings import DecodeSettings
from specviz.models import encode_prompt
from specviz.models.tiny import build_tiny_pair
from tests import drafted
from specviz.trace import load_recording
from specviz.ui import links, live

ROOT = Path(__file__).resolve().parents[1]
RECORDINGS = sorted((ROOT / "assets" / "traces").glob("*.json"))
EXAMPLES = json.loads((ROOT / "assets" / "examples.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def tree_run():
    pair = build_tiny_pair()
    ids = encode_prompt(pair, "hello there")
    s = DecodeSettings.checked(gamma=3, max_new_tokens=12, temperature=1.0, seed=2, drafter="tree", branches=2,
                               tree_nodes=6, tree_mode="iid")
    return drafted.speculative_decode(pair, ids, s, prompt="hello there"), engine.standard_decode(pair, ids, s,
                                                                                                prompt="hello there")


def test_chain_runs_hide_the_tree_parts_and_tree_runs_show_them(tree_run):
    chain = live.show_recording(*load_recording(RECORDINGS[0].read_bytes()), "Loaded")
    assert chain.tree_mask_box == {"__type__": "update", "visible": False}
    assert chain.tree_plots == {"__type__": "update", "visible": False}
    tree = live.show_recording(*tree_run, "Loaded")
    assert tree.tree_mask_box["visible"] is True and tree.tree_plots["visible"] is True
    assert tree.plot_tree_size.layout.meta != {"empty": True}  # and they have something to show


@pytest.mark.parametrize("value, on", [("1", True), ("true", True), ("yes", True), ("on", True), ("", False),
                                       ("0", False), ("no", False), ("<b>", False)])
def test_the_present_flag(value, on):
    link = links.parse_link({"present": value, "recording": RECORDINGS[1].stem}, examples=EXAMPLES,
                            recordings=RECORDINGS)
    assert link.present is on and link.recording == RECORDINGS[1]
    if value in ("", "0", "no", "1", "true", "yes", "on"):
        assert not link.notes
    else:
        assert "present" in link.note and "<" not in link.note  # a value it cannot read: a plain note


def test_the_present_flag_alone_and_a_link_query_keeps_it():
    assert links.parse_link({"present": "1"}, examples=EXAMPLES, recordings=RECORDINGS).present
    assert not links.parse_link({}, examples=EXAMPLES, recordings=RECORDINGS).present
    spec, _ = load_recording(RECORDINGS[0].read_bytes())
    q = links.link_query(spec, 3, examples=EXAMPLES, recordings=RECORDINGS, present=True)
    assert q.endswith("&present=1") and "round=3" in q
    assert "present" not in links.link_query(spec, 3, examples=EXAMPLES, recordings=RECORDINGS)
