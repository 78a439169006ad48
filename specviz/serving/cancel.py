"""A run's cancel flag, per session: the page's Stop and a closed page (Gradio's ``unload`` event) set it, and the
run's ``should_stop`` reads it, so a run ends within one round or one chunk of its prompt's pass (issue 55).

Gradio's own cancel (an event's ``cancels=``) closes the run's generator, which can only happen between two of
its outputs: a long prompt's pass, with no output until it ends, would hold the models for minutes after the
visitor left.  The flag is read *inside* the pass, between its chunks (core.kv.feed_prompt).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

MAX_SESSIONS = 1024  # flags kept; a finished run removes its own, so only runs in progress hold one


class Cancels:
    def __init__(self, max_sessions: int = MAX_SESSIONS):
        self._flags: OrderedDict[str, threading.Event] = OrderedDict()
        self._lock = threading.Lock()
        self.max_sessions = max_sessions

    def start(self, session: str | None) -> threading.Event:
        """A new run of ``session``: its flag (a session without a name gets one nobody else can set)."""
        flag = threading.Event()
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
