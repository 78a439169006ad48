"""Following the teacher (class mode): what a page shows, as its room names it, and the Live tab's frame of what
the room's teacher shows.  Following runs no model: a shipped recording is drawn once per process (ui.live), and a
run of the teacher's own is drawn once per room and shared by every attendee's page (`_run_frame`)."""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from ..serving import rooms as R
from ..serving.rooms import ROOMS
from ..theory.figures import run_figures
from ..views import html as V
from ..views import plots as P
from ..views import race_plots as RP
from . import live
from .frames import SKIP, LiveFrame, round_number
from .store import Shown
from .tree_ui import live_tree, mask_for, tree_figures


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
        return room_run(self.room, self.key)

    @property
    def nbytes(self) -> int | None:
        return None


ROOM_SESSION = "room:"  # the trace store's session of a room's shown runs: "room:<code>"


def room_run(code: str, key: str) -> dict | None:
    """The traces of a run the room's teacher showed ({"spec", "std"}), while the room and the trace store hold it
    (None once the room let it go, or the store needed the room for its fair share)."""
    handle = ROOMS.payload(code, key)
    return handle._found() if isinstance(handle, Shown) else None


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
FRAMES_KEPT = 4  # drawn views of up to 4 rooms' runs (each held by the trace store, within its budget)


def _run_frame(code: str, key: str) -> LiveFrame | None:
    """The Live tab's frame for a run of the teacher's, drawn once and shared by the room's pages (as ui.live's
    shipped recordings are): the same views as live.final_frame, with a RoomShown handle, no store entry and
    no export file."""
    payload = room_run(code, key)
    with _FRAMES_LOCK:
        for k in [k for k in _FRAMES if room_run(*k) is None]:  # drawn views of runs no longer held go with them
            del _FRAMES[k]
        if (code, key) in _FRAMES:
            _FRAMES.move_to_end((code, key))
            return _FRAMES[(code, key)]
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
        metrics=V.metrics_html(summary, gamma=spec.gamma if spec else 0, figures=run_figures(spec, std)),
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


def rounds_of(state: Any) -> int:
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
    n = rounds_of(frame.state)
    i = round_number(room.step, n)
    narration, step_round = live.step_views(frame.state.get("spec"), i)
    return dataclasses.replace(frame, narration=narration, step_round=step_round,
                               step=gr.Slider(minimum=1, maximum=max(n, 2), value=i, step=1, interactive=n > 0,
                                              label=f"Round (1–{n})" if n else "Round"))
