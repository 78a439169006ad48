"""Gradio's session limit, shared fairly: a session that holds something goes after the ones that hold nothing
(issue 33, "no honest session loses a loaded run").

The server keeps Gradio's per-session state for at most ``state_session_capacity`` sessions (app.py's
SPECVIZ_SESSIONS, 128: each keeps copies of what its page was sent).  Gradio 6.31's ``StateHolder`` drops the
least recently used session beyond it, whatever it holds, and every request with a new ``session_hash`` makes
one: a `/trace` API call from a fresh client, a page opened and left, a refused value.  So 128 cheap API calls
(a room's replays, in scripts/crowd.py: 203 calls in 4 minutes) emptied every page that had a run loaded:
Next went back to round 1, the picture and the download were gone.

`install` replaces ``StateHolder.update`` so that, past the limit, the least recently used session **holding
no value in a gr.State** (an API call's, a page that never showed a run) goes first; only when every session
holds something does the least recently used one go, as before.  The limit itself is unchanged.
"""

from __future__ import annotations

from typing import Any

_INSTALLED = "_specviz_sessions"


def holds_something(session: Any) -> bool:
    """Whether a Gradio SessionState has a non-empty value in one of the page's gr.State components."""
    from gradio.components import State

    blocks = getattr(getattr(session, "blocks_config", None), "blocks", {}) or {}
    for _id, value in list(getattr(session, "state_data", {}).items()):
        if isinstance(blocks.get(_id), State) and value is not None and not (
                isinstance(value, (list, dict, str, tuple, set)) and len(value) == 0):
            return True
    return False


def _evict(holder: Any, keep: str | None) -> None:
    """Drop sessions until the holder is within its capacity: empty ones first, oldest first."""
    data = holder.session_data
    while len(data) > holder.capacity:
        victim = next((sid for sid, st in data.items() if sid != keep and not holds_something(st)), None)
        if victim is None:
            victim = next(iter(data))
        data.pop(victim)
        holder.time_last_used.pop(victim, None)


def install() -> bool:
    """Patch Gradio's StateHolder (once per process); False when this Gradio has none."""
    try:
        from gradio.state_holder import StateHolder
    except ImportError:
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
