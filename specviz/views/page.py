"""A standalone HTML page around view fragments (exports, screenshots, tests)."""

from __future__ import annotations

from pathlib import Path

from ._fmt import esc

CSS_PATH = Path(__file__).resolve().parents[2] / "assets" / "style.css"


def load_css(path: str | Path | None = None) -> str:
    """The text of assets/style.css ('' if it is missing)."""
    p = Path(path) if path is not None else CSS_PATH
    try:
        return p.read_text(encoding="utf-8")
    except OSError:
        return ""


def standalone_page(body_html: str, title: str = "specviz", *, dark: bool = False, css: str | None = None) -> str:
    """A full HTML document with the specviz CSS inlined.

    ``body_html`` is trusted view output (already escaped); ``title`` is escaped.
    ``dark`` puts ``class="dark"`` on <body>, as Gradio does in dark mode.
    """
    css = load_css() if css is None else css
    return (
        "<!doctype html><html><head><meta charset=\"utf-8\">"
        f"<title>{esc(title)}</title><style>{css}</style></head>"
        f"<body class=\"sv-page{' dark' if dark else ''}\">{body_html}</body></html>"
    )
