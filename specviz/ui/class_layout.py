"""Class mode's controls: the bar above the tabs (who is in which class, follow or explore) and the "Class" tab
(start or join; the teacher's projected card, private link, experiment, plot, export and end).  Their events:
ui.classroom; what the browser keeps (the hidden ``client`` and ``ident``): ui.class_client."""

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
    room: Any = None  # gr.State: {"code", "role": "teacher"|"attendee"|"ended", "secret", "page", "seat"}
    client: Any = None  # hidden: what the browser kept (its id, the teacher's secret): class_client.CLIENT_JS
    ident: Any = None  # hidden: what the browser must keep (the class, the teacher's secret): class_client.IDENT_JS
    restore: Any = None  # hidden number, new when a reopened teacher's page must first show the room's view
    bar: Any = None
    bar_text: Any = None
    follow: Any = None
    poll: Any = None
    entry: Any = None  # the intro, Start and Join
    start: Any = None
    code_in: Any = None
    join: Any = None
    message: Any = None
    teacher_box: Any = None
    card: Any = None
    project: Any = None
    private: Any = None  # the accordion "This page, for you only" (closed), outside the projected card
    private_link: Any = None
    experiment: Any = None
    count: Any = None
    plot: Any = None
    seen: Any = None
    want: Any = None  # a hidden number, new when the attendee's page must move to the teacher's round
    want_all: Any = None  # a hidden number, new when it must show another recording (every view of the Live tab)
    teacher_poll: Any = None
    manage: Any = None  # the row of a point's removal (hidden once the class ended)
    pick: Any = None
    remove: Any = None
    export: Any = None
    files: Any = None
    close: Any = None
    confirm: Any = None  # "End the class for everyone?": export first, end, or keep it
    confirm_text: Any = None
    confirm_export: Any = None
    confirm_end: Any = None
    confirm_cancel: Any = None
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
    ui.client = gr.Textbox("", visible="hidden", show_label=False, container=False, elem_id="sv-class-client")
    ui.ident = gr.Textbox("", visible="hidden", show_label=False, container=False, elem_id="sv-class-ident")
    ui.restore = gr.Number(0, visible="hidden", show_label=False, container=False)
    # (in the page, hidden: a new value fires their change events there, after a poll outside Gradio's queue)
    ui.want, ui.want_all = (gr.Number(0, visible="hidden", show_label=False, container=False) for _ in range(2))
    return ui


# The projected card: the code at least 48 px and the QR code at least 320 px on a 1280×720 screen (issue 66: 16 px
# and 110 px could not be read from the back of a room); full screen, they fill it.
CARD_CSS = """<style>
#sv-class-card .sv-class-card { display: flex; flex-wrap: wrap; align-items: center; gap: 24px 40px; padding: 12px; }
#sv-class-card .sv-class-qr { background: #fff; padding: 8px; border-radius: 6px; line-height: 0; }
#sv-class-card .sv-class-qr svg { width: 340px; height: 340px; }
#sv-class-card .sv-class-label { font-size: 22px; margin: 0; }
#sv-class-card .sv-class-code { font: 700 64px/1.1 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  letter-spacing: 0.04em; margin: 4px 0 12px; white-space: nowrap; }
#sv-class-card .sv-class-url { font-size: 20px; margin: 0; overflow-wrap: anywhere; }
#sv-class-card.sv-projecting, #sv-class-card:fullscreen { position: fixed; inset: 0; z-index: 10000; margin: 0;
  width: 100vw; height: 100vh; max-width: none; background: #fff; color: #111; display: flex; align-items: center;
  justify-content: center; cursor: zoom-out; }
#sv-class-card.sv-projecting a, #sv-class-card:fullscreen a { color: #1d4ed8; }
#sv-class-card.sv-projecting::after, #sv-class-card:fullscreen::after { content: "Click or press Esc to return";
  position: absolute; bottom: 10px; right: 16px; font-size: 13px; color: #777; }
#sv-class-card.sv-projecting .sv-class-card, #sv-class-card:fullscreen .sv-class-card { flex-wrap: nowrap;
  justify-content: center; gap: 4vw; }
#sv-class-card.sv-projecting .sv-class-qr svg, #sv-class-card:fullscreen .sv-class-qr svg {
  width: min(70vh, 40vw); height: min(70vh, 40vw); }
#sv-class-card.sv-projecting .sv-class-code, #sv-class-card:fullscreen .sv-class-code { font-size: min(6vw, 14vh); }
#sv-class-card.sv-projecting .sv-class-url, #sv-class-card:fullscreen .sv-class-url,
#sv-class-card.sv-projecting .sv-class-label, #sv-class-card:fullscreen .sv-class-label { font-size: min(2.2vw, 4vh); }
@media (max-width: 640px) {
  #sv-class-card .sv-class-qr svg { width: 240px; height: 240px; }
  #sv-class-card .sv-class-code { font-size: 40px; }
}
</style>"""


def build_tab(ui: ClassUI) -> None:
    """The "Class" tab: start or join a class; the teacher's room (projected card, private link, experiment, plot,
    export, end)."""
    with gr.Tab("Class", id="class"):
        gr.HTML(CARD_CSS, padding=False, elem_id="sv-class-css")
        with gr.Column(elem_id="sv-class-entry") as ui.entry:  # (hidden in a class: the card first on a projector)
            gr.Markdown("**Class mode.** A teacher starts a class and projects the code; attendees join with the "
                        "link or the code, and their Live tab follows the teacher's round by round. An experiment "
                        "collects every attendee's race on the teacher's plot.", elem_id="sv-class-intro")
            with gr.Row(equal_height=True):
                ui.start = gr.Button("Start a class", variant="primary", scale=0, min_width=180,
                                     elem_id="sv-class-start")
                ui.code_in = gr.Textbox(label="Class code", placeholder="e.g. abc-def-ghj", max_lines=1, scale=2,
                                        elem_id="sv-class-code-in")
                ui.join = gr.Button("Join", scale=0, min_width=100, elem_id="sv-class-join")
        ui.message = gr.HTML("", elem_id="sv-class-message")
        with gr.Column(visible=False, elem_id="sv-class-teacher") as ui.teacher_box:
            ui.card = gr.HTML("", elem_id="sv-class-card")
            ui.project = gr.Button("Project the code (full screen)", size="sm", variant="primary", scale=0,
                                   min_width=240, elem_id="sv-class-project")
            with gr.Accordion("This page, for you only", open=False, elem_id="sv-class-private") as ui.private:
                ui.private_link = gr.HTML("", elem_id="sv-class-private-link")
            ui.experiment = gr.Dropdown([("none (attendees follow only)", "")]
                                        + [(title, key) for key, (title, _) in R.EXPERIMENTS.items()], value="",
                                        label="Class experiment", elem_id="sv-class-experiment")
            ui.count = gr.HTML("", elem_id="sv-class-count-box")
            ui.plot = gr.Plot(show_label=False, elem_id="sv-class-plot")
            with gr.Row(equal_height=True) as ui.manage:
                ui.pick = gr.Dropdown([], label="A point", scale=2, elem_id="sv-class-pick")
                ui.remove = gr.Button("Remove the point", size="sm", scale=0, min_width=160,
                                      elem_id="sv-class-remove")
            with gr.Row(equal_height=True):
                ui.export = gr.Button("Export every experiment's points (CSV, JSON)", size="sm", scale=0,
                                      min_width=300, elem_id="sv-class-export")
                ui.close = gr.Button("End the class…", size="sm", variant="stop", scale=0, min_width=160,
                                     elem_id="sv-class-close")
            with gr.Group(visible=False, elem_id="sv-class-confirm") as ui.confirm:
                ui.confirm_text = gr.HTML("", elem_id="sv-class-confirm-text")
                with gr.Row(equal_height=True):
                    ui.confirm_export = gr.Button("Export the points first", size="sm", scale=0, min_width=200,
                                                  elem_id="sv-class-confirm-export")
                    ui.confirm_end = gr.Button("Yes, end the class", size="sm", variant="stop", scale=0,
                                               min_width=180, elem_id="sv-class-confirm-end")
                    ui.confirm_cancel = gr.Button("Keep the class", size="sm", scale=0, min_width=150,
                                                  elem_id="sv-class-confirm-cancel")
            ui.files = gr.File(label="The class's points", file_count="multiple", visible=False, interactive=False,
                               elem_id="sv-class-files")
        with gr.Group(visible=False, elem_id="sv-class-attendee") as ui.attendee_box:
            ui.task = gr.HTML("", elem_id="sv-class-task")
            ui.post = gr.Button("Post the race on my Live tab", size="sm", elem_id="sv-class-post")
            ui.posted = gr.HTML("", elem_id="sv-class-posted")
