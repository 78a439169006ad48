"""Gradio's session limit, shared fairly: a session that holds something goes after the ones that hold nothing
(issue 33, "no honest session loses a loaded run").

The server keeps Gradio's per-session state for at most ``state_session_capacity`` sessions (app.py's
SPECVIZ_SESSIONS, 128: each keeps copies of what its page was sent).  Gradio 6.31's ``StateHolder`` drops the
least recently used session beyond it, whatever it holds, and every request with a new ``session_hash`` makes
one: a `/trace` API call from a fresh client, a page opened and left, a refused value.  So 128 cheap API calls
(a room's replays, in scripts/crowd.py: 203 calls in 4 minutes) emptied every page that had a run loaded:
Next went back to round 1, the picture and the download were gone.

`install` replaces ``StateHolder.update`` so that, past the limit, the least recently used session **holding
no value of its own in a gr.State** (an API call's, a page that shows only a shipped recording) goes first; only
when every session holds something does the least recently used one go, as before.  The limit itself is
unchanged, and an evicted session's delete callbacks run (Gradio 6.31's own eviction runs none, which orphaned
the store's entries: issue 55), so whatever the server keeps for it goes with it.

Why a patch and not a hook: Gradio has no supported way to choose which session its holder evicts, and its
default (plain LRU, callbacks skipped) loses a visitor's run to 128 API calls.  It is pinned: `install` patches
only the Gradio version it was tested on (``TESTED``; tests/test_forged.py) and otherwise leaves Gradio as it is,
with one log line -- the store stays bounded either way (ui.store asks Gradio which sessions it still holds).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("specviz.sessions")
_INSTALLED = "_specviz_sessions"
TESTED = "6.31.0"  # the Gradio whose StateHolder.update this replaces (state_holder.py)


def holds_something(session: Any) -> bool:
    """Whether a Gradio SessionState has a non-empty value in one of the page's gr.State components."""
    from gradio.components import State

    blocks = getattr(getattr(session, "blocks_config", None), "blocks", {}) or {}
    for _id, value in list(getattr(session, "state_data", {}).items()):
        if getattr(value, "held", True) is False:  # a handle on a shipped recording: nothing of its own
            continue
        block = blocks.get(_id)
        if isinstance(block, State) and value is not None and not (
                isinstance(value, (list, dict, str, tuple, set)) and len(value) == 0) and not _initial(block, value):
            return True
    return False


def _initial(block: Any, value: Any) -> bool:
    """Whether a State holds the value the page starts with (a refused action, e.g. a class join that failed,
    writes the initial value back: it holds nothing, issue 62)."""
    try:
        return bool(type(value) is type(block.value) and value == block.value)
    except Exception:  # noqa: BLE001 -- a value that cannot be compared is the visitor's own
        return False


def _evict(holder: Any, keep: str | None) -> None:
    """Drop sessions until the holder is within its capacity: empty ones first, oldest first."""
    data = holder.session_data
    if len(data) <= holder.capacity:
        return
    busy = _in_flight(holder)  # a session whose event is running is not "empty": its state is about to be set
    while len(data) > holder.capacity:
        victim = next((sid for sid, st in data.items()
                       if sid != keep and sid not in busy and not holds_something(st)), None)
        if victim is None:
            victim = next((sid for sid in data if sid != keep and sid not in busy), None) or next(iter(data))
        try:
            holder.delete_state(victim)  # its gr.State delete callbacks: the store drops what it held
        except Exception:  # noqa: BLE001 -- a failing callback must not keep the session: the store sweeps it later
            log.warning("a delete callback failed for an evicted session", exc_info=False)
        data.pop(victim, None)
        holder.time_last_used.pop(victim, None)


def _in_flight(holder: Any) -> set[str]:
    """The sessions with an event queued or running (Gradio's queue, read without its lock: a snapshot)."""
    queue = getattr(getattr(holder, "blocks", None), "_queue", None)
    events = getattr(queue, "event_ids_to_events", None) or {}
    try:
        return {getattr(e, "session_hash", None) for e in list(events.values())} - {None}
    except RuntimeError:  # changed while read: no protection this time
        return set()


def install() -> bool:
    """Patch Gradio's StateHolder (once per process); False when this Gradio has none or is not the tested
    version (then Gradio's own eviction runs, and the store sweeps the sessions it drops)."""
    try:
        import gradio
        from gradio.state_holder import StateHolder
    except ImportError:
        return False
    if getattr(gradio, "__version__", "") != TESTED:
        log.warning("Gradio %s is not %s: its own session eviction is kept", getattr(gradio, "__version__", "?"), TESTED)
        return False
    if getattr(StateHolder.update, _INSTALLED, False):
        return True

    def update(self, session_id: str) -> None:
        with self.lock:
            if session_id in self.session_data:
                self.session_data.move_to_end(session_id)
            _evict(self, session_id)

    setattr(update, _INSTALLED, True)
    StateHolder.update = update
    return True
