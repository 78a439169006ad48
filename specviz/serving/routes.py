"""Only the routes the page uses are served (issue 62).

Why: Gradio 6.31 registers some 85 routes on every app.  The page, its queue and the `/trace` API need a score
of them; the others are open to anyone all the same.  One of them, ``GET /gradio_api/deep_link?session_hash=S``,
saves a session's raw input values to disk (``<uploads>/deep_links/H/state.json``, never cleaned up: 30 calls
wrote 48 MB) for anyone to open as ``/?deep_link=H``: markup sent as the status line's value in the Stop event
came back as the page's own HTML, and ran in every visitor's page that opened the link (a stored XSS).  Others
show Gradio's monitoring dashboard to anyone (``GET /monitoring`` also prints its key's URL to the log on every
call), or serve login, run history, media streaming, proxies and the "vibe" code editor, none of which this
page uses.  specviz makes its own links (specviz.ui.links), so it needs no deep link of Gradio's.

`ServedRoutes`, an ASGI middleware in front of Gradio's routes (installed with ``Blocks.launch(app_kwargs=...)``,
a supported hook: nothing of Gradio's is patched), serves a request only when its method and path are in
`SERVED`: what the page, gradio_client and the `/trace` API were seen to request (a page load, Run, Stop, an
upload, both exports, every tab, the "Use via API" page; a Client's predict, submit, cancel and view_api; the
API page's cURL calls), narrowed to the one API name each needs.  Anything else is answered 404 with one
plain sentence, and so is every websocket.  Every route Gradio registers is reviewed here, in `SERVED`,
`NARROWED` or `REFUSED`: tests/test_routes.py fails when an upgrade of Gradio registers one nobody reviewed.

A ``deep_link`` query parameter is dropped from every request, so that a deep-link file already on disk
(written before this) is never loaded into the page or its config.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable
from urllib.parse import unquote_plus

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

DEEP_LINK = "deep_link"  # Gradio's query parameter that loads a saved session into the page
NOT_FOUND = b"Not found: this server serves the specviz page and its /trace API only.\n"


def pattern(template: str) -> re.Pattern[str]:
    """A route template as Gradio writes it ("{name}": one path segment, "{name:path}": the rest) as a regex."""
    parts = re.split(r"(\{[^{}]+\})", template)
    return re.compile("".join((".+" if p.endswith(":path}") else "[^/]+") if p.startswith("{") else re.escape(p)
                              for p in parts))


@dataclass(frozen=True)
class Served:
    """A route that is served: its path (Gradio's template), its methods, and who requests it."""

    path: str
    methods: frozenset[str]
    why: str
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "regex", pattern(self.path))

    def matches(self, method: str, path: str) -> bool:
        return method in self.methods and self.regex.fullmatch(path) is not None


def _served(path: str, methods: str, why: str) -> Served:
    return Served(path, frozenset(methods.split()), why)


API_NAME = "trace"  # app.py's gr.api(api_name="trace"): the one named endpoint; the page's own events have none

SERVED: tuple[Served, ...] = (
    _served("/", "GET HEAD", "the page (HEAD: Gradio's launch checks with it that the server is up)"),
    _served("/config", "GET", "the page's config, read by gradio_client (the page has it inline)"),
    _served("/theme.css", "GET", "the page's theme"),
    _served("/assets/{path:path}", "GET", "the page's scripts and styles"),
    _served("/static/{path:path}", "GET", "the page's fonts and images"),
    _served("/favicon.ico", "GET", "the page's icon"),
    _served("/gradio_api/startup-events", "GET", "Gradio's launch starts the queue with it"),
    _served("/gradio_api/info", "GET", "the API's description: the \"Use via API\" page, gradio_client"),
    _served("/gradio_api/heartbeat/{session_hash}", "GET", "an open page's session (its unload event: Stop)"),
    _served("/gradio_api/queue/join", "POST", "every queued event: the page's, gradio_client's /trace"),
    _served("/gradio_api/queue/data", "GET", "the queued events' results, streamed"),
    _served("/gradio_api/run/predict", "POST", "the page's events outside the queue (stepping, Stop's cancel)"),
    _served("/gradio_api/cancel", "POST", "Stop's cancel of a run, Job.cancel() of gradio_client"),
    _served("/gradio_api/reset", "POST", "the page's client calls it after a cancel (a no-op in Gradio 6)"),
    _served("/gradio_api/upload", "POST", "\"Load a trace\""),
    _served("/gradio_api/upload_progress", "GET", "\"Load a trace\": its progress"),
    _served("/gradio_api/file={path_or_url:path}", "GET HEAD", "the exports, uploaded files"),
    _served(f"/gradio_api/call/{API_NAME}", "POST", "the /trace API over plain HTTP (the API page's cURL)"),
    _served(f"/gradio_api/call/{API_NAME}/{{event_id}}", "GET", "its result stream"),
)

# Gradio's routes with a name in their path, served for one name only: the other names are private events
# (called by number through the queue, as the page does) or do not exist.
NARROWED: dict[str, str] = {
    "/gradio_api/run/{api_name}": "/gradio_api/run/predict",
    "/gradio_api/call/{api_name}": f"/gradio_api/call/{API_NAME}",
    "/gradio_api/call/{api_name}/{event_id}": f"/gradio_api/call/{API_NAME}/{{event_id}}",
}

_LOGIN = "login: this page has none (no auth)"
_SPELLING = "another spelling of a served route; no client here uses it"
_STREAM = "media streaming (WebRTC, HLS): no component here streams"
_HISTORY = "Gradio's run history page: not used"
_VIBE = "Gradio's \"vibe\" editor, which edits the app's code: never on a public server"
_MONITORING = ("Gradio's monitoring dashboard: readable by anyone, and GET /monitoring prints its key's URL to "
               "the log on every call (the API page asks /monitoring/summary for timings and does without)")

# Every other route Gradio 6.31 registers, refused whatever the method, and why.
REFUSED: dict[str, str] = {
    "/gradio_api/deep_link": ("saves any session's raw inputs to disk for anyone to open as /?deep_link=H "
                              "(a stored XSS), and nothing cleans them up; specviz.ui.links makes the page's links"),
    "/monitoring": _MONITORING,
    "/monitoring/summary": _MONITORING,
    "/monitoring/{key}": _MONITORING,
    "/login": _LOGIN, "/login/": _LOGIN, "/logout": _LOGIN,
    "/gradio_api/user": _LOGIN, "/gradio_api/user/": _LOGIN,
    "/gradio_api/login_check": _LOGIN, "/gradio_api/login_check/": _LOGIN,
    "/gradio_api/token": _LOGIN, "/gradio_api/token/": _LOGIN,
    "/gradio_api/app_id": "the app's id, for Gradio's sign-in: not used",
    "/gradio_api/app_id/": "the app's id, for Gradio's sign-in: not used",
    "/gradio_api/dev/reload": "Gradio's reload mode only",
    "/gradio_api/runs": _HISTORY, "/gradio_api/runs/": _HISTORY,
    "/gradio_api/run-history/connect": _HISTORY, "/gradio_api/run-history/buckets": _HISTORY,
    "/gradio_api/run-history/records": _HISTORY,
    "/gradio_api/run-history/records/{endpoint}/{record_id}/assets/{asset_id}": _HISTORY,
    "/openapi.json": "FastAPI's schema of Gradio's routes: the API is described by /gradio_api/info",
    "/gradio_api/openapi.json": "an OpenAPI schema of the API: nothing here reads it (/gradio_api/info does)",
    "/svelte/{path:path}": "server-side rendering only (off)",
    "/robots.txt": "not used (Gradio's says \"Disallow:\" with nothing after it, as a 404 does)",
    "/pwa_icon": "progressive web app: off", "/pwa_icon/{size}": "progressive web app: off",
    "/manifest.json": "progressive web app: off",
    "/gradio_api/theme.css": "the page reads /theme.css",
    "/config/": _SPELLING, "/gradio_api/info/": _SPELLING, "/gradio_api/reset/": _SPELLING,
    "/gradio_api/file/{path:path}": _SPELLING + " (deprecated for file=)",
    "/gradio_api/run/{api_name}/": _SPELLING, "/gradio_api/api/{api_name}": _SPELLING,
    "/gradio_api/api/{api_name}/": _SPELLING, "/gradio_api/call/{api_name}/": _SPELLING,
    "/gradio_api/call/v2/{api_name}": _SPELLING, "/gradio_api/call/v2/{api_name}/": _SPELLING,
    "/gradio_api/call/v2/{api_name}/{event_id}": _SPELLING,
    "/gradio_api/custom_component/{id}/{environment}/{type}/{file_name}": "custom components: none here",
    "/gradio_api/proxy={url_path:path}": "a proxy to Spaces loaded with gr.load: none here",
    "/gradio_api/stream/{event_id}": _STREAM, "/gradio_api/stream/{event_id}/close": _STREAM,
    "/gradio_api/stream/{session_hash}/{run}/{component_id}/playlist.m3u8": _STREAM,
    "/gradio_api/stream/{session_hash}/{run}/{component_id}/{segment_id}.{ext}": _STREAM,
    "/gradio_api/stream/{session_hash}/{run}/{component_id}/playlist-file": _STREAM,
    "/gradio_api/component_server": "components' server functions: no component here has one",
    "/gradio_api/component_server/": "components' server functions: no component here has one",
    "/gradio_api/queue/status": "the queue's length: not used",
    "/gradio_api/process_recording": "Gradio's screen recorder: not used",
    "/gradio_api/vibe-edit": _VIBE, "/gradio_api/vibe-edit/": _VIBE,
    "/gradio_api/undo-vibe-edit": _VIBE, "/gradio_api/undo-vibe-edit/": _VIBE,
    "/gradio_api/vibe-code": _VIBE, "/gradio_api/vibe-code/": _VIBE,
    "/gradio_api/vibe-starter-queries": _VIBE, "/gradio_api/vibe-starter-queries/": _VIBE,
}


def served(method: str, path: str) -> bool:
    """Whether a request for ``path`` (under the app's root) with ``method`` is one of `SERVED`."""
    return any(route.matches(method, path) for route in SERVED)


def route_path(scope: Scope) -> str:
    """The request's path under the app's root path (as Starlette's router matches it)."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    if root and path.startswith(root) and (len(path) == len(root) or path[len(root)] == "/"):
        return path[len(root):] or "/"
    return path


def without_deep_link(query: bytes) -> bytes:
    """The query string less every ``deep_link`` parameter, however its name is escaped; else unchanged."""
    if b"deep" not in query.lower() and b"%" not in query:
        return query
    kept = [part for part in query.split(b"&")
            if unquote_plus(part.split(b"=", 1)[0].decode("latin-1")) != DEEP_LINK]
    return b"&".join(kept)


class ServedRoutes:
    """ASGI middleware: `SERVED` routes pass (less any ``deep_link`` parameter); every other request gets 404."""

    def __init__(self, app: App):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope.get("type")
        if kind == "websocket":  # the page uses none
            await send({"type": "websocket.close", "code": 1008})
            return
        if kind != "http":  # lifespan
            return await self.app(scope, receive, send)
        if not served(scope.get("method", ""), route_path(scope)):
            return await _not_found(send)
        query = scope.get("query_string") or b""
        kept = without_deep_link(query)
        if kept != query:
            scope = {**scope, "query_string": kept}
        return await self.app(scope, receive, send)


async def _not_found(send: Send) -> None:
    await send({"type": "http.response.start", "status": 404,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(NOT_FOUND)).encode("ascii"))]})
    await send({"type": "http.response.body", "body": NOT_FOUND})
