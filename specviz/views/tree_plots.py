"""Plots of a tree run's rounds, and of the Sweeps tab's verify time against tree nodes.

Pure functions of traces / sweep rows, like specviz.views.plots: chain runs get
a blank figure that says why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go

from ._fmt import COLORS
from .figures import compact_layout, empty_figure

if TYPE_CHECKING:
    from specviz.trace import Trace


def _tree_rounds(trace: Trace | None) -> list:
    return [r for r in (trace.rounds if trace else []) if r.tree is not None]


def tree_sizes(trace: Trace | None) -> go.Figure:
    """Bars per tree round: the nodes drafted, and the accepted path's length on top."""
    title = "Tree size per round"
    rounds = _tree_rounds(trace)
    if not rounds:
        return empty_figure(title, "No tree rounds: run with the tree drafter")
    xs = [r.index + 1 for r in rounds]
    fig = go.Figure()
    fig.add_trace(go.Bar(name="nodes drafted", x=xs, y=[len(r.tree.nodes) for r in rounds],
                         marker=dict(color=COLORS["verify_time"], line=dict(width=0)),
                         hovertemplate="round %{x}: %{y} nodes<extra></extra>"))
    fig.add_trace(go.Scatter(name="accepted path", x=xs, y=[len(r.tree.path) for r in rounds], mode="markers+lines",
                             marker=dict(color=COLORS["accepted"], size=8),
                             hovertemplate="round %{x}: %{y} accepted<extra></extra>"))
    mean = sum(len(r.tree.nodes) for r in rounds) / len(rounds)
    return compact_layout(fig, title, "round", "tokens", subtitle=f"mean {mean:.1f} nodes per tree")


def tree_verify_scatter(trace: Trace | None) -> go.Figure:
    """The target's verify pass time against the tokens it scored (tree nodes + the last token)."""
    title = "Verify time vs tree nodes scored"
    # The first round's pass also read the prompt: a point about the prompt, not the tree.
    rounds = [r for r in _tree_rounds(trace) if not r.prompt_fed]
    if not rounds:
        return empty_figure(title, "No tree rounds: run with the tree drafter")
    fig = go.Figure(go.Scatter(
        x=[r.tree.fed for r in rounds], y=[r.tree.t_forward for r in rounds], mode="markers",
        marker=dict(color=COLORS["verify_time"], size=9, opacity=0.8), customdata=[r.index + 1 for r in rounds],
        hovertemplate="round %{customdata}: %{x} tokens in %{y:.3f} s<extra></extra>", name="tree round"))
    return compact_layout(fig, title, "tokens fed to the target (nodes + 1)", "seconds", legend=False,
                  subtitle="one verify pass per round: flat while the machine is memory-bound")


def tree_sweep_plot(rows: list[dict[str, Any]] | None) -> go.Figure:
    """Sweeps tab: median verify time of a tree of n nodes, beside n tokens as a plain chain."""
    title = "Verify time vs tree nodes"
    if not rows:
        return empty_figure(title, "Press “Measure verify time vs tree nodes”")
    xs = [r["nodes"] for r in rows]
    fig = go.Figure()
    fig.add_trace(go.Scatter(name="tree (tree attention mask)", x=xs, y=[r["t_verify"] for r in rows],
                             mode="lines+markers", marker=dict(color=COLORS["verify_time"], size=8),
                             customdata=[r["depth"] for r in rows],
                             hovertemplate="%{x} nodes (depth %{customdata}): %{y:.4f} s<extra></extra>"))
    fig.add_trace(go.Scatter(name="same tokens as a chain (causal mask)", x=xs, y=[r["t_chain"] for r in rows],
                             mode="lines+markers", line=dict(dash="dash"), marker=dict(color=COLORS["draft_time"], size=7),
                             hovertemplate="%{x} tokens: %{y:.4f} s<extra></extra>"))
    fig.update_xaxes(type="log", tickvals=xs, ticktext=[str(x) for x in xs])
    return compact_layout(fig, title, "tree nodes scored in one target pass", "seconds (median)",
                  subtitle=f"median of {rows[0].get('repeats', '?')} passes per size on the loaded target")


def add_batch_points(fig: go.Figure, points: list[dict[str, Any]] | None) -> go.Figure:
    """The Theory tab's batch curve with the last i.i.d. tree runs' measured first-position
    rejection rate per M (real models, so beside the synthetic formula, not on it)."""
    pts = [p for p in (points or []) if p.get("rounds")]
    if not pts:
        return fig
    fig.add_trace(go.Scatter(
        x=[p["M"] for p in pts], y=[p["rejected"] / p["rounds"] for p in pts], mode="markers",
        name="your tree runs (real models, i.i.d. mode)",
        marker=dict(color=COLORS["rejected"], size=11, symbol="diamond", line=dict(width=1, color="white")),
        customdata=[[p["rejected"], p["rounds"]] for p in pts],
        hovertemplate="M=%{x}: all rejected in %{customdata[0]} of %{customdata[1]} rounds"
                      " (%{y:.2f})<extra>tree run</extra>"))
    top = max(p["rejected"] / p["rounds"] for p in pts)
    fig.update_yaxes(range=[0, max(top * 1.1, fig.layout.yaxis.range[1] if fig.layout.yaxis.range else 0)])
    return fig
