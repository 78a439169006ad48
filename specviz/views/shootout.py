"""The drafter shoot-out drawn: one table and one chart, from rows of plain dicts (a fresh
shoot-out's `specviz.experiments.shootout.Row.as_dict()` or a recording's), and the "recorded" marking.

Rows measured several times show tok/s and speedup as "1.23× (1.18–1.27)": the median and the range of
the repeats (error bars on the chart), and ⚠ where the timing judge flagged any repeat."""

from __future__ import annotations

from typing import Any, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ._fmt import esc
from .contrast import label_color
from .figures import FONT_COLOR, NO_DATA, WIDE_WRAP, empty_figure, safe_figure, wide_layout, wrap_html
from .sweep_plots import error_bars, spread_text
from .theory_plots import as_number

SHORT = {"model": "draft model", "prompt-lookup": "prompt lookup", "tree": "token tree",
         "speculator": "learned head", "hybrid": "model + lookup", "standard": "standard"}
COLORS = {"model": "#2563eb", "prompt-lookup": "#d97706", "tree": "#7c3aed", "speculator": "#059669",
          "hybrid": "#0891b2", "standard": "#6b7280"}
# (key, column title, format, definition): the table's columns after the drafter's name, and the chart's panels.
METRICS = (
    ("alpha", "α", "{:.2f}", "acceptance rate: accepted ÷ verified drafts"),
    ("mean_accepted_length", "tokens / target pass", "{:.2f}", "1 + accepted ÷ rounds (vLLM's mean acceptance length)"),
    ("c", "c", "{:.3f}", "drafting time per draft token ÷ one target forward pass"),
    ("tokens_per_s", "tok/s", "{:.2f}", "generated tokens ÷ wall time, prompt prefill included"),
    ("speedup", "speedup", "{:.2f}×", "tok/s ÷ standard decoding's tok/s"),
)
TITLE = "Drafter shoot-out: the same prompt and settings, every drafter"


SPREAD = ("tokens_per_s", "speedup")  # shown with their range over the repeats: "1.23× (1.18–1.27)"
NOISY = "⚠"


def _fmt(row: dict, key: str, fmt: str) -> str:
    if key in SPREAD:
        return spread_text(row, key, fmt)
    v = as_number(row.get(key))
    return fmt.format(v) if v is not None else "—"


def _noisy(row: dict) -> str:
    """The table's mark on a row whose repeats' timings were flagged ("" when none was)."""
    bad, n = row.get("noisy"), row.get("repeats")
    if not isinstance(bad, int) or bad <= 0:
        return ""
    why = f"timings flagged noisy in {bad} of {n} repeats: other work on the machine disturbed them"
    return f' <span class="sv-noisy" title="{esc(why)}" aria-label="{esc(why)}">{NOISY}</span>'


def repeats_caption(rows: Sequence[dict] | None) -> str:
    """What the table's ranges are, when its rows have repeats ("" for one run each, or an older recording)."""
    ns = [r.get("repeats") for r in rows or [] if isinstance(r.get("repeats"), int)]
    if not ns or max(ns) <= 1:
        return ""
    n = f"{max(ns)}" if min(ns) == max(ns) else f"{min(ns)}–{max(ns)}"
    return (f" · median of {n} repeats, run round-robin with standard decoding (min–max in brackets)"
            + (f"; {NOISY}: timings flagged noisy" if any(_noisy(r) for r in rows or []) else ""))


def table_html(rows: Sequence[dict] | None, caption: str = "") -> str:
    """The shoot-out table; a contender that did not run spans the metric columns with why."""
    if not rows:
        return '<div class="sv-metrics sv-empty">No shoot-out yet: press <b>Run drafter shoot-out</b>.</div>'
    head = "".join(f'<th scope="col" title="{esc(d)}">{esc(t)}</th>' for _, t, _, d in METRICS)
    out = [f'<table class="sv-metrics sv-shootout" data-rows="{len(rows)}">',
           f"<caption>{esc((caption or TITLE) + repeats_caption(rows))}</caption>",
           f'<thead><tr><th scope="col">drafter</th><th scope="col">policy</th>{head}'
           '<th scope="col" title="the same tokens as standard decoding">same text</th></tr></thead><tbody>']
    for r in rows:
        name = f'<th scope="row" class="sv-metric-k">{esc(str(r.get("label", "?")))}</th>'
        policy = f'<td>{esc(str(r.get("policy") or ""))}</td>'
        if r.get("error"):
            out.append(f'<tr data-key="{esc(str(r.get("key", "")))}" data-error="1">{name}{policy}'
                       f'<td class="sv-metric-d" colspan="{len(METRICS) + 1}">did not run: {esc(str(r["error"]))}</td></tr>')
            continue
        cells = "".join(f'<td class="sv-metric-v">{esc(_fmt(r, k, f))}{_noisy(r) if k == "speedup" else ""}</td>'
                        for k, _, f, _ in METRICS)
        same = {True: "yes", False: "no"}.get(r.get("same_text"), "—")
        flag = f' data-noisy="{r["noisy"]}"' if _noisy(r) else ""
        out.append(f'<tr data-key="{esc(str(r.get("key", "")))}"{flag}>{name}{policy}{cells}<td>{same}</td></tr>')
    out.append("</tbody></table>")
    return "".join(out)


def chart(rows: Sequence[dict] | None, subtitle: str = "") -> go.Figure:
    """One figure, one panel per metric, one bar per contender that ran."""
    ran = [r for r in (rows or []) if isinstance(r, dict) and not r.get("error")]
    if not ran:
        return empty_figure(TITLE, f"{NO_DATA}: run a drafter shoot-out", wide=True)

    def build() -> go.Figure:
        names = [SHORT.get(str(r.get("key")), str(r.get("label", "?"))) for r in ran]
        fig = make_subplots(rows=1, cols=len(METRICS), shared_yaxes=True, horizontal_spacing=0.03,
                            subplot_titles=[t for _, t, _, _ in METRICS])
        colors = [COLORS.get(str(r.get("key")), "#1f77b4") for r in ran]
        for col, (key, title, fmt, _) in enumerate(METRICS, 1):
            xs = [as_number(r.get(key)) for r in ran]
            bars = error_bars(ran, key) if key in SPREAD else None
            fig.add_trace(go.Bar(
                x=xs, y=names, orientation="h", marker_color=colors, showlegend=False, name=title,
                text=[(fmt.format(x) + (NOISY if key == "speedup" and _noisy(r) else "")) if x is not None else ""
                      for x, r in zip(xs, ran)], textposition="auto", error_x=bars,
                insidetextfont=dict(color=[label_color(c) for c in colors]),  # 4.5:1 on each bar (issue 65)
                customdata=[_fmt(r, key, fmt) for r in ran],
                hovertemplate="%{y}<br>" + title + " %{customdata}<extra></extra>"), row=1, col=col)
        fig.add_vline(x=1.0, line=dict(color=FONT_COLOR, width=1, dash="dash"), row=1, col=len(METRICS))
        skipped = [SHORT.get(str(r.get("key")), str(r.get("label"))) for r in rows or [] if r.get("error")]
        sub = subtitle + ("; " if subtitle and skipped else "") + (
            f"did not run: {', '.join(skipped)} (see the table)" if skipped else "")
        wide_layout(fig, TITLE, sub or None, height=340)
        fig.update_layout(margin=dict(l=10, r=10, b=40))
        fig.update_yaxes(autorange="reversed")
        return fig

    return safe_figure(TITLE, build)


def mark_recorded(fig: go.Figure, label: str) -> go.Figure:
    """Say on a figure that its numbers were recorded elsewhere ("recorded on <machine>, <date>"): a first
    line of the subtitle, so it never collides with subplot titles or the legend."""
    sub = fig.layout.title.subtitle.text if fig.layout.title and fig.layout.title.subtitle else None
    mark = wrap_html(f"<span style='color:#b45309'><i>{esc(label)}</i></span>", WIDE_WRAP)  # fits a phone
    lines = mark.count("<br>") + 1
    fig.update_layout(title_subtitle_text=mark + (f"<br>{sub}" if sub else ""),
                      margin_t=(fig.layout.margin.t or 60) + 16 * lines + 4)
    if fig.layout.height:
        fig.update_layout(height=fig.layout.height + 16 * lines + 4)
    return fig


def rows_of(items: Sequence[Any]) -> list[dict[str, Any]]:
    """Plain dicts from Rows (as_dict) or pydantic rows (model_dump), for the views."""
    out = []
    for r in items:
        if hasattr(r, "as_dict"):
            out.append(r.as_dict())
        elif hasattr(r, "model_dump"):
            out.append(r.model_dump())
        else:
            out.append(dict(r))
    return out
