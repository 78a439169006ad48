"""Class mode (issue 58, 66): the teacher's page leads, the attendees' pages follow, and the room runs experiments.

    ?class=new                  start a class: this page becomes its teacher's (code, join link, QR code)
    ?class=CODE                 join the class as an attendee: the Live tab follows the teacher's; in the
                                teacher's own browser (the secret kept there), the teacher's page again
    ?class=CODE&teacher=SECRET  the teacher's page on any browser; the join link never holds the secret

Who a page is survives reloads and tabs (ui.class_client): once in a class, the page's URL becomes ?class=CODE; the
teacher's browser keeps the secret (so a reload, or the link in a new tab, is the teacher's page again, and a
reload of ?class=new reopens the same class), and every browser keeps an id that is its one seat.  A reopened
teacher's page shows the room's view (recording or run, round) and experiment as they were: until it does, what
the page shows is its fresh start and does not move the room (`teacher_moved`, serving.rooms' restore).

The rooms are specviz.serving.rooms' (bounded, in memory).  The teacher's page tells its room what it shows (the
recording, the round) whenever its step or its run changes; each attendee's page asks its room every
POLL_S seconds (a gr.Timer) and, while "Follow the teacher" is on, shows the same recording at the same round
(ui.class_attend).  In an experiment, each race an attendee finishes is posted to the room as one point, computed
here from the race the server holds for that page (never from values a client sends); each experiment keeps its
own points, drawn on its own axes (ui.class_plot); the export holds every experiment's.  Ending a class asks first
and offers the export; an ended class's points stay for its teacher to export until it would have expired.

Beside it: ui.class_layout (the controls), ui.class_attend (the attendees' events), ui.class_follow (what an
attendee's page shows of the teacher's), ui.class_views (link, card, bar, points, export), ui.class_client.
Wiring (app.py): ``ui = class_layout.build_bar()`` above the tabs, ``class_layout.build_tab(ui)`` inside them,
``wire(ui, ...)`` with the events.  Handlers are plain functions of their inputs (tests call them without Blocks).
"""

from __future__ import annotations

import functools
import json
import logging
import secrets
from pathlib import Path
from typing import Any

import anyio
import gradio as gr

from ..serving import rooms as R
from ..serving.clients import client_key
from ..serving.rooms import ROOMS, RoomError
from . import live, picture_ui, room_wait
from .class_attend import (WANTS, attendee_poll, attendee_step, attendee_sync, changes_nothing, post_race, room_of,
                           shows_room_view)
from .class_client import CLIENT_JS, IDENT_JS, PROJECT_JS, ident, parse_client
from .class_follow import ROOM_SESSION, rounds_of, view_key
from .class_layout import EXPLORE, FOLLOW, ClassUI
from .class_plot import class_plot
from .class_views import (bar_html, count_html, ended_html, mine_html, page_url, point_choices, private_html,
                          spaced, task_html, teacher_html, write_points)
from .frames import round_number
from .store import STORE, StoreFull

__all__ = ["attendee_poll", "attendee_step", "attendee_sync", "on_load", "on_step", "post_race", "teacher_view",
           "wire"]

log = logging.getLogger("specviz.classroom")
# A room's shown runs are entries of the one trace store (session "room:<code>"): a run the room lets go, and every
# run of a room that closes, leave the store with it (serving.rooms: one budget for all held state, issue 62).
ROOMS.release = STORE.discard


# ---- the room's state in a page: {"code", "role", "secret" and "page" (teacher), "seat" (attendee)} ------------


def _teacher(st: Any) -> R.Room:
    if not isinstance(st, dict) or st.get("role") != "teacher":
        raise RoomError("Only the teacher's page can do that.")
    return ROOMS.teacher(st.get("code", ""), st.get("secret"))


def _results(st: Any) -> R.Room:
    """The room whose points the teacher's page may read: open or ended."""
    if not isinstance(st, dict) or st.get("role") not in ("teacher", "ended"):
        raise RoomError("Only the teacher's page can do that.")
    return ROOMS.results(st.get("code", ""), st.get("secret"))


def _teacher_st(room: R.Room) -> dict:
    return {"code": room.code, "role": "teacher", "secret": room.secret, "page": secrets.token_hex(8)}


def _seen_key(room: R.Room, experiment: str | None = None) -> str:
    return f"{experiment or room.experiment}:{room.points_version}"


# ---- what every class control shows -----------------------------------------------------------------------------


def _panel(ui: ClassUI, st: Any, room: R.Room | None, note: str = "", base: str = "/", gone: str = "") -> dict:
    """Every class control as a page in this role sees it ("teacher", "ended", "attendee", or none)."""
    role = st.get("role") if isinstance(st, dict) and room is not None else None
    teaching = role in ("teacher", "ended")
    out = {ui.room: st if role else None,
           ui.ident: ident(st if role else None, gone),
           ui.bar: gr.Row(visible=bool(role) or bool(note)),
           ui.entry: gr.Column(visible=role not in ("teacher", "attendee")),
           ui.bar_text: bar_html(room, role or "", note if role != "ended" else ""),
           ui.follow: gr.Radio(visible=role == "attendee", value=FOLLOW),
           ui.poll: gr.Timer(active=role == "attendee"),
           ui.teacher_poll: gr.Timer(active=role == "teacher"),
           ui.teacher_box: gr.Column(visible=teaching),
           ui.attendee_box: gr.Group(visible=role == "attendee"),
           ui.message: live.status_html(note, "warn" if role is None else "ok") if note else "",
           ui.confirm: gr.Group(visible=False),
           ui.seen: -1}
    if teaching:
        out.update({ui.card: teacher_html(room, base) if role == "teacher" else
                    ended_html(room, ROOMS.ttl_s, ROOMS.clock()),
                    ui.project: gr.Button(visible=role == "teacher"),
                    ui.private: gr.Accordion(visible=role == "teacher"),
                    ui.private_link: private_html(room, base) if role == "teacher" else "",
                    ui.experiment: gr.Dropdown(value=room.experiment or "",
                                               label="Class experiment" if role == "teacher" else
                                               "The points of the experiment"),
                    ui.count: count_html(room), ui.plot: class_plot(room),
                    ui.pick: gr.Dropdown(choices=point_choices(room), value=None),
                    ui.manage: gr.Row(visible=role == "teacher"), ui.close: gr.Button(visible=role == "teacher"),
                    ui.seen: _seen_key(room)})
    if role == "attendee":
        out[ui.task] = task_html(room)
        out[ui.posted] = mine_html(room, st.get("seat", ""))
    return out


def start_class(ui: ClassUI, st: Any, client: Any, state: Any, step: Any, request: gr.Request = None) -> dict:
    """The Start button (and ``?class=new``): a new class, unless this page already teaches an open one."""
    if isinstance(st, dict) and st.get("role") == "teacher" and room_of(st) is not None:
        room = room_of(st)
        return _panel(ui, st, room, f"You are teaching class {spaced(room.code)} already: end it to start another.",
                      page_url(request))
    try:
        room = ROOMS.create(client_key(request))
    except RoomError as exc:
        return _panel(ui, None, None, str(exc))
    st = _teacher_st(room)
    teacher_view(st, state, step)
    return _panel(ui, st, room, "Class started: project the code, attendees join with the link or the QR code.",
                  page_url(request))


def reopen(ui: ClassUI, code: str, secret: str, request: gr.Request = None, *, kept: bool = False) -> dict:
    """The teacher's page again (a reload, a new tab, the private link): the class as it was, its view restored
    first (`teacher_moved`); an ended class's points, read-only.  ``kept``: the secret came from the browser's
    storage (a class gone: the browser forgets it)."""
    try:
        room = ROOMS.teacher(code, secret)
    except RoomError as exc:
        try:
            ended = ROOMS.results(code, secret)
        except RoomError:
            gone = R.clean_code(code) if kept and "Only the teacher" not in str(exc) else ""
            return _panel(ui, None, None, str(exc), gone=gone)
        return _panel(ui, {"code": ended.code, "role": "ended", "secret": ended.secret}, ended, "", page_url(request))
    st = _teacher_st(room)
    ROOMS.begin_restore(room, st["page"])
    out = _panel(ui, st, room, "You are this class's teacher again: the class is where you left it.",
                 page_url(request))
    out[ui.restore] = next(WANTS)  # (its change: `teacher_moved`, with the page's state as it is by then)
    return out


def join_class(ui: ClassUI, code: Any, client: Any = None, request: gr.Request = None) -> dict:
    """Join as an attendee: one seat for the browser (its kept id), however many tabs it opens."""
    seat = R.seat_key(parse_client(client)["id"], str(getattr(request, "session_hash", "") or ""))
    try:
        room = ROOMS.join(R.clean_code(code) if isinstance(code, str) else "", seat, client_key(request))
    except RoomError as exc:
        return _panel(ui, None, None, str(exc))
    return _panel(ui, {"code": room.code, "role": "attendee", "seat": seat}, room,
                  "Joined: your Live tab follows the teacher's.")


def on_load(ui: ClassUI, client: Any, request: gr.Request = None) -> dict:
    """``?class=new``, ``?class=CODE`` or ``?class=CODE&teacher=SECRET``, with what the browser kept
    (ui.class_client); nothing else touches the class controls."""
    params = dict(request.query_params) if request is not None and getattr(request, "query_params", None) else {}
    code = params.get("class")
    if not code:
        return {ui.message: gr.skip()}  # (an empty dict would read as one missing value)
    kept = parse_client(client)
    if str(code).strip().lower() == "new":
        if kept["reopen"] and kept["teacher"] and ROOMS.get(kept["reopen"]) is not None:
            return reopen(ui, kept["reopen"], kept["teacher"], request, kept=True)  # this tab's class: no new one
        return start_class(ui, None, client, None, None, request)
    if params.get("teacher"):
        return reopen(ui, str(code), str(params["teacher"]), request)
    if kept["teacher"]:
        return reopen(ui, str(code), kept["teacher"], request, kept=True)
    return join_class(ui, code, client, request)


# ---- the teacher's page leads -----------------------------------------------------------------------------------


def teacher_view(st: Any, state: Any, step: Any) -> None:
    """The teacher's page moved (a round, a run, a recording): the room follows.  Nothing for other pages, nor for
    a reopened page still showing its fresh start (it ends the restore once it shows the room's view)."""
    if not isinstance(st, dict) or st.get("role") != "teacher":
        return
    key = view_key(state)
    if key is None:
        return
    room = room_of(st)
    if room is not None and ROOMS.restoring(room, st.get("page")):
        if shows_room_view(room, state, step):
            ROOMS.end_restore(room, st.get("page"))
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


def teacher_moved(ui: ClassUI, st: Any, state: Any, step: Any) -> dict:
    """The page's state changed (or a reopened teacher's page asks): on a reopened teacher's page that shows
    something other than the room's view, the room's view is drawn there (``ui.want_all``: the sync); else the
    room follows the teacher (`teacher_view`)."""
    skip = {ui.want_all: gr.skip()}
    if not isinstance(st, dict) or st.get("role") != "teacher":
        return skip
    room = room_of(st)
    if room is not None and ROOMS.restoring(room, st.get("page")) and state is not None \
            and not shows_room_view(room, state, step):
        return {ui.want_all: next(WANTS)}
    teacher_view(st, state, step)
    return skip


def on_step(st: Any, state: Any, step: Any) -> tuple[Any, ...]:
    """A step (any page's): step mode's views of the round (picture_ui.on_step); on a teacher's page, the room
    follows (`teacher_view`).  One event, where two would cost every attendee's page a request at every step."""
    teacher_view(st, state, step)
    return picture_ui.on_step(state, step)


def teacher_refresh(ui: ClassUI, st: Any, seen: Any) -> dict:
    """The teacher's bar and count (live), and the plot and points list when points came or went."""
    room = room_of(st) if isinstance(st, dict) and st.get("role") == "teacher" else None
    if room is None:
        return {ui.teacher_poll: gr.Timer(active=False)}
    out = {ui.count: count_html(room), ui.bar_text: bar_html(room, "teacher")}
    if seen != _seen_key(room):
        out.update({ui.plot: class_plot(room), ui.pick: gr.Dropdown(choices=point_choices(room), value=None),
                    ui.seen: _seen_key(room)})
    return out


def set_experiment(ui: ClassUI, st: Any, experiment: Any) -> dict:
    """The teacher sets the class's experiment (its own points and axes come with it); on an ended class's page,
    the pick only shows that experiment's points."""
    if isinstance(st, dict) and st.get("role") == "ended":
        try:
            room = _results(st)
        except RoomError as exc:
            return {ui.message: live.status_html(str(exc), "error")}
        exp = experiment if experiment in R.EXPERIMENTS else None
        return {ui.message: gr.skip(), ui.plot: class_plot(room, exp), ui.count: count_html(room, exp),
                ui.pick: gr.skip(), ui.seen: gr.skip()}
    if not isinstance(st, dict) or st.get("role") != "teacher":
        return {ui.message: gr.skip()}
    try:
        room = ROOMS.set_experiment(st.get("code", ""), st.get("secret"), experiment or None)
    except RoomError as exc:
        return {ui.message: live.status_html(str(exc), "error")}
    return {ui.message: live.status_html(f"Experiment: {R.EXPERIMENTS[room.experiment][0]}." if room.experiment
                                         else "No experiment: attendees follow only.", "ok"),
            ui.plot: class_plot(room), ui.count: count_html(room),
            ui.pick: gr.Dropdown(choices=point_choices(room), value=None), ui.seen: _seen_key(room)}


def remove_point(ui: ClassUI, st: Any, pick: Any) -> dict:
    try:
        room = _teacher(st)
        gone = ROOMS.remove_point(room.code, st.get("secret"), pick) if type(pick) is int else False
    except RoomError as exc:
        return {ui.message: live.status_html(str(exc), "error")}
    return {ui.message: live.status_html(f"Point #{pick} removed: its attendee's page says so, and that race "
                                         "cannot be posted again." if gone else "Pick a point to remove.",
                                         "ok" if gone else "info"), ui.seen: -1}


def export_points(st: Any) -> Any:
    """Every experiment's points as a CSV and a JSON file (the teacher's page, while open and after it ended)."""
    try:
        room = _results(st)
    except RoomError as exc:
        gr.Warning(str(exc))
        return gr.update(value=None, visible=False)
    return gr.update(value=write_points(room), visible=True)


def ask_close(ui: ClassUI, st: Any) -> dict:
    """"End the class…": what ending does, and the export first."""
    try:
        room = _teacher(st)
    except RoomError as exc:
        return {ui.message: live.status_html(str(exc), "error"), ui.confirm: gr.Group(visible=False)}
    n = len(ROOMS.points(room.code))
    hours = ROOMS.ttl_s / 3600
    return {ui.message: gr.skip(), ui.confirm: gr.Group(visible=True), ui.confirm_text: live.status_html(
        f"End class {spaced(room.code)} for everyone? The attendees' pages stop following. The class's {n} "
        f"point{' stays' if n == 1 else 's stay'} here, read-only, for you to export for {hours:g} h; export "
        f"{'it' if n == 1 else 'them'} first to keep {'it' if n == 1 else 'them'}.", "warn")}


def close_class(ui: ClassUI, st: Any, request: gr.Request = None) -> dict:
    try:
        room = _teacher(st)
        ROOMS.close(room.code, st.get("secret"))
    except RoomError as exc:
        return {ui.message: live.status_html(str(exc), "error")}
    out = _panel(ui, {"code": room.code, "role": "ended", "secret": room.secret}, room, "", page_url(request))
    out[ui.message] = live.status_html("The class has ended. Its points stay below for you to export.", "ok")
    return out


def wire(ui: ClassUI, demo: gr.Blocks, *, state: Any, step: Any, views: Any, run_btn: Any, run_evt: Any,
         recordings: list[Path]) -> None:
    """The class's events: the page's load, start and join, the teacher's moves, the attendees' polls, the points."""
    outs = [ui.room, ui.ident, ui.entry, ui.bar, ui.bar_text, ui.follow, ui.poll, ui.teacher_poll, ui.teacher_box,
            ui.attendee_box, ui.message, ui.confirm, ui.seen, ui.card, ui.project, ui.private, ui.private_link,
            ui.experiment, ui.count, ui.plot, ui.pick, ui.manage, ui.close, ui.task, ui.posted, ui.restore]
    quick = dict(api_visibility="private", concurrency_limit=None, show_progress="hidden")

    # (closures, not functools.partial: Gradio passes gr.Request only to a parameter it sees annotated)
    def load(client: Any, request: gr.Request = None) -> dict:
        return on_load(ui, client, request)

    def start(st: Any, state_v: Any, step_v: Any, client: Any, request: gr.Request = None) -> dict:
        return start_class(ui, st, client, state_v, step_v, request)

    def join(code: Any, client: Any, request: gr.Request = None) -> dict:
        return join_class(ui, code, client, request)

    def close(st: Any, request: gr.Request = None) -> dict:
        return close_class(ui, st, request)

    def sync(st: Any, follow: Any, state_v: Any, step_v: Any, seen: Any, request: gr.Request = None) -> dict:
        return attendee_sync(ui, views, step, recordings, st, follow, state_v, step_v, seen, request)

    # What the browser kept goes with the load, the start and the join (its id: one seat; the teacher's secret).
    demo.load(load, [ui.client], outs, js=CLIENT_JS, **quick)
    ui.start.click(start, [ui.room, state, step, ui.client], outs, js=CLIENT_JS, **quick)
    ui.join.click(join, [ui.code_in, ui.client], outs, js=CLIENT_JS, **quick)
    ui.code_in.submit(join, [ui.code_in, ui.client], outs, js=CLIENT_JS, **quick)
    ui.ident.change(None, [ui.ident], None, js=IDENT_JS, api_visibility="private")  # what the browser keeps
    ui.project.click(None, None, None, js=PROJECT_JS, api_visibility="private")
    # Ending asks first (and offers the export); the ended class's points stay for the teacher's export.
    shown = "() => document.querySelector('#sv-class-confirm')?.scrollIntoView({block: 'nearest'})"
    ui.close.click(functools.partial(ask_close, ui), [ui.room], [ui.message, ui.confirm, ui.confirm_text],
                   **quick).then(None, None, None, js=shown, api_visibility="private")
    ui.confirm_cancel.click(lambda: gr.Group(visible=False), None, [ui.confirm], **quick)
    ui.confirm_end.click(close, [ui.room], outs, **quick)
    # The teacher's page: every round or run it shows goes to its room (nothing happens on other pages); a
    # reopened teacher's page first shows the room's view (the sync, through ui.want_all).
    # (a step's: on_step, app.py's step-mode event, which every page fires at every step)
    moved = functools.partial(teacher_moved, ui)
    state.change(moved, [ui.room, state, step], [ui.want_all], **quick)
    ui.restore.change(moved, [ui.room, state, step], [ui.want_all], **quick)
    # The attendees' pages: a poll a second; following again catches up at once; a Run of one's own leaves.
    sync_in, sync_outs = [ui.room, ui.follow, state, step, ui.seen], [*views.outputs, ui.bar_text, ui.poll,
                                                                      ui.follow, ui.room, ui.task, ui.posted, ui.seen]
    # A poll's outputs are the step and two hidden numbers (most polls change none: nothing is drawn or sent); a
    # new round is the step, a changed bar syncs the few outputs in `small`, another recording every view.
    small_outs = [step, views["narration"], views["step_round"], ui.bar_text, ui.poll, ui.follow, ui.room, ui.task,
                  ui.posted, ui.seen, ui.want_all]
    small = frozenset(small_outs)

    async def poll(st: Any, follow: Any, state_v: Any, step_v: Any, seen: Any, request: gr.Request = None) -> dict:
        # (room_wait: a poll finding the page up to date waits for the teacher's next move, on the event loop)
        answer = functools.partial(attendee_poll, ui, views, step, recordings, st, follow, state_v, step_v, seen,
                                   request, small)
        room = room_of(st) if follow == FOLLOW and isinstance(st, dict) and st.get("role") == "attendee" else None
        version = room.version if room is not None else None
        out = await anyio.to_thread.run_sync(answer)
        if room is None or not changes_nothing(out):
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
    exp_outs = [ui.message, ui.plot, ui.count, ui.pick, ui.seen]
    ui.experiment.input(functools.partial(set_experiment, ui), [ui.room, ui.experiment], exp_outs, **quick)
    refresh_outs = [ui.count, ui.bar_text, ui.plot, ui.pick, ui.seen, ui.teacher_poll]
    ui.teacher_poll.tick(functools.partial(teacher_refresh, ui), [ui.room, ui.seen], refresh_outs, **quick)
    ui.remove.click(functools.partial(remove_point, ui), [ui.room, ui.pick], [ui.message, ui.seen], **quick).then(
        functools.partial(teacher_refresh, ui), [ui.room, ui.seen], refresh_outs, **quick)
    for button in (ui.export, ui.confirm_export):
        button.click(export_points, [ui.room], [ui.files], **quick)
