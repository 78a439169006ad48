"""One log line, not a traceback, for a request a client forged (issue 33: "0 tracebacks in the server log,
forged event values included").

The page's events are private to it, but anyone can send them through Gradio's queue with any values
(`scripts/hostile.py` does).  Gradio 6.31 refuses what its components cannot read, and tells the client
why, but writes a full traceback for each refusal:

* a value a component will not take (a NaN or 10**30 for a slider, a radio value not among its choices,
  a list where a number goes, a file path outside the upload folder, a NUL byte in a path): raised while
  the event's inputs are preprocessed (``Blocks.preprocess_data``) and printed by the queue
  (``traceback.print_exc``) unless the error says ``print_exception=False``;
* an event number the page does not have (``fn_index`` -1 or 10**6): a ``KeyError`` in
  ``route_utils.get_fn``, a 500 and ~40 lines under "Exception in ASGI application".

Neither is a fault of the server.  `install` makes the first a refusal with the component's own message
(``gr.Error``, ``print_exception=False``) logged as one warning line, and the second a 404 "no such
event".  What an event's handler raises is untouched (the handlers' own errors keep their tracebacks).
"""

from __future__ import annotations

import functools
import logging

from .ratelimit import RateLimit

log = logging.getLogger("specviz.forged")
_LOG = RateLimit()  # a client can send refused values without end: a few lines a minute (issue 62)
_INSTALLED = "_specviz_forged"


def _short(exc: BaseException, limit: int = 300) -> str:
    # The client's own value may be quoted back (Gradio's "Value: … is not in the list of choices"): never as
    # markup, whatever renders the message (issue 62).
    text = " ".join(str(exc).split()).replace("<", "‹").replace(">", "›") or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def refusal(exc: BaseException, fn_name: str | None = None) -> Exception:
    """The error a client gets for inputs its event could not read: Gradio's own message (the cause's, where
    Gradio wrapped it), never printed as a traceback."""
    from gradio.exceptions import ComponentProcessingError, Error

    cause = exc.__cause__ if isinstance(exc, ComponentProcessingError) and exc.__cause__ else exc
    what = f"The values sent to this event{f' ({fn_name})' if fn_name else ''} could not be read: {_short(cause)}"
    if isinstance(exc, Error) and not isinstance(exc, ComponentProcessingError):
        return Error(_short(exc, 600), print_exception=False)  # a component's own refusal: its message, inert
    return Error(what, print_exception=False)


def install() -> bool:
    """Patch Gradio (once per process) as the module says; False when this Gradio has not the two functions."""
    try:
        from fastapi import HTTPException
        from gradio import blocks, route_utils
    except ImportError:
        return False
    if getattr(blocks.Blocks.preprocess_data, _INSTALLED, False):
        return True
    original_pre = blocks.Blocks.preprocess_data
    original_get_fn = route_utils.get_fn

    @functools.wraps(original_pre)
    async def preprocess_data(self, block_fn, inputs, state, *args, **kwargs):
        try:
            return await original_pre(self, block_fn, inputs, state, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - every failure here is about the client's values
            name = getattr(block_fn, "name", None)
            err = refusal(exc, name)
            _LOG.warn(log, "refused the values sent to event %s: %s", name or "?", _short(exc.__cause__ or exc, 200))
            raise err from None

    @functools.wraps(original_get_fn)
    def get_fn(*args, **kwargs):
        try:
            return original_get_fn(*args, **kwargs)
        except (KeyError, IndexError) as exc:
            _LOG.warn(log, "refused a request for an event this page does not have: %s", _short(exc, 100))
            raise HTTPException(status_code=404, detail="No such event on this page.") from None

    setattr(preprocess_data, _INSTALLED, True)
    blocks.Blocks.preprocess_data = preprocess_data
    route_utils.get_fn = get_fn
    return True
