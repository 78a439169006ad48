"""Plotly figures of a trace (or two): acceptance, tokens per round, timings, speedup.

Every function takes plain trace data (or None) and returns a ``go.Figure``; an
empty or missing trace gives a figure with a "no data yet" note, never an
exception.  Colours match the chips (``_fmt.COLORS``).  Backgrounds are
transparent and text is mid-grey so the figures read in light and dark mode.
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from specviz.core.settings import stop_sentence, stop_short
from specviz.theory.costs import race_costs, steps

from ._fmt import COLORS, DRAFTER_SHORT, fsec, mean_draft_length
from .rules import rule_name

if TYPE_CHECKING:
    from specviz.trace import Trace

FONT_COLOR = "#7b8190"  # readable on white and on Gradio's dark background
GRID_COLOR = "rgba(128, 128, 128, 0.22)"
FONT_FAMILY = "system-ui, -apple-system, 'Segoe UI', Roboto, 'DejaVu Sans', sans-serif"
HEIGHT = 360


def style_figure(
    fig: go.Figure, title: str, x_title: str = "", y_title: str = "", subtitle: str = "", legend: bool = True
) -> go.Figure:
    fig.update_layout(
        title=dict(
            text=title,
            subtitle=dict(text=subtitle, font=dict(size=12, color=FONT_COLOR)),
            x=0.5,
            xanchor="center",
            xref="container",
            y=0.97,
            yanchor="top",
            yref="container",
            font=dict(size=16),
        ),
        paper_bgcolor="rgba(0,0,0,0)",
        plot_bgcolor="rgba(0,0,0,0)",
        font=dict(family=FONT_FAMILY, size=13, color=FONT_COLOR),
        # Room for the title and each line of the subtitle (a figure shares a row with two others,
        # so long subtitles are broken with <br>; tests/test_views checks that every line fits).
        margin=dict(l=64, r=24, t=(84 + 18 * subtitle.count("<br>")) if subtitle else 56, b=62),
        legend=dict(orientation="h", yanchor="top", y=-0.2, xanchor="left", x=0, bgcolor="rgba(0,0,0,0)",
                    font=dict(size=12)),
        hoverlabel=dict(font=dict(family=FONT_FAMILY, size=12)),
        height=HEIGHT + (40 if legend else 0),
        showlegend=legend,
        bargap=0.25,
    )
    if legend:
        fig.update_layout(margin=dict(b=100))
    axis = dict(gridcolor=GRID_COLOR, zerolinecolor=GRID_COLOR, linecolor=GRID_COLOR, showline=True, automargin=True)
    fig.update_xaxes(title=dict(text=x_title), **axis)
    fig.update_yaxes(title=dict(text=y_title), **axis)
    return fig


EMPTY_WRAP = 38  # characters a line of an empty figure's message: a plot on a phone is ~330 px wide


def empty_figure(title: str, message: str = "No data yet") -> go.Figure:
    """A blank figure that says why it is blank (the message broken into lines that fit a narrow plot)."""
    fig = go.Figure()
    style_figure(fig, title, legend=False)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.add_annotation(
        text="<br>".join(textwrap.wrap(message, EMPTY_WRAP)) or message,
        x=0.5,
        y=0.5,
        xref="paper",
        yref="paper",
        showarrow=False,
        font=dict(size=15, color=FONT_COLOR),
    )
    fig.update_layout(meta={"empty": True})
    return fig


def _spec_ready(trace: Trace | None) -> str | None:
    """None if ``trace`` has verified speculative rounds, else the reason to show."""
    if trace is None:
        return "No data yet: run speculative decoding"
    if getattr(trace, "kind", None) != "speculative":
        return "Only for speculative decoding (standard decoding drafts nothing)"
    if not trace.rounds or not any(r.positions for r in trace.rounds):
        return "No data yet: no verified rounds"
    return None


# ---- acceptance by position --------------------------------------------------------


def acceptance_by_position(trace: Trace | None) -> go.Figure:
    """Per-position acceptance rate (bars) with the overall α (dashed line)."""
    title = "Acceptance rate by draft position"
    why = _spec_ready(trace)
    if why:
        return empty_figure(title, why)
    s = trace.summary()
    rates = s.per_position_acceptance or []
    gamma = len(rates)
    tested = [0] * gamma
    accepted = [0] * gamma
    for r in trace.rounds:
        for pos in r.positions:
            if 1 <= pos.i <= gamma:
                tested[pos.i - 1] += 1
                accepted[pos.i - 1] += int(pos.accepted)
    xs = list(range(1, gamma + 1))
    ys = [v if v is not None else 0.0 for v in rates]
    labels = [f"{v:.2f}" if v is not None else "never reached" for v in rates]
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            name="acceptance rate at position i",
            x=xs,
            y=ys,
            text=labels,
            textposition="inside",
            insidetextanchor="end",
            textfont=dict(color="#ffffff", size=13),
            marker=dict(color=COLORS["accepted"], line=dict(width=0)),
            customdata=list(zip(accepted, tested)),
            hovertemplate="position %{x}<br>accepted %{customdata[0]} of %{customdata[1]} verified"
            "<br>rate %{y:.3f}<extra></extra>",
        )
    )
    alpha = s.alpha
    if alpha is not None:
        fig.add_trace(
            go.Scatter(
                name=f"overall α = {alpha:.2f}",
                x=[0.5, gamma + 0.5],
                y=[alpha, alpha],
                mode="lines",
                line=dict(color=COLORS["theory"], dash="dash", width=2),
                hovertemplate=f"overall α = accepted ÷ verified = {s.accepted} ÷ {s.verified} = {alpha:.3f}<extra></extra>",
            )
        )
    style_figure(
        fig,
        title,
        "draft position i (1 = first drafted)",
        "acceptance rate",
        subtitle="share of verified drafts at position i<br>that the target accepted",
    )
    fig.update_xaxes(tickmode="linear", dtick=1, range=[0.4, gamma + 0.6])
    fig.update_yaxes(range=[0, 1.12], tickformat=".0%")
    return fig


# ---- tokens per round --------------------------------------------------------------


def expected_tokens_distribution(alpha: float, gamma: int) -> list[float]:
    """P(n tokens emitted in a round), n = 0…γ+1, for i.i.d. acceptance with rate α.

    n = 1…γ: α^(n−1)(1−α) (rejected at draft n, plus the correction);
    n = γ+1: α^γ (all accepted, plus the bonus); n = 0: 0.
    """
    probs = [0.0]
    probs += [alpha ** (n - 1) * (1 - alpha) for n in range(1, gamma + 1)]
    probs.append(alpha**gamma)
    return probs


def tokens_per_round_hist(trace: Trace | None) -> go.Figure:
    """Histogram of tokens emitted per round (0…γ+1) with the expected truncated geometric."""
    title = "Tokens emitted per round"
    why = _spec_ready(trace)
    if why:
        return empty_figure(title, why)
    s = trace.summary()
    hist = list(s.tokens_per_round_hist or [])
    gamma = len(hist) - 2
    n_rounds = sum(hist)
    xs = list(range(len(hist)))
    colors = [COLORS["discarded"]] + [COLORS["correction"]] * gamma + [COLORS["bonus"]]
    share = [h / n_rounds if n_rounds else 0.0 for h in hist]
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            name="observed rounds",
            x=xs,
            y=hist,
            text=[str(h) if h else "" for h in hist],
            textposition="outside",
            marker=dict(color=colors, line=dict(width=0)),
            customdata=share,
            hovertemplate="%{y} rounds emitted %{x} tokens (%{customdata:.0%})<extra></extra>",
        )
    )
    alpha = s.alpha
    if alpha is not None and n_rounds:
        exp = [n_rounds * p for p in expected_tokens_distribution(alpha, gamma)]
        fig.add_trace(
            go.Scatter(
                name=f"expected for α = {alpha:.2f} (truncated geometric)",
                x=xs,
                y=exp,
                mode="lines+markers",
                line=dict(color=COLORS["theory"], dash="dot", width=2),
                marker=dict(size=8, symbol="diamond"),
                hovertemplate="expected %{y:.1f} rounds with %{x} tokens<extra></extra>",
            )
        )
    style_figure(
        fig,
        title,
        f"tokens per round ({gamma + 1} = all + bonus)",
        "rounds",
        subtitle=f"{rule_name(trace)}<br>orange: ended by a correction · blue: by a bonus",
    )
    fig.update_xaxes(tickmode="linear", dtick=1, range=[-0.6, gamma + 1.6])
    # The expected line can rise above every bar (a tree run's α counts the siblings it rejected).
    top = max(hist + [1] + (exp if alpha is not None and n_rounds else []))
    fig.update_yaxes(range=[0, top * 1.2 + 0.5])
    return fig


# ---- draft length per round --------------------------------------------------------


def draft_lengths(trace: Trace | None) -> go.Figure:
    """Per round: tokens drafted (wide bar) and accepted (narrow bar inside it), γ dashed.

    Shows what the draft-length policy did: how long it let the drafter run and how
    much of that the target kept.  The hover says why each round stopped drafting."""
    title = "Draft length per round"
    if trace is None or trace.kind != "speculative":
        return empty_figure(title, "No data yet: run speculative decoding")
    rounds = trace.rounds
    if not rounds:
        return empty_figure(title, "No data yet: no rounds")
    xs = [r.index + 1 for r in rounds]
    drafted = [len(r.draft) for r in rounds]
    accepted = [r.n_accepted for r in rounds]
    why = [stop_sentence(r.draft_stop, "not recorded") for r in rounds]
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            name="drafted",
            x=xs,
            y=drafted,
            width=0.8,
            marker=dict(color=COLORS["draft_time"], opacity=0.55, line=dict(width=0)),
            customdata=why,
            hovertemplate="round %{x}: drafted %{y}<br>stopped: %{customdata}<extra></extra>",
        )
    )
    fig.add_trace(
        go.Bar(
            name="accepted",
            x=xs,
            y=accepted,
            width=0.45,
            marker=dict(color=COLORS["accepted"], line=dict(width=0)),
            hovertemplate="round %{x}: accepted %{y}<extra></extra>",
        )
    )
    gamma = trace.gamma
    fig.add_trace(
        go.Scatter(
            name=f"γ = {gamma}" if trace.settings.policy == "constant" else f"γ = {gamma}, the maximum ({trace.settings.policy} policy)",
            x=[0.5, len(rounds) + 0.5],
            y=[gamma, gamma],
            mode="lines",
            line=dict(color=COLORS["theory"], dash="dash", width=1.5),
            hoverinfo="skip",
        )
    )
    stops: dict[str, int] = {}
    for r in rounds:
        if r.draft_stop:
            stops[r.draft_stop] = stops.get(r.draft_stop, 0) + 1
    mean_d = mean_draft_length(trace) or 0.0
    mean_a = sum(accepted) / len(rounds)
    # Two short lines: the chart shares a row with two others.
    sub = f"mean drafted {mean_d:.2f} · mean accepted {mean_a:.2f}"
    if stops:
        top = sorted(stops.items(), key=lambda kv: -kv[1])
        sub += "<br>stopped: " + " · ".join(f"{stop_short(k, k)} {n}" for k, n in top[:3])
        sub += " · …" if len(top) > 3 else ""
    style_figure(fig, title, "round", "tokens", subtitle=sub)
    fig.update_layout(barmode="overlay", bargap=0.15 if len(rounds) < 60 else 0.0,
                      meta={"mean_drafted": mean_d, "mean_accepted": mean_a, "stops": stops})
    fig.update_yaxes(range=[0, max(drafted + [gamma]) * 1.12 + 0.2], dtick=1 if gamma <= 8 else None)
    return fig


# ---- timings -----------------------------------------------------------------------


def round_times(trace: Trace | None) -> go.Figure:
    """Stacked bars per round: draft time and verify (target) time."""
    title = "Time per round: drafting and verifying"
    if trace is None or not trace.rounds:
        return empty_figure(title, "No data yet: no rounds")
    rounds = trace.rounds
    xs = [r.index + 1 for r in rounds]
    emitted = [len(r.emitted) for r in rounds]
    fig = go.Figure()
    has_draft = any(r.draft or r.t_draft for r in rounds)
    if has_draft:
        fig.add_trace(
            go.Bar(
                name=f"draft ({DRAFTER_SHORT.get(trace.settings.drafter, trace.settings.drafter)})",
                x=xs,
                y=[r.t_draft for r in rounds],
                marker=dict(color=COLORS["draft_time"], line=dict(width=0)),
                customdata=list(zip([len(r.draft) for r in rounds], [r.draft_forwards for r in rounds])),
                hovertemplate="round %{x}<br>drafting %{customdata[0]} tokens: %{y:.3f} s"
                " (%{customdata[1]} forward passes)<extra></extra>",
            )
        )
    fig.add_trace(
        go.Bar(
            name="verify (target model)" if has_draft else "target forward pass",
            x=xs,
            y=[r.t_verify for r in rounds],
            marker=dict(color=COLORS["verify_time"], line=dict(width=0)),
            customdata=emitted,
            hovertemplate="round %{x}<br>target pass: %{y:.3f} s<br>+%{customdata} tokens<extra></extra>",
        )
    )
    total_d = sum(r.t_draft for r in rounds)
    total_v = sum(r.t_verify for r in rounds)
    sub = f"total drafting {fsec(total_d)} · total verifying {fsec(total_v)}"
    style_figure(fig, title, "round", "seconds", subtitle=sub)
    fig.update_layout(barmode="stack", bargap=0.15 if len(rounds) < 60 else 0.0)
    return fig


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
    style_figure(fig, title, "seconds since start", "tokens", subtitle="steeper is faster<br>each step is one round (one target pass)")
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
    rc = race_costs(spec, std)
    alpha, gamma = rc.alpha, spec.gamma
    measured = rc.measured
    theory, with_v, v = rc.textbook, rc.with_verify, rc.v
    c = rc.c if rc.c is not None else rc.c_verify
    free = None
    if alpha is not None:
        free = float(gamma + 1) if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)

    # Short, two-line labels: four of them fit a third of a row without turning on their side.
    names = ["measured", "Thm 3.8<br>textbook",
             f"Thm 3.8<br>v = {steps(v)}" if v is not None else "Thm 3.8<br>v unknown",
             "free<br>draft"]
    vals = [measured, theory, with_v, free]
    colors = [COLORS["speculative"], "rgba(100, 116, 139, 0.75)", COLORS["theory"], "rgba(100, 116, 139, 0.35)"]
    hovers = [
        "speculative tok/s ÷ standard tok/s" if measured is not None else "run standard decoding to measure",
        "(1 − α^(γ+1)) / ((1 − α)(γc + 1)), Leviathan et al. 2023: a verify pass costs one standard step (v = 1)",
        "(1 − α^(γ+1)) / ((1 − α)(γc + v)), v = verify pass ÷ standard step, measured in this race"
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
    if rc.c is not None:
        c_text = f"c = {rc.c:.3f} (draft token ÷ standard step)"
    elif c is not None:
        c_text = f"c = {c:.3f} (draft token ÷ verify pass)"
    else:
        c_text = "c = n/a"
    style_figure(fig, title, "", "speedup (×)", subtitle=" · ".join(parts) + "<br>" + c_text)
    fig.update_xaxes(tickangle=0)
    top = max([x for x in vals if x is not None] + [1.0])
    fig.update_yaxes(range=[0, top * 1.22])
    fig.update_layout(meta={"measured": measured, "theoretical": theory, "with_verify": with_v, "v": v, "c": c,
                            "ideal": free})
    return fig


__all__ = [
    "COLORS",
    "acceptance_by_position",
    "draft_lengths",
    "empty_figure",
    "expected_tokens_distribution",
    "round_times",
    "speedup_bars",
    "tokens_per_round_hist",
    "tokens_vs_time",
]
