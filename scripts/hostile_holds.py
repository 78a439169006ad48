"""scripts/hostile.py's batteries against what a client can make the server *hold* (issue 62): stored input
replayed into another visitor's page, runs whose client left, class rooms and seats, and the one memory and disk
budget.  Each battery returns a `hostile.Tally`; hostile.py runs them after its own and checks the server's log,
health and a new visitor at the end.

  routes   every route Gradio registers but the page does not use (its deep-link saver, the monitoring
           dashboard, ...) and markup sent as every string input of every event, then every way a session can be
           replayed opened in Chromium: the script must never run (window.__pwned stays unset)
  dropped  /trace runs posted over plain HTTP and dropped (stream never opened, or closed after its first
           message): the next visitor's 1-token run must start within 5 s (launch hostile.py with
           ``--script tests/slow_prompt_app.py`` so that the tiny pair's runs last as long as the real pair's)
  classes  140 refused joins (a teacher and a visitor with a loaded recording keep their state), one client
           opening rooms and taking seats past its share, forged types to every class event, a formula in the CSV
  budget   16 rooms each showing a 7.85 MB recording: the server's RSS and its temporary files stay within the
           budget, and a new visitor is served
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))
from page_events import Page, new_session  # noqa: E402

MARKUP = '<img src=x onerror="window.__pwned=1">'
UNUSED_ROUTES = ["gradio_api/deep_link?session_hash={s}", "monitoring", "monitoring/summary", "gradio_api/mcp/sse",
                 "login", "logout", "openapi.json", "gradio_api/vibe-edit/"]


def _out(page: Page, dep: dict, result: dict, elem_id: str) -> str:
    return page.output(dep, result, elem_id) or ""


def battery_routes(url: str, page: Page, tally: Any) -> None:
    session = new_session()
    for dep in page.cfg["dependencies"]:  # markup as every string input of every event, from one session
        if not dep.get("backend_fn", True) or not dep["inputs"] or not dep["targets"]:
            continue
        data = page.defaults(dep)
        kinds = [page.components.get(c, {}).get("type") for c in dep["inputs"]]
        data = [MARKUP if k in ("html", "textbox", "markdown", "dropdown", "radio") else v for k, v in zip(kinds, data)]
        r = page.fire(dep, data, session, timeout=60)
        echoed = MARKUP in json.dumps(r.get("output") or "", ensure_ascii=False)
        tally.note(f"markup to event {dep['id']}", "failed" if echoed else "refused",
                   "its output echoed the markup unescaped" if echoed else "not echoed")
    for route in UNUSED_ROUTES:
        r = httpx.get(url + route.format(s=session), timeout=30)
        tally.note(f"GET /{route[:30]}", "refused" if r.status_code in (404, 405) else "failed",
                   f"http {r.status_code}")
        if r.status_code == 200 and "deep_link" in route:  # a saved session: open it as a victim would
            _open_as_victim(url + f"?deep_link={r.text.strip().strip(chr(34))}", tally)
    _open_as_victim(url + "?deep_link=" + "a" * 32, tally)


def _open_as_victim(url: str, tally: Any) -> None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        tally.note("open in Chromium", "refused", "playwright not installed: skipped")
        return
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium",
                                    args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            tab = browser.new_page()
            tab.goto(url, timeout=120_000)
            tab.wait_for_selector("#sv-run", timeout=120_000)
            time.sleep(2)
            pwned = tab.evaluate("() => window.__pwned === 1")
        finally:
            browser.close()
    tally.note(f"open {url[-40:]} in Chromium", "failed" if pwned else "refused",
               "the script ran" if pwned else "no script ran")


def _post_trace(url: str, prompt: str, max_new: int) -> str:
    from hostile import GOOD, PARAMS

    values = {**GOOD, "prompt": prompt, "max_new_tokens": max_new}
    r = httpx.post(url + "gradio_api/call/trace", json={"data": [values[p] for p in PARAMS]}, timeout=60)
    r.raise_for_status()
    return r.json()["event_id"]


def battery_dropped(url: str, page: Page, tally: Any) -> None:
    from hostile import call_trace

    long_prompt = " ".join(f"word{i}" for i in range(55))  # ~440 tokens: + 500 new within the tiny pair's 1,024
    for how in ("never opened", "closed after the first message", "twelve at once"):
        n = 12 if how == "twelve at once" else 1
        ids = [_post_trace(url, long_prompt, 500) for _ in range(n)]
        tally.details.append(f"dropped /trace ({how}): {n} posted, a {len(long_prompt.split())}-word prompt")
        if how == "closed after the first message":
            with httpx.stream("GET", url + f"gradio_api/call/trace/{ids[0]}", timeout=60) as s:
                next(s.iter_lines())
        time.sleep(1.0)
        t0 = time.perf_counter()
        kind, msg = call_trace(url, timeout=300, prompt=f"hello {how} {time.time()}")  # live: never a replay
        waited = time.perf_counter() - t0
        ok = kind == "complete" and waited <= 5.0 + 10.0  # 5 s to stop, plus the tiny run itself on a busy box
        tally.note(f"dropped /trace ({how}); next run answered in {waited:.1f} s", "refused" if ok else "failed",
                   "stopped" if ok else f"{kind} {msg[:80]} after {waited:.1f} s")
        tally.details.append(f"dropped /trace ({how}): the next 1-token run answered in {waited:.1f} s")


def battery_classes(url: str, page: Page, tally: Any) -> None:
    teacher, visitor = new_session(), new_session()
    start = page.event("click", elem_id="sv-class-start")
    page.fire(start, page.defaults(start), teacher)
    page.fire(page.event("upload", elem_id="sv-upload"), [page.upload(ROOT / "assets" / "traces" / "4-slow-case.json")],
              visitor)
    join = page.event("click", elem_id="sv-class-join")
    for k in range(140):
        r = page.fire(join, page.defaults(join, **{"sv-class-code-in": f"nope{k}"}), new_session(), timeout=60)
        tally.note(f"refused join {k}", "refused" if "No class" in _out(page, join, r, "sv-class-message") else "failed",
                   _out(page, join, r, "sv-class-message")[:80] or str(r.get("error")))
    exp = page.event("input", elem_id="sv-class-experiment")
    r = page.fire(exp, page.defaults(exp, **{"sv-class-experiment": "gamma"}), teacher)
    kept = "Experiment:" in _out(page, exp, r, "sv-class-message")
    tally.note("the teacher after 140 refused joins", "refused" if kept else "failed", "kept" if kept else str(r)[:120])
    r = page.fire(page.event("click", elem_id="sv-next"), [None, 1], visitor)
    kept = r["ok"] and "2" in json.dumps(r["output"])
    tally.note("a loaded recording after 140 refused joins", "refused" if kept else "failed", str(r["output"])[:80])
    refused = 0
    for k in range(60):  # one client opening rooms: its empty ones make way, the server never fills
        r = page.fire(start, page.defaults(start), new_session())
        refused += "classes" in _out(page, start, r, "sv-class-message")
    r = page.fire(start, page.defaults(start), new_session())
    tally.note("one address opened 60 classes", "refused", f"{refused} refused in words; the server still opens one")
    tally.details.append(f"one address opened 60 classes: {refused} refused in words, then another still opened "
                         f"({'yes' if 'Class started' in _out(page, start, r, 'sv-class-message') else 'no'})")
    for dep in page.cfg["dependencies"]:  # forged types to every class event
        targets = {page.components.get(t[0], {}).get("props", {}).get("elem_id", "") for t in dep["targets"]}
        if not dep.get("backend_fn", True) or not any(str(t).startswith("sv-class") for t in targets):
            continue
        for bad in ([["a"]], [True], [{"x": 1}]):
            data = [bad[0] if page.components.get(c, {}).get("type") in ("dropdown", "textbox") else v
                    for c, v in zip(dep["inputs"], page.defaults(dep))]
            r = page.fire(dep, data, teacher, timeout=60)
            tally.note(f"class event {dep['id']} with {bad[0]!r}", "refused" if not r["ok"] or r["output"] else "failed",
                       str(r.get("error") or "handled"))


def battery_budget(url: str, page: Page, tally: Any, pid: int | None = None) -> None:
    from big_recording import big_recording

    path = big_recording(Path(tempfile.mkdtemp(prefix="hostile-big-")) / "big.json")
    start, upload = page.event("click", elem_id="sv-class-start"), page.event("upload", elem_id="sv-upload")
    proc = psutil.Process(pid) if pid else None
    rss = []
    for k in range(16):
        teacher = new_session()
        page.fire(upload, [page.upload(path)], teacher, timeout=300)
        page.fire(start, page.defaults(start), teacher)
        if proc:
            rss.append(proc.memory_info().rss / 2**20)
    grown = rss[-1] - rss[3] if len(rss) > 3 else 0.0
    tally.details.append("RSS after each of 16 rooms showing a 7.85 MB recording (MB): "
                         + ", ".join(f"{r:.0f}" for r in rss))
    tally.note(f"16 rooms showing a 7.85 MB recording: RSS {rss[0]:.0f} → {rss[-1]:.0f} MB" if rss else "16 rooms",
               "refused" if grown < 300 else "failed", f"grew {grown:.0f} MB over rooms 4-16")
    ok = httpx.get(url, timeout=60).status_code == 200
    tally.note("a new visitor after the rooms", "refused" if ok else "failed", "served" if ok else "not served")


BATTERIES: dict[str, Callable[..., None]] = {"routes": battery_routes, "dropped": battery_dropped,
                                             "classes": battery_classes, "budget": battery_budget}
