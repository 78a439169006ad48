"""Issue 33, "One visitor cannot spoil the room": values a visitor (or a forged request) sends must be
refused with a clear message or coerced, never end in NaN probabilities, a 500 or a logged traceback.

Pure functions and tiny tensors only: no model, no server."""

from __future__ import annotations

import math

import pytest

from specviz.core.settings import TEMPERATURE_MIN, TOP_P_MIN, DecodeSettings, SettingsError


# ---- 1. temperature and top-p too small to compute with ------------------------------------------


@pytest.mark.parametrize("temperature", [1e-40, 1e-300, 5e-324, TEMPERATURE_MIN / 2])
def test_a_temperature_too_small_to_sample_with_is_refused(temperature):
    with pytest.raises(SettingsError, match=r"temperature must be 0 \(greedy\) or at least"):
        DecodeSettings.checked(temperature=temperature)


@pytest.mark.parametrize("top_p", [1e-46, 1e-300, 5e-324, TOP_P_MIN / 2])
def test_a_top_p_too_small_to_compute_with_is_refused(top_p):
    with pytest.raises(SettingsError, match="top-p must be at least"):
        DecodeSettings.checked(top_p=top_p)


def test_the_refusal_reaches_the_service_as_an_input_error():
    from specviz.serving.service import InputError, check_request

    with pytest.raises(InputError, match="temperature"):
        check_request("hello", temperature=1e-40)
    with pytest.raises(InputError, match="top-p"):
        check_request("hello", top_p=1e-46)


def test_the_smallest_allowed_values_still_sample():
    import torch

    from specviz.core.sampling import Warp, sample

    s = DecodeSettings.checked(temperature=TEMPERATURE_MIN, top_p=TOP_P_MIN, top_k=3)
    assert (s.temperature, s.top_p) == (TEMPERATURE_MIN, TOP_P_MIN)
    assert DecodeSettings.checked(temperature=0).temperature == 0.0  # greedy stays allowed
    warp = Warp(s.temperature, 0, s.top_p)
    g = torch.Generator().manual_seed(0)
    # Logits as models give them (bf16's range, ties, -inf from a mask), and a flat row.
    rows = torch.tensor([[30.0, 29.999, -50.0, float("-inf"), 0.0],
                         [0.0, 0.0, 0.0, 0.0, 0.0],
                         [1e4, -1e4, 3.0, 2.0, 1.0],
                         [-1e4, -1e4 + 1e-3, -1e4, -1e4, -1e4]])
    for w in (warp, Warp(s.temperature, s.top_k, s.top_p), Warp(s.temperature, 0, 1.0), Warp(1.0, 0, s.top_p)):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            probs = w(rows.to(dtype))
            assert torch.isfinite(probs).all(), (w, dtype, probs)
            assert torch.allclose(probs.sum(-1), torch.ones(len(rows))), (w, dtype, probs)
            for row in probs:
                sample(row, g)  # torch.multinomial refuses NaN: "probability tensor contains ..."


# ---- 5. trace and recording versions --------------------------------------------------------------


def _versioned(version, kind="trace"):
    import json
    from pathlib import Path

    doc = json.loads((Path(__file__).resolve().parent.parent / "assets" / "traces" / "1-code-greedy.json")
                     .read_text(encoding="utf-8"))
    if kind == "trace":
        return {**doc["speculative"], "version": version}
    return {**doc, "version": version}


def test_an_unknown_version_is_refused_naming_the_versions_this_specviz_reads():
    from specviz.trace import TraceError, load_recording, trace_from_dict
    from specviz.trace.model import READ_VERSIONS

    read = ", ".join(map(str, READ_VERSIONS[:-1])) + f" and {READ_VERSIONS[-1]}"
    future = max(READ_VERSIONS) + 1
    with pytest.raises(TraceError, match=f"unsupported trace version {future} .*reads versions {read}"):
        trace_from_dict(_versioned(future))
    import json

    with pytest.raises(TraceError, match=f"unsupported recording version {future} .*reads versions {read}"):
        load_recording(json.dumps(_versioned(future, "recording")))
    for v in READ_VERSIONS:  # each version it reads loads
        trace_from_dict(_versioned(v))


@pytest.mark.parametrize("version", [True, False, 3.0, 1.0, "3", None, [3], 1e300, 2**70])
@pytest.mark.parametrize("kind", ["trace", "recording"])
def test_a_version_that_is_not_a_whole_number_is_refused(version, kind):
    import json

    from specviz.trace import TraceError, load_recording

    with pytest.raises(TraceError, match=f"unsupported {kind} version") as err:
        load_recording(json.dumps(_versioned(version, kind)))
    if version is not None and not isinstance(version, int) or isinstance(version, bool):
        assert "must be a whole number" in str(err.value), str(err.value)


# ---- 3. forged step, round and position numbers from the page ------------------------------------

FORGED = [float("nan"), float("inf"), float("-inf"), "abc", None, -5, 0, 10**12, 2**70, "7", "1e999", 3.7, True,
          [], {}, "\x00", -(10**400)]


@pytest.fixture(scope="module")
def shown():
    """What the Live tab shows after a shipped recording loads: (state, rounds), and a tree run's."""
    from pathlib import Path

    from specviz.trace import load_recording

    path = Path(__file__).resolve().parent.parent / "assets" / "traces" / "1-code-greedy.json"
    spec, std = load_recording(path.read_bytes())
    return {"spec": spec, "std": std}, len(spec.rounds)


@pytest.mark.parametrize("value", FORGED, ids=repr)
def test_a_forged_round_number_never_raises(shown, value):
    from specviz.ui import live, picture_ui, present, tree_ui
    from specviz.ui.frames import round_number

    state, n = shown
    spec = state["spec"]
    i = round_number(value, n)
    assert isinstance(i, int) and not isinstance(i, bool) and 1 <= i <= n, i
    narration, step_round = live.step_views(spec, value)
    assert narration and step_round
    assert 1 <= live.next_round(state, value) <= n
    assert live.prev_round(value) >= 1
    assert 1 <= live.prev_round(value, state) <= n
    assert present.last_round(state) == n
    tree_ui.mask_for(spec, value)
    picker, picture = picture_ui.for_step(state, value)
    picture_ui.for_position(state, value, value)  # a forged position too
    picture_ui.for_position(state, 2, value)
    for empty in (None, {}, {"spec": None}):
        live.step_views(None, value)
        assert live.next_round(empty, value) == 1
        picture_ui.for_step(empty, value)
        picture_ui.for_position(empty, value, value)


@pytest.mark.parametrize("value", FORGED, ids=repr)
def test_a_forged_round_in_a_link_or_a_slider_never_raises(shown, value):
    from urllib.parse import parse_qs

    from specviz.ui import links, tabs

    state, n = shown
    q = links.link_query(state["spec"], value, examples=[], recordings=[])
    assert 1 <= int(parse_qs(q)["round"][0]) <= n, q
    for policy in ("constant", "adaptive", "nonsense", None):
        g = tabs.gamma_slider(policy, value)["value"]
        assert isinstance(g, int) and g >= 1


def test_round_numbers_keep_what_the_page_sends_in_range(shown):
    from specviz.ui import live
    from specviz.ui.frames import round_number

    state, n = shown
    assert [round_number(v, 10) for v in (1, 2, 2.0, 2.9, "3", " 4 ", 10, 11)] == [1, 2, 2, 2, 3, 4, 10, 10]
    assert round_number(5, 0) == 1  # nothing shown: round 1
    assert live.next_round(state, 1) == 2 and live.next_round(state, n) == n
    assert live.prev_round(2) == 1 and live.prev_round(1) == 1


# ---- 4. Gradio's file copies, bounded by size and count -------------------------------------------


def _files(folder, sizes):
    """Files of these sizes, one per hashed folder as Gradio writes them, oldest first (by ctime)."""
    import time

    out = []
    for n, size in enumerate(sizes):
        sub = folder / f"hash{n}"
        sub.mkdir()
        f = sub / f"file{n}.json"
        f.write_bytes(b"x" * size)
        out.append(str(f))
        time.sleep(0.01)  # distinct ctimes
    return out


def test_the_oldest_files_go_beyond_the_count_and_the_size(tmp_path):
    import os
    import time

    from specviz.serving.temp_files import evict_oldest

    files = _files(tmp_path, [100] * 10)
    gone = evict_oldest(files, max_files=4, max_bytes=10**9)
    assert gone == set(files[:6]) and [os.path.exists(f) for f in files] == [False] * 6 + [True] * 4
    gone = evict_oldest(files, max_files=100, max_bytes=250)  # two files of 100 bytes fit in 250
    assert gone == set(files[:8])  # the six already missing are reported gone too
    assert [os.path.exists(f) for f in files[8:]] == [True, True]
    # A copy Gradio hands out again is touched (its ctime moves): it is the newest now.
    os.utime(files[8])
    time.sleep(0.01)
    assert evict_oldest(files[8:], max_files=1, max_bytes=10**9) == {files[9]}
    assert os.path.exists(files[8])


def test_files_the_page_keeps_are_never_evicted_nor_counted(tmp_path):
    import os

    from specviz.serving.temp_files import evict_oldest

    files = _files(tmp_path, [1000, 10, 10, 10])
    assert evict_oldest(files, max_files=2, max_bytes=25, keep=[files[0]]) == {files[1]}
    assert os.path.exists(files[0])


def test_trim_bounds_the_blocks_files_and_forgets_them(tmp_path):
    import os
    from types import SimpleNamespace

    from specviz.serving.temp_files import trim

    files = _files(tmp_path, [2**20] * 6 + [10])
    uploads, downloads = set(files[:3]), set(files[3:6])
    page_value = SimpleNamespace(keep_in_cache={files[6]})
    blocks = SimpleNamespace(temp_file_sets=[uploads, downloads], blocks={1: page_value, 2: SimpleNamespace()},
                             GRADIO_CACHE=str(tmp_path))
    assert trim(blocks, max_files=100, max_bytes=2 * 2**20 + 5) == set(files[:4])
    assert uploads == set() and downloads == set(files[4:6])
    assert not any(os.path.exists(os.path.dirname(f)) for f in files[:4])  # their hashed folders too
    assert tmp_path.is_dir() and all(os.path.exists(f) for f in files[4:])
    assert trim(blocks) == set()  # within the defaults


# ---- 2. a URL too long for the server's URL parser ------------------------------------------------


def _get(path: str, query: str = "") -> tuple[int, dict, str]:
    """GET through LongUrls in front of an app that answers with the query string it was given, as raw
    ASGI (httpx, under Starlette's test client, refuses a URL over 64 KiB before sending it)."""
    import asyncio

    from specviz.serving.long_urls import LongUrls

    async def echo(scope, receive, send):
        body = scope["query_string"]
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": body})

    out: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        out.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(), "query_string": query.encode(),
             "headers": [], "http_version": "1.1", "scheme": "http", "server": ("x", 80), "client": ("y", 1)}
    asyncio.run(LongUrls(echo)(scope, receive, send))
    start, body = out[0], b"".join(m.get("body", b"") for m in out[1:])
    return start["status"], dict(start["headers"]), body.decode()


def test_an_over_long_query_reaches_the_app_as_one_short_note():
    from specviz.serving.long_urls import MAX_QUERY

    assert _get("/", "recording=1-code-greedy&round=3") == (200, {b"content-type": b"text/plain"},
                                                            "recording=1-code-greedy&round=3")
    query = "recording=1-code-greedy&x=" + "a" * 70_000
    assert _get("/", query)[::2] == (200, f"link_too_long={len(query)}")
    assert _get("/gradio_api/queue/join", query)[2] == f"link_too_long={len(query)}"  # the page's requests repeat it
    at_limit = "x=" + "a" * (MAX_QUERY - 2)
    assert _get("/", at_limit)[2] == at_limit


def test_an_over_long_path_is_a_plain_414():
    status, headers, text = _get("/" + "a" * 70_000)
    assert status == 414 and headers[b"content-type"].startswith(b"text/plain")
    assert text.startswith("URL too long") and "Traceback" not in text


def test_the_link_note_says_the_link_was_too_long():
    from specviz.ui.links import parse_link

    link = parse_link({"link_too_long": "70026"}, examples=[{"label": "a", "prompt": "p"}], recordings=[])
    assert link.recording is None and link.example is None and link.round is None
    assert link.note == "link ignored: it is too long (70,026 characters)"
    assert "too long" in parse_link({"link_too_long": "x" * 99}, examples=[], recordings=[]).note


@pytest.mark.server
@pytest.mark.slow
def test_a_gradio_page_opens_whatever_its_url_holds():
    """The real server stack (uvicorn, Gradio's routes) with the launch arguments app.main passes: a 70 KB
    query used to end in httpx's "URL too long", a 500 and a traceback."""
    import socket
    import urllib.request

    import gradio as gr

    import app

    with gr.Blocks() as demo:
        gr.Textbox()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                **app.launch_options())
    try:
        query = "recording=1-code-greedy&round=2&x=" + "a" * 70_000
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/?{query}", timeout=60) as r:
            assert r.status == 200 and b"<html" in r.read().lower()
    finally:
        demo.close()


def test_asking_by_name_for_the_execution_auto_chose_reuses_the_loaded_pair(monkeypatch):
    """Issue 33: `target_exec="int8"` after the default ("auto", which chose int8) loaded a second copy."""
    from types import SimpleNamespace

    from specviz.models import loading

    loads = []

    def fake_load(label, draft_ref, target_ref, dev, dt, quant, progress, t0, *, target_exec, alpha,
                  defer_packing=False):
        loads.append(target_exec)
        return SimpleNamespace(preset=label, target_exec="int8" if target_exec == "auto" else target_exec)

    monkeypatch.setattr(loading, "_load_uncached", fake_load)
    monkeypatch.setattr(loading, "_PAIRS", type(loading._PAIRS)())
    a = loading.load_pair(draft="some/draft", target="some/target", device="cpu", target_exec="auto")
    b = loading.load_pair(draft="some/draft", target="some/target", device="cpu", target_exec="int8")
    assert b is a and loads == ["auto"]
    c = loading.load_pair(draft="some/draft", target="some/target", device="cpu", target_exec="bf16")
    assert c is not a and loads == ["auto", "bf16"]
