"""The Live tab's handlers: Run, Stop, replay, recordings and step mode.

Each returns (or yields) a `LiveFrame` of plain values; app.py's wiring turns
it into ``{component: value}``.  No Blocks are needed to call them, so tests
call them directly.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import dataclasses
import functools
import gc
import html
import logging
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Iterator

import gradio as gr

from ..core.settings import round_kind
from ..models import ModelError
from ..serving.cancel import CANCELS
from ..serving.jobs import Decoding, Finished, Job, Loading, Replaying, RunFailed, Stalled, Waiting, run_job
from ..serving.replay import Busy, Entry, replay_speed
from ..serving.service import InputError, Update, describe_error, job_seconds
from ..theory.figures import run_figures
from ..theory.timing import flagged, starting, trusted_speedup
from ..trace import MAX_TRACE_BYTES, Trace, TraceError, load_recording, recording_bytes
from ..views import html as V
from ..views.rules import rules_html
from ..views import plots as P
from ..views import race_plots as RP
from ..views._fmt import draft_source, plural
from ..views.execution import trace_exec_line
from .form import RunForm
from .exports import export_file, shipped_export
from .frames import SKIP, LiveFrame, round_number
from .store import STORE, Shown, StoreFull
from .tree_ui import Walks, live_tree, mask_for, step_tree, tree_figures

log = logging.getLogger("specviz.app")
UI_THROTTLE_S = 0.06  # at most ~16 UI updates a second while decoding
# The largest recording the page draws: a real 1024-token run is ~1-5 MB; a bigger file would
# take hundreds of MB of plots and HTML per visitor.
MAX_DRAW_BYTES = 8 * 2**20
TRIM_AFTER_BYTES = 2**20  # loads of larger recordings return their freed memory to the system


def status_html(text: str, kind: str = "info") -> str:
    return f'<div class="sv-status sv-status-{kind}" data-kind="{kind}">{html.escape(text)}</div>'


def step_views(spec: Trace | None, idx: Any) -> tuple[str, str]:
    """Step mode: (narration, the round and the text up to it) for round ``idx`` (1-based)."""
    if not spec or not spec.rounds:
        return "<p class='sv-muted'>Run or load a trace to step through its rounds.</p>", ""
    i = round_number(idx, len(spec.rounds)) - 1  # whatever the page sent (issue 33)
    rnd = spec.rounds[i]
    if rnd.tree is not None:
        return step_tree(spec, rnd)
    round_html = V.round_html(rnd, spec.gamma, epsilon=spec.settings.epsilon, current=True,
                              policy=spec.settings.policy, drafter=spec.settings.drafter, rule=spec.settings.rule)
    return V.narrate_html(rnd, spec), (round_html + rules_html(rnd, spec)
                                       + V.text_html([t for r in spec.rounds[: i + 1] for t in r.emitted]))


def final_frame(spec: Trace | None, std: Trace | None, status: str, shipped: Path | None = None,
                run: bool = False) -> LiveFrame:
    """Everything drawn from a finished race (or a loaded recording); when the server cannot keep it for
    this session (its share of the store, issue 33), the status line says so and the page keeps what it showed.
    ``shipped``: the file of a shipped recording being shown, referred to by name (no store entry, issue 55);
    ``run``: a run of the visitor's own (the Challenges count it as soon as it is shown)."""
    if shipped is not None:
        state, data = Shown.shipped(shipped), None  # the export is the shipped file itself
    else:
        data = recording_bytes(spec, std) if (spec or std) else b""  # once: the export file and the store's size
        try:
            state = STORE.put(spec, std, len(data), run=run)
        except StoreFull as exc:
            return LiveFrame(status=status_html(str(exc), "warn"))
    summary = spec.summary() if spec else (std.summary() if std else None)
    n = len(spec.rounds) if spec else 0
    narration, step_round = step_views(spec, 1)
    plot_tree_size, plot_tree_verify = tree_figures(spec)
    trees = bool(spec) and any(r.tree is not None for r in spec.rounds)  # chain runs hide the tree-only parts
    return LiveFrame(
        status=status, legend=V.legend_html(spec), rounds=V.rounds_html(spec), race=V.race_html(spec, std),
        state=state,
        metrics=V.metrics_html(summary, gamma=spec.gamma if spec else 0, figures=run_figures(spec, std)),
        plot_pos=P.acceptance_by_position(spec), plot_hist=P.tokens_per_round_hist(spec),
        plot_draft=P.draft_lengths(spec), plot_time=P.round_times(spec), plot_curve=RP.tokens_vs_time(spec, std),
        plot_speed=RP.speedup_bars(spec, std),
        step=gr.Slider(minimum=1, maximum=max(n, 2), value=1, step=1, interactive=n > 0,
                       label=f"Round (1–{n})" if n else "Round"),
        narration=narration, step_round=step_round,
        export=shipped_export(shipped) if shipped is not None else export_file(spec, std, data=data),
        tree=live_tree(spec), tree_mask=mask_for(spec), plot_tree_size=plot_tree_size,
        plot_tree_verify=plot_tree_verify, tree_mask_box=gr.update(visible=trees), tree_plots=gr.update(visible=trees),
    )


# ---- the run ----------------------------------------------------------------------------


def run(form: RunForm, session: str | None = None,
        progress: Callable[..., Any] | None = None) -> Iterator[LiveFrame]:
    """Speculative and standard decoding, interleaved (serving.service.race), streamed to the page round by round.

    Every drafted token is drawn (dashed, pending) while the next one is drafted,
    at most every UI_THROTTLE_S seconds.  A request identical to a finished run is
    replayed from the recording cache (marked as such, no model lock taken); one
    identical to a run in progress follows that run (specviz.serving.jobs)."""
    try:
        job = form.check()
    except InputError as exc:
        yield LiveFrame(status=status_html(str(exc), "error"))
        raise gr.Error(str(exc), print_exception=False)
    show = _Shown(job)
    _live_pop(session)  # a stopped run's traces left for its Stop (below) are stale now
    flag = CANCELS.start(session)  # Stop and a closed page set it: read inside the run (serving.cancel)
    try:
        # closing(): Stop or a closed page ends the job at once (its engine loop, the gate, the cache entry).
        report = (lambda f, m: progress(f, desc=m)) if progress else None
        with contextlib.closing(run_job(job, progress=report, should_stop=flag.is_set)) as events:
            for ev in events:
                if isinstance(ev, Loading):
                    yield LiveFrame(status=status_html("Loading models…"))
                elif isinstance(ev, Waiting):
                    yield LiveFrame(status=status_html(f"Waiting for the models: {ev.ahead} run"
                                                       f"{'s' if ev.ahead != 1 else ''} waiting (this one included)…"))
                elif isinstance(ev, Decoding):
                    _live_put(session, ev.update.spec, ev.update.std, _running(ev.update))
                    yield from _until(flag, show.decoding(ev.update))
                elif isinstance(ev, Replaying):
                    yield from _until(flag, show.replaying(ev, session))
                elif isinstance(ev, Finished):
                    if flag.is_set():
                        # Stop (or a closed page) ended the run, often before Stop's own drawing (live.stop) runs:
                        # leave it the finished traces to draw, and draw nothing more here, since a last frame
                        # could land after Stop's and overwrite it.
                        _live_put(session, ev.spec, ev.std, ())
                        return
                    _live_pop(session)
                    yield from show.rest_of_walks(ev.spec)  # the models are free again: the pace costs no one
                    label = f"{replay_label(ev.replayed)}. " if ev.replayed is not None else ""
                    yield final_frame(ev.spec, ev.std, status_html(label + done_message(ev.spec, ev.std), "ok"),
                                      run=True)
    except (InputError, ModelError, Busy, RunFailed) as exc:
        _live_pop(session)
        yield LiveFrame(status=status_html(str(exc), "error"))
        raise gr.Error(str(exc), print_exception=False)
    except Stalled:
        yield LiveFrame(status=status_html("The identical runs in progress kept stopping; press Run again.", "warn"))
    except Exception as exc:  # drawing a frame broke: end this run cleanly, never a traceback on the page
        log.exception("run failed")
        _live_pop(session)
        yield LiveFrame(status=status_html(describe_error(exc), "error"))
        raise gr.Error(describe_error(exc), print_exception=False)
    finally:
        CANCELS.finish(session, flag)


def _until(flag: threading.Event, frames: Iterator[LiveFrame]) -> Iterator[LiveFrame]:
    """``frames`` until Stop (or a closed page) sets ``flag``: after it only Stop's drawing draws, since a frame
    of the run could land after Stop's and overwrite it."""
    for frame in frames:
        if flag.is_set():
            return
        yield frame


class _Shown:
    """What one run has drawn so far: throttling, the legend (once), and its tree walks."""

    def __init__(self, job: Job):
        self.trees = round_kind(job.settings.drafter) == "tree"
        self.last = 0.0
        self.legend_drawn = False
        self.walks = Walks()

    def decoding(self, up: Update) -> Iterator[LiveFrame]:
        spec, std, ev = up.spec, up.std, up.event
        if up.phase == "speculative" and ev.kind == "round" and self.trees:
            self.walks.add(ev.round)  # a tree round's verdict is never throttled away: its walk is queued
        step = self.walks.due() if up.phase == "speculative" else None
        now = time.perf_counter()
        if step is None and ev.kind != "done" and now - self.last < UI_THROTTLE_S:
            return
        self.last = now
        # The two runs advance in alternation (serving.service.race): both columns are drawn from
        # their own traces, each as far as its own clock has got.
        race = V.race_html(spec, std, spec_running=not up.spec_done, std_running=std is not None and not up.std_done)
        if up.phase == "speculative":
            pending = ev.round if ev.kind == "draft" else None
            msg = f"Speculative decoding · round {len(spec.rounds) + (1 if pending else 0)} · {spec.n_tokens} tokens"
            if std is not None and not up.std_done:
                msg += f" · standard {std.n_tokens}"
            frame = LiveFrame(status=status_html(msg), rounds=V.rounds_html(spec, pending_round=pending), race=race)
            if not self.legend_drawn:  # say which drafter and policy are running, once
                frame.legend, self.legend_drawn = V.legend_html(spec), True
                frame.tree_mask_box = frame.tree_plots = gr.update(visible=self.trees)  # the tree-only parts
            if step is not None:
                frame.status = status_html(f"{msg} · {Walks.status(step)}")
                frame.tree = Walks.tree(spec, step)
            elif self.trees and not self.walks.active:  # a walk on screen keeps the panel
                frame.tree = live_tree(spec, pending)
            yield frame
        else:  # the standard baseline
            if step is None:
                step = self.walks.due()  # a walk still playing goes on beside the baseline
            msg = f"Standard decoding (the baseline) · {std.n_tokens} tokens"
            if spec is not None and not up.spec_done:  # the two runs interleave: the same line as the other side's
                msg = (f"Speculative decoding · round {len(spec.rounds)} · {spec.n_tokens} tokens · "
                       f"standard {std.n_tokens}")
            frame = LiveFrame(status=status_html(msg), race=race)
            if step is not None:
                frame.status = status_html(f"{msg} · {Walks.status(step)}")
                frame.tree = Walks.tree(spec, step)
            yield frame

    def rest_of_walks(self, spec: Trace | None) -> Iterator[LiveFrame]:
        for step in self.walks.rest():
            yield LiveFrame(status=status_html(f"Decoding done · {Walks.status(step)}"), tree=Walks.tree(spec, step))

    def replaying(self, ev: Replaying, session: str | None) -> Iterator[LiveFrame]:
        """A finished run replayed at its recorded times, or a run in progress followed as it goes."""
        label = replay_label(ev.entry)
        snap = ev.snapshot
        if snap is None:
            yield LiveFrame(status=status_html(f"{label} (still running): waiting for the models…"))
            return
        spec, std = snap.spec, snap.std
        _live_put(session, spec, std, ("spec",) * (snap.phase == "speculative") + ("std",) * (std is not None))
        now = time.perf_counter()
        if now - self.last < UI_THROTTLE_S:
            return
        self.last = now
        if snap.phase == "speculative" and spec is not None:
            frame = LiveFrame(status=status_html(f"{label} · round {len(spec.rounds)} · {spec.n_tokens} tokens"),
                              rounds=V.rounds_html(spec),
                              race=V.race_html(spec, std, spec_running=True, std_running=std is not None))
            if not self.legend_drawn:
                frame.legend, self.legend_drawn = V.legend_html(spec), True
            yield frame
        elif std is not None:
            yield LiveFrame(status=status_html(f"{label} · standard decoding · {std.n_tokens} tokens"),
                            race=V.race_html(spec, std, std_running=True))


def done_message(spec: Trace, std: Trace | None) -> str:
    summ = spec.summary()
    sp = V.race_speedup(spec, std)
    msg = f"Done: {spec.n_tokens} tokens in {len(spec.rounds)} rounds, α = {summ.alpha or 0:.2f}"
    if spec.stop_reason in ("time_limit", "stopped"):
        why = (f"Stopped at the server's time limit for one run ({job_seconds():.0f} s, SPECVIZ_JOB_SECONDS)"
               if spec.stop_reason == "time_limit" else "Stopped (the page was closed or Stop was pressed)")
        n = len(spec.rounds)
        where = " while reading the prompt" if not n else f" after {plural(n, 'round')}"
        advice = " A shorter prompt or fewer new tokens fits in the limit." if spec.stop_reason == "time_limit" else ""
        return f"{why}{where}: {spec.n_tokens} tokens.{advice}"
    timing = spec.timing
    if sp and flagged(spec):  # the clocks were disturbed: say so, never state them
        trusted = trusted_speedup(spec, sp)
        shown = (f", count-based ≈{trusted:.2f}× standard decoding" if trusted
                 else f", {sp:.2f}× by a wall clock that cannot be trusted")
        cause = "the server was still starting" if starting(timing) else "the machine was busy during this race"
        return msg + f"{shown}; timings ±{timing.spread:.0%}: {cause}"
    if sp and sp < 1:  # a loss in plain words, never "0.58× faster" (nor "0.58× slower")
        return msg + f", speculative took {1 / sp:.2f}× as long per token ({sp:.2f}× the speed of standard decoding)"
    return msg + (f", speedup {sp:.2f}× over standard decoding" if sp else "")


def replay_label(entry: Entry) -> str:
    """How the page marks a replay: what was replayed, when and where it ran."""
    where = entry.machine or "this server"
    if entry.recorded_at is None:
        return f"↻ Replay of an identical run ({entry.source}, made on {where})"
    return f"↻ Replay of an identical run made at {entry.recorded_at} on {where}"


def _running(up: Update) -> tuple[str, ...]:
    """The sides still running at this update ("spec", "std"): both, while the race interleaves them."""
    return tuple(side for side, trace, done in (("spec", up.spec, up.spec_done), ("std", up.std, up.std_done))
                 if trace is not None and not done)


# ---- Stop ---------------------------------------------------------------------------------
# Stop cancels the run's event, which ends its generator at once: the run cannot draw its own last
# frame.  So the run leaves its traces so far here (per browser session), and Stop draws them.

_LIVE: OrderedDict[str, tuple] = OrderedDict()  # session -> (spec, std, side still running or None)
_LIVE_LOCK = threading.Lock()
_LIVE_MAX = 64  # sessions; a finished run removes its entry, Stop a stopped one's (a closed page's: this bound)


def _live_put(session: str | None, spec, std, running: tuple[str, ...]) -> None:
    """running: the sides still running ("spec", "std"); () when the run is over."""
    if not session:
        return
    with _LIVE_LOCK:
        _LIVE[session] = (spec, std, running)
        _LIVE.move_to_end(session)
        while len(_LIVE) > _LIVE_MAX:
            _LIVE.popitem(last=False)


def _live_pop(session: str | None):
    if not session:
        return None
    with _LIVE_LOCK:
        return _LIVE.pop(session, None)


def _as_stopped(tr: Trace | None) -> Trace | None:
    """A copy of a trace cut short by Stop, drawn as finished ('stopped') at its last whole round."""
    if tr is None:
        return None
    tr = copy.copy(tr)
    tr.rounds = list(tr.rounds)
    tr.stop_reason = "stopped"
    if tr.rounds:
        tr.t_total = tr.rounds[-1].t_end
    return tr


_PRESSED: OrderedDict[str, bool] = OrderedDict()  # session -> whether a run was in progress when Stop was pressed


def press_stop(session: str | None) -> bool:
    """Stop's first step (outside the queue): the session's run in progress stops (serving.cancel), and whether it
    had one is kept for Stop's drawing, which follows (`stopped`).  The server's own knowledge of the run, never
    the page's word: an event's inputs are whatever its client sends (issue 62)."""
    running = CANCELS.cancel(session)
    if session:
        with _LIVE_LOCK:
            _PRESSED[session] = running
            _PRESSED.move_to_end(session)
            while len(_PRESSED) > _LIVE_MAX:
                _PRESSED.popitem(last=False)
    return running


def _shown_traces(state: Any) -> tuple[Trace | None, Trace | None]:
    """(spec, std) the page's state shows: none for an empty state, or one whose traces the server dropped."""
    get = getattr(state, "get", None)
    if not state or get is None:
        return None, None
    return get("spec"), get("std")


def stopped(state: Any, session: str | None = None) -> LiveFrame:
    """Stop pressed: draw the run as far as it got (no round left "verifying…") and say it stopped.

    Decided from what the server knows of the session: the traces its run left (`_live_put`), whether a run was
    in progress when Stop was pressed (`press_stop`), the traces its state shows.  Never an empty frame, whatever
    the state (empty, dropped by the store or by Gradio): Gradio reads an empty dict as one missing value of the
    event's 22 ("on_stop didn't return enough output values"), and puts "Error" on every output."""
    live = _live_pop(session)
    with _LIVE_LOCK:
        was_running = _PRESSED.pop(session, False) if session else False
    if live:
        spec, std, running = live
        spec = _as_stopped(spec) if "spec" in running else spec
        std = _as_stopped(std) if "std" in running else std
        if spec is not None and not spec.rounds:
            msg = "Stopped while reading the prompt"
        else:
            msg = f"Stopped after {plural(spec.n_tokens if spec else 0, 'speculative token')}"
            msg += f" and {plural(std.n_tokens, 'standard token')}" if std else ""
        status = status_html(msg + ". Press Run to start again.", "warn")
        # Everything on the page then shows this run as far as it got (its rounds, numbers, charts, export),
        # as for a run the time limit stopped.  Not counted as a run of the visitor's (run=False).
        frame = final_frame(spec, std, status)
        if frame.race is SKIP:  # the store has no room to keep it: draw where it got all the same
            frame = LiveFrame(status=status, race=V.race_html(spec, std))
            if spec:
                frame.rounds, frame.tree = V.rounds_html(spec), live_tree(spec)
        return frame
    if was_running:  # stopped before it drew a token: while loading the models, or waiting for them
        return LiveFrame(status=status_html("Stopped. Press Run to start again.", "warn"))
    spec, std = _shown_traces(state)
    if spec or std:  # no run: a replay of the race was stopped, so show the finished race
        return LiveFrame(race=V.race_html(spec, std))
    return LiveFrame(status=gr.skip())  # nothing ran, nothing shown to redraw: the page stays as it is


def stop(_status: Any, state: Any, session: str | None = None) -> LiveFrame:
    """`stopped`, called as the page once called it, with its status line first: that argument is ignored."""
    return stopped(state, session)


def replay(state: Any) -> Iterator[str]:
    """Replay both runs in real time from their recorded timestamps (the race panel only),
    faster for a run longer than MAX_REPLAY_S so a replay never takes longer than that."""
    spec, std = (state or {}).get("spec"), (state or {}).get("std")
    if not spec and not std:
        yield V.race_html(None, None)
        return
    end = max(t.t_total for t in (spec, std) if t)
    speed = replay_speed(end)
    t0 = time.perf_counter()
    while True:
        t = (time.perf_counter() - t0) * speed
        yield V.race_html(spec, std, at_time=min(t, end))
        if t >= end:
            return
        time.sleep(0.1)


# ---- recordings -----------------------------------------------------------------------------


def show_recording(spec: Trace | None, std: Trace | None, label: str, shipped: Path | None = None) -> LiveFrame:
    where = spec or std
    msg = (f"{label}: {draft_source(where)} → {where.models.get('target', '')} · "
           f"{trace_exec_line(where, recorded=True, brief=True)}")  # in full: the legend
    return final_frame(spec, std, status_html(msg, "ok"), shipped=shipped)


def load_file(file: Any) -> LiveFrame:
    """Load an exported recording and show it as if it had just run."""
    if file is None:
        return LiveFrame()
    try:
        path = Path(file if isinstance(file, str) else file.name)
        size, limit = path.stat().st_size, min(MAX_DRAW_BYTES, MAX_TRACE_BYTES)
        if size > limit:
            raise TraceError(f"the file is too large for this page to draw ({size / 2**20:.1f} MB; the page draws "
                             f"recordings up to {limit / 2**20:.0f} MB, about a 1,000-token run)")
        data = path.read_bytes()
        spec, std = load_recording(data)
    except (TraceError, OSError) as exc:
        return LiveFrame(status=status_html(f"Could not load that file: {exc}", "error"))
    frame = show_recording(spec, std, f"Loaded {path.name}")
    if len(data) > TRIM_AFTER_BYTES:
        # Parsing and drawing a large recording allocates ~20× its size for a moment; give the freed
        # heap back, as after a run (measured: RSS ~120 MiB lower after 30 loads of a 7 MB recording).
        # The young objects only: the loaded traces hold no cycle, and a full collection walks every
        # object of the server with the GIL held (0.3-0.5 s beside big recordings; issue 33).
        gc.collect(1)
        trim_heap()
    return frame


def trim_heap() -> None:
    """Freed heap pages back to the system (glibc's malloc_trim; nothing elsewhere)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc (musl): nothing to trim
            pass


def load_example_recording(recordings: list[Path], name: str | None = None) -> LiveFrame:
    if not recordings:
        return LiveFrame()
    path = next((p for p in recordings if p.name == name), recordings[0])
    # Drawn once per process (a visit costs no drawing, no store entry: issue 55); the export file is checked
    # at each visit, as the export folder keeps only the newest files.
    return dataclasses.replace(_drawn_recording(path), export=shipped_export(path))


@functools.lru_cache(maxsize=16)
def _drawn_recording(path: Path) -> LiveFrame:
    """A shipped recording's frame (its views), made once: the file does not change while the server runs, and a
    frame is plain values that every visitor's page is sent (never changed in place: handlers copy it)."""
    shown = Shown.shipped(path)  # read once per process; shown by name, no store entry
    frame = show_recording(shown.get("spec"), shown.get("std"), f"Recorded example ({path.stem})", shipped=path)
    return dataclasses.replace(frame, export=SKIP)


def next_round(state: Any, idx: Any) -> int:
    spec = (state or {}).get("spec")
    n = len(spec.rounds) if spec else 1
    return min(round_number(idx, n) + 1, n)


def prev_round(idx: Any, state: Any = None) -> int:
    """The round before ``idx`` (at least 1; at most the last round of what is shown, when ``state`` is given)."""
    spec = (state or {}).get("spec") if state is not None else None
    n = len(spec.rounds) if spec else 2**31
    return max(round_number(idx, n) - 1, 1)
