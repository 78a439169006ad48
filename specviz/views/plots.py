"""Plotly figures of a trace: acceptance, tokens per round, draft lengths, round timings (the race's two
figures, tokens against time and the speedup, are :mod:`.race_plots`).

Every function takes plain trace data (or None) and returns a ``go.Figure``; an
empty or missing trace gives a figure with a "no data yet" note, never an
exception.  Colours match the chips (``_fmt.COLORS``); the look and the compact
layout (three to a row) are :mod:`.figures`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go

from specviz.core.settings import stop_sentence, stop_short

from ._fmt import COLORS, DRAFTER_SHORT, fsec, mean_draft_length
from .figures import compact_layout, empty_figure
from .rules import rule_name

if TYPE_CHECKING:
    from specviz.trace import Trace


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


# The acceptance bars' green, a shade deeper than the accepted chips' (#059669): their white labels are 5.5:1 on it,
# 3.8:1 on the lighter one (tests/test_contrast.py checks every chart's text).
ACCEPTED_DEEP = "#047857"


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
            marker=dict(color=ACCEPTED_DEEP, line=dict(width=0)),
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
    compact_layout(
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
    compact_layout(
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
    if stops:  # two reasons a line: three on one overflowed a 400-px screen's chart (Chromium 150's fonts)
        top = sorted(stops.items(), key=lambda kv: -kv[1])
        parts = [f"{stop_short(k, k)} {n}" for k, n in top[:3]] + (["…"] if len(top) > 3 else [])
        sub += "<br>stopped: " + "<br>".join(" · ".join(parts[i:i + 2]) for i in range(0, len(parts), 2))
    compact_layout(fig, title, "round", "tokens", subtitle=sub)
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
    compact_layout(fig, title, "round", "seconds", subtitle=sub)
    fig.update_layout(barmode="stack", bargap=0.15 if len(rounds) < 60 else 0.0)
    return fig


__all__ = [
    "COLORS",
    "acceptance_by_position",
    "draft_lengths",
    "expected_tokens_distribution",
    "round_times",
    "tokens_per_round_hist",
]
