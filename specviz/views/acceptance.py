"""The acceptance picture of one verified position: p and q as paired bars over the top tokens, their
overlap min(p, q) shaded (its mass β is the chance the rule accepts a token drawn from q there), the
distribution a correction is drawn from, the drafted token, and the uniform draw u against b.

Drawn from the trace alone (`trace.Picture`, version 3), so a recording shows it without a model.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..trace import Position, Round, Trace
from ._fmt import COLORS
from .plots import empty_figure
from .rules import NAMES

C_P, C_Q, C_RES, C_OVER = "#2563eb", "#f59e0b", "#dc2626", "rgba(16,185,129,0.28)"


def _label(text: str) -> str:
    shown = text.replace("\n", "↵").replace("\t", "⇥").replace(" ", "␣") or "∅"
    return shown if len(shown) <= 10 else shown[:9] + "…"


def _beta(pos: Position, rule: str) -> tuple[float, str]:
    """(β, what it is) for the rule at this position, over the whole vocabulary."""
    if rule == "match":
        return 1.0 - pos.reject_prob, "β = Σ p·q: the chance the target's own sample equals a token drawn from q"
    if rule == "block":
        return pos.b, "h: the chance the kept prefix may end here or later (block verification)"
    return 1.0 - pos.tv, "β = Σ min(p, q) = 1 − TV(p, q): the chance a token drawn from q is accepted"


def position_choices(rnd: Round | None) -> list[tuple[str, int]]:
    """(label, index) of a chain round's positions that carry a picture, for the picker."""
    if rnd is None or rnd.tree is not None:
        return []
    out = []
    for j, pos in enumerate(rnd.positions):
        if pos.picture is None:
            continue
        tok = rnd.draft[pos.i - 1].text if pos.i - 1 < len(rnd.draft) else "?"
        out.append((f"{pos.i}: {_label(tok)} · {'accepted' if pos.accepted else 'rejected'}", j))
    return out


def acceptance_figure(spec: Trace | None, rnd: Round | None, index: int | None) -> go.Figure:
    title = "The acceptance picture"
    if spec is None or rnd is None:
        return empty_figure(title, "Run or load a trace, then step to a round")
    if rnd.tree is not None:
        return empty_figure(title, "Tree rounds: see the tree's walk above (the picture draws chain positions)")
    if not rnd.positions:
        return empty_figure(title, "Nothing was drafted in this round: the target sampled on its own")
    if index is None or not 0 <= int(index) < len(rnd.positions):
        index = 0
    pos = rnd.positions[int(index)]
    pic = pos.picture
    if pic is None:
        return empty_figure(title, "This recording predates the picture's numbers (trace version 3 keeps them)")
    rule = spec.settings.rule
    greedy = spec.settings.temperature == 0
    x_tok = rnd.draft[pos.i - 1].id
    last = pos is rnd.positions[-1]
    corr = rnd.extra.id if (last and not pos.accepted and rnd.extra is not None) else None
    n = len(pic.ids)
    xs = list(range(n))
    ticks = [("★ " if t == x_tok else "") + ("⟲ " if t == corr else "") + _label(txt)
             for t, txt in zip(pic.ids, pic.text)]
    p_show = pic.p1 if greedy and pic.p1 is not None else pic.p
    q_show = pic.q1 if greedy and pic.q1 is not None else pic.q
    over = [min(a, b) for a, b in zip(p_show, q_show)]
    fig = make_subplots(rows=2, cols=1, row_heights=[0.8, 0.2], vertical_spacing=0.18)
    tag = " at temperature 1" if greedy else ""
    fig.add_trace(go.Bar(x=xs, y=q_show, name=f"q: draft{tag}", marker_color=C_Q, offset=-0.4, width=0.25,
                         hovertemplate="q = %{y:.4f}<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Bar(x=xs, y=p_show, name=f"p: target{tag}", marker_color=C_P, offset=-0.14, width=0.25,
                         hovertemplate="p = %{y:.4f}<extra></extra>"), row=1, col=1)
    # the overlap on top of both bars: shaded, outlined, so its height min(p, q) reads across the pair
    fig.add_trace(go.Bar(x=xs, y=over, name="overlap min(p, q)", offset=-0.42, width=0.56,
                         marker=dict(color=C_OVER, line=dict(color="#059669", width=2)),
                         hovertemplate="min(p, q) = %{y:.4f}<extra></extra>"), row=1, col=1)
    res_name = {"token": "residual norm(max(0, p − q))", "block": "residual norm(max(0, w·p − q))",
                "match": "p without the drafted token"}[rule]
    if rule == "token" and spec.settings.variant == "uno":
        res_name = "p (Decoding-UNO corrects from p)"
    fig.add_trace(go.Bar(x=xs, y=pic.res, name=f"correction drawn from: {res_name}", marker_color=C_RES,
                         offset=0.16, width=0.25, opacity=0.85,
                         hovertemplate="correction distribution %{y:.4f}<extra></extra>"), row=1, col=1)
    if greedy:
        ones = [i for i, (a, b) in enumerate(zip(pic.p, pic.q)) if a > 0.5 or b > 0.5]
        fig.add_trace(go.Scatter(x=ones, y=[1.02] * len(ones), mode="markers+text", name="greedy's one-hot picks",
                                 text=["p" * (pic.p[i] > 0.5) + "q" * (pic.q[i] > 0.5) for i in ones],
                                 textposition="top center", marker=dict(symbol="triangle-down", size=10,
                                                                       color="#111827")), row=1, col=1)
    beta, what = _beta(pos, rule)
    verdict = "accepted" if pos.accepted else "rejected"
    b_name = "h" if rule == "block" else "b"
    cmp = "<" if pos.u < pos.b else "≥"
    fig.add_trace(go.Bar(x=[pos.b], y=[""], orientation="h", marker_color="rgba(16,185,129,0.55)", width=0.6,
                         name=f"{b_name} = {pos.b:.3f}", showlegend=False,
                         hovertemplate=f"{b_name} = %{{x:.4f}}<extra></extra>"), row=2, col=1)
    fig.add_trace(go.Scatter(x=[pos.u, pos.u], y=["", ""], mode="markers", marker=dict(symbol="line-ns-open", size=28,
                                                                                        color="#111827"),
                             name=f"u = {pos.u:.3f}", showlegend=False), row=2, col=1)
    why = f"u = {pos.u:.3f} {cmp} {b_name} = {pos.b:.3f}: {verdict}"
    if rule == "block" and pos.accepted and pos.u >= pos.b:
        why += " (kept because a later position passed: block verification keeps up to the last one that does)"
    fig.update_xaxes(range=[0, 1], row=2, col=1, title_text=why)
    fig.update_xaxes(tickmode="array", tickvals=xs, ticktext=ticks, row=1, col=1)
    fig.update_yaxes(title_text="probability", row=1, col=1)
    sub = (f"{NAMES.get(rule, rule)} rule · position {pos.i} of round {rnd.index + 1} · ★ drafted"
           + (" · ⟲ the correction drawn here" if corr is not None else "")
           + f" · {what}: {beta:.3f}")
    if greedy:
        sub += ("<br>greedy decoding: the rule sees one-hot p and q (b = 1 on a match, else 0); the bars show "
                "both models' temperature-1 beliefs")
    rest = f"not shown: p {pic.rest_p:.3f}, q {pic.rest_q:.3f} of the mass" if not greedy else ""
    fig.update_layout(title=dict(text=f"{title}<br><sup>{sub}</sup>", x=0.01, xanchor="left"),
                      barmode="overlay", height=520, margin=dict(l=60, r=20, t=110, b=60),
                      legend=dict(orientation="h", y=-0.32, x=0), bargap=0.1,
                      annotations=[dict(text=rest, xref="paper", yref="paper", x=1, y=1.02, showarrow=False,
                                        xanchor="right", font=dict(size=11, color=COLORS.get("theory", "#555")))]
                      if rest else [])
    return fig
