"""The exported page in a headless browser, from file://, with the network cut off.

Debian's Chromium (``/usr/bin/chromium``, or ``$SPECVIZ_CHROMIUM``) through Playwright's sync API
(never `playwright install`).  The browser context is offline and every request that is not a
file:// one is aborted and recorded: the page must need none.  Each test leaves a screenshot in
``$SPECVIZ_SCREENSHOTS`` (or a pytest temporary folder).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specviz.cli.export import export_file
from tests.test_export import tiny_recording

ROOT = Path(__file__).resolve().parents[1]
UI_MS = 30_000


def default_recording() -> Path:
    """The first example's shipped recording: the one the app opens with."""
    first = json.loads((ROOT / "assets" / "examples.json").read_text(encoding="utf-8"))[0]
    for path in sorted((ROOT / "assets" / "traces").glob("*.json")):
        spec = json.loads(path.read_text(encoding="utf-8")).get("speculative") or {}
        if spec.get("prompt") == first["prompt"]:
            return path
    raise AssertionError("no shipped recording for the first example")


@pytest.fixture
def offline_page(browser, shots, request):
    """A page in an offline context; `pg.svx_requests` lists every non-file request (all aborted)."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 800}, offline=True)
    requests: list[str] = []

    def route(r):
        if r.request.url.startswith("file:"):
            r.continue_()
        else:
            requests.append(r.request.url)
            r.abort()
    ctx.route("**/*", route)
    pg = ctx.new_page()
    pg.set_default_timeout(UI_MS)
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.svx_requests, pg.svx_errors = requests, errors
    try:
        yield pg
    finally:
        try:
            pg.screenshot(path=str(shots / f"{request.node.name}-end.png"))
        except Exception:  # a crashed page must not hide the test's own failure
            pass
        ctx.close()


def frame(pg) -> int:
    return int(pg.get_attribute("body", "data-frame"))


def open_page(pg, path: Path) -> None:
    pg.goto(path.as_uri())
    pg.wait_for_selector("body[data-ready='1']")


def test_the_default_recordings_page_animates_offline(offline_page, tmp_path, shots):
    pg = offline_page
    page, nbytes = export_file(default_recording(), tmp_path / "run.html")
    open_page(pg, page)
    # The finished run is drawn at once, and the charts were drawn by the inlined plotly.js.
    n_frames = frame(pg) + 1
    assert n_frames > 10 and pg.locator("#sv-rounds .sv-round").count() >= 2
    pg.wait_for_function("document.querySelectorAll('.sv-x-plot .main-svg').length >= 6")
    assert "Done:" in pg.inner_text("#sv-x-status")
    # Back to the start: the first round, its first draft token pending.
    pg.click("#sv-x-first")
    assert frame(pg) == 0
    assert pg.locator("#sv-rounds .sv-round").count() == 1
    assert pg.locator("#sv-rounds .sv-round--pending [data-status='pending']").count() == 1
    first = pg.inner_html("#sv-rounds")
    # Step forward: the next frame, different markup; step back returns to the first.
    pg.click("#sv-x-fwd")
    assert frame(pg) == 1 and pg.inner_html("#sv-rounds") != first
    assert pg.locator("#sv-rounds .sv-round--pending [data-status='pending']").count() == 2
    pg.click("#sv-x-back")
    assert frame(pg) == 0 and pg.inner_html("#sv-rounds") == first
    # The next round, then play: the frames move on by themselves and more rounds appear.
    pg.click("#sv-x-next-round")
    assert "Round 2 of" in pg.inner_text("#sv-x-pos")
    at = frame(pg)
    pg.select_option("#sv-x-speed", "4")
    pg.click("#sv-x-play")
    pg.wait_for_function(f"Number(document.body.dataset.frame) > {at + 3}")
    pg.screenshot(path=str(shots / "export-mid-animation.png"))
    pg.click("#sv-x-play")  # pause
    assert pg.get_attribute("body", "data-rounds") == "paused"
    assert pg.locator("#sv-rounds .sv-round").count() >= 2
    # The race replays from its recorded timestamps: the clock shows, tokens arrive, then both finish.
    pg.click("#sv-x-race-play")
    pg.wait_for_selector("#sv-race .sv-race-clock")
    pg.wait_for_function("Number(document.querySelector('#sv-race .sv-race-std').dataset.tokens) > 0")
    pg.select_option("#sv-x-race-speed", "4")
    pg.wait_for_selector("#sv-race .sv-speedup-v", timeout=60_000)
    pg.locator("#sv-race").scroll_into_view_if_needed()
    pg.screenshot(path=str(shots / "export-race.png"))
    assert pg.svx_requests == [], f"the page asked the network for {pg.svx_requests}"
    assert pg.svx_errors == [], pg.svx_errors
    assert nbytes < 8 * 2**20


def test_a_tree_runs_page_plays_the_walk(offline_page, tmp_path, shots):
    pg = offline_page
    rec = tiny_recording(tmp_path, drafter="tree", branches=3, tree_nodes=9, tree_mode="iid")
    page, _ = export_file(rec, tmp_path / "tree.html")
    open_page(pg, page)
    pg.click("#sv-x-first")
    assert pg.locator("#sv-tree [data-status='pending']").count() >= 1  # the tree grows, pending
    for _ in range(60):  # step until the target's walk is under way
        if pg.locator("#sv-tree .sv-tree-walk").count():
            break
        pg.click("#sv-x-fwd")
    assert pg.locator("#sv-tree .sv-tree-walk").count() == 1
    assert "verdict, step" in pg.inner_text("#sv-x-status")
    pg.click("#sv-x-fwd")
    pg.locator("#sv-status").scroll_into_view_if_needed()
    pg.screenshot(path=str(shots / "export-tree-walk.png"))
    pg.wait_for_function("document.querySelectorAll('.sv-x-plot .main-svg').length >= 9")
    assert pg.svx_requests == [] and pg.svx_errors == []
