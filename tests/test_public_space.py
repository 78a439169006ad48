"""A public Space that holds (issue 55): a visit costs no store entry, a full store never breaks the page,
and whatever the server keeps for a session Gradio dropped goes first when room is needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specviz.ui import links, live
from specviz.ui.store import STORE, Shown, StoreFull, TraceStore

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = json.loads((ROOT / "assets" / "examples.json").read_text(encoding="utf-8"))
RECORDINGS = sorted((ROOT / "assets" / "traces").glob("*.json"))


@pytest.fixture
def full_store(monkeypatch):
    """The shared store, full of other live sessions' runs, none over a fair share: a put is refused."""
    small = TraceStore(max_entries=8, max_bytes=10**6, session_bytes=10**5)  # full by count, as at 256 visits
    for k in range(8):
        small.put(None, None, 1_000, session=f"someone-{k}")
    monkeypatch.setattr("specviz.ui.store.STORE", small)
    monkeypatch.setattr("specviz.ui.live.STORE", small)
    with pytest.raises(StoreFull):
        small.put(None, None, 1_000, session="me")
    return small


def test_a_visit_shows_a_shipped_recording_by_name_and_puts_nothing():
    before = len(STORE)
    frame = live.load_example_recording(RECORDINGS, RECORDINGS[1].name)
    assert isinstance(frame.state, Shown) and frame.state.recording == str(RECORDINGS[1])
    assert not frame.state.held and len(STORE) == before
    spec = frame.state.get("spec")
    assert spec is not None and spec.rounds and frame.state.nbytes == RECORDINGS[1].stat().st_size
    assert Path(frame.export).exists()  # the download still works


def test_with_the_store_full_every_deep_link_still_opens_and_only_a_run_is_refused(full_store):
    for params in ({}, {"recording": RECORDINGS[1].stem, "round": "3"}, {"example": "2"}, {"recording": "nope"}):
        link = links.parse_link(params, examples=EXAMPLES, recordings=RECORDINGS)
        frame = links.open_link(link, RECORDINGS)
        assert isinstance(frame.state, Shown) and frame.state.get("spec") is not None, params
        assert "sv-status-error" not in str(frame.status)
    assert len(full_store) == 8  # nothing was put
    spec, std = frame.state.get("spec"), frame.state.get("std")
    refused = live.final_frame(spec, std, "done")  # a run of one's own needs room: refused in words
    assert "sv-status-warn" in refused.status and "other visitors" in refused.status, refused.status


def test_entries_of_sessions_gradio_dropped_go_first_when_room_is_needed(full_store):
    full_store.alive = lambda s: s not in ("someone-0", "someone-5")  # Gradio evicted two, running no callback
    mine = full_store.put(None, None, 1_000, session="me")
    assert mine and len(full_store) == 7 and full_store.stats()["sessions"] == 7
    assert full_store.sweep() == 0  # the dead ones are already gone
    full_store.alive = lambda s: s == "me"
    assert full_store.sweep() == 6 and full_store.stats() == {"entries": 1, "bytes": 1_000, "sessions": 1}
    assert full_store.lookup(mine.id) is not None


def test_a_failing_liveness_check_keeps_entries_and_never_locks_the_store():
    store = TraceStore(max_entries=2, max_bytes=10_000, session_bytes=10_000)
    store.put(None, None, 10, session="a")
    store.put(None, None, 10, session="b")

    def broken(_s):
        raise RuntimeError("no holder")

    store.alive = broken
    with pytest.raises(StoreFull):
        store.put(None, None, 10, session="c")
    assert len(store) == 2


@pytest.mark.server
@pytest.mark.slow
def test_the_page_opens_after_the_store_is_filled_through_the_server(tmp_path):
    """A real server with a small store: 6 sessions upload a recording each (filling it, the early ones
    evicted by Gradio's session limit of 3), then 20 plain visits and a deep link open the page with a recording,
    no error, no traceback in the log."""
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    from page_events import Page, new_session, text_of  # noqa: E402

    from server import launch_app

    env = {"SPECVIZ_SESSIONS": "3", "SPECVIZ_STORE_MB": "0.4", "SPECVIZ_STORE_SESSION_MB": "0.2"}
    with launch_app(tmp_path, env=env) as srv:
        page = Page(srv.url)
        upload = page.event("upload", elem_id="sv-upload")
        small = min(RECORDINGS, key=lambda p: p.stat().st_size)
        answers = [page.fire(upload, [page.upload(small)], new_session()) for _ in range(6)]
        assert all(a["ok"] for a in answers), [a["error"] for a in answers]
        load = page.start_event()
        for _ in range(20):
            r = page.fire(load, [], new_session())
            assert r["ok"] and "Recorded example" in text_of(r["output"]), r["error"]
        log = srv.log()
    assert "Traceback" not in log
