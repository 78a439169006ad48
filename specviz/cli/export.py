"""Export a recording as one standalone HTML page ("Download as a page", from the command line).

    python -m specviz.export RECORDING.json -o run.html
    python -m specviz.export 2-chat-greedy -o chat.html     # a shipped recording (assets/traces/)

The page plays the run as the Live tab does, offline (specviz.views.export_page).  No model is
loaded: a recording replays from its own numbers.  A missing or invalid file is reported in one
line, with a non-zero exit status.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from ..trace import MAX_TRACE_BYTES, TraceError, load_recording
from ..views.export_page import export_page

TRACES = Path(__file__).resolve().parents[2] / "assets" / "traces"


class ExportError(Exception):
    """A recording that cannot be exported, in words for the person who named it."""


def shipped_names(folder: Path = TRACES) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.json"))


def find_recording(name: str, *, folder: Path = TRACES) -> Path:
    """A path as given, else a shipped recording by name ("2-chat-greedy" or "2-chat-greedy.json")."""
    path = Path(name).expanduser()
    if path.is_file():
        return path
    if path.exists():
        raise ExportError(f"{name} is not a file")
    if len(path.parts) == 1:
        shipped = folder / (path.name if path.suffix == ".json" else f"{path.name}.json")
        if shipped.is_file():
            return shipped
    names = ", ".join(shipped_names(folder)) or "none"
    raise ExportError(f"no such file: {name} (shipped recordings: {names})")


def export_file(recording: str | os.PathLike, out: str | os.PathLike, *, folder: Path = TRACES) -> tuple[Path, int]:
    """Write the page of `recording` (a path or a shipped name) to `out`; returns (path, bytes)."""
    src = find_recording(str(recording), folder=folder)
    target = Path(out).expanduser()
    if target.is_dir():
        raise ExportError(f"{target} is a folder: give the page's file name, e.g. {target / 'run.html'}")
    if not (target.parent if str(target.parent) else Path(".")).is_dir():
        raise ExportError(f"cannot write {target}: the folder {target.parent} does not exist")
    try:
        size = src.stat().st_size
        if size > MAX_TRACE_BYTES:
            raise ExportError(f"{src} is too large ({size:,} bytes; recordings are at most {MAX_TRACE_BYTES:,})")
        spec, std = load_recording(src.read_bytes())
    except OSError as exc:
        raise ExportError(f"could not read {src}: {exc.strerror or exc}") from None
    except TraceError as exc:
        raise ExportError(f"{src} is not a specviz recording that loads: {exc}") from None
    page = export_page(spec, std, source=src.name).encode("utf-8")
    return write_atomic(target, page), len(page)


def write_atomic(path: Path, data: bytes) -> Path:
    """Write `data` to `path` through a temporary file beside it, so a failure leaves no half page."""
    if path.is_dir():
        raise ExportError(f"{path} is a folder: give the page's file name, e.g. {path / 'run.html'}")
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".specviz-", suffix=".html", dir=folder)
    except OSError as exc:
        raise ExportError(f"cannot write into {folder}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # as an ordinary new file (mkstemp's are private)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise ExportError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specviz.export",
        description="Export a specviz recording as one HTML page that plays the run offline "
                    "(rounds, tree walks, the race, metrics and charts; no server, no network).")
    parser.add_argument("recording", help="a recording's .json file, or a shipped one's name "
                                          f"({', '.join(shipped_names()) or 'none shipped'})")
    parser.add_argument("-o", "--output", help="the page to write (default: the recording's name with .html, "
                                               "in the current folder)")
    args = parser.parse_args(argv)
    out = args.output or f"{Path(args.recording).stem or 'specviz-run'}.html"
    try:
        path, nbytes = export_file(args.recording, out)
    except ExportError as exc:
        print(f"specviz export: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {path} ({nbytes / 1e6:.1f} MB): open it in any browser, offline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
