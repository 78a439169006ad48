"""Class mode (issue 58): the teacher's page leads, the attendees' pages follow, and the room runs one experiment.

    ?class=new                  start a class: this page becomes its teacher's (code, join link, QR code)
    ?class=CODE                 join the class as an attendee: the Live tab follows the teacher's
    ?class=CODE&teacher=SECRET  the teacher's page again (after a reload); the join link never holds the secret

The rooms are specviz.serving.rooms' (bounded, in memory).  The teacher's page tells its room what it shows (the
recording, the round) whenever its step or its run changes; each attendee's page asks its room every
POLL_S seconds (a gr.Timer) and, while "Follow the teacher" is on, shows the same recording at the same round.
Following runs no model: a shipped recording is drawn once per process (ui.live), and a run of the teacher's own
is drawn once per room and shared by every attendee's page (`_run_frame`).  "Let me explore" leaves; pressing
Run leaves too (the attendee's own race is then on screen).

In an experiment, each race an attendee finishes (live or replayed) is posted to the room as one point, computed
here from the race the server holds for that page (never from values a client sends); the teacher's page
draws the points over Thm 3.8 at the room's measured α and c, and exports them as CSV and JSON.

Wiring (app.py): ``ui = build_bar()`` above the tabs, ``build_tab(ui)`` inside them, ``wire(ui, ...)`` with the
events.  Handlers are plain functions of their inputs (tests call them without Blocks).
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import hashlib
import html
import io
import itertools
import json
import logging
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import anyio
import gradio as gr
import plotly.graph_objects as go

from ..serving import rooms as R
from ..serving.rooms import ROOMS, RoomError
from ..theory.costs import race_costs
from ..theory.timing import flagged, trusted_speedup
from ..trace.summary import theoretical_speedup
from ..views import html as V
from ..views import plots as P
from ..views import race_plots as RP
from ..views.figures import empty_figure, wide_layout
from . import live, picture_ui, room_wait
from .frames import SKIP, LiveFrame, round_number
from .store import Shown
from .tree_ui import live_tree, mask_for, tree_figures

log = logging.getLogger("specviz.classroom")
POLL_S = 1.0  # an attendee's page asks its room this often (the issue: the teacher's step shown within 2 s)
TEACHER_POLL_S = 2.0  # the teacher's plot refreshes this often when points came
FOLLOW, EXPLORE = "Follow the teacher", "Let me explore"
NO_POINTS = "No points yet: when an attendee's race ends, it appears here."
EXPORT_DIR = Path(tempfile.gettempdir()) / "specviz-class"


# ---- what a page shows, as the room names it --------------------------------------------------------------


@dataclass(frozen=True)
class RoomShown(Shown):
    """An attendee's handle on a run of the teacher's, held by the room (never by the trace store: Gradio's
    delete callback on the attendee's state must not drop the teacher's run, and the store's shares stay the
    visitors' own).  Reads as nothing once the room lets the run go (closed, or the teacher moved on long ago)."""

    room: str = ""
    key: str = ""

    @property
    def held(self) -> bool:  # not an entry of the attendee's own (the store's drop and the challenges skip it)
        return False

    def _found(self) -> dict | None:
        return ROOMS.payload(self.room, self.key)

    @property
    def nbytes(self) -> int | None:
        return None


def view_key(state: Any) -> str | None:
    """How a room names what a page shows: "rec:<file name>" for a shipped recording, "run:<id>" for a run in the
    trace store, the room's own key for a RoomShown; None when nothing is shown."""
    if isinstance(state, RoomShown):
        return state.key
    if isinstance(state, Shown):
        if state.recording:
            return "rec:" + Path(state.recording).name
        return f"run:{state.id}" if state else None
    return None


_FRAMES: OrderedDict[tuple[str, str], LiveFrame] = OrderedDict()  # a teacher's run, drawn once per room
_FRAMES_LOCK = threading.Lock()
FRAMES_KEPT = 8


def _run_frame(code: str, key: str) -> LiveFrame | None:
    """The Live tab's frame for a run of the teacher's, drawn once and shared by the room's pages (as ui.live's
    shipped recordings are): the same views as live.final_frame, with a RoomShown handle, no store entry and
    no export file."""
    with _FRAMES_LOCK:
        if (code, key) in _FRAMES:
            _FRAMES.move_to_end((code, key))
            return _FRAMES[(code, key)]
    payload = ROOMS.payload(code, key)
    if not payload:
        return None
    spec, std = payload.get("spec"), payload.get("std")
    summary = spec.summary() if spec else (std.summary() if std else None)
    narration, step_round = live.step_views(spec, 1)
    plot_tree_size, plot_tree_verify = tree_figures(spec)
    trees = bool(spec) and any(r.tree is not None for r in spec.rounds)
    frame = LiveFrame(
        status=live.status_html("The teacher's run, as the teacher's page shows it.", "ok"),
        legend=V.legend_html(spec), rounds=V.rounds_html(spec), race=V.race_html(spec, std),
        state=RoomShown(0, room=code, key=key),
        metrics=V.metrics_html(summary, gamma=spec.gamma if spec else 0, costs=race_costs(spec, std)),
        plot_pos=P.acceptance_by_position(spec), plot_hist=P.tokens_per_round_hist(spec),
        plot_draft=P.draft_lengths(spec), plot_time=P.round_times(spec), plot_curve=RP.tokens_vs_time(spec, std),
        plot_speed=RP.speedup_bars(spec, std), step=SKIP, narration=narration, step_round=step_round,
        export=None, tree=live_tree(spec), tree_mask=mask_for(spec), plot_tree_size=plot_tree_size,
        plot_tree_verify=plot_tree_verify, tree_mask_box=gr.update(visible=trees), tree_plots=gr.update(visible=trees))
    with _FRAMES_LOCK:
        _FRAMES[(code, key)] = frame
        while len(_FRAMES) > FRAMES_KEPT:
            _FRAMES.popitem(last=False)
    return frame


def _rounds_of(state: Any) -> int:
    spec = state.get("spec") if state is not None and hasattr(state, "get") else None
    return len(spec.rounds) if spec else 0


def view_frame(room: R.Room, recordings: list[Path]) -> LiveFrame | None:
    """The Live tab's frame for what the room's teacher shows, at the teacher's round (None: nothing to show)."""
    key = room.view_key
    if key.startswith("rec:"):
        name = key[4:]
        if not any(p.name == name for p in recordings):
            return None
        frame = live.load_example_recording(recordings, name)
    elif key.startswith("run:"):
        frame = _run_frame(room.code, key)
    else:
        return None
    if frame is None:
        return None
    n = _rounds_of(frame.state)
    i = round_number(room.step, n)
    narration, step_round = live.step_views(frame.state.get("spec"), i)
    return dataclasses.replace(frame, narration=narration, step_round=step_round,
                               step=gr.Slider(minimum=1, maximum=max(n, 2), value=i, step=1, interactive=n > 0,
                                              label=f"Round (1–{n})" if n else "Round"))


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


# ---- the room's state in a page: {"code", "role", "secret" (teacher only)} -----------------------------------


def _room(st: Any) -> R.Room | None:
    return ROOMS.get(st.get("code", "")) if isinstance(st, dict) else None


def _teacher(st: Any) -> R.Room:
    if not isinstance(st, dict) or st.get("role") != "teacher":
        raise RoomError("Only the teacher's page can do that.")
    return ROOMS.teacher(st.get("code", ""), st.get("secret"))


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
    return {"alpha": s.alpha, "mean_accepted_length": s.mean_accepted_length, "c": s.c, "speedup": trusted,
            "spread": getattr(spec.timing, "spread", None) if spec.timing is not None else None,
            "gamma": float(st.gamma), "epsilon": float(st.epsilon), "temperature": float(st.temperature),
            "tokens": float(spec.n_tokens), "flagged": flagged(spec), "drafter": str(st.drafter),
            "policy": str(st.policy), "example": (spec.prompt or "")[:80]}


def post_race(st: Any, state: Any, request: gr.Request = None) -> str:
    """Post the race this attendee's page shows to its room: a sentence for the page."""
    if not isinstance(st, dict) or st.get("role") != "attendee":
        return ""
    session = str(getattr(request, "session_hash", "") or "")
    room = _room(st)
    if room is None:
        return live.status_html("This class has ended: nothing was posted.", "warn")
    if room.experiment is None:
        return live.status_html("No experiment is running: your race stays on your page.", "info")
    if not isinstance(state, Shown) or isinstance(state, RoomShown) or not state.run or not state:
        if state is not None and not isinstance(state, RoomShown) and getattr(state, "recording", "") == "" and state:
            log.warning("refused a point for class %s: not a race run on this page", room.code)
        return live.status_html("Refused: only a race you ran here can be posted (a recording you loaded or "
                                "the teacher's run cannot).", "error")
    spec, std = state.get("spec"), state.get("std")
    if spec is None or std is None or not spec.rounds or spec.stop_reason in ("time_limit", "stopped"):
        return live.status_html("Refused: only a finished race (both decoders to the end) can be posted.", "error")
    if V.race_speedup(spec, std) is None:
        return live.status_html("Refused: this race has no measured speedup (its standard run did not finish).",
                                "error")
    try:
        ROOMS.join(room.code, session)
        point = ROOMS.post_point(room.code, session, race_identity(spec, std), point_values(spec, std))
    except RoomError as exc:
        return live.status_html(f"Refused: {exc}.", "error")
    v = point.values
    return live.status_html(f"Posted to the class: γ = {v['gamma']:g}, α = {v['alpha']:.2f}, speedup "
                            f"{v['speedup']:.2f}×{' (flagged)' if v['flagged'] else ''}.", "ok")


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


def export_points(st: Any) -> Any:
    """The room's points as a CSV and a JSON file (teacher only)."""
    try:
        room = _teacher(st)
    except RoomError as exc:
        gr.Warning(str(exc))
        return gr.update(value=None, visible=False)
    data = rows(room)
    EXPORT_DIR.mkdir(parents=True, exist_ok=True)
    live.prune(EXPORT_DIR, "class-*", 32)
    stem = EXPORT_DIR / f"class-{room.code}-{len(data)}pts"
    fields = ["id", "attendee", "experiment", *R.RANGES, "flagged", *R.TEXT_FIELDS, "posted"]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore")
    w.writeheader()
    w.writerows(data)
    csv_path, json_path = stem.with_suffix(".csv"), stem.with_suffix(".json")
    csv_path.write_text(buf.getvalue(), encoding="utf-8")
    json_path.write_text(json.dumps({"class": room.code, "experiment": room.experiment, "points": data}, indent=1),
                         encoding="utf-8")
    return gr.update(value=[str(csv_path), str(json_path)], visible=True)


# ---- the page's class controls ---------------------------------------------------------------------------------


@dataclass
class ClassUI:
    room: Any = None  # gr.State: {"code", "role", "secret"}
    bar: Any = None
    bar_text: Any = None
    follow: Any = None
    poll: Any = None
    start: Any = None
    code_in: Any = None
    join: Any = None
    message: Any = None
    teacher_box: Any = None
    card: Any = None
    experiment: Any = None
    count: Any = None
    plot: Any = None
    seen: Any = None
    want: Any = None  # a hidden number, new when the attendee's page must move to the teacher's round
    want_all: Any = None  # a hidden number, new when it must show another recording (every view of the Live tab)
    teacher_poll: Any = None
    pick: Any = None
    remove: Any = None
    export: Any = None
    files: Any = None
    close: Any = None
    attendee_box: Any = None
    task: Any = None
    post: Any = None
    posted: Any = None


def build_bar() -> ClassUI:
    """The class's bar above the tabs (hidden outside a class): who is in which class, follow or explore."""
    ui = ClassUI()
    ui.room = gr.State(None)
    with gr.Row(visible=False, elem_id="sv-class-bar", equal_height=True) as ui.bar:
        with gr.Column(scale=3, min_width=300):  # a phone stacks the switch under the text
            ui.bar_text = gr.HTML("", elem_id="sv-class-bar-text")
        ui.follow = gr.Radio([FOLLOW, EXPLORE], value=FOLLOW, show_label=False, visible=False, scale=0,
                             min_width=300, elem_id="sv-class-follow")
    ui.poll = gr.Timer(POLL_S, active=False)
    ui.teacher_poll = gr.Timer(TEACHER_POLL_S, active=False)
    ui.seen = gr.State(-1)
    # (in the page, hidden: a new value fires their change events there, after a poll outside Gradio's queue)
    ui.want, ui.want_all = (gr.Number(0, visible="hidden", show_label=False, container=False) for _ in range(2))
    return ui


def build_tab(ui: ClassUI) -> None:
    """The "Class" tab: start or join a class; the teacher's room (code, QR, experiment, plot, export)."""
    with gr.Tab("Class", id="class"):
        gr.Markdown("**Class mode.** A teacher starts a class and projects the code; attendees join with the "
                    "link or the code, and their Live tab follows the teacher's round by round. An experiment "
                    "collects every attendee's race on the teacher's plot.", elem_id="sv-class-intro")
        with gr.Row(equal_height=True):
            ui.start = gr.Button("Start a class", variant="primary", scale=0, min_width=180, elem_id="sv-class-start")
            ui.code_in = gr.Textbox(label="Class code", placeholder="e.g. abc-def-ghj", max_lines=1, scale=2,
                                    elem_id="sv-class-code-in")
            ui.join = gr.Button("Join", scale=0, min_width=100, elem_id="sv-class-join")
        ui.message = gr.HTML("", elem_id="sv-class-message")
        with gr.Group(visible=False, elem_id="sv-class-teacher") as ui.teacher_box:
            ui.card = gr.HTML("", elem_id="sv-class-card")
            ui.experiment = gr.Dropdown([("none (attendees follow only)", "")]
                                        + [(title, key) for key, (title, _) in R.EXPERIMENTS.items()], value="",
                                        label="Class experiment", elem_id="sv-class-experiment")
            ui.count = gr.HTML("", elem_id="sv-class-count-box")
            ui.plot = gr.Plot(show_label=False, elem_id="sv-class-plot")
            with gr.Row(equal_height=True):
                ui.pick = gr.Dropdown([], label="A point", scale=2, elem_id="sv-class-pick")
                ui.remove = gr.Button("Remove the point", size="sm", scale=0, min_width=160,
                                      elem_id="sv-class-remove")
                ui.export = gr.Button("Export the points (CSV, JSON)", size="sm", scale=0, min_width=220,
                                      elem_id="sv-class-export")
                ui.close = gr.Button("End the class", size="sm", variant="stop", scale=0, min_width=140,
                                     elem_id="sv-class-close")
            ui.files = gr.File(label="The class's points", file_count="multiple", visible=False, interactive=False,
                               elem_id="sv-class-files")
        with gr.Group(visible=False, elem_id="sv-class-attendee") as ui.attendee_box:
            ui.task = gr.HTML("", elem_id="sv-class-task")
            ui.post = gr.Button("Post the race on my Live tab", size="sm", elem_id="sv-class-post")
            ui.posted = gr.HTML("", elem_id="sv-class-posted")


# ---- handlers ----------------------------------------------------------------------------------------------------


def _panel(ui: ClassUI, st: Any, room: R.Room | None, note: str = "", base: str = "/") -> dict:
    """Every class control as a page in this role sees it."""
    role = st.get("role") if isinstance(st, dict) and room is not None else None
    out = {ui.room: st if role else None,
           ui.bar: gr.Row(visible=bool(role) or bool(note)),
           ui.bar_text: bar_html(room, role or "", note),
           ui.follow: gr.Radio(visible=role == "attendee", value=FOLLOW),
           ui.poll: gr.Timer(active=role == "attendee"),
           ui.teacher_poll: gr.Timer(active=role == "teacher"),
           ui.teacher_box: gr.Group(visible=role == "teacher"),
           ui.attendee_box: gr.Group(visible=role == "attendee"),
           ui.message: live.status_html(note, "warn" if role is None else "ok") if note else "",
           ui.seen: -1}
    if role == "teacher":
        out[ui.card] = teacher_html(room, base)
        out[ui.experiment] = gr.Dropdown(value=room.experiment or "")
    if role == "attendee":
        out[ui.task] = task_html(room)
    return out


def start_class(ui: ClassUI, state: Any, step: Any, request: gr.Request = None) -> dict:
    try:
        room = ROOMS.create()
    except RoomError as exc:
        return _panel(ui, None, None, str(exc))
    st = {"code": room.code, "role": "teacher", "secret": room.secret}
    teacher_view(st, state, step)
    return _panel(ui, st, room, "Class started: project the code, attendees join with the link or the QR code.",
                  page_url(request))


def join_class(ui: ClassUI, code: Any, request: gr.Request = None) -> dict:
    session = str(getattr(request, "session_hash", "") or "")
    try:
        room = ROOMS.join(R.clean_code(code) or str(code or "")[:40], session)
    except RoomError as exc:
        return _panel(ui, None, None, str(exc))
    return _panel(ui, {"code": room.code, "role": "attendee"}, room, "Joined: your Live tab follows the teacher's.")


def on_load(ui: ClassUI, state: Any, step: Any, request: gr.Request = None) -> dict:
    """``?class=new``, ``?class=CODE`` or ``?class=CODE&teacher=SECRET``; nothing else touches the class controls."""
    params = dict(request.query_params) if request is not None and getattr(request, "query_params", None) else {}
    code = params.get("class")
    if not code:
        return {ui.message: gr.skip()}  # (an empty dict would read as one missing value)
    if str(code).strip().lower() == "new":
        return start_class(ui, state, step, request)
    secret = params.get("teacher")
    if secret:
        try:
            room = ROOMS.teacher(str(code), str(secret))
        except RoomError as exc:
            return _panel(ui, None, None, str(exc))
        st = {"code": room.code, "role": "teacher", "secret": room.secret}
        teacher_view(st, state, step)
        return _panel(ui, st, room, "You are this class's teacher again.", page_url(request))
    return join_class(ui, code, request)


def teacher_view(st: Any, state: Any, step: Any) -> None:
    """The teacher's page moved (a round, a run, a recording): the room follows.  Nothing for other pages."""
    if not isinstance(st, dict) or st.get("role") != "teacher":
        return
    key = view_key(state)
    if key is None:
        return
    payload = None
    if key.startswith("run:"):
        payload = {"spec": state.get("spec"), "std": state.get("std")}
    try:
        ROOMS.set_view(st["code"], st.get("secret"), key, round_number(step, _rounds_of(state) or 2**31), payload)
    except RoomError as exc:
        log.info("class %s: the teacher's view not sent: %s", st.get("code"), exc)
        return
    room_wait.moved(st["code"])  # the attendees' polls waiting on it answer now


def on_step(st: Any, state: Any, step: Any) -> tuple[Any, ...]:
    """A step (any page's): step mode's views of the round (picture_ui.on_step); on a teacher's page, the room
    follows (`teacher_view`).  One event, where two would cost every attendee's page a request at every step."""
    teacher_view(st, state, step)
    return picture_ui.on_step(state, step)


def attendee_sync(ui: ClassUI, views: Any, step_c: Any, recordings: list[Path], st: Any, follow: Any, state: Any,
                  step: Any, seen: Any = None, request: gr.Request = None) -> dict:
    """An attendee's poll: while following, show the teacher's recording at the teacher's round (only what
    differs is sent: most polls send nothing)."""
    if not isinstance(st, dict) or st.get("role") != "attendee":
        return {ui.poll: gr.Timer(active=False)}
    room = _room(st)
    if room is None:
        return {ui.bar_text: bar_html(None, "", "This class has ended. The page is yours."),
                ui.poll: gr.Timer(active=False), ui.follow: gr.Radio(visible=False), ui.room: None}
    ROOMS.seen(room, str(getattr(request, "session_hash", "") or ""))
    out: dict = {ui.seen: gr.skip()}  # (an empty dict would read as one missing value)
    task, bar = task_html(room), bar_html(room, "attendee")
    said = hashlib.sha256((task + bar).encode()).hexdigest()[:16]
    if seen != said:  # what the bar and the task say changed (the experiment, the attendees): those too
        out.update({ui.task: task, ui.bar_text: bar, ui.seen: said})
    if follow == FOLLOW and isinstance(state, Shown) and state.held and state.run and state:
        # A race of the attendee's own is on screen (Run pressed while following): it stays; the page explores.
        out[ui.follow] = EXPLORE
    elif follow == FOLLOW and room.view_key:
        if view_key(state) != room.view_key:
            frame = view_frame(room, recordings)
            if frame is not None:
                out.update(views.write(frame))
        elif round_number(step, _rounds_of(state) or 2**31) != round_number(room.step, _rounds_of(state) or 1):
            # The round's narration comes with the step: the step's own change events (one at a time for the
            # whole server) redraw the rest, but the page reads the right round at once.
            i = round_number(room.step, _rounds_of(state) or 1)
            narration, step_round = live.step_views(state.get("spec"), i)
            out.update(views.write(LiveFrame(step=i, narration=narration, step_round=step_round)))
    return out


_WANTS = itertools.count(1)


def _changes_nothing(out: dict) -> bool:
    return all(isinstance(v, dict) and v == {"__type__": "update"} for v in out.values())  # gr.skip()s only


def attendee_poll(ui: ClassUI, views: Any, step_c: Any, recordings: list[Path], st: Any, follow: Any, state: Any,
                  step: Any, seen: Any = None, request: gr.Request = None, small: frozenset = frozenset()) -> dict:
    """An attendee's poll, cheap for a room of sixty.  Gradio rebuilds each component an event leaves alone (a
    skipped output costs about a millisecond of the server's one interpreter lock), so with the Live tab's views as
    the poll's outputs, sixty polls a second saturated the server and the teacher's step reached pages seconds late.
    The poll's outputs are the step and two hidden numbers: a new round is the step itself (its change event,
    ``on_step``, draws the round); a new value of ``ui.want`` when the bar or the follow switch differ, its change
    event syncing those few outputs (``small``); of ``ui.want_all`` when the recording does, its change event
    syncing every view.  Most polls change nothing; the poll runs outside Gradio's queue (one request, no event
    stream: half the cost of a queued one)."""
    out = attendee_sync(ui, views, step_c, recordings, st, follow, state, step, seen, request)
    skip = gr.skip()
    if _changes_nothing(out):
        return {ui.want: skip, ui.want_all: skip, step_c: skip}
    if set(out) <= {step_c, views["narration"], views["step_round"], ui.seen}:  # the round only: the step, whose
        return {ui.want: skip, ui.want_all: skip, step_c: out[step_c]}  # change event draws the round (on_step)
    if set(out) <= small:
        return {ui.want: next(_WANTS), ui.want_all: skip, step_c: skip}
    return {ui.want: skip, ui.want_all: next(_WANTS), step_c: skip}


def attendee_step(ui: ClassUI, views: Any, step_c: Any, recordings: list[Path], st: Any, follow: Any, state: Any,
                  step: Any, seen: Any = None, request: gr.Request = None, small: frozenset = frozenset()) -> dict:
    """``ui.want``'s change: the sync, with the few outputs a new round needs (``small``); if by now the page needs
    more (the teacher showed another recording meanwhile), ``ui.want_all`` changes instead."""
    out = attendee_sync(ui, views, step_c, recordings, st, follow, state, step, seen, request)
    return out if set(out) <= small else {ui.want_all: next(_WANTS)}


def teacher_refresh(ui: ClassUI, st: Any, seen: Any) -> dict:
    """The teacher's plot, count and points list, redrawn when points came or went."""
    room = _room(st) if isinstance(st, dict) and st.get("role") == "teacher" else None
    if room is None:
        return {ui.teacher_poll: gr.Timer(active=False)}
    out = {ui.count: count_html(room)}
    if seen != room.points_version:
        out.update({ui.plot: class_plot(room), ui.pick: gr.Dropdown(choices=point_choices(room), value=None),
                    ui.seen: room.points_version})
    return out


def set_experiment(ui: ClassUI, st: Any, experiment: Any) -> dict:
    if not isinstance(st, dict) or st.get("role") != "teacher":
        return {ui.message: gr.skip()}
    try:
        room = ROOMS.set_experiment(st.get("code", ""), st.get("secret"), experiment or None)
    except RoomError as exc:
        return {ui.message: live.status_html(str(exc), "error")}
    return {ui.message: live.status_html(f"Experiment: {R.EXPERIMENTS[room.experiment][0]}." if room.experiment
                                         else "No experiment: attendees follow only.", "ok"),
            ui.plot: class_plot(room), ui.seen: room.points_version}


def remove_point(ui: ClassUI, st: Any, pick: Any) -> dict:
    try:
        room = _teacher(st)
        gone = ROOMS.remove_point(room.code, st.get("secret"), pick) if isinstance(pick, int) else False
    except RoomError as exc:
        return {ui.message: live.status_html(str(exc), "error")}
    return {ui.message: live.status_html(f"Point #{pick} removed." if gone else "Pick a point to remove.",
                                         "ok" if gone else "info"), ui.seen: -1}


def close_class(ui: ClassUI, st: Any) -> dict:
    try:
        room = _teacher(st)
        ROOMS.close(room.code, st.get("secret"))
    except RoomError as exc:
        return {ui.message: live.status_html(str(exc), "error")}
    return _panel(ui, None, None, "The class has ended.")


def wire(ui: ClassUI, demo: gr.Blocks, *, state: Any, step: Any, views: Any, run_btn: Any, run_evt: Any,
         recordings: list[Path]) -> None:
    """The class's events: the page's load, start and join, the teacher's moves, the attendees' polls, the points."""
    outs = [ui.room, ui.bar, ui.bar_text, ui.follow, ui.poll, ui.teacher_poll, ui.teacher_box, ui.attendee_box,
            ui.message, ui.seen, ui.card, ui.experiment, ui.task]
    quick = dict(api_visibility="private", concurrency_limit=None, show_progress="hidden")

    # (closures, not functools.partial: Gradio passes gr.Request only to a parameter it sees annotated)
    def load(state_v: Any, step_v: Any, request: gr.Request = None) -> dict:
        return on_load(ui, state_v, step_v, request)

    def start(state_v: Any, step_v: Any, request: gr.Request = None) -> dict:
        return start_class(ui, state_v, step_v, request)

    def join(code: Any, request: gr.Request = None) -> dict:
        return join_class(ui, code, request)

    def sync(st: Any, follow: Any, state_v: Any, step_v: Any, seen: Any, request: gr.Request = None) -> dict:
        return attendee_sync(ui, views, step, recordings, st, follow, state_v, step_v, seen, request)

    demo.load(load, [state, step], outs, **quick)
    ui.start.click(start, [state, step], outs, **quick)
    ui.join.click(join, [ui.code_in], outs, **quick)
    ui.code_in.submit(join, [ui.code_in], outs, **quick)
    ui.close.click(functools.partial(close_class, ui), [ui.room], outs, **quick)
    # The teacher's page: every round or run it shows goes to its room (nothing happens on other pages).
    # (a step's: on_step, app.py's step-mode event, which every page fires at every step)
    state.change(teacher_view, [ui.room, state, step], None, **quick)
    # The attendees' pages: a poll a second; following again catches up at once; a Run of one's own leaves.
    sync_in, sync_outs = [ui.room, ui.follow, state, step, ui.seen], [*views.outputs, ui.bar_text, ui.poll,
                                                                      ui.follow, ui.room, ui.task, ui.seen]
    # A poll's outputs are the step and two hidden numbers (most polls change none: nothing is drawn or sent); a
    # new round is the step, a changed bar syncs the few outputs in `small`, another recording every view.
    small_outs = [step, views["narration"], views["step_round"], ui.bar_text, ui.poll, ui.follow, ui.room, ui.task,
                  ui.seen, ui.want_all]
    small = frozenset(small_outs)

    async def poll(st: Any, follow: Any, state_v: Any, step_v: Any, seen: Any, request: gr.Request = None) -> dict:
        # (room_wait: a poll finding the page up to date waits for the teacher's next move, on the event loop)
        answer = functools.partial(attendee_poll, ui, views, step, recordings, st, follow, state_v, step_v, seen,
                                   request, small)
        room = _room(st) if follow == FOLLOW and isinstance(st, dict) and st.get("role") == "attendee" else None
        version = room.version if room is not None else None
        out = await anyio.to_thread.run_sync(answer)
        if room is None or not _changes_nothing(out):
            return out
        if await room_wait.until_moved(st.get("code", ""), lambda: room.version != version):
            return await anyio.to_thread.run_sync(answer)
        return out

    def to_round(st: Any, follow: Any, state_v: Any, step_v: Any, seen: Any, request: gr.Request = None) -> dict:
        return attendee_step(ui, views, step, recordings, st, follow, state_v, step_v, seen, request, small)

    direct = dict(api_visibility="private", show_progress="hidden", queue=False)  # one request each, no stream
    ui.poll.tick(poll, sync_in, [ui.want, ui.want_all, step], **direct)
    ui.want.change(to_round, sync_in, small_outs, **direct)
    ui.want_all.change(sync, sync_in, sync_outs, **quick)
    ui.follow.input(sync, sync_in, sync_outs, **quick)
    # In the browser, at once (the Radio shows only on an attendee's page): the poll must not replace the race.
    run_btn.click(None, None, None, api_visibility="private", show_progress="hidden",
                  js=f"() => {{ const el = document.querySelector('#sv-class-follow input[value={json.dumps(EXPLORE)}]'); "
                     "if (el && el.offsetParent !== null && !el.checked) el.click(); }")
    run_evt.success(post_race, [ui.room, state], [ui.posted], **quick)
    ui.post.click(post_race, [ui.room, state], [ui.posted], **quick)
    # The teacher's room: the experiment, the plot, a point removed, the export.
    ui.experiment.input(functools.partial(set_experiment, ui), [ui.room, ui.experiment],
                        [ui.message, ui.plot, ui.seen], **quick)
    refresh_outs = [ui.count, ui.plot, ui.pick, ui.seen, ui.teacher_poll]
    ui.teacher_poll.tick(functools.partial(teacher_refresh, ui), [ui.room, ui.seen], refresh_outs, **quick)
    ui.remove.click(functools.partial(remove_point, ui), [ui.room, ui.pick], [ui.message, ui.seen], **quick).then(
        functools.partial(teacher_refresh, ui), [ui.room, ui.seen], refresh_outs, **quick)
    ui.export.click(export_points, [ui.room], [ui.files], **quick)
