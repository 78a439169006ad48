"""Step mode's views of the round shown: its narration, its text, the attention mask and the acceptance
picture (pick a position of the round, see its picture; specviz.views.acceptance).  Stepping to a round picks
its last judged position: the rejected one with its correction, or the last accepted.

Each view is drawn once per recording and round (ui.round_memo): a class's pages all step to the same round of
the same recording at once (issue 58), so these handlers run without a concurrency limit (app.py)."""

from __future__ import annotations

from typing import Any

import gradio as gr

from ..views.acceptance import acceptance_figure, position_choices
from . import live, tree_ui
from .frames import index_number, round_number
from .round_memo import ROUNDS


def _round(state: Any, idx: Any) -> tuple[Any, Any, int]:
    """(the trace, its round ``idx`` (1-based, as the page sent it), that round's number; 0: none)."""
    spec = (state or {}).get("spec")
    if not spec or not spec.rounds:
        return spec, None, 0
    i = round_number(idx, len(spec.rounds))
    return spec, spec.rounds[i - 1], i


def _picture(spec: Any, rnd: Any, i: int, index: int | None) -> Any:
    return ROUNDS.get(spec if rnd is not None else None, ("picture", i, index),
                      lambda: acceptance_figure(spec if rnd is not None else None, rnd, index))


def for_step(state: Any, idx: Any) -> tuple[Any, Any]:
    """(the position picker, the picture) for round ``idx`` (1-based)."""
    spec, rnd, i = _round(state, idx)
    choices = ROUNDS.get(spec if rnd is not None else None, ("choices", i), lambda: position_choices(rnd))
    pick = choices[-1][1] if choices else None
    return (gr.Radio(choices=list(choices), value=pick, visible=bool(choices)), _picture(spec, rnd, i, pick))


def for_position(state: Any, idx: Any, pos: Any) -> Any:
    spec, rnd, i = _round(state, idx)
    return _picture(spec, rnd, i, index_number(pos))


def step_texts(state: Any, idx: Any) -> tuple[str, str, Any]:
    """(the narration, the round and the text up to it, the attention mask) for round ``idx`` (1-based)."""
    spec, _, i = _round(state, idx)
    shown = spec if i else None
    return ROUNDS.get(shown, ("texts", i), lambda: (*live.step_views(shown, i), tree_ui.mask_for(shown, i)))


_PLOT = gr.Plot(render=False)


def on_step(state: Any, idx: Any) -> tuple[str, str, Any, Any, Any]:
    """Every view of step mode for round ``idx``: (narration, round, mask, position picker, picture); the two
    figures as Gradio sends them (its Plot's postprocess, a JSON string: made once per round, not per page)."""
    narration, step_round, mask = step_texts(state, idx)
    picker, picture = for_step(state, idx)
    spec, _, i = _round(state, idx)
    sent = ROUNDS.get(spec if i else None, ("sent", i), lambda: (_PLOT.postprocess(mask), _PLOT.postprocess(picture)))
    return narration, step_round, sent[0], picker, sent[1]
