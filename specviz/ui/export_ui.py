""""Download as a page": the Live tab's run (a live run, a replay or a loaded recording) as one HTML file.

The page is built from what the Live tab's state holds (specviz.views.export_page) and written
to the exports folder; Gradio serves its copy.  With nothing shown, or when the page cannot be
built, the status line says so (never a traceback).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import gradio as gr

from ..trace.recording import write_new_file
from ..views.export_page import export_page
from .live import export_dir, prune, status_html

log = logging.getLogger("specviz.app")
PAGES_KEEP = 16  # exported pages kept on disk (the newest; ~5 MB each)
NOTHING = ("Nothing to download yet: run, replay or load a recording first, then “Download as a page” "
           "saves it as one HTML file that plays offline.")


def write_page(spec: Any, std: Any, folder: Path | None = None) -> Path:
    """The page of (spec, std), written to a new file in the exports folder; returns its path."""
    folder = folder or export_dir()
    folder.mkdir(parents=True, exist_ok=True)
    data = export_page(spec, std, source="exported from the specviz app").encode("utf-8")
    name = write_new_file(data, directory=folder, prefix="specviz-page-", suffix=".html")
    prune(folder, "specviz-page-*.html", PAGES_KEEP)
    return Path(name)


def download_page(state: Any) -> tuple[Any, Any]:
    """(the page file's update, the status line's update) for the "Download as a page" button."""
    spec, std = (state or {}).get("spec"), (state or {}).get("std")
    if not spec and not std:
        return gr.update(value=None, visible=False), status_html(NOTHING, "warn")
    try:
        path = write_page(spec, std)
    except Exception as exc:  # a full disk, an unreadable exports folder, a view that cannot draw…
        log.exception("page export failed")
        return gr.update(value=None, visible=False), status_html(f"Could not make the page: {exc}", "error")
    return gr.update(value=str(path), visible=True), gr.skip()


def hidden_page() -> Any:
    """The page file hidden again (a new run or recording is shown: the old page is not it)."""
    return gr.update(value=None, visible=False)
