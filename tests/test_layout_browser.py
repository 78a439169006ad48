"""The page at 400 px and in dark mode, measured in a real browser: nothing runs off its card, a chart's subtitle
and legend stay inside it and clear of its plot and axis titles (issue 56's defects 1 and 3)."""

from __future__ import annotations

import pytest

from tests.test_browser import UI_S, assert_no_traceback, open_app, wait_until  # noqa: F401
from tests.test_present_browser import viewport_page  # noqa: F401

# For every plotly chart inside `root`: the parts that overflow the chart's own box, and a subtitle or legend that
# overlaps the plot area or the x-axis title.
CHART_JS = """(root) => {
  const out = [];
  for (const plot of document.querySelectorAll(root + ' .js-plotly-plot')) {
    const svg = plot.querySelector('.main-svg');
    if (!svg || !plot.offsetParent) continue;
    const box = svg.getBoundingClientRect();
    const name = (plot.querySelector('.gtitle')?.textContent || '?').slice(0, 40);
    const inside = (r) => r.left >= box.left - 1 && r.right <= box.right + 1 && r.top >= box.top - 1 && r.bottom <= box.bottom + 1;
    const parts = [...plot.querySelectorAll('.gtitle, .gtitle-subtitle, .legend .traces, .g-xtitle, .g-ytitle')];
    for (const p of parts) {
      const r = p.getBoundingClientRect();
      if (r.width && !inside(r)) out.push(`${name}: ${p.getAttribute("class")} runs off the chart (${Math.round(r.left)}-${Math.round(r.right)} px in ${Math.round(box.left)}-${Math.round(box.right)})`);
    }
    const area = plot.querySelector('.cartesianlayer .bg, .subplot .bg, .bglayer rect');
    const titles = [...plot.querySelectorAll('.gtitle, .gtitle-subtitle')].map((e) => e.getBoundingClientRect());
    if (area) {
      const a = area.getBoundingClientRect();
      for (const t of titles) if (t.height && t.bottom > a.top + 2) out.push(`${name}: the title's lines run into the plot`);
    }
    const legend = plot.querySelector('.legend');
    const xt = plot.querySelector('.g-xtitle');
    if (legend && xt) {
      const l = legend.getBoundingClientRect(), x = xt.getBoundingClientRect();
      if (x.height && l.height && l.top < x.bottom - 2 && l.bottom > x.top + 2) out.push(`${name}: the legend covers the x-axis title`);
    }
  }
  return out;
}"""


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_at_400_px_tables_and_charts_fit_their_cards(viewport_page, server, shots, theme):  # noqa: F811
    page = viewport_page(400, 860)
    query = "?recording=3-translation-sampled&round=2" + ("&__theme=dark" if theme == "dark" else "")
    open_app(page, server, query)
    wait_until(page, server, "() => !!document.querySelector('#sv-step-round .sv-rules-table')", "the rules table", UI_S)
    wait_until(page, server, "() => !!document.querySelector('#sv-picture .js-plotly-plot .main-svg')", "the picture", UI_S)
    page.wait_for_timeout(800)
    fits = page.evaluate("""() => { const t = document.querySelector('#sv-step-round .sv-rules-table').getBoundingClientRect();
        const card = document.querySelector('#sv-step-round').getBoundingClientRect();
        return {table: t.right, card: card.right, page: document.documentElement.scrollWidth}; }""")
    assert fits["table"] <= fits["card"] + 1 and fits["page"] <= 400, fits
    assert page.evaluate(CHART_JS, "#sv-picture") == []
    if theme == "dark":  # the picture follows the page: no white card
        bg = page.evaluate("() => getComputedStyle(document.querySelector('#sv-picture .main-svg')).backgroundColor")
        assert bg in ("rgba(0, 0, 0, 0)", "transparent"), bg
    page.locator("#sv-picture").screenshot(path=str(shots / f"picture-400-{theme}.png"))
    page.get_by_role("tab", name="Sweeps").click()
    page.wait_for_selector("#sv-shootout-plot .js-plotly-plot .main-svg", timeout=UI_S * 1000)
    page.wait_for_timeout(1500)
    problems = page.evaluate(CHART_JS, "body")
    assert problems == [], problems
    clipped = page.evaluate("""() => [...document.querySelectorAll('table.sv-shootout th, table.sv-shootout td')]
        .filter(e => e.getBoundingClientRect().right > innerWidth + 1).map(e => e.textContent.slice(0, 30))""")
    assert clipped == [], clipped
    page.screenshot(path=str(shots / f"sweeps-400-{theme}.png"), full_page=True)
    assert_no_traceback(page)


def test_at_1400_px_the_pictures_subtitle_is_clear_of_its_plot(viewport_page, server, shots):  # noqa: F811
    page = viewport_page(1400, 900)
    open_app(page, server, "?recording=2-chat-greedy&round=3&__theme=dark")
    wait_until(page, server, "() => !!document.querySelector('#sv-picture .js-plotly-plot .main-svg')", "the picture", UI_S)
    page.wait_for_timeout(800)
    assert page.evaluate(CHART_JS, "#sv-picture") == []
    page.locator("#sv-picture").screenshot(path=str(shots / "picture-1400-dark.png"))


# ---- the charts' layout and legibility (issue 65) --------------------------------------------------------------

# Every chart text's drawn fill and the colour under it (the first ancestor of the chart with a background: a chart
# is transparent), for the contrast check.
CHART_TEXT_JS = """(root) => {
  const out = [];
  const under = (el) => { for (let e = el; e; e = e.parentElement) { const c = getComputedStyle(e).backgroundColor;
    if (c && c !== 'rgba(0, 0, 0, 0)' && c !== 'transparent') return c; } return 'rgb(255, 255, 255)'; };
  for (const plot of document.querySelectorAll(root + ' .js-plotly-plot')) {
    if (!plot.offsetParent) continue;
    const bg = under(plot);
    const name = (plot.querySelector('.gtitle')?.textContent || '?').slice(0, 40);
    const sel = '.gtitle, .gtitle-subtitle, .gtitle-subtitle tspan[style*=fill], .xtick text, .ytick text, .g-xtitle text, .g-ytitle text, .g-y2title text, .legendtext, .annotation-text';
    for (const t of plot.querySelectorAll(sel)) {
      if (!t.textContent.trim() || !t.getBoundingClientRect().width) continue;
      out.push({name, cls: t.getAttribute('class') || t.parentElement.getAttribute('class'), text: t.textContent.slice(0, 30),
                fill: getComputedStyle(t).fill, bg});
    }
  }
  return out;
}"""
# Boxes that must not meet: the picture's token labels and its u-vs-b bar, a compact chart's legend and its x-axis
# title, the optimal γ's label and the mean-draft-length line, the Pareto chart's ε labels (and the chart's edge).
CLEAR_JS = """() => {
  const out = [];
  const box = (e) => e.getBoundingClientRect();
  const meet = (a, b) => a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1;
  const title = (p) => (p.querySelector('.gtitle')?.textContent || '?').slice(0, 40);
  const pic = document.querySelector('#sv-picture .js-plotly-plot');
  if (pic && pic.offsetParent) {
    const labels = [...pic.querySelectorAll('.subplot.xy .xaxislayer-above .xtick text')].map(box);
    const bar = pic.querySelector('.subplot.x2y2 .point path');
    if (!labels.length || !bar) out.push('the picture has no token labels or no u-vs-b bar');
    else { const low = Math.max(...labels.map((r) => r.bottom)), top = box(bar).top;
           if (low > top - 2) out.push(`the picture's token labels reach ${Math.round(low)} px, the u-vs-b bar starts at ${Math.round(top)} px`); }
  }
  for (const p of document.querySelectorAll('.js-plotly-plot')) {
    if (!p.offsetParent) continue;
    const legend = p.querySelector('.legend'), xt = p.querySelector('.g-xtitle');
    if (legend && xt && box(xt).height && box(legend).height && box(legend).top < box(xt).bottom - 1)
      out.push(`${title(p)}: the legend (top ${Math.round(box(legend).top)}) is on the x-axis title (bottom ${Math.round(box(xt).bottom)})`);
    const texts = [...p.querySelectorAll('.scatterlayer .textpoint text')].filter((t) => t.textContent.trim());
    const star = texts.find((t) => t.textContent.startsWith('γ*='));
    if (star) for (const s of p.querySelectorAll('.shapelayer path'))
      if (getComputedStyle(s).stroke === 'rgb(214, 39, 40)' && meet(box(star), box(s))) out.push(`${title(p)}: the line crosses "${star.textContent}"`);
    if (title(p).startsWith('Rejection probability vs bias')) {
      const svg = box(p.querySelector('.main-svg'));
      texts.forEach((t, i) => {
        const r = box(t);
        if (r.left < svg.left || r.right > svg.right || r.top < svg.top || r.bottom > svg.bottom) out.push(`"${t.textContent}" runs off the chart`);
        texts.slice(i + 1).forEach((u) => { if (meet(r, box(u))) out.push(`"${t.textContent}" and "${u.textContent}" overlap`); });
      });
      if (texts.length < 4) out.push(`the Pareto chart has ${texts.length} labels`);
    }
  }
  return out;
}"""


def _low_contrast(rows) -> list[str]:
    from specviz.views.contrast import AA, ratio
    from specviz.views.cvd import parse_color

    return sorted({f"{r['name']}: {r['cls']} {r['text']!r} {r['fill']} on {r['bg']} = "
                   f"{ratio(parse_color(r['fill']), parse_color(r['bg'])):.2f}" for r in rows
                   if ratio(parse_color(r["fill"]), parse_color(r["bg"])) < AA})


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_at_400_px_on_a_touch_screen_chart_text_is_clear_legible_and_uncovered(browser, server, shots, theme):  # noqa: F811
    """Issue 65 at 400 px on a touch screen: a tap shows no toolbar over a title, the picture's upright token
    labels end above the u-vs-b bar, a legend is under its x-axis title, the optimal γ's label is off its line, the
    Pareto labels are apart and inside, and every chart text is 4.5:1 on what it is drawn on (light and dark)."""
    ctx = browser.new_context(viewport={"width": 400, "height": 860}, has_touch=True)
    page = ctx.new_page()
    page.set_default_timeout(UI_S * 1000)
    try:
        dark = "&__theme=dark" if theme == "dark" else ""
        open_app(page, server, "?recording=2-chat-greedy&round=3" + dark)
        wait_until(page, server, "() => !!document.querySelector('#sv-picture .js-plotly-plot .main-svg')", "the picture", UI_S)
        page.locator("#sv-draft-lengths").scroll_into_view_if_needed()
        page.wait_for_selector("#sv-draft-lengths .js-plotly-plot .main-svg")
        page.wait_for_timeout(1500)
        page.locator("#sv-picture").scroll_into_view_if_needed()
        page.tap("#sv-picture .js-plotly-plot .nsewdrag")  # a tap on the plot: plotly's toolbar would show now
        page.wait_for_timeout(600)
        shown = page.evaluate("""() => [...document.querySelectorAll('.modebar-container, .modebar')]
            .filter((e) => e.getBoundingClientRect().width > 0 && getComputedStyle(e).display !== 'none').length""")
        assert shown == 0, f"{shown} plotly toolbars shown"
        page.locator("#sv-picture").screenshot(path=str(shots / f"issue65-picture-400-{theme}.png"))
        assert page.evaluate(CLEAR_JS) == []
        rows = page.evaluate(CHART_TEXT_JS, "body")
        kinds = {r["cls"].split()[0] for r in rows}
        assert len({r["name"] for r in rows}) >= 6 and {"gtitle", "xtick", "ytick", "legendtext"} <= kinds, kinds
        assert _low_contrast(rows) == []
        if theme == "dark":  # the ink is the dark muted grey, not the light one
            fills = {r["fill"] for r in rows if r["cls"].startswith("gtitle")}
            assert fills == {"rgb(161, 168, 181)"}, fills
        for tab in ("Theory", "Sweeps"):
            page.get_by_role("tab", name=tab).click()
            page.wait_for_timeout(2500)
            if tab == "Sweeps":
                page.wait_for_selector("#sv-shootout-plot .js-plotly-plot .main-svg")
                page.wait_for_timeout(1500)
            assert page.evaluate(CLEAR_JS) == [], tab
            assert _low_contrast(page.evaluate(CHART_TEXT_JS, "body")) == [], tab
            page.screenshot(path=str(shots / f"issue65-{tab.lower()}-400-{theme}.png"), full_page=True)
        assert_no_traceback(page)
    finally:
        ctx.close()


def test_at_1400_px_the_charts_text_is_clear(viewport_page, server, shots):  # noqa: F811
    page = viewport_page(1400, 900)
    open_app(page, server, "?recording=2-chat-greedy&round=3")
    wait_until(page, server, "() => !!document.querySelector('#sv-picture .js-plotly-plot .main-svg')", "the picture", UI_S)
    page.locator("#sv-draft-lengths").scroll_into_view_if_needed()
    page.wait_for_selector("#sv-draft-lengths .js-plotly-plot .main-svg")
    page.wait_for_timeout(1500)
    assert page.evaluate(CLEAR_JS) == []
    assert _low_contrast(page.evaluate(CHART_TEXT_JS, "body")) == []
    page.get_by_role("tab", name="Theory").click()
    page.wait_for_selector("#sv-t-speed .js-plotly-plot .main-svg")
    page.wait_for_timeout(1500)
    assert page.evaluate(CLEAR_JS) == []
    assert page.evaluate("() => [...document.querySelectorAll('#sv-t-speed .textpoint text')].some(t => t.textContent.startsWith('γ*='))")
    page.locator("#sv-t-speed").screenshot(path=str(shots / "issue65-theory-speed-1400.png"))
