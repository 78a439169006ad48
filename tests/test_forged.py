"""Issue 33: values a client forges for the page's events are refused with Gradio's own message and one log
line, never a traceback (specviz.serving.forged).  Small Blocks, no server: tests/test_fuzz.py sends the
same through a running app's queue and reads its log."""

from __future__ import annotations

import asyncio
import logging
import math
from pathlib import Path

import gradio as gr
import pytest
from fastapi import HTTPException
from gradio import route_utils
from gradio.exceptions import ComponentProcessingError, Error

from specviz.serving import forged, stream_log


@pytest.fixture(scope="module")
def demo():
    forged.install()
    with gr.Blocks() as demo:
        step = gr.Slider(1, 10, value=1, step=1)
        pick = gr.Radio(["a", "b"], value="a")
        out = gr.Number()
        step.change(lambda v, p: v, [step, pick], out)
    return demo


def preprocess(demo, values):
    return asyncio.run(demo.preprocess_data(demo.fns[0], values, None))


@pytest.mark.parametrize("value,words", [(math.inf, "greater than maximum"), (-math.inf, "less than minimum"),
                                         (10**30, "greater than maximum")])
def test_a_value_out_of_a_sliders_range_is_refused_without_a_traceback(demo, value, words, caplog):
    with caplog.at_level(logging.WARNING, "specviz.forged"), pytest.raises(Error) as err:
        preprocess(demo, [value, "a"])
    assert words in str(err.value)
    assert err.value.print_exception is False  # the queue prints a traceback for an Error unless this is False
    assert [r.name for r in caplog.records] == ["specviz.forged"] and "refused the values" in caplog.text


@pytest.mark.parametrize("values", [[[1], "a"], [{"a": 1}, "a"], ["abc", "a"], [None, "a"], [2, math.nan], [2, "zzz"]])
def test_a_value_of_the_wrong_kind_is_a_plain_refusal_not_a_processing_error(demo, values):
    """Gradio wraps what a component's preprocess raises (a TypeError comparing a list with a number…) in a
    ComponentProcessingError, printed with its traceback; here it is a gr.Error with the cause's words."""
    with pytest.raises(Error) as err:
        preprocess(demo, values)
    assert not isinstance(err.value, ComponentProcessingError)
    assert err.value.print_exception is False and str(err.value).strip()


def test_good_values_still_go_through(demo):
    assert preprocess(demo, [3, "b"]) == [3, "b"]


def test_an_event_number_the_page_does_not_have_is_a_404(demo):
    class Body:
        session_hash = None
        fn_index = 10**6

    with pytest.raises(HTTPException) as err:
        route_utils.get_fn(demo, None, Body())
    assert err.value.status_code == 404
    Body.fn_index = -1
    with pytest.raises(HTTPException):
        route_utils.get_fn(demo, None, Body())
    Body.fn_index = 0
    assert route_utils.get_fn(demo, None, Body()) is demo.fns[0]


def test_installed_once_by_the_servers_log_setup():
    """app.py's main calls stream_log.install(), which installs this too; installing again changes nothing."""
    stream_log.install(logging.getLogger("test-forged"))
    patched = gr.Blocks.preprocess_data
    assert getattr(patched, forged._INSTALLED, False)
    assert forged.install() and gr.Blocks.preprocess_data is patched


# ---- Gradio's session limit: the sessions holding nothing go first (specviz.serving.sessions) -------


def test_api_calls_from_new_sessions_never_push_out_a_page_holding_a_run():
    """Three page sessions hold a run; 300 later requests from new sessions (API calls, pages that show
    nothing) pass a limit of 128: the three stay.  Before, Gradio dropped the least recently used whatever it
    held, and 128 API calls emptied every page (scripts/crowd.py's keepers: 0 of 3 kept)."""
    from gradio.state_holder import StateHolder

    from specviz.serving import sessions

    assert sessions.install()
    with gr.Blocks() as demo:
        state = gr.State(None)
        n = gr.Number()
        n.change(lambda x: x, n, n)
    demo.state_session_capacity = 128
    holder = StateHolder()
    holder.set_blocks(demo)
    for k in range(3):
        holder[f"page-{k}"][state._id] = {"spec": f"run {k}"}
    for k in range(300):
        holder[f"api-{k}"]  # a request from a new session: it holds no gr.State value
    assert len(holder.session_data) == 128
    assert all(f"page-{k}" in holder for k in range(3))
    assert holder["page-0"][state._id] == {"spec": "run 0"}
    assert "api-299" in holder and "api-0" not in holder  # the empty ones go oldest first


def test_when_every_session_holds_something_the_oldest_goes_as_before():
    from gradio.state_holder import StateHolder

    from specviz.serving import sessions

    sessions.install()
    with gr.Blocks() as demo:
        state = gr.State(None)
    demo.state_session_capacity = 4
    holder = StateHolder()
    holder.set_blocks(demo)
    for k in range(6):
        holder[f"page-{k}"][state._id] = [k]
    assert list(holder.session_data) == [f"page-{k}" for k in range(2, 6)]
    assert not sessions.holds_something(holder[f"new"]) and "page-2" not in holder  # a new one pushes out the oldest


def test_empty_values_hold_nothing():
    from specviz.serving import sessions

    with gr.Blocks() as demo:
        a, b = gr.State(None), gr.State([])
        t = gr.Textbox()

    class S:
        blocks_config = type("C", (), {"blocks": demo.blocks})()
        state_data = {a._id: None, b._id: [], t._id: "text in a textbox is not a held run"}

    assert not sessions.holds_something(S())
    S.state_data = {b._id: [1]}
    assert sessions.holds_something(S())


def test_an_evicted_session_runs_its_delete_callbacks_and_frees_the_store():
    """Past the limit, an evicted session's gr.State delete callback runs (Gradio's own eviction runs none),
    so the store entry it held goes with it; a page showing only a shipped recording holds nothing of its own
    and goes before a page holding a run."""
    from gradio.state_holder import StateHolder

    from specviz.serving import sessions
    from specviz.ui.store import Shown, TraceStore

    store = TraceStore(max_entries=10, max_bytes=10**6, session_bytes=10**6)
    assert sessions.install()
    with gr.Blocks() as demo:
        state = gr.State(None, delete_callback=store.drop)
    demo.state_session_capacity = 3
    holder = StateHolder()
    holder.set_blocks(demo)
    shipped = next(iter(sorted((Path(__file__).resolve().parents[1] / "assets" / "traces").glob("*.json"))))
    for k in range(3):
        holder[f"page-{k}"][state._id] = store.put(None, None, 10, session=f"page-{k}")
    holder["visitor"][state._id] = Shown.shipped(shipped)
    assert not sessions.holds_something(holder["visitor"])
    assert "visitor" in holder and "page-0" not in holder and len(store) == 2  # page-0 went, with its entry
    holder["visitor-2"][state._id] = Shown.shipped(shipped)
    assert "visitor" not in holder and all(f"page-{k}" in holder for k in (1, 2))  # the empty one went first


def test_the_session_patch_is_pinned_to_the_tested_gradio(monkeypatch):
    from gradio.state_holder import StateHolder

    from specviz.serving import sessions

    assert sessions.TESTED == gr.__version__  # the version requirements.txt installs
    original = StateHolder.update
    monkeypatch.setattr(StateHolder, "update", lambda self, sid: None)  # a fresh, unpatched holder
    monkeypatch.setattr(gr, "__version__", "99.0.0")
    assert sessions.install() is False and not getattr(StateHolder.update, sessions._INSTALLED, False)
    monkeypatch.setattr(StateHolder, "update", original)


def test_a_session_whose_event_is_running_is_not_evicted_as_empty():
    """A new visitor's first event (an upload being read) holds nothing yet: past the limit it is spared while its
    event runs, so the run it is about to show is not written to a session Gradio already dropped."""
    from types import SimpleNamespace

    from gradio.state_holder import StateHolder

    from specviz.serving import sessions

    assert sessions.install()
    with gr.Blocks() as demo:
        gr.State(None)
    demo.state_session_capacity = 2
    holder = StateHolder()
    holder.set_blocks(demo)
    demo._queue = SimpleNamespace(event_ids_to_events={"e1": SimpleNamespace(session_hash="uploading")})
    holder["uploading"]
    for k in range(5):
        holder[f"visit-{k}"]
    assert "uploading" in holder and "visit-4" in holder and len(holder.session_data) == 2
