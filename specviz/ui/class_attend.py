"""Class mode's attendee events (issue 58, 66): the poll that follows the teacher, and a race posted as a point.

An attendee's seat is its browser's (serving.room_points.seat_key; the page's state holds the seat the server
gave it at the join), so every tab and reload of one browser is one attendee.  The same sync also serves a
teacher's page just reopened: it shows the room's view there first (ui.classroom's restore), where the page's own
start would have replaced it.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from pathlib import Path
from typing import Any

import gradio as gr

from ..serving import rooms as R
from ..serving.clients import client_key
from ..serving.rooms import ROOMS, RoomError
from ..views import html as V
from . import live
from .class_follow import RoomShown, rounds_of, view_frame, view_key
from .class_layout import EXPLORE, FOLLOW, ClassUI
from .class_views import bar_html, mine_html, point_values, race_identity, task_html
from .frames import LiveFrame, round_number
from .store import Shown

log = logging.getLogger("specviz.classroom")


def room_of(st: Any) -> R.Room | None:
    return ROOMS.get(st.get("code", "")) if isinstance(st, dict) else None


def seat_of(st: Any, request: Any) -> str:
    """The page's seat: the one the join gave it (its browser's), else its session's."""
    seat = st.get("seat") if isinstance(st, dict) else None
    return seat if isinstance(seat, str) and seat else R.seat_key(None, getattr(request, "session_hash", "") or "")


def shows_room_view(room: R.Room, state: Any, step: Any) -> bool:
    """Whether a page shows what the room's teacher shows, at the same round."""
    if view_key(state) != room.view_key:
        return False
    n = rounds_of(state) or 2**31
    return round_number(step, n) == round_number(room.step, n)


# ---- the experiment's points ----------------------------------------------------------------------------------


def post_race(st: Any, state: Any, request: gr.Request = None) -> str:
    """Post the race this attendee's page shows to its room: a sentence for the page."""
    if not isinstance(st, dict) or st.get("role") != "attendee":
        return ""
    seat = seat_of(st, request)
    room = room_of(st)
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
        ROOMS.join(room.code, seat, client_key(request))
        point = ROOMS.post_point(room.code, seat, race_identity(spec, std), point_values(spec, std))
    except RoomError as exc:
        return live.status_html(f"Refused: {exc}.", "error")
    v = point.values
    return live.status_html(f"Posted to the class: γ = {v['gamma']:g}, ε = {v['epsilon'] or 0:g}, α = "
                            f"{v['alpha']:.2f}, speedup {v['speedup']:.2f}×{' (flagged)' if v['flagged'] else ''}.",
                            "ok")


# ---- following -------------------------------------------------------------------------------------------------


def teacher_sync(ui: ClassUI, views: Any, step_c: Any, recordings: list[Path], st: dict, state: Any,
                 step: Any) -> dict:
    """A reopened teacher's page: the room's view (recording or run, and round), where the page's own start showed
    its default; nothing once the page shows it (or the room has nothing to show)."""
    room = room_of(st)
    skip = {ui.seen: gr.skip()}
    if room is None or not ROOMS.restoring(room, st.get("page")):
        return skip
    if view_key(state) != room.view_key:
        frame = view_frame(room, recordings)
        if frame is None:  # (a recording this server no longer has): the page's own view stands
            ROOMS.end_restore(room, st.get("page"))
            return skip
        return views.write(frame)
    if not shows_room_view(room, state, step):
        return {step_c: round_number(room.step, rounds_of(state) or 1)}
    return skip


def attendee_sync(ui: ClassUI, views: Any, step_c: Any, recordings: list[Path], st: Any, follow: Any, state: Any,
                  step: Any, seen: Any = None, request: gr.Request = None) -> dict:
    """An attendee's poll: while following, show the teacher's recording at the teacher's round (only what
    differs is sent: most polls send nothing)."""
    if isinstance(st, dict) and st.get("role") == "teacher":
        return teacher_sync(ui, views, step_c, recordings, st, state, step)
    if not isinstance(st, dict) or st.get("role") != "attendee":
        return {ui.poll: gr.Timer(active=False)}
    room = room_of(st)
    if room is None:
        return {ui.bar_text: bar_html(None, "", "This class has ended. The page is yours."),
                ui.poll: gr.Timer(active=False), ui.follow: gr.Radio(visible=False), ui.room: None}
    seat = seat_of(st, request)
    ROOMS.seen(room, seat)
    out: dict = {ui.seen: gr.skip()}  # (an empty dict would read as one missing value)
    task, bar, mine = task_html(room), bar_html(room, "attendee"), mine_html(room, seat)
    said = hashlib.sha256((task + bar + mine).encode()).hexdigest()[:16]
    if seen != said:  # what the bar, the task or the attendee's points say changed: those too
        out.update({ui.task: task, ui.bar_text: bar, ui.posted: mine, ui.seen: said})
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


WANTS = itertools.count(1)


def changes_nothing(out: dict) -> bool:
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
    if changes_nothing(out):
        return {ui.want: skip, ui.want_all: skip, step_c: skip}
    if set(out) <= {step_c, views["narration"], views["step_round"], ui.seen}:  # the round only: the step, whose
        return {ui.want: skip, ui.want_all: skip, step_c: out[step_c]}  # change event draws the round (on_step)
    if set(out) <= small:
        return {ui.want: next(WANTS), ui.want_all: skip, step_c: skip}
    return {ui.want: skip, ui.want_all: next(WANTS), step_c: skip}


def attendee_step(ui: ClassUI, views: Any, step_c: Any, recordings: list[Path], st: Any, follow: Any, state: Any,
                  step: Any, seen: Any = None, request: gr.Request = None, small: frozenset = frozenset()) -> dict:
    """``ui.want``'s change: the sync, with the few outputs a new round needs (``small``); if by now the page needs
    more (the teacher showed another recording meanwhile), ``ui.want_all`` changes instead."""
    out = attendee_sync(ui, views, step_c, recordings, st, follow, state, step, seen, request)
    return out if set(out) <= small else {ui.want_all: next(WANTS)}
