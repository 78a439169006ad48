"""Plotly figures for the theory tab: what the papers predict, next to what a run measured.

Every function returns a `go.Figure` and never raises on missing input: None,
empty lists or out-of-range numbers give a figure with an explanatory
annotation instead, so a half-filled form never breaks the page.  They are
full-width charts: the look and the wide layout are :mod:`.figures`.

Notation: p = target, q = draft (Leviathan et al.); Yin et al. swap them.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .. import theory as th
from ..theory.figures import BEST_GAMMA_MAX, best_gamma
from .figures import FONT_COLOR, NO_DATA, empty_figure, safe_figure, wide_layout

C_THEORY = "#1f77b4"
C_SECOND = "#7f7f7f"
C_OPT = "#2ca02c"
C_MEASURED = "#d62728"
C_UNO = "#ff7f0e"


# ---- helpers ---------------------------------------------------------------------------


def as_number(x: Any) -> float | None:
    """A finite float, or None (for optional fields of result dicts)."""
    if x is None or isinstance(x, bool):
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _alphas(alpha: Any) -> list[float]:
    if alpha is None:
        return []
    if isinstance(alpha, (int, float)):
        return [float(alpha)]
    return [float(a) for a in alpha if as_number(a) is not None]


# ---- Leviathan et al.: speedup, tokens per round, cost -----------------------------------


STAR_CLEAR = 0.3  # γ either side of the star where the line passes under the star, not under its label


def star_label_position(g_opt: int, gamma_max: int, line_x: float | None) -> str | None:
    """Where the optimal γ's label goes beside its star: away from the dotted mean-draft-length line at ``line_x``
    (it crossed "γ*=N: 1.03×", issue 65) and inside the plot; None where no side is clear (the subtitle names γ*).

    The label's reach is taken as on a 400 px phone, where it spans about half the plot (γ from 0.5 to
    gamma_max + 0.5): a side is clear when the label ends inside the plot and the line is not under it."""
    reach = 0.5 * gamma_max
    lo, hi = 0.5, gamma_max + 0.5
    if line_x is None:
        return "top left" if g_opt > 0.8 * gamma_max else "top center"
    right = g_opt + reach <= hi and not (g_opt + STAR_CLEAR < line_x <= g_opt + reach)
    left = g_opt - reach >= lo and not (g_opt - reach <= line_x < g_opt - STAR_CLEAR)
    if right and (line_x < g_opt or not left):
        return "top right"
    if left:
        return "top left"
    return None


def speedup_curves(
    alpha: float | None, c: float | None, gamma_max: int = 16, measured: dict | None = None, v: float = 1.0
) -> go.Figure:
    """Expected speedup (Thm 3.8) and tokens per round vs γ, the optimal γ marked.

    v: the verify pass's cost in standard steps (1: the textbook theorem); when it is not 1 the
    textbook curve is drawn dashed beside the one with v.
    measured: the last run, dict(alpha, c, gamma, speedup, draft_len[, v]) with speedup =
    speculative tok/s ÷ standard tok/s; drawn as a point next to the curve at the
    run's mean draft length ``draft_len`` (what a dynamic policy or early stops
    really drafted; γ when absent), with a dotted line there.
    When alpha or c is None the measured run's own α and c are used.
    """
    title = "Expected speedup vs draft length γ (Leviathan et al., Thm 3.8)"
    m = measured or {}
    a = as_number(alpha) if alpha is not None else as_number(m.get("alpha"))
    cc = as_number(c) if c is not None else as_number(m.get("c"))
    if a is None or cc is None:
        return empty_figure(title, f"{NO_DATA}: need α and c (run speculative decoding first)", wide=True)

    vv = as_number(v) or 1.0

    def build() -> go.Figure:
        gmax = max(1, int(gamma_max))
        sw = th.sweep_theory(a, cc, range(1, gmax + 1), v=vv)
        g_opt, s_opt = best_gamma(a, cc, vv) if gmax >= BEST_GAMMA_MAX else th.optimal_gamma(a, cc, gmax, vv)
        helps = s_opt > 1
        fig = make_subplots(specs=[[{"secondary_y": True}]])
        fig.add_trace(
            go.Scatter(
                x=sw["gamma"], y=sw["speedup"], mode="lines+markers",
                name="expected speedup" + (f" (verify = {vv:.2f} steps)" if vv != 1 else ""),
                line=dict(color=C_THEORY),
                hovertemplate="γ=%{x}<br>speedup %{y:.3f}×<extra>Thm 3.8</extra>",
            ),
            secondary_y=False,
        )
        if vv != 1:
            fig.add_trace(
                go.Scatter(
                    x=sw["gamma"], y=th.sweep_theory(a, cc, range(1, gmax + 1))["speedup"], mode="lines",
                    name="textbook (verify = 1 step)", line=dict(color=C_THEORY, dash="dash", width=1.5),
                    hovertemplate="γ=%{x}<br>speedup %{y:.3f}×<extra>Thm 3.8, textbook</extra>",
                ),
                secondary_y=False,
            )
        fig.add_trace(
            go.Scatter(
                x=sw["gamma"], y=sw["tokens_per_round"], mode="lines", name="expected tokens per round",
                line=dict(color=C_SECOND, dash="dot"),
                hovertemplate="γ=%{x}<br>%{y:.3f} tokens / round<extra>(1−α^(γ+1))/(1−α)</extra>",
            ),
            secondary_y=True,
        )
        line_x = as_number(m.get("draft_len")) if m and as_number(m.get("gamma")) is not None \
            and as_number(m.get("speedup")) is not None else None
        where = star_label_position(g_opt, gmax, line_x)
        fig.add_trace(
            go.Scatter(
                x=[g_opt], y=[s_opt], mode="markers+text" if where else "markers",
                name="optimal γ",
                marker=dict(symbol="star", size=16, color=C_OPT),
                text=[f"γ*={g_opt}: {s_opt:.2f}×"] if where else None, cliponaxis=False,
                textposition=where or None,
                hovertemplate="optimal γ*=%{x}<br>%{y:.3f}×<extra></extra>",
            ),
            secondary_y=False,
        )
        fig.add_hline(y=1.0, line=dict(color=FONT_COLOR, width=1, dash="dash"),
                      annotation_text="no speedup", annotation_position="bottom right")
        if m and as_number(m.get("gamma")) is not None and as_number(m.get("speedup")) is not None:
            mg, ms = as_number(m["gamma"]), as_number(m["speedup"])
            ma, mc = as_number(m.get("alpha")), as_number(m.get("c"))
            md = as_number(m.get("draft_len"))
            mx = md if md is not None else mg
            mv = as_number(m.get("v"))
            pred = th.expected_speedup(ma, int(mg), mc, mv or 1.0) if (ma is not None and mc is not None and mg >= 0) else None
            hover = f"measured run<br>γ={mg:g}"
            if md is not None:
                hover += f", mean draft length {md:.2f}"
                fig.add_vline(x=md, line=dict(color=C_MEASURED, width=1, dash="dot"),
                              annotation_text=f"mean draft<br>length {md:.2f}", annotation_position="top right")
            hover += f"<br>speedup {ms:.3f}×"
            if ma is not None:
                hover += f"<br>α={ma:.3f}"
            if mc is not None:
                hover += f"<br>c={mc:.3f}"
            if mv is not None:
                hover += f"<br>verify pass = {mv:.2f} standard steps"
            if pred is not None:
                hover += f"<br>Thm 3.8 at γ={mg:g}, this α, c{', v' if mv else ''}: {pred:.3f}×"
            fig.add_trace(
                go.Scatter(
                    x=[mx], y=[ms], mode="markers",
                    name=("count-based (the race's clocks were flagged)" if m.get("by") == "counts"
                          else "measured (spec ÷ standard tok/s)"),
                    marker=dict(symbol="diamond", size=13, color=C_MEASURED),
                    hovertemplate=hover + "<extra></extra>",
                ),
                secondary_y=False,
            )
        sub = f"α = {a:.3f}, c = {cc:.3f}" + (f", verify = {vv:.2f} steps" if vv != 1 else "")
        sub += f"; optimal γ* = {g_opt} ({s_opt:.2f}×)"
        if not helps:
            sub += " — no γ helps: plain decoding is faster" + (" (α ≤ c)" if vv == 1 else "")
        wide_layout(fig, title, sub, height=430)
        # A fixed range: the marker labels and the mean-draft-length line must not stretch the axis.
        fig.update_xaxes(title_text="draft length γ", dtick=1 if gmax <= 20 else None, range=[0.5, gmax + 0.5])
        fig.update_yaxes(title_text="expected speedup (×)", secondary_y=False)
        fig.update_yaxes(title_text="expected tokens per round", secondary_y=True, showgrid=False)
        return fig

    return safe_figure(title, build)


def tokens_per_round_curves(alpha: float | Sequence[float] | None, gamma_max: int = 16,
                            rules: dict[str, Any] | None = None) -> go.Figure:
    """Expected tokens per round (1 − α^(γ+1))/(1 − α) vs γ, one curve per α,
    with the γ → ∞ limit 1/(1 − α) dotted.

    ``rules``: the last run's same-draft expectations (`specviz.views.rules.run_rule_expectations`):
    {"draft_len": mean draft length, "tokens": {rule: expected tokens per round}, "rule": the rule it ran}.
    Block verification has no closed form in α alone (its gain depends on the whole block's p and q),
    so each rule is drawn as a measured marker at the run's mean draft length."""
    title = "Expected tokens per round vs γ (Leviathan et al., Eq. 1)"
    alphas = _alphas(alpha)
    if not alphas:
        return empty_figure(title, f"{NO_DATA}: give one or more values of α", wide=True)

    def build() -> go.Figure:
        gmax = max(1, int(gamma_max))
        gs = list(range(0, gmax + 1))
        fig = go.Figure()
        for a in alphas:
            ys = [th.expected_tokens_per_round(a, g) for g in gs]
            fig.add_trace(go.Scatter(
                x=gs, y=ys, mode="lines+markers", name=f"α = {a:.2f}",
                hovertemplate=f"α={a:.2f}<br>γ=%{{x}}<br>%{{y:.3f}} tokens / round<extra></extra>",
            ))
            if a < 1:
                fig.add_trace(go.Scatter(
                    x=[0, gmax], y=[1 / (1 - a)] * 2, mode="lines", name=f"limit 1/(1−α) = {1 / (1 - a):.2f}",
                    line=dict(dash="dot", width=1, color=C_SECOND), showlegend=len(alphas) == 1,
                    hovertemplate=f"γ→∞ limit for α={a:.2f}: %{{y:.3f}}<extra></extra>",
                ))
        sub = "i.i.d. acceptances with probability α; a round emits the accepted drafts + 1 token"
        if rules:
            for (rule, value), symbol in zip(rules["tokens"].items(), ("circle", "diamond", "x")):
                ran = " (the rule it ran)" if rule == rules.get("rule") else ""
                fig.add_trace(go.Scatter(
                    x=[rules["draft_len"]], y=[value], mode="markers", marker=dict(size=12, symbol=symbol),
                    name=f"last run's drafts, {rule}: {value:.2f}{ran}",
                    hovertemplate=(f"{rule} rule on the last run's own drafts{ran}<br>mean draft length %{{x:.2f}}"
                                   f"<br>%{{y:.3f}} expected tokens / round<extra></extra>")))
            sub += ("<br>markers: each rule's exact expectation on the last run's drafts (block verification has "
                    "no closed form in α)")
        wide_layout(fig, title, sub, height=400)
        fig.update_xaxes(title_text="draft length γ")
        fig.update_yaxes(title_text="expected tokens per round")
        return fig

    return safe_figure(title, build)


def cost_factor_curve(alpha: float | None, c_hat: float | None, gamma_max: int = 16) -> go.Figure:
    """Arithmetic-operations factor (1 − α)(γĉ + γ + 1)/(1 − α^(γ+1)) vs γ (Thm 3.11)."""
    title = "Extra arithmetic vs γ (Leviathan et al., Thm 3.11)"
    a, ch = as_number(alpha), as_number(c_hat)
    if a is None or ch is None:
        return empty_figure(title, f"{NO_DATA}: need α and ĉ", wide=True)

    def build() -> go.Figure:
        gs = list(range(1, max(1, int(gamma_max)) + 1))
        ys = [th.arithmetic_cost_factor(a, g, ch) for g in gs]
        fig = go.Figure(go.Scatter(
            x=gs, y=ys, mode="lines+markers", name="operations factor", line=dict(color=C_UNO),
            hovertemplate="γ=%{x}<br>%{y:.3f}× the operations of plain decoding<extra>Thm 3.11</extra>",
        ))
        fig.add_hline(y=1.0, line=dict(color=FONT_COLOR, width=1, dash="dash"),
                      annotation_text="plain decoding", annotation_position="bottom right")
        wide_layout(fig, title, f"α = {a:.3f}, ĉ = {ch:.3f} (draft ops / target ops per token)", height=400)
        fig.update_xaxes(title_text="draft length γ")
        fig.update_yaxes(title_text="total arithmetic operations (×)", rangemode="tozero")
        return fig

    return safe_figure(title, build)


# ---- Yin et al. Thm 1 ---------------------------------------------------------------------


def theorem1_plot(trace: Any) -> go.Figure:
    """Running Σ TV(p, q) (expected rejections, Yin et al. Thm 1) vs the running
    count of actual rejections, along the run, with the y = x reference and a
    ±2 s.d. band (the count is a sum of Bernoulli(r_n) draws)."""
    title = "Rejections vs Σ TV(p, q) along the run (Yin et al., Thm 1)"
    try:
        s = th.theorem1_series(trace)
    except (AttributeError, TypeError, ValueError) as exc:
        return empty_figure(title, f"{NO_DATA}: {exc}", wide=True)
    if not s.index:
        return empty_figure(title, f"{NO_DATA}: run speculative decoding (with statistics) to see this", wide=True)

    def build() -> go.Figure:
        eps = trace.settings.epsilon if trace is not None else 0.0
        top = max(s.cum_tv[-1], s.cum_rejections[-1], s.cum_reject_prob[-1], 1e-9) * 1.05
        fig = go.Figure()
        # The band is drawn around the rejection probability actually in force
        # (Σ r = Σ TV at ε = 0).
        upper = [r + 2 * math.sqrt(v) for r, v in zip(s.cum_reject_prob, s.cum_var)]
        lower = [max(0.0, r - 2 * math.sqrt(v)) for r, v in zip(s.cum_reject_prob, s.cum_var)]
        fig.add_trace(go.Scatter(
            x=s.cum_tv + s.cum_tv[::-1], y=upper + lower[::-1], fill="toself", mode="lines",
            line=dict(width=0), fillcolor="rgba(31,119,180,0.12)", name="±2 s.d.", hoverinfo="skip",
        ))
        fig.add_trace(go.Scatter(
            x=[0, top], y=[0, top], mode="lines", name="y = x (Thm 1)",
            line=dict(color=FONT_COLOR, dash="dash", width=1), hoverinfo="skip",
        ))
        if eps > 0:
            fig.add_trace(go.Scatter(
                x=s.cum_tv, y=s.cum_reject_prob, mode="lines", name="Σ r (expected at this ε)",
                line=dict(color=C_UNO, dash="dot"),
                hovertemplate="Σ TV %{x:.2f}<br>Σ r %{y:.2f}<extra></extra>",
            ))
        fig.add_trace(go.Scatter(
            x=s.cum_tv, y=s.cum_rejections, mode="lines+markers", name="actual rejections",
            line=dict(color=C_MEASURED, shape="hv"), marker=dict(size=4), customdata=s.index,
            hovertemplate="token %{customdata}<br>Σ TV %{x:.2f}<br>rejections %{y}<extra></extra>",
        ))
        sub = (f"{len(s.index)} verified positions: Σ TV = {s.cum_tv[-1]:.2f} expected, "
               f"{s.cum_rejections[-1]} actual rejections")
        if eps > 0:
            sub += f"<br>ε = {eps:g} > 0: fewer rejections than Σ TV are expected (Σ r = {s.cum_reject_prob[-1]:.2f})"
        wide_layout(fig, title, sub, height=450)
        fig.update_xaxes(title_text="running Σ TV(p_n, q_n) over verified positions", range=[0, top])
        fig.update_yaxes(title_text="running number of rejections", range=[0, top])
        return fig

    return safe_figure(title, build)


# ---- Yin et al. Thms 4–5: Pareto front --------------------------------------------------------


PARETO_MARKER = 10  # px
# The plot area of the Pareto chart on a 400 px phone, where its labels are most crowded (px, measured in Chromium):
# wider screens only spread the points apart, the labels keep their size.
PHONE_PLOT = (170.0, 250.0)
LABEL_CHAR_PX, LABEL_LINE_PX = 7.0, 15.0  # a label's character and line at the 12 px font
LABEL_POSITIONS = ("top right", "middle right", "bottom right", "top left", "middle left", "bottom left",
                   "top center", "bottom center")
SAME_PLACE_PX = 30.0  # two points of the same label closer than this share one label
# px a label may run past the plot's right edge: into the figure's right margin (80 px, empty: the legend is below);
# never past the other edges (the ticks, and the title above).
RIGHT_ROOM = 40.0


def _eps_label(d: dict) -> str:
    return str(d.get("label") if d.get("label") is not None else f"ε={as_number(d.get('epsilon')) or 0:g}")


def label_box(x: float, y: float, text: str, where: str, marker: float = PARETO_MARKER) -> tuple[float, ...]:
    """(left, bottom, right, top) in px (y up) of plotly's label at ``where`` beside a marker at (x, y) px."""
    w, h = LABEL_CHAR_PX * len(text), LABEL_LINE_PX
    d = marker / 2 / 0.8 + 1  # plotly's offset from a marker's centre (Drawing.textPointPosition)
    v, hz = where.split()
    left = {"right": x + d, "left": x - d - w, "center": x - w / 2}[hz]
    bottom = {"top": y + d, "bottom": y - d - h, "middle": y - h / 2}[v]
    return left, bottom, left + w, bottom + h


def _overlap(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))


def place_labels(points: list[tuple[float, float, str]], axis: tuple[float, float], front: float | None,
                 plot: tuple[float, float] = PHONE_PLOT) -> list[str | None]:
    """A textposition for each (x, y, label) point of the Pareto chart (both axes spanning ``axis``), or None for
    a point whose label a point next to it carries (OPT and UNO at one ε).  Greedy, from the top point down: the
    first position whose label box, on a plot of ``plot`` px, stays inside the plot (or the right margin's first
    RIGHT_ROOM px) and clear of the markers, the front x + y = ``front`` and the labels already placed; else the
    one that overlaps least."""
    lo, span = axis[0], axis[1] - axis[0]
    px = [((x - lo) / span * plot[0], (y - lo) / span * plot[1], t) for x, y, t in points]
    r = PARETO_MARKER / 2 + 1
    taken = [(x - r, y - r, x + r, y + r) for x, y, _ in px]
    line = []
    if front is not None:
        def at(x: float, y: float) -> tuple[float, float]:
            return (x - lo) / span * plot[0], (y - lo) / span * plot[1]
        a, b = at(0, front), at(front, 0)
        line = [(a[0] + (b[0] - a[0]) * k / 60, a[1] + (b[1] - a[1]) * k / 60) for k in range(61)]
    out: list[str | None] = [None] * len(px)
    order = sorted(range(len(px)), key=lambda i: -px[i][1])  # a pair's upper point carries the label
    carried: list[int] = []
    for i in order:
        x, y, text = px[i]
        if any(px[j][2] == text and math.dist(px[j][:2], (x, y)) < SAME_PLACE_PX for j in carried):
            continue
        best, cost = None, math.inf
        for where in LABEL_POSITIONS:
            box = label_box(x, y, text, where)
            c = sum(_overlap(box, t) for t in taken)
            c += sum(100.0 for lx, ly in line if box[0] <= lx <= box[2] and box[1] <= ly <= box[3])
            c += 1000.0 * (max(0.0, -box[0]) + max(0.0, box[2] - plot[0] - RIGHT_ROOM) + max(0.0, -box[1])
                           + max(0.0, box[3] - plot[1]))
            if c < cost:
                best, cost = where, c
            if c == 0:
                break
        out[i] = best
        taken.append(label_box(x, y, text, best))
        carried.append(i)
    return out


def pareto_plot(tv: float | None, points: Iterable[dict] | None) -> go.Figure:
    """The rejection/bias trade-off: the Pareto line from (0, TV) to (TV, 0)
    (Yin et al. Thms 4–5) and measured points dict(label or epsilon, variant
    "opt"/"uno", reject_prob, bias[, tv]).

    Points that carry their own ``tv`` (a run's mean TV(p, q) over the very positions its rejection and bias
    were measured on) are drawn as fractions of it, against the front x + y = 1: runs at different ε visit
    different positions, so one TV for all of them put exact points inside the shade (issue 56)."""
    title = "Rejection probability vs bias (Yin et al., Thms 4–5)"
    pts = [d for d in (points or []) if isinstance(d, dict)
           and as_number(d.get("reject_prob")) is not None and as_number(d.get("bias")) is not None]
    t = as_number(tv)
    if t is None and not pts:
        return empty_figure(title, f"{NO_DATA}: need TV(p, q) or measured points", wide=True)
    own = bool(pts) and all((as_number(d.get("tv")) or 0) > 0 for d in pts)

    def build() -> go.Figure:
        fig = go.Figure()
        scale = (lambda d: float(d["tv"])) if own else (lambda d: 1.0)  # noqa: E731
        front = 1.0 if own else t
        if front is not None:
            xs, ys = th.pareto_front(front)
            fig.add_trace(go.Scatter(
                x=xs, y=ys, mode="lines", name="Pareto front: rejection + bias = TV",
                line=dict(color=FONT_COLOR), fill="tozeroy", fillcolor="rgba(128,128,128,0.10)",
                hovertemplate="reject %{x:.3f}<br>bias %{y:.3f}<extra>front</extra>",
            ))
        groups = []
        for variant, color, symbol in (("opt", C_OPT, "circle"), ("uno", C_UNO, "square")):
            grp = [d for d in pts if str(d.get("variant", "opt")).lower() == variant]
            if grp:
                groups.append((variant, color, symbol, grp, [float(d["reject_prob"]) / scale(d) for d in grp],
                               [float(d["bias"]) / scale(d) for d in grp]))
        top = max([0.0, *(v for g in groups for v in g[4] + g[5])])
        hi = max(top, front or 0.0) * 1.18 + 0.02
        # The ε labels placed once for the whole chart: clear of each other, of the markers and of the front, inside
        # the plot (they overlapped, "ε=0.2ε=0.2", and ran off its edge on a phone: issue 65).
        labelled = [(x, y, _eps_label(d)) for g in groups for d, x, y in zip(g[3], g[4], g[5])]
        places = iter(place_labels(labelled, (-0.02 * hi, hi), front))
        for variant, color, symbol, grp, xs, ys in groups:
            labels = [_eps_label(d) for d in grp]
            where = [next(places) for _ in grp]
            fig.add_trace(go.Scatter(
                x=xs, y=ys, mode="markers+text", text=[lab if w else "" for lab, w in zip(labels, where)],
                textposition=[w or "top center" for w in where], cliponaxis=False, hovertext=labels,
                name=f"Decoding-{variant.upper()}", marker=dict(color=color, size=PARETO_MARKER, symbol=symbol),
                customdata=[[float(d["reject_prob"]), float(d["bias"]), scale(d)] for d in grp],
                hovertemplate="%{hovertext}<br>P(reject) %{customdata[0]:.3f}<br>bias TV(A, p) %{customdata[1]:.3f}"
                              + ("<br>TV(p, q) of its positions %{customdata[2]:.3f}" if own else "")
                              + "<extra>" + variant.upper() + "</extra>",
            ))
        if own:
            tvs = [float(d["tv"]) for d in pts]
            sub = (f"each ε's run over its own positions, as fractions of their mean TV(p, q) "
                   f"({min(tvs):.3f}–{max(tvs):.3f})<br>OPT lands on the front r + bias = TV; UNO above it; "
                   "the shade below is what no rejection-based rule reaches")
        else:
            sub = "shaded: below the front, no rejection-based rule can reach"
            if t is not None:
                sub = f"TV(p, q) = {t:.3f}; " + sub
        wide_layout(fig, title, sub, height=470)
        fig.update_xaxes(title_text="rejection r ÷ TV(p, q)" if own else "rejection probability r = 1 − Σ q·b",
                         range=[-0.02 * hi, hi])
        fig.update_yaxes(title_text="bias TV(A, p) ÷ TV(p, q)" if own else "bias TV(A, p)", range=[-0.02 * hi, hi])
        return fig

    return safe_figure(title, build)


# ---- Yin et al. Thm 3: batch drafts -------------------------------------------------------------


def batch_plot(p: Any, q: Any, M_max: int = 16, n_mc: int = 20_000, seed: int = 0) -> go.Figure:
    """P(all M drafts rejected at one position) vs M: the exact recursion
    Π TV(q, r_{m−1}) and Monte Carlo of the batch procedure (±2 s.e.)."""
    title = "Batch drafting: P(all M drafts rejected) vs M (Yin et al., Thm 3)"
    if p is None or q is None:
        return empty_figure(title, f"{NO_DATA}: need target and draft distributions p and q", wide=True)

    def build() -> go.Figure:
        m_max = max(1, int(M_max))
        exact = th.batch_rejection_exact(p, q, m_max)
        floor = th.batch_rejection_floor(p, q)
        ms = list(range(1, m_max + 1))
        fig = go.Figure()
        fig.add_trace(go.Scatter(
            x=ms, y=exact, mode="lines", name="exact: Π TV(q, r<sub>m−1</sub>)", line=dict(color=C_THEORY),
            hovertemplate="M=%{x}<br>P(all rejected) %{y:.4f}<extra>exact</extra>",
        ))
        n = int(n_mc)
        if n > 0:
            mc, se = th.batch_rejection_mc(p, q, m_max, n, int(seed))
            fig.add_trace(go.Scatter(
                x=ms, y=mc, mode="markers", name=f"Monte Carlo ({n:,} runs)",
                marker=dict(color=C_MEASURED, size=8), error_y=dict(type="data", array=[2 * s for s in se], visible=True),
                hovertemplate="M=%{x}<br>fraction %{y:.4f}<extra>Monte Carlo</extra>",
            ))
        fig.add_hline(y=floor, line=dict(color=C_SECOND, dash="dot"),
                      annotation_text=f"floor: p-mass where q = 0 ({floor:.3f})", annotation_position="top right")
        # broken by hand (wrap_html leaves a line with markup in it whole): it ran off a 400 px phone's chart
        sub = ("line: exact, M i.i.d. drafts from q checked<br>in turn against r<sub>0</sub> = p,<br>"
               "r<sub>m</sub> = norm(max(0, r<sub>m−1</sub> − q))"
               f"<br>dots: Monte Carlo of the procedure,<br>{n:,} runs, seed {int(seed)}, ±2 s.e.")
        wide_layout(fig, title, sub, height=450)
        fig.update_xaxes(title_text="number of drafts M", dtick=1 if m_max <= 20 else None)
        fig.update_yaxes(title_text="P(all M drafts rejected)", range=[0, max(exact[0], 0.05) * 1.1])
        return fig

    return safe_figure(title, build)
