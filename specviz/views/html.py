"""HTML views of a trace: the public entry points.

Every function takes plain trace data (no torch, no models) and returns an
HTML string styled by ``assets/style.css``.  Everything user- or model-derived
(token text, prompt, model names, errors) is HTML-escaped.

The implementations live in small modules; this module is the one to import:

- :func:`round_html`, :func:`rounds_html`, :func:`legend_html` (``chips.py``)
- :func:`text_html` (``text.py``)
- :func:`race_html` (``race.py``)
- :func:`narrate`, :func:`narrate_html` (``narrate.py``)
- :func:`metrics_html` (``metrics.py``)
- :func:`standalone_page`, :func:`load_css` (``page.py``)
"""

from __future__ import annotations

from .chips import legend_html, round_html, rounds_html, verdict_text
from .metrics import metric_rows, metrics_html
from .narrate import narrate, narrate_html
from .page import load_css, standalone_page
from .race import race_html, race_side, race_speedup
from .text import text_html

__all__ = [
    "legend_html",
    "load_css",
    "metric_rows",
    "metrics_html",
    "narrate",
    "narrate_html",
    "race_html",
    "race_side",
    "race_speedup",
    "round_html",
    "rounds_html",
    "standalone_page",
    "text_html",
    "verdict_text",
]
