"""A public server no visitor can script (issue 62): only the routes the page uses are served
(specviz.serving.routes), and no event takes HTML from the client.

In process: every route Gradio registers is reviewed (served, narrowed to one name, or refused), every event's
inputs, and Stop's drawing for every page state.  On the real app in a subprocess (the tiny pair offered): the
deep-link and monitoring routes answer 404 and write nothing, a planted deep-link file is never loaded, the
page and gradio_client's /trace still work, markup sent as every string input of every event never comes
back unescaped, and a page in Chromium (Run, Stop, "Use via API") asks for nothing that is refused.
"""

from __future__ import annotations

import json
import re
import secrets
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from specviz.models import TINY_PRESET
from specviz.serving import routes
from tests.server import ROOT, launch_app

MARKUP = "<img src=x onerror=alert(1)>"
GONE = routes.NOT_FOUND.decode()


# ---- in process: the routes ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo():
    import app

    return app.build()


@pytest.fixture(scope="module")
def gradio_app(demo):
    """Gradio's FastAPI app for the page, with the middleware app.main launches it with (no server started)."""
    import gradio as gr

    import app

    return gr.routes.App.create_app(demo, app_kwargs=app.launch_options()["app_kwargs"])


def registered(fastapi_app) -> dict[str, set[str]]:
    """{path template: methods} of every route the app registers (FastAPI's included routers flattened)."""
    try:
        from fastapi.routing import iter_route_contexts  # FastAPI >= 0.165: routers stay nested
    except ImportError:  # an older FastAPI: the app's routes are flat already
        contexts = fastapi_app.routes
    else:
        contexts = iter_route_contexts(fastapi_app.routes)
    out: dict[str, set[str]] = {}
    for r in contexts:
        out.setdefault(r.path, set()).update(getattr(r, "methods", None) or {"GET"})
    return out


def sample(template: str, value: str = "x") -> str:
    """A path the template matches, each parameter filled with ``value``."""
    return re.sub(r"\{[^{}]+\}", value, template)


def test_every_route_gradio_registers_is_reviewed_and_only_the_served_ones_pass(gradio_app):
    """A route Gradio adds in an upgrade fails here until someone puts it in SERVED or REFUSED (or NARROWED)."""
    reg = registered(gradio_app)
    assert len(reg) > 50  # the flattening found Gradio's routes (its API router included)
    served = {r.path: r for r in routes.SERVED}
    unreviewed = sorted(p for p in reg if p not in served and p not in routes.NARROWED and p not in routes.REFUSED)
    assert not unreviewed, (f"Gradio registers routes nobody reviewed: {unreviewed}; put each in SERVED or "
                            "REFUSED in specviz/serving/routes.py")
    for path, methods in reg.items():
        if path in routes.REFUSED:
            assert not any(routes.served(m, sample(path)) for m in methods | {"GET", "POST", "HEAD"}), path
        elif path in routes.NARROWED:
            narrowed = routes.NARROWED[path]
            assert all(routes.served(m, sample(narrowed)) for m in methods), (path, narrowed)
            assert not any(routes.served(m, sample(path, "other")) for m in methods), path
        else:
            missing = methods - served[path].methods
            assert not missing, f"{path}: {sorted(missing)} registered, not served"
            assert all(routes.served(m, sample(path)) for m in methods), path
    # nothing reviewed that Gradio no longer registers (a stale allow-list hides what changed)
    stale = [p for p in [*served, *routes.NARROWED, *routes.REFUSED]
             if p not in reg and p not in routes.NARROWED.values()]
    assert not stale, stale


def test_a_refused_route_is_one_plain_404_before_gradio_sees_it(gradio_app):
    from starlette.testclient import TestClient

    client = TestClient(gradio_app)
    for method, path in [("GET", "/gradio_api/deep_link?session_hash=abc"), ("POST", "/gradio_api/deep_link"),
                         ("GET", "/monitoring"), ("GET", "/monitoring/summary"), ("GET", "/monitoring/k3y"),
                         ("POST", "/login"), ("GET", "/gradio_api/mcp/schema"), ("POST", "/gradio_api/mcp/"),
                         ("POST", "/gradio_api/call/on_stop"), ("POST", "/gradio_api/run/on_stop"),
                         ("POST", "/gradio_api/vibe-edit"), ("GET", "/gradio_api/openapi.json"),
                         ("GET", "/gradio_api/deep%5Flink?session_hash=abc"), ("DELETE", "/"),
                         ("POST", "/gradio_api/call/v2/trace"), ("GET", "/nothing/here")]:
        r = client.request(method, path)
        assert (r.status_code, r.text) == (404, GONE), (method, path, r.status_code, r.text[:200])
        assert r.headers["content-type"].startswith("text/plain")


@pytest.mark.parametrize("query, kept", [
    (b"deep_link=abc", b""), (b"example=1&deep_link=abc&round=2", b"example=1&round=2"),
    (b"deep%5Flink=abc&x=1", b"x=1"), (b"%64eep_link=a&deep_link=b&deep_link", b""),
    (b"recording=deep_link&x=deep_link=1", b"recording=deep_link&x=deep_link=1"), (b"", b""),
    (b"example=1&round=3", b"example=1&round=3"),
])
def test_a_deep_link_parameter_is_dropped_from_every_query(query, kept):
    assert routes.without_deep_link(query) == kept


def test_the_path_is_read_under_the_root_path():
    assert routes.route_path({"path": "/app/config", "root_path": "/app"}) == "/config"
    assert routes.route_path({"path": "/app", "root_path": "/app"}) == "/"
    assert routes.route_path({"path": "/apple/config", "root_path": "/app"}) == "/apple/config"
    assert routes.route_path({"path": "/config"}) == "/config"


# ---- in process: no event takes HTML from the client ------------------------------------------------


def test_no_event_takes_a_component_the_server_fills_with_html(demo):
    """An event's inputs are whatever its client sends: one that takes a gr.HTML (the Stop event took the status
    line) hands the server markup it may send back as HTML (issue 62's stored XSS went through it)."""
    import gradio as gr

    rendered = (gr.HTML, gr.Markdown)  # what the server fills with HTML (the page's textboxes hold plain text)
    bad = [(fn.name, type(c).__name__, c.elem_id) for fn in demo.fns.values() if fn.fn is not None
           for c in fn.inputs if isinstance(c, rendered)]
    assert not bad, f"events that take HTML from the client: {bad}"
    assert not any(getattr(b, "server_fns", None) for b in demo.blocks.values())  # component_server is refused


def test_stop_draws_a_frame_for_every_page_state():
    """Stop with an empty page state, one whose traces the store dropped, or with no run: never an empty frame
    ("on_stop didn't return enough output values (needed: 22, returned: 1)")."""
    from specviz.serving.cancel import CANCELS
    from specviz.ui import live
    from specviz.ui.store import Shown

    dropped = Shown(10**9, "gone")  # a handle whose store entry is gone
    for state in (None, {}, dropped, Shown(0, "", ""), "not a state", 0):
        frame = live.stopped(state, "no-run-" + secrets.token_hex(4))
        assert frame.updates(), state  # something set: Gradio gets a dict it reads
        frame = live.stopped(state, None)
        assert frame.updates(), state
    # a run still loading when Stop was pressed: it says so, whatever the page's status line said
    session = "loading-" + secrets.token_hex(4)
    flag = CANCELS.start(session)
    try:
        assert live.press_stop(session) and flag.is_set()
    finally:
        CANCELS.finish(session, flag)
    frame = live.stopped(None, session)
    assert "Stopped. Press Run" in frame.status and 'data-kind="warn"' in frame.status
    again = live.stopped(None, session)  # said once: a second drawing leaves the status line alone
    assert again.updates() and not isinstance(again.status, str)
    assert not live.press_stop(session)  # no run now: Stop leaves the page as it is
    assert not isinstance(live.stopped(None, session).status, str)


# ---- the real app ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("routes")
    uploads = tmp / "gradio"
    with launch_app(tmp, env={"SPECVIZ_SHOW_TINY": "1", "GRADIO_TEMP_DIR": str(uploads)}) as srv:
        srv.uploads = uploads
        yield srv


def page_events():
    if str(ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(ROOT / "scripts"))
    import page_events

    return page_events


def deep_links(srv) -> set[Path]:
    folder = srv.uploads / "deep_links"
    return set(folder.rglob("*")) if folder.exists() else set()


@pytest.mark.server
@pytest.mark.slow
def test_deep_links_and_monitoring_answer_404_and_write_nothing(server):
    pe = page_events()
    page = pe.Page(server.url)
    session = pe.new_session()
    assert page.fire(page.start_event(), [], session)["ok"]  # a session the server holds, its values stored
    before, log_before = deep_links(server), len(server.log())
    for _ in range(3):
        for method in ("GET", "POST"):
            for path in (f"gradio_api/deep_link?session_hash={session}", "monitoring", "monitoring/summary",
                         "monitoring/some-key", "gradio_api/deep%5Flink?session_hash=" + session):
                r = httpx.request(method, server.url + path, timeout=30)
                assert (r.status_code, r.text) == (404, GONE), (method, path, r.status_code, r.text[:300])
    assert deep_links(server) == before == set()
    assert "Monitoring URL" not in server.log()[log_before:]


def plant_deep_link(srv, marker: str) -> str:
    """A deep-link file as Gradio's route wrote one before it was refused: the page's components, the status
    line's value replaced by ``marker``."""
    components = httpx.get(srv.url + "config", timeout=60).json()["components"]
    status = next(c for c in components if c.get("props", {}).get("elem_id") == "sv-status")
    status["props"]["value"] = marker
    name = "planted" + secrets.token_hex(6)
    folder = srv.uploads / "deep_links" / name
    folder.mkdir(parents=True)
    (folder / "state.json").write_text(json.dumps(components), encoding="utf-8")
    return name


@pytest.mark.server
@pytest.mark.slow
def test_a_deep_link_on_disk_is_never_loaded_into_the_page(server):
    marker = f'<div id="planted-{secrets.token_hex(4)}">{MARKUP}</div>'
    name = plant_deep_link(server, marker)
    for query in (f"?deep_link={name}", f"?deep%5Flink={name}", f"?example=1&deep_link={name}&round=2",
                  "?deep_link=whatever", f"?deep_link={name}&deep_link={name}"):
        for path in ("", "config"):
            r = httpx.get(server.url + path + query, timeout=60)
            assert r.status_code == 200, (path, query, r.status_code)
            assert marker not in r.text and "planted-" not in r.text, (path, query)
            cfg = r.json() if path else json.loads(r.text.split("window.gradio_config = ", 1)[1].split(";</script>")[0])
            # (/config has the key only when asked for a deep link)
            assert cfg.get("deep_link_state", "none") == "none", (path, query, cfg["deep_link_state"])


@pytest.mark.server
@pytest.mark.slow
def test_the_page_and_the_trace_api_still_work(server):
    from gradio_client import Client

    page = httpx.get(server.url + "?example=1&round=2", timeout=60)
    assert page.status_code == 200 and "window.gradio_config" in page.text
    assert httpx.head(server.url, timeout=60).status_code == 200
    assert httpx.get(server.url + "theme.css", timeout=60).status_code == 200
    client = Client(server.url, verbose=False)
    assert "/trace" in client.view_api(return_format="dict", print_info=False)["named_endpoints"]
    doc = client.predict(prompt="abc", preset=TINY_PRESET, max_new_tokens=6, api_name="/trace")
    assert doc["schema"] == "specviz.recording" and doc["speculative"]["settings"]["max_new_tokens"] == 6
    # over plain HTTP, as the API page's cURL shows it
    posted = httpx.post(server.url + "gradio_api/call/trace", json={"data": ["abc", TINY_PRESET, 3, 0, 0, 1, 4]},
                        timeout=60)
    stream = httpx.get(server.url + f"gradio_api/call/trace/{posted.json()['event_id']}", timeout=120).text
    assert "event: complete" in stream, stream[-500:]
    # what the page's client and gradio_client send after a cancel (Stop, Job.cancel()) reaches Gradio
    for path, body in (("gradio_api/cancel", {"session_hash": "nobody", "fn_index": 0, "event_id": "none"}),
                       ("gradio_api/reset", {"event_id": "none"})):
        r = httpx.post(server.url + path, json=body, timeout=60)
        assert r.status_code == 200 and r.json() == {"success": True}, (path, r.status_code, r.text[:200])
    assert "Traceback" not in server.log()


@pytest.mark.server
@pytest.mark.slow
def test_stop_through_the_queue_draws_a_frame_for_every_page_state(server):
    """Stop's two events as the page sends them (its cancel outside the queue, then its drawing): from a page that
    never ran, one whose start showed a recording, and one Gradio no longer holds -- a frame every time, no
    traceback (each used to end in "on_stop didn't return enough output values (needed: 22, returned: 1)")."""
    pe = page_events()
    page = pe.Page(server.url)
    press = page.event("click", elem_id="sv-stop")
    drawing = next(d for d in page.cfg["dependencies"] if d.get("trigger_after") == press["id"])
    assert [page.components[c]["type"] for c in drawing["inputs"]] == ["state"]  # the server's own state only
    shown = pe.new_session()
    assert page.fire(page.start_event(), [], shown)["ok"]
    for session in (pe.new_session(), shown, "gone-" + secrets.token_hex(6)):
        pressed = httpx.post(server.url + "gradio_api/run/predict", timeout=60, json={
            "data": [], "fn_index": press["id"], "session_hash": session, "event_data": None,
            "trigger_id": press["targets"][0][0]})
        assert pressed.status_code == 200, pressed.text[:300]
        ok, outputs = fire(page, drawing, [None], session)
        assert ok and outputs, session
    assert "Traceback" not in server.log() and "enough output values" not in server.log()


# ---- markup through every string input of every event ----------------------------------------------

STRING_TYPES = {"textbox", "dropdown", "radio", "html", "markdown"}
TRACE_DEFAULTS = ["hello", TINY_PRESET, 3, 0.0, 0.0, 1.0, 4, 0, "opt", True, "model", "constant", 0.4, 2, 16,
                  "best-first", "", "token"]  # the /trace endpoint's 18 parameters, on the tiny pair


def string_inputs(page, dep: dict) -> list[int]:
    """The positions of the event's inputs that carry a string (or a list of them)."""
    out = []
    for i, cid in enumerate(dep["inputs"]):
        comp = page.components.get(cid, {})
        kind = comp.get("type")
        api_string = kind == "api" and (comp.get("api_info") or {}).get("type") == "string"
        if kind in STRING_TYPES or kind == "checkboxgroup" or api_string:
            out.append(i)
    return out


def fire(page, dep: dict, data: list, session: str) -> tuple[bool, list[list]]:
    """Send the event as the page does (also the /trace endpoint: gr.api, which no component triggers) and
    collect every output it sends, the streamed ones included (a generator's frames, then its last)."""
    trigger = dep["targets"][0][0] if dep["targets"] else None
    body = {"data": data, "fn_index": dep["id"], "session_hash": session, "event_data": None, "trigger_id": trigger}
    join = httpx.post(page.url + "gradio_api/queue/join", json=body, timeout=60)
    assert join.status_code == 200, join.text[:300]
    event_id, outputs = join.json()["event_id"], []
    with httpx.stream("GET", page.url + "gradio_api/queue/data", params={"session_hash": session},
                      timeout=300) as stream:
        for line in stream.iter_lines():
            msg = json.loads(line[6:]) if line.startswith("data: ") else {}
            if msg.get("event_id") != event_id:
                continue
            if (msg.get("output") or {}).get("data") is not None:
                outputs.append(msg["output"]["data"])
            if msg.get("msg") == "process_completed":
                return bool(msg.get("success")), outputs
    return False, outputs


def echoes(page, dep: dict, output: Any) -> list[str]:
    """The outputs that carry MARKUP as it was sent: shown as HTML, it would run.  A textbox's value is text, and
    the /trace endpoint's output is a recording for programs (its prompt is the one given, as given)."""
    found = []
    for cid, value in zip(dep["outputs"], output or []):
        comp = page.components.get(cid, {})
        if comp.get("type") == "api" or (comp.get("type") == "textbox" and (isinstance(value, str) or value is None)):
            continue
        if isinstance(value, dict) and comp.get("type") == "textbox":
            value = {k: v for k, v in value.items() if k != "value"}
        if MARKUP in json.dumps(value, ensure_ascii=False, default=str):
            found.append(f"{comp.get('type')}#{comp.get('props', {}).get('elem_id') or cid}")
    return found


@pytest.mark.server
@pytest.mark.slow
def test_markup_sent_as_any_string_input_never_comes_back_as_html(server):
    pe = page_events()
    page = pe.Page(server.url)
    backend = [d for d in page.cfg["dependencies"] if d.get("backend_fn", True)]
    checked, accepted, problems = 0, 0, []
    # 1. each string input of each event, alone (the others as the page starts, on the tiny pair)
    for dep in backend:
        positions = string_inputs(page, dep)
        if not positions:
            continue
        api = any(page.components.get(c, {}).get("type") == "api" for c in dep["inputs"])
        base = list(TRACE_DEFAULTS) if api else page.defaults(dep, **{"sv-preset": TINY_PRESET, "sv-max-new": 4})
        for i in positions:
            data = list(base)
            kind = page.components.get(dep["inputs"][i], {}).get("type")
            data[i] = [MARKUP] if kind == "checkboxgroup" else MARKUP
            ok, outputs = fire(page, dep, data, pe.new_session())
            checked, accepted = checked + 1, accepted + ok  # (a choice that is not one: Gradio's refusal, a toast)
            problems += [(dep["id"], i, found) for out in outputs if (found := echoes(page, dep, out))]
    # 2. a run whose prompt is markup, then every event of that session: what the state holds is drawn escaped
    session = pe.new_session()
    run = page.event("click", elem_id="sv-run")
    prompt_at = [page.components[c]["props"].get("elem_id") for c in run["inputs"]].index("sv-prompt")
    data = page.defaults(run, **{"sv-preset": TINY_PRESET, "sv-max-new": 8})
    data[prompt_at] = f"Say {MARKUP}"
    ok, outputs = fire(page, run, data, session)
    assert ok and outputs
    problems += [(run["id"], prompt_at, found) for out in outputs if (found := echoes(page, run, out))]
    for dep in backend:
        kinds = {page.components.get(c, {}).get("type") for c in dep["inputs"]}
        if dep["id"] == run["id"] or dep.get("api_name") == routes.API_NAME or "file" in kinds:
            continue  # (a file's event, without a file, draws nothing)
        _, outputs = fire(page, dep, page.defaults(dep, **{"sv-preset": TINY_PRESET, "sv-max-new": 4}), session)
        checked += 1
        problems += [(dep["id"], "after the run", found) for out in outputs if (found := echoes(page, dep, out))]
    assert checked > 60 and accepted > 10, (checked, accepted)  # handlers took the markup, not only Gradio's checks
    assert not problems, problems
    assert "Traceback" not in server.log()


# ---- a page in Chromium --------------------------------------------------------------------------------

# What the page asks for that is refused, and does without: the API page's timings (Gradio's monitoring) and
# its MCP tab's schema (no MCP server here).
REFUSED_AND_UNNEEDED = ("/monitoring/summary", "/gradio_api/mcp/schema")


@pytest.mark.server
@pytest.mark.browser
@pytest.mark.slow
def test_a_page_in_chromium_asks_for_nothing_refused(server):
    from tests import chromium

    verdict = chromium.decision()
    if verdict == "skip":
        pytest.skip(chromium.skip_reason())
    if verdict == "error":
        pytest.fail(chromium.error_message(), pytrace=False)
    from playwright import sync_api

    refused: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium.CHROMIUM, args=chromium.CHROMIUM_ARGS)
        try:
            pg = browser.new_page(viewport={"width": 1400, "height": 1000})
            pg.set_default_timeout(120_000)
            pg.on("response", lambda resp: refused.append(resp.request.method + " " + resp.url)
                  if resp.status == 404 else None)
            pg.goto(server.url + "?example=1&round=2&deep_link=whatever")
            pg.wait_for_function("() => document.querySelector('#sv-status .sv-status')?.innerText"
                                 ".startsWith('Recorded example')")
            pg.locator("#sv-preset input").first.click()
            pg.get_by_role("option", name=TINY_PRESET, exact=True).click()
            pg.click("#sv-run")
            pg.wait_for_function("() => document.querySelector('#sv-status .sv-status')?.innerText"
                                 ".startsWith('Done')", timeout=300_000)
            pg.click("#sv-stop")  # nothing runs: the page stays as it was
            pg.wait_for_timeout(1500)
            assert pg.locator("#sv-status .sv-status").inner_text().startswith("Done")
            pg.get_by_text("Use via API").first.click()
            pg.get_by_text("API name").first.wait_for()
            pg.wait_for_timeout(1500)
        finally:
            browser.close()
    unexpected = [u for u in refused if not u.split("?")[0].endswith(REFUSED_AND_UNNEEDED)]
    assert not unexpected, unexpected
    assert any(u.split("?")[0].endswith("/monitoring/summary") for u in refused), refused  # the API page was open
    assert "Traceback" not in server.log()
