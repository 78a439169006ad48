"""The race's plotly figures: tokens against time for both decoders, and the measured speedup beside
Thm 3.8's (textbook, and with the measured verify cost).  Styled like :mod:`.plots`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go

from specviz.theory.costs import steps
from specviz.theory.figures import run_figures

from ._fmt import COLORS
from .figures import compact_layout, empty_figure

if TYPE_CHECKING:
    from specviz.trace import Trace


def _curve(trace: Trace) -> tuple[list[float], list[int]]:
    pts = trace.token_times()
    return [0.0] + [t for t, _ in pts], [0] + [n for _, n in pts]


def tokens_vs_time(spec: Trace | None, std: Trace | None) -> go.Figure:
    """Tokens generated versus seconds since start, both decoders on the same axes."""
    title = "Tokens generated over time"
    sides = [(t, name, color) for t, name, color in ((spec, "Speculative", COLORS["speculative"]), (std, "Standard", COLORS["standard"])) if t is not None and t.rounds]
    if not sides:
        return empty_figure(title, "No data yet: run a decoder")
    fig = go.Figure()
    for trace, name, color in sides:
        xs, ys = _curve(trace)
        tps = trace.summary().tokens_per_s or 0.0
        fig.add_trace(
            go.Scatter(
                name=f"{name} ({tps:.1f} tok/s)",
                x=xs,
                y=ys,
                mode="lines",
                line=dict(color=color, width=3, shape="hv"),
                hovertemplate=f"{name}<br>t = %{{x:.2f}} s<br>%{{y}} tokens<extra></extra>",
            )
        )
        fig.add_trace(
            go.Scatter(
                name=f"{name} end",
                x=[xs[-1]],
                y=[ys[-1]],
                mode="markers",
                marker=dict(color=color, size=9),
                showlegend=False,
                hovertemplate=f"{name} finished: %{{y}} tokens at %{{x:.2f}} s<extra></extra>",
            )
        )
    compact_layout(fig, title, "seconds since start", "tokens", subtitle="steeper is faster<br>each step is one round (one target pass)")
    fig.update_xaxes(rangemode="tozero")
    fig.update_yaxes(rangemode="tozero")
    return fig


# ---- speedup -----------------------------------------------------------------------


def speedup_bars(spec: Trace | None, std: Trace | None) -> go.Figure:
    """Measured speedup (spec tok/s ÷ std tok/s) next to Thm 3.8 twice: as published (a verify pass
    costs one standard step) and with the verify factor v this race measured (specviz.theory.costs)."""
    title = "Speedup: measured vs theory"
    if spec is None or spec.kind != "speculative" or not spec.rounds:
        return empty_figure(title, "No data yet: run speculative decoding")
    fig_ = run_figures(spec, std)  # the numbers every panel quotes: a flagged race's counts and probed v
    alpha, gamma = fig_.alpha, spec.gamma
    measured = fig_.speedup
    theory, with_v, v = fig_.textbook, fig_.with_verify, fig_.v
    c = fig_.c
    free = None
    if alpha is not None:
        free = float(gamma + 1) if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)

    # Short, two-line labels: four of them fit a third of a row without turning on their side.
    names = ["count-based" if fig_.speedup_by == "counts" else "measured", "Thm 3.8<br>textbook",
             f"Thm 3.8<br>v = {steps(v)}" if v is not None else "Thm 3.8<br>v unknown",
             "free<br>draft"]
    vals = [measured, theory, with_v, free]
    colors = [COLORS["speculative"], "rgba(100, 116, 139, 0.75)", COLORS["theory"], "rgba(100, 116, 139, 0.35)"]
    hovers = [
        ("this race's passes at this machine's probed costs (its clocks were flagged)" if fig_.speedup_by == "counts"
         else "speculative tok/s ÷ standard tok/s") if measured is not None
        else "stopped before the end: no speedup" if fig_.cut else "run standard decoding to measure",
        "(1 − α^(γ+1)) / ((1 − α)(γc + 1)), Leviathan et al. 2023: a verify pass costs one standard step (v = 1)",
        "(1 − α^(γ+1)) / ((1 − α)(γc + v)), v = verify pass ÷ standard step, "
        + ("probed on this machine (the race's clocks were flagged)" if fig_.v_source == "probed" else "measured in this race")
        if v is not None else "needs a standard run to measure a step",
        "(1 − α^(γ+1)) / (1 − α): expected tokens per target pass (a free draft: c = 0, v = 1)",
    ]
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            name="speedup",
            x=names,
            y=[v if v is not None else 0.0 for v in vals],
            text=[f"{v:.2f}×" if v is not None else "n/a" for v in vals],
            textposition="outside",
            marker=dict(color=colors, line=dict(width=0)),
            customdata=hovers,
            hovertemplate="%{x}: %{y:.2f}×<br>%{customdata}<extra></extra>",
            showlegend=False,
        )
    )
    fig.add_hline(y=1.0, line=dict(color=COLORS["rejected"], dash="dash", width=1.5))
    fig.add_trace(  # legend entry for the 1× line
        go.Scatter(
            name="1× = no speedup",
            x=[None],
            y=[None],
            mode="lines",
            line=dict(color=COLORS["rejected"], dash="dash", width=1.5),
            hoverinfo="skip",
        )
    )
    parts = [f"α = {alpha:.2f}" if alpha is not None else "α = n/a", f"γ = {gamma}",
             f"verify = {steps(v)} steps" if v is not None else "verify cost unknown"]
    if c is not None and fig_.c_per_step:
        c_text = f"c = {c:.3f} (draft token ÷ standard step)"
    elif c is not None:
        c_text = f"c = {c:.3f} (draft token ÷ verify pass)"
    else:
        c_text = "c = n/a"
    compact_layout(fig, title, "", "speedup (×)", subtitle=" · ".join(parts) + "<br>" + c_text)
    fig.update_xaxes(tickangle=0)
    top = max([x for x in vals if x is not None] + [1.0])
    fig.update_yaxes(range=[0, top * 1.22])
    fig.update_layout(meta={"measured": measured, "theoretical": theory, "with_verify": with_v, "v": v, "c": c,
                            "ideal": free})
    return fig
