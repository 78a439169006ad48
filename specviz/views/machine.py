"""The "This machine" panel: the target's measured verify-cost curves, and what they mean here.

The execution probe (:mod:`specviz.hardware.probe`) times the target's forward over k new tokens,
T(k), in each execution this machine offers, and chooses the one with the fastest predicted
speculative rate.  This module draws those curves (the chosen one marked, the draft's one-token
step and the flat "memory-bound" reference beside them), writes what they mean with this machine's
own numbers, and loads the curves recorded on other machines (``assets/hardware/*.json``: a probe's
``as_dict()`` plus "draft", "target" and "note") to compare with.

Every function takes plain data (a Probe or None) and never raises on missing parts: a machine with
no probe gets a sentence saying so, and the recorded curves still show.
"""

from __future__ import annotations

import json
import logging
import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import plotly.graph_objects as go

from ..hardware.curves import interpolate
from ..hardware.probe import PREFIX, Probe
from ._fmt import COLORS
from .execution import short_machine
from .figures import FONT_COLOR, compact_layout, empty_figure

log = logging.getLogger("specviz.views")
HARDWARE_DIR = Path(__file__).resolve().parent.parent.parent / "assets" / "hardware"
TITLE = "Verify time vs tokens fed"
SUB_WRAP = 48  # characters a subtitle line holds at 400 px
DEFAULT_GAMMA = 5  # the page's default draft length: a verify pass feeds γ + 1 = 6 tokens
LOG_SCALE_RATIO = 8.0  # curves whose one-token steps differ more than this (a GPU beside a CPU): log axis

# One colour per execution, whichever machine ran it (recorded curves are dashed, fainter).
EXEC_COLORS = {
    "bf16": COLORS["target"],  # violet
    "fp32": "#64748b",  # slate
    "int8": COLORS["speculative"],  # teal
    "fp16": COLORS["bonus"],  # blue
    "bf16+graphs": "#db2777",  # pink
    "fp16+graphs": COLORS["correction"],  # orange
}
DRAFT_COLOR = COLORS["draft_time"]  # amber, as the draft's time in the run's plots
OTHER_COLOR = "#9ca3af"


# ---- the recorded machines ------------------------------------------------------------------


@dataclass(frozen=True)
class RecordedMachine:
    """Curves measured on another machine and shipped with the app."""

    key: str  # the file's stem: the value the page's "Compare with" sends
    name: str  # short, for the choice: "AVX2 EPYC"
    label: str  # the machine's full label
    note: str  # how the figures were obtained
    probe: Probe
    target: str = ""
    draft: str = ""
    reference: str = ""  # another program's curves (llama.cpp), not a specviz probe's

    @property
    def choice_label(self) -> str:
        if self.reference:  # another program: which machine it ran on is the part to tell apart
            return f"{self.name} on {short_name(self.probe.machine)} (recorded)"
        return f"{self.name} (recorded)"


_FAMILIES = ("Xeon", "EPYC", "Ryzen", "Threadripper", "Core", "Graviton", "Neoverse", "Apple")


def short_name(machine: dict) -> str:
    """A machine in two or three words: "AMX Xeon", "AVX2 EPYC", a GPU's name."""
    name = str(machine.get("name") or machine.get("label") or "a machine")
    if machine.get("kind") == "cuda":
        return name.replace("NVIDIA ", "")
    isa = set(machine.get("isa") or ())
    feature = next((words for flag, words in (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16"),
                                              ("avx512f", "AVX-512"), ("avx2", "AVX2")) if flag in isa), "")
    clean = name.replace("(R)", "").replace("(TM)", "").replace("(tm)", "")
    family = next((f for f in _FAMILIES if f.lower() in clean.lower()), " ".join(clean.split()[:2]))
    return f"{feature} {family}".strip()


def recorded_machine(doc: dict, key: str) -> RecordedMachine:
    """One recorded file's contents (ValueError/TypeError/KeyError when it is not a probe recording).
    Only "machine" and "curves" are needed: a recording made from runs rather than by the probe may
    name no acceptance α, no choice (then its first curve) and no draft step."""
    curves = doc.get("curves")
    if not isinstance(curves, dict) or not curves:
        raise ValueError("no curves")
    defaults = {"model": doc.get("target") or key, "draft_ms": None, "alpha": None, "choice": next(iter(curves))}
    probe = Probe.from_dict({**defaults, **doc})
    if not isinstance(probe.machine, dict) or not probe.curves:
        raise ValueError("no machine or no curves")
    label = str(probe.machine.get("label") or probe.machine.get("name") or key)
    name = str(doc.get("name") or short_name(probe.machine))
    return RecordedMachine(key, name, label, str(doc.get("note") or ""), probe, str(doc.get("target") or ""),
                           str(doc.get("draft") or ""), str(doc.get("reference") or ""))


def load_recorded(folder: Path | None = None) -> list[RecordedMachine]:
    """Every readable ``*.json`` recording in ``folder`` (default: assets/hardware), by file name; an
    unreadable file is skipped with a warning, a missing folder gives none.  The folder also holds
    the bench's and the fidelity check's results (JSON objects without "curves"): those are other
    files, not broken recordings, and are passed over without a word."""
    folder = HARDWARE_DIR if folder is None else Path(folder)
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(doc, dict) and "curves" not in doc:
                continue
            out.append(recorded_machine(doc, path.stem))
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            log.warning("hardware recording %s not shown: %s", path.name, exc)
    return out


# ---- numbers from a probe -------------------------------------------------------------------


def probe_gamma(probe: Probe) -> int:
    """The draft length the chosen execution's prediction runs at (DEFAULT_GAMMA without one)."""
    g = (probe.predicted.get(probe.choice) or {}).get("gamma")
    return int(g) if isinstance(g, (int, float)) and g >= 1 else DEFAULT_GAMMA


def verify_factor(curve: dict[int, float], k: int) -> float | None:
    """T(k) / T(1) from a curve of at least two points (one point says nothing about the slope)."""
    if len(curve) < 2 or 1 not in curve or curve[1] <= 0:
        return None
    return interpolate(curve, k) / curve[1]


def draft_ratio(probe: Probe) -> float | None:
    """c: the draft's one-token step over the chosen execution's."""
    curve = probe.curves.get(probe.choice) or {}
    if probe.draft_ms is None or not curve.get(1):
        return None
    return probe.draft_ms / curve[1]


# ---- the figure -----------------------------------------------------------------------------


def _span(curves: Iterable[dict[int, float]]) -> tuple[float, float]:
    ks = [k for c in curves for k in c]
    return (min(ks), max(ks)) if ks else (1, 8)


def _hover_note(text: str, width: int = 60) -> str:
    """A note wrapped for a hover label (plotly's hover text does not wrap by itself)."""
    words, lines, line = text.split(), [], ""
    for w in words:
        if line and len(line) + len(w) + 1 > width:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}".strip()
    return "<br>".join(lines + ([line] if line else []))


RECORDED_STYLES = (("dash", "circle-open"), ("dashdot", "square-open"), ("longdash", "diamond-open"),
                   ("longdashdot", "triangle-up-open"))


def _curve_trace(execution: str, curve: dict[int, float], *, name: str, chosen: bool = False,
                 recorded: str = "", note: str = "", style: int = 0) -> go.Scatter:
    ks = sorted(curve)
    t1 = curve.get(1)
    factors = [curve[k] / t1 if t1 else None for k in ks]
    color = EXEC_COLORS.get(execution, OTHER_COLOR)
    where = f"{recorded} (recorded)" if recorded else "this machine"
    extra = f"<br>{_hover_note(note)}" if note else ""
    dash, symbol = RECORDED_STYLES[style % len(RECORDED_STYLES)] if recorded else ("solid", "circle")
    width = (3 if chosen else 1.5) if recorded else (5 if chosen else 2)
    return go.Scatter(
        name=name, x=ks, y=[curve[k] for k in ks], mode="lines+markers",
        line=dict(color=color, width=width, dash=dash),
        marker=dict(size=10 if chosen and not recorded else 7, color=color, symbol=symbol),
        opacity=0.65 if recorded else 1.0, legendgroup=recorded or "here",
        customdata=factors,
        hovertemplate=(f"{execution} on {where}<br>k = %{{x}} tokens: %{{y:.1f}} ms"
                       f" = %{{customdata:.2f}} × T(1){extra}<extra></extra>"),
        meta={"execution": execution, "chosen": chosen, "recorded": recorded},
    )


def bound_line(probe: Probe) -> tuple[float, str] | None:
    """(ms, words): the time the chosen execution's weights take to stream at the copy bandwidth
    (:mod:`specviz.hardware.roofline`), or None where the probe did not measure them."""
    mb = probe.step_mb.get(probe.choice)
    ms = probe.bound_ms(mb)
    if ms is None:
        return None
    return ms, f"its weights ({mb:,.0f} MB a step) at the copy bandwidth ({probe.copy_gbps:.1f} GB/s)"


def roofline_trace(probe: Probe, lo: float, hi: float) -> go.Scatter | None:
    """The chosen execution's roofline over k in [lo, hi] (:func:`specviz.hardware.roofline.probe_roofline`):
    max(its bandwidth bound, k × a token's multiply-adds at the CPU's int8 peak), flat to its knee, then climbing;
    the flat bandwidth bound alone where no peak applies (a float execution, no peak measured); None without either."""
    from ..hardware.peak import words as isa_words
    from ..hardware.roofline import probe_roofline

    roof = probe_roofline(probe)
    bound = bound_line(probe)
    if roof is None or bound is None:
        return None
    ms, words = bound
    knee = roof.knee()
    if roof.token_ms is None or knee is None:
        return go.Scatter(name=f"bandwidth bound of {probe.choice}: {words}", x=[lo, hi], y=[ms, ms], mode="lines",
                          line=dict(color=FONT_COLOR, width=1, dash="dash"),
                          hovertemplate=f"{ms:.1f} ms: {words}<extra></extra>", meta={"reference": "bound"})
    xs = sorted({lo, hi} | ({knee} if lo < knee < hi else set()))
    gmac = (roof.macs or 0) / 1e9
    compute = f"k × {gmac:.2f} G multiply-adds at the int8 peak ({roof.gmacs:,.0f} GMAC/s, {isa_words(roof.isa)})"
    return go.Scatter(
        name=(f"roofline of {probe.choice}: max({probe.step_mb[probe.choice]:,.0f} MB at {probe.copy_gbps:.1f} GB/s, "
              f"k × {gmac:.2f} GMAC at {roof.gmacs:,.0f} GMAC/s)"), x=xs, y=[roof.at(k) for k in xs],
        mode="lines", line=dict(color=FONT_COLOR, width=1.5, dash="dash"),
        hovertemplate=(f"k = %{{x:.1f}}: %{{y:.1f}} ms, the roofline: the larger of<br>{ms:.1f} ms, {words},<br>"
                       f"and {roof.token_ms:.2f} ms a token, {compute}<extra></extra>"),
        meta={"reference": "roofline", "bandwidth_ms": ms, "token_ms": roof.token_ms, "knee": knee, "isa": roof.isa})


def verify_cost_figure(probe: Probe | None, recorded: Sequence[RecordedMachine] = (), *,
                       target: str = "") -> go.Figure:
    """T(k) in ms against the k tokens fed, for each execution this machine's probe measured (the
    chosen one thick and labelled "chosen"), the chosen one-token step T(1) as a dashed flat line
    (a memory-bound verify pass would stay on it), its roofline dashed (where measured: the bandwidth bound, and
    for int8 k × a token's multiply-adds at the CPU's int8 peak beyond the knee),
    the draft's one-token step with c = t_draft / T(1)
    beside it, and the ``recorded`` machines' curves, dashed, to compare with."""
    here = probe is not None and bool(probe.curves)
    if not here and not recorded:
        return empty_figure(TITLE, "Not measured on this machine, and no recorded machine to compare with")
    fig = go.Figure()
    curves_drawn: list[dict[int, float]] = []
    if here:
        for execution, curve in probe.curves.items():
            if not curve:
                continue
            chosen = execution == probe.choice
            only_step = " (one-token step only: could not win)" if len(curve) < 2 else ""
            fig.add_trace(_curve_trace(execution, curve, name=f"{execution}{' (chosen)' if chosen else ''}{only_step}",
                                       chosen=chosen))
            curves_drawn.append(curve)
        one = (probe.one_thread or {}).get("curve")
        if one:  # what a race on a busy machine runs with (hardware.load): a dotted twin of the chosen curve
            trace = _curve_trace(probe.choice, one, name=f"{probe.choice} on one thread (a busy machine's races)")
            trace.line.dash, trace.marker.symbol = "dot", "circle-open"
            trace.meta = {"one_thread": probe.choice, "threads": 1}
            trace.hovertemplate = trace.hovertemplate.replace("on this machine", "on this machine, one thread")
            fig.add_trace(trace)
            curves_drawn.append(one)
    for i, rec in enumerate(recorded):
        for execution, curve in rec.probe.curves.items():
            if not curve:
                continue
            mine = execution == rec.probe.choice
            name = (f"{execution} · {short_name(rec.probe.machine)} (recorded)" if rec.reference else
                    f"{execution} · {rec.name} (recorded{', its choice' if mine else ''})")
            fig.add_trace(_curve_trace(execution, curve, name=name, recorded=rec.name, note=rec.note, chosen=mine,
                                       style=i))
            curves_drawn.append(curve)
    lo, hi = _span(curves_drawn)
    annotations = []
    if here:
        t1 = (probe.curves.get(probe.choice) or {}).get(1)
        if t1:
            fig.add_trace(go.Scatter(
                name=f"T(1) of {probe.choice}, flat: a memory-bound verify pass",
                x=[lo, hi], y=[t1, t1], mode="lines", line=dict(color=FONT_COLOR, width=1.5, dash="dot"),
                hovertemplate=f"T(1) = {t1:.1f} ms: the cost of one token; flat = memory-bound<extra></extra>",
                meta={"reference": "step"}))
            # Labelled at the right edge, outside the plot: above the line (the draft's label goes below its own).
            annotations.append(dict(x=1.0, y=t1, xref="paper", yref="y", xanchor="left", yanchor="bottom",
                                    showarrow=False, text=f"T(1), {probe.choice}",
                                    font=dict(size=12, color=FONT_COLOR)))
        roof = roofline_trace(probe, lo, hi)
        if roof is not None:  # named in the legend only: a label at the edge would sit on T(1)'s and the draft's
            fig.add_trace(roof)
        c = draft_ratio(probe)
        if probe.draft_ms is not None:
            fig.add_trace(go.Scatter(
                name=f"draft's step t_d ({probe.draft_ms:.1f} ms)", x=[lo, hi], y=[probe.draft_ms] * 2,
                mode="lines", line=dict(color=DRAFT_COLOR, width=2),
                hovertemplate=f"draft step t_d = {probe.draft_ms:.1f} ms<extra></extra>", meta={"reference": "draft"}))
            if c is not None:
                annotations.append(dict(x=1.0, y=probe.draft_ms, xref="paper", yref="y", xanchor="left",
                                        yanchor="top", showarrow=False, text=f"draft step<br>c = {c:.2f}",
                                        align="left", font=dict(size=12, color=FONT_COLOR)))  # amber text: 2:1
    steps = [c[min(c)] for c in curves_drawn if c[min(c)] > 0]
    log_y = bool(steps) and max(steps) / min(steps) > LOG_SCALE_RATIO
    if log_y:  # annotations on a log axis take log10 of the value
        for a in annotations:
            a["y"] = math.log10(a["y"])
    machine = short_machine(str(probe.machine.get("label", ""))) if here else ""
    if here:
        name = str(probe.machine.get("name") or machine)
        title = TITLE
        rest = machine[len(name):].lstrip(", ") if machine.startswith(name) else ""
        # Short lines: plotly never wraps a title, and at 400 px wide ~50 characters fit (longer ones were cut).
        pass_words = f"{target or probe.model}: a forward over k new tokens after a {PREFIX}-token prefix"
        sub = "<br>".join(textwrap.wrap(f"on this machine: {name}{', ' + rest if rest else ''}", SUB_WRAP)
                          + textwrap.wrap(pass_words + (" · log scale" if log_y else ""), SUB_WRAP))
    elif probe is not None and getattr(probe, "after_serving", False):
        title, sub = f"{TITLE}: measured here once the page is served", "recorded machines only"
    elif probe is not None and not probe.measured:
        title, sub = f"{TITLE}: not measured here (machine busy)", "recorded machines only"
    else:
        title, sub = f"{TITLE}: not measured on this machine", "recorded machines only"
    if log_y and not here:
        sub += " · log scale"
    compact_layout(fig, title, "tokens fed k (a verify pass feeds γ + 1)", "time of the pass (ms)", subtitle=sub)
    # The legend at the container's foot: plotly then makes room for it, however many lines it wraps to (at
    # 400 px each entry is a line: anchored to the plot instead, it ran over the x-axis title).
    fig.update_layout(annotations=annotations, legend=dict(yref="container", y=0, yanchor="bottom"),
                      margin=dict(b=60, r=96), height=620,
                      meta={"machine": machine, "chosen": probe.choice if here else None})
    fig.update_xaxes(tickmode="array", tickvals=sorted({k for c in curves_drawn for k in c}))
    if log_y:
        fig.update_yaxes(type="log")
    else:
        fig.update_yaxes(rangemode="tozero")
    return fig


__all__ = ["RecordedMachine", "bound_line", "load_recorded", "recorded_machine", "roofline_trace", "short_name",
           "verify_cost_figure", "verify_factor"]
