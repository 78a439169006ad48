"""Draw a loaded recording the way the page does, and serialise what would be sent to the browser.

A recording that loads must also draw: every view the page builds from it (round chips, race,
metrics, plots, step mode with its narration, the theory tab's measured marker) and the export
file.  Gradio sends HTML strings as UTF-8 JSON and figures through ``Figure.to_json`` (orjson),
so both are serialised here: a lone surrogate or an integer beyond 64 bits fails here as it would
in the server.
"""

from __future__ import annotations

import os
from typing import Any

import gradio as gr
import plotly.graph_objects as go

from specviz.trace import Trace, load_recording
from specviz.views import html as V


def sendable(value: Any) -> None:
    """Serialise one output as Gradio would; raises if it cannot be sent."""
    if isinstance(value, str):
        value.encode("utf-8")  # strict: a lone surrogate raises UnicodeEncodeError
    elif isinstance(value, go.Figure):
        gr.Plot().postprocess(value)  # Figure.to_json: orjson refuses integers beyond 64 bits
    elif isinstance(value, (tuple, list)):
        for v in value:
            sendable(v)


def render_everything(spec: Trace | None, std: Trace | None) -> int:
    """Everything the page draws from a loaded recording, plus the export file read back.

    Returns how many round views were drawn (every round of both traces, in step mode too)."""
    import app

    out = app.show_recording(spec, std, "Loaded")
    export = out.export
    try:
        assert 'data-kind="ok"' in out.status, out.status
        sendable([v for k, v in vars(out).items() if k != "export"])
        state = out.state
        sendable(list(vars(app.theory_views(0.8, 5, 0.15, 0.05, state)).values()))
        app.use_last_run(state)
        drawn = 0
        for tr in (spec, std):
            if tr is None:
                continue
            tr.summary()
            tr.to_json()  # allow_nan=False: everything loaded is finite
            sendable(V.rounds_html(tr, upto=len(tr.rounds)))
            for rnd in tr.rounds:
                sendable(V.narrate_html(rnd, tr))
                drawn += 1
            for t in (0.0, tr.t_total / 2, tr.t_total):  # the race replay at a few moments
                sendable(V.race_html(spec, std, at_time=t))
        if spec is not None:
            for i in range(1, len(spec.rounds) + 1):
                sendable(app.step_views(spec, i))
        with open(export, "rb") as f:
            data = f.read()
        assert data, "the export file is empty"
        again = load_recording(data)  # what was exported loads back
        assert [t.to_dict() if t else None for t in again] == [t.to_dict() if t else None for t in (spec, std)]
        return drawn
    finally:
        if export:
            os.unlink(export)
