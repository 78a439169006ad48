"""The Challenges tab in a headless browser: a recording on the Live tab is not counted, a run of the tiny
pair is, and every challenge then shows its status and a verdict.  Fixtures and helpers are test_browser's
(same server setup)."""

from __future__ import annotations

import re

from specviz.experiments.challenges import CHALLENGES
from specviz.models import TINY_PRESET
from tests.test_browser import (RECORDINGS, UI_S, assert_no_traceback, open_accordion, open_app,  # noqa: F401
                                page, pick, set_number, wait_until)


def check(page, server, expect: str) -> str:
    page.get_by_role("tab", name="Challenges").click()
    page.click("#sv-challenge-check")
    # a check reads every run of the session and the probe's curves: longer than a UI reaction when the other
    # test worker loads the machine (52 s for the whole test once, against ~28 s alone)
    wait_until(page, server, f"() => document.querySelector('#sv-challenge-note')?.innerText.includes({expect!r})",
               f"the check to say {expect!r}", 3 * UI_S)
    return page.inner_text("#sv-challenge-note")


def test_the_challenges_count_the_learners_runs_not_recordings(page, server, shots):  # noqa: F811
    open_app(page, server)
    note = check(page, server, "No runs of yours")
    assert "not counted" in note  # the page opens on a shipped recording
    assert page.locator("#sv-challenges .sv-challenge, #sv-challenges-more .sv-challenge").count() == len(CHALLENGES)
    assert "0 of 8 done" in page.inner_text("#sv-challenges")

    page.get_by_role("tab", name="Live").click()
    pick(page, "sv-preset", TINY_PRESET)
    open_accordion(page, "sv-sampling", "#sv-max-new input[type=number]")
    set_number(page, "sv-max-new", 16)
    page.click("#sv-run")
    wait_until(page, server, "() => document.querySelector('#sv-status .sv-status')?.innerText.startsWith('Done:')",
               "the tiny run to finish", 180)
    note = check(page, server, "Checked 1 run of yours")
    board = page.inner_text("#sv-challenges") + page.inner_text("#sv-challenges-more")
    done = int(re.search(r"(\d+) of 8 done", board).group(1))
    assert f"{done} of {len(CHALLENGES)} done" in note
    # every challenge says where it stands: done (with the verdict that passed it) or not yet, and why
    assert board.count("Passed:") == done and board.count("Not yet:") == len(CHALLENGES) - done
    assert "Pick an answer first" in board  # the machine challenge, answered with nothing
    page.screenshot(path=str(shots / "challenges-after-a-run.png"), full_page=True)

    if RECORDINGS:  # a recording put on the Live tab is shown, never counted
        page.get_by_role("tab", name="Live").click()
        open_accordion(page, "sv-files", "#sv-recordings input")
        pick(page, "sv-recordings", RECORDINGS[-1].name)
        wait_until(page, server, "() => document.querySelector('#sv-status .sv-status')?.innerText"
                                 ".startsWith('Recorded example')", "the recording to load", UI_S)
        note = check(page, server, "not counted")
        assert "Checked 1 run of yours" in note
    assert_no_traceback(page)
    assert not page.svx_errors, f"JS errors: {page.svx_errors}"
