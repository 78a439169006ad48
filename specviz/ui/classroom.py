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

This module holds the events.  Beside it: ui.class_layout (the controls), ui.class_follow (what an attendee's page
shows of the teacher's), ui.class_views (what the pages show of the room: link, bar, points, plot, export).
Wiring (app.py): ``ui = class_layout.build_bar()`` above the tabs, ``class_layout.build_tab(ui)`` inside them,
``wire(ui, ...)`` with the events.  Handlers are plain functions of their inputs (tests call them without Blocks).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import logging
from pathlib import Path
from typing import Any

import anyio
import gradio as gr

from ..serving import rooms as R
from ..serving.clients import client_key
from ..serving.rooms import ROOMS, RoomError
from ..views import html as V
from . import live, picture_ui, room_wait
from .class_follow import ROOM_SESSION, RoomShown, rounds_of, view_frame, view_key
from .class_layout import EXPLORE, FOLLOW, ClassUI
from .class_views import (bar_html, class_plot, count_html, page_url, point_choices, point_values, race_identity,
                          task_html, teacher_html, write_points)
from .frames import LiveFrame, round_number
from .store import STORE, Shown, StoreFull

log = logging.getLogger("specviz.classroom")
# A room's shown runs are entries of the one trace store (session "room:<code>"): a run the room lets go, and every
# run of a room that closes, leave the store with it (serving.rooms: one budget for all held state, issue 62).
ROOMS.release = STORE.discard


# ---- the room's state in a page: {"code", "role", "secret" (teacher only)} -----------------------------------


def _room(st: Any) -> R.Room | None:
    return ROOMS.get(st.get("code", "")) if isinstance(st, dict) else None


def _teacher(st: Any) -> R.Room:
    if not isinstance(st, dict) or st.get("role") != "teacher":
        raise RoomError("Only the teacher's page can do that.")
    return ROOMS.teacher(st.get("code", ""), st.get("secret"))


# ---- the experiment's points ----------------------------------------------------------------------------------


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
        ROOMS.join(room.code, session, client_key(request))
        point = ROOMS.post_point(room.code, session, race_identity(spec, std), point_values(spec, std))
    except RoomError as exc:
        return live.status_html(f"Refused: {exc}.", "error")
    v = point.values
    return live.status_html(f"Posted to the class: γ = {v['gamma']:g}, α = {v['alpha']:.2f}, speedup "
                            f"{v['speedup']:.2f}×{' (flagged)' if v['flagged'] else ''}.", "ok")


def export_points(st: Any) -> Any:
    """The room's points as a CSV and a JSON file (teacher only)."""
    try:
        room = _teacher(st)
    except RoomError as exc:
        gr.Warning(str(exc))
        return gr.update(value=None, visible=False)
    return gr.update(value=write_points(room), visible=True)


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
        room = ROOMS.create(client_key(request))
    except RoomError as exc:
        return _panel(ui, None, None, str(exc))
    st = {"code": room.code, "role": "teacher", "secret": room.secret}
    teacher_view(st, state, step)
    return _panel(ui, st, room, "Class started: project the code, attendees join with the link or the QR code.",
                  page_url(request))


def join_class(ui: ClassUI, code: Any, request: gr.Request = None) -> dict:
    session = str(getattr(request, "session_hash", "") or "")
    try:
        room = ROOMS.join(R.clean_code(code) if isinstance(code, str) else "", session, client_key(request))
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
    if key.startswith("run:") and ROOMS.payload(st.get("code", ""), key) is None:
        # Held by the trace store for the room, within its budget (the same traces: no copy, the bytes counted).
        try:
            payload = STORE.put(state.get("spec"), state.get("std"), nbytes=state.nbytes,
                                session=ROOM_SESSION + str(st.get("code", "")), run=True)
        except StoreFull as exc:
            log.info("class %s: the teacher's run is not shared: %s", st.get("code"), exc)
    try:
        ROOMS.set_view(st["code"], st.get("secret"), key, round_number(step, rounds_of(state) or 2**31), payload)
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
        elif round_number(step, rounds_of(state) or 2**31) != round_number(room.step, rounds_of(state) or 1):
            # The round's narration comes with the step: the step's own change events (one at a time for the
            # whole server) redraw the rest, but the page reads the right round at once.
            i = round_number(room.step, rounds_of(state) or 1)
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
        gone = ROOMS.remove_point(room.code, st.get("secret"), pick) if type(pick) is int else False
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
