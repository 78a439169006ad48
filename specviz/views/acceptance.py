"""The acceptance picture of one verified position: p and q as paired bars over the top tokens, their
overlap min(p, q) shaded (its mass β is the chance the rule accepts a token drawn from q there), the
distribution a correction is drawn from, the drafted token, and the uniform draw u against b.

Drawn from the trace alone (`trace.Picture`, version 3), so a recording shows it without a model.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..trace import Position, Round, Trace
from ._fmt import fsig, fsig_pair, token_label
from .figures import CLEAR, FONT_COLOR, apply_look, empty_figure

INK = FONT_COLOR  # the u mark, the greedy picks and the notes: the charts' ink (redrawn for a dark page)
from .rules import NAMES

C_P, C_Q, C_RES, C_OVER = "#2563eb", "#f59e0b", "#dc2626", "rgba(16,185,129,0.28)"

# Below this chance of a rejection at a position, no correction can happen there: the recorded "correction
# distribution" is rounding noise normalised into one (p ≈ q ≈ 1 gave a residual bar of 0.977 on the
# drafted token), or p itself where the residual's mass is exactly 0.  The picture says so instead.
NO_CORRECTION = 1e-3


def correction_possible(reject_prob: float) -> bool:
    """Whether a correction can be drawn at a position whose rejection probability is ``reject_prob``
    (the residual's mass under the token-wise rule: Σ max(0, p − q) = 1 − β; 1 − h under block
    verification; 1 − Σ p·q under exact match)."""
    return reject_prob >= NO_CORRECTION


def _label(text: str) -> str:
    """A token in the position picker and under the bars: the page's one notation (``token_label``)."""
    return token_label(text, 10)


def _beta(pos: Position, rule: str) -> tuple[float, str]:
    """(β, what it is) for the rule at this position, over the whole vocabulary."""
    if rule == "match":
        return 1.0 - pos.reject_prob, "β = Σ p·q: the chance the target's own sample equals a token drawn from q"
    if rule == "block":
        return pos.b, "h: the chance the kept prefix may end here or later (block verification)"
    return 1.0 - pos.tv, "β = Σ min(p, q) = 1 − TV(p, q): the chance a token drawn from q is accepted"


def _tries(rnd: Round) -> list[tuple[int, int]]:
    """(visit, try) of every child tried in a tree round, in the order of the walk."""
    return [(k, j) for k, vis in enumerate(rnd.tree.visits) for j in range(len(vis.tries))] if rnd.tree else []


def position_choices(rnd: Round | None) -> list[tuple[str, int]]:
    """(label, index) of what a round's picture can show: a chain round's judged positions, or every child
    a tree round's walk tried (index: their order in the walk); only those that carry a picture."""
    if rnd is None:
        return []
    if rnd.tree is not None:
        out = []
        for n, (k, j) in enumerate(_tries(rnd)):
            t = rnd.tree.visits[k].tries[j]
            if t.picture is not None:
                out.append((f"depth {k + 1}, child {j + 1}: {_label(rnd.tree.nodes[t.node].text)} · "
                            f"{'accepted' if t.accepted else 'rejected'}", n))
        return out
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
        return _tree_figure(spec, rnd, index)
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
    tag = " at temperature 1" if greedy else ""
    p_show = pic.p1 if greedy and pic.p1 is not None else pic.p
    q_show = pic.q1 if greedy and pic.q1 is not None else pic.q
    res_name = {"token": "residual norm(max(0, p − q))", "block": "residual norm(max(0, w·p − q))",
                "match": "p without the drafted token"}[rule]
    if rule == "token" and spec.settings.variant == "uno":
        res_name = "p (Decoding-UNO corrects from p)"
    beta, what = _beta(pos, rule)
    b_name = "h" if rule == "block" else "b"
    verdict = "accepted" if pos.accepted else "rejected"
    su, sb = fsig_pair(pos.u, pos.b)
    why = f"u = {su} {'<' if pos.u < pos.b else '≥'} {b_name} = {sb}: {verdict}"
    if rule == "block" and pos.accepted and pos.u >= pos.b:
        why += " (kept because a later position passed: block verification keeps up to the last one that does)"
    sub = (f"{NAMES.get(rule, rule)} rule · position {pos.i} of round {rnd.index + 1} · ◆ drafted"
           + (" · ↻ the correction drawn here" if corr is not None else "") + f" · {what}: {beta:.3f}")
    marks = None
    if greedy:
        sub += ("<br>greedy decoding: the rule sees one-hot p and q (b = 1 on a match, else 0); the bars show "
                "both models' temperature-1 beliefs")
        marks = [(i, "p" * (a > 0.5) + "q" * (b > 0.5)) for i, (a, b) in enumerate(zip(pic.p, pic.q))
                 if a > 0.5 or b > 0.5]
    rest = f"not shown: p {pic.rest_p:.3f}, q {pic.rest_q:.3f} of the mass" if not greedy else ""
    res = (f"correction drawn from: {res_name}", pic.res)
    none = ""
    if corr is None and not correction_possible(pos.reject_prob):  # nothing to draw: the bars would be noise
        res = None
        none = ("no correction can happen here<br><sup>" + _lines(
            f"the chance of a rejection is {fsig(pos.reject_prob)} (below {NO_CORRECTION:g}): there is no "
            f"{res_name} to draw from") + "</sup>")
    return _draw(title=title, sub=sub, ids=pic.ids, text=pic.text, x_tok=x_tok, corr=corr,
                 target=(f"p: target{tag}", p_show), draft=(f"q: draft{tag}", q_show),
                 res=res, u=pos.u, b=pos.b, b_name=b_name, why=why,
                 rest=rest, marks=marks, no_correction=none)


def _tree_figure(spec: Trace, rnd: Round, index: int | None) -> go.Figure:
    title = "The acceptance picture"
    tries = _tries(rnd)
    if not tries:
        return empty_figure(title, "Nothing was drafted in this round: the target sampled on its own")
    if index is None or not 0 <= int(index) < len(tries):
        index = 0
    k, j = tries[int(index)]
    vis = rnd.tree.visits[k]
    t = vis.tries[j]
    pic = t.picture
    if pic is None:
        return empty_figure(title, "This recording predates the picture's numbers (trace version 3 keeps them)")
    last_try = k == len(rnd.tree.visits) - 1 and j == len(vis.tries) - 1
    corr = rnd.extra.id if (last_try and not t.accepted and rnd.extra is not None) else None
    verdict = "accepted" if t.accepted else "rejected"
    su, sb = fsig_pair(t.u, t.b)
    why = f"u = {su} {'<' if t.u < t.b else '≥'} b = min(1, r/q) = {sb}: {verdict}"
    r_name = "p: target (r = p at the first child)" if j == 0 else (
        f"r: what the {j} earlier rejection{'s' if j > 1 else ''} left of p")
    beta = sum(min(a, b) for a, b in zip(pic.r, pic.q))
    sub = (f"token tree · depth {k + 1}, child {j + 1} tried (of {len(vis.tries)} tried here) · round {rnd.index + 1}"
           f" · ◆ this child" + (" · ↻ the correction" if corr is not None else "")
           + f" · Σ min(r, q) over the shown tokens: {beta:.3f}")
    if j:
        sub += "<br>after a rejection the rule judges the next child against r = norm(max(0, r − q)), not p"
    return _draw(title=title, sub=sub, ids=pic.ids, text=pic.text, x_tok=rnd.tree.nodes[t.node].id, corr=corr,
                 target=(r_name, pic.r), draft=("q: what this child was drawn from", pic.q),
                 res=("norm(max(0, r − q)): the next child's r, or the correction's", pic.res),
                 u=t.u, b=t.b, b_name="b", why=why, rest="", marks=None, overlap="overlap min(r, q)")


LINE = 52  # characters a subtitle line may take: the picture must read on a 400 px phone as on a desktop
# The gap between the bars and the u-vs-b bar, in px: on a phone the token labels under the bars stand upright and
# take ~8 px a character (12 px font, measured in Chromium), so the gap grows with the longest label, the figure
# with it; level labels (a desktop) take less than the GAP_PX they always had.
GAP_PX = 65
TICK_CHAR_PX = 8
ROWS_PX = 295  # the two rows' own height (bars 80 %, the u-vs-b bar 20 %)


def gap_px(ticks: list[str]) -> int:
    """The px between the bars' axis and the u-vs-b bar: room for the longest tick label drawn upright."""
    return max(GAP_PX, 24 + TICK_CHAR_PX * max((len(t) for t in ticks), default=0))


def _lines(text: str, width: int = LINE) -> str:
    """``text`` broken into lines of at most ``width`` characters, at its " · " separators where it has
    them (its own <br>s kept), inside a long piece at spaces."""
    import textwrap

    out: list[str] = []
    for para in text.split("<br>"):
        line = ""
        for piece in para.split(" · "):
            for part in textwrap.wrap(piece, width) or [piece]:
                if line and len(line) + 3 + len(part) <= width:
                    line += " · " + part
                else:
                    if line:
                        out.append(line)
                    line = part
        out.append(line)
    return "<br>".join(out)


def _draw(*, title: str, sub: str, ids: list[int], text: list[str], x_tok: int, corr: int | None,
          target: tuple[str, list[float]], draft: tuple[str, list[float]], res: tuple[str, list[float]] | None,
          u: float, b: float, b_name: str, why: str, rest: str, marks, overlap: str = "overlap min(p, q)",
          no_correction: str = "") -> go.Figure:
    """The figure: paired bars (draft, target), their overlap on top, the correction's distribution
    (or, with ``res`` None, the ``no_correction`` sentence in its place), and u against b on a [0, 1] bar."""
    xs = list(range(len(ids)))
    # legend entries wrapped: on a 400 px phone a long one ran off the card
    target, draft = (_lines(target[0], 34), target[1]), (_lines(draft[0], 34), draft[1])
    res = (_lines(res[0], 34), res[1]) if res is not None else None
    ticks = [("◆ " if t == x_tok else "") + ("↻ " if t == corr else "") + _label(txt) for t, txt in zip(ids, text)]
    gap = gap_px(ticks)
    fig = make_subplots(rows=2, cols=1, row_heights=[0.8, 0.2], vertical_spacing=gap / (ROWS_PX + gap))
    fig.add_trace(go.Bar(x=xs, y=draft[1], name=draft[0], marker_color=C_Q, offset=-0.4, width=0.25,
                         hovertemplate="q = %{y:.3g}<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Bar(x=xs, y=target[1], name=target[0], marker_color=C_P, offset=-0.14, width=0.25,
                         hovertemplate="%{y:.3g}<extra></extra>"), row=1, col=1)
    # the overlap on top of both bars: shaded, outlined, so its height min(p, q) reads across the pair
    over = [min(a, c) for a, c in zip(target[1], draft[1])]
    fig.add_trace(go.Bar(x=xs, y=over, name=overlap, offset=-0.42, width=0.56,
                         marker=dict(color=C_OVER, line=dict(color="#059669", width=2)),
                         hovertemplate="min = %{y:.3g}<extra></extra>"), row=1, col=1)
    if res is not None:
        fig.add_trace(go.Bar(x=xs, y=res[1], name=res[0], marker_color=C_RES, offset=0.16, width=0.25, opacity=0.85,
                             hovertemplate="%{y:.3g}<extra></extra>"), row=1, col=1)
    if marks:
        fig.add_trace(go.Scatter(x=[i for i, _ in marks], y=[1.02] * len(marks), mode="markers+text",
                                 name="greedy's one-hot picks", text=[m for _, m in marks], textposition="top center",
                                 marker=dict(symbol="triangle-down", size=10, color=INK)), row=1, col=1)
        fig.update_yaxes(range=[0, 1.18], row=1, col=1)  # their "pq" above the top mark, inside the plot (it was cut)
    fig.add_trace(go.Bar(x=[b], y=[""], orientation="h", marker_color="rgba(16,185,129,0.55)", width=0.6,
                         name=f"{b_name} = {fsig(b)}", showlegend=False,
                         hovertemplate=f"{b_name} = %{{x:.3g}}<extra></extra>"), row=2, col=1)
    fig.add_trace(go.Scatter(x=[u], y=[""], mode="markers", name=f"u = {fsig(u)}", showlegend=False,
                             marker=dict(symbol="line-ns-open", size=28, color=INK,
                                         line=dict(width=3, color=INK))), row=2, col=1)
    fig.update_xaxes(range=[0, 1], row=2, col=1, title_text=why)
    fig.update_xaxes(tickmode="array", tickvals=xs, ticktext=ticks, row=1, col=1)
    fig.update_yaxes(title_text="probability", row=1, col=1)
    sub_lines = _lines(sub)
    n_lines = sub_lines.count("<br>") + 1 if sub else 0
    apply_look(fig)  # transparent, the page's font colour: reads in dark mode as in light (issue 56)
    # The title and every line of the subtitle above the plot, never over its ticks or bars: 17 px a line.
    top = 66 + 17 * n_lines
    fig.update_layout(title=dict(text=f"{title}<br><sup>{sub_lines}</sup>" if sub else title, x=0.01, xanchor="left",
                                 y=1, yref="container", yanchor="top", pad=dict(t=26)),
                      barmode="overlay", height=ROWS_PX + gap + top + 60, margin=dict(l=60, r=20, t=top, b=60),
                      legend=dict(orientation="h", y=-0.32, x=0), bargap=0.1,
                      annotations=[dict(text=rest, xref="paper", yref="paper", x=1, y=1.02, showarrow=False,
                                        xanchor="right", font=dict(size=11, color=INK))]
                      if rest else [])
    if no_correction:  # where the correction's bars would be: said in the charts' ink (red was 3:1 on a dark page)
        fig.add_annotation(text=no_correction, xref="paper", yref="paper", x=0.5, y=0.55, showarrow=False,
                           xanchor="center", font=dict(size=13, color=INK), bgcolor=CLEAR,
                           name="no-correction")
    return fig
