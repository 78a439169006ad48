"""The Challenges tab: guided tasks checked from the runs the learner made (specviz.experiments.challenges).

Everything here is per browser session: the learner's runs are handles on the page's trace store kept
in a `gr.State` (the store is bounded, so an old run may be gone; the check says so), and so is the
progress (which challenges are done, with the verdict that passed them).  Nothing is shared between
sessions and nothing outlives the page.

Which runs count: those the learner made -- a Run that finished (live or a replay of an identical
request) and a shoot-out run put on the Live tab.  A recording (shipped, uploaded or linked) is shown
but not counted, so opening one never passes a challenge.  `track` tells them apart: it notes the
handle shown when the learner pressed the button and remembers the one shown after the event
succeeded only when it is a new one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import gradio as gr

from ..experiments.challenges import BY_KEY, CHALLENGES, MACHINE_ANSWERS, Given, Run, Verdict, check_all
from ..serving.service import describe_error
from ..views.challenges import board_html
from .store import Shown

log = logging.getLogger("specviz.app")
HISTORY_MAX = 24  # runs remembered per session (handles; the traces live in the bounded store)
MACHINE_KEY = "machine"
INTRO = ("Short tasks to do with the live models. Each is **checked from the runs you make** on the Live tab (Run, "
         "or a shoot-out run shown there), never by asking you: make a run, then press **Check my last run**; it "
         "checks that run and your earlier runs of this session. Opening a recording does not count. Progress "
         "stays in this browser tab only and is gone when you close or reload it.")


@dataclass(frozen=True)
class CheckResult:
    """What a check shows: the session's progress, the check's verdicts and the line beside the button."""

    done: dict[str, str]  # {key: the message of the verdict that passed it}
    latest: dict[str, Verdict]  # this check's verdicts (on the challenges that were not done before it)
    note: str

    @property
    def board(self) -> str:
        return board_html(self.done, self.latest)


def _handle_id(state: Any) -> int | None:
    return state.id if isinstance(state, Shown) else None


def mark(state: Any) -> int | None:
    """Before a run: the handle shown now (a run that succeeds shows a new one)."""
    return _handle_id(state)


def remember(state: Any, started: Any, history: Any) -> list:
    """After a run succeeded: add the handle it shows to the session's runs, if it is a new one."""
    runs = [h for h in (history or []) if isinstance(h, Shown)]
    key = _handle_id(state)
    if key is None or not state.held or key == started or any(h.id == key for h in runs):
        return runs
    return (runs + [state])[-HISTORY_MAX:]


def probe_curves(runs: Sequence[Run]) -> dict[tuple[str, str], dict[int, float]]:
    """This machine's probed verify-cost curves for the runs' pairs (never loads a model): {(preset, execution):
    {tokens fed: ms}}."""
    from .machine_ui import probe_of

    out: dict[tuple[str, str], dict[int, float]] = {}
    for preset in {r.spec.models.get("preset", "") for r in runs if r.spec is not None}:
        try:
            probe = probe_of(preset) if preset else None
        except Exception as exc:  # a probe we cannot read only leaves the message without it
            log.warning("no probe for %s: %s", preset, exc)
            probe = None
        for execution, curve in (probe.curves.items() if probe is not None else ()):
            out[(preset, execution)] = dict(curve)
    return out


def check_session(state: Any, history: Any, done: Mapping[str, str] | None, answer: Any,
                  curves: Any = probe_curves) -> CheckResult:
    """Check every challenge not done yet against the session's runs (oldest first)."""
    done = dict(done or {})
    handles = [h for h in (history or []) if isinstance(h, Shown)]
    shown = _handle_id(state)
    notes = []
    if isinstance(state, Shown) and state.run and state and all(h.id != shown for h in handles):
        # The run on screen is the visitor's own even before `remember` (a follow-up event) has added it:
        # a check pressed at once after a race counts it (issue 56).
        handles.append(state)
    runs = [Run(spec=h.get("spec"), std=h.get("std")) for h in handles if h]
    gone = len(handles) - len(runs)
    if shown is not None and state and all(h.id != shown for h in handles):
        notes.append("The Live tab shows a recording, not a run of yours: it is not counted.")
    if gone:
        notes.append(f"{gone} earlier run{'s are' if gone != 1 else ' is'} no longer held by the server (it keeps "
                     "a bounded number) and could not be checked.")
    if not runs:
        notes.insert(0, "No runs of yours yet in this session: press Run on the Live tab, then check.")
        return CheckResult(done=done, latest={}, note=" ".join(notes))
    given = Given(answer=answer if isinstance(answer, str) else None, probe_curves=curves(runs))
    open_keys = [c.key for c in CHALLENGES if c.key not in done]
    verdicts = check_all(runs, given, keys=open_keys)
    new = [k for k, v in verdicts.items() if v.passed]
    for k in new:
        done[k] = verdicts[k].message
    n = len(runs)
    head = f"Checked {n} run{'s' * (n != 1)} of yours. "
    if new:
        head += "Newly done: " + ", ".join(f"✓ {BY_KEY[k].title}" for k in new) + ". "
    elif open_keys:
        head += "Nothing new passed: each open challenge says why below. "
    head += f"{len(done)} of {len(CHALLENGES)} done."
    return CheckResult(done=done, latest=verdicts, note=" ".join([head, *notes]))


# The board is drawn in two parts with the machine challenge's answer between them, under its card.
SPLIT = [c.key for c in CHALLENGES].index(MACHINE_KEY) + 1
TOP, BOTTOM = [c.key for c in CHALLENGES[:SPLIT]], [c.key for c in CHALLENGES[SPLIT:]]


def boards(done: Mapping[str, str] | None = None, latest: Mapping[str, Verdict] | None = None) -> tuple[str, str]:
    return board_html(done, latest, keys=TOP), board_html(done, latest, keys=BOTTOM, head=False)


def on_check(state: Any, history: Any, done: Any, answer: Any) -> tuple[str, str, str, dict]:
    """The button: (top of the board, its bottom, the note, progress); never a traceback on the page."""
    try:
        res = check_session(state, history, done if isinstance(done, dict) else {}, answer)
    except Exception as exc:
        log.exception("checking the challenges failed")
        return gr.skip(), gr.skip(), f"Could not check your runs: {describe_error(exc)}", gr.skip()
    return (*boards(res.done, res.latest), res.note, res.done)


@dataclass(frozen=True)
class ChallengeTab:
    history: Any  # gr.State: the learner's runs (handles), oldest first
    started: Any  # gr.State: the handle shown when the learner last pressed Run (see `track`)
    done: Any  # gr.State: {challenge key: the message that passed it}


def build_tab(state: Any) -> ChallengeTab:
    """The tab's contents (call inside its `gr.Tab`); `state` is the Live tab's shown run."""
    history, started, done = gr.State([]), gr.State(None), gr.State({})
    gr.Markdown(INTRO, elem_id="sv-challenges-intro")
    with gr.Row(equal_height=True):
        check_btn = gr.Button("Check my last run", variant="primary", scale=0, min_width=220,
                              elem_id="sv-challenge-check")
        note = gr.Markdown("", elem_id="sv-challenge-note")
    top, bottom = boards()
    board_top = gr.HTML(top, elem_id="sv-challenges")
    answer = gr.Radio(list(MACHINE_ANSWERS), value=None, label=f"Challenge {SPLIT} ({BY_KEY[MACHINE_KEY].title}): "
                      "on this machine, one verify pass over γ + 1 tokens costs…", elem_id="sv-challenge-answer")
    board_bottom = gr.HTML(bottom, elem_id="sv-challenges-more")
    check_btn.click(on_check, [state, history, done, answer], [board_top, board_bottom, note, done],
                    api_visibility="private")
    return ChallengeTab(history=history, started=started, done=done)


def track(tab: ChallengeTab, button: Any, event: Any, state: Any) -> None:
    """Count the run that `event` (started by `button`) shows once it succeeds: the handle shown at the
    click is noted first, so an event that ends without a new run adds nothing."""
    button.click(mark, [state], [tab.started], queue=False, api_visibility="private")
    event.success(remember, [state, tab.started, tab.history], [tab.history], api_visibility="private")


__all__ = ["ChallengeTab", "CheckResult", "boards", "build_tab", "check_session", "mark", "on_check", "remember", "track"]
