"""A large, valid recording for the memory-budget tests: a shipped recording's rounds repeated (the issue's attack
showed a 7.85 MB recording in 16 rooms)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "assets" / "traces" / "1-code-greedy.json"


def big_recording(path: Path, megabytes: float = 7.85) -> Path:
    """Write a recording of about ``megabytes`` MB to ``path`` (its standard trace as shipped)."""
    data = json.loads(SOURCE.read_text(encoding="utf-8"))
    spec = data["speculative"]
    base = spec["rounds"]
    total = spec["summary"]["tokens"]
    emitted = [b["n_before"] - a["n_before"] for a, b in zip(base, base[1:])] + [total - base[-1]["n_before"]]
    per_copy = len(json.dumps(base).encode())
    copies = max(1, int(megabytes * 2**20 / per_copy))
    rounds, n = [], 0
    for _ in range(copies):
        for r, e in zip(base, emitted):
            r = copy.deepcopy(r)
            r["index"], r["n_before"] = len(rounds), n
            rounds.append(r)
            n += e
    spec["rounds"] = rounds
    path.write_text(json.dumps(data), encoding="utf-8")
    return path
