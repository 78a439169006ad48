"""The server's default pair, loaded in the background from the first moment of a start.

``app.py`` calls :func:`start` before it imports Gradio (~5 s of imports on the AVX2 EPYC), so reading
the weights overlaps importing the page; the pair serves as soon as it is loaded (``serve_early``: its
fbgemm packing finishes in the background, :mod:`specviz.models.warm`).  Importing this module imports
torch and the loader, never Gradio.
"""

from __future__ import annotations

import logging
import threading

from .service import default_preset, describe_error, get_pair

log = logging.getLogger("specviz.app")
_STARTED: list[threading.Thread] = []


def start() -> threading.Thread:
    """Load (or convert, the first time) the default pair in a daemon thread, once; a failure is logged
    here and shown again, clearly, when someone presses Run."""
    if _STARTED:
        return _STARTED[0]

    def work() -> None:
        try:
            get_pair(default_preset(), serve_early=True)
            log.info("default pair ready")
        except Exception as exc:  # noqa: BLE001 -- reported to the visitor by the next run
            log.warning("could not preload the default pair: %s", describe_error(exc))

    thread = threading.Thread(target=work, daemon=True, name="preload")
    _STARTED.append(thread)
    thread.start()
    return thread
