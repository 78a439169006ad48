"""A run's cancel flag, per session: the page's Stop and a closed page (Gradio's ``unload`` event) set it, and the
run's ``should_stop`` reads it, so a run ends within one round or one chunk of its prompt's pass (issue 55).

Gradio's own cancel (an event's ``cancels=``) closes the run's generator, which can only happen between two of
its outputs: a long prompt's pass, with no output until it ends, would hold the models for minutes after the
visitor left.  The flag is read *inside* the pass, between its chunks (core.kv.feed_prompt).

A client can also go without a word: a /trace call over plain HTTP whose event stream was dropped or never
opened (issue 62).  A run's flag is a `RunFlag`, which also reads as set once the run's client has had no
stream open for a few seconds (serving.liveness): such a run stops as if its Stop had been pressed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Iterable

from . import liveness

log = logging.getLogger("specviz.cancel")
MAX_SESSIONS = 1024  # flags kept; a finished run removes its own, so only runs in progress hold one


class RunFlag(threading.Event):
    """A run's cancel flag: set by Stop or a closed page (`Cancels.cancel`), and set by itself, the first time
    it is read after its client went away (``keys``: the streams that carry the run's results; None: a run
    nobody watches, set only by `Cancels.cancel`)."""

    def __init__(self, keys: Iterable[str] | None = None, streams: liveness.Streams | None = None):
        super().__init__()
        self.keys = tuple(keys) if keys else ()
        self.streams = liveness.STREAMS if streams is None else streams
        self.started = time.monotonic()
        self.client_gone = False

    def is_set(self) -> bool:
        if super().is_set():
            return True
        if self.keys and self.streams.gone(self.keys, self.started):
            self.client_gone = True
            self.set()
            log.info("a run was cancelled: its client went away (no event stream open for %.0f s)",
                     self.streams.grace_s)
            return True
        return False


class Cancels:
    def __init__(self, max_sessions: int = MAX_SESSIONS):
        self._flags: OrderedDict[str, threading.Event] = OrderedDict()
        self._lock = threading.Lock()
        self.max_sessions = max_sessions

    def start(self, session: str | None, keys: Iterable[str] | None = None) -> RunFlag:
        """A new run of ``session``: its flag (a session without a name gets one nobody else can set).  ``keys``:
        the streams its client listens on; by default those of the Gradio event being served, when the request
        came through serving.liveness's middleware (else the client is not watched)."""
        flag = RunFlag(liveness.run_keys(session) if keys is None else keys)
        if session:
            with self._lock:
                self._flags[session] = flag
                self._flags.move_to_end(session)
                while len(self._flags) > self.max_sessions:
                    self._flags.popitem(last=False)
        return flag

    def cancel(self, session: str | None) -> bool:
        """Stop the session's run in progress; False when it has none."""
        with self._lock:
            flag = self._flags.get(session or "")
        if flag is None:
            return False
        flag.set()
        return True

    def finish(self, session: str | None, flag: threading.Event) -> None:
        """The run is over: forget its flag (unless a newer run of the session replaced it)."""
        with self._lock:
            if session and self._flags.get(session) is flag:
                del self._flags[session]

    def __len__(self) -> int:
        return len(self._flags)


CANCELS = Cancels()
