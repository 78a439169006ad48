"""Loading and serializing a recording give the other threads the GIL (issue 33): the cycle collector is
paused meanwhile (and only then), and the compact JSON, written a round at a time, is json's text."""

from __future__ import annotations

import gc
import json
import math
from pathlib import Path

import pytest

from specviz.trace import TraceError, load_recording, recording_bytes, recording_to_json
from specviz.trace import recording as R
from specviz.trace.model import SCHEMA_VERSION

SHIPPED = sorted((Path(__file__).resolve().parent.parent / "assets" / "traces").glob("*.json"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_the_compact_json_is_jsons_own_text(path):
    spec, std = load_recording(path.read_bytes())
    doc = {"schema": "specviz.recording", "version": SCHEMA_VERSION,
           "speculative": spec.to_dict() if spec else None, "standard": std.to_dict() if std else None}
    one_call = json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    assert recording_to_json(spec, std) == one_call
    assert load_recording(recording_bytes(spec, std)) == load_recording(one_call.encode("utf-8"))


def test_a_nan_is_still_refused_and_odd_keys_still_written():
    with pytest.raises(ValueError):
        R._compact({"a": [{"b": math.nan}]})
    value = {"a": {1: [1.5, None, "é"], "b": [[{"c": True}]]}, "d": []}
    assert R._compact(value) == json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def test_the_collector_is_paused_while_loading_and_back_after(monkeypatch):
    seen = []
    real = R.parse_trace
    monkeypatch.setattr(R, "parse_trace", lambda *a: (seen.append(gc.isenabled()), real(*a))[1])
    assert gc.isenabled()
    load_recording(SHIPPED[2].read_bytes())
    assert seen and not any(seen) and gc.isenabled()
    with pytest.raises(TraceError):
        load_recording(b'{"schema": "specviz.recording", "version": 3, "speculative": {"schema": 1}}')
    assert gc.isenabled()
    with R.gc_paused():  # nested (or another thread's): on again only when the last one ends
        load_recording(SHIPPED[2].read_bytes())
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_turned_off_elsewhere_stays_off():
    gc.disable()
    try:
        load_recording(SHIPPED[2].read_bytes())
        assert not gc.isenabled()
    finally:
        gc.enable()
