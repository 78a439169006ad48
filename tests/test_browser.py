"""The real app in a headless browser: a run on the default pair, escaping, errors, theory, loading, step mode.

Drives Debian's Chromium (``/usr/bin/chromium``, or ``$SPECVIZ_CHROMIUM``) through Playwright's sync API;
Playwright's own browser download is never used.  One app server (conftest's session fixture, started by
``tests/server.py`` with the tiny pair shown in the dropdown) serves every test; each test opens its own page.

Every test leaves a full-page screenshot in ``$SPECVIZ_SCREENSHOTS`` (or a pytest temporary folder,
printed at the end of the module), also when it fails.

Timeouts are generous: on a 2-core CPU the default pair takes ~20 s to load, ~15 s for 16 speculative
tokens and ~1 s per standard token; the finished race shows its speedup at once (the replay is a button).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.server import launch_app
from specviz.drafters import DRAFTERS
from specviz.models import DEFAULT_PRESET, TINY_PRESET
from specviz.trace import load_recording

from playwright import sync_api  # noqa: E402,F401  (requirements-test.txt: a missing Playwright fails collection, never skips)

from tests.chromium import CHROMIUM, CHROMIUM_ARGS  # noqa: E402,F401  (without Chromium these tests skip; tests/chromium.py)

VIEWPORT = {"width": 1400, "height": 900}
ROOT = Path(__file__).resolve().parent.parent
RECORDINGS = sorted((ROOT / "assets" / "traces").glob("*.json"))

UI_S = 30  # a UI reaction (event round trip, tab switch, plot redraw)
RUN_S = 900  # model load (first-ever conversion: ~2 min) + both decoders
XSS = "<script>window.__pwned=1</script>"
XSS_IMG = "<img/src=x/onerror=window.__pwned=2>"
TRACEBACK_MARKERS = ("Traceback (most recent call last)", 'File "/', "site-packages")


# ---- fixtures ----------------------------------------------------------------------------------------


# `server` (the app, shared by every module), `browser` and `shots` are tests/conftest.py's session fixtures.


@pytest.fixture
def page(browser, server, shots, request):
    """A fresh page on the app; a full-page screenshot of it is saved when the test ends, pass or fail."""
    ctx = browser.new_context(viewport=VIEWPORT)
    pg = ctx.new_page()
    pg.set_default_timeout(UI_S * 1000)
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.svx_errors = errors  # uncaught JS errors, for failure messages
    try:
        yield pg
    finally:
        try:
            pg.screenshot(path=str(shots / f"{request.node.name}-end.png"), full_page=True)
        except Exception:  # a crashed page must not hide the test's own failure
            pass
        ctx.close()


@pytest.fixture(scope="module")
def tiny_recording(tmp_path_factory) -> Path:
    """A recording made in-process with the tiny random pair (no server, no download)."""
    from specviz.core import engine
    from tests import drafted
    from specviz.models import encode_prompt
    from specviz.core.settings import DecodeSettings
    from specviz.models.tiny import build_tiny_pair
    from specviz.trace import recording_to_json

    pair = build_tiny_pair()
    prompt = "Say something."
    ids = encode_prompt(pair, prompt)
    settings = DecodeSettings.checked(gamma=4, max_new_tokens=24, temperature=1.0, seed=1)
    spec = drafted.speculative_decode(pair, ids, settings, prompt=prompt)
    std = engine.standard_decode(pair, ids, settings, prompt=prompt)
    assert len(spec.rounds) >= 2, "the tiny recording needs at least two rounds for step mode"
    path = tmp_path_factory.mktemp("traces") / "tiny-recording.json"
    path.write_text(recording_to_json(spec, std), encoding="utf-8")
    return path


# ---- helpers -----------------------------------------------------------------------------------------


def open_app(page, server, query: str = "") -> None:
    page.goto(server.url + query)
    # attached, not visible: in presenter mode (?present=1) the controls column, Run and the status line with
    # it, sits in a closed drawer, and whether it is hidden before or after this wait is a race
    page.wait_for_selector("#sv-status .sv-status", state="attached", timeout=60_000)
    page.wait_for_selector("#sv-run", state="attached", timeout=60_000)
    if RECORDINGS:  # the page shows the first shipped recording once it has loaded; let that land first
        page.wait_for_function(
            "() => document.querySelector('#sv-status .sv-status')?.innerText.startsWith('Recorded example')",
            timeout=60_000)


def status(page) -> tuple[str, str]:
    """(kind, text) of the status line."""
    el = page.locator("#sv-status .sv-status").first
    return (el.get_attribute("data-kind") or ""), el.inner_text()


def wait_until(page, server, js: str, what: str, timeout_s: float, *, fail_on_error: bool = True) -> None:
    """Wait for a JS condition (polled in the page every 100 ms, so a wait ends as soon as it holds);
    once a second, fail at once when the status line shows an error."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            page.wait_for_function(js, polling=100, timeout=1000)
            return
        except sync_api.TimeoutError:
            pass
        kind, text = status(page)
        if fail_on_error and kind == "error":
            pytest.fail(f"while waiting for {what}, the app reported an error: {text}\n"
                        f"--- app log (tail) ---\n{server.log()[-3000:]}", pytrace=False)
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}; status: [{kind}] {text!r}; "
                        f"JS errors: {page.svx_errors}\n--- app log (tail) ---\n{server.log()[-3000:]}",
                        pytrace=False)


def pick(page, elem_id: str, option: str) -> None:
    """Choose an option of a gr.Dropdown."""
    page.locator(f"#{elem_id} input").first.click()
    page.get_by_role("option", name=option, exact=True).click()
    page.wait_for_function("([sel, v]) => document.querySelector(sel)?.value === v",
                           arg=[f"#{elem_id} input", option])


def set_number(page, elem_id: str, value) -> None:
    """Type a value into a slider's (or number's) box, then leave the box, as a person would."""
    box = page.locator(f"#{elem_id} input[type=number]").first
    check = "([sel, v]) => Number(document.querySelector(sel)?.value) === v"
    arg = [f"#{elem_id} input[type=number]", float(value)]
    for _ in range(3):  # an update from an earlier event (a policy change resets γ's range) may land after typing
        box.fill(str(value))
        box.press("Tab")
        try:
            page.wait_for_function(check, arg=arg, timeout=5_000)
            return
        except Exception:
            page.wait_for_timeout(500)
    page.wait_for_function(check, arg=arg)


def open_accordion(page, elem_id: str, inner_selector: str) -> None:
    """Open a gr.Accordion (its children are only rendered once open)."""
    if not page.locator(f"#{elem_id} {inner_selector}").count():
        page.locator(f"#{elem_id} button").first.click()
    # a file input is hidden behind its drop zone: "attached" is as visible as it gets
    state = "attached" if "type=file" in inner_selector else "visible"
    page.wait_for_selector(f"#{elem_id} {inner_selector}", state=state)


# Every figure in view drawn, at its box's width (a tab's figures are laid out when the tab opens).
PLOTS_DRAWN = """() => [...document.querySelectorAll('.js-plotly-plot')].filter(p => p.offsetWidth > 0)
  .every(p => p._fullLayout && Math.abs(p._fullLayout.width - p.parentElement.clientWidth) <= 4)"""


def settle_plots(page, timeout_ms: int = 3000) -> None:
    """Before a screenshot: let the figures in view finish drawing (at most ``timeout_ms``; only the picture
    depends on it, so a figure that never matches its box's width is no failure here)."""
    try:
        page.wait_for_function(PLOTS_DRAWN, polling=100, timeout=timeout_ms)
    except sync_api.TimeoutError:
        pass
    page.wait_for_timeout(200)  # the frame after the last relayout


def assert_no_traceback(page) -> None:
    body = page.inner_text("body")
    for marker in TRACEBACK_MARKERS:
        assert marker not in body, f"the page shows traceback text ({marker!r}):\n{body[-2000:]}"


def narration(page) -> str:
    return page.inner_text("#sv-narration").strip()


def step_and_check(page, server) -> None:
    """Step mode: Next and Previous move the round and change the narration."""
    page.locator("#sv-stepper").scroll_into_view_if_needed()
    wait_until(page, server, "() => /^Round 1\\b/.test(document.querySelector('#sv-narration')?.innerText.trim())",
               "the narration of round 1", UI_S)
    first = narration(page)
    page.click("#sv-next")
    wait_until(page, server, "() => /^Round 2\\b/.test(document.querySelector('#sv-narration')?.innerText.trim())",
               "Next to show round 2's narration", UI_S)
    second = narration(page)
    assert second != first, "Next did not change the narration"
    assert page.locator("#sv-step-round .sv-round--current[data-round='2']").count() == 1, \
        "step mode does not show round 2 as the current round"
    page.click("#sv-prev")
    wait_until(page, server, "() => /^Round 1\\b/.test(document.querySelector('#sv-narration')?.innerText.trim())",
               "Previous to go back to round 1", UI_S)
    assert narration(page) == first, "Previous did not bring round 1's narration back"


def wait_race_finished(page, server, timeout_s: float, *, replayed: bool) -> float:
    """Both race columns finished and the speedup shown; returns the speedup.

    ``replayed``: the race was replayed in real time (the replay button: a clock shows); wait for the
    replay's end, not the moment before its first frame."""
    need_clock = "!!document.querySelector('#sv-race .sv-race-clock')" if replayed else "true"
    wait_until(page, server, f"""() => {{
        const sp = document.querySelector('#sv-race .sv-speedup[data-speedup]');
        return !!sp && document.querySelectorAll('#sv-race .sv-race-col .sv-badge--done').length === 2
            && {need_clock};
    }}""",
        "the race to finish with a speedup" + (" (end of the replay)" if replayed else ""), timeout_s)
    sp = page.locator("#sv-race .sv-speedup[data-speedup]")
    value = float(sp.get_attribute("data-speedup"))
    shown = sp.locator(".sv-speedup-v").inner_text()
    if sp.get_attribute("data-reliable") == "false":  # a busy machine (CI's other worker): the count-based figure
        assert re.fullmatch(r"≈\d+\.\d\d×", shown) or re.fullmatch(r"\d+\.\d\d×", shown), f"speedup shown as {shown!r}"
        assert "Timings ±" in sp.inner_text(), "a flagged race does not say its timings were disturbed"
        return float(shown.lstrip("≈")[:-1]) if shown.startswith("≈") else value
    assert re.fullmatch(r"\d+\.\d\d×", shown), f"speedup shown as {shown!r}"
    assert value > 0 and abs(float(shown[:-1]) - value) < 0.006, f"speedup {shown!r} vs data-speedup {value}"
    return value


# ---- tests -------------------------------------------------------------------------------------------


def test_default_pair_run_animates_and_races(page, server, shots):
    """The default pair through the UI: rounds with accepted and rejected drafts, then the race and its speedup."""
    open_app(page, server)
    pick(page, "sv-preset", DEFAULT_PRESET)
    pick(page, "sv-example", "Chat")  # greedy chat text: the 0.5B draft disagrees now and then
    wait_until(page, server, "() => document.querySelector('#sv-prompt textarea')?.value.includes('hash table')",
               "the Chat example to fill the prompt", UI_S)
    open_accordion(page, "sv-sampling", "#sv-max-new input[type=number]")
    set_number(page, "sv-temperature", 0)
    # 24 tokens: a few rounds, with a rejection in them (on the int8 target with the lean glue, greedy γ = 5
    # accepts 5, 5, 5, then rejects the fourth round's first draft; the shipped recording, made before the
    # glue, rejects in round 2), and less decoding and replay time than 32
    set_number(page, "sv-max-new", 24)
    set_number(page, "sv-gamma", 5)
    page.click("#sv-run")

    # While it runs: rounds appear; a screenshot of the panel mid-animation (not of the recording
    # shown before the run, whose rounds are already there).
    wait_until(page, server, "() => document.querySelector('#sv-status .sv-status')?.innerText"
               ".startsWith('Speculative decoding') && document.querySelectorAll('#sv-rounds .sv-round').length >= 2",
               "the first rounds to appear", RUN_S)
    page.locator("#sv-legend").scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "live-default-pair-animating.png"))

    wait_until(page, server, "() => document.querySelector('#sv-status .sv-status')?.innerText.startsWith('Done:')",
               "the run to finish (status 'Done: …')", RUN_S)
    # The result shows as soon as the run ends (no replay hides it); the replay is on request.
    speedup = wait_race_finished(page, server, UI_S, replayed=False)
    assert page.locator("#sv-race .sv-race-clock").count() == 0, "the finished run was replayed unasked"
    kind, text = status(page)
    assert kind == "ok" and text.startswith("Done:"), f"status after the run: [{kind}] {text}"
    assert f"{speedup:.2f}×" in text, f"the status does not repeat the speedup {speedup:.2f}×: {text}"

    chips = {s: page.locator(f"#sv-rounds .sv-chip.sv-{s}").count() for s in ("accepted", "rejected")}
    assert chips["accepted"] > 0 and chips["rejected"] > 0, f"expected accepted and rejected drafts, got {chips}"
    for col in ("spec", "std"):
        n = int(page.locator(f"#sv-race .sv-race-{col}").get_attribute("data-tokens"))
        assert n == 24, f"the {col} column shows {n} tokens, expected 24"
    assert page.locator("#sv-metrics table.sv-metrics").count() == 1, "no metrics table after the run"
    assert_no_traceback(page)
    page.screenshot(path=str(shots / "live-default-pair-done.png"), full_page=True)
    page.click("#sv-replay")  # on request: the race again at its recorded times, ending on the same result
    assert wait_race_finished(page, server, RUN_S, replayed=True) == speedup

    step_and_check(page, server)
    assert not page.svx_errors, f"JS errors: {page.svx_errors}"


def test_stop_mid_run_shows_where_it_got(page, server, shots):
    """Stop during speculative decoding: a clear status, no round left "verifying…", the column marked stopped."""
    open_app(page, server)
    pick(page, "sv-preset", DEFAULT_PRESET)
    open_accordion(page, "sv-sampling", "#sv-max-new input[type=number]")
    # (long enough that a loaded machine cannot finish the race before Stop reaches the server: with 48 tokens the
    # run once ended there first, and the status said only "Stopped")
    set_number(page, "sv-max-new", 160)
    page.click("#sv-run")
    wait_until(page, server, "() => document.querySelectorAll('#sv-rounds .sv-round:not(.sv-round--pending)').length >= 1"
               " && document.querySelector('#sv-status .sv-status')?.innerText.startsWith('Speculative')",
               "the first round", RUN_S)
    # every text the status line shows from now on
    page.evaluate("() => { window.__said = []; new MutationObserver(() => window.__said.push("
                  "document.querySelector('#sv-status')?.innerText || '')).observe("
                  "document.querySelector('#sv-status'), {subtree: true, childList: true, characterData: true, "
                  "attributes: true}); }")
    page.click("#sv-stop")
    wait_until(page, server, "() => document.querySelector('#sv-status .sv-status')?.dataset.kind === 'warn'",
               "the status to say the run stopped", UI_S)
    page.wait_for_timeout(2000)  # nothing may redraw after Stop
    said = page.evaluate("() => window.__said")
    assert any("Stopping…" in t for t in said), f"Stop said nothing before the server answered: {said[:5]}"
    kind, text = status(page)
    assert text.startswith("Stopped after"), f"status after Stop: [{kind}] {text}"
    assert page.locator("#sv-rounds .sv-round--pending").count() == 0, "a round is still 'verifying…' after Stop"
    badges = page.locator("#sv-race .sv-badge").all_inner_texts()
    assert badges[0].startswith("stopped · ") and "running…" not in badges, f"race badges after Stop: {badges}"
    n = int(page.locator("#sv-race .sv-race-spec").get_attribute("data-tokens"))
    assert 0 < n < 160 and f"after {n} speculative token" in text, f"{n} tokens shown; status: {text}"
    assert "Stopped before the end" in page.inner_text("#sv-race .sv-speedup")  # a cut race: no speedup
    assert "stopped by the user" in page.inner_text("#sv-metrics")  # the numbers are this run's, not the last
    # step mode's acceptance picture is this run's round 1 too (the page's state changed: its picture follows)
    from specviz.views.acceptance import _label

    # (what the narration of round 1 says: the position of the token it names, or that all k drafts were accepted)
    narration = page.inner_text("#sv-narration")
    named, every = re.search(r"token (\d+) '([^']*)'", narration), re.search(r"accepted all (\d+)", narration)
    assert named or every, narration[:600]
    check = (f"t.includes({json.dumps(named.group(1) + ': ' + _label(named.group(2)))})" if named else
             f"t.includes({json.dumps(every.group(1) + ': ')}) && !t.includes('rejected')")
    wait_until(page, server, f"() => {{ const t = document.querySelector('#sv-pos-pick')?.innerText || ''; return {check}; }}",
               "the acceptance picture of the stopped run's first round", UI_S)
    page.locator("#sv-legend").scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "live-stopped.png"))
    assert_no_traceback(page)


def test_prompt_markup_is_text_not_html(page, server, tiny_recording, tmp_path):
    """A prompt and token texts full of markup are shown as text; no script runs."""
    open_app(page, server)
    pick(page, "sv-preset", TINY_PRESET)
    page.fill("#sv-prompt textarea", f"Repeat: {XSS} {XSS_IMG}")
    open_accordion(page, "sv-sampling", "#sv-max-new input[type=number]")
    set_number(page, "sv-max-new", 8)
    page.click("#sv-run")
    wait_until(page, server, "() => document.querySelector('#sv-status .sv-status')?.innerText.startsWith('Done:')",
               "the tiny run to finish", 180)
    assert page.evaluate("typeof window.__pwned") == "undefined", "a script from the prompt ran"

    # Token texts are model output, so also feed markup through the rendering of a loaded recording.
    doc = json.loads(tiny_recording.read_text(encoding="utf-8"))
    doc["speculative"]["prompt"] = XSS
    rnd = doc["speculative"]["rounds"][0]
    rnd["draft"][0]["text"] = XSS
    rnd["extra"]["text"] = XSS_IMG
    rnd["emitted"][-1]["text"] = XSS_IMG
    evil = tmp_path / "markup.json"
    evil.write_text(json.dumps(doc), encoding="utf-8")
    open_accordion(page, "sv-files", "#sv-upload input[type=file]")
    page.set_input_files("#sv-upload input[type=file]", str(evil))
    wait_until(page, server, "() => document.querySelector('#sv-status .sv-status')?.innerText.includes('markup.json')",
               "the doctored recording to load", UI_S)
    page.wait_for_timeout(500)
    assert page.evaluate("typeof window.__pwned") == "undefined", "markup in a token ran as HTML"
    assert XSS in page.inner_text("#sv-rounds"), "the <script> token is not shown as text in the rounds panel"
    assert XSS_IMG in page.inner_text("#sv-race"), "the <img> token is not shown as text in the race"
    assert page.locator("#sv-rounds img, #sv-race img, #sv-rounds script, #sv-race script").count() == 0


def test_empty_prompt_shows_a_clear_message(page, server):
    open_app(page, server)
    pick(page, "sv-preset", TINY_PRESET)
    page.fill("#sv-prompt textarea", "   ")
    rounds_before = page.locator("#sv-rounds .sv-rounds").evaluate("e => e.outerHTML")
    page.click("#sv-run")
    wait_until(page, server, "() => document.querySelector('#sv-status .sv-status')?.dataset.kind === 'error'",
               "an error in the status line", UI_S, fail_on_error=False)
    kind, text = status(page)
    assert "prompt is empty" in text.lower(), f"unclear status for an empty prompt: {text!r}"
    assert_no_traceback(page)
    assert page.locator("#sv-rounds .sv-rounds").evaluate("e => e.outerHTML") == rounds_before, \
        "an empty prompt changed the rounds panel"


def test_theory_slider_updates_note_and_plot(page, server):
    open_app(page, server)
    page.get_by_role("tab", name="Theory").click()
    page.wait_for_selector("#sv-theory-note", state="visible")
    # The shipped recording loads at start-up and moves the sliders to its measured α, γ, c:
    # wait for that first, so it cannot overwrite the slider move below.
    wait_until(page, server, "() => /Optimal γ[\\s\\S]*Last run/.test(document.querySelector('#sv-theory-note')?.innerText)",
               "the theory note with the recorded run's numbers", UI_S)
    before = page.inner_text("#sv-theory-note")
    first = sorted((ROOT / "assets" / "traces").glob("*.json"))[0]
    recorded_alpha = load_recording(first.read_bytes())[0].summary().alpha
    assert f"α = {recorded_alpha:.2f}" in before and "γ* = " in before, \
        f"sliders did not follow the recorded run (α = {recorded_alpha:.3f}): {before!r}"
    plot_before = page.locator("#sv-t-speed").text_content()

    # Drag α with the mouse: press on the handle, release a third of the way along the track.
    track = page.locator("#sv-alpha input[type=range]")
    track.scroll_into_view_if_needed()
    box = track.bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.8, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.33, y, steps=8)
    page.mouse.up()
    alpha = float(page.locator("#sv-alpha input[type=number]").input_value())
    assert alpha < 0.6, f"α did not move (it is {alpha})"
    # (The note may also change for another reason first: the shipped recording loading at start-up
    # adds its "Last run" line.  Wait for the new α itself.)
    wait_until(page, server, f"() => document.querySelector('#sv-theory-note')?.innerText.includes("
               f"{json.dumps(f'Optimal γ for α = {alpha:.2f}')})", "the note to follow the α slider", UI_S)
    after = page.inner_text("#sv-theory-note")
    assert after != before and f"α = {alpha:.2f}" in after, f"the note does not show the new α {alpha:.2f}: {after!r}"
    wait_until(page, server, f"() => document.querySelector('#sv-t-speed')?.textContent !== {json.dumps(plot_before)}",
               "the speedup plot to redraw for the new α", UI_S)
    assert f"α = {alpha:.3f}" in page.locator("#sv-t-speed").text_content()

    # γ is a real input too: the note reports the expected values at the chosen γ.
    set_number(page, "sv-t-gamma", 9)
    wait_until(page, server, "() => document.querySelector('#sv-theory-note')?.innerText.includes('At γ = 9')",
               "the note to follow γ", UI_S)
    assert_no_traceback(page)


def test_load_trace_without_models_then_step(page, server, tiny_recording, shots):
    """A recording (shipped, or made here with the tiny pair) renders rounds and race with no model loaded."""
    log_before = len(server.log())
    open_app(page, server)
    if RECORDINGS:
        # The first shipped recording is shown when the page opens; pick each in turn.
        open_accordion(page, "sv-files", "#sv-recordings input")
        names = [p.name for p in RECORDINGS]
        wait_until(page, server, "() => document.querySelector('#sv-status .sv-status')?.innerText.startsWith('Recorded example')",
                   "the first recording to load with the page", UI_S)
        if len(names) > 1:
            pick(page, "sv-recordings", names[1])
            wait_until(page, server, f"() => document.querySelector('#sv-status .sv-status')?.innerText.includes({json.dumps(RECORDINGS[1].stem)})",
                       "the second recording to load", UI_S)
    else:
        open_accordion(page, "sv-files", "#sv-upload input[type=file]")
        page.set_input_files("#sv-upload input[type=file]", str(tiny_recording))
        wait_until(page, server, "() => document.querySelector('#sv-status .sv-status')?.innerText.startsWith('Loaded tiny-recording.json')",
                   "the uploaded recording to load", UI_S)
    kind, text = status(page)
    assert kind == "ok", f"status after loading: [{kind}] {text}"
    assert page.locator("#sv-rounds .sv-round").count() >= 2, "the rounds panel is empty after loading"
    assert page.locator("#sv-rounds .sv-chip.sv-accepted, #sv-rounds .sv-chip.sv-rejected").count() > 0
    speedup = wait_race_finished(page, server, UI_S, replayed=False)
    assert speedup > 0
    step_and_check(page, server)
    page.screenshot(path=str(shots / "loaded-trace.png"), full_page=True)
    loaded = [ln for ln in server.log()[log_before:].splitlines() if re.search(r"\bLoad(ing|ed) ", ln)]
    assert not loaded, "loading a recording loaded models:\n" + "\n".join(loaded)
    assert_no_traceback(page)


def test_a_loaded_recording_sets_the_form_to_what_it_recorded(page, server, tiny_recording):
    assert RECORDINGS, "the repository ships recordings"
    sampled = next(p for p in RECORDINGS if p.stem == "3-translation-sampled")
    open_app(page, server)
    open_accordion(page, "sv-files", "#sv-recordings input")
    pick(page, "sv-recordings", sampled.name)
    wait_until(page, server, "() => document.querySelector('#sv-gamma input[type=number]')?.value === '4'",
               "γ from the translation recording (4)", UI_S)
    assert page.locator("#sv-prompt textarea").first.input_value().startswith("Translate into French")
    # an uploaded file is shown, its settings fill the form, and the dropdown no longer names another file
    page.set_input_files("#sv-upload input[type=file]", str(tiny_recording))
    wait_until(page, server, "() => document.querySelector('#sv-status .sv-status')?.innerText.startsWith('Loaded tiny-recording.json')",
               "the uploaded recording to load", UI_S)
    wait_until(page, server, "() => !(document.querySelector('#sv-recordings input')?.value || '').includes('translation')",
               "the recordings dropdown to drop the old name", UI_S)
    assert "Loaded tiny-recording.json" in status(page)[1]  # the upload stays on screen
    assert_no_traceback(page)


def test_a_deep_link_opens_step_mode_at_its_round_and_hostile_links_do_no_harm(page, server, shots):
    assert RECORDINGS, "the repository ships recordings"
    name = RECORDINGS[1].stem
    open_app(page, server, f"?recording={name}&round=3")
    wait_until(page, server, "() => document.querySelector('#sv-narration')?.innerText.startsWith('Round 3')",
               "step mode at round 3 of the linked recording", UI_S)
    assert name in status(page)[1] and status(page)[0] == "ok"
    assert page.locator("#sv-step input[type=number]").first.input_value() == "3"
    # "Copy link" writes a URL that opens the same recording at the same round
    page.click("#sv-copy-link")
    wait_until(page, server, "() => (document.querySelector('#sv-link textarea, #sv-link input')?.value || '')"
               f".includes('recording={name}&round=3')", "the link to this round", UI_S)
    link = page.locator("#sv-link textarea, #sv-link input").first.input_value()
    assert link.startswith(server.url.rstrip("/"))
    page.screenshot(path=str(shots / "deep-link.png"), full_page=False)
    # an example by its place in the list, and hostile values: ignored with a note, the page works
    open_app(page, server, "?example=3&step=2")  # example 3 is recording 3: one numbering
    wait_until(page, server, "() => document.querySelector('#sv-narration')?.innerText.startsWith('Round 2')",
               "step mode at round 2 of the third example's recording", UI_S)
    # the form follows the example (its own output: it may land after the step's views, which skip the queue)
    wait_until(page, server, "() => (document.querySelector('#sv-prompt textarea')?.value || '')"
               ".startsWith('Translate into French')", "the third example's prompt in the form", UI_S)
    open_app(page, server, "?recording=../../etc/passwd&round=%3Cscript%3Ealert(1)%3C/script%3E&example=%00x&x=1")
    wait_until(page, server, "() => document.querySelector('#sv-status .sv-status')?.innerText.includes('link ignored')",
               "a note on the ignored link", UI_S)
    text = status(page)[1]
    assert "no recording named" in text and "not a round number" in text and "<script>" not in text
    assert page.locator("#sv-rounds .sv-round").count() >= 2  # the first recording shows as usual
    assert_no_traceback(page)



@pytest.mark.parametrize("recording", [r.stem for r in RECORDINGS])
def test_a_deep_link_to_each_shipped_recording_shows_the_three_rules_and_the_picture(page, server, shots, recording):
    """What a teacher opens first: every shipped recording, linked at a round, shows "Same draft, three
    rules" with its numbers and the acceptance picture (a recording older than trace v3 shows neither)."""
    open_app(page, server, f"?recording={recording}&round=2")
    wait_until(page, server, "() => document.querySelector('#sv-narration')?.innerText.startsWith('Round 2')",
               f"step mode at round 2 of {recording}", UI_S)
    wait_until(page, server, "() => !!document.querySelector('#sv-step-round .sv-rules')",
               "the three-rules table", UI_S)
    rules = page.locator("#sv-step-round .sv-rules").first.inner_text()
    assert "three rules" in rules and "predates" not in rules, rules
    wait_until(page, server, "() => !!document.querySelector('#sv-picture .js-plotly-plot .main-svg')",
               "the acceptance picture", UI_S)
    picture = page.locator("#sv-picture").first.inner_text()
    assert "predates" not in picture, picture
    assert page.locator("#sv-picture .js-plotly-plot .bars path, #sv-picture .js-plotly-plot .trace").count() > 0
    page.screenshot(path=str(shots / f"deep-link-{recording}.png"), full_page=False)
    assert_no_traceback(page)


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_every_tab_renders(page, server, shots, theme):
    """Each tab opens without errors, in light and dark mode; screenshots for a person to look at."""
    open_app(page, server, "?__theme=dark" if theme == "dark" else "")
    if theme == "dark":
        assert page.evaluate("document.body.classList.contains('dark')"), "?__theme=dark did not turn on dark mode"
    for tab, ready in [("Live", "#sv-rounds"), ("Theory", "#sv-t-speed .js-plotly-plot"),
                       ("Sweeps", "#sv-sweep-status"), ("How it works", "text=How speculative decoding works")]:
        page.get_by_role("tab", name=tab).click()
        page.wait_for_selector(ready, state="visible")
        settle_plots(page)
        slug = tab.lower().replace(" ", "-")
        page.screenshot(path=str(shots / f"tab-{slug}-{theme}.png"), full_page=True)
        assert_no_traceback(page)
    assert not page.svx_errors, f"JS errors: {page.svx_errors}"


# ---- drafters, policies and live drafting ------------------------------------------------------------


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory):
    """The app with a draft model slowed to 0.4 s per drafted token (tests/slow_drafter_app.py)."""
    with launch_app(tmp_path_factory.mktemp("slow-app"), env={"SPECVIZ_SHOW_TINY": "1"},
                    script=ROOT / "tests" / "slow_drafter_app.py") as srv:
        yield srv


PENDING_JS = """() => {
    const r = document.querySelector('#sv-rounds .sv-round--pending');
    if (!r) return null;
    return {round: r.dataset.round, pending: r.querySelectorAll('.sv-chip.sv-pending').length,
            slots: r.querySelectorAll('.sv-chip.sv-slot').length};
}"""


def test_drafts_appear_one_by_one_while_the_next_is_drafted(browser, slow_server, shots):
    """With slow drafting, the page shows a round with some drafts (dashed, pending) and the rest still to come."""
    ctx = browser.new_context(viewport=VIEWPORT)
    page = ctx.new_page()
    page.set_default_timeout(UI_S * 1000)
    page.svx_errors = []  # for wait_until's failure messages
    page.on("pageerror", lambda exc: page.svx_errors.append(str(exc)))
    try:
        open_app(page, slow_server)
        pick(page, "sv-preset", TINY_PRESET)
        set_number(page, "sv-gamma", 4)
        open_accordion(page, "sv-sampling", "#sv-max-new input[type=number]")
        set_number(page, "sv-max-new", 12)
        page.click("#sv-run")
        seen = []  # snapshots of the pending round: (round, pending drafts, empty slots)
        partial = None
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            snap = page.evaluate(PENDING_JS)
            if snap:
                seen.append((snap["round"], snap["pending"], snap["slots"]))
                if 0 < snap["pending"] < 4 and snap["slots"] == 4 - snap["pending"] and partial is None:
                    partial = snap
                    page.locator("#sv-legend").scroll_into_view_if_needed()
                    page.screenshot(path=str(shots / "live-drafting-pending.png"))
            if page.evaluate("() => document.querySelector('#sv-status .sv-status')?.innerText.startsWith('Done:')"):
                break
            page.wait_for_timeout(100)
        assert partial, f"no snapshot showed a round part-drafted; pending rounds seen: {seen[:40]}"
        # The same round was seen growing one draft at a time.
        growth = sorted({p for r, p, _ in seen if r == partial["round"]})
        assert len(growth) >= 2 and growth == sorted(growth), growth
        wait_until(page, slow_server,
                   "() => document.querySelector('#sv-status .sv-status')?.innerText.startsWith('Done:')",
                   "the slow run to finish", 300)
        assert page.locator("#sv-rounds .sv-round--pending").count() == 0
        stops = page.locator("#sv-rounds .sv-draft-stop").all_inner_texts()
        assert stops and all(re.fullmatch(r"\d drafted · (γ reached|token budget|end of text)", s) for s in stops), stops
        assert_no_traceback(page)
    finally:
        ctx.close()


def test_prompt_lookup_with_a_dynamic_policy(page, server, shots):
    """Choosing the prompt-lookup drafter and the confidence policy: τ shows, γ goes up to 32, the run
    names the drafter and policy in the legend and the narration, and the draft-length chart draws."""
    open_app(page, server)
    pick(page, "sv-preset", TINY_PRESET)
    pick(page, "sv-drafter", DRAFTERS["prompt-lookup"][0])
    assert not page.locator("#sv-tau").is_visible()
    page.locator("#sv-policy label", has_text="confidence").click()
    page.wait_for_selector("#sv-tau", state="visible")
    wait_until(page, server, "() => document.querySelector('#sv-gamma')?.innerText.includes('Maximum draft length')",
               "the γ slider to become a maximum", UI_S)
    assert page.locator("#sv-gamma input[type=range]").get_attribute("max") == "32"
    set_number(page, "sv-gamma", 20)
    page.fill("#sv-prompt textarea", "one two three four one two three four one two three four")
    open_accordion(page, "sv-sampling", "#sv-max-new input[type=number]")
    set_number(page, "sv-max-new", 24)
    page.click("#sv-run")
    wait_until(page, server, "() => document.querySelector('#sv-status .sv-status')?.innerText.startsWith('Done:')",
               "the prompt-lookup run to finish", 180)
    legend = page.inner_text("#sv-legend")
    assert "prompt lookup" in legend and "confidence policy, γ ≤ 20" in legend, legend
    page.locator("#sv-stepper").scroll_into_view_if_needed()
    wait_until(page, server, "() => /^Round 1\\b/.test(document.querySelector('#sv-narration')?.innerText.trim())",
               "the narration of round 1", UI_S)
    assert "prompt lookup" in narration(page), narration(page)
    assert page.locator("#sv-rounds .sv-draft-stop").count() > 0
    page.locator("#sv-legend").scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "prompt-lookup-done.png"))
    chart = page.locator("#sv-draft-lengths")
    chart.scroll_into_view_if_needed()
    page.wait_for_selector("#sv-draft-lengths .js-plotly-plot")
    assert "Draft length per round" in chart.text_content()
    chart.screenshot(path=str(shots / "draft-length-chart.png"))
    assert_no_traceback(page)
    assert not page.svx_errors, f"JS errors: {page.svx_errors}"


def test_tree_drafter_draws_a_tree(page, server, shots):
    """Choosing the token-tree drafter: its controls show, ε and UNO lock (chain only), γ becomes the depth;
    a run draws trees as they are drafted, then the last round's verdict, and the mask heat map opens."""
    open_app(page, server)
    pick(page, "sv-preset", TINY_PRESET)
    assert not page.locator("#sv-tree-controls").is_visible()
    pick(page, "sv-drafter", DRAFTERS["tree"][0])
    page.wait_for_selector("#sv-branches", state="visible")
    wait_until(page, server, "() => document.querySelector('#sv-gamma')?.innerText.includes('Tree depth')",
               "the γ slider to become the tree depth", UI_S)
    wait_until(page, server, "() => document.querySelector('#sv-epsilon input[type=range]')?.disabled",
               "ε to lock for the tree drafter", UI_S)
    assert "chain drafters only" in page.inner_text("#sv-epsilon")
    page.locator("#sv-tree-mode label", has_text="i.i.d.").click()
    set_number(page, "sv-branches", 3)
    open_accordion(page, "sv-sampling", "#sv-max-new input[type=number]")
    set_number(page, "sv-temperature", 1)
    # 16 tokens: several rounds (a depth-γ tree emits at most γ + 1 a round), and a few seconds of the walks
    # the page plays after decoding (up to 1.5 s a round) where 64 tokens played their 30-s cap
    set_number(page, "sv-max-new", 16)
    page.click("#sv-run")
    # While decoding, a tree whose nodes still wait for the target (pending chips) is drawn.
    page.wait_for_function("() => !!document.querySelector('#sv-tree .sv-tree [data-status=\"pending\"]')",
                           polling=30, timeout=120_000)
    page.locator("#sv-tree").screenshot(path=str(shots / "tree-drafting.png"))
    wait_until(page, server, "() => document.querySelector('#sv-status .sv-status')?.innerText.startsWith('Done:')",
               "the tree run to finish", 180)
    tree = page.locator("#sv-tree .sv-tree").first
    assert tree.locator('[data-status="accepted"], [data-status="rejected"]').count() > 0
    page.locator("#sv-tree").screenshot(path=str(shots / "tree-verdict.png"))
    open_accordion(page, "sv-tree-mask-box", ".js-plotly-plot")
    assert "Tree attention mask" in page.locator("#sv-tree-mask").text_content()
    page.locator("#sv-stepper").scroll_into_view_if_needed()
    wait_until(page, server, "() => !!document.querySelector('#sv-narration .sv-tree-narration li')",
               "the tree round's step narration", UI_S)
    assert page.locator("#sv-step-round .sv-tree").count() == 1
    # Round 1 is not the last, so its walk ends with a correction or a bonus token.
    assert page.locator("#sv-step-round .sv-tree .sv-extra").count() == 1
    page.screenshot(path=str(shots / "tree-done.png"), full_page=True)
    assert_no_traceback(page)
    assert not page.svx_errors, f"JS errors: {page.svx_errors}"


WALK_JS = """() => {
    const trees = document.querySelectorAll('#sv-tree .sv-tree');
    const t = trees[trees.length - 1];
    if (!t) return null;
    const n = s => t.querySelectorAll(`[data-node] > [data-status="${s}"]`).length;
    const walk = document.querySelector('#sv-tree .sv-tree-walk');
    return {round: t.querySelector('.sv-rounds-head span')?.innerText.split(' ·')[0], step: Number(t.dataset.step),
            steps: Number(t.dataset.steps), pending: n('pending'), accepted: n('accepted'), rejected: n('rejected'),
            discarded: n('discarded'), walk: walk ? walk.innerText : null};
}"""

# Every state the tree panel takes, recorded by the page itself as it changes (a MutationObserver),
# so a walk step up for 0.3 s is seen even when the test's own polling or a screenshot is slow
# (a loaded CI machine missed them when the test polled).
RECORD_WALK_JS = """(snapJs) => {
    const snap = eval(snapJs);
    window.svxTreeStates = [];
    let last = '';
    const record = () => {
        const s = snap();
        const key = JSON.stringify(s);
        if (s && key !== last) { window.svxTreeStates.push(s); last = key; }
    };
    new MutationObserver(record).observe(document.querySelector('#sv-tree'),
        {subtree: true, childList: true, attributes: true, characterData: true});
}"""


def test_tree_walk_plays_step_by_step_mid_run(browser, slow_server, shots):
    """A live tree run (tiny pair, slowed drafting): a tree grows with its nodes pending, then the target's
    walk plays on the page: a state with some nodes verdicted and others still pending, narrated, before
    the round's final verdict; then the run goes on to its end."""
    ctx = browser.new_context(viewport=VIEWPORT)
    page = ctx.new_page()
    page.set_default_timeout(UI_S * 1000)
    page.svx_errors = []
    page.on("pageerror", lambda exc: page.svx_errors.append(str(exc)))
    try:
        open_app(page, slow_server)
        pick(page, "sv-preset", TINY_PRESET)
        pick(page, "sv-drafter", DRAFTERS["tree"][0])
        page.wait_for_selector("#sv-branches", state="visible")
        page.locator("#sv-tree-mode label", has_text="distinct").click()
        set_number(page, "sv-branches", 3)
        set_number(page, "sv-gamma", 3)
        open_accordion(page, "sv-sampling", "#sv-max-new input[type=number]")
        set_number(page, "sv-temperature", 1)
        set_number(page, "sv-max-new", 16)
        page.evaluate(RECORD_WALK_JS, WALK_JS)
        page.click("#sv-run")
        shot_drafting = shot_mid = False
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # screenshots of the two states, when the polling catches them
            snap = page.evaluate(WALK_JS)
            if snap and snap["walk"] is None and snap["pending"] and not shot_drafting:
                page.locator("#sv-tree").screenshot(path=str(shots / "tree-walk-0-drafting.png"))
                shot_drafting = True
            if snap and snap["walk"] is not None and snap["pending"] and not shot_mid:
                page.locator("#sv-tree").screenshot(path=str(shots / "tree-walk-1-mid.png"))
                shot_mid = True
            if page.evaluate("() => document.querySelector('#sv-status .sv-status')?.innerText.startsWith('Done:')"):
                break
            page.wait_for_timeout(40)
        wait_until(page, slow_server,
                   "() => document.querySelector('#sv-status .sv-status')?.innerText.startsWith('Done:')",
                   "the tree run to finish", 300)
        states = page.evaluate("() => window.svxTreeStates")
        drafting = [s for s in states if s["walk"] is None and s["pending"]]
        assert drafting, "no tree was seen being drafted (pending nodes, no walk yet)"
        walks = [s for s in states if s["walk"] is not None]
        mid = next((s for s in walks if s["pending"] and (s["accepted"] or s["rejected"])), None)
        assert mid, f"no walk state showed some nodes verdicted and others pending; walk states seen: {walks[:40]}"
        assert re.search(r"child \d+ of \d+ \(.*\) (accepted|rejected)", mid["walk"]), mid["walk"]
        assert mid["step"] < mid["steps"], mid
        # Within a round the walk only moves forward, one step at a time or more, and some round
        # showed more than one step of its walk.
        by_round = {}
        for s in walks:
            by_round.setdefault(s["round"], []).append(s["step"])
        assert all(steps == sorted(steps) for steps in by_round.values()), by_round
        assert any(len(set(steps)) >= 2 for steps in by_round.values()), by_round
        done = page.evaluate(WALK_JS)
        assert done["walk"] is None and done["pending"] == 0 and done["step"] == done["steps"], done
        assert "distinct draws" in page.inner_text("#sv-tree")
        page.locator("#sv-tree").screenshot(path=str(shots / "tree-walk-2-verdict.png"))
        assert_no_traceback(page)
        assert not page.svx_errors, f"JS errors: {page.svx_errors}"
    finally:
        ctx.close()
