"""Screenshots of class mode (issue 58): the teacher's plot with a class's worth of points, an attendee's page.

    python scripts/class_screenshots.py                    # 24 points; docs/images/class-teacher.png
    python scripts/class_screenshots.py --points 30 --out /tmp/class-shots

Starts the app (the tiny pair offered, no preload) on a free loopback port, starts a class with the experiment
"Everyone picks γ" through the page's own events (scripts/classroom.py's helpers), and lets `--points` attendees
each run one race on the tiny pair (γ from 1 to 10, sampled at temperature 1 with a seed of their own, so the races
differ) and post it.  Then Debian's Chromium (Playwright, no download) opens:

- the teacher's page (the teacher's own link) at 1280×720: docs/images/class-teacher.png, the Class tab's plot
  (docs/workshop.md shows it), and OUT/class-teacher-1280.png, the whole page;
- an attendee's page following the teacher at round 3, at 1280×720 and at 400 px wide: OUT/class-attendee-1280.png,
  OUT/class-attendee-400.png (for a person to look at; not committed).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import html
import json
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from classroom import Class, Session  # noqa: E402
from page_events import Page  # noqa: E402
from screenshots import CHROMIUM_ARGS  # noqa: E402
from soak import Server  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEACHER_PNG = ROOT / "docs" / "images" / "class-teacher.png"
UI_MS = 120_000


def post_races(cls: Class, code: str, n: int, workers: int, max_new: int) -> int:
    """``n`` attendees join, race once each (a γ and a seed of their own) and post: the points posted."""
    from specviz.models import TINY_PRESET

    by = cls.by_elem

    def one(k: int) -> bool:
        s = Session(cls.page)
        cls.fire(cls.start_page, s)
        cls.fire(cls.join, s, {by["sv-class-code-in"]: code})
        for attempt in range(3):  # a race whose clocks a busy machine spoilt may be refused: another seed
            cls.fire(cls.run, s, {by["sv-preset"]: TINY_PRESET, by["sv-gamma"]: 1 + k % 10,
                                  by["sv-max-new"]: max_new, by["sv-temperature"]: 1.0,
                                  by["sv-seed"]: 1000 * attempt + k})
            posted = cls.fire(cls.post, s)
            if "Posted to the class" in json.dumps(posted.get("output"), ensure_ascii=False):
                return True
        return False

    with cf.ThreadPoolExecutor(workers) as ex:
        return sum(ex.map(one, range(n)))


def wait_js(pg, js: str, arg=None) -> None:
    pg.wait_for_function(js, arg=arg, polling=200, timeout=UI_MS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", type=int, default=24, help="attendees who race and post (one point each)")
    ap.add_argument("--workers", type=int, default=3, help="races at once")
    ap.add_argument("--max-new", type=int, default=24)
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "specviz-class-shots")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    log_dir = Path(tempfile.mkdtemp(prefix="specviz-class-shots-"))
    server = Server({"SPECVIZ_SHOW_TINY": "1", "SPECVIZ_PRELOAD": "0"}, log_dir / "server.log", log_dir / "stats.jsonl")
    try:
        page = Page(server.url)
        cls = Class(page)
        teacher = Session(page)
        cls.fire(cls.start_page, teacher)
        started = json.dumps(cls.fire(cls.start, teacher, {cls.step_id: 1}).get("output"))
        code = re.search(r'data-code=\\"(\w+)', started).group(1)
        own = html.unescape(re.search(r'id=\\"sv-class-teacher-link\\">([^<]+)<', started).group(1))
        cls.fire(cls.experiment, teacher, {cls.by_elem["sv-class-experiment"]: "gamma"})
        posted = post_races(cls, code, args.points, args.workers, args.max_new)
        print(f"class {code}: {posted} of {args.points} races posted", flush=True)

        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            tctx = browser.new_context(viewport={"width": 1280, "height": 720})
            tp = tctx.new_page()
            tp.goto(server.url + "?" + own.split("?", 1)[1])
            wait_js(tp, "() => !!document.querySelector('#sv-class-bar-text [data-role=teacher]')")
            tp.get_by_role("tab", name="Class").click()
            wait_js(tp, "(n) => Number(document.querySelector('#sv-class-count')?.dataset.points) >= n", posted)
            wait_js(tp, "(n) => document.querySelector('#sv-class-plot .js-plotly-plot')?.innerText"
                        ".includes(`races (${n})`)", posted)
            tp.wait_for_timeout(800)  # Plotly's own transition
            tp.locator("#sv-class-plot").screenshot(path=str(TEACHER_PNG))
            tp.screenshot(path=str(args.out / "class-teacher-1280.png"))
            # The teacher steps to round 3; the attendees' pages follow.
            tp.get_by_role("tab", name="Live").click()
            tp.locator("#sv-stepper").scroll_into_view_if_needed()
            for n in (2, 3):
                tp.click("#sv-next")
                wait_js(tp, "(n) => Number(document.querySelector('#sv-step input[type=number]')?.value) === n", n)
            for width, height in ((1280, 720), (400, 860)):
                ctx = browser.new_context(viewport={"width": width, "height": height})
                ap_ = ctx.new_page()
                ap_.goto(server.url + f"?class={code}")
                wait_js(ap_, "() => !!document.querySelector('#sv-class-bar-text [data-role=attendee]')")
                wait_js(ap_, "() => /^Round 3\\b/.test(document.querySelector('#sv-narration')?.innerText.trim())")
                ap_.wait_for_timeout(800)
                ap_.screenshot(path=str(args.out / f"class-attendee-{width}.png"))
                ctx.close()
            browser.close()
        for path in (TEACHER_PNG, *sorted(args.out.glob("class-*.png"))):
            print(path)
        return 0 if posted >= min(args.points, 20) else 1
    finally:
        server.stop()
        print(f"server log: {server.log_path}")


if __name__ == "__main__":
    sys.exit(main())
