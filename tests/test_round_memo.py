"""Step mode's views are drawn once per recording and round (issue 58: a class's pages step together)."""

from __future__ import annotations

import threading
import weakref
from pathlib import Path

import gradio as gr
import pytest

from specviz.ui import live, picture_ui, tree_ui
from specviz.ui.round_memo import ROUNDS, RoundMemo
from specviz.ui.store import Shown
from specviz.views.acceptance import acceptance_figure, position_choices

SENT = gr.Plot(render=False)
TRACES = sorted((Path(__file__).resolve().parents[1] / "assets" / "traces").glob("*.json"))


class Spec:  # a stand-in trace: weakly referable, with rounds
    def __init__(self, n: int = 3):
        self.rounds = [object()] * n


@pytest.fixture
def shown():
    ROUNDS.clear()
    return Shown.shipped(TRACES[0])


def _json(fig) -> str:
    return fig.to_json()


def test_every_page_stepping_to_a_round_is_served_the_same_views_an_uncached_draw_gives(shown):
    spec = shown.get("spec")
    n = len(spec.rounds)
    assert n >= 3
    for i in (1, 3, n):
        first = picture_ui.on_step(shown, i)
        misses = ROUNDS.misses
        for _ in range(5):  # five more pages: every view from the memo, nothing drawn again
            again = picture_ui.on_step(shown, i)
            assert again[0] is first[0] and again[1] is first[1]
            assert again[2] is first[2] and again[4] is first[4]  # the very figures
            assert again[3] is not first[3]  # the picker: a fresh update per page
            assert again[3].choices == first[3].choices and again[3].value == first[3].value
        assert ROUNDS.misses == misses
        # ... and what an uncached draw gives
        narration, step_round = live.step_views(spec, i)
        assert (first[0], first[1]) == (narration, step_round)
        assert first[2].plot == SENT.postprocess(tree_ui.mask_for(spec, i)).plot  # as Gradio sends the figure
        rnd = spec.rounds[i - 1]
        choices = position_choices(rnd)
        pick = choices[-1][1] if choices else None
        assert first[3].choices == [(label, value) for label, value in choices] and first[3].value == pick
        assert first[4].plot == SENT.postprocess(acceptance_figure(spec, rnd, pick)).plot
        assert _json(picture_ui.for_position(shown, i, 0)) == _json(acceptance_figure(spec, rnd, 0))
    # A round the page sent out of range is the round it is clamped to (the same entry), not a new one.
    misses = ROUNDS.misses
    assert picture_ui.on_step(shown, 10**9)[4] is picture_ui.on_step(shown, n)[4]
    assert ROUNDS.misses == misses


def test_another_recording_at_the_same_round_is_drawn_for_itself(shown):
    other = Shown.shipped(TRACES[1])
    a, b = picture_ui.on_step(shown, 2), picture_ui.on_step(other, 2)
    assert a[0] != b[0] and a[4].plot != b[4].plot
    assert picture_ui.on_step(None, 2)[0] == live.step_views(None, 2)[0]  # nothing shown


def test_the_memo_is_bounded_and_never_serves_another_traces_entry():
    memo = RoundMemo(entries=3)
    specs = [Spec() for _ in range(5)]
    for s in specs:
        assert memo.get(s, "k", lambda s=s: id(s)) == id(s)
    assert len(memo) == 3 and memo.misses == 5
    # An entry whose trace is gone, its id now another trace's: made again for the new one.
    a, b = Spec(), Spec()
    memo.get(a, "k", lambda: "a's")
    memo._data[memo._key(b, "k")] = (weakref.ref(a), "a's")  # as if b had a's old id
    assert memo.get(b, "k", lambda: "b's") == "b's"
    # The same trace with more rounds (never in practice: a shown trace does not grow) is drawn again.
    a.rounds.append(object())
    assert memo.get(a, "k", lambda: "a's, longer") == "a's, longer"


def test_sixty_pages_asking_at_once_draw_a_round_once():
    memo, spec, made = RoundMemo(), Spec(), []
    start = threading.Barrier(60)

    def make():
        made.append(1)
        return object()

    got = []

    def page():
        start.wait()
        got.append(memo.get(spec, ("texts", 2), make))

    threads = [threading.Thread(target=page) for _ in range(60)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and len(got) == 60 and all(g is got[0] for g in got)
    assert memo.hits == 59 and memo.misses == 1
