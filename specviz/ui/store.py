"""What the page shows, held on the server in one bounded store instead of in each session.

Gradio keeps a session's `gr.State` for as long as the session lives (up to 10,000 sessions), so
traces kept there grow without bound with the number of visitors.  The page's state is a small
`Shown` handle instead; the traces live here, least recently used first out, bounded by count and
by the recordings' JSON bytes.  A handle whose traces were dropped reads as nothing shown.

Fair between sessions (issue 33): each session may hold up to `SPECVIZ_STORE_SESSION_MB` of the
`SPECVIZ_STORE_MB` in all.  Making room drops the *putting* session's own oldest entries first; then,
only from sessions holding more than a fair share of the store (its size over the number of
sessions holding runs, the putting one included), the largest holder's least recently used entry
(ties: the session used least recently).  So a visitor within a fair share never loses a run to
someone else's uploads -- four sessions uploading 8 MB recordings evict each other, not the victim's
run -- and a room of visitors loading big recordings one after the other is not locked out by the
first three (they were, while only the putting session's own entries could go).  A put that still
cannot fit raises `StoreFull`, whose message is for the page.

Per visit, nothing (issue 55).  A shipped recording is shown by *name*: ``Shown.shipped(path)`` refers to
the file, read once per process into a cache bounded by the number of shipped files, so a plain visit, a
deep link or an example click puts nothing here and cannot fill the store.  The store holds only a
visitor's own runs and uploads.  An entry belongs to a Gradio session; when Gradio no longer holds that
session (evicted past its capacity, or expired), the entry is the first to go when room is needed
(``alive``, set by the app to ask Gradio's state holder), so entries orphaned by an eviction that ran no
delete callback can never lock the store.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections import OrderedDict
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from ..serving.envvars import env_number
from ..trace import Trace, load_recording, recording_to_json

STORE_ENTRIES = 256
SHIPPED_MAX = 64  # shipped recordings parsed and kept (assets/traces holds a handful)
# JSON bytes of the held recordings; in memory a trace with its views takes ~6× its JSON.
STORE_BYTES = int(env_number("SPECVIZ_STORE_MB", 24.0) * 2**20)
# One session's share: enough for the largest recording an upload may be (10 MB).
SESSION_BYTES = int(env_number("SPECVIZ_STORE_SESSION_MB", 10.0) * 2**20)
_SESSION: ContextVar[str | None] = ContextVar("specviz_session", default=None)


class StoreFull(RuntimeError):
    """The run cannot be kept for this session; the message says why, for the page."""


def current_session() -> str:
    """The session of the event being handled: Gradio's session hash ("" outside an event: scripts, tests)."""
    name = _SESSION.get()
    if name is not None:
        return name
    try:
        from gradio.context import LocalContext

        return str(getattr(LocalContext.request.get(None), "session_hash", None) or "")
    except Exception:  # noqa: BLE001 -- no Gradio, no event: the shared anonymous session
        return ""


@contextmanager
def as_session(name: str) -> Iterator[None]:
    """Handle what follows as session `name` (tests, scripts)."""
    token = _SESSION.set(name)
    try:
        yield
    finally:
        _SESSION.reset(token)


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"


@functools.lru_cache(maxsize=SHIPPED_MAX)
def _shipped(path: str) -> tuple[dict, int]:
    """A shipped recording's traces and JSON bytes, read once per process (the files do not change)."""
    data = Path(path).read_bytes()
    spec, std = load_recording(data)
    return {"spec": spec, "std": std}, len(data)


@dataclass(frozen=True)
class Shown:
    """The page's state: a handle on the run or recording it shows.  Reads like the dict it
    replaces (``state.get("spec")``), so handlers need not know where the traces are.

    ``recording``: the path of a shipped recording, shown by name (no store entry; ``id`` is 0)."""

    id: int
    session: str = ""
    recording: str = ""
    run: bool = False  # a run of this visitor's own (a race, a shoot-out run), not an upload or a recording

    @classmethod
    def shipped(cls, path: Path | str) -> "Shown":
        """A handle on a shipped recording: costs no store entry, never dropped."""
        _shipped(str(path))  # read (and checked) now, once per process
        return cls(0, "", str(path))

    @property
    def held(self) -> bool:
        """Whether this handle holds a store entry of the visitor's own (a run or an upload)."""
        return not self.recording

    def _found(self) -> dict | None:
        return _shipped(self.recording)[0] if self.recording else STORE.lookup(self.id)

    def get(self, name: str, default: Any = None) -> Any:
        found = self._found()
        return found.get(name, default) if found else default

    def __getitem__(self, name: str) -> Any:
        found = self._found()
        if found is None:
            raise KeyError(name)
        return found[name]

    def __bool__(self) -> bool:
        return self._found() is not None

    @property
    def nbytes(self) -> int | None:
        """The JSON bytes of the shown recording (None once dropped)."""
        return _shipped(self.recording)[1] if self.recording else STORE.size(self.id)


class TraceStore:
    def __init__(self, max_entries: int = STORE_ENTRIES, max_bytes: int = STORE_BYTES,
                 session_bytes: int | None = None):
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.session_bytes = SESSION_BYTES if session_bytes is None else session_bytes
        self._lock = threading.Lock()
        self._items: OrderedDict[int, tuple[dict, int, str]] = OrderedDict()
        self._ids = itertools.count(1)
        self.nbytes = 0
        # Whether Gradio still holds a session (the app sets it to ask its state holder); entries of a
        # session it dropped go first when room is needed.  Default: every session is alive.
        self.alive: Callable[[str], bool] = lambda _session: True

    def __len__(self) -> int:
        return len(self._items)

    def session_nbytes(self, session: str) -> int:
        with self._lock:
            return sum(n for _, n, s in self._items.values() if s == session)

    def put(self, spec: Trace | None, std: Trace | None, nbytes: int | None = None,
            session: str | None = None, run: bool = False) -> Shown:
        """Hold (spec, std) for `session` (default: the current event's) and return its handle.  Room is
        made by dropping that session's own least recently used entries, never another's; StoreFull
        when the run is over the session's share or the other sessions hold the rest."""
        if nbytes is None:
            nbytes = len(recording_to_json(spec, std)) if (spec or std) else 0
        session = current_session() if session is None else session
        quota = min(self.session_bytes, self.max_bytes)
        if nbytes > quota:
            raise StoreFull(f"This run is too large for the server to keep for your page ({_mb(nbytes)}; each "
                            f"visitor may keep {_mb(quota)}, SPECVIZ_STORE_SESSION_MB): load a smaller recording "
                            "or a shorter run.")
        with self._lock:
            mine = [k for k, (_, _, s) in self._items.items() if s == session]  # least recently used first
            own = sum(self._items[k][1] for k in mine)
            while mine and own + nbytes > quota:
                own -= self._pop(mine.pop(0))
            full = lambda: self.nbytes + nbytes > self.max_bytes or len(self._items) + 1 > self.max_entries  # noqa: E731
            # Entries of sessions Gradio dropped go at every put (at most STORE_ENTRIES checks of a dict): the
            # store holds live visitors' runs only, and its memory follows them (a session evicted while its
            # event still ran set its state on a session Gradio no longer held, with no callback to run).
            self._drop_dead(session)
            while full() and mine:
                own -= self._pop(mine.pop(0))
            while full():
                key = self._over_share(session)
                if key is None:
                    raise StoreFull(f"The server is holding other visitors' runs ({_mb(self.nbytes - own)} of "
                                    f"{_mb(self.max_bytes)}, SPECVIZ_STORE_MB), none over a fair share: it cannot keep "
                                    "this one for your page now. Try again in a few minutes, or ask the host for a "
                                    "bigger store.")
                self._pop(key)
            key = next(self._ids)
            self._items[key] = ({"spec": spec, "std": std}, nbytes, session)
            self.nbytes += nbytes
        return Shown(key, session, run=run)

    def _pop(self, key: int) -> int:
        _, n, _ = self._items.pop(key)
        self.nbytes -= n
        return n

    def _drop_dead(self, putting: str) -> None:
        """Drop the entries of sessions Gradio no longer holds (never the putting one's)."""
        verdict: dict[str, bool] = {}
        for key, (_, _, s) in list(self._items.items()):
            if s == putting:
                continue
            if s not in verdict:
                try:
                    verdict[s] = bool(self.alive(s)) if s else True  # "" (scripts, tests): never orphaned
                except Exception:  # noqa: BLE001 -- a failing check must not lock the store: keep the entry
                    verdict[s] = True
            if not verdict[s]:
                self._pop(key)

    def sweep(self) -> int:
        """Drop every entry whose session Gradio no longer holds; the number dropped."""
        with self._lock:
            before = len(self._items)
            self._drop_dead("\0")
            return before - len(self._items)

    def stats(self) -> dict[str, int]:
        """The store's size, for the soak and the log: entries, bytes, sessions holding entries."""
        with self._lock:
            return {"entries": len(self._items), "bytes": self.nbytes,
                    "sessions": len({s for _, _, s in self._items.values()})}

    def _over_share(self, putting: str) -> int | None:
        """The entry to drop for another session's put: the least recently used entry of the session
        holding the most bytes over a fair share (store ÷ sessions holding runs, the putting one
        counted); None when no other session is over its share."""
        held: dict[str, int] = {}
        last: dict[str, int] = {}  # a session's place in the use order: its most recently used entry
        first: dict[str, int] = {}  # its least recently used entry
        for i, (key, (_, n, s)) in enumerate(self._items.items()):
            held[s] = held.get(s, 0) + n
            last[s] = i
            first.setdefault(s, key)
        share = self.max_bytes / (len(held | {putting: 0}))
        over = [s for s, n in held.items() if s != putting and n > share]
        if not over:
            return None
        victim = max(over, key=lambda s: (held[s], -last[s]))
        return first[victim]

    def lookup(self, key: int) -> dict | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def size(self, key: int) -> int | None:
        with self._lock:
            item = self._items.get(key)
            return item[1] if item else None

    def discard(self, handle: Any) -> None:
        """Drop the one entry ``handle`` names (a room's shown run it let go: serving.rooms' ``release``)."""
        if isinstance(handle, Shown) and handle.held:
            with self._lock:
                if handle.id in self._items:
                    self._pop(handle.id)

    def drop_session(self, session: str) -> None:
        """Drop every entry of ``session`` (a room that closed)."""
        with self._lock:
            for key in [k for k, (_, _, s) in self._items.items() if s == session]:
                self._pop(key)

    def drop(self, state: Any) -> None:
        """gr.State's delete_callback: the session ended (or its state expired), its traces go, all of them."""
        if isinstance(state, Shown) and state.held:
            with self._lock:
                gone = [state.id] + ([k for k, (_, _, s) in self._items.items() if s == state.session]
                                     if state.session else [])
                for key in gone:
                    item = self._items.pop(key, None)
                    if item:
                        self.nbytes -= item[1]


STORE = TraceStore()
