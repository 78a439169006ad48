"""Is the page's small text readable?  WCAG 2 contrast ratios computed from ``assets/style.css``.

WCAG 2.x (success criterion 1.4.3, level AA) asks for a contrast ratio of at least 4.5:1 between text
of normal size (under 18.66 px bold / 24 px) and its background.  The ratio is (L1 + 0.05) / (L2 + 0.05),
L the relative luminance of the lighter (L1) and darker (L2) colour.

What is checked, in light and dark mode: Gradio's form help text (the 12-px "info" under a control:
``--block-info-text-color``, also ``--body-text-color-subdued``), the views' muted text
(``--sv-muted``) and each token chip's text on its fill, each against every surface it is drawn on.
The surfaces are Gradio Soft's (the app's theme), listed in :data:`SURFACES`.

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


def main() -> None:
    css = (Path(__file__).resolve().parents[2] / "assets" / "style.css").read_text(encoding="utf-8")
    print(f"{'mode':5} {'ratio':>6}  text on surface")
    for r in checks(css):
        flag = "" if r["ratio"] >= AA else "  < 4.5"
        print(f"{r['mode']:5} {r['ratio']:6.2f}  {r['text']} ({r['fg']}) on {r['on']} ({r['bg']}){flag}")


if __name__ == "__main__":
    main()
