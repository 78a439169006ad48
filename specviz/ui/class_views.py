"""What a class's pages show of its room: the join link and QR code, the bar and the task, the experiment's
points (computed from a race the server holds, never from values a client sends), the teacher's plot over
Thm 3.8, and the points as CSV and JSON files.  Plain functions of a room (class mode's handlers: ui.classroom)."""

from __future__ import annotations

import csv
import hashlib
import html
import io
import json
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import plotly.graph_objects as go

from ..serving import rooms as R
from ..serving.rooms import ROOMS
from ..theory.figures import run_figures
from ..theory.timing import flagged, trusted_speedup
from ..trace.summary import theoretical_speedup
from ..views import html as V
from ..views.figures import empty_figure, wide_layout
from .exports import prune

NO_POINTS = "No points yet: when an attendee's race ends, it appears here."
EXPORT_DIR = Path(tempfile.gettempdir()) / "specviz-class"


# ---- the links and the QR code ------------------------------------------------------------------------------


def page_url(request: Any) -> str:
    """The page's address without its query (the referring page of the event; else the server's own root)."""
    headers = getattr(request, "headers", None) or {}
    ref = headers.get("referer") if hasattr(headers, "get") else None
    if ref:
        parts = urlsplit(ref)
        if parts.scheme in ("http", "https") and parts.netloc:
            return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", "", ""))
    url = getattr(request, "url", None)
    if url is not None:
        parts = urlsplit(str(url))
        return urlunsplit((parts.scheme, parts.netloc, "/", "", ""))
    return "/"


def join_link(base: str, code: str) -> str:
    return f"{base}?{urlencode({'class': code})}"


def qr_svg(text: str) -> str:
    """A QR code of ``text`` as inline SVG, made here (the `qrcode` package; no network); "" without it."""
    try:
        import qrcode
        import qrcode.image.svg
    except ImportError:
        return ""
    img = qrcode.make(text, image_factory=qrcode.image.svg.SvgPathImage, box_size=10, border=2)
    return img.to_string(encoding="unicode")


def spaced(code: str) -> str:
    return f"{code[:3]}-{code[3:6]}-{code[6:]}"


def teacher_html(room: R.Room, base: str) -> str:
    link = join_link(base, room.code)
    own = f"{base}?{urlencode({'class': room.code, 'teacher': room.secret})}"
    svg = qr_svg(link)
    qr = (f'<div class="sv-class-qr" role="img" aria-label="QR code of the join link">{svg}</div>' if svg else
          '<p class="sv-muted">(no QR code: the qrcode package is not installed)</p>')
    return (f'<div class="sv-class-card">{qr}<div><p>Class code</p>'
            f'<p class="sv-class-code" id="sv-class-code" data-code="{room.code}">{spaced(room.code)}</p>'
            f'<p>Attendees open <a href="{html.escape(link)}" target="_blank" id="sv-class-join-link">'
            f'{html.escape(link)}</a> (or scan the code).</p>'
            f'<details><summary>This page, for you only</summary><p class="sv-muted">Reopens the class as its teacher '
            f'after a reload; whoever has it drives the class:</p><code id="sv-class-teacher-link">{html.escape(own)}'
            f'</code></details></div></div>')


# ---- the bar and the task ------------------------------------------------------------------------------------


def task_html(room: R.Room | None) -> str:
    if room is None:
        return ""
    if room.experiment is None:
        return "<p class='sv-muted'>No experiment yet: follow the teacher.</p>"
    title, task = R.EXPERIMENTS[room.experiment]
    return f"<p><b>Experiment: {html.escape(title)}.</b> {html.escape(task)}</p>"


def bar_html(room: R.Room | None, role: str, note: str = "") -> str:
    if room is None:
        return f'<div class="sv-class-bar-text" data-state="closed">{html.escape(note)}</div>' if note else ""
    who = "You are teaching" if role == "teacher" else "You are in"
    extra = f" · {html.escape(note)}" if note else ""
    return (f'<div class="sv-class-bar-text" data-state="open" data-role="{role}">{who} class '
            f'<b>{spaced(room.code)}</b> · {len(room.attendees)} attendee{"s" if len(room.attendees) != 1 else ""}'
            f'{extra}{task_html(room) if role == "attendee" else ""}</div>')


# ---- the experiment's points ----------------------------------------------------------------------------------


def race_identity(spec: Any, std: Any) -> str:
    """A race's identity: its prompt, settings, tokens and clocks, hashed (a replay of it is the same race)."""
    parts = [spec.prompt, json.dumps(spec.settings.as_dict(), sort_keys=True, default=str), spec.n_tokens,
             round(spec.t_total, 6), round(getattr(std, "t_total", 0.0) or 0.0, 6),
             [t for r in spec.rounds for t in r.emitted][:512]]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]


def point_values(spec: Any, std: Any) -> dict[str, Any]:
    """The point a race posts: its settings, α, mean accepted length, c, speedup (the one the page quotes: the
    count-based one when its clocks were flagged and it has one) with its uncertainty, and whether it was flagged."""
    s = spec.summary()
    sp = V.race_speedup(spec, std)
    # flagged clocks: the count-based figure where the race has one, else the wall clock's, marked flagged (the
    # teacher's plot rings it): a busy room's races are part of the experiment too
    trusted = (trusted_speedup(spec, sp) or sp) if sp else None
    st = spec.settings
    rc = run_figures(spec, std).quoted  # c as the race's panels quote it: per standard step, the probe's when flagged
    c = rc.c if rc is not None and rc.c is not None else s.c
    return {"alpha": s.alpha, "mean_accepted_length": s.mean_accepted_length, "c": c, "speedup": trusted,
            "spread": getattr(spec.timing, "spread", None) if spec.timing is not None else None,
            "gamma": float(st.gamma), "epsilon": float(st.epsilon), "temperature": float(st.temperature),
            "tokens": float(spec.n_tokens), "flagged": flagged(spec), "drafter": str(st.drafter),
            "policy": str(st.policy), "example": (spec.prompt or "")[:80]}


def class_plot(room: R.Room | None) -> go.Figure:
    """The room's points over Thm 3.8 at the room's mean α and c (γ on x for the γ experiment, else α);
    flagged races ringed in red; error bars: the speedup's uncertainty."""
    pts = ROOMS.points(room.code) if room is not None else []
    title = "The class's races"
    if not pts:
        return empty_figure(title, NO_POINTS, wide=True)
    vals = [p.values for p in pts]
    alphas = [v["alpha"] for v in vals]
    cs = [v["c"] for v in vals if v.get("c") is not None]
    a_mean = sum(alphas) / len(alphas)
    c_mean = sum(cs) / len(cs) if cs else None
    g_mean = sum(v["gamma"] for v in vals) / len(vals)
    by_gamma = room.experiment == "gamma"
    xs = [v["gamma"] if by_gamma else v["alpha"] for v in vals]
    fig = go.Figure()
    if c_mean is not None:
        if by_gamma:
            gx = list(range(1, max(11, int(max(xs)) + 1)))
            gy = [theoretical_speedup(a_mean, g, c_mean) for g in gx]
        else:
            gx = [i / 50 for i in range(0, 50)]
            gy = [theoretical_speedup(a, max(g_mean, 1.0), c_mean) for a in gx]
        fig.add_trace(go.Scatter(x=gx, y=gy, mode="lines", name=f"Thm 3.8 at the class's α = {a_mean:.2f}, "
                                 f"c = {c_mean:.2f}" + ("" if by_gamma else f", γ = {g_mean:.1f}"),
                                 line=dict(color="#888", dash="dash")))
    errs = [(v["speedup"] * v["spread"]) if v.get("spread") else 0.0 for v in vals]
    text = [f"#{p.id} · attendee {room.attendee_number(p.attendee)}<br>γ = {v['gamma']:g}, ε = {v['epsilon'] or 0:g}, "
            f"α = {v['alpha']:.2f}, c = {v['c'] if v['c'] is not None else float('nan'):.2f}<br>"
            f"speedup {v['speedup']:.2f}×{' · flagged' if v['flagged'] else ''}" for p, v in zip(pts, vals)]
    fig.add_trace(go.Scatter(
        x=xs, y=[v["speedup"] for v in vals], mode="markers", name=f"races ({len(pts)})", text=text,
        hovertemplate="%{text}<extra></extra>", error_y=dict(type="data", array=errs, visible=True, thickness=1),
        marker=dict(size=10, color="#2a6fdb", opacity=0.85, line=dict(width=1, color="white"))))
    ringed = [(x, v["speedup"]) for x, v in zip(xs, vals) if v["flagged"]]
    if ringed:
        fig.add_trace(go.Scatter(x=[x for x, _ in ringed], y=[y for _, y in ringed], mode="markers",
                                 name="flagged: the machine was busy (count-based speedup)", hoverinfo="skip",
                                 marker=dict(size=20, symbol="circle-open", color="#d62728", line=dict(width=2))))
    fig.add_hline(y=1.0, line=dict(color="#bbb", width=1))
    fig.update_xaxes(title="γ (draft length)" if by_gamma else "α (acceptance rate)")
    fig.update_yaxes(title="speedup over standard decoding", rangemode="tozero")
    races = f"{len(pts)} race{'s' if len(pts) != 1 else ''}"
    return wide_layout(fig, title, f"{races} from {room.posters()} of {len(room.attendees)} attendees; the curve: "
                       "the textbook theorem (a verify pass costs one step, v = 1)", height=420)


def count_html(room: R.Room | None) -> str:
    if room is None:
        return ""
    n = len(room.points)
    return (f'<p id="sv-class-count" data-points="{n}" data-posters="{room.posters()}">'
            f'{room.posters()} of {len(room.attendees)} attendees have posted · {n} point{"s" if n != 1 else ""}</p>')


def point_choices(room: R.Room | None) -> list[tuple[str, int]]:
    if room is None:
        return []
    return [(f"#{p.id} · attendee {room.attendee_number(p.attendee)} · γ {p.values['gamma']:g} · "
             f"{p.values['speedup']:.2f}×", p.id) for p in ROOMS.points(room.code)]


def rows(room: R.Room) -> list[dict[str, Any]]:
    return [p.row(f"attendee {room.attendee_number(p.attendee)}") for p in ROOMS.points(room.code)]


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")  # what a spreadsheet may read as a formula (OWASP's list)


def csv_cell(value: Any) -> Any:
    """A text cell a spreadsheet would run as a formula (``=HYPERLINK(…)`` in an attendee's prompt), made inert
    with a leading apostrophe; numbers and other text unchanged (issue 62)."""
    return "'" + value if isinstance(value, str) and value.startswith(FORMULA_START) else value


def write_points(room: R.Room) -> list[str]:
    """The room's points as a CSV and a JSON file; their paths."""
    data = rows(room)
    EXPORT_DIR.mkdir(parents=True, exist_ok=True)
    prune(EXPORT_DIR, "class-*", 32)
    stem = EXPORT_DIR / f"class-{room.code}-{len(data)}pts"
    fields = ["id", "attendee", "experiment", *R.RANGES, "flagged", *R.TEXT_FIELDS, "posted"]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore")
    w.writeheader()
    w.writerows([{k: csv_cell(v) for k, v in row.items()} for row in data])
    csv_path, json_path = stem.with_suffix(".csv"), stem.with_suffix(".json")
    csv_path.write_text(buf.getvalue(), encoding="utf-8")
    json_path.write_text(json.dumps({"class": room.code, "experiment": room.experiment, "points": data}, indent=1),
                         encoding="utf-8")
    return [str(csv_path), str(json_path)]
