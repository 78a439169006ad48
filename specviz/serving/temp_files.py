"""Gradio's copies of the app's files (uploads, exported recordings, downloaded pages), bounded by size
and count as well as by age.

Gradio deletes them by age only (the Blocks' ``delete_cache``: every 15 minutes, those older than an
hour), so twenty loads and twenty downloads within the hour left 102 files and 202 MB on disk, and a
visitor who keeps loading 10 MB files fills it (issue 33).  `trim` deletes the oldest of the app's
files beyond `SPECVIZ_TEMP_FILES` (256) files or `SPECVIZ_TEMP_MB` (256) MB, as Gradio's own deletion
does: only files the app's Blocks recorded as its temporary files, never one a component keeps
(``keep_in_cache``: the page's initial values), aged by ctime (Gradio touches a copy it hands out
again).  `start` runs it every few seconds in a daemon thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterable

from .envvars import env_int

log = logging.getLogger("specviz.app")
MAX_FILES = env_int("SPECVIZ_TEMP_FILES", 256)
MAX_BYTES = env_int("SPECVIZ_TEMP_MB", 256) * 2**20
EVERY_S = 5.0


def evict_oldest(files: Iterable[str], *, max_files: int, max_bytes: int, keep: Iterable[str] = ()) -> set[str]:
    """Delete the oldest of ``files`` (by ctime) until at most ``max_files`` of them remain, together at
    most ``max_bytes``; never one in ``keep`` (nor is it counted).  Returns the paths that are gone: those
    deleted, and those already missing."""
    keep = set(keep)
    gone: set[str] = set()
    present = []
    for f in set(files) - keep:
        try:
            st = os.stat(f)
        except (FileNotFoundError, NotADirectoryError):
            gone.add(f)
            continue
        except OSError:  # unreadable: leave it to Gradio's own deletion
            continue
        present.append((st.st_ctime_ns, f, st.st_size))
    present.sort(reverse=True)  # newest first: they stay
    count = total = 0
    for _, f, size in present:
        count += 1
        total += size
        if count > max_files or total > max_bytes:
            try:
                os.remove(f)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("could not delete %s: %s", f, exc)
                continue
            gone.add(f)
    return gone


def _snapshot(s: set) -> list:
    """A copy of a set that request threads add to meanwhile."""
    for _ in range(5):
        try:
            return list(s)
        except RuntimeError:  # "Set changed size during iteration"
            continue
    return []


def trim(blocks: Any, *, max_files: int | None = None, max_bytes: int | None = None) -> set[str]:
    """Bound the Blocks' temporary files (``blocks.temp_file_sets``, as Gradio's ``delete_cache`` reads them);
    returns the paths removed.  Each file's folder (Gradio's copies sit one to a hashed folder) goes too
    once it is empty."""
    sets = list(getattr(blocks, "temp_file_sets", None) or [])
    keep: set[str] = set()
    for component in list(getattr(blocks, "blocks", {}).values()):
        keep.update(_snapshot(getattr(component, "keep_in_cache", set()) or set()))
    files = [f for s in sets for f in _snapshot(s)]
    gone = evict_oldest(files, max_files=MAX_FILES if max_files is None else max_files,
                        max_bytes=MAX_BYTES if max_bytes is None else max_bytes, keep=keep)
    for s in sets:
        s.difference_update(gone)
    cache = getattr(blocks, "GRADIO_CACHE", None)
    for f in gone:
        parent = Path(f).parent
        if cache and parent != Path(cache) and Path(cache) in parent.parents:
            try:
                parent.rmdir()  # only when empty
            except OSError:
                pass
    return gone


def start(blocks: Any, every_s: float = EVERY_S) -> threading.Thread:
    """Trim the Blocks' files every ``every_s`` seconds, for as long as the process runs."""
    def loop() -> None:
        while True:
            time.sleep(every_s)
            try:
                gone = trim(blocks)
                if gone:
                    log.info("deleted %d of Gradio's file copies (over %d files or %d MB)", len(gone), MAX_FILES,
                             MAX_BYTES // 2**20)
            except Exception as exc:  # one line, and try again next time
                log.warning("could not trim Gradio's file copies: %s", exc)

    t = threading.Thread(target=loop, daemon=True, name="temp-files")
    t.start()
    return t
