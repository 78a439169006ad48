"""Plotly figures for the Sweeps tab: measured speedup against γ (with Thm 3.8, textbook and with the
measured verify cost) and α, rejections and bias against ε.  Like :mod:`.theory_plots`, whose helpers
and colours they use, they never raise on missing input: an explanatory figure instead.

A point measured several times (round-robin, specviz.experiments.repeats) is the median of its repeats,
drawn with error bars from its min to its max and ringed when the timing judge flagged any of its
repeats; older recordings (one run a point, no range) draw no bars."""

from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .. import theory as th
from .figures import FONT_COLOR, NO_DATA, empty_figure, safe_figure, wide_layout
from .theory_plots import C_MEASURED, C_OPT, C_THEORY, C_UNO, as_number

C_NOISY = "#b45309"  # a point some of whose repeats the timing judge flagged


# ---- the spread of a point's repeats -------------------------------------------------------------


def spread_of(row: dict, key: str) -> tuple[float, float] | None:
    """(lo, hi) of a metric over a point's repeats (key_lo, key_hi), or None (one run, or an older recording)."""
    lo, hi, mid = as_number(row.get(f"{key}_lo")), as_number(row.get(f"{key}_hi")), as_number(row.get(key))
    if lo is None or hi is None or mid is None:
        return None
    return min(lo, mid), max(hi, mid)


def error_bars(rows: Sequence[dict], key: str) -> dict | None:
    """Plotly's asymmetric error bars (error_y or error_x) from the rows' ranges: up to the max, down to the
    min; None when no row has a range (the figure then draws no bars at all)."""
    spreads = [spread_of(r, key) for r in rows]
    if not any(spreads):
        return None
    plus, minus = [], []
    for r, sp in zip(rows, spreads):
        mid = as_number(r.get(key))
        plus.append(sp[1] - mid if sp and mid is not None else 0.0)
        minus.append(mid - sp[0] if sp and mid is not None else 0.0)
    return dict(type="data", symmetric=False, array=plus, arrayminus=minus, thickness=1.5, width=5)


def spread_text(row: dict, key: str, fmt: str = "{:.2f}") -> str:
    """"1.23× (1.18–1.27)": the median and, when the point has one, its range over the repeats (the
    range's numbers without the unit)."""
    mid = as_number(row.get(key))
    if mid is None:
        return "—"
    sp = spread_of(row, key)
    if not sp:
        return fmt.format(mid)
    lo, hi = (fmt.format(x).rstrip("×") for x in sp)
    return f"{fmt.format(mid)} ({lo}–{hi})"


def repeats_note(row: dict) -> str:
    """The hover's line on the repeats: 'median of 3 repeats, range 1.18–1.27×; 1 flagged noisy'."""
    n, bad = row.get("repeats"), row.get("noisy")
    if not isinstance(n, int) or n <= 1:
        return ""
    out = f"<br>median of {n} repeats"
    sp = spread_of(row, "speedup")
    if sp:
        out += f", range {sp[0]:.2f}–{sp[1]:.2f}×"
    if isinstance(bad, int) and bad:
        out += f"<br>timings flagged noisy in {bad} of {n}"
    return out


def noisy_rows(rows: Sequence[dict]) -> list[dict]:
    """The points some of whose repeats were flagged (their timings were disturbed)."""
    return [r for r in rows if isinstance(r.get("noisy"), int) and r["noisy"] > 0]


def noisy_marks(rows: Sequence[dict], x: str, y: str, name: str = "timings flagged noisy") -> go.Scatter | None:
    """A ring around each flagged point (None when none was flagged)."""
    bad = [r for r in noisy_rows(rows) if as_number(r.get(y)) is not None]
    if not bad:
        return None
    return go.Scatter(
        x=[as_number(r[x]) for r in bad], y=[as_number(r[y]) for r in bad], mode="markers", name=name,
        marker=dict(symbol="circle-open", size=20, color=C_NOISY, line=dict(width=2)),
        text=[f"timings flagged noisy in {r['noisy']} of {r.get('repeats', '?')} repeats" for r in bad],
        hovertemplate="%{text}<extra></extra>")


# ---- sweeps of real runs -----------------------------------------------------------------------


def gamma_sweep_plot(results: Sequence[dict] | None, alpha: float | None = None, c: float | None = None) -> go.Figure:
    """Measured speedup vs γ against Thm 3.8, textbook and with the measured verify cost.

    results: list of dict(gamma, speedup, alpha, c[, v]), one per run; c and v are per standard
    step (specviz.theory.costs), v the verify pass's cost in steps measured at that γ.  The textbook curve
    (a verify pass costs one step) uses alpha and c when given, else the mean α and c of the runs;
    when the runs measured v, a second curve evaluates Thm 3.8 at each measured γ with that γ's own
    v (v grows with γ on a compute-bound target).  Each run's own prediction (its α, c, v) is a
    hollow marker.  Rows without v (older recordings) get the textbook curve only.
    """
    title = "Measured speedup vs γ, against Thm 3.8"
    rows = [r for r in (results or []) if isinstance(r, dict)
            and as_number(r.get("gamma")) is not None and as_number(r.get("speedup")) is not None]
    if not rows:
        return empty_figure(title, f"{NO_DATA}: run a γ sweep first", wide=True)

    def build() -> go.Figure:
        rows.sort(key=lambda r: as_number(r["gamma"]))
        alphas = [as_number(r.get("alpha")) for r in rows if as_number(r.get("alpha")) is not None]
        cs = [as_number(r.get("c")) for r in rows if as_number(r.get("c")) is not None]
        a = as_number(alpha) if alpha is not None else (sum(alphas) / len(alphas) if alphas else None)
        cc = as_number(c) if c is not None else (sum(cs) / len(cs) if cs else None)
        gs = [int(as_number(r["gamma"])) for r in rows]
        measured_v = [(g, as_number(r.get("v"))) for g, r in zip(gs, rows) if as_number(r.get("v")) and g >= 1]
        fig = go.Figure()
        sub = "no α, c: theoretical curve omitted"
        if a is not None and cc is not None:
            gmax = max(max(gs), 1)
            sw = th.sweep_theory(a, cc, range(1, gmax + 1))
            textbook = "Thm 3.8, textbook: verify = 1 step"
            fig.add_trace(go.Scatter(
                x=sw["gamma"], y=sw["speedup"], mode="lines", name=f"{textbook} (α={a:.2f}, c={cc:.2f})",
                line=dict(color=C_THEORY, dash="dash" if measured_v else "solid"),
                hovertemplate="γ=%{x}<br>%{y:.3f}×<extra>" + textbook + "</extra>",
            ))
            if measured_v:
                ys = [th.expected_speedup(a, g, cc, vv) for g, vv in measured_v]
                fig.add_trace(go.Scatter(
                    x=[g for g, _ in measured_v], y=ys, mode="lines", name="Thm 3.8 with the verify cost measured at each γ",
                    line=dict(color=C_THEORY), text=[f"verify = {vv:.2f} steps" for _, vv in measured_v],
                    hovertemplate="γ=%{x}<br>%{y:.3f}×<br>%{text}<extra>Thm 3.8, measured v</extra>",
                ))
                k = max(range(len(ys)), key=lambda i: (ys[i], -i))
                g_opt, s_opt = measured_v[k][0], ys[k]
            else:
                g_opt, s_opt = th.optimal_gamma(a, cc, gmax)
            fig.add_trace(go.Scatter(
                x=[g_opt], y=[s_opt], mode="markers", name="optimal γ", marker=dict(symbol="star", size=14, color=C_OPT),
                hovertemplate="optimal γ*=%{x}<br>%{y:.3f}×<extra></extra>",
            ))
            means = " (means over the runs)" if alpha is None or c is None else ""
            if measured_v:
                lo, hi = min(vv for _, vv in measured_v), max(vv for _, vv in measured_v)
                sub = (f"α = {a:.3f}, c = {cc:.3f} per standard step{means}; a verify pass cost "
                       f"{lo:.2f}–{hi:.2f} standard steps (measured at each γ; the textbook assumes 1)")
            else:
                sub = f"curve: α = {a:.3f}, c = {cc:.3f}{means}; verify cost not measured (textbook: one step)"
        own = [(g, th.expected_speedup(as_number(r["alpha"]), g, as_number(r["c"]), as_number(r.get("v")) or 1.0))
               for g, r in zip(gs, rows) if as_number(r.get("alpha")) is not None and as_number(r.get("c")) is not None and g >= 0]
        if own:
            fig.add_trace(go.Scatter(
                x=[g for g, _ in own], y=[s for _, s in own], mode="markers",
                name="Thm 3.8 at each run's own α, c" + (", v" if measured_v else ""),
                marker=dict(symbol="circle-open", size=11, color=C_THEORY),
                hovertemplate="γ=%{x}<br>predicted %{y:.3f}×<extra></extra>",
            ))
        hover = [f"γ={g}<br>measured {as_number(r['speedup']):.3f}×"
                 + repeats_note(r)
                 + (f"<br>α={as_number(r['alpha']):.3f}" if as_number(r.get("alpha")) is not None else "")
                 + (f"<br>c={as_number(r['c']):.3f}" if as_number(r.get("c")) is not None else "")
                 + (f"<br>verify = {as_number(r['v']):.2f} steps" if as_number(r.get("v")) is not None else "")
                 for g, r in zip(gs, rows)]
        bars = error_bars(rows, "speedup")
        reps = [r.get("repeats") for r in rows if isinstance(r.get("repeats"), int)]
        fig.add_trace(go.Scatter(
            x=gs, y=[as_number(r["speedup"]) for r in rows], mode="lines+markers",
            name="measured (spec ÷ standard tok/s)" + (f", median of {max(reps)} with min–max" if bars and reps else ""),
            line=dict(color=C_MEASURED), marker=dict(symbol="diamond", size=10), text=hover, error_y=bars,
            hovertemplate="%{text}<extra></extra>",
        ))
        marks = noisy_marks(rows, "gamma", "speedup")
        if marks is not None:
            fig.add_trace(marks)
        fig.add_hline(y=1.0, line=dict(color=FONT_COLOR, width=1, dash="dash"))
        wide_layout(fig, title, sub, height=430)
        fig.update_xaxes(title_text="draft length γ", dtick=1)
        fig.update_yaxes(title_text="speedup (×)", rangemode="tozero")
        return fig

    return safe_figure(title, build)


def epsilon_sweep_plot(results: Sequence[dict] | None) -> go.Figure:
    """Measured α, speedup and recorded bias vs ε (over-acceptance, Yin et al. §4).

    results: list of dict(epsilon, alpha, speedup, mean_bias, first_divergence,
    edit_distance[, variant]); the last two (against the ε = 0 text) are in
    the hover.
    """
    title = "Over-acceptance: acceptance, speedup and bias vs ε"
    rows = [r for r in (results or []) if isinstance(r, dict) and as_number(r.get("epsilon")) is not None]
    if not rows:
        return empty_figure(title, f"{NO_DATA}: run an ε sweep first", wide=True)

    def build() -> go.Figure:
        fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.07,
                            subplot_titles=("acceptance rate α", "speedup (×)", "mean bias TV(A, p) per position"))
        variants = sorted({str(r.get("variant", "opt")).lower() for r in rows})
        colors = {"opt": C_OPT, "uno": C_UNO}
        for variant in variants:
            grp = sorted((r for r in rows if str(r.get("variant", "opt")).lower() == variant), key=lambda r: as_number(r["epsilon"]))
            xs = [as_number(r["epsilon"]) for r in grp]
            hover = []
            for r in grp:
                h = f"ε={as_number(r['epsilon']):g} ({variant.upper()})"
                for key, label in (("first_divergence", "first divergence at token"), ("edit_distance", "edit distance")):
                    if r.get(key) is not None:
                        h += f"<br>{label}: {r[key]}"
                hover.append(h)
            for row, key, fmt in ((1, "alpha", ".3f"), (2, "speedup", ".2f"), (3, "mean_bias", ".4f")):
                ys = [as_number(r.get(key)) for r in grp]
                text = [h + repeats_note(r) for h, r in zip(hover, grp)] if key == "speedup" else hover
                fig.add_trace(go.Scatter(
                    x=xs, y=ys, mode="lines+markers", name=f"{key} ({variant.upper()})", legendgroup=variant,
                    showlegend=row == 1 and len(variants) > 1, line=dict(color=colors.get(variant, C_THEORY)),
                    error_y=error_bars(grp, key) if key == "speedup" else None,
                    text=text, hovertemplate="%{text}<br>" + key + " %{y:" + fmt + "}<extra></extra>",
                ), row=row, col=1)
            marks = noisy_marks(grp, "epsilon", "speedup", f"timings flagged noisy ({variant.upper()})")
            if marks is not None:
                fig.add_trace(marks, row=2, col=1)
        fig.add_hline(y=1.0, line=dict(color=FONT_COLOR, width=1, dash="dash"), row=2, col=1)
        wide_layout(fig, title, "ε = 0 is exact (bias 0 for OPT); larger ε accepts more drafts at the cost of bias", height=620)
        fig.update_xaxes(title_text="over-acceptance threshold ε", row=3, col=1)
        fig.update_yaxes(rangemode="tozero")
        return fig

    return safe_figure(title, build)
