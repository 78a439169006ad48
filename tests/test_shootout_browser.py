"""The Sweeps tab in a headless browser: the recorded results at page load, then a drafter shoot-out on
the tiny pair whose runs go to the Live tab.  Fixtures and helpers are test_browser's (same server setup)."""

from __future__ import annotations

from specviz.experiments import recorded
from specviz.models import TINY_PRESET
from tests.test_browser import (UI_S, assert_no_traceback, open_accordion, open_app, page,  # noqa: F401
                                pick, set_number, status, wait_until)


def test_sweeps_tab_shows_the_recording_then_a_fresh_shootout(page, server, shots):  # noqa: F811
    rec = recorded.load()
    open_app(page, server)
    page.get_by_role("tab", name="Sweeps").click()
    page.wait_for_selector("#sv-shootout-table table.sv-shootout")
    assert rec.when() in page.inner_text("#sv-sweep-status")
    assert rec.when() in page.inner_text("#sv-shootout-table")
    page.wait_for_selector("#sv-shootout-plot .js-plotly-plot")
    squash = lambda text: "".join(text.split())  # noqa: E731 -- the chart wraps the line for phones
    assert squash(rec.when()) in squash(page.locator("#sv-shootout-plot").text_content())
    page.screenshot(path=str(shots / "sweeps-recorded.png"), full_page=True)
    page.get_by_role("tab", name="How it works").click()
    page.wait_for_selector("#sv-how >> text=Draft heads")
    assert "2–3×" in page.inner_text("#sv-how")
    page.locator("#sv-how >> text=Draft heads").scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "how-draft-heads.png"))

    page.get_by_role("tab", name="Live").click()
    pick(page, "sv-preset", TINY_PRESET)
    open_accordion(page, "sv-sampling", "#sv-max-new input[type=number]")
    set_number(page, "sv-max-new", 8)
    page.get_by_role("tab", name="Sweeps").click()
    page.click("#sv-shootout-run")
    wait_until(page, server, "() => document.querySelector('#sv-sweep-status')?.innerText.includes('shoot-out done')",
               "the shoot-out to finish", 300)
    table = page.inner_text("#sv-shootout-table")
    assert "tiny-target" in table and "did not run: No trained speculator" in table
    assert rec.when() not in table  # the fresh shoot-out replaced the recording
    page.locator("#sv-shootout-table").scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "sweeps-shootout-tiny.png"), full_page=True)

    page.click("#sv-shootout-show")  # the first run (the draft model's) goes to the Live tab
    wait_until(page, server, "() => document.querySelector('#sv-status .sv-status')?.innerText.startsWith('Shoot-out run')",
               "the run on the Live tab", UI_S)
    assert "confidence" in page.inner_text("#sv-legend")
    assert_no_traceback(page)
    assert not page.svx_errors, f"JS errors: {page.svx_errors}"
