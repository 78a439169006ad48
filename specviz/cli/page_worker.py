"""The app's "Download as a page", made in a process of its own (issue 33).

    python -m specviz.cli.page_worker RECORDING.json PAGE.html SOURCE

Making the page of a big recording is ~17 s of CPU (7.9 MB on a 2-core EPYC) in plain Python and long
C calls that hold the GIL; made in the server's process it stalled every replay streaming beside it.
Here it runs in a child process at a slightly lower priority (nice 2): the server hands it file paths (the
recording it wrote, the page to write), so nothing big crosses a pipe, and reads back one line.

The recording is loaded as the app loads an upload (every check), then drawn by the same
`export_page` as in process: the same page.  Exit status 0: the page is written; otherwise nothing is
written and stderr holds one line, the message the app shows (never a traceback).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# A little below the server's threads, so its streams and runs come first, but not starved: at nice 10, under
# three CPU hogs and a load average of 10, a small page's 4 s of CPU took over 120 s and the export failed.
# The page is made in its own process for the GIL (the server's streams never wait on it), not for the priority.
NICE = 2
FAILED = 2  # the exit status of a page that could not be made (its reason on stderr, one line)


def make_page(recording: Path, out: Path, source: str) -> int:
    """Write the page of the recording file to `out` (which exists, empty); returns the page's bytes."""
    from ..trace import load_recording
    from ..views.export_page import export_page

    spec, std = load_recording(recording.read_bytes())
    data = export_page(spec, std, source=source).encode("utf-8")
    with open(out, "wb") as f:
        f.write(data)
    return len(data)


def lower_priority() -> None:
    try:
        os.nice(NICE)
    except OSError:  # not allowed here: run at the server's priority
        pass


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m specviz.cli.page_worker RECORDING.json PAGE.html SOURCE", file=sys.stderr)
        return FAILED
    lower_priority()
    try:
        make_page(Path(args[0]), Path(args[1]), args[2])
    except Exception as exc:  # noqa: BLE001 -- the app shows the reason in one line, as it did in process
        print(" ".join(str(exc).split()) or type(exc).__name__, file=sys.stderr)
        return FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
