"""Hostile input: the `/trace` API endpoint of a running app, and hostile trace files.

Every bad request must get a clear message naming the problem (gradio_client raises AppError
with it), never a traceback in the server log, and the server must keep working.  Values JSON
cannot carry through gradio_client (NaN, ±Infinity, lone surrogates) go through Gradio's REST
route with a hand-written body.

The property tests use a fixed number of derandomized examples; set SPECVIZ_FUZZ_EXAMPLES to
run more of the trace-file mutations locally.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import urllib.request
from pathlib import Path

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from specviz.models import DEFAULT_PRESET, TINY_PRESET
from specviz.serving.service import CUSTOM_PRESET, MAX_PROMPT_CHARS, InputError, get_pair, prepare, race
from specviz.trace import (MAX_TRACE_BYTES, Trace, TraceError, load_recording, recording_to_json, trace_from_dict,
                           trace_from_json)
from tests.rendering import render_everything
from tests.server import launch_app

PARAMS = ["prompt", "preset", "gamma", "epsilon", "temperature", "top_p", "max_new_tokens", "seed", "variant",
          "standard", "drafter", "policy", "tau"]
GOOD = dict(prompt="hello", preset=TINY_PRESET, gamma=3, epsilon=0.0, temperature=0.0, top_p=1.0, max_new_tokens=6,
            seed=0, variant="opt", standard=True, drafter="model", policy="constant", tau=0.4)
# How each parameter is named in the messages.
LABELS = {"gamma": ("γ",), "epsilon": ("ε",), "temperature": ("temperature",), "top_p": ("top-p",),
          "max_new_tokens": ("max new tokens",), "seed": ("seed",), "variant": ("variant",),
          "standard": ("standard",), "prompt": ("prompt",), "preset": ("preset", "model pair"),
          "drafter": ("drafter",), "policy": ("policy",), "tau": ("τ",)}


def names(param: str, msg: str) -> bool:
    return any(label in msg for label in LABELS[param])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with launch_app(tmp_path_factory.mktemp("fuzz"), env={"SPECVIZ_ALLOW_CUSTOM": "0"}) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return Client(server.url, verbose=False)


def raw_call(url: str, **kw) -> tuple[str, object]:
    """POST a hand-written JSON body (NaN, Infinity and lone surrogates allowed) to /trace.

    Returns ("complete", recording) or ("error", message)."""
    data = [kw.get(p, GOOD[p]) for p in PARAMS]
    body = json.dumps({"data": data}, allow_nan=True, ensure_ascii=True).encode()
    req = urllib.request.Request(url + "gradio_api/call/trace", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        event_id = json.loads(r.read())["event_id"]
    with urllib.request.urlopen(f"{url}gradio_api/call/trace/{event_id}", timeout=120) as r:
        stream = r.read().decode("utf-8")
    events = re.findall(r"^event: (\w+)\ndata: (.*)$", stream, flags=re.M)
    assert events, stream[:500]
    kind, payload = events[-1]
    payload = json.loads(payload)
    if kind == "error":
        return "error", payload["error"]
    assert kind == "complete", stream[-500:]
    return "complete", payload[0]


def assert_valid_recording(doc: dict, max_new_tokens: int) -> Trace:
    spec = trace_from_dict(doc["speculative"])
    assert 1 <= spec.n_tokens <= max_new_tokens
    return spec


# ---- the API endpoint: a table of hostile values -------------------------------------------

BAD = [
    # (parameter, value, words the message must contain)
    ("gamma", 0, "between 1 and 16"),
    ("gamma", 17, "between 1 and 16"),
    ("gamma", 10**6, "between 1 and 16"),
    ("gamma", -3, "between 1 and 16"),
    ("gamma", 2.5, "whole number"),
    ("gamma", "five", "must be a number"),
    ("gamma", "", "must be a number"),
    ("gamma", [5], "must be a number"),
    ("gamma", {"a": 1}, "must be a number"),
    ("gamma", True, "must be a number"),
    ("gamma", 10**400, "far out of range"),
    ("gamma", "nan", "finite"),
    ("epsilon", -0.1, "between 0 and 1"),
    ("epsilon", 1.5, "between 0 and 1"),
    ("epsilon", 1e308, "between 0 and 1"),
    ("epsilon", "inf", "finite"),
    ("epsilon", "NaN", "finite"),
    ("temperature", -1, "between 0 and 5"),
    ("temperature", 1e9, "between 0 and 5"),
    ("temperature", "-inf", "finite"),
    ("temperature", "hot", "must be a number"),
    ("top_p", 0, "(0, 1]"),
    ("top_p", -1, "(0, 1]"),
    ("top_p", 2, "(0, 1]"),
    ("top_p", "nan", "finite"),
    ("max_new_tokens", 0, "between 1 and 1024"),
    ("max_new_tokens", -5, "between 1 and 1024"),
    ("max_new_tokens", 10**9, "between 1 and 1024"),
    ("max_new_tokens", 10**100, "between 1 and 1024"),
    ("max_new_tokens", 1e300, "between 1 and 1024"),
    ("seed", -1, "between 0 and"),
    ("seed", 2**64, "between 0 and"),
    ("seed", 0.5, "whole number"),
    ("variant", "bogus", "'opt' or 'uno'"),
    ("variant", "", "'opt' or 'uno'"),
    ("variant", 7, "'opt' or 'uno'"),
    ("variant", "x" * 10_000, "'opt' or 'uno'"),
    ("standard", "yes", "true or false"),
    ("standard", 1, "true or false"),
    ("prompt", "x" * 100_000, "too long"),
    ("prompt", "", "empty"),
    ("prompt", " \n\t\r\n  ", "empty"),
    ("prompt", "\x00\x01\x02\x1b\x7f\u200b\u202e", "empty"),  # only control / invisible characters
    ("prompt", 12345, "must be text"),
    ("prompt", ["hello"], "must be text"),
    ("prompt", None, "must be text"),
    ("prompt", "a" * (MAX_PROMPT_CHARS - 10), "tokens; the limit is 2,048"),  # fits the character limit only
    ("prompt", "a" * 1500, "context"),  # fits the token limit, not the tiny pair's context of 1,024
    ("preset", "no such pair", "Unknown model preset"),
    ("preset", "x" * 50_000, "Unknown model preset"),
    ("preset", 5, "must be text"),
    ("preset", CUSTOM_PRESET, "Custom model pairs are disabled"),
    ("drafter", "oracle", "must be one of model, prompt-lookup"),
    ("drafter", 3, "must be one of"),
    ("policy", "sometimes", "must be one of constant, heuristic, confidence, adaptive"),
    ("policy", "", "must be one of"),
    ("tau", 1.5, "between 0 and 1"),
    ("tau", "high", "must be a number"),
]


def test_gamma_range_follows_the_policy(client):
    """γ is the draft length (≤ 16) of the constant policy and the maximum (≤ 32) of the dynamic ones."""
    for policy in ("heuristic", "confidence", "adaptive"):
        with pytest.raises(AppError, match="between 1 and 32"):
            client.predict(api_name="/trace", **{**GOOD, "gamma": 33, "policy": policy})
    doc = client.predict(api_name="/trace", **{**GOOD, "gamma": 32, "policy": "adaptive", "standard": False})
    assert trace_from_dict(doc["speculative"]).settings.gamma == 32


@pytest.mark.parametrize("param,value,words", BAD, ids=[f"{p}-{i}" for i, (p, _, _) in enumerate(BAD)])
def test_bad_value_gets_a_clear_message(client, param, value, words):
    with pytest.raises(AppError) as err:
        client.predict(api_name="/trace", **{**GOOD, param: value})
    msg = str(err.value)
    assert words in msg, msg
    assert names(param, msg), f"the message should name {param}: {msg}"
    assert len(msg) < 600 and "Traceback" not in msg


# Values JSON can only carry with the NaN/Infinity extension, and invalid Unicode.
RAW_BAD = [
    ("gamma", float("nan"), "finite"),
    ("gamma", float("inf"), "finite"),
    ("epsilon", float("nan"), "finite"),
    ("epsilon", float("inf"), "finite"),
    ("epsilon", float("-inf"), "finite"),
    ("temperature", float("nan"), "finite"),
    ("temperature", float("inf"), "finite"),
    ("top_p", float("nan"), "finite"),
    ("top_p", float("-inf"), "finite"),
    ("max_new_tokens", float("inf"), "finite"),
    ("seed", float("nan"), "finite"),
    ("variant", "\ud800", "'opt' or 'uno'"),
    ("preset", "\udfff\x00", "Unknown model preset"),
    ("prompt", "\ud800" * 100_000, "too long"),
]


@pytest.mark.parametrize("param,value,words", RAW_BAD, ids=[f"{p}-{i}" for i, (p, _, _) in enumerate(RAW_BAD)])
def test_non_json_values_get_a_clear_message(server, param, value, words):
    kind, msg = raw_call(server.url, **{param: value})
    assert kind == "error"
    assert words in msg and names(param, msg), msg
    assert "\ud800" not in msg and "\udfff" not in msg  # echoed escaped, never as invalid text


@pytest.mark.parametrize("prompt", ["\ud800", "lone \udc00 surrogate", "nul\x00byte", "bell\x07 and esc\x1b[31m",
                                    "bidi \u202e override", "crlf\r\nline", "emoji 🙂 e\u0301"])
def test_odd_prompts_still_run(server, prompt):
    """Invalid Unicode and control characters are cleaned, not fatal: the run goes ahead."""
    kind, doc = raw_call(server.url, prompt=prompt)
    assert kind == "complete", doc
    spec = assert_valid_recording(doc, GOOD["max_new_tokens"])
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f\u202e]|[\ud800-\udfff]", spec.prompt), repr(spec.prompt)
    assert spec.prompt.strip()


def test_defaults_when_null(server):
    """null for a setting means its default."""
    kind, doc = raw_call(server.url, gamma=None, epsilon=None, temperature=None, top_p=None, seed=None)
    assert kind == "complete", doc
    assert trace_from_dict(doc["speculative"]).settings.gamma == 5


def test_bad_settings_fail_before_loading_models(client, server):
    """A bad γ with the big default pair is refused at once, without loading the pair first."""
    before = server.log()
    with pytest.raises(AppError, match="between 1 and 16"):
        client.predict(api_name="/trace", **{**GOOD, "preset": DEFAULT_PRESET, "gamma": 99})
    assert "Loading" not in server.log()[len(before):]


# ---- the API endpoint: random hostile requests, checked against the validation rules -----------

def _hostile_numbers():
    return st.one_of(
        st.integers(-3, 40),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([10**400, -(10**30), 2**63, True, False, "", "7", "1e3", "nan", "-inf", "0x10"]),
        st.text(max_size=6),
        st.lists(st.integers(), max_size=2),
    )


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(
    gamma=_hostile_numbers(), epsilon=_hostile_numbers(), temperature=_hostile_numbers(), top_p=_hostile_numbers(),
    max_new_tokens=st.one_of(st.integers(-2, 24), _hostile_numbers()), seed=_hostile_numbers(),
    variant=st.one_of(st.sampled_from(["opt", "uno", "Decoding-UNO", " OPT "]), st.text(max_size=8)),
    prompt=st.one_of(st.text(min_size=0, max_size=40), st.sampled_from(["hello", "\ud800x", "\x00"])),
)
def test_random_requests(server, gamma, epsilon, temperature, top_p, max_new_tokens, seed, variant, prompt):
    """The server refuses exactly what the validation rules refuse, with the same message, and
    anything it accepts gives a valid recording."""
    settings_ = dict(gamma=gamma, epsilon=epsilon, temperature=temperature, top_p=top_p,
                     max_new_tokens=max_new_tokens, seed=seed, variant=variant)
    try:
        prepare(get_pair(TINY_PRESET), prompt, **settings_)  # the same checks, in this process
        expected = None
    except InputError as exc:
        expected = str(exc)
    kind, out = raw_call(server.url, prompt=prompt, **settings_)
    if expected is None:
        assert kind == "complete", out
        spec = assert_valid_recording(out, int(float(max_new_tokens)))
        assert spec.n_tokens == int(float(max_new_tokens)) or spec.stop_reason == "eos"
    else:
        assert (kind, out) == ("error", expected)
        assert any(names(p, out) for p in LABELS), out


def test_forged_values_for_the_pages_events_are_refused_without_a_traceback(server):
    """The page's private events sent as a browser sends them (scripts/page_events.py), with values no page
    would send: each is refused with Gradio's message (or coerced by the handler), and the log gets one line
    per refusal, no traceback (specviz.serving.forged; before it: 91 tracebacks for 96 such events)."""
    import sys

    from tests.server import ROOT

    sys.path.insert(0, str(ROOT / "scripts"))
    from page_events import Page, new_session

    page = Page(server.url)
    before = server.log()
    nxt, pos = page.event("click", elem_id="sv-next"), page.event("input", elem_id="sv-pos-pick")
    refused = 0
    for v in (math.nan, math.inf, -math.inf, 10**30, "abc", None, [1], {"a": 1}):
        for dep, data in ((nxt, [None, v]), (pos, page.defaults(pos, **{"sv-step": 2, "sv-pos-pick": v}))):
            r = page.fire(dep, data, new_session(), timeout=60)
            assert r["http"] == 200
            refused += not r["ok"]
            assert r["ok"] or (r["error"] and "Traceback" not in r["error"]), r
    assert refused >= 8
    # an event number the page does not have: 404, not a 500
    import httpx

    bad = httpx.post(server.url + "gradio_api/queue/join", json={"data": [], "fn_index": 10**6, "session_hash": "x"})
    assert bad.status_code == 404
    log = server.log()[len(before):]
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-3000:]
    assert "specviz.forged refused" in log


def test_server_is_healthy_afterwards(server, client):
    """After all of the above: a valid run works and no validation error left a traceback."""
    doc = client.predict(api_name="/trace", **{**GOOD, "max_new_tokens": 16})
    assert_valid_recording(doc, 16)
    assert server.proc.poll() is None
    log = server.log()
    assert "Traceback" not in log, log[-4000:]
    assert "api run failed" not in log


# ---- hostile trace files -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def doc():
    """A real recording of the tiny pair, sampled, so it has accepted and rejected drafts."""
    req = prepare(get_pair(TINY_PRESET), "hello world", gamma=4, max_new_tokens=24, temperature=1.0, seed=1)
    for up in race(req):
        pass
    out = json.loads(recording_to_json(up.spec, up.std))
    assert any(not p["accepted"] for r in out["speculative"]["rounds"] for p in r["positions"])
    return out


def mutated(doc: dict, path: str, value=None, delete: bool = False) -> dict:
    d = copy.deepcopy(doc)
    *head, last = [int(k) if k.lstrip("-").isdigit() else k for k in path.split(".")]
    node = d
    for k in head:
        node = node[k]
    if delete:
        del node[last]
    else:
        node[last] = value
    return d


def dumps(d) -> str:
    return json.dumps(d, allow_nan=True)


S = "speculative"
R0 = "speculative.rounds.0"
TRACE_CASES = [
    # (description, document text, words the message must contain)
    ("not json", "{'schema': 'specviz.recording'", "not valid JSON"),
    ("empty", "", "not valid JSON"),
    ("a list", "[1, 2, 3]", "not a specviz recording"),
    ("a string", '"specviz.recording"', "not a specviz recording"),
    ("null", "null", "not a specviz recording"),
    ("deep arrays", "[" * 100_000 + "]" * 100_000, "not valid JSON"),
    ("deep objects", '{"a":' * 50_000 + "1" + "}" * 50_000, "not valid JSON"),
    ("huge integer", '{"schema": "specviz.recording", "version": ' + "9" * 5000 + "}", "not valid JSON"),
    ("wrong schema", dumps({"schema": "something.else", "version": 1}), "not a specviz recording"),
    ("version 4", None, "unsupported recording version"),
    ("no trace", dumps({"schema": "specviz.recording", "version": 1, S: None, "standard": None}), "holds no trace"),
    ("trace is a list", ("speculative", []), "must hold a JSON object"),
    ("trace is a number", ("standard", 5), "must hold a JSON object"),
    ("sides swapped", None, "is not a speculative trace"),
    ("rounds is an object", (f"{S}.rounds", {}), "rounds: expected a list"),
    ("round is a string", (R0, "round"), "expected an object"),
    ("prompt is a number", (f"{S}.prompt", 5), "prompt: expected a string"),
    ("prompt far too long", (f"{S}.prompt", "x" * 300_000), "text too long"),
    ("token text is a number", (f"{R0}.emitted.0.text", 5), "text: expected a string"),
    ("token text too long", (f"{R0}.emitted.0.text", "x" * 5000), "text too long"),
    ("token id is a string", (f"{R0}.emitted.0.id", "7"), "id: expected an integer"),
    ("token id is a float", (f"{R0}.emitted.0.id", 7.0), "id: expected an integer"),
    ("unknown origin", (f"{R0}.emitted.0.origin", "<script>"), "unknown value"),
    ("accepted is a string", (f"{R0}.positions.0.accepted", "yes"), "accepted: expected true or false"),
    ("probability above 1", (f"{R0}.positions.0.q", 1.5), "not a probability"),
    ("probability NaN", (f"{R0}.positions.0.p", math.nan), "finite number"),
    ("probability Infinity", (f"{R0}.positions.0.u", math.inf), "finite number"),
    ("t_total NaN", (f"{S}.t_total", math.nan), "finite number"),
    ("t_total -Infinity", (f"{S}.t_total", -math.inf), "finite number"),
    ("negative seconds", (f"{R0}.t_verify", -1.0), "cannot be negative"),
    ("negative forwards", (f"{R0}.draft_forwards", -1), "cannot be negative"),
    ("optional seconds NaN", (f"{S}.draft_prefill", math.nan), "finite number"),
    ("optional seconds a string", (f"{S}.t_tracing", "abc"), "finite number"),
    ("optional seconds a list", (f"{S}.target_prefill", [1]), "finite number"),
    ("gamma huge", (f"{S}.settings.gamma", 10**12), "gamma"),
    ("gamma a float", (f"{S}.settings.gamma", 1e308), "gamma"),
    ("setting nested", (f"{S}.settings.seed", {"a": [1, [2, [3]]]}), "numbers or strings"),
    ("setting NaN", (f"{S}.settings.epsilon", math.nan), "not a finite number"),
    ("model name a number", (f"{S}.models.draft", 5), "short strings"),
    ("unknown stop reason", (f"{S}.stop_reason", "boom"), "unknown value"),
    ("unknown kind", (f"{S}.kind", "magic"), "kind: unknown value 'magic'"),
    ("unknown extra kind", (f"{R0}.extra", {"id": 1, "text": "x", "kind": "evil", "p": 0.5}), "unknown value"),
    ("more drafts than gamma", (f"{S}.settings.gamma", 1), "more drafted tokens than gamma"),
    ("missing field", (f"{S}.t_prefill", "DELETE"), "missing field 't_prefill'"),
    ("too many rounds", (f"{S}.rounds", [{}] * 20_001), "too many rounds"),
]


def _case_text(doc: dict, case) -> str:
    name, spec_, _ = case
    if isinstance(spec_, str):
        return spec_
    if name == "version 4":  # one past the newest this version reads
        return dumps({**doc, "version": 4})
    if name == "sides swapped":
        return dumps({**doc, S: doc["standard"], "standard": doc[S]})
    path, value = spec_
    return dumps(mutated(doc, path, delete=True) if value == "DELETE" else mutated(doc, path, value))


@pytest.mark.parametrize("case", TRACE_CASES, ids=[c[0] for c in TRACE_CASES])
def test_hostile_trace_file(doc, case, tmp_path):
    text = _case_text(doc, case)
    with pytest.raises(TraceError) as err:
        load_recording(text.encode())
    assert case[2] in str(err.value), str(err.value)
    assert len(str(err.value)) < 600
    with pytest.raises(TraceError):
        load_recording(text)  # the same as text


def test_valid_recording_round_trips(doc):
    spec, std = load_recording(dumps(doc).encode())
    assert spec.to_dict() == doc[S] and std.to_dict() == doc["standard"]
    tr = trace_from_json(json.dumps(doc[S]))  # a bare trace loads too
    assert tr.to_dict() == doc[S]


def test_too_large_files_are_refused_before_parsing(doc, tmp_path):
    big = dumps(doc) + " " * (30 * 1024 * 1024)  # valid JSON, 30 MB
    for data in (big, big.encode()):
        with pytest.raises(TraceError, match="too large"):
            load_recording(data)
    with pytest.raises(TraceError, match="too large"):
        trace_from_json(big.encode())
    assert len(big) > MAX_TRACE_BYTES


@pytest.mark.parametrize("data", [b"\xff\xfe{\x00}\x00", json.dumps({"schema": "é"}, ensure_ascii=False).encode("latin-1"), b"\x80" * 100,
                                  "{\"schema\": \"specviz.recording\"}".encode("utf-16")])
def test_non_utf8_files_are_refused(data):
    with pytest.raises(TraceError, match="UTF-8"):
        load_recording(data)


def test_script_in_token_text_survives_as_text(doc):
    """Token text is data: `<script>` loads, round-trips and is shown escaped, never as markup."""
    evil = "<script>alert(1)</script>"
    d = copy.deepcopy(doc)
    d[S]["prompt"] = d["standard"]["prompt"] = '<img src=x onerror="alert(2)">'
    d[S]["models"]["draft"] = "<b>draft</b>"
    for side in (S, "standard"):
        for rnd in d[side]["rounds"]:
            for tok in rnd["draft"] + rnd["emitted"] + ([rnd["extra"]] if rnd["extra"] else []):
                tok["text"] = evil
    spec, std = load_recording(dumps(d).encode())
    assert {t.text for t in spec.tokens} == {evil}
    assert json.loads(recording_to_json(spec, std))[S]["rounds"][0]["emitted"][0]["text"] == evil

    import app

    out = app.show_recording(spec, std, "Loaded evil.json")
    try:
        html_parts = [x for x in out.updates().values() if isinstance(x, str) and x != out.export]
        html = "".join(html_parts)
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
        assert "<script" not in html.lower() and "<img" not in html.lower() and "<b>draft" not in html
        with open(out.export, encoding="utf-8") as f:  # the export holds the text unchanged
            assert json.load(f)[S]["rounds"][0]["emitted"][0]["text"] == evil
    finally:
        os.unlink(out.export)


@pytest.mark.parametrize("case", TRACE_CASES[:8] + TRACE_CASES[-4:], ids=[c[0] for c in TRACE_CASES[:8] + TRACE_CASES[-4:]])
def test_the_ui_upload_reports_hostile_files(doc, case, tmp_path):
    """What the "Load a trace" upload does with the file: an error status, not an exception."""
    import app

    path = tmp_path / "upload.json"
    path.write_bytes(_case_text(doc, case).encode())
    out = app.load_file(str(path))
    assert 'data-kind="error"' in out.status and "Could not load that file" in out.status


def test_the_ui_upload_refuses_a_30mb_file(tmp_path, doc):
    import app

    path = tmp_path / "big.json"
    path.write_text(dumps(doc) + " " * (30 * 1024 * 1024))
    out = app.load_file(str(path))
    assert 'data-kind="error"' in out.status and "too large" in out.status


# ---- random mutations of a real recording ----------------------------------------------------------


def _leaf_paths(node, prefix=""):
    if isinstance(node, dict):
        items = node.items()
    elif isinstance(node, list):
        items = enumerate(node)
    else:
        return [prefix[:-1]]
    out = [prefix[:-1]] if prefix else []
    for k, v in items:
        out += _leaf_paths(v, f"{prefix}{k}.")
    return out


_json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.sampled_from([10**30, -1, 0, 1]),
              st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
              st.sampled_from(["<script>alert(1)</script>", "accepted", "bonus", "eos", "speculative", ""])),
    lambda children: st.one_of(st.lists(children, max_size=3),
                               st.dictionaries(st.text("abxyz", min_size=1, max_size=4), children, max_size=3)),
    max_leaves=6,
)


def _get(d, path: str):
    for k in path.split("."):
        d = d[int(k)] if isinstance(d, list) else d[k]
    return d


def _same_kind(value) -> st.SearchStrategy:
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.one_of(st.integers(-3, 70), st.integers(-(2**70), 2**70))
    if isinstance(value, float):
        return st.one_of(st.floats(0, 1), st.floats(allow_nan=True, allow_infinity=True), st.just(0.0))
    if isinstance(value, str):
        return st.one_of(st.text(max_size=30), st.sampled_from(["<script>alert(1)</script>", "\n\t ", "", "é" * 999]))
    if isinstance(value, list):  # drop, repeat or reorder entries
        return st.one_of(st.just(value[:-1]), st.just(value + value[-1:]), st.permutations(value).map(list))
    return _json_values


def _plausible(value) -> st.SearchStrategy:
    """Values of the right type and range, so the file often loads and the views meet odd data:
    hostile text (markup, control characters, lone surrogates), edge probabilities, small counts."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.integers(0, 40)
    if isinstance(value, float):
        return st.one_of(st.floats(0, 1), st.sampled_from([0.0, 1.0, 5e-324, 0.9999999, 1 + 1e-7]))
    if isinstance(value, str):
        return st.one_of(st.text(max_size=20), st.sampled_from(
            ["\udfff", "a\ud800b", "<img src=x onerror=alert(1)>", "\x00\x1b[31m\x7f", "\u202e\u200b", "é" * 999, "",
             "eos", "time_limit", "speculative", "bonus"]))
    if isinstance(value, list):  # a run cut short after any round is still a valid run
        return st.just(value[:-1])
    return st.just(value)


EXAMPLE_PATH = Path(__file__).resolve().parent.parent / "assets" / "traces" / "3-translation-sampled.json"
EXAMPLE_RECORDING = json.loads(EXAMPLE_PATH.read_text(encoding="utf-8"))
FUZZ = {"loaded": 0, "refused": 0, "rounds drawn": 0}  # reported by test_fuzz_counts


@settings(max_examples=int(os.environ.get("SPECVIZ_FUZZ_EXAMPLES", 60)), deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_recordings_load_or_fail_cleanly(doc, data):
    """Whatever a file holds, loading it either fails with TraceError or gives traces that
    summarise, export as strict JSON and draw every view the page draws (chips, race, metrics,
    plots, step mode and its narration, the theory marker) in a form Gradio can send, and the
    exported file loads back.  Mutations start from a tiny-pair recording or a shipped one."""
    d = data.draw(st.sampled_from([doc, EXAMPLE_RECORDING]))
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(_leaf_paths(d)))
        how = data.draw(st.sampled_from(["plausible", "plausible", "same kind", "same kind", "anything", "delete"]))
        if how == "plausible":
            d = mutated(d, path, data.draw(_plausible(_get(d, path))))
        elif how == "same kind":  # well-typed but odd: the values most likely to get past the checks
            d = mutated(d, path, data.draw(_same_kind(_get(d, path))))
        elif how == "anything":
            d = mutated(d, path, data.draw(_json_values))
        elif not path.split(".")[-1].isdigit():
            d = mutated(d, path, delete=True)
    try:
        spec, std = load_recording(dumps(d).encode())
    except TraceError as exc:
        assert len(str(exc)) < 600 and "\n" not in str(exc)
        event("refused")
        FUZZ["refused"] += 1
        return
    event("loaded")
    FUZZ["loaded"] += 1
    FUZZ["rounds drawn"] += render_everything(spec, std)


def test_fuzz_counts():
    """Runs after the property test (file order): both outcomes occurred, so the test exercised the views."""
    print(f"\nmutated recordings: {FUZZ}")
    assert FUZZ["loaded"] > 0 and FUZZ["refused"] > 0 and FUZZ["rounds drawn"] > 0
