"""specviz.serving.stream_log: gradio's queue stream failing on a client-side event logs one line; every
other exception keeps its traceback.

The exceptions here are raised by real code compiled under gradio's file name (so the filter sees the
frames it would see in the server); test_api checks the real thing on the running app."""

from __future__ import annotations

import asyncio
import io
import logging

import pytest
from fastapi import HTTPException

from specviz.serving import stream_log

STREAM_SRC = '''
def sse_stream(kind):
    if kind == "404":
        raise HTTPException(status_code=404)
    if kind == "500":
        raise HTTPException(status_code=500)
    if kind == "cancel":
        try:
            raise asyncio.CancelledError("Cancelled via cancel scope")
        except asyncio.CancelledError:
            raise asyncio.CancelledError("Cancelled via cancel scope")
    if kind == "timeout-on-cancel":  # asyncio.wait_for (3.11): its timeout lands as the client's cancel does
        try:
            raise asyncio.CancelledError("Cancelled via cancel scope")
        except asyncio.CancelledError as exc:
            raise TimeoutError() from exc
    if kind == "timeout":
        raise TimeoutError()
    raise ValueError("a real bug in the stream")
'''
WRAP_SRC = '''
def handle(stream, kind):
    try:
        stream(kind)
    except Exception as exc:
        raise RuntimeError("Caught handled exception, but response already started.") from exc
'''


def compiled(src: str, filename: str, name: str):
    scope = {"HTTPException": HTTPException, "asyncio": asyncio}
    exec(compile(src, filename, "exec"), scope)
    return scope[name]


GRADIO_STREAM = compiled(STREAM_SRC, "/venv/lib/python3.11/site-packages/gradio/routes.py", "sse_stream")
OTHER_STREAM = compiled(STREAM_SRC, "/work/specviz/serving/other.py", "sse_stream")
STARLETTE = compiled(WRAP_SRC, "/venv/lib/python3.11/site-packages/starlette/_exception_handler.py", "handle")


def raised(stream, kind: str, *, wrapped: bool) -> BaseException:
    try:
        STARLETTE(stream, kind) if wrapped else stream(kind)
    except BaseException as exc:  # noqa: B902 (CancelledError included, as uvicorn sees it)
        return exc
    raise AssertionError("nothing raised")


def logged(exc: BaseException, msg: str = stream_log.ASGI_MESSAGE) -> str:
    """What uvicorn's error logger prints for ``exc``, with the filter installed."""
    logger = logging.getLogger(f"test-stream-log-{id(exc)}")
    logger.propagate = False
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    logger.addHandler(handler)
    stream_log.install(logger)
    try:
        logger.error(msg, exc_info=(type(exc), exc, exc.__traceback__))
    finally:
        logger.removeHandler(handler)
    return out.getvalue()


@pytest.mark.parametrize("kind,wrapped,why", [
    ("404", True, "session not found"),  # the session was dropped: HTTPException after the response started
    ("404", False, "session not found"),
    ("cancel", False, "client went away"),  # the client closed the stream while it waited
    ("cancel", True, "client went away"),
    ("timeout-on-cancel", False, "client went away"),
    ("timeout-on-cancel", True, "client went away"),
])
def test_a_client_side_end_of_gradios_stream_is_one_line(kind, wrapped, why):
    exc = raised(GRADIO_STREAM, kind, wrapped=wrapped)
    assert stream_log.stream_end(exc) == why
    text = logged(exc)
    assert text == f"WARNING: a client's Gradio event stream ended early ({why}); the server carries on\n"


@pytest.mark.parametrize("stream,kind", [
    (GRADIO_STREAM, "500"),  # a server error in the stream
    (GRADIO_STREAM, "bug"),  # any other exception in the stream
    (GRADIO_STREAM, "timeout"),  # a timeout the client did not cause
    (OTHER_STREAM, "404"),  # the same exceptions anywhere but gradio's queue stream
    (OTHER_STREAM, "cancel"),
    (OTHER_STREAM, "timeout-on-cancel"),
])
@pytest.mark.parametrize("wrapped", [False, True])
def test_every_other_exception_keeps_its_traceback(stream, kind, wrapped):
    exc = raised(stream, kind, wrapped=wrapped)
    assert stream_log.stream_end(exc) is None
    text = logged(exc)
    assert text.startswith(f"ERROR: {stream_log.ASGI_MESSAGE}\nTraceback (most recent call last):")
    assert 'in sse_stream' in text


def test_other_messages_pass_unchanged_and_install_is_once():
    exc = raised(GRADIO_STREAM, "404", wrapped=True)
    assert logged(exc, "something else").startswith("ERROR: something else\nTraceback")
    logger = logging.getLogger("test-stream-log-once")
    first = stream_log.install(logger)
    assert stream_log.install(logger) is first and logger.filters == [first]
