"""Is the page's small text readable?  WCAG 2 contrast ratios computed from ``assets/style.css``.

WCAG 2.x (success criterion 1.4.3, level AA) asks for a contrast ratio of at least 4.5:1 between text
of normal size (under 18.66 px bold / 24 px) and its background.  The ratio is (L1 + 0.05) / (L2 + 0.05),
L the relative luminance of the lighter (L1) and darker (L2) colour.

What is checked, in light and dark mode: Gradio's form help text (the 12-px "info" under a control:
``--block-info-text-color``, also ``--body-text-color-subdued``), the views' muted text
(``--sv-muted``) and each token chip's text on its fill, each against every surface it is drawn on.
The surfaces are Gradio Soft's (the app's theme), listed in :data:`SURFACES`.

The charts' text (:func:`chart_checks`): every text a Plotly figure draws (title, subtitle, ticks, axis titles,
legend, annotations, the traces' labels) in the colour its layout gives it, on the chart's surfaces (a chart is
transparent: a block, or the page in presenter mode) or on the bar it is drawn in; in dark mode as the style sheet
redraws it (:func:`chart_ink`: the charts' ink is redrawn in the dark muted grey).

    python -m specviz.views.contrast         # the table for the shipped style sheet

Pure Python, no dependencies beyond the standard library.
"""

from __future__ import annotations

import re
from pathlib import Path

from .cvd import PANEL, RGB, STATUSES, _block, _to_linear, parse_color

AA = 4.5  # WCAG 2 AA, normal-size text

# The surfaces text sits on, per mode: Gradio Soft's theme values (tests/test_contrast.py checks them
# against the installed theme): a block (the form's cards), the page, the secondary fill, an input.
SURFACES: dict[str, dict[str, str]] = {
    "light": {"block": "#ffffff", "page": "#f9fafb", "secondary": "#f9fafb", "input": "#ffffff"},
    "dark": {"block": "#1f2937", "page": "#0b0f19", "secondary": "#111827", "input": "#374151"},
}
THEME_VARS = {"block": "block-background-fill", "page": "background-fill-primary",
              "secondary": "background-fill-secondary", "input": "input-background-fill"}
# Where the container-level overrides live: light on ``.gradio-container``, dark under ``.dark``.
FORM_SELECTOR = {"light": ".gradio-container", "dark": ".dark .gradio-container"}
FORM_VARS = ("block-info-text-color", "body-text-color-subdued")


def luminance(rgb: RGB) -> float:
    """WCAG relative luminance of an sRGB colour (components 0..1)."""
    r, g, b = (_to_linear(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def ratio(fg: RGB, bg: RGB) -> float:
    """The WCAG contrast ratio of two colours, 1..21."""
    hi, lo = sorted((luminance(fg), luminance(bg)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def variables(css: str, selector: str) -> dict[str, str]:
    """The custom properties (``--name: value``) of the first rule for ``selector``, names without ``--``."""
    body = re.sub(r"/\*.*?\*/", "", _block(css, selector), flags=re.S)
    return {k: v.strip() for k, v in re.findall(r"--([\w-]+)\s*:\s*([^;]+);", body)}


def checks(css: str) -> list[dict]:
    """One row per (mode, text, surface): the colours and their contrast ratio."""
    rows = []
    for mode in ("light", "dark"):
        form = variables(css, FORM_SELECTOR[mode])
        views = variables(css, ":root" if mode == "light" else ".dark")
        panel = parse_color(PANEL[mode])
        texts = {f"form help text (--{name})": form[name] for name in FORM_VARS}
        texts["muted text (--sv-muted)"] = views["sv-muted"]
        for what, fg in texts.items():
            for surface, bg in SURFACES[mode].items():
                if surface == "input" and what.startswith("muted"):  # the views are never drawn in an input
                    continue
                rows.append({"mode": mode, "text": what, "on": surface, "fg": fg, "bg": bg,
                             "ratio": ratio(parse_color(fg), parse_color(bg))})
        for status in STATUSES:  # a chip's text on its own fill (translucent fills composited on the panel)
            fg, bg = views[f"sv-{status}-fg"], views[f"sv-{status}-bg"]
            rows.append({"mode": mode, "text": f"{status} chip", "on": "its fill", "fg": fg, "bg": bg,
                         "ratio": ratio(parse_color(fg, panel), parse_color(bg, panel))})
    return rows


# ---- the charts' text (issue 65) ------------------------------------------------------------------------------

CHART_SURFACES = ("block", "page", "secondary")  # what a transparent chart is drawn on (never an input)
NAMED = {"black": "#000000", "white": "#ffffff"}
# The style sheet's dark-mode redraw of a chart colour: `.dark .js-plotly-plot … [style*="fill: rgb(r, g, b)"] {
# fill: <colour> !important; }` (assets/style.css, "Plotly charts"; a colour plotly sets through the DOM is written
# rgb(r, g, b), one from a <span style='color:…'> in a label as it was written, "fill:#rrggbb").
_INK_RULE = re.compile(r'\.dark\s+\.js-plotly-plot[^{]*\[style\*="fill:\s*(rgb\([^)]*\)|#[0-9a-fA-F]{3,6})"\]\s*\{\s*'
                       r'fill:\s*([^;!]+)')
_SPAN_COLOR = re.compile(r"color:\s*(#[0-9a-fA-F]{3,6}|rgba?\([^)]*\))")


def _color(text: str, over: RGB | None = None) -> RGB:
    return parse_color(NAMED.get(text.strip().lower(), text), over)


def chart_ink(css: str) -> dict[RGB, str]:
    """{the colour a figure draws: what the style sheet draws it as in dark mode} (var() read from ``.dark``)."""
    dark = variables(css, ".dark")
    out: dict[RGB, str] = {}
    for src, dst in _INK_RULE.findall(re.sub(r"/\*.*?\*/", "", css, flags=re.S)):
        dst = dst.strip()
        m = re.fullmatch(r"var\(--([\w-]+)\)", dst)
        out[_color(src)] = dark[m.group(1)] if m else dst
    return out


def _colors(value, base: str) -> list[str]:
    """A font's colour(s): its own (one or one a point), else the colour it inherits."""
    if value is None:
        return [base]
    if isinstance(value, str):
        return [value]
    return [v if isinstance(v, str) else base for v in value] or [base]


def chart_texts(fig) -> list[tuple[str, str, str | None]]:
    """(what, colour, on) for every text a Plotly figure draws; ``on`` None: the chart's own (transparent)
    background, else the colour of the bar the text is drawn in.  An unset colour is inherited as plotly does:
    the layout's font, else its template's."""
    L = fig.layout
    base = L.font.color if L.font.color else (L.template.layout.font.color if L.template.layout.font else None)
    base = base or "#444444"  # plotly's own default
    out: list[tuple[str, str, str | None]] = []

    def add(what: str, font, on: str | None = None, inherit: str = base, text: str = "") -> None:
        for col in _colors(getattr(font, "color", None) if font is not None else None, inherit):
            out.append((what, col, on))
        for col in _SPAN_COLOR.findall(text or ""):  # a part of the text in a colour of its own
            out.append((f"{what} (a coloured part)", col, on))

    if L.title.text:
        add("title", L.title.font, text=L.title.text)
        if L.title.subtitle.text:
            add("subtitle", L.title.subtitle.font, inherit=L.title.font.color or base, text=L.title.subtitle.text)
    if L.showlegend is not False and any(getattr(t, "showlegend", None) is not False and getattr(t, "name", None)
                                         for t in fig.data):
        add("legend", L.legend.font)
    for key in L:
        if key.startswith(("xaxis", "yaxis")) and L[key].visible is not False:
            add(f"{key} ticks", L[key].tickfont)
            if L[key].title.text:
                add(f"{key} title", L[key].title.font)
    for a in L.annotations or ():
        if a.text:
            add(f"annotation {a.text[:30]!r}", a.font, on=a.bgcolor if a.bgcolor and _opaque(a.bgcolor) else None,
                text=a.text)
    for t in fig.data:
        has_text = getattr(t, "text", None) is not None or getattr(t, "texttemplate", None)
        if not has_text:
            continue
        name = f"{t.type} {t.name!r} labels"
        if t.type == "bar":
            where = t.textposition if isinstance(t.textposition, str) else "auto"
            bars = [t.marker.color] if isinstance(t.marker.color, str) else list(t.marker.color or [])
            if where in ("inside", "auto"):
                font = t.insidetextfont if t.insidetextfont.color else t.textfont
                own = font.color if font.color is not None and not isinstance(font.color, str) else None
                for k, bar in enumerate(bars):
                    if not isinstance(bar, str):
                        continue
                    # a label in a bar without a colour of its own: plotly's contrast colour for that bar
                    col = (own[k] if own is not None and k < len(own) else font.color if isinstance(font.color, str)
                           else _plotly_contrast(bar))
                    out.append((name + " (in the bar)", col, bar))
            if where in ("outside", "auto"):
                add(name, t.outsidetextfont if t.outsidetextfont.color else t.textfont)
        elif "text" in (getattr(t, "mode", None) or ""):
            add(name, t.textfont)
    return out


def label_color(bar: str) -> str:
    """White or near-black, whichever is the more legible on a bar of colour ``bar`` (for labels drawn in bars)."""
    fill = _color(bar)
    return max(("#ffffff", "#111827", "#000000"), key=lambda c: (ratio(parse_color(c), fill) >= AA, c == "#ffffff",
                                                                  ratio(parse_color(c), fill)))


def _plotly_contrast(bar: str) -> str:
    """The colour plotly gives a label inside a bar of colour ``bar`` (plotly.js Color.contrast: white on a dark
    bar, #444 on a light one, "dark" by tinycolor's perceived brightness)."""
    r, g, b = (255 * c for c in _color(bar))
    return "#ffffff" if (299 * r + 587 * g + 114 * b) / 1000 < 128 else "#444444"


def _opaque(color: str) -> bool:
    m = re.fullmatch(r"rgba\(([^)]*)\)", color.strip().lower())
    return not m or float(m.group(1).split(",")[3]) >= 1


def chart_checks(css: str, figures: dict[str, object]) -> list[dict]:
    """One row per (mode, figure, text, surface): the colour the text is drawn in there and its contrast ratio.
    Dark mode draws a figure's colour as the style sheet redraws it (:func:`chart_ink`); a bar under a label keeps
    its colour in both modes."""
    ink = chart_ink(css)
    rows = []
    for name, fig in figures.items():
        for what, col, on in chart_texts(fig):
            for mode in ("light", "dark"):
                fg = col if mode == "light" else ink.get(_color(col), col)
                under = {"its bar": on} if on else {s: SURFACES[mode][s] for s in CHART_SURFACES}
                for surface, bg in under.items():
                    rows.append({"mode": mode, "figure": name, "text": what, "on": surface, "fg": fg, "bg": bg,
                                 "ratio": ratio(_color(fg, parse_color(SURFACES[mode]["block"])),
                                                _color(bg, parse_color(SURFACES[mode]["block"])))})
    return rows


def main() -> None:
    css = (Path(__file__).resolve().parents[2] / "assets" / "style.css").read_text(encoding="utf-8")
    print(f"{'mode':5} {'ratio':>6}  text on surface")
    for r in checks(css):
        flag = "" if r["ratio"] >= AA else "  < 4.5"
        print(f"{r['mode']:5} {r['ratio']:6.2f}  {r['text']} ({r['fg']}) on {r['on']} ({r['bg']}){flag}")


if __name__ == "__main__":
    main()
