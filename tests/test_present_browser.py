"""Presenter mode and the page's layout in a headless browser (issue 22, parts 3 and 5): what the first
view shows, presenter mode's sizes, drawer and keys (light and dark), a 400-px screen, a tree run's
parts and tooltips.  Fixtures and helpers are test_browser's (the same server setup)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_browser import (RECORDINGS, UI_S, assert_no_traceback, narration, open_accordion,  # noqa: F401
                                open_app, status, wait_until)

# Text of a Plotly figure that runs past the figure's edge (the clipped titles and axis titles of part 5).
CLIPPED_PLOT_TEXT = """(root) => {
  const out = [];
  (root || document).querySelectorAll('.js-plotly-plot').forEach((plot) => {
    const svg = plot.querySelector('svg.main-svg');
    if (!svg || plot.offsetWidth === 0) return;
    const box = svg.getBoundingClientRect();
    plot.querySelectorAll('.infolayer text, .legendtext').forEach((t) => {
      const r = t.getBoundingClientRect();
      if (!r.width || !t.textContent.trim()) return;
      if (r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1 || r.bottom > box.bottom + 1)
        out.push(t.textContent.slice(0, 60));
    });
  });
  return out;
}"""
FONT_PX = "(sel) => { const e = document.querySelector(sel); return e ? parseFloat(getComputedStyle(e).fontSize) : 0; }"
IN_VIEW = """(sel) => { const e = document.querySelector(sel); if (!e) return false; const r = e.getBoundingClientRect();
  return r.width > 0 && r.top >= 0 && r.left >= 0 && r.bottom <= innerHeight && r.right <= innerWidth; }"""
VISIBLE = "(sel) => { const e = document.querySelector(sel); return !!e && e.getBoundingClientRect().width > 0; }"
# Every figure on the Live tab drawn at its box's width (after a layout change the page's script resizes them).
PLOTS_SETTLED = """() => [...document.querySelectorAll('#sv-stepper ~ * .js-plotly-plot, .row.sv-plots .js-plotly-plot')]
  .filter(p => p.offsetWidth > 0)
  .every(p => p._fullLayout && Math.abs(p._fullLayout.width - p.parentElement.clientWidth) <= 4)"""


def new_page(browser, shots, request, width: int, height: int):  # noqa: F811
    ctx = browser.new_context(viewport={"width": width, "height": height})
    pg = ctx.new_page()
    pg.set_default_timeout(UI_S * 1000)
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.svx_errors = errors
    return ctx, pg


@pytest.fixture
def viewport_page(browser, server, shots, request):  # noqa: F811
    """A factory of pages at a given viewport; a screenshot of each when the test ends."""
    made = []

    def make(width: int, height: int):
        ctx, pg = new_page(browser, shots, request, width, height)
        made.append((ctx, pg, f"{width}x{height}"))
        return pg
    yield make
    for ctx, pg, size in made:
        try:
            pg.screenshot(path=str(shots / f"{request.node.name}-{size}-end.png"), full_page=True)
        except Exception:
            pass
        ctx.close()


def round_of_narration(page) -> int:
    return int(narration(page).split(":")[0].split()[1])


def no_error_badges(page) -> None:
    badges = page.get_by_text("Error", exact=True)
    shown = [i for i in range(badges.count()) if badges.nth(i).is_visible()]
    assert not shown, f"{len(shown)} outputs show Gradio's 'Error' badge"


@pytest.fixture(scope="module")
def tree_recording(tmp_path_factory) -> Path:
    """A tree run of the tiny random pair (no server, no download), long enough to scroll."""
    from specviz.core import engine
    from tests import drafted
    from specviz.core.settings import DecodeSettings
    from specviz.models import encode_prompt
    from specviz.models.tiny import build_tiny_pair
    from specviz.trace import recording_to_json

    pair = build_tiny_pair()
    ids = encode_prompt(pair, "hello there")
    s = DecodeSettings.checked(gamma=4, max_new_tokens=32, temperature=1.0, seed=2, drafter="tree", branches=3,
                               tree_nodes=12, tree_mode="iid")
    spec = drafted.speculative_decode(pair, ids, s, prompt="hello there")
    std = engine.standard_decode(pair, ids, s, prompt="hello there")
    assert sum(r.tree is not None for r in spec.rounds) >= 4
    path = tmp_path_factory.mktemp("traces") / "tree-recording.json"
    path.write_text(recording_to_json(spec, std), encoding="utf-8")
    return path


# ---- the first view ----------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [(1280, 720), (1400, 1000)])
def test_the_first_view_says_what_to_press_and_shows_the_headline(viewport_page, server, shots, size):
    page = viewport_page(*size)
    open_app(page, server)
    page.wait_for_selector("#sv-race .sv-speedup[data-speedup]")
    assert page.evaluate(IN_VIEW, "#sv-run"), "Run is not in the first view"
    assert page.evaluate(IN_VIEW, "#sv-race .sv-speedup-v"), "the race's headline (the speedup) is not in the first view"
    assert "Press Run" in page.inner_text("#sv-hint")
    assert page.locator("#sv-legend .sv-legend").bounding_box()["height"] < 130, "the legend is not compact"
    page.click("#sv-legend summary")  # its meanings open on request, with the race text's second cue
    page.wait_for_selector("#sv-legend .sv-legend-items", state="visible")
    assert "wavy underline" in page.inner_text("#sv-legend")
    # rounds read oldest first, and the panel shows the newest
    rows = page.eval_on_selector_all("#sv-rounds .sv-round", "rs => rs.map(r => Number(r.dataset.round))")
    assert rows == sorted(rows) and len(rows) >= 2
    assert page.evaluate("""() => { const b = document.querySelector('#sv-rounds .sv-rounds-body').getBoundingClientRect();
        const rs = document.querySelectorAll('#sv-rounds .sv-round'); const last = rs[rs.length - 1].getBoundingClientRect();
        return last.bottom <= b.bottom + 1 && last.top >= b.top - 1; }"""), "the newest round is scrolled out of view"
    # a chain run: no empty tree plots, no tree mask
    assert not page.evaluate(VISIBLE, "#sv-tree-mask-box") and not page.evaluate(VISIBLE, "#sv-tree-plots")
    # the race's text marks a token's origin by its underline too, not by colour alone
    styles = page.evaluate("""() => Object.fromEntries(['accepted', 'correction', 'bonus'].map(o => {
        const e = document.querySelector(`#sv-race .sv-race-spec .sv-tk.sv-${o}`);
        return [o, e ? getComputedStyle(e).textDecorationLine + ' ' + getComputedStyle(e).textDecorationStyle : null]; }))""")
    # (the first recording, greedy Fibonacci on the int8 target, accepted every draft: it may have no correction)
    assert styles["correction"] in (None, "underline wavy") and styles["bonus"] == "underline double", styles
    assert styles["accepted"].startswith("none"), styles
    # every chart's text fits its chart
    page.locator("#sv-draft-lengths").scroll_into_view_if_needed()
    page.wait_for_selector("#sv-draft-lengths .js-plotly-plot")
    page.wait_for_timeout(1000)
    assert page.evaluate(CLIPPED_PLOT_TEXT) == []
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(shots / f"first-view-{size[0]}x{size[1]}.png"))
    no_error_badges(page)
    assert_no_traceback(page)
    assert not page.svx_errors, f"JS errors: {page.svx_errors}"


# ---- presenter mode ----------------------------------------------------------------------------------


PRESENTED = "2-chat-greedy"  # the recording presenter mode is checked on


@pytest.fixture(scope="module")
def normal_sizes(browser, server, shots):
    """The font sizes of the page without presenter mode (same recording, round and viewport), measured once
    for both themes' presenter tests: the normal page is the same page for both."""
    assert any(p.stem == PRESENTED for p in RECORDINGS)
    ctx, normal = new_page(browser, shots, None, 1280, 720)
    try:
        open_app(normal, server, f"?recording={PRESENTED}&round=3")
        return {sel: normal.evaluate(FONT_PX, sel) for sel in
                ("#sv-rounds .sv-chip", "#sv-rounds .sv-round-time", "#sv-narration .sv-narration", "#sv-race .sv-race-text")}
    finally:
        ctx.close()


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_presenter_mode_enlarges_hides_the_settings_and_takes_keys(viewport_page, server, shots, theme, normal_sizes):
    page = viewport_page(1280, 720)
    name = PRESENTED
    before = normal_sizes
    open_app(page, server, f"?recording={name}&round=3&present=1" + ("&__theme=dark" if theme == "dark" else ""))
    page.wait_for_function("() => document.body.classList.contains('sv-present')")
    assert page.evaluate("document.body.classList.contains('dark')") == (theme == "dark")
    assert page.locator("#sv-present-toggle input").is_checked()
    assert not page.evaluate(VISIBLE, "#sv-controls"), "the settings column is still shown"
    sizes = {sel: page.evaluate(FONT_PX, sel) for sel in before}
    for sel, px in sizes.items():
        assert px >= 1.4 * before[sel] and px >= 17, f"{sel}: {before[sel]} px -> {px} px"
    assert page.evaluate(FONT_PX, "#sv-race .sv-stat-k") >= 15
    # the plots: two to a row, their text scaled, and still inside each figure
    page.locator("#sv-draft-lengths").scroll_into_view_if_needed()
    page.wait_for_function("""() => { const p = document.querySelector('#sv-draft-lengths .js-plotly-plot');
        return p && p._fullLayout && p._fullLayout.title.font.size >= 20; }""")
    page.wait_for_function(PLOTS_SETTLED)
    widths = page.eval_on_selector_all(".row.sv-plots .js-plotly-plot",
                                       "ps => ps.filter(p => p.offsetWidth).map(p => p.offsetWidth / p.closest('.row').clientWidth)")
    assert widths and min(widths) > 0.45, widths
    page.wait_for_timeout(1000)
    assert page.evaluate(CLIPPED_PLOT_TEXT) == []
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(shots / f"presenter-{theme}.png"))
    if theme == "dark":  # the drawer and the keys below do not depend on the theme: checked once, in light
        no_error_badges(page)
        assert not page.svx_errors, f"JS errors: {page.svx_errors}"
        return
    # the settings open in a drawer and close with Escape
    page.click("#sv-drawer-btn")
    page.wait_for_function("(sel) => document.querySelector(sel).getBoundingClientRect().width > 0", arg="#sv-controls")
    assert page.evaluate(IN_VIEW, "#sv-run")
    columns = page.eval_on_selector("#sv-controls", "c => new Set([...c.children].filter(e => e.offsetWidth)"
                                    ".map(e => Math.round(e.getBoundingClientRect().left))).size")
    assert columns == 1, "the drawer's controls spill into more than one column"
    page.screenshot(path=str(shots / f"presenter-{theme}-drawer.png"))
    # keys typed in the prompt are the prompt's
    page.click("#sv-prompt textarea")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("End")
    page.wait_for_timeout(1500)
    assert round_of_narration(page) == 3
    page.keyboard.press("Escape")
    page.wait_for_function("() => !document.body.classList.contains('sv-drawer-open')")
    page.locator("#sv-legend").click()  # focus back on the page
    n = int(page.locator("#sv-step input[type=number]").first.get_attribute("max"))
    for key, expected in [("ArrowRight", 4), ("End", n), ("ArrowLeft", n - 1), ("Home", 1), ("ArrowLeft", 1)]:
        page.keyboard.press(key)
        wait_until(page, server, f"() => /^Round {expected}\\b/.test(document.querySelector('#sv-narration')?.innerText.trim())",
                   f"{key} to show round {expected}", UI_S)
    page.keyboard.press(" ")  # play: the rounds advance on their own, then pause
    wait_until(page, server, "() => /^Round [3-9]\\b/.test(document.querySelector('#sv-narration')?.innerText.trim())",
               "play to advance two rounds", UI_S)
    page.keyboard.press(" ")
    assert not page.evaluate("document.body.classList.contains('sv-playing')")
    page.screenshot(path=str(shots / f"presenter-{theme}-stepped.png"))
    # off again: sizes and the settings come back, and keys are the page's own
    page.locator("#sv-present-toggle input").click()
    page.wait_for_function("() => !document.body.classList.contains('sv-present')")
    assert page.evaluate(FONT_PX, "#sv-rounds .sv-chip") == before["#sv-rounds .sv-chip"]
    assert page.evaluate(VISIBLE, "#sv-controls")
    at = round_of_narration(page)
    page.locator("#sv-legend").click()
    page.keyboard.press("ArrowRight")
    page.wait_for_timeout(1500)
    assert round_of_narration(page) == at
    page.wait_for_function("""() => { const p = document.querySelector('#sv-draft-lengths .js-plotly-plot');
        return p && p._fullLayout && p._fullLayout.title.font.size < 20; }""")
    no_error_badges(page)
    assert_no_traceback(page)
    assert not page.svx_errors, f"JS errors: {page.svx_errors}"


# ---- a phone ---------------------------------------------------------------------------------------------


def test_a_400_px_screen_reflows_instead_of_clipping(viewport_page, server, shots):
    page = viewport_page(400, 800)
    open_app(page, server, "?recording=2-chat-greedy&round=3")
    page.wait_for_selector("#sv-race .sv-speedup[data-speedup]")
    assert page.evaluate("document.documentElement.scrollWidth") <= 400, "the page scrolls sideways"
    # the metrics table fits its column
    table = page.locator("#sv-metrics table").bounding_box()
    column = page.locator("#sv-metrics").bounding_box()
    assert table["width"] <= column["width"] + 1, (table, column)
    # nothing inside a round, the race's numbers or the metrics is cut off
    clipped = page.evaluate("""() => [...document.querySelectorAll(
        '#sv-rounds .sv-gain, #sv-rounds .sv-draft-stop, #sv-rounds .sv-round-num, #sv-race .sv-stat-k, #sv-race .sv-stat-v, #sv-metrics th, #sv-metrics td')]
        .filter(e => e.scrollWidth > e.clientWidth + 1 || e.getBoundingClientRect().right > innerWidth)
        .map(e => e.className + ': ' + e.textContent.slice(0, 30))""")
    assert clipped == [], clipped
    # a round's chips share lines (not one chip a line)
    per_line = page.evaluate("""() => { const r = [...document.querySelectorAll('#sv-rounds .sv-round')]
            .sort((a, b) => b.querySelectorAll('.sv-chip').length - a.querySelectorAll('.sv-chip').length)[0];
        const chips = [...r.querySelectorAll('.sv-chips .sv-chip')];
        return chips.length / new Set(chips.map(c => Math.round(c.getBoundingClientRect().top))).size; }""")
    assert per_line >= 1.5, f"{per_line:.1f} chips a line"
    # every tab's name is in view (none behind a "more" menu)
    tabs = page.get_by_role("tab")
    assert tabs.count() >= 5 and all(tabs.nth(i).is_visible() for i in range(tabs.count()))
    # the charts: one to a row, their text inside them
    page.locator("#sv-draft-lengths").scroll_into_view_if_needed()
    page.wait_for_function(PLOTS_SETTLED)
    page.wait_for_timeout(1000)
    assert page.evaluate(CLIPPED_PLOT_TEXT) == []
    page.screenshot(path=str(shots / "narrow-400.png"), full_page=True)
    assert_no_traceback(page)
    assert not page.svx_errors, f"JS errors: {page.svx_errors}"


# ---- a tree run ------------------------------------------------------------------------------------------


def test_tree_parts_show_for_a_tree_run_and_its_tooltips_stay_visible(viewport_page, server, shots, tree_recording):
    page = viewport_page(1400, 1000)
    open_app(page, server)
    open_accordion(page, "sv-files", "#sv-upload input[type=file]")
    page.set_input_files("#sv-upload input[type=file]", str(tree_recording))
    wait_until(page, server, "() => document.querySelector('#sv-status .sv-status')?.innerText.startsWith('Loaded')",
               "the tree recording to load", UI_S)
    page.wait_for_function(VISIBLE, arg="#sv-tree-plots")
    assert page.evaluate(VISIBLE, "#sv-tree-mask-box")
    assert page.locator("#sv-tree-plots .js-plotly-plot").count() == 2
    page.wait_for_timeout(1500)  # the dropdown clears after an upload: no output may show an error for it
    no_error_badges(page)
    # the expected line of the tokens-per-round chart stays on the chart
    page.locator("#sv-draft-lengths").scroll_into_view_if_needed()
    page.wait_for_timeout(1000)
    assert page.evaluate(CLIPPED_PLOT_TEXT) == []
    # a tooltip of the tree's bottom node shows whole, over the panel's edge
    chip = page.locator("#sv-tree .sv-trees > .sv-tree").last.locator(".sv-chip").last
    chip.scroll_into_view_if_needed()
    page.evaluate("() => window.scrollBy(0, document.querySelector('#sv-tree').getBoundingClientRect().bottom - innerHeight + 20)")
    chip.hover()
    tip = chip.locator(".sv-tip")
    page.wait_for_function("(t) => getComputedStyle(t).visibility === 'visible'", arg=tip.element_handle())
    # hit-testing sees what clipping leaves of the tip (its pointer-events are off in the page: on for the test)
    whole = tip.evaluate("""(t) => { t.style.pointerEvents = 'auto'; const r = t.getBoundingClientRect();
        const pts = [[r.left + 4, r.top + 4], [r.right - 4, r.top + 4], [r.left + 4, r.bottom - 4], [r.right - 4, r.bottom - 4]];
        return r.top >= 0 && r.bottom <= innerHeight && pts.every(([x, y]) => t.contains(document.elementFromPoint(x, y))); }""")
    assert whole, "the tooltip is cut off or covered"
    page.screenshot(path=str(shots / "tree-tooltip.png"))
    # a chain recording hides the tree parts again
    page.locator("#sv-recordings input").first.click()
    page.get_by_role("option", name=RECORDINGS[0].name, exact=True).click()
    wait_until(page, server, "() => document.querySelector('#sv-status .sv-status')?.innerText.startsWith('Recorded example')",
               "the chain recording to load", UI_S)
    page.wait_for_function(f"() => !({VISIBLE})('#sv-tree-plots') && !({VISIBLE})('#sv-tree-mask-box')")
    assert_no_traceback(page)
    assert not page.svx_errors, f"JS errors: {page.svx_errors}"


# ---- play / pause (issue 65) -------------------------------------------------------------------------------------

# Samples, every 20 ms, whether a step faded the narration ("pending") or showed Gradio's progress text over it.
WATCH_OVERLAY = """() => { window.__svOverlay = []; const blk = document.querySelector('#sv-narration');
  setInterval(() => {
    const faded = blk.querySelector('.pending');
    const shown = [...blk.querySelectorAll('[data-testid=status-tracker]')].filter((w) => parseFloat(getComputedStyle(w).opacity) > 0.05
      && getComputedStyle(w).display !== 'none' && getComputedStyle(w).visibility !== 'hidden' && w.textContent.trim());
    if (faded || shown.length) window.__svOverlay.push((faded ? 'faded ' : '') + shown.map((w) => w.textContent.trim()).join(' '));
  }, 20); }"""
SHOWN_ROUND = "() => Number((/^Round (\\d+)/.exec(document.querySelector('#sv-narration .sv-narration')?.textContent.trim() || '') || [0, 0])[1])"
BOX = "() => Number(document.querySelector('#sv-step input[type=number]').value)"
PLAY_LABEL = "() => document.querySelector('#sv-play').textContent.trim()"


def test_play_reads_pause_a_pause_stops_on_the_round_shown_and_steps_do_not_flicker(viewport_page, server, shots):
    """Space plays (the button reads "⏸ Pause"), space pauses ("▶ Play") on the round the page shows, even when a
    tick had already asked for the next one (it let one more round through); no step fades the narration under
    a "processing" overlay."""
    page = viewport_page(1280, 720)
    open_app(page, server, f"?recording={PRESENTED}&round=1&present=1")
    page.wait_for_function("() => document.body.classList.contains('sv-present')")
    wait_until(page, server, f"() => ({SHOWN_ROUND})() === 1", "round 1", UI_S)
    assert page.evaluate(PLAY_LABEL) == "▶ Play"
    page.evaluate(WATCH_OVERLAY)
    page.locator("#sv-legend").click()  # focus on the page, not a field
    page.keyboard.press(" ")
    page.wait_for_function(f"() => ({PLAY_LABEL})() === '⏸ Pause'", timeout=2000)
    assert page.evaluate("document.querySelector('#sv-play').getAttribute('aria-pressed')") == "true"
    # the second space at the moment the second tick's round is asked for (the box moved) but not drawn yet (the
    # narration still shows the round before): pressed from the page, so no round trip lets round 3 arrive first
    shown = page.evaluate(f"""() => new Promise((done) => {{ const t = setInterval(() => {{
        if (({BOX})() === 3 && ({SHOWN_ROUND})() === 2) {{
          clearInterval(t);
          const at = ({SHOWN_ROUND})();
          document.activeElement.dispatchEvent(new KeyboardEvent('keydown', {{key: ' ', bubbles: true}}));
          done(at);
        }} }}, 5); }})""")
    assert shown == 2
    assert page.evaluate(PLAY_LABEL) == "▶ Play"
    assert page.evaluate("document.querySelector('#sv-play').getAttribute('aria-pressed')") == "false"
    page.wait_for_timeout(5000)  # longer than a tick and a step's round trip: round 3 came and was stepped back from
    assert (page.evaluate(SHOWN_ROUND), page.evaluate(BOX)) == (2, 2)
    # steps by key: no fading, no progress text
    page.keyboard.press("ArrowRight")
    wait_until(page, server, f"() => ({SHOWN_ROUND})() === 3", "round 3", UI_S)
    page.keyboard.press("End")
    wait_until(page, server, f"() => ({SHOWN_ROUND})() === ({BOX})() && ({BOX})() > 3", "the last round", UI_S)
    assert page.evaluate("window.__svOverlay") == []
    page.screenshot(path=str(shots / "presenter-paused.png"))
    assert not page.svx_errors, f"JS errors: {page.svx_errors}"
