"""Small text is readable (WCAG contrast computed from assets/style.css) and every token is drawn:
fonts that have the glyph, and an escape for characters no font draws."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from specviz.views import contrast
from specviz.views._fmt import tok_repr, visible_ws
from specviz.views.cvd import parse_color
from specviz.views.page import load_css
from specviz.views.text import tokens_html

CSS = load_css()


def test_the_ratio_is_wcags():
    white, black = parse_color("#ffffff"), parse_color("#000000")
    assert contrast.ratio(white, black) == pytest.approx(21.0)
    assert contrast.ratio(white, white) == pytest.approx(1.0)
    # the measurement: Gradio Soft's help text #9ca3af on white is 2.5:1
    assert contrast.ratio(parse_color("#9ca3af"), white) == pytest.approx(2.54, abs=0.01)


def test_form_help_text_reaches_4_5_to_1_in_light_and_dark_mode():
    rows = contrast.checks(CSS)
    form = [r for r in rows if r["text"].startswith("form help text")]
    assert {r["mode"] for r in form} == {"light", "dark"} and len(form) == 16
    low = [f"{r['mode']}: {r['text']} {r['fg']} on {r['on']} {r['bg']} = {r['ratio']:.2f}" for r in rows
           if r["ratio"] < contrast.AA]
    assert not low, low
    # the values come from the style sheet: the light help text is not Soft's #9ca3af any more
    light = contrast.variables(CSS, ".gradio-container")
    assert parse_color(light["block-info-text-color"]) != parse_color("#9ca3af")


def test_a_style_sheet_with_softs_grey_fails_the_check():
    """The check reads the sheet: put #9ca3af back and it reports 2.5:1."""
    bad = CSS.replace("--block-info-text-color: #5f6673;", "--block-info-text-color: #9ca3af;", 1)
    assert bad != CSS
    low = [r for r in contrast.checks(bad) if r["ratio"] < contrast.AA]
    assert low and all(r["fg"] == "#9ca3af" and r["mode"] == "light" for r in low)


def _theme_values(css: str, mode: str) -> dict[str, str]:
    """Gradio theme variables for ``mode``, var() chains resolved ("white" as #ffffff)."""
    blocks = re.findall(r"(:root|\.dark, :root \.dark)\s*\{([^}]*)\}", css)
    light = dict(re.findall(r"--([\w-]+):\s*([^;]+);", dict(blocks)[":root"]))
    values = dict(light)
    if mode == "dark":
        values.update(re.findall(r"--([\w-]+):\s*([^;]+);", dict(blocks)[".dark, :root .dark"]))

    def resolve(v: str) -> str:
        m = re.fullmatch(r"var\(--([\w-]+)\)", v.strip())
        return resolve(values[m.group(1)]) if m else {"white": "#ffffff"}.get(v.strip(), v.strip())
    return {k: resolve(v) for k, v in values.items()}


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_the_surfaces_checked_are_the_apps_themes(mode):
    gr = pytest.importorskip("gradio")
    theme = _theme_values(gr.themes.Soft()._get_theme_css(), mode)
    for surface, name in contrast.THEME_VARS.items():
        assert parse_color(theme[name]) == parse_color(contrast.SURFACES[mode][surface]), (mode, surface)
    # and the text it overrides is the theme's 12-px help text
    assert theme["block-info-text-size"] == "12px"


def _font_stack(css: str, var: str) -> list[str]:
    m = re.search(r"--" + var + r":\s*([^;]+);", css)
    return [f.strip().strip('"') for f in m.group(1).split(",")]


def test_token_fonts_fall_back_to_fonts_with_the_glyphs():
    glyphs = _font_stack(CSS, "sv-font-glyphs")
    assert {"Noto Sans Symbols 2", "Noto Sans CJK SC", "Noto Color Emoji", "Segoe UI Symbol"} <= set(glyphs)
    for var, generic in (("sv-font-mono", "monospace"), ("sv-font-text", "sans-serif")):
        stack = _font_stack(CSS, var)
        assert "var(--sv-font-glyphs)" in stack and stack[-1] == generic  # the fallbacks, before the generic
    chip = re.search(r"\n\.sv-chip \{([^}]*)\}", CSS).group(1)
    assert "font-family: var(--sv-font-mono)" in chip
    text = re.search(r"\n\.sv-text \{([^}]*)\}", CSS).group(1)
    assert "font-family: var(--sv-font-text)" in text


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.titles: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.titles += [v for k, v in attrs if k == "title" and v]

    def handle_data(self, data):
        self.text.append(data)


def _read(html: str) -> _Text:
    p = _Text()
    p.feed(html)
    return p


@pytest.mark.parametrize("raw, shown, kind", [
    ("a\x07b", "a\\x07b", "control character"),
    ("x\x85", "x\\x85", "control character"),          # C1 control (NEL)
    ("\u200bzero", "\\u200bzero", "invisible format character"),
    ("rtl\u202e", "rtl\\u202e", "invisible format character"),  # a bidi override would reorder the page
    ("\ue000", "\\ue000", "private-use character"),
    ("\U000f0001", "\\U000f0001", "private-use character"),
])
def test_unprintable_characters_show_as_escapes_in_the_token_views(raw, shown, kind):
    chip = _read(visible_ws(raw))
    assert "".join(chip.text) == shown and raw not in "".join(chip.text)
    assert any(kind in t for t in chip.titles)
    assert tok_repr(raw) == f"'{shown}'"
    from specviz.trace import Token
    running = _read(tokens_html([(Token(id=1, text=raw, origin="accepted"), 1)]))
    assert "".join(running.text) == shown


def test_printable_text_and_whitespace_are_kept():
    from specviz.trace import Token
    text = "日本 🦜 é\u0301 👩\u200d💻\n\tfin"  # CJK, emoji, a combining accent, a ZWJ sequence, newline, tab
    running = _read(tokens_html([(Token(id=1, text=text, origin="accepted"), 1)]))
    assert "".join(running.text) == text  # the running text keeps newlines and tabs as they are
    chip = "".join(_read(visible_ws(text)).text)
    assert chip == "日本·🦜·é\u0301·👩\u200d💻↵⇥fin"
    assert tok_repr("a\nb\\") == "'a↵b\\'"  # a sentence quotes a token in the chips' notation (issue 65)


def test_the_rules_table_escapes_its_token_headers():
    from tests.synthetic import make_trace
    from specviz.views.rules import rules_html

    tr = make_trace(plan=[dict(accept=1, extra="correction", draft=2)], gamma=2)
    for d in tr.rounds[0].draft:
        d.p, d.h = 0.5, 0.5
    tr.rounds[0].draft[0].text = "bell\x07"
    html = rules_html(tr.rounds[0], tr)
    assert "≥1: bell\\x07" in "".join(_read(html).text) and "\x07" not in html


# ---- the charts' text (issue 65) ------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
RECORDINGS = sorted((ROOT / "assets" / "traces").glob("*.json"))


def _figures_of(frame, prefix: str) -> dict:
    import dataclasses

    import plotly.graph_objects as go
    return {f"{prefix}{f.name}": getattr(frame, f.name) for f in dataclasses.fields(frame)
            if isinstance(getattr(frame, f.name), go.Figure)}


@pytest.fixture(scope="module")
def every_figure() -> dict:
    """Every kind of chart the page draws: the Live tab's of each shipped recording, its acceptance pictures, the
    Theory tab's (the last run measured), the Sweeps tab's shipped recording, the machine tab, a tree run's, and
    the empty figures."""
    from specviz.core.settings import DecodeSettings
    from specviz.models import encode_prompt
    from specviz.models.tiny import build_tiny_pair
    from specviz.trace import load_recording
    from specviz.ui import live, machine_ui, picture_ui, shootout_ui, tabs
    from specviz.views import tree_plots
    from specviz.views.figures import empty_figure
    from tests import drafted

    figs: dict = {}
    for rec in RECORDINGS:
        frame = live.show_recording(*load_recording(rec.read_bytes()), "Loaded")
        figs.update(_figures_of(frame, f"{rec.stem}: "))
        figs.update(_figures_of(tabs.theory_views(0.8, 5, 0.15, 0.05, frame.state), f"{rec.stem}: theory "))
        for i in (1, 2):
            figs[f"{rec.stem}: picture of round {i}"] = picture_ui.for_step(frame.state, i)[1]
    pair = build_tiny_pair()
    s = DecodeSettings.checked(gamma=3, max_new_tokens=10, temperature=1.0, seed=2, drafter="tree", branches=2,
                               tree_nodes=6, tree_mode="iid")
    tree = drafted.speculative_decode(pair, encode_prompt(pair, "hello there"), s, prompt="hello there")
    figs["tree: sizes"], figs["tree: verify"] = tree_plots.tree_sizes(tree), tree_plots.tree_verify_scatter(tree)
    figs["tree: picture"] = picture_ui.for_step({"spec": tree}, 1)[1]
    figs.update(_figures_of(shootout_ui.recorded_frame(), "sweeps: "))
    figs["sweeps: tree sweep"] = tree_plots.tree_sweep_plot([
        {"nodes": n, "t_verify": 0.01 * n, "t_chain": 0.012 * n, "depth": 2, "repeats": 3} for n in (2, 4, 8)])
    figs["theory: batch"] = tabs.batch_view(8, 0.5, 6, 0)
    figs["machine"] = machine_ui.machine_views().plot
    from tests.test_machine import make_probe
    from specviz.views.machine import verify_cost_figure
    figs["machine probed"] = verify_cost_figure(make_probe())
    figs["empty"], figs["empty wide"] = empty_figure("t", "nothing"), empty_figure("t", "nothing", wide=True)
    return figs


def test_every_charts_text_reaches_4_5_to_1_in_light_and_dark_mode(every_figure):
    """Titles, subtitles, ticks, legends and labels of every chart, in the colour each layout gives them, on the
    surfaces a chart is drawn on (it is transparent), and in dark mode as the style sheet redraws them."""
    rows = contrast.chart_checks(CSS, every_figure)
    kinds = {r["text"].split(" ")[0] for r in rows}
    assert {"title", "subtitle", "legend", "xaxis", "yaxis", "annotation", "bar", "scatter"} <= kinds, kinds
    assert len({r["figure"] for r in rows}) >= 40 and {r["mode"] for r in rows} == {"light", "dark"}
    low = sorted({f"{r['mode']}: {r['figure'].split(': ')[-1]}: {r['text']} {r['fg']} on {r['on']} {r['bg']} = "
                  f"{r['ratio']:.2f}" for r in rows if r["ratio"] < contrast.AA})
    assert not low, "\n".join(low)


def test_the_charts_ink_is_redrawn_in_dark_mode_and_was_3_8_to_1_before():
    """The check reads the style sheet and the layouts: the old grey (rgb(123, 129, 144)) fails it on white, and
    without the dark-mode rule the light ink is under 4.5:1 on the dark block."""
    from specviz.views.figures import FONT_COLOR, compact_layout
    import plotly.graph_objects as go

    ink = contrast.chart_ink(CSS)
    assert ink[parse_color(FONT_COLOR)] == contrast.variables(CSS, ".dark")["sv-muted"]
    assert ink[parse_color("#b45309")] == "#fbbf24"  # the Sweeps charts' "recorded on" line
    fig = compact_layout(go.Figure(go.Bar(x=[1], y=[1], name="a")), "t", "x", "y", subtitle="s")
    old = go.Figure(fig).update_layout(font_color="#7b8190")
    low = [r for r in contrast.chart_checks(CSS, {"old": old}) if r["ratio"] < contrast.AA]
    assert {r["mode"] for r in low} == {"light", "dark"}
    assert min(r["ratio"] for r in low) == pytest.approx(3.8, abs=0.1)
    no_rule = re.sub(r"\.dark \.js-plotly-plot[^\n]*\n", "", CSS)
    assert contrast.chart_ink(no_rule) == {}
    low = [r for r in contrast.chart_checks(no_rule, {"new": fig}) if r["ratio"] < contrast.AA]
    assert low and {r["mode"] for r in low} == {"dark"}
    assert not [r for r in contrast.chart_checks(CSS, {"new": fig}) if r["ratio"] < contrast.AA]
