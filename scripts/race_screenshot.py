"""A screenshot of the default example's race made on a busy machine (CPU hogs beside the app).

    python scripts/race_screenshot.py OUT.png [--hogs 3]

Starts the app (replays off), starts ``--hogs`` pure-Python CPU-hog processes, clicks Run on the
default example in Debian's Chromium and saves the race panel once both runs have finished, then
prints what the headline and the status line said.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specviz.cli.race_load import _hog  # noqa: E402
from tests.server import launch_app  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--hogs", type=int, default=3)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp, launch_app(Path(tmp), env={"SPECVIZ_REPLAY": "0"}, timeout=600) as srv:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium",
                                        args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(srv.url)
            page.wait_for_selector("#sv-run", timeout=120_000)
            hogs = [mp.Process(target=_hog, daemon=True) for _ in range(args.hogs)]
            for h in hogs:
                h.start()
            try:
                page.click("#sv-run")
                # The page opens on a shipped recording's race: wait for this run's end (the status says "Done:").
                page.wait_for_function(
                    "() => document.querySelector('#sv-status .sv-status')?.innerText.startsWith('Done:') && "
                    "!!document.querySelector('#sv-race .sv-speedup[data-speedup]')", timeout=600_000)
            finally:
                for h in hogs:
                    h.terminate()
            race = page.locator("#sv-race")
            race.scroll_into_view_if_needed()
            race.screenshot(path=str(args.out))
            print(page.locator("#sv-race .sv-speedup").inner_text())
            print(page.locator("#sv-status").inner_text())
            browser.close()


if __name__ == "__main__":
    main()
