"""Trace files: reading and writing a trace or a recording (a race's two traces) as JSON.

Reading checks everything: the file's size, UTF-8, JSON, then the schema name and version here,
then every rule the views rely on with pydantic (specviz.trace.schema).  A file loads whole or
not at all, with a message saying where ("speculative.rounds[3].positions[1].i: ...").  The
data model itself, and what a trace's JSON holds, is specviz.trace.model.
"""

from __future__ import annotations

import gc
import json
import os
import re
import tempfile
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from .model import READ_VERSIONS, SCHEMA_NAME, SCHEMA_VERSION, Trace, TraceError
from .schema import parse_trace

MAX_TRACE_BYTES = 20 * 1024 * 1024  # a trace file larger than this is refused
_PAUSE_LOCK = threading.Lock()
_PAUSES = [0, False]  # loads and serializations in progress, whether the collector was on before the first


@contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic cycle collection while a recording is parsed or serialized (issue 33).

    A 7.5 MB recording makes ~2 M objects, none in a cycle: they set off full collections (4 while it
    loaded, 0.2-0.5 s each with two such recordings held), each walking every object of the server
    with the GIL held, stalling every stream beside it.  Paused, the objects are counted once, later;
    what they allocate is freed by reference counting as before.  Nested and threaded uses share the
    pause; the collector is turned back on only if it was on."""
    with _PAUSE_LOCK:
        if _PAUSES[0] == 0:
            _PAUSES[1] = gc.isenabled()
            gc.disable()
        _PAUSES[0] += 1
    try:
        yield
    finally:
        with _PAUSE_LOCK:
            _PAUSES[0] -= 1
            if _PAUSES[0] == 0 and _PAUSES[1]:
                gc.enable()


def _read_json(data: str | bytes) -> Any:
    """Decode an uploaded file: size limit, UTF-8 and JSON checked, each with a clear TraceError."""
    if isinstance(data, bytes):
        if len(data) > MAX_TRACE_BYTES:
            raise TraceError(f"file is too large ({len(data):,} bytes; the limit is {MAX_TRACE_BYTES:,})")
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            raise TraceError("file is not UTF-8 text: expected a specviz .json trace or recording") from None
    if len(data) > MAX_TRACE_BYTES:
        raise TraceError(f"file is too large ({len(data):,} characters; the limit is {MAX_TRACE_BYTES:,})")
    try:
        # The hook is called once per object: a big file's parse gives other threads the GIL in between
        # (one C call held it for 0.4 s for a 7.5 MB recording, stalling every stream; issue 33).
        return json.loads(data, object_hook=_same)
    except (ValueError, RecursionError) as exc:  # ValueError: also an integer of over 4300 digits
        raise TraceError(f"not valid JSON: {exc}") from None


def _same(obj: dict) -> dict:
    return obj


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _compact(value: Any, depth: int = 0) -> str:
    """``_dumps(value)``, the same text, in pieces down to `depth` 3 (a trace's rounds one by one): one C call
    for a 7.5 MB recording held the GIL for ~0.45 s, stalling every stream beside it (issue 33)."""
    if depth < 3 and isinstance(value, dict) and all(type(k) is str for k in value):
        return "{" + ",".join(_dumps(k) + ":" + _compact(v, depth + 1) for k, v in value.items()) + "}"
    if depth < 3 and isinstance(value, list):
        return "[" + ",".join(_compact(v, depth + 1) for v in value) + "]"
    return _dumps(value)


def _versions_read() -> str:
    """"1, 2 and 3": the versions this specviz reads, as a message says them."""
    v = [str(x) for x in sorted(READ_VERSIONS)]
    return v[0] if len(v) == 1 else f"{', '.join(v[:-1])} and {v[-1]}"


def check_version(value: Any, what: str) -> None:
    """A file's "version" must be one of READ_VERSIONS, as a JSON integer: true or 3.0 compare equal to 1
    and 3 in Python, but are not versions."""
    if type(value) is int and value in READ_VERSIONS:
        return
    if type(value) is int:
        shown = str(value) if value.bit_length() <= 64 else "a huge integer"
        raise TraceError(f"unsupported {what} version {shown} (this specviz reads versions {_versions_read()})")
    if value is None:
        raise TraceError(f"unsupported {what} version: no \"version\" field "
                         f"(this specviz reads versions {_versions_read()})")
    shown = repr(value) if isinstance(value, (bool, float, str)) else f"a JSON {type(value).__name__}"
    shown = shown if len(shown) <= 42 else shown[:40] + "…"
    raise TraceError(f"unsupported {what} version {shown}: the version must be a whole number "
                     f"(this specviz reads versions {_versions_read()})")


def trace_from_dict(d: Any, where: str = "trace") -> Trace:
    """A checked Trace from a decoded JSON object, or TraceError saying what is wrong and where."""
    if not isinstance(d, dict):
        raise TraceError(f"not a specviz trace ({where}): the file must hold a JSON object")
    if d.get("schema") != SCHEMA_NAME:
        raise TraceError(f"not a specviz trace ({where}): field 'schema' must be 'specviz.trace'")
    check_version(d.get("version"), "trace")
    return parse_trace(d, where)


def trace_from_json(text: str | bytes) -> Trace:
    """A checked Trace from a trace's JSON text (a bare trace, not a recording), or TraceError."""
    return trace_from_dict(_read_json(text))


# ---- recordings: a speculative run and its standard baseline in one file ------------

RECORDING_NAME = "specviz.recording"


def recording_to_json(spec: Trace | None, std: Trace | None, indent: int | None = None) -> str:
    """One file for a whole race: what the app exports and loads back.

    Without ``indent`` the text is compact and written by json's C encoder (an indent makes json fall
    back to its Python encoder: 0.87 s instead of 0.26 s for a 7 MB recording on the 2-core EPYC), a
    round at a time (`_compact`)."""
    doc = {
        "schema": RECORDING_NAME,
        "version": SCHEMA_VERSION,
        "speculative": spec.to_dict() if spec else None,
        "standard": std.to_dict() if std else None,
    }
    if indent is None:
        return _compact(doc)
    return json.dumps(doc, indent=indent, ensure_ascii=False, allow_nan=False)


def recording_bytes(spec: Trace | None, std: Trace | None) -> bytes:
    """The recording's file contents: its compact JSON as UTF-8, a lone surrogate built in memory
    (loading already replaces them) written as U+FFFD.  Compute it once per run or load and pass it
    on (``save_recording(data=...)``, the store's size): a 7 MB recording takes ~0.3 s."""
    with gc_paused():
        text = recording_to_json(spec, std)
    return re.sub("[\ud800-\udfff]", "\ufffd", text).encode("utf-8")


def save_recording(spec: Trace | None, std: Trace | None, directory: str | os.PathLike | None = None, *,
                   data: bytes | None = None) -> str:
    """Write a recording to a new temporary .json file and return its path ("Export trace").

    ``data``, when given, is ``recording_bytes(spec, std)`` already computed.  The bytes are ready
    before the file is created, so a failure never leaves an empty file behind."""
    if data is None:
        data = recording_bytes(spec, std)
    return write_new_file(data, directory=directory, prefix="specviz-", suffix=".json")


def write_new_file(data: bytes, *, directory: str | os.PathLike | None, prefix: str, suffix: str) -> str:
    """Write ``data`` to a new file (a unique name in ``directory``) and return its path; on failure
    the half-written file is removed."""
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        os.unlink(path)
        raise
    return path


def load_recording(data: str | bytes) -> tuple[Trace | None, Trace | None]:
    """Parse an exported recording (or a bare trace) into (speculative, standard)."""
    with gc_paused():
        return _load_recording(data)


def _load_recording(data: str | bytes) -> tuple[Trace | None, Trace | None]:
    doc = _read_json(data)
    if isinstance(doc, dict) and doc.get("schema") == SCHEMA_NAME:
        tr = trace_from_dict(doc)
        return (tr, None) if tr.kind == "speculative" else (None, tr)
    if not isinstance(doc, dict) or doc.get("schema") != RECORDING_NAME:
        raise TraceError("not a specviz recording: expected a JSON object with \"schema\": \"specviz.recording\"")
    check_version(doc.get("version"), "recording")
    spec = trace_from_dict(doc["speculative"], "speculative") if doc.get("speculative") is not None else None
    std = trace_from_dict(doc["standard"], "standard") if doc.get("standard") is not None else None
    if spec is not None and spec.kind != "speculative":
        raise TraceError("recording: the 'speculative' entry is not a speculative trace")
    if std is not None and std.kind != "standard":
        raise TraceError("recording: the 'standard' entry is not a standard trace")
    if spec is None and std is None:
        raise TraceError("recording holds no trace")
    return spec, std
