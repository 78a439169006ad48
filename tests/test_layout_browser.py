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
