"""The teacher's plot of one experiment's points (issue 58, 66), each experiment on its own axes with its own
reference:

* *Everyone picks γ*: speedup against γ, under Thm 3.8 at the class's measured α, c and v (the function the race
  headline uses, `trace.summary.theoretical_speedup`: v is a verify pass's cost in standard steps, which the
  textbook theorem takes as 1), and the textbook curve (v = 1) as a faint second line;
* *Make speculation lose*: speedup against α, the same two curves at the class's mean γ, and the line at 1×;
* *Find the ε where α reaches 0.95*: α against ε, and the target line α = 0.95.

Only the experiment's own points are drawn (a point keeps the experiment it was posted to); the axes fit them.
Flagged races are ringed in red; error bars: the speedup's uncertainty."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from ..serving import rooms as R
from ..serving.rooms import ROOMS
from ..trace.summary import theoretical_speedup
from ..views.figures import empty_figure, wide_layout

NO_POINTS = "No points yet: when an attendee's race ends, it appears here."
NO_EXPERIMENT = "No experiment: the attendees follow only. Pick one above to collect their races."
ALPHA_TARGET = 0.95  # the ε experiment's goal

# experiment -> (x field, x title, y field, y title)
AXES: dict[str, tuple[str, str, str, str]] = {
    "gamma": ("gamma", "γ (draft length)", "speedup", "speedup over standard decoding"),
    "lose": ("alpha", "α (acceptance rate)", "speedup", "speedup over standard decoding"),
    "epsilon": ("epsilon", "ε (over-acceptance)", "alpha", "α (acceptance rate)"),
}


def _mean(xs: list[Any]) -> float | None:
    xs = [float(x) for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def reference(values: list[dict[str, Any]]) -> dict[str, float | None]:
    """The class's measured α, γ, c and v: the means over its races (the unflagged ones, where there are any:
    a busy machine's clocks say little about a verify pass)."""
    trusted = [v for v in values if not v.get("flagged")] or values
    return {k: _mean([v.get(k) for v in trusted]) for k in ("alpha", "gamma", "c", "v")}


def _fmt(x: Any, spec: str = ".2f") -> str:
    return "–" if x is None else format(x, spec)


def quantities(p: R.Point) -> str:
    """A point by its experiment's own quantities: "γ 4 · 1.21×", "ε 0.1 · α 0.93"."""
    v = p.values
    if p.experiment == "epsilon":
        return f"ε {_fmt(v.get('epsilon'), 'g')} · α {_fmt(v.get('alpha'))}"
    if p.experiment == "lose":
        return f"γ {v['gamma']:g} · T {_fmt(v.get('temperature'), 'g')} · {v['speedup']:.2f}×"
    return f"γ {v['gamma']:g} · {v['speedup']:.2f}×"


def label(p: R.Point, who: int) -> str:
    """A point as the teacher's list names it."""
    return f"#{p.id} · attendee {who} · {quantities(p)}"


def _curve(fig: go.Figure, xs: list[float], ys: list[float | None], name: str, faint: bool) -> None:
    pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
    if not pts:
        return
    line = dict(color="#bbb", dash="dot", width=1.5) if faint else dict(color="#555", dash="dash", width=2.5)
    fig.add_trace(go.Scatter(x=[x for x, _ in pts], y=[y for _, y in pts], mode="lines", name=name, line=line,
                             hoverinfo="skip", opacity=0.8 if faint else 1.0))


def _span(xs: list[float], pad: float, lo: float | None = None, hi: float | None = None) -> list[float]:
    a, b = min(xs) - pad, max(xs) + pad
    return [a if lo is None else max(lo, a), b if hi is None else min(hi, b)]


def class_plot(room: R.Room | None, experiment: str | None = None) -> go.Figure:
    """The room's points in ``experiment`` (else the room's current one) over that experiment's reference."""
    exp = experiment or (room.experiment if room is not None else None)
    title = f"The class's races: {R.EXPERIMENTS[exp][0]}" if exp in R.EXPERIMENTS else "The class's races"
    if room is None or exp not in AXES:
        return empty_figure(title, NO_EXPERIMENT, wide=True)
    pts = ROOMS.points(room.code, exp)
    if not pts:
        return empty_figure(title, NO_POINTS, wide=True)
    xf, xtitle, yf, ytitle = AXES[exp]
    vals = [p.values for p in pts]
    keep = [(p, v) for p, v in zip(pts, vals) if v.get(xf) is not None and v.get(yf) is not None]
    xs = [float(v[xf]) for _, v in keep] or [0.0]
    ys = [float(v[yf]) for _, v in keep] or [1.0]
    ref = reference(vals)
    a, g, c, vv = ref["alpha"], ref["gamma"], ref["c"], ref["v"]
    fig = go.Figure()
    note = ""
    if exp == "epsilon":
        fig.add_hline(y=ALPHA_TARGET, line=dict(color="#2ca02c", dash="dash", width=2),
                      annotation_text=f"the target: α = {ALPHA_TARGET}", annotation_position="top left")
        note = f"the line: the target α = {ALPHA_TARGET}"
    elif c is not None:
        if exp == "gamma":
            lo, hi = max(1, int(min(xs)) - 1), int(max(xs)) + 1
            grid = [float(x) for x in range(lo, hi + 1)]
            measured = [theoretical_speedup(a, x, c, vv) for x in grid]
            textbook = [theoretical_speedup(a, x, c, 1.0) for x in grid]
            at = f"α = {_fmt(a)}, c = {_fmt(c)}"
        else:
            lo, hi = max(0.0, min(xs) - 0.05), min(0.99, max(xs) + 0.05)
            grid = [lo + (hi - lo) * i / 40 for i in range(41)]
            measured = [theoretical_speedup(x, max(g or 1.0, 1.0), c, vv) for x in grid]
            textbook = [theoretical_speedup(x, max(g or 1.0, 1.0), c, 1.0) for x in grid]
            at = f"γ = {_fmt(g, '.1f')}, c = {_fmt(c)}"
        if vv is not None:  # (the name wrapped where a phone's legend wraps it: after the theorem)
            _curve(fig, grid, measured, f"Thm 3.8 at the class's measured v = {vv:.2f}<br>({at})", faint=False)
        _curve(fig, grid, textbook, "textbook Thm 3.8 (v = 1)", faint=True)
        note = (f"the curve: Thm 3.8 at the class's measured costs (a verify pass: v = {vv:.2f} standard steps)"
                if vv is not None else "the curve: the textbook Thm 3.8 (v = 1; the races measured no v)")
        note += "; faint: the textbook v = 1" if vv is not None else ""
    errs = [(v["speedup"] * v["spread"]) if yf == "speedup" and v.get("spread") else 0.0 for _, v in keep]
    text = [f"#{p.id} · attendee {room.attendee_number(p.attendee)}<br>γ = {v['gamma']:g}, ε = "
            f"{_fmt(v.get('epsilon'), 'g')}, T = {_fmt(v.get('temperature'), 'g')}, {v.get('policy') or '–'}, "
            f"{v.get('drafter') or '–'}<br>α = {v['alpha']:.2f}, c = {_fmt(v.get('c'))}, v = {_fmt(v.get('v'))}"
            f"<br>speedup {v['speedup']:.2f}×{' · flagged' if v['flagged'] else ''}" for p, v in keep]
    fig.add_trace(go.Scatter(
        x=xs, y=ys, mode="markers", name=f"races ({len(keep)})", text=text, hovertemplate="%{text}<extra></extra>",
        error_y=dict(type="data", array=errs, visible=any(errs), thickness=1),
        marker=dict(size=11, color="#2a6fdb", opacity=0.85, line=dict(width=1, color="white"))))
    ringed = [(x, y) for x, y, (_, v) in zip(xs, ys, keep) if v["flagged"]]
    if ringed:
        fig.add_trace(go.Scatter(x=[x for x, _ in ringed], y=[y for _, y in ringed], mode="markers",
                                 name="flagged: the machine was busy", hoverinfo="skip",
                                 marker=dict(size=21, symbol="circle-open", color="#d62728", line=dict(width=2))))
    if yf == "speedup":
        fig.add_hline(y=1.0, line=dict(color="#999", width=1), annotation_text="standard decoding (1×)",
                      annotation_position="bottom right", annotation_font_size=10)
        fig.update_yaxes(rangemode="tozero")
    else:
        fig.update_yaxes(range=[max(0.0, min(ys + [ALPHA_TARGET]) - 0.05), 1.02])
    if exp == "gamma":
        fig.update_xaxes(range=_span(xs, 0.6, lo=0.4), dtick=1 if max(xs) - min(xs) <= 14 else None)
    elif exp == "epsilon":
        fig.update_xaxes(range=_span(xs, max(0.05, (max(xs) - min(xs)) * 0.1), lo=-0.01))
    else:
        fig.update_xaxes(range=_span(xs, max(0.03, (max(xs) - min(xs)) * 0.1), lo=0.0, hi=1.0))
    fig.update_xaxes(title=xtitle)
    fig.update_yaxes(title=ytitle)
    races = f"{len(keep)} race{'s' if len(keep) != 1 else ''}"
    sub = f"{races} from {room.posters(exp)} of {room.people()} attendees" + (f"; {note}" if note else "")
    return wide_layout(fig, title, sub, height=440)
