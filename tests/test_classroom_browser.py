"""Class mode in two real pages (issue 58): a teacher's and an attendee's.

The attendee follows the teacher's step, leaves with "Let me explore", comes back; the attendee's race lands on
the teacher's plot (and the teacher removes it); an unknown code and a forged point are refused in words.
Screenshots: the teacher's plot, the attendee's page at 1280×720 and at 400 px.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from playwright import sync_api  # noqa: F401  (requirements-test.txt)

from specviz.models import TINY_PRESET
from tests.server import launch_app
from tests.test_browser import assert_no_traceback, open_accordion, pick, set_number, tiny_recording  # noqa: F401

UI_S = 30


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """This module's own app (the shared one stops after the app modules; tests/conftest.py)."""
    with launch_app(tmp_path_factory.mktemp("class-app"), env={"SPECVIZ_SHOW_TINY": "1"}) as srv:
        yield srv


@pytest.fixture
def pages(browser):
    made = []

    def new(width=1280, height=720):
        ctx = browser.new_context(viewport={"width": width, "height": height})
        pg = ctx.new_page()
        pg.set_default_timeout(UI_S * 1000)
        pg.svx_errors = []
        pg.on("pageerror", lambda exc: pg.svx_errors.append(str(exc)))
        made.append(ctx)
        return pg

    yield new
    for ctx in made:
        ctx.close()


def step_of(pg) -> int:
    return int(float(pg.input_value("#sv-step input[type=number]")))


def wait_js(pg, js: str, what: str, timeout_s: float = UI_S, arg=None) -> None:
    try:
        pg.wait_for_function(js, arg=arg, polling=100, timeout=timeout_s * 1000)
    except sync_api.TimeoutError:
        pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}; JS errors: {pg.svx_errors}", pytrace=False)


def wait_step(pg, n: int, what: str, timeout_s: float = UI_S) -> float:
    t0 = time.monotonic()
    wait_js(pg, "(n) => Number(document.querySelector('#sv-step input[type=number]')?.value) === n", what,
            timeout_s, arg=n)
    return time.monotonic() - t0


def open_tab(pg, name: str) -> None:
    pg.get_by_role("tab", name=name).click()


def test_a_class_follows_its_teacher_and_plots_its_races(pages, server, tiny_recording, shots):
    teacher = pages(1400, 900)
    teacher.goto(server.url + "?class=new")
    wait_js(teacher, "() => !!document.querySelector('#sv-class-bar-text [data-role=teacher]')", "the teacher's bar", 90)
    open_tab(teacher, "Class")
    teacher.wait_for_selector("#sv-class-code")
    code = teacher.get_attribute("#sv-class-code", "data-code")
    link = teacher.inner_text("#sv-class-join-link")
    assert link.endswith(f"?class={code}") and "teacher=" not in link
    assert teacher.locator("#sv-class-card svg").count() == 1, "no QR code"
    assert "teacher=" in (teacher.text_content("#sv-class-teacher-link") or "")
    pick(teacher, "sv-class-experiment", "Everyone picks γ")
    wait_js(teacher, "() => document.querySelector('#sv-class-message')?.innerText.includes('Experiment')",
            "the experiment to start")

    # An unknown code: a plain message, no class.
    stranger = pages()
    stranger.goto(server.url + "?class=abcdefghj")
    wait_js(stranger, "() => document.querySelector('#sv-class-bar-text')?.innerText.includes('No class is open')",
            "the unknown code's message", 90)
    assert stranger.locator("#sv-class-follow").is_hidden()

    attendee = pages()
    attendee.goto(server.url + f"?class={code}")
    wait_js(attendee, "() => !!document.querySelector('#sv-class-bar-text [data-role=attendee]')", "the attendee's bar", 90)
    wait_js(attendee, "() => document.querySelector('#sv-class-bar-text')?.innerText.includes('Everyone picks')",
            "the experiment's task on the attendee's page")

    # Follow: the teacher steps, the attendee's page shows the same round.
    open_tab(teacher, "Live")
    teacher.locator("#sv-stepper").scroll_into_view_if_needed()
    teacher.click("#sv-next")
    wait_step(teacher, 2, "the teacher's Next")
    teacher.click("#sv-next")
    wait_step(teacher, 3, "the teacher's second Next")
    delay = wait_step(attendee, 3, "the attendee to follow to round 3")
    print(f"attendee followed in {delay:.2f} s after the teacher's page showed round 3")
    wait_js(attendee, "() => /^Round 3\\b/.test(document.querySelector('#sv-narration')?.innerText.trim())",
            "the attendee's narration of round 3")
    attendee.screenshot(path=str(shots / "class-attendee-1280.png"))

    # Detach: the teacher moves on, the attendee stays; back: the attendee catches up.
    attendee.get_by_label("Let me explore").check()
    time.sleep(1.5)
    teacher.click("#sv-next")
    wait_step(teacher, 4, "the teacher's third Next")
    time.sleep(3)
    assert step_of(attendee) == 3, "an exploring attendee was moved by the teacher"
    attendee.get_by_label("Follow the teacher").check()
    wait_step(attendee, 4, "the attendee to catch up after following again")

    # The attendee's race: posted to the room, drawn on the teacher's plot.
    pick(attendee, "sv-preset", TINY_PRESET)
    open_accordion(attendee, "sv-sampling", "#sv-max-new input[type=number]")
    set_number(attendee, "sv-max-new", 16)
    attendee.click("#sv-run")
    wait_js(attendee, "() => document.querySelector('#sv-status .sv-status')?.innerText.startsWith('Done:')",
            "the attendee's race", 300)
    wait_js(attendee, "() => document.querySelector('#sv-class-follow input[value=\"Let me explore\"]')?.checked",
            "Run to leave the teacher's view")
    assert attendee.inner_text("#sv-status .sv-status").startswith("Done:"), "the teacher's view replaced the attendee's race"
    open_tab(attendee, "Class")
    wait_js(attendee, "() => document.querySelector('#sv-class-posted')?.innerText.includes('Posted to the class')",
            "the attendee's point to be posted")
    t_posted = time.monotonic()
    open_tab(teacher, "Class")
    wait_js(teacher, "() => document.querySelector('#sv-class-count')?.dataset.points === '1'",
            "the point on the teacher's page", 10)
    print(f"the point reached the teacher's page {time.monotonic() - t_posted:.2f} s after it was posted")
    wait_js(teacher, "() => document.querySelector('#sv-class-plot .js-plotly-plot')?.innerText.includes('races (1)')",
            "the point on the teacher's plot")
    teacher.locator("#sv-class-plot").screenshot(path=str(shots / "class-teacher-plot.png"))

    # Posting the same race again is refused; a loaded (forged) recording is refused in words.
    attendee.click("#sv-class-post")
    wait_js(attendee, "() => document.querySelector('#sv-class-posted')?.innerText.includes('one point per race')",
            "the second post of one race to be refused")
    forged = tiny_recording
    open_tab(attendee, "Live")
    attendee.get_by_label("Let me explore").check()
    open_accordion(attendee, "sv-files", "#sv-upload input[type=file]")
    attendee.set_input_files("#sv-upload input[type=file]", str(forged))
    wait_js(attendee, "() => document.querySelector('#sv-status .sv-status')?.innerText.startsWith('Loaded')",
            "the forged recording to load")
    open_tab(attendee, "Class")
    attendee.click("#sv-class-post")
    wait_js(attendee, "() => document.querySelector('#sv-class-posted')?.innerText.includes('only a race you ran here')",
            "the forged point to be refused")
    time.sleep(TEACHER_WAIT)
    assert teacher.get_attribute("#sv-class-count", "data-points") == "1"

    # The teacher exports, then removes the point.
    teacher.click("#sv-class-export")
    wait_js(teacher, "() => document.querySelectorAll('#sv-class-files a').length >= 2", "the CSV and JSON files")
    names = teacher.inner_text("#sv-class-files")
    assert ".csv" in names and ".json" in names, names
    teacher.locator("#sv-class-pick input").first.click()
    teacher.get_by_role("option").first.click()
    teacher.click("#sv-class-remove")
    wait_js(teacher, "() => document.querySelector('#sv-class-count')?.dataset.points === '0'", "the point removed", 10)

    # The attendee's page on a phone.
    phone = pages(400, 860)
    phone.goto(server.url + f"?class={code}")
    wait_js(phone, "() => !!document.querySelector('#sv-class-bar-text [data-role=attendee]')", "the phone's bar", 90)
    wait_step(phone, 4, "the phone to follow the teacher")
    phone.screenshot(path=str(shots / "class-attendee-400.png"))
    for pg in (teacher, attendee, stranger, phone):
        assert_no_traceback(pg)
        assert not pg.svx_errors, pg.svx_errors
    assert "Traceback" not in server.log()
    assert "refused a point for class" in server.log()


TEACHER_WAIT = 2.5  # more than the teacher's refresh (class_layout.TEACHER_POLL_S)
