"""Step mode's acceptance picture: pick a position of the round shown, see its picture
(specviz.views.acceptance).  Stepping to a round picks its last judged position: the rejected one
with its correction, or the last accepted."""

from __future__ import annotations

from typing import Any

import gradio as gr

from ..views.acceptance import acceptance_figure, position_choices
from .frames import index_number, round_number


def _round(state: Any, idx: Any):
    spec = (state or {}).get("spec")
    if not spec or not spec.rounds:
        return spec, None
    return spec, spec.rounds[round_number(idx, len(spec.rounds)) - 1]


def for_step(state: Any, idx: Any) -> tuple[Any, Any]:
    """(the position picker, the picture) for round ``idx`` (1-based)."""
    spec, rnd = _round(state, idx)
    choices = position_choices(rnd)
    pick = choices[-1][1] if choices else None
    return (gr.Radio(choices=choices, value=pick, visible=bool(choices)),
            acceptance_figure(spec, rnd, pick))


def for_position(state: Any, idx: Any, pos: Any) -> Any:
    spec, rnd = _round(state, idx)
    return acceptance_figure(spec, rnd, index_number(pos))
