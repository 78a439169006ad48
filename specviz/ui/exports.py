"""The files the page offers for download: a run's recording ("Export trace"), a shipped recording's (written
once), kept in one folder of which only the newest stay (Gradio serves its own copy of each)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..trace import Trace, save_recording
from .store import Shown

EXPORT_KEEP = 32  # exported recordings kept on disk (the newest); a download takes the file at once


def export_dir() -> Path:
    return Path(os.environ.get("SPECVIZ_EXPORT_DIR") or Path(tempfile.gettempdir()) / "specviz-exports")


def export_file(spec: Trace | None, std: Trace | None, *, data: bytes | None = None) -> str | None:
    """The recording as a file for "Export trace": all exports in one directory, of which only
    the newest EXPORT_KEEP stay (Gradio serves its own copy, removed by the Blocks' delete_cache).
    ``data``: the recording's bytes when the caller already has them (``recording_bytes``)."""
    if not spec and not std:
        return None
    folder = export_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = save_recording(spec, std, folder, data=data)
    prune(folder, "specviz-*.json", EXPORT_KEEP)
    return path


_SHIPPED_EXPORTS: dict[str, str] = {}  # a shipped recording's export file, written once while it exists


def shipped_export(path: Path) -> str | None:
    """The export file of a shipped recording: written once and reused while it is on disk, so a page
    visit does not serialise and write the recording again."""
    done = _SHIPPED_EXPORTS.get(str(path))
    if done and Path(done).exists():
        return done
    shown = Shown.shipped(path)
    out = export_file(shown.get("spec"), shown.get("std"))
    if out:
        _SHIPPED_EXPORTS[str(path)] = out
    return out


def prune(folder: Path, pattern: str, keep: int) -> None:
    """Keep the ``keep`` newest files of ``folder`` matching ``pattern``; delete the rest."""
    files = []
    for p in folder.glob(pattern):
        try:
            files.append((p.stat().st_mtime, p))
        except OSError:  # removed by another thread meanwhile
            pass
    for _, p in sorted(files, reverse=True)[keep:]:
        p.unlink(missing_ok=True)
