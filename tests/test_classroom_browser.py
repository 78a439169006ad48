"""Class mode in real pages (issue 58, 66): a teacher's and attendees'.

The attendee follows the teacher's step, leaves with "Let me explore", comes back; the attendee's race lands on
the teacher's plot (and the teacher removes it); an unknown code and a forged point are refused in words.
Issue 66: the teacher's page reloaded (started from ?class=new, and from the Start button), opened from the
private link and from the join link in the teacher's own browser, is the same class at the same round and
experiment; an attendee with two tabs and a reload is one attendee; each experiment shows only its own points; a
removed point stays removed; ending asks first and the export works after.
Screenshots: the teacher's plot, the projected card at 1280×720, the attendee's page at 1280×720 and at 400 px.
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
    # Every page here comes from one address: its classes (five, each with attendees or points) exceed the three
    # one address may hold open by default (serving.rooms: issue 62).
    env = {"SPECVIZ_SHOW_TINY": "1", "SPECVIZ_CLASS_ROOMS_PER_CLIENT": "12"}
    with launch_app(tmp_path_factory.mktemp("class-app"), env=env) as srv:
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
    assert teacher.locator("#sv-class-card #sv-class-teacher-link").count() == 0, "the secret on the projected card"
    open_accordion(teacher, "sv-class-private", "#sv-class-teacher-link")
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


# ---- issue 66 ------------------------------------------------------------------------------------------------

TEACHER_BAR = "() => !!document.querySelector('#sv-class-bar-text [data-role=teacher]')"
ATTENDEE_BAR = "() => !!document.querySelector('#sv-class-bar-text [data-role=attendee]')"
IN_URL = "() => /^[?]class=[a-z0-9]{9}$/.test(window.location.search)"  # the class's code, no secret


def new_tab(pg):
    """Another tab of the same browser (its storage shared)."""
    tab = pg.context.new_page()
    tab.set_default_timeout(UI_S * 1000)
    tab.svx_errors = []
    tab.on("pageerror", lambda exc: tab.svx_errors.append(str(exc)))
    return tab


def class_code(pg) -> str:
    wait_js(pg, IN_URL, "the page's URL to name its class")
    return pg.evaluate("new URLSearchParams(window.location.search).get('class')")


def experiment_shown(pg) -> str:
    open_tab(pg, "Class")
    pg.wait_for_selector("#sv-class-experiment input")
    return pg.input_value("#sv-class-experiment input")


def box(pg, selector: str) -> dict:
    return pg.evaluate("(s) => { const r = document.querySelector(s).getBoundingClientRect(); "
                       "return {w: r.width, h: r.height, top: r.top, bottom: r.bottom}; }", selector)


def race_here(pg, *, gamma: int, epsilon: float | None = None) -> None:
    """Run a short race on the tiny pair (a replay of an earlier identical race is a race too)."""
    open_tab(pg, "Live")
    pick(pg, "sv-preset", TINY_PRESET)
    open_accordion(pg, "sv-sampling", "#sv-max-new input[type=number]")
    set_number(pg, "sv-max-new", 16)
    set_number(pg, "sv-gamma", gamma)
    if epsilon is not None:
        set_number(pg, "sv-epsilon", epsilon)
    pg.click("#sv-run")
    wait_js(pg, "() => document.querySelector('#sv-status .sv-status')?.innerText.includes('Done:')", "a race", 300)


def test_a_reloaded_teacher_page_keeps_its_class_round_and_experiment(pages, server, browser, shots):
    """?class=new made a new class on every reload; a class started with the button came back as a plain page;
    the private link reset the round and the recording to the first example."""
    for how, experiment in (("link", "Make speculation lose"), ("button", "Find the ε where α reaches 0.95")):
        teacher = pages(1280, 720)
        if how == "link":
            teacher.goto(server.url + "?class=new")
        else:
            teacher.goto(server.url)
            open_tab(teacher, "Class")
            teacher.click("#sv-class-start")
        wait_js(teacher, TEACHER_BAR, f"the teacher's bar ({how})", 90)
        code = class_code(teacher)
        assert "teacher=" not in teacher.url, "the secret in the address bar (a projector shows it)"
        open_tab(teacher, "Class")
        pick(teacher, "sv-class-experiment", experiment)
        wait_js(teacher, "() => document.querySelector('#sv-class-message')?.innerText.includes('Experiment')",
                "the experiment to start")
        if how == "link":  # the projected card: large; the private link collapsed, outside it
            teacher.wait_for_selector("#sv-class-code")
            assert teacher.locator("#sv-class-card #sv-class-teacher-link").count() == 0
            assert teacher.locator("#sv-class-teacher-link").count() == 0 or \
                not teacher.locator("#sv-class-teacher-link").is_visible(), "the private link shown"
            assert float(teacher.evaluate("parseFloat(getComputedStyle(document.querySelector('#sv-class-code'))"
                                          ".fontSize)")) >= 48
            assert box(teacher, "#sv-class-card .sv-class-qr svg")["w"] >= 320
            teacher.click("#sv-class-project")
            wait_js(teacher, "() => document.querySelector('#sv-class-card.sv-projecting')", "the projection view")
            qr, code_box = box(teacher, "#sv-class-card .sv-class-qr svg"), box(teacher, "#sv-class-code")
            assert qr["w"] >= 320 and qr["top"] >= 0 and qr["bottom"] <= 720 and code_box["bottom"] <= 720, qr
            teacher.screenshot(path=str(shots / "class-card-projected-1280.png"))
            teacher.keyboard.press("Escape")
            wait_js(teacher, "() => !document.querySelector('#sv-class-card.sv-projecting')", "the projection to end")
        open_tab(teacher, "Live")
        teacher.locator("#sv-stepper").scroll_into_view_if_needed()
        for n in (2, 3, 4):
            teacher.click("#sv-next")
            wait_step(teacher, n, "the teacher's Next")

        teacher.reload()
        wait_js(teacher, TEACHER_BAR, f"the reloaded teacher's bar ({how})", 90)
        assert class_code(teacher) == code, "a reload made another class"
        wait_step(teacher, 4, "the reloaded teacher's page at the class's round")
        time.sleep(TEACHER_WAIT)  # (the page's own start, landing late, must not move it back)
        assert step_of(teacher) == 4
        assert experiment_shown(teacher) == experiment

        # The same class from the private link (another browser), and from the join link in the teacher's own.
        open_accordion(teacher, "sv-class-private", "#sv-class-teacher-link")
        private = teacher.text_content("#sv-class-teacher-link")
        if how == "button":
            elsewhere = pages(1280, 720)
            elsewhere.goto(private)
            wait_js(elsewhere, TEACHER_BAR, "the private link's teacher page", 90)
            wait_step(elsewhere, 4, "the private link's page at the class's round")
            assert experiment_shown(elsewhere) == experiment
        else:
            tab = new_tab(teacher)
            tab.goto(server.url + f"?class={code}")
            wait_js(tab, TEACHER_BAR, "the join link in the teacher's browser: the teacher's page", 90)
            wait_step(tab, 4, "the new tab at the class's round")
            attendee = pages()
            attendee.goto(server.url + f"?class={code}")
            wait_js(attendee, ATTENDEE_BAR, "an attendee's bar", 90)
            wait_step(attendee, 4, "the attendee to follow to the class's round")
    for pg in (teacher,):
        assert_no_traceback(pg)
        assert not pg.svx_errors, pg.svx_errors


def gamma_class(teacher, server):
    """A class started by ``?class=new`` on the teacher's page, on "Everyone picks γ": (the page, its code)."""
    teacher.goto(server.url + "?class=new")
    wait_js(teacher, TEACHER_BAR, "the teacher's bar", 90)
    code = class_code(teacher)
    open_tab(teacher, "Class")
    pick(teacher, "sv-class-experiment", "Everyone picks γ")
    return teacher, code


def test_an_attendee_with_two_tabs_and_a_reload_is_one_attendee(pages, server, shots):
    """"2 of 4 attendees have posted" with two attendees, one of them with a second tab and one reload; the bar
    said "0 attendees" while the count box said "0 of 2"."""
    teacher, code = gamma_class(pages(1280, 720), server)

    phone = pages(400, 860)
    phone.goto(server.url + f"?class={code}")
    wait_js(phone, ATTENDEE_BAR, "the first tab's bar", 90)
    second = new_tab(phone)
    second.goto(server.url + f"?class={code}")
    wait_js(second, ATTENDEE_BAR, "the second tab's bar", 90)
    phone.reload()
    wait_js(phone, ATTENDEE_BAR, "the reloaded tab's bar", 90)
    other = pages()  # another person, who types the code
    other.goto(server.url)
    open_tab(other, "Class")
    other.fill("#sv-class-code-in input, #sv-class-code-in textarea", code.upper())
    other.click("#sv-class-join")
    wait_js(other, ATTENDEE_BAR, "the typed code's bar", 60)
    assert class_code(other) == code  # so a reload comes back to the class
    other.reload()
    wait_js(other, ATTENDEE_BAR, "the reloaded typed page's bar", 90)

    both = ("() => document.querySelector('#sv-class-bar-text .sv-class-people')?.dataset.people === '2' && "
            "document.querySelector('#sv-class-count')?.dataset.people === '2'")
    wait_js(teacher, both, "the teacher's bar and count box to say 2 attendees", 15)
    time.sleep(TEACHER_WAIT)
    assert "0 of 2 attendees have posted" in teacher.inner_text("#sv-class-count")
    assert "2 attendees" in teacher.inner_text("#sv-class-bar-text")
    for pg in (phone, second, other):
        wait_js(pg, "() => document.querySelector('#sv-class-bar-text .sv-class-people')?.dataset.people === '2'",
                "an attendee's bar to say 2 attendees", 15)
    phone.screenshot(path=str(shots / "class-attendee-400.png"))
    for pg in (teacher, phone, second, other):
        assert_no_traceback(pg)
        assert not pg.svx_errors, pg.svx_errors


def test_experiments_keep_their_points_a_removed_point_stays_removed_and_ending_asks(pages, server, shots):
    teacher, code = gamma_class(pages(1400, 900), server)
    attendee = pages()
    attendee.goto(server.url + f"?class={code}")
    wait_js(attendee, ATTENDEE_BAR, "the attendee's bar", 90)

    race_here(attendee, gamma=3)
    open_tab(attendee, "Class")
    wait_js(attendee, "() => document.querySelector('#sv-class-posted')?.innerText.includes('γ 3')", "the γ point")
    count = "(n) => document.querySelector('#sv-class-count')?.dataset.points === n"
    wait_js(teacher, count, "the γ point on the teacher's page", 10, arg="1")

    # Another experiment: none of the γ points, its own axis; an ε race is listed with its ε.
    pick(teacher, "sv-class-experiment", "Find the ε where α reaches 0.95")
    wait_js(teacher, count, "the ε experiment's count", 10, arg="0")
    wait_js(teacher, "() => document.querySelector('#sv-class-plot')?.innerText.includes('No points yet')",
            "the ε experiment's empty plot")
    race_here(attendee, gamma=3, epsilon=0.2)
    open_tab(attendee, "Class")
    wait_js(attendee, "() => document.querySelector('#sv-class-posted')?.innerText.includes('ε 0.2')", "the ε point")
    wait_js(teacher, count, "the ε point on the teacher's page", 10, arg="1")
    wait_js(teacher, "() => document.querySelector('#sv-class-plot')?.innerText.includes('ε (over-acceptance)')",
            "the ε axis")
    teacher.locator("#sv-class-plot").screenshot(path=str(shots / "class-teacher-plot-epsilon.png"))
    teacher.locator("#sv-class-pick input").first.click()
    options = [o.inner_text() for o in teacher.get_by_role("option").all()]
    assert len(options) == 1 and "ε 0.2" in options[0] and "γ" not in options[0], options

    # The teacher removes it: the attendee's page says so, and the same race cannot come back.
    teacher.get_by_role("option").first.click()
    teacher.click("#sv-class-remove")
    wait_js(teacher, count, "the point removed", 10, arg="0")
    wait_js(attendee, "() => document.querySelector('#sv-class-posted')?.innerText.includes('Removed by the teacher')",
            "the attendee's page to say the point was removed", 15)
    attendee.click("#sv-class-post")
    wait_js(attendee, "() => document.querySelector('#sv-class-posted')?.innerText.includes('removed this race')",
            "the removed race to be refused")
    time.sleep(TEACHER_WAIT)
    assert teacher.get_attribute("#sv-class-count", "data-points") == "0"

    # Back to γ: its one point, on its own axis.
    pick(teacher, "sv-class-experiment", "Everyone picks γ")
    wait_js(teacher, count, "the γ experiment's point again", 10, arg="1")
    wait_js(teacher, "() => document.querySelector('#sv-class-plot')?.innerText.includes('γ (draft length)')",
            "the γ axis")
    wait_js(teacher, "() => document.querySelector('#sv-class-plot')?.innerText.includes('textbook')",
            "the textbook curve beside the measured one")
    teacher.locator("#sv-class-plot").screenshot(path=str(shots / "class-teacher-plot-gamma.png"))

    # Ending asks first and offers the export; after it, the points stay for the teacher's export.
    teacher.click("#sv-class-close")
    wait_js(teacher, "() => document.querySelector('#sv-class-confirm-text')?.innerText.includes('End class')",
            "the question before ending")
    time.sleep(TEACHER_WAIT)
    assert attendee.locator("#sv-class-bar-text [data-role=attendee]").count() == 1, "asking ended the class"
    teacher.click("#sv-class-confirm-export")
    wait_js(teacher, "() => document.querySelectorAll('#sv-class-files a').length >= 2", "the export before ending")
    teacher.click("#sv-class-confirm-end")
    wait_js(teacher, "() => !!document.querySelector('#sv-class-card [data-state=ended]')", "the ended class")
    wait_js(attendee, "() => document.querySelector('#sv-class-bar-text')?.innerText.includes('ended')",
            "the attendee's page to say the class ended", 15)
    teacher.reload()
    wait_js(teacher, "() => document.querySelector('#sv-class-bar-text [data-state=closed]')", "the ended bar", 90)
    open_tab(teacher, "Class")
    wait_js(teacher, "() => !!document.querySelector('#sv-class-card [data-state=ended]')", "the ended class")
    wait_js(teacher, count, "the ended class's γ point", 10, arg="1")
    teacher.click("#sv-class-export")
    wait_js(teacher, "() => document.querySelectorAll('#sv-class-files a').length >= 2", "the export after ending")
    names = teacher.inner_text("#sv-class-files")
    assert ".csv" in names and ".json" in names, names
    for pg in (teacher, attendee):
        assert_no_traceback(pg)
        assert not pg.svx_errors, pg.svx_errors
    assert "Traceback" not in server.log()
