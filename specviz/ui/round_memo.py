"""Step mode's views of one round, drawn once per recording and round (issue 58).

In a class, every attendee's page steps with the teacher's: sixty pages ask for the same round of the same
recording within a second, and each of those requests drew the same narration, attention mask and acceptance
picture again (tens of ms each, one at a time for the whole server).  Here a view is made once per (recording,
round, what) and then served from a bounded memo, least recently used first out.

A recording is known by its trace object: the shipped recordings are read once per process (ui.store), a
visitor's run lives in the trace store and a teacher's run in its room, so every page showing one gets the very
same object.  The key is the object's ``id()`` and its number of rounds; a weak reference checks that the
entry's trace is still that object (an id can be reused once a trace is gone).  Values are shared between
pages, as ui.live's drawn recordings are: callers never change them in place (Gradio's postprocess reads a
figure, it does not change it); per-page wrappers (a gr.Radio update) are made fresh around them.

No Gradio here: the memo stores whatever the makers return.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, Hashable, TypeVar

T = TypeVar("T")
ENTRIES = 384  # views kept: ~30 recordings' rounds of 2-3 views; a view is a figure or a few kB of HTML


class RoundMemo:
    """A bounded LRU memo of views keyed by (a trace object, a key); thread-safe.  A miss makes the view under
    one lock, so sixty pages asking for a new round at once draw it once (the others wait, then read it)."""

    def __init__(self, entries: int = ENTRIES):
        self.entries = entries
        self._data: OrderedDict[tuple, tuple[Any, Any]] = OrderedDict()
        self._lock = threading.Lock()  # the dict
        self._making = threading.Lock()  # one maker at a time (the views hold the GIL anyway)
        self.hits = self.misses = 0

    @staticmethod
    def _key(spec: Any, key: Hashable) -> tuple:
        if spec is None:
            return (None, 0, key)
        return (id(spec), len(getattr(spec, "rounds", None) or ()), key)

    def _lookup(self, k: tuple, spec: Any) -> tuple[bool, Any]:
        with self._lock:
            found = self._data.get(k)
            if found is None:
                return False, None
            ref, value = found
            if spec is not None and (ref is None or ref() is not spec):  # another trace at a reused id
                del self._data[k]
                return False, None
            self._data.move_to_end(k)
            self.hits += 1
            return True, value

    def get(self, spec: Any, key: Hashable, make: Callable[[], T]) -> T:
        """``make()``'s value for ``spec`` and ``key``, made once while it stays in the memo."""
        k = self._key(spec, key)
        ok, value = self._lookup(k, spec)
        if ok:
            return value
        with self._making:
            ok, value = self._lookup(k, spec)  # made by another page while this one waited
            if ok:
                return value
            value = make()
            try:
                ref = weakref.ref(spec) if spec is not None else None
            except TypeError:  # an object without weak references: never memoised
                return value
            with self._lock:
                self.misses += 1
                self._data[k] = (ref, value)
                while len(self._data) > self.entries:
                    self._data.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._data)


ROUNDS = RoundMemo()
