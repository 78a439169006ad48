"""The app, plus one line a second of its bounded state (for scripts/soak.py): the store, Gradio's sessions, the
run cancel flags, written to $SPECVIZ_SOAK_STATS as JSON lines.  Otherwise exactly `python app.py`."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import app  # noqa: E402
from specviz.serving.cancel import CANCELS  # noqa: E402
from specviz.ui.store import STORE  # noqa: E402


def _write_stats(path: Path) -> None:
    while True:
        time.sleep(1.0)
        demo = getattr(STORE.alive, "args", [None])[0]
        holder = getattr(demo, "state_holder", None)
        line = {"t": time.time(), "store": STORE.stats(),
                "sessions": len(holder.session_data) if holder is not None else None, "cancels": len(CANCELS)}
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    target = os.environ.get("SPECVIZ_SOAK_STATS")
    if target:
        threading.Thread(target=_write_stats, args=(Path(target),), daemon=True).start()
    app.main()
