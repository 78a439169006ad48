"""One log line, not a traceback, when a client's Gradio event stream ends early.

Gradio 6.31's queue stream (``GET /gradio_api/queue/data``, ``sse_stream`` in gradio/routes.py) fails
loudly on two client-side events:

* the stream is asked for a session the queue no longer holds (a tab reconnecting after its stream
  was dropped, a client from before a restart, a scanner): gradio raises ``HTTPException(404)`` after
  the streaming response has started, starlette turns it into ``RuntimeError("Caught handled exception,
  but response already started.")``, and uvicorn logs ~120 lines under "Exception in ASGI application";
* the client drops the stream while gradio waits for the session's next message: the same log, from a
  ``CancelledError`` -- or, when gradio's 10-second wait for that message times out as the cancellation lands,
  from the ``TimeoutError`` that Python 3.11's ``asyncio.wait_for`` raises from that ``CancelledError``
  (seen once in this project's CI, 2026-12-08).

Neither is a fault of the server: the client has gone, or is told "session not found", and every other
session carries on.  For a host reading a Space's log the traceback reads like a crash, so
:class:`StreamEndFilter` rewrites exactly those records, on uvicorn's ``uvicorn.error`` logger, into one
warning line.  Any other exception, or these exception types raised anywhere but gradio's queue stream,
keeps its traceback.
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType
from typing import Iterator

STREAM_FILE, STREAM_FN = "gradio/routes.py", "sse_stream"
LOGGER = "uvicorn.error"
ASGI_MESSAGE = "Exception in ASGI application"
RESPONSE_STARTED = "response already started"


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception it was raised from or during (``__cause__``, ``__context__``)."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__]
        if isinstance(e, BaseExceptionGroup):
            todo += list(e.exceptions)


def _raised_in_stream(tb: TracebackType | None) -> bool:
    """Whether the exception was raised while gradio's queue stream was on the stack."""
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == STREAM_FN and code.co_filename.replace("\\", "/").endswith(STREAM_FILE):
            return True
        tb = tb.tb_next
    return False


def _is_404(e: BaseException) -> bool:
    return type(e).__name__ == "HTTPException" and getattr(e, "status_code", None) == 404


def _client_side(e: BaseException) -> bool:
    """An exception seen on the way up from the stream when a client left or its session is unknown (the two
    logged in this project's CI, 2026-11-25); anything else in the chain keeps the traceback."""
    return (isinstance(e, (asyncio.CancelledError, BaseExceptionGroup)) or _is_404(e)
            or (type(e) is RuntimeError and RESPONSE_STARTED in str(e))
            or (isinstance(e, TimeoutError) and isinstance(e.__cause__, asyncio.CancelledError)))


def stream_end(exc: BaseException) -> str | None:
    """"session not found" or "client went away" when ``exc`` is gradio's queue stream failing on a
    client-side event (above); None for anything else."""
    chain = list(_chain(exc))
    if not all(_client_side(e) for e in chain):
        return None
    if any(_is_404(e) and _raised_in_stream(e.__traceback__) for e in chain):
        return "session not found"
    if any(isinstance(e, asyncio.CancelledError) and _raised_in_stream(e.__traceback__) for e in chain):
        return "client went away"
    return None


class StreamEndFilter(logging.Filter):
    """Rewrites uvicorn's "Exception in ASGI application" record for a client-side end of gradio's queue
    stream into one warning line (no traceback); passes every other record unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None or not str(record.msg).startswith(ASGI_MESSAGE):
            return True
        why = stream_end(exc)
        if why is not None:
            record.msg, record.args = "a client's Gradio event stream ended early (%s); the server carries on", (why,)
            record.exc_info, record.exc_text, record.stack_info = None, None, None
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        return True


def install(logger: logging.Logger | None = None) -> StreamEndFilter:
    """Add the filter to uvicorn's error logger (once; uvicorn's own logging set-up keeps it).  Also makes a
    client's forged event values one log line, not a traceback (:mod:`specviz.serving.forged`), and Gradio's
    session limit drop the sessions holding nothing first (:mod:`specviz.serving.sessions`)."""
    from . import forged, sessions

    forged.install()
    sessions.install()
    logger = logger or logging.getLogger(LOGGER)
    for f in logger.filters:
        if isinstance(f, StreamEndFilter):
            return f
    f = StreamEndFilter()
    logger.addFilter(f)
    return f
