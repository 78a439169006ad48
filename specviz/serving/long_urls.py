"""Over-long URLs: the page opens whatever its URL holds (issue 33).

Gradio builds the page's root URL from the request's whole URL with httpx, which refuses a URL over
64 KiB ("URL too long"): the page answered 500 with a traceback in the log, and never loaded.  A
deep link is a few dozen characters (specviz.ui.links), so `LongUrls`, an ASGI middleware in front
of Gradio's routes, replaces a query string over `MAX_QUERY` bytes with ``link_too_long=<its length>``:
the page loads, the link is ignored and the status line says why.  The page's own requests (the
queue's, which repeat the page's query) are rewritten the same way.  A path over `MAX_PATH` bytes is
no page of this app: it is answered 414 with one plain sentence.

Beyond these, a request line longer than uvicorn's h11 parser takes (measured: 70 KB always loads,
150 KB was refused by the app, 120 KB by a bare Blocks was not: it depends on how the bytes arrive) is
refused by the server itself with 400, before any of this runs, and logged as one line ("Invalid HTTP
request received"): Gradio's launch gives no way to raise that limit.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable
from urllib.parse import urlencode

MAX_QUERY = 8192  # bytes of query string: a deep link takes under a hundred
MAX_PATH = 8192  # bytes of path
TOO_LONG = "link_too_long"  # the query parameter that replaces an over-long query (its value: the length)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


class LongUrls:
    """ASGI middleware: over-long query strings become ``link_too_long=<n>``; over-long paths get 414."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path = scope.get("raw_path") or scope.get("path", "").encode("utf-8", "surrogateescape")
        if len(path) > MAX_PATH:
            return await _refuse(scope, receive, send, len(path))
        query = scope.get("query_string") or b""
        if len(query) > MAX_QUERY:
            scope = {**scope, "query_string": urlencode({TOO_LONG: len(query)}).encode("ascii")}
        return await self.app(scope, receive, send)


async def _refuse(scope: Scope, receive: Receive, send: Send, n: int) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1009})
        return
    body = f"URL too long ({n:,} bytes of path; the limit is {MAX_PATH:,}).\n".encode("utf-8")
    await send({"type": "http.response.start", "status": 414,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode("ascii"))]})
    await send({"type": "http.response.body", "body": body})


def app_kwargs() -> dict[str, Any]:
    """What ``Blocks.launch(app_kwargs=...)`` passes to Gradio's FastAPI app to put `LongUrls` in front, then
    `ServedRoutes` (serving.routes)."""
    from starlette.middleware import Middleware

    from .liveness import ClientStreams  # which clients still listen to their runs (issue 62)
    from .routes import ServedRoutes  # only the routes the page uses are served (issue 62)

    return {"middleware": [Middleware(LongUrls), Middleware(ServedRoutes), Middleware(ClientStreams)]}
