"""Screenshots of the running app, for the README and for a person to look at.

    python scripts/screenshots.py                  # docs/images/*.png and their manifest
    python scripts/screenshots.py --review OUT/    # also the page at 1400 px, 1280x720, 400 px and dark mode

Starts the app on a free loopback port (no model preload: the shots show the shipped recordings of real races),
drives Debian's Chromium through Playwright and writes:

- docs/images/race.png: the Live tab on the first example's recorded race (the README's picture);
- docs/images/step.png: step mode at round 3 with the acceptance picture;
- docs/images/manifest.json: each image's size and SHA-256, and the app's fingerprint (the elem_ids of its
  components and its style sheet, `app_fingerprint`), which tests/test_docs.py compares with the current app's:
  when the page changes, the test says to run this script again.

`--review OUT/`: the Live tab (step mode, the acceptance picture), Sweeps, How it works and Challenges at
1400 px, 1280x720 and 400 px, light and dark, for the looking the developers' guide asks for (not committed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def app_fingerprint() -> str:
    """What a screenshot shows of the app's make: its components' elem_ids (in order) and its style sheet."""
    import os

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("SPECVIZ_PRELOAD", "0")
    sys.path.insert(0, str(ROOT))
    import app

    demo = app.build()
    ids = [getattr(b, "elem_id", None) for b in demo.blocks.values()]
    h = hashlib.sha256()
    h.update(json.dumps([i for i in ids if i]).encode())
    h.update((ROOT / "assets" / "style.css").read_bytes())
    return h.hexdigest()[:16]


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    return struct.unpack(">II", head[16:24])


def _wait_recording(page) -> None:
    page.wait_for_selector("#sv-status .sv-status", state="attached", timeout=120_000)
    page.wait_for_function("() => document.querySelector('#sv-status .sv-status')?.innerText"
                           ".startsWith('Recorded example')", timeout=120_000)
    page.wait_for_selector("#sv-race .sv-speedup[data-speedup]", timeout=60_000)


def _settle(page) -> None:
    page.wait_for_timeout(1200)  # plotly's first draw and the fonts


def readme_shots(browser, url: str) -> dict[str, dict]:
    out = {}
    page = browser.new_page(viewport={"width": 1280, "height": 860})
    page.goto(url + "?recording=1-code-greedy")
    _wait_recording(page)
    _settle(page)
    page.screenshot(path=str(IMAGES / "race.png"))
    out["race.png"] = {"what": "the Live tab on the first example's recorded race", "query": "?recording=1-code-greedy"}
    page.goto(url + "?recording=2-chat-greedy&round=3")
    _wait_recording(page)
    page.wait_for_selector("#sv-picture .js-plotly-plot", timeout=60_000)
    _settle(page)
    pic = page.locator("#sv-picture")
    pic.scroll_into_view_if_needed()
    pic.screenshot(path=str(IMAGES / "step.png"))
    out["step.png"] = {"what": "step mode: the acceptance picture at round 3", "query": "?recording=2-chat-greedy&round=3"}
    page.close()
    return out


REVIEW_SIZES = [("1400", 1400, 900), ("1280x720", 1280, 720), ("400", 400, 860)]


def review_shots(browser, url: str, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    made = []
    for theme in ("light", "dark"):
        for name, w, h in REVIEW_SIZES:
            page = browser.new_page(viewport={"width": w, "height": h})
            q = "?recording=3-translation-sampled&round=2" + ("&__theme=dark" if theme == "dark" else "")
            page.goto(url + q)
            _wait_recording(page)
            page.wait_for_selector("#sv-picture .js-plotly-plot", timeout=60_000)
            _settle(page)
            for sel, slug in (("#sv-picture", "picture"), ("#sv-step-round", "step-round"), ("#sv-race", "race")):
                loc = page.locator(sel).first
                loc.scroll_into_view_if_needed()
                path = out / f"{slug}-{name}-{theme}.png"
                loc.screenshot(path=str(path))
                made.append(path)
            for tab in ("Sweeps", "How it works", "Challenges", "Theory"):
                page.get_by_role("tab", name=tab).click()
                _settle(page)
                path = out / f"tab-{tab.lower().replace(' ', '-')}-{name}-{theme}.png"
                page.screenshot(path=str(path), full_page=True)
                made.append(path)
            page.close()
    return made


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--review", type=Path, default=None, help="also write review shots to this folder")
    ap.add_argument("--no-readme", action="store_true", help="only the review shots")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from playwright.sync_api import sync_playwright

    from tests.server import launch_app

    IMAGES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, launch_app(Path(tmp), timeout=600) as srv, sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        if not args.no_readme:
            shots = readme_shots(browser, srv.url)
            for name, info in shots.items():
                path = IMAGES / name
                info["size"] = list(png_size(path))
                info["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
            manifest = {"app_fingerprint": app_fingerprint(), "images": shots,
                        "made_by": "python scripts/screenshots.py"}
            (IMAGES / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
            print(f"wrote {', '.join(shots)} and manifest.json to {IMAGES}")
        if args.review:
            made = review_shots(browser, srv.url, args.review)
            print(f"wrote {len(made)} review shots to {args.review}")
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
