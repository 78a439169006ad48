""""Download as a page": the Live tab's run (a live run, a replay or a loaded recording) as one HTML file.

The page is built from what the Live tab's state holds (specviz.views.export_page) and written
to the exports folder; Gradio serves its copy.  With nothing shown, or when the page cannot be
built, the status line says so (never a traceback).

Pages are made outside the model gate, by `EXPORTS`: at most `SPECVIZ_EXPORTS` (2) at a time for
everyone and one at a time per session; a request past either limit is answered at once with what
it waits for, priced by the sizes of the pages in the making (about `SECONDS_PER_MB` of CPU per MB
of recording), and a recording over `SPECVIZ_EXPORT_MB` is refused with its size (issue 33).

Each page is made in a child process at a lower priority (specviz.cli.page_worker), one per slot, so
at most `SPECVIZ_EXPORTS` at once: made in the server's process, a big one's ~17 s of CPU held the GIL
in long stretches and stalled every replay streaming beside it.  The server writes the recording to
a file, the child writes the page to the file the server named; only paths and one line cross.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import gradio as gr

from ..serving.envvars import env_int, env_number
from ..cli import page_worker
from ..trace import recording_bytes
from ..trace.recording import write_new_file
from .exports import export_dir, prune
from .live import status_html
from .store import current_session

log = logging.getLogger("specviz.app")
PAGES_KEEP = 16  # exported pages kept on disk (the newest; ~5 MB each)
NOTHING = ("Nothing to download yet: run, replay or load a recording first, then “Download as a page” "
           "saves it as one HTML file that plays offline.")


SECONDS_PER_MB = 2.2  # CPU to make a page, per MB of recording JSON (7.9 MB took 16.9 s on a 2-core EPYC)


class ExportBusy(RuntimeError):
    """This page cannot be made now; the message (for the status line) says why and when to retry."""


class ExportSlots:
    """How many pages are made at once (`limit`), one per session, none over `max_bytes` of recording."""

    def __init__(self, limit: int | None = None, max_bytes: int | None = None):
        self.limit = limit or env_int("SPECVIZ_EXPORTS", 2)
        self.max_bytes = max_bytes or int(env_number("SPECVIZ_EXPORT_MB", 8.0) * 2**20)
        self._lock = threading.Lock()
        self._running: dict[int, tuple[str, int, float]] = {}  # ticket -> (session, bytes, started)
        self._tickets = 0

    @staticmethod
    def price_s(nbytes: int) -> float:
        return max(1.0, nbytes / 2**20 * SECONDS_PER_MB)

    def _left_s(self) -> float:
        now = time.monotonic()
        return sum(max(1.0, self.price_s(n) - (now - t)) for _, n, t in self._running.values())

    @contextmanager
    def slot(self, session: str, nbytes: int) -> Iterator[None]:
        """Hold one of the slots while the page is made; ExportBusy (at once, no queue) otherwise."""
        if nbytes > self.max_bytes:
            raise ExportBusy(f"This recording is too large to make a page of here ({nbytes / 2**20:.1f} MB; "
                             f"the limit is {self.max_bytes / 2**20:.0f} MB, about {self.price_s(nbytes):.0f} s of "
                             "work): use “Export trace” and `python -m specviz export` on your own machine.")
        with self._lock:
            mine = [t for s, _, t in self._running.values() if s == session]
            if mine:
                raise ExportBusy(f"Your page is still being made (started {time.monotonic() - mine[0]:.0f} s ago); "
                                 "it appears here when it is done.")
            if len(self._running) >= self.limit:
                raise ExportBusy(f"The server is making {len(self._running)} other page(s) (about "
                                 f"{self._left_s():.0f} s of work left); yours would take about "
                                 f"{self.price_s(nbytes):.0f} s: try again in a moment.")
            self._tickets += 1
            ticket = self._tickets
            self._running[ticket] = (session, nbytes, time.monotonic())
        try:
            yield
        finally:
            with self._lock:
                self._running.pop(ticket, None)

    @property
    def running(self) -> int:
        return len(self._running)


EXPORTS = ExportSlots()


class ExportFailed(RuntimeError):
    """The page could not be made; the message (one line, no traceback) is for the status line."""


class PageWorkers:
    """The child processes making pages now (bounded by EXPORTS' slots; counted for tests and the log)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running = 0
        self.most = 0  # the most running at once since the start

    def run(self, recording: Path, out: Path, source: str, timeout_s: float) -> None:
        """Make the page of `recording` into `out` in a child process; ExportFailed with its reason."""
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH")))))
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            done = subprocess.run([sys.executable, "-m", page_worker.__name__, str(recording), str(out), source],
                                  cwd=root, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise ExportFailed(f"it took longer than {timeout_s:.0f} s (the server is busy): try again later") from None
        finally:
            with self._lock:
                self.running -= 1
        if done.returncode != 0:
            lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
            raise ExportFailed(lines[-1] if lines else f"the page maker stopped (status {done.returncode})")


WORKERS = PageWorkers()


def write_page(spec: Any, std: Any, folder: Path | None = None, *, data: bytes | None = None) -> Path:
    """The page of (spec, std), written to a new file in the exports folder by a child process; returns
    its path.  ``data``: the recording's bytes when the caller has them (``recording_bytes``)."""
    folder = folder or export_dir()
    folder.mkdir(parents=True, exist_ok=True)
    data = recording_bytes(spec, std) if data is None else data
    src = Path(write_new_file(data, directory=folder, prefix=".specviz-src-", suffix=".json"))  # not pruned
    out = Path(write_new_file(b"", directory=folder, prefix="specviz-page-", suffix=".html"))
    try:
        WORKERS.run(src, out, "exported from the specviz app", timeout_s=max(120.0, 10 * EXPORTS.price_s(len(data))))
    except BaseException:
        out.unlink(missing_ok=True)  # never a half or empty page left behind
        raise
    finally:
        src.unlink(missing_ok=True)
    prune(folder, "specviz-page-*.html", PAGES_KEEP)
    return out


def download_page(state: Any) -> tuple[Any, Any]:
    """(the page file's update, the status line's update) for the "Download as a page" button."""
    spec, std = (state or {}).get("spec"), (state or {}).get("std")
    if not spec and not std:
        return gr.update(value=None, visible=False), status_html(NOTHING, "warn")
    try:
        nbytes, data = getattr(state, "nbytes", None), None  # a Shown knows its size; a plain dict (tests) is measured
        if not isinstance(nbytes, int):
            data = recording_bytes(spec, std)
            nbytes = len(data)
        with EXPORTS.slot(current_session(), nbytes):
            path = write_page(spec, std, data=data)
    except ExportBusy as exc:
        return gr.update(value=None, visible=False), status_html(str(exc), "warn")
    except ExportFailed as exc:  # the child's reason, in one line: no traceback to log (it has none here)
        log.warning("page export failed: %s", exc)
        return gr.update(value=None, visible=False), status_html(f"Could not make the page: {exc}", "error")
    except Exception as exc:  # a full disk, an unreadable exports folder, a view that cannot draw…
        log.exception("page export failed")
        return gr.update(value=None, visible=False), status_html(f"Could not make the page: {exc}", "error")
    return gr.update(value=str(path), visible=True), gr.skip()


def hidden_page() -> Any:
    """The page file hidden again (a new run or recording is shown: the old page is not it)."""
    return gr.update(value=None, visible=False)
