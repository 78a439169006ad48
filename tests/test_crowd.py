"""A crowded room: identical requests served as replays of finished runs, live runs behind a
bounded gate, handler gates, the API's defaults over raw HTTP.  Tiny pair only.  Each test on the shared
`server` also fails if the server logged a traceback while it ran (conftest's _server_log_stays_clean)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

import gradio as gr
import pytest

from specviz.core.settings import DecodeSettings
from specviz.models import TINY_PRESET
from specviz.serving import replay as R
from specviz.serving.service import MODEL_LOCK
from specviz.trace import Trace, load_recording, trace_from_dict
from specviz.ui import api, exports, live, tabs
from specviz.ui.form import RunForm
from specviz.ui.frames import SKIP
from tests.server import ROOT

ARGS = ("a crowded room", TINY_PRESET, 3, 0.0, 0.0, 1.0, 12, 0, "opt", True)  # api_trace's positional order


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    R.CACHE.clear()
    monkeypatch.setattr(R.CACHE, "enabled", True)
    monkeypatch.setattr(api, "API_STREAM_S", 0.0)
    yield
    R.CACHE.clear()


def last(gen):
    *_, final = gen
    return final


def held(lock: threading.Lock):
    """Hold the model lock from another thread (a live run in progress, as far as anyone can tell)."""
    got, release = threading.Event(), threading.Event()

    def hold():
        with lock:
            got.set()
            release.wait(60)
    t = threading.Thread(target=hold, daemon=True)
    t.start()
    got.wait(10)
    return release, t


# ---- the cache -----------------------------------------------------------------------------------


def test_an_identical_request_is_a_replay_that_takes_no_model_lock(monkeypatch):
    first = last(api.api_trace(*ARGS))
    assert "replay" not in first and R.CACHE.misses == 1 and len(R.CACHE) == 1
    # While the model lock is held (a live run going on), the identical request is answered in
    # full, at its recorded times: had it taken the lock, the gate would refuse it at once.
    monkeypatch.setattr(R.GATE, "max_wait_s", 0.5)
    release, t = held(MODEL_LOCK)
    try:
        outs = list(api.api_trace(*ARGS))
    finally:
        release.set()
        t.join()
    second = outs[-1]
    assert R.CACHE.hits == 1
    assert second["replay"]["machine"] == "cpu" and second["replay"]["recorded_at"]
    assert "partial" not in second and all(o.get("partial") for o in outs[:-1])
    assert second["speculative"]["rounds"] == first["speculative"]["rounds"]
    assert second["standard"]["rounds"] == first["standard"]["rounds"]
    # the partial outputs grow round by round, as a live run's would
    sizes = [len(o["speculative"]["rounds"]) for o in outs]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]


@pytest.mark.parametrize("change", [dict(seed=1), dict(gamma=4), dict(standard=False), dict(prompt="another room"),
                                    dict(policy="heuristic")])
def test_a_changed_setting_runs_live(change):
    names = ["prompt", "preset", "gamma", "epsilon", "temperature", "top_p", "max_new_tokens", "seed", "variant",
             "standard"]
    kw = dict(zip(names, ARGS))
    last(api.api_trace(**kw))
    out = last(api.api_trace(**{**kw, **change}))
    assert "replay" not in out and R.CACHE.misses == 2 and R.CACHE.hits == 0


def test_a_stopped_run_is_not_cached():
    gen = api.api_trace(*ARGS)
    next(gen)
    gen.close()  # Job.cancel()
    assert len(R.CACHE) == 0 and not MODEL_LOCK.locked()
    assert "replay" not in last(api.api_trace(*ARGS))


def _entry(i: int, nbytes: int) -> R.Entry:
    key = R.RunKey(TINY_PRESET, f"prompt {i}", DecodeSettings(), True)
    return R.Entry(key, R.now_iso(), "cpu", nbytes=nbytes)


def test_the_cache_is_bounded_by_count_and_bytes():
    cache = R.RecordingCache(max_entries=3, max_bytes=1000)
    for i in range(5):
        cache.add(_entry(i, 100))
    assert len(cache) == 3 and [k.prompt for k in cache._done] == ["prompt 2", "prompt 3", "prompt 4"]
    assert cache.claim(_entry(2, 0).key)[0] == "replay"  # used: now the most recent
    cache.add(_entry(5, 700))  # over the count: the least recently used goes
    assert [k.prompt for k in cache._done] == ["prompt 4", "prompt 2", "prompt 5"]
    cache.add(_entry(6, 300))  # over the bytes: as many as needed go
    assert cache.nbytes == 1000 and [k.prompt for k in cache._done] == ["prompt 5", "prompt 6"]
    assert cache.claim(_entry(0, 0).key)[0] == "lead"  # evicted: runs live again


def test_an_identical_request_follows_a_run_in_progress():
    leader = api.api_trace(*ARGS)
    first = next(leader)  # running: holds the model lock
    assert first["partial"] and MODEL_LOCK.locked()
    out: list = []
    follower = threading.Thread(target=lambda: out.extend(api.api_trace(*ARGS)), daemon=True)
    follower.start()
    time.sleep(0.3)
    final = last(leader)
    follower.join(30)
    assert not follower.is_alive() and R.CACHE.follows == 1 and R.CACHE.misses == 1
    assert out[-1]["replay"] and out[-1]["speculative"]["rounds"] == final["speculative"]["rounds"]


def test_busy_gate_says_when_to_retry(monkeypatch):
    gate = R.LiveGate(threading.Lock(), max_waiting=1, max_wait_s=0.3)
    gate.lock.acquire()
    with pytest.raises(R.Busy, match=r"retry in about \d+ s"):
        list(gate.enter(poll_s=0.05))  # waited max_wait_s
    assert gate.waiting == 0
    waiter = gate.enter(poll_s=0.05)
    next(waiter)  # one waiting: the next is refused at once
    with pytest.raises(R.Busy, match="1 run waiting"):
        next(gate.enter())
    waiter.close()
    assert gate.waiting == 0
    # through the API: a clear message, not a traceback
    monkeypatch.setattr(R.GATE, "max_wait_s", 0.3)
    release, t = held(MODEL_LOCK)
    try:
        with pytest.raises(gr.Error, match="busy.*retry in about"):
            list(api.api_trace(*ARGS))
    finally:
        release.set()
        t.join()


def test_replay_keeps_the_recorded_times_and_is_capped():
    spec, std = load_recording((ROOT / "assets" / "traces" / "2-chat-greedy.json").read_bytes())
    entry = R.Entry(R.RunKey("x", spec.prompt, spec.settings, True), None, "cpu", spec=spec, std=std, done=True)
    now = [0.0]
    snaps = list(R.replay(entry, max_s=60, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s)))
    total = max(spec.t_total, std.t_total)  # both runs advance together, each by its own clock
    assert total < 60 and now[0] == pytest.approx(total)  # real time
    counts = [len(s.spec.rounds) for s in snaps]
    assert counts == sorted(counts) and set(range(1, len(spec.rounds) + 1)) <= set(counts)
    assert any(0 < len(s.std.rounds) < len(std.rounds) and 0 < len(s.spec.rounds) < len(spec.rounds) for s in snaps)
    assert snaps[-1].phase == "done" and snaps[-1].std is std
    # a run recorded as lasting 10⁶ s replays in max_s
    long = Trace(**{**spec.__dict__, "t_total": 1e6})
    long.rounds = spec.rounds[:-1] + [type(spec.rounds[-1])(**{**spec.rounds[-1].__dict__, "t_end": 1e6})]
    entry = R.Entry(entry.key, None, "cpu", spec=long, std=None, done=True)
    now = [0.0]
    list(R.replay(entry, max_s=60, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s)))
    assert now[0] == pytest.approx(60)


def test_the_race_replay_is_capped(monkeypatch):
    spec, std = load_recording((ROOT / "assets" / "traces" / "2-chat-greedy.json").read_bytes())
    spec = Trace(**{**spec.__dict__, "t_total": 1e6})
    monkeypatch.setattr(R, "MAX_REPLAY_S", 60.0)
    now = [0.0]
    monkeypatch.setattr(live.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(live.time, "sleep", lambda s: now.__setitem__(0, now[0] + s))
    frames = list(live.replay({"spec": spec, "std": std}))
    assert now[0] <= 61 and len(frames) <= 700


# ---- the page ---------------------------------------------------------------------------------------


def test_the_page_marks_a_replay():
    form = RunForm(preset=TINY_PRESET, prompt="a crowded room", gamma=3, max_new_tokens=12)
    first = list(live.run(form))
    assert "Replay" not in first[-1].status
    release, t = held(MODEL_LOCK)
    try:
        frames = list(live.run(form))
    finally:
        release.set()
        t.join()
    assert "↻ Replay of an identical run made at" in frames[-1].status and "on cpu" in frames[-1].status
    assert any("Replay" in (f.status or "") and f.rounds for f in frames[:-1]), "rounds appear as they were recorded"
    assert frames[-1].state.get("spec").text == first[-1].state.get("spec").text


AMX = ("amx_bf16", "avx512f", "avx2")


@pytest.mark.parametrize("isa, forced, replayed", [(("avx2", "fma"), "", True), (("avx2", "fma"), "int8", True),
                                                   (("avx2", "fma"), "bf16", False), (AMX, "", False),
                                                   (AMX, "bf16", False)])
def test_shipped_recordings_are_served_for_the_page_examples(monkeypatch, tmp_path, isa, forced, replayed):
    """The page's examples with a shipped recording send exactly its settings (examples.json), and
    are replayed where the run would execute as they did: the int8 target (the probe's choice on every
    CPU so far) on a CPU without native bf16 (the AVX2 EPYC they were recorded on, 2026-11-26).  A
    forced bf16 target is another execution, and a CPU with native bf16 another machine class: there
    the examples run live rather than show another execution's or another machine's race."""
    import app
    from specviz.serving import service
    from specviz.hardware import machine

    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))  # no probe recorded: the machine's default execution
    monkeypatch.setenv("SPECVIZ_TARGET_EXEC", forced)
    monkeypatch.setattr(service, "_EXECUTIONS", {})
    monkeypatch.setattr(machine, "this_machine", lambda device="cpu": machine.Machine("cpu", "cpu", isa, 2, "x"))
    cache = R.RecordingCache()
    assert cache.seed(app.RECORDINGS) == len(app.RECORDINGS) == 6
    hits = []
    for ex in app.EXAMPLES:
        s = app.example_settings(ex)
        form = RunForm(preset="default", prompt=ex["prompt"], **s)
        if cache.claim(form.check().key)[0] == "replay":
            hits.append(ex["label"])
    # Every example on the page has its recording: a room's identical clicks all replay.
    assert hits == ([ex["label"] for ex in app.EXAMPLES] if replayed else [])


@pytest.mark.parametrize("call,match", [
    (lambda: tabs.batch_view(16, 0.5, 16, 1e300), "seed must be between 0 and"),
    (lambda: tabs.batch_view(16, 0.5, 16, None), "seed must be a number"),
    (lambda: tabs.batch_view(16, float("nan"), 16, 0), "closeness to target must be a finite number"),
    (lambda: tabs.theory_views(float("nan"), 5, 0.1, 0.05, None), "α .* must be a finite number"),
    (lambda: tabs.theory_views(0.8, 1e9, 0.1, 0.05, None), "γ .* must be between 1 and 16"),
    (lambda: tabs.theory_views(0.8, 5, -1, 0.05, None), "c .* must be between 0 and 1"),
])
def test_theory_handlers_refuse_bad_input_with_a_message(call, match):
    with pytest.raises(gr.Error, match=match):
        call()


def test_exports_stay_in_one_bounded_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_EXPORT_DIR", str(tmp_path / "exports"))
    monkeypatch.setattr(exports, "EXPORT_KEEP", 5)
    spec, std = load_recording((ROOT / "assets" / "traces" / "2-chat-greedy.json").read_bytes())
    paths = [exports.export_file(spec, std) for _ in range(12)]
    files = list((tmp_path / "exports").iterdir())
    assert len(files) == 5 and Path(paths[-1]) in files
    assert load_recording(Path(paths[-1]).read_bytes())[0].text == spec.text


def test_a_recording_too_large_to_draw_gets_a_message(tmp_path, monkeypatch):
    monkeypatch.setattr(live, "MAX_DRAW_BYTES", 10_000)
    path = ROOT / "assets" / "traces" / "2-chat-greedy.json"
    frame = live.load_file(str(path))
    assert "too large for this page to draw" in frame.status and frame.state is SKIP


# ---- over HTTP: the API's defaults -------------------------------------------------------------------


# `server`: the shared app (conftest); Gradio keeps its copies of uploads in server.uploads.


def call_raw(url: str, data: list) -> tuple[str, dict]:
    """POST /gradio_api/call/trace with a raw data list; (last event name, its data)."""
    req = urllib.request.Request(url + "gradio_api/call/trace", data=json.dumps({"data": data}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        event_id = json.loads(r.read())["event_id"]
    with urllib.request.urlopen(url + f"gradio_api/call/trace/{event_id}", timeout=120) as r:
        lines = r.read().decode().strip().splitlines()
    event = [ln[7:] for ln in lines if ln.startswith("event: ")][-1]
    payload = json.loads([ln[6:] for ln in lines if ln.startswith("data: ")][-1])
    return event, payload


@pytest.mark.parametrize("data,expect", [
    ([], "The prompt is empty"),
    ([None], "The prompt must be text"),
    (["hi", TINY_PRESET, 2, 0.0, 0.0, 1.0, 8, 1e300], "seed"),
    (["hi", TINY_PRESET, "five"], "must be a"),
])
def test_raw_http_calls_get_defaults_or_a_clear_error(server, data, expect):
    event, payload = call_raw(server.url, data)
    assert event == "error" and payload["error"] and expect in payload["error"], payload


def test_raw_http_call_with_a_partial_list_runs_with_the_defaults(server):
    event, payload = call_raw(server.url, ["hello crowd", TINY_PRESET])
    assert event == "complete", payload
    spec = trace_from_dict(payload[0]["speculative"])
    assert spec.settings == DecodeSettings(max_new_tokens=32) and spec.n_tokens <= 32


def upload(url: str, name: str, nbytes: int):
    """POST a file of `nbytes` to Gradio's upload route, as the page's "Load a trace" box does."""
    import httpx

    body = b"{" + b" " * (nbytes - 2) + b"}"
    return httpx.post(url + "gradio_api/upload", files={"files": (name, body, "application/json")}, timeout=60)


def test_uploads_over_the_size_limit_are_refused(server):
    """app.py launches with max_file_size 10 MB: Gradio refuses an 11 MB upload before it is stored
    (an upload of 50 MB used to be accepted, copied to disk and refused only when read)."""
    import app

    assert app.MAX_UPLOAD == "10mb"
    small = upload(server.url, "small.json", 2**20)
    assert small.status_code == 200, small.text
    (kept,) = small.json()
    assert Path(kept).stat().st_size == 2**20  # a 1 MB upload still works
    stored = {p for p in server.uploads.rglob("*") if p.is_file()}

    big = upload(server.url, "big.json", 11 * 2**20)
    assert big.status_code == 413, (big.status_code, big.text[:300])
    assert "maximum allowed size" in big.text
    assert {p for p in server.uploads.rglob("*") if p.is_file()} == stored  # nothing of it kept
    assert upload(server.url, "again.json", 1000).status_code == 200  # and the server carries on


def test_the_crowd_script_runs_end_to_end_on_the_tiny_pair(server, tmp_path, capsys):
    """scripts/crowd.py as the lead runs it on the real pair, here with --preset tiny and a small room:
    everyone is served, the identical example requests become replays, and it prints the served count
    and the p50/p95 waits for examples and unique prompts separately."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("crowd", ROOT / "scripts" / "crowd.py")
    crowd = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(crowd)
    out = tmp_path / "crowd.json"
    rc = crowd.main(["--url", server.url, "--attendees", "8", "--unique", "2", "--spread", "0.5", "--preset", "tiny",
                     "--json", str(out)])
    printed = capsys.readouterr().out
    doc = json.loads(out.read_text())
    s = doc["summary"]
    assert rc == 0, printed
    assert s["attendees"] == 8 and s["served"] == 8
    assert s["example"]["n"] == 6 and s["unique"]["n"] == 2 and s["unique"]["served"] == 2
    assert s["example"]["replays"] >= 6 - 4  # at most one live run per distinct example
    assert all(r["replay"] is False for r in doc["results"] if r["kind"] == "unique")
    for kind in ("example", "unique"):
        assert 0 < s[kind]["wait_p50"] <= s[kind]["wait_p95"] <= s[kind]["total_p95"]
    assert "8 of 8 served" in printed
    assert "examples:        6/6 served" in printed and "unique prompts:  2/2 served" in printed
    assert printed.count("wait to first output p50") == 2
