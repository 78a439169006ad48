"""What the page shows, held on the server in one bounded store instead of in each session.

Gradio keeps a session's `gr.State` for as long as the session lives (up to 10,000 sessions), so
traces kept there grow without bound with the number of visitors.  The page's state is a small
`Shown` handle instead; the traces live here, least recently used first out, bounded by count and
by the recordings' JSON bytes.  A handle whose traces were dropped reads as nothing shown.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ..serving.envvars import env_number
from ..trace import Trace, recording_to_json

STORE_ENTRIES = 256
# JSON bytes of the held recordings; in memory a trace with its views takes ~6× its JSON.
STORE_BYTES = int(env_number("SPECVIZ_STORE_MB", 24.0) * 2**20)


@dataclass(frozen=True)
class Shown:
    """The page's state: a handle on the run or recording it shows.  Reads like the dict it
    replaces (``state.get("spec")``), so handlers need not know where the traces are."""

    id: int

    def get(self, name: str, default: Any = None) -> Any:
        found = STORE.lookup(self.id)
        return found.get(name, default) if found else default

    def __getitem__(self, name: str) -> Any:
        found = STORE.lookup(self.id)
        if found is None:
            raise KeyError(name)
        return found[name]

    def __bool__(self) -> bool:
        return STORE.lookup(self.id) is not None


class TraceStore:
    def __init__(self, max_entries: int = STORE_ENTRIES, max_bytes: int = STORE_BYTES):
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._lock = threading.Lock()
        self._items: OrderedDict[int, tuple[dict, int]] = OrderedDict()
        self._ids = itertools.count(1)
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def put(self, spec: Trace | None, std: Trace | None, nbytes: int | None = None) -> Shown:
        if nbytes is None:
            nbytes = len(recording_to_json(spec, std)) if (spec or std) else 0
        with self._lock:
            key = next(self._ids)
            self._items[key] = ({"spec": spec, "std": std}, nbytes)
            self.nbytes += nbytes
            while len(self._items) > 1 and (len(self._items) > self.max_entries or self.nbytes > self.max_bytes):
                _, (_, n) = self._items.popitem(last=False)
                self.nbytes -= n
        return Shown(key)

    def lookup(self, key: int) -> dict | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def drop(self, state: Any) -> None:
        """gr.State's delete_callback: the session ended, its traces go."""
        if isinstance(state, Shown):
            with self._lock:
                item = self._items.pop(state.id, None)
                if item:
                    self.nbytes -= item[1]


STORE = TraceStore()
