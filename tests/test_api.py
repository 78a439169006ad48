"""The named API endpoint `/trace`, through gradio_client, against the real app in a subprocess.

One server per module (tiny random pair and the default offline Qwen pair), plus in-process
checks that a cancelled API run releases the model lock and frees the KV caches.
"""

from __future__ import annotations

import json
import time

import pytest
from gradio_client import Client
from gradio_client.utils import Status

from specviz.models import DEFAULT_PRESET, TINY_PRESET
from specviz.trace import SCHEMA_VERSION, Trace, load_recording, trace_from_dict

PROMPT = "Write a Python function `square(x)` that returns x squared."


@pytest.fixture(scope="module")
def client(server):
    return Client(server.url, verbose=False)


def trace_call(client: Client, **kw) -> dict:
    return client.predict(api_name="/trace", **kw)


def check_recording(doc: dict, *, prompt: str, preset: str, standard: bool = True, **settings) -> tuple[Trace, Trace]:
    """Everything a client may rely on in a finished recording."""
    assert doc["schema"] == "specviz.recording" and doc["version"] == SCHEMA_VERSION == 3
    assert "partial" not in doc
    spec = trace_from_dict(doc["speculative"])
    std = trace_from_dict(doc["standard"]) if standard else None
    assert (doc["standard"] is not None) == standard
    again = load_recording(json.dumps(doc))  # what the app's "Load a trace" reads
    assert again[0].to_dict() == spec.to_dict()

    for tr, kind in ((spec, "speculative"), (std, "standard")):
        if tr is None:
            continue
        assert tr.kind == kind
        assert tr.prompt == prompt
        assert tr.models["preset"] == preset
        assert tr.models["draft"] and tr.models["target"]
        assert tr.prompt_tokens > 0
        for key, value in settings.items():  # the settings echo exactly what was asked
            assert getattr(tr.settings, key) == value, (kind, key, getattr(tr.settings, key), value)
        n = tr.n_tokens
        if tr.stop_reason == "max_new_tokens":
            assert n == settings["max_new_tokens"]
        else:
            assert tr.stop_reason == "eos", tr.stop_reason
            assert 1 <= n <= settings["max_new_tokens"]
        assert 0 <= tr.t_prefill <= tr.t_total
        # The target reads the prompt in its first pass (no pass of its own), as transformers does.
        assert tr.rounds[0].prompt_fed == tr.prompt_tokens - 1
        assert all(r.prompt_fed == 0 for r in tr.rounds[1:])
        assert [r.index for r in tr.rounds] == list(range(len(tr.rounds)))

    summary = doc["speculative"]["summary"]
    assert summary == spec.to_dict()["summary"]
    assert summary["tokens"] == spec.n_tokens
    if summary["verified"]:
        assert 0.0 <= summary["alpha"] <= 1.0
        assert summary["accepted"] <= summary["verified"] <= summary["drafted"]
    for rnd in spec.rounds:
        assert len(rnd.draft) <= settings.get("gamma", 5)
        assert 1 <= len(rnd.emitted) <= len(rnd.draft) + 1
    if std is not None and settings.get("temperature") == 0 and settings.get("epsilon", 0) == 0:
        # Greedy speculative decoding is exactly greedy decoding of the target.
        assert [t.id for t in spec.tokens] == [t.id for t in std.tokens]
        assert spec.text == std.text
        assert spec.stop_reason == std.stop_reason
    return spec, std


# ---- the tiny random pair ------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings",
    [
        dict(gamma=4, epsilon=0.0, temperature=0.0, top_p=1.0, max_new_tokens=24, seed=0, variant="opt"),
        dict(gamma=1, epsilon=0.0, temperature=0.0, top_p=1.0, max_new_tokens=7, seed=3, variant="uno"),
        dict(gamma=16, epsilon=0.0, temperature=0.0, top_p=1.0, max_new_tokens=40, seed=1, variant="opt"),
        dict(gamma=5, epsilon=0.25, temperature=0.9, top_p=0.8, max_new_tokens=33, seed=7, variant="opt"),
        dict(gamma=3, epsilon=0.0, temperature=1.5, top_p=1.0, max_new_tokens=20, seed=11, variant="uno"),
        dict(gamma=4, epsilon=0.0, temperature=0.0, top_p=1.0, max_new_tokens=16, seed=0, variant="opt",
             drafter="prompt-lookup"),
        dict(gamma=24, epsilon=0.0, temperature=0.0, top_p=1.0, max_new_tokens=30, seed=2, variant="opt",
             policy="adaptive"),
        dict(gamma=8, epsilon=0.0, temperature=1.0, top_p=1.0, max_new_tokens=20, seed=5, variant="opt",
             policy="confidence", tau=0.6),
        dict(gamma=4, epsilon=0.0, temperature=1.0, top_p=1.0, max_new_tokens=20, seed=4, variant="opt", rule="block"),
        dict(gamma=4, epsilon=0.0, temperature=1.0, top_p=0.9, max_new_tokens=20, seed=4, variant="opt", rule="match"),
    ],
    ids=["greedy", "gamma1-uno", "gamma16", "sampled-eps", "hot-uno", "prompt-lookup", "adaptive-gamma24",
         "confidence", "block", "match"],
)
def test_tiny_pair(client, settings):
    doc = trace_call(client, prompt=PROMPT, preset=TINY_PRESET, standard=True, **settings)
    spec, _ = check_recording(doc, prompt=PROMPT, preset=TINY_PRESET, **settings)
    drafter = settings.get("drafter", "model")
    assert spec.models["drafter"] == ("prompt lookup" if drafter == "prompt-lookup" else spec.models["draft"])
    stops = {r.draft_stop for r in spec.rounds}
    if settings.get("policy", "constant") == "constant" and drafter == "model":
        # a constant policy stops only at γ, the budget or EOS ("none": the budget left room for one token only)
        assert stops <= {"limit", "budget", "eos", "none"}, stops
    if settings.get("policy") == "confidence":
        confident = [r for r in spec.rounds if r.draft_stop == "confidence"]
        assert all(r.draft[-1].conf < settings["tau"] for r in confident)


def test_tiny_pair_is_reproducible_and_standard_optional(client):
    kw = dict(prompt="abc def", preset=TINY_PRESET, gamma=3, epsilon=0.1, temperature=1.0, top_p=0.9,
              max_new_tokens=16, seed=42, variant="opt")
    a = trace_call(client, standard=False, **kw)
    spec, _ = check_recording(a, prompt="abc def", preset=TINY_PRESET, standard=False,
                              **{k: v for k, v in kw.items() if k not in ("prompt", "preset")})
    b = trace_call(client, standard=True, **kw)
    assert [t.id for t in trace_from_dict(b["speculative"]).tokens] == [t.id for t in spec.tokens]


def test_defaults_of_the_endpoint(client):
    """Only a prompt and a preset: the documented defaults apply (γ 5, greedy, 32 tokens)."""
    doc = trace_call(client, prompt="hello", preset=TINY_PRESET)
    check_recording(doc, prompt="hello", preset=TINY_PRESET, gamma=5, epsilon=0.0, temperature=0.0,
                    top_p=1.0, max_new_tokens=32, seed=0, variant="opt")


def test_api_is_documented(client):
    info = client.view_api(return_format="dict", print_info=False)
    params = [p["parameter_name"] for p in info["named_endpoints"]["/trace"]["parameters"]]
    assert params == ["prompt", "preset", "gamma", "epsilon", "temperature", "top_p", "max_new_tokens", "seed",
                      "variant", "standard", "drafter", "policy", "tau", "branches", "tree_nodes", "tree_mode",
                      "target_exec", "rule"]
    # The UI's own events are not part of the public API.
    assert set(info["named_endpoints"]) == {"/trace"}


# ---- the default offline pair (real Qwen models) -------------------------------------------------


def test_default_pair_streams_then_returns_a_recording(client):
    settings = dict(gamma=4, epsilon=0.0, temperature=0.0, top_p=1.0, max_new_tokens=12, seed=0, variant="opt")
    job = client.submit(api_name="/trace", prompt=PROMPT, preset=DEFAULT_PRESET, standard=True, **settings)
    doc = job.result(timeout=300)
    spec, std = check_recording(doc, prompt=PROMPT, preset=DEFAULT_PRESET, **settings)
    assert "0.5B" in spec.models["draft"] and "1.5B" in spec.models["target"]
    assert spec.device == "cpu" or spec.device.startswith("cuda")
    assert spec.models["dtype"] in ("bfloat16", "float16", "float32")
    assert spec.text.strip(), "the models wrote nothing"
    # While decoding, the recording so far was streamed; every partial one is a valid recording too.
    outputs = job.outputs()
    assert outputs[-1] == doc
    partials = outputs[:-1]
    assert partials, "a multi-second run should stream at least one partial recording"
    for part in partials:
        assert part["partial"] is True
        load_recording(json.dumps(part))
    sizes = [len(p["speculative"]["rounds"]) for p in partials]
    assert sizes == sorted(sizes)


# ---- cancellation ------------------------------------------------------------------------------


def test_cancel_stops_the_run_within_a_round(server, client):
    t_submit = time.perf_counter()
    job = client.submit(api_name="/trace", prompt="Write a long essay about the history of computing.",
                        preset=DEFAULT_PRESET, gamma=4, max_new_tokens=1000, seed=0)
    deadline = time.time() + 180
    while time.time() < deadline:  # wait until decoding is under way (a partial recording with rounds)
        outs = job.outputs()
        if outs and outs[-1]["speculative"]["rounds"]:
            break
        assert not job.done(), f"the run ended before it could be cancelled: {job.exception()}"
        time.sleep(0.1)
    else:
        pytest.fail("no partial recording within 180 s")
    partial = trace_from_dict(job.outputs()[-1]["speculative"])
    print(f"cancel: decoding under way {time.perf_counter() - t_submit:.1f} s after submitting")
    round_s = max(r.t_end - r.t_start for r in partial.rounds)

    other = Client(server.url, verbose=False)  # another visitor
    t0 = time.perf_counter()
    assert job.cancel()
    # The next run waits for the model lock and the "models" concurrency slot: it must not wait
    # for the rest of a 1000-token run, only for the round in progress.
    doc = other.predict(api_name="/trace", prompt="hello", preset=TINY_PRESET, max_new_tokens=8)
    waited = time.perf_counter() - t0
    check_recording(doc, prompt="hello", preset=TINY_PRESET, max_new_tokens=8, temperature=0.0, epsilon=0.0)
    own = doc["speculative"]["t_total"] + doc["standard"]["t_total"]
    assert waited < 5 + 2 * round_s, f"the next run waited {waited:.1f} s (one round takes {round_s:.2f} s)"
    assert job.status().code == Status.CANCELLED
    print(f"cancel: one round {round_s:.2f} s; the next run finished {waited:.2f} s after Job.cancel() "
          f"(of which {own:.2f} s decoding)")

    # The cancelled pair works again at once.  An empty preset means the default pair (the
    # offline Qwen pair on a CPU host).
    doc = client.predict(api_name="/trace", prompt="Say hi.", preset="", gamma=3, max_new_tokens=6, standard=False)
    check_recording(doc, prompt="Say hi.", preset=DEFAULT_PRESET, standard=False, gamma=3, max_new_tokens=6,
                    temperature=0.0, epsilon=0.0)


def test_a_stream_for_an_unknown_session_is_one_log_line(server):
    """A client asking for the event stream of a session the queue does not hold (a tab reconnecting after its
    stream was dropped, a client from before a restart) is told so, and the log says it in one line: Gradio
    alone raises after the response has started and uvicorn prints ~120 lines of traceback."""
    import http.client
    from urllib.parse import urlsplit

    url = urlsplit(server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.request("GET", "/gradio_api/queue/data?session_hash=no-such-session")
    resp = conn.getresponse()
    try:
        body = resp.read()
    except http.client.IncompleteRead as cut:  # the stream ends abnormally: Gradio raised inside it
        body = cut.partial
    conn.close()
    assert b'"session_not_found":true' in body, body
    line = "a client's Gradio event stream ended early (session not found); the server carries on"
    deadline = time.monotonic() + 10
    while line not in server.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    log = server.log()
    assert line in log and "Traceback" not in log, log[-4000:]


def test_server_log_is_clean(server, client):
    assert trace_call(client, prompt="still fine?", preset=TINY_PRESET, max_new_tokens=4)["speculative"]
    log = server.log()
    assert "Traceback" not in log, log[-4000:]
    assert server.proc.poll() is None


# ---- in process: what a cancelled API run leaves behind ------------------------------------------


@pytest.fixture()
def app_module(monkeypatch):
    import app
    from specviz.ui import api

    monkeypatch.setattr(api, "API_STREAM_S", 0.0)  # stream every update, so there is a mid-run yield
    return app


@pytest.fixture()
def freed(monkeypatch):
    """The KV caches freed, in order."""
    from specviz.core.kv import CachedLM

    out = []
    real_free = CachedLM.free

    def counting_free(self):
        out.append(self)
        real_free(self)

    monkeypatch.setattr(CachedLM, "free", counting_free)
    return out


def test_closing_a_running_api_generator_releases_lock_and_caches(app_module, freed):
    from specviz.serving.service import MODEL_LOCK

    gen = app_module.api_trace("hello there", TINY_PRESET, 2, 0.0, 0.0, 1.0, 200, 0, "opt", True)
    first = next(gen)
    assert first["partial"] is True and first["standard"] is None
    assert MODEL_LOCK.locked(), "the lock is held while decoding"
    n_before = len(freed)
    gen.close()  # what Gradio does to a cancelled job's generator
    assert not MODEL_LOCK.locked()
    caches = freed[n_before:]
    assert len(caches) >= 2, "both the target's and the draft's KV caches are freed"
    assert all(c.cached == 0 and c.cache.get_seq_length() == 0 for c in caches)

    # And a full run afterwards is unaffected.
    *_, final = app_module.api_trace("hello there", TINY_PRESET, 2, 0.0, 0.0, 1.0, 12, 0, "opt", True)
    check_recording(final, prompt="hello there", preset=TINY_PRESET, gamma=2, max_new_tokens=12, temperature=0.0,
                    epsilon=0.0)
    assert not MODEL_LOCK.locked()


def test_a_failing_run_releases_the_lock(app_module, monkeypatch):
    import gradio as gr

    from specviz.core.kv import CachedLM
    from specviz.serving.service import MODEL_LOCK

    def broken_feed(self, ids, keep=1, hidden=False):
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(CachedLM, "feed", broken_feed)
    with pytest.raises(gr.Error, match="ran out of memory"):
        list(app_module.api_trace("hello", TINY_PRESET, 2, 0.0, 0.0, 1.0, 12, 0, "opt", True))
    assert not MODEL_LOCK.locked()
