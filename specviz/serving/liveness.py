"""Every run belongs to a live client: a run whose client stopped listening stops within seconds (issue 62).

A Gradio event's results go to its client over a server-sent-event stream, opened after the request that
queued the event:

    the page, gradio_client   POST /gradio_api/queue/join     stream GET /gradio_api/queue/data?session_hash=S
    plain HTTP                POST /gradio_api/call/trace     stream GET /gradio_api/call/trace/E  (E: its event id)

(the stream of a session stays open while any of its events is pending; the page does not reopen one that broke:
its pending events end with "Connection errored out", so a run without its stream has nobody to show it to).

Gradio notices a stream that closes only at the event's next output (its ``event.alive``), and a stream that
was never opened not at all: a /trace run with a 1,600-token prompt, posted and dropped, kept the models for
minutes, and twelve of them filled the queue of live runs for everyone.

`ClientStreams`, an ASGI middleware in front of Gradio's routes, sees each of these streams start and end
(the response finishing, or ``http.disconnect``) and keeps, in `STREAMS`, how many are open per session hash
and per event id, and when the last one closed.  A run's cancel flag (serving.cancel) asks `Streams.gone`
between rounds and between a long prompt's chunks: its client is gone when no stream of its session or of
its event has been open for `GRACE_S` seconds (3), counted from the run's start or from
the last stream's end, whichever is later.  The grace is the time a client has to open its stream after
posting, or to reopen one.  The page's heartbeat stream (GET /gradio_api/heartbeat/S) is not counted: it says
that a page is open, not that anyone reads the run's results (gradio_client keeps one too, after `Job.cancel()`
has ended the job's stream; a closed heartbeat is the app's unload event, which cancels the session's run).

Only runs that came in through this middleware are judged (their request carries `MARK`): a run called from
Python (the tests, the scripts), or through a server without the middleware, never is.

Hooks only, no patch: the middleware is one of the app's own (``Blocks.launch(app_kwargs=...)``), and a run
finds its request and event id in Gradio's context of the event being served (``gradio.context.LocalContext``,
which ``gr.Info`` reads too).
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections import OrderedDict
from typing import Any, Awaitable, Callable, Iterable
from urllib.parse import parse_qs

from .clients import client_key

GRACE_S = 3.0  # no stream this long: the client is gone (its stream not opened yet, or not reopened)
MARK = "specviz.client_streams"  # set in the scope of every request that came through ClientStreams
REMEMBERED = 4096  # keys whose last stream closed, kept to time their grace (the oldest are forgotten)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]

# The streams a client listens on (the path's end, under any root path): the key is the session or the event.
_QUEUE_DATA = re.compile(r"(?:^|/)queue/data/?$")
_CALL_STREAM = re.compile(r"(?:^|/)call/(?:v2/)?[^/]+/([^/]+)/?$")


class Streams:
    """The client streams open now, by key (a session hash or an event id), and when each key's last one ended."""

    def __init__(self, grace_s: float = GRACE_S, remembered: int = REMEMBERED):
        self.grace_s = grace_s
        self.remembered = remembered
        self._open: dict[str, int] = {}
        self._ended: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def attach(self, key: str) -> None:
        with self._lock:
            self._open[key] = self._open.get(key, 0) + 1

    def detach(self, key: str, now: float | None = None) -> None:
        with self._lock:
            n = self._open.get(key, 0) - 1
            if n > 0:
                self._open[key] = n
                return
            self._open.pop(key, None)
            self._ended[key] = time.monotonic() if now is None else now
            self._ended.move_to_end(key)
            while len(self._ended) > self.remembered:
                self._ended.popitem(last=False)

    def attached(self, key: str) -> bool:
        with self._lock:
            return self._open.get(key, 0) > 0

    def gone(self, keys: Iterable[str], since: float, now: float | None = None) -> bool:
        """Whether no stream of ``keys`` has been open for `grace_s` seconds, counted from ``since`` (the run's
        start, time.monotonic) or from the last stream's end, whichever is later."""
        now = time.monotonic() if now is None else now
        with self._lock:
            last = since
            for key in keys:
                if self._open.get(key, 0) > 0:
                    return False
                last = max(last, self._ended.get(key, since))
        return now - last > self.grace_s

    def __len__(self) -> int:
        return len(self._open)


STREAMS = Streams()


def stream_key(scope: Scope) -> str | None:
    """The session hash or event id whose results the request's stream carries; None for any other request."""
    if scope.get("type") != "http" or scope.get("method") != "GET":
        return None
    path = scope.get("path", "")
    if _QUEUE_DATA.search(path):
        query = parse_qs((scope.get("query_string") or b"").decode("latin-1"))
        return (query.get("session_hash") or [None])[0] or None
    m = _CALL_STREAM.search(path)
    return m.group(1) if m else None


class ClientStreams:
    """ASGI middleware: counts each client stream in `STREAMS` while it is open, and marks every request it
    passes on (`MARK` in its scope) so that a run knows its client can be watched."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], streams: Streams | None = None):
        self.app = app
        self.streams = STREAMS if streams is None else streams

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            return await self.app(scope, receive, send)
        scope[MARK] = True  # the same dict Gradio's request reads: the run finds it there
        key = stream_key(scope)
        if key is None:
            return await self.app(scope, receive, send)
        attached = True
        self.streams.attach(key)

        def end() -> None:
            nonlocal attached
            if attached:
                attached = False
                self.streams.detach(key)

        async def receive_noting_disconnect() -> dict:
            message = await receive()
            if message.get("type") == "http.disconnect":
                end()  # the client left: at once, whenever the route gets round to returning
            return message

        try:
            await self.app(scope, receive_noting_disconnect, send)
        finally:
            end()


# ---- the run's side: its request, its event, its client ---------------------------------------------


def current_request() -> Any:
    """The gr.Request of the Gradio event this thread is serving, or None (not in an event, or no Gradio)."""
    context = sys.modules.get("gradio.context")
    if context is None:
        return None
    return context.LocalContext.request.get(None)


def current_event_id() -> str | None:
    context = sys.modules.get("gradio.context")
    if context is None:
        return None
    return context.LocalContext.event_id.get(None)


def watched(request: Any) -> bool:
    """Whether ``request`` (a gr.Request) came in through `ClientStreams`, so its client's streams are counted."""
    scope = getattr(getattr(request, "request", None), "scope", None)
    return isinstance(scope, dict) and bool(scope.get(MARK))


def run_keys(session: str | None) -> tuple[str, ...] | None:
    """The keys whose streams carry the current event's results (its session and its event id), or None
    when the run is not watched (called from Python, or served without `ClientStreams`)."""
    request = current_request()
    if request is None or not watched(request):
        return None
    keys = tuple(k for k in (session or getattr(request, "session_hash", None), current_event_id()) if k)
    return keys or None


def current_client() -> str | None:
    """The address of the client whose Gradio event this thread is serving (serving.clients), None outside one."""
    request = current_request()
    return None if request is None else client_key(request)


__all__ = ["ClientStreams", "GRACE_S", "MARK", "STREAMS", "Streams", "current_client", "current_event_id",
           "current_request", "run_keys", "stream_key", "watched"]
