"""Class mode's controls: the bar above the tabs (who is in which class, follow or explore) and the "Class" tab
(start or join; the teacher's code, QR code, experiment, plot and export).  Their events: ui.classroom."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from ..serving import rooms as R

POLL_S = 1.0  # an attendee's page asks its room this often (the issue: the teacher's step shown within 2 s)
TEACHER_POLL_S = 2.0  # the teacher's plot refreshes this often when points came
FOLLOW, EXPLORE = "Follow the teacher", "Let me explore"


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
