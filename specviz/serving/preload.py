"""The server's default pair, loaded in the background from the first moment of a start.

``app.py`` calls :func:`start` before it imports Gradio (~5 s of imports on the AVX2 EPYC), so reading
the weights overlaps importing the page; the pair serves as soon as it is loaded (``serve_early``: its
fbgemm packing finishes in the background, :mod:`specviz.models.warm`).  Importing this module imports
torch and the loader, never Gradio.
"""

from __future__ import annotations

import logging
import sys
import threading

from ..models import warm
from .service import default_preset, describe_error, get_pair

log = logging.getLogger("specviz.app")
_STARTED: list[threading.Thread] = []
_START_LOCK = threading.Lock()
# While the page's imports run, this thread's C calls (reading, fusing, blocking the int8 weights; keeping
# the prompt head) each wait for the interpreter lock, which a thread running pure Python hands over only
# every sys.getswitchinterval() (5 ms): measured on the AVX2 EPYC beside a spinning thread, reading the
# target's int8 cache took 12.3 s instead of 0.03 s.  Until the pair is prepared, it is handed over 10x as
# often (0.5 ms: 0.17 s), then the default comes back.
START_SWITCH_S = 0.0005


def start(*, hold_traces: bool = False) -> threading.Thread:
    """Load (or convert, the first time) the default pair in a daemon thread, once; a failure is logged
    here and shown again, clearly, when someone presses Run.  ``hold_traces``: the server's page is still to
    be built, so the models' steps are traced only once it is served (:func:`.warm.serving`)."""
    with _START_LOCK:  # app.py starts it from a thread of its own, and main() again: one thread
        if _STARTED:
            return _STARTED[0]
        return _start(hold_traces)


def _start(hold_traces: bool) -> threading.Thread:
    if hold_traces:
        warm.hold_traces()

    def work() -> None:
        try:
            pair = get_pair(default_preset(), serve_early=True)
            log.info("default pair ready")
            warm.wait(pair, timeout=600)
        except Exception as exc:  # noqa: BLE001 -- reported to the visitor by the next run
            log.warning("could not preload the default pair: %s", describe_error(exc))
        finally:
            if sys.getswitchinterval() == START_SWITCH_S:
                sys.setswitchinterval(default_switch)

    default_switch = sys.getswitchinterval()
    sys.setswitchinterval(min(default_switch, START_SWITCH_S))
    thread = threading.Thread(target=work, daemon=True, name="preload")
    _STARTED.append(thread)
    thread.start()
    return thread
