"""The Live tab's handlers: Run, Stop, replay, recordings and step mode.

Each returns (or yields) a `LiveFrame` of plain values; app.py's wiring turns
it into ``{component: value}``.  No Blocks are needed to call them, so tests
call them directly.
"""

from __future__ import annotations

import copy
import html
import logging
import os
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Iterator

import gradio as gr

from ..models import ModelError
from ..service import MODEL_LOCK, InputError, describe_error, race
from ..trace import MAX_TRACE_BYTES, Trace, TraceError, load_recording, recording_to_json
from ..views import html as V
from ..views import plots as P
from .form import RunForm
from .frames import LiveFrame
from .tree_ui import live_tree, mask_for, step_tree, tree_figures

log = logging.getLogger("specviz.app")
UI_THROTTLE_S = 0.06  # at most ~16 UI updates a second while decoding


def status_html(text: str, kind: str = "info") -> str:
    return f'<div class="sv-status sv-status-{kind}" data-kind="{kind}">{html.escape(text)}</div>'


def step_views(spec: Trace | None, idx: Any) -> tuple[str, str]:
    """Step mode: (narration, the round and the text up to it) for round ``idx`` (1-based)."""
    if not spec or not spec.rounds:
        return "<p class='sv-muted'>Run or load a trace to step through its rounds.</p>", ""
    i = min(max(int(idx or 1), 1), len(spec.rounds)) - 1
    rnd = spec.rounds[i]
    if rnd.tree is not None:
        return step_tree(spec, rnd)
    round_html = V.round_html(rnd, spec.gamma, epsilon=spec.settings.epsilon, current=True,
                              policy=spec.settings.policy)
    return V.narrate_html(rnd, spec), round_html + V.text_html([t for r in spec.rounds[: i + 1] for t in r.emitted])


def final_frame(spec: Trace | None, std: Trace | None, status: str) -> LiveFrame:
    """Everything drawn from a finished race (or a loaded recording)."""
    summary = spec.summary() if spec else (std.summary() if std else None)
    n = len(spec.rounds) if spec else 0
    narration, step_round = step_views(spec, 1)
    plot_tree_size, plot_tree_verify = tree_figures(spec)
    return LiveFrame(
        status=status, legend=V.legend_html(spec), rounds=V.rounds_html(spec), race=V.race_html(spec, std),
        state={"spec": spec, "std": std}, metrics=V.metrics_html(summary, gamma=spec.gamma if spec else 0),
        plot_pos=P.acceptance_by_position(spec), plot_hist=P.tokens_per_round_hist(spec),
        plot_draft=P.draft_lengths(spec), plot_time=P.round_times(spec), plot_curve=P.tokens_vs_time(spec, std),
        plot_speed=P.speedup_bars(spec, std),
        step=gr.Slider(minimum=1, maximum=max(n, 2), value=1, step=1, interactive=n > 0,
                       label=f"Round (1–{n})" if n else "Round"),
        narration=narration, step_round=step_round, export=export_file(spec, std),
        tree=live_tree(spec), tree_mask=mask_for(spec), plot_tree_size=plot_tree_size,
        plot_tree_verify=plot_tree_verify,
    )


def export_file(spec: Trace | None, std: Trace | None) -> str | None:
    if not spec and not std:
        return None
    fd, path = tempfile.mkstemp(prefix="specviz-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(recording_to_json(spec, std, indent=1))
    return path


# ---- the run ----------------------------------------------------------------------------


def run(form: RunForm, session: str | None = None,
        progress: Callable[..., Any] | None = None) -> Iterator[LiveFrame]:
    """Speculative then standard decoding, streamed to the page round by round.

    Every drafted token is drawn (dashed, pending) while the next one is drafted,
    at most every UI_THROTTLE_S seconds."""
    try:
        yield LiveFrame(status=status_html("Loading models…"))
        req = form.request(progress=(lambda f, m: progress(f, desc=m)) if progress else None)
    except (InputError, ModelError) as exc:
        yield LiveFrame(status=status_html(str(exc), "error"))
        raise gr.Error(str(exc), print_exception=False)

    last = 0.0
    spec = std = None
    legend_drawn = False
    try:
        with MODEL_LOCK:
            for up in race(req):
                spec, std = up.spec, up.std
                ev = up.event
                _live_put(session, spec, std, ev)
                now = time.perf_counter()
                final = up.phase == "done" or (ev and ev.kind == "done")
                if not final and now - last < UI_THROTTLE_S:
                    continue
                last = now
                if up.phase == "speculative":
                    pending = ev.round if ev.kind == "draft" else None
                    n = len(spec.rounds)
                    msg = f"Speculative decoding · round {n + (1 if pending else 0)} · {spec.n_tokens} tokens"
                    frame = LiveFrame(status=status_html(msg), rounds=V.rounds_html(spec, pending_round=pending),
                                      race=V.race_html(spec, None, spec_running=ev.kind != "done"))
                    if not legend_drawn:  # say which drafter and policy are running, once
                        frame.legend, legend_drawn = V.legend_html(spec), True
                    if req.settings.drafter == "tree":
                        frame.tree = live_tree(spec, pending)
                    yield frame
                elif up.phase == "standard":
                    msg = f"Standard decoding (the baseline) · {std.n_tokens} tokens"
                    yield LiveFrame(status=status_html(msg), race=V.race_html(spec, std, std_running=ev.kind != "done"))
    except Exception as exc:  # out of memory, a broken model…: end this run cleanly
        log.exception("run failed")
        _live_pop(session)
        yield LiveFrame(status=status_html(describe_error(exc), "error"))
        raise gr.Error(describe_error(exc), print_exception=False)

    _live_pop(session)
    summ = spec.summary() if spec else {}
    sp = V.race_speedup(spec, std)
    msg = f"Done: {spec.n_tokens} tokens in {len(spec.rounds)} rounds, α = {summ.get('alpha') or 0:.2f}"
    if sp:
        msg += f", speedup {sp:.2f}× over standard decoding"
    yield final_frame(spec, std, status_html(msg, "ok"))


# ---- Stop ---------------------------------------------------------------------------------
# Stop cancels the run's event, which ends its generator at once: the run cannot draw its own last
# frame.  So the run leaves its traces so far here (per browser session), and Stop draws them.

_LIVE: OrderedDict[str, tuple] = OrderedDict()  # session -> (spec, std, side still running or None)
_LIVE_LOCK = threading.Lock()
_LIVE_MAX = 64  # sessions; a stopped run's entry is removed by Stop, a finished one by the run


def _live_put(session: str | None, spec, std, ev) -> None:
    if not session:
        return
    side = None if ev is None or ev.kind == "done" else ("std" if std is not None else "spec")
    with _LIVE_LOCK:
        _LIVE[session] = (spec, std, side)
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


def stop(current: str | None, state: Any, session: str | None = None) -> LiveFrame:
    """Stop pressed: draw the run as far as it got (no round left "verifying…") and say it stopped."""
    live = _live_pop(session)
    if live:
        spec, std, side = live
        spec, std = (_as_stopped(spec) if side == "spec" else spec), (_as_stopped(std) if side == "std" else std)
        msg = f"Stopped after {spec.n_tokens if spec else 0} speculative tokens"
        msg += f" and {std.n_tokens} standard tokens" if std else ""
        frame = LiveFrame(status=status_html(msg + ". Press Run to start again.", "warn"), race=V.race_html(spec, std))
        if spec:
            frame.rounds, frame.tree = V.rounds_html(spec), live_tree(spec)
        return frame
    if current and 'data-kind="info"' in current and "press Run" not in current:  # stopped while loading
        return LiveFrame(status=status_html("Stopped. Press Run to start again.", "warn"))
    spec, std = (state or {}).get("spec"), (state or {}).get("std")
    if spec or std:  # the replay was stopped: show the finished race
        return LiveFrame(race=V.race_html(spec, std))
    return LiveFrame()


def replay(state: Any) -> Iterator[str]:
    """Replay both runs in real time from their recorded timestamps (the race panel only)."""
    spec, std = (state or {}).get("spec"), (state or {}).get("std")
    if not spec and not std:
        yield V.race_html(None, None)
        return
    end = max(t.t_total for t in (spec, std) if t)
    t0 = time.perf_counter()
    while True:
        t = time.perf_counter() - t0
        yield V.race_html(spec, std, at_time=min(t, end))
        if t >= end:
            return
        time.sleep(0.1)


# ---- recordings -----------------------------------------------------------------------------


def show_recording(spec: Trace | None, std: Trace | None, label: str) -> LiveFrame:
    where = spec or std
    msg = f"{label}: {where.models.get('draft', '')} → {where.models.get('target', '')} on {where.device}"
    return final_frame(spec, std, status_html(msg, "ok"))


def load_file(file: Any) -> LiveFrame:
    """Load an exported recording and show it as if it had just run."""
    if file is None:
        return LiveFrame()
    try:
        path = Path(file if isinstance(file, str) else file.name)
        if path.stat().st_size > MAX_TRACE_BYTES:
            raise TraceError(f"file is too large ({path.stat().st_size:,} bytes; the limit is {MAX_TRACE_BYTES:,})")
        spec, std = load_recording(path.read_bytes())
    except (TraceError, OSError) as exc:
        return LiveFrame(status=status_html(f"Could not load that file: {exc}", "error"))
    return show_recording(spec, std, f"Loaded {path.name}")


def load_example_recording(recordings: list[Path], name: str | None = None) -> LiveFrame:
    if not recordings:
        return LiveFrame()
    path = next((p for p in recordings if p.name == name), recordings[0])
    spec, std = load_recording(path.read_bytes())
    return show_recording(spec, std, f"Recorded example ({path.stem})")


def recorded_prompt(state: Any) -> Any:
    tr = (state or {}).get("spec") or (state or {}).get("std")
    return tr.prompt if tr and tr.prompt else gr.skip()


def next_round(state: Any, idx: Any) -> int:
    spec = (state or {}).get("spec")
    return min(int(idx or 1) + 1, len(spec.rounds) if spec else 1)
