"""Every event's inputs checked for type before Gradio stores or reads them (issue 62).

Gradio 6.31 writes an event's raw input values into the sender's session (``SessionState._update_value_in_config``)
*before* any component reads them, and a component reads some wrong types without complaint: a list sent to a
single-choice dropdown reached the handler (``unhashable type: 'list'`` at ``p in PRESETS``), ``True`` reached
"Remove the point" as a point number.  `check` runs from ``Blocks.validate_inputs`` (ui.api.ApiBlocks, the hook
Gradio calls first for every event, page and API alike) and refuses, with one rate-limited log line and a
message for the client, any value whose JSON type the component cannot hold:

    Dropdown, Radio     one choice: a string or a number (a list only for a multiselect dropdown), or null
    Slider, Number      a number (not a boolean), or null for Number
    Checkbox            true or false
    CheckboxGroup       a list of strings or numbers
    Textbox             a string, or null

Whether the value is among the choices, in range or sensible is still the component's and the handler's to judge;
this only makes sure that what is judged, stored or rendered later has the type everyone downstream assumes.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from .ratelimit import RateLimit

log = logging.getLogger("specviz.forged")
_LOG = RateLimit()
Scalar = (str, int, float)


def _scalar(v: Any) -> bool:
    return isinstance(v, Scalar) and not isinstance(v, bool) and not (isinstance(v, float) and not math.isfinite(v))


def expected(component: Any, value: Any) -> str | None:
    """What ``component`` takes, when ``value`` is not of it; None when the value's type is fine (or the component
    is not one checked here)."""
    from gradio import components as C

    if isinstance(component, C.Dropdown):
        if getattr(component, "multiselect", False):
            ok = value is None or (isinstance(value, list) and all(_scalar(v) for v in value))
            return None if ok else "a list of choices"
        return None if value is None or _scalar(value) else "one choice (a string or a number)"
    if isinstance(component, C.Radio):
        return None if value is None or _scalar(value) else "one choice (a string or a number)"
    if isinstance(component, C.CheckboxGroup):
        ok = isinstance(value, list) and all(_scalar(v) for v in value)
        return None if ok else "a list of choices"
    if isinstance(component, C.Checkbox):
        return None if isinstance(value, bool) else "true or false"
    if isinstance(component, (C.Slider, C.Number)):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if value is None and isinstance(component, C.Number):
            ok = True
        return None if ok else "a number"
    if isinstance(component, C.Textbox):
        return None if value is None or isinstance(value, str) else "text"
    return None


def _kind(value: Any) -> str:
    return {bool: "a boolean", list: "a list", dict: "an object", type(None): "null", str: "text"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)


def check(block_fn: Any, inputs: list[Any]) -> None:
    """Refuse (gr.Error, never a traceback) the first input whose type its component cannot hold."""
    from gradio.exceptions import Error

    for i, (component, value) in enumerate(zip(getattr(block_fn, "inputs", []) or [], inputs)):
        want = expected(component, value)
        if want is None:
            continue
        label = getattr(component, "label", None) or getattr(component, "elem_id", None) or f"input {i + 1}"
        name = getattr(block_fn, "name", None) or "?"
        _LOG.warn(log, "refused the values sent to event %s: %s is %s, not %s", name, label, _kind(value), want)
        raise Error(f"The values sent to this event ({name}) could not be read: “{label}” takes {want}, "
                    f"not {_kind(value)}.", print_exception=False)
