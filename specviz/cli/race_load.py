"""The race under load: does the headline hold when the machine is busy?

    python -m specviz.cli.bench --race-under-load [--races 5] [--hogs 3] [--json FILE]

Runs the default example's race (the first of assets/examples.json, the app's default settings and
pair, replays off) ``--races`` times in each of four conditions, through the app's own race
(serving.service.race: threads chosen for the moment, the runs interleaved, the timings judged):

    idle       the machine to itself
    hogs       ``--hogs`` pure-Python CPU-hog processes beside it the whole time
    switching  the same hogs stopped and started every ``--switch-s`` seconds (a sequential race then
               compares two different machines)
    second     a second specviz process making its own races beside it (the workshop server case)

and, for contrast, the same races as specviz made them before: sequential, on every core.  For each
race: both runs' tokens/s, the speedup, whether it was flagged and the count-based figure; per
condition the median and the spread (max − min over the median) of the speedups.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CONDITIONS = ("idle", "hogs", "switching", "second")
MODES = {"interleaved": dict(order=None, threads=None), "sequential, all cores (before)": dict(order="sequential", threads=0)}


def _hog() -> None:  # pragma: no cover - runs in a child process
    x = 0
    while True:
        x = (x * 1103515245 + 12345) % 2**31


class Load:
    """The background of one condition: hog processes, switched or not, or a second specviz process."""

    def __init__(self, condition: str, hogs: int, switch_s: float):
        self.condition, self.hogs, self.switch_s = condition, hogs, switch_s
        self.procs: list[Any] = []
        self.stop = threading.Event()

    def __enter__(self) -> "Load":
        if self.condition in ("hogs", "switching"):
            self.procs = [mp.Process(target=_hog, daemon=True) for _ in range(self.hogs)]
            for p in self.procs:
                p.start()
            if self.condition == "switching":
                threading.Thread(target=self._switch, daemon=True).start()
        elif self.condition == "second":
            env = {**os.environ, "SPECVIZ_REPLAY": "0"}
            self.procs = [subprocess.Popen([sys.executable, "-m", "specviz.cli.race_load", "--worker"], cwd=ROOT,
                                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
            time.sleep(40)  # let it load its models and start racing
        return self

    def _switch(self) -> None:
        on = True
        while not self.stop.wait(self.switch_s):
            on = not on
            for p in self.procs:
                try:
                    os.kill(p.pid, signal.SIGCONT if on else signal.SIGSTOP)
                except ProcessLookupError:
                    pass

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        for p in self.procs:
            try:
                os.kill(p.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            p.terminate()  # a hog (multiprocessing.Process) or the second specviz (subprocess.Popen)
        for p in self.procs:
            p.join(10) if isinstance(p, mp.Process) else p.wait(10)


def _example() -> tuple[str, dict]:
    ex = json.loads((ROOT / "assets" / "examples.json").read_text())[0]
    settings = {k: v for k, v in ex.items() if k not in ("label", "prompt")}
    return ex["prompt"], settings


def _request(pair: Any, prompt: str, settings: dict) -> Any:
    """The example as the app checks and tokenises it."""
    from ..serving.service import check_request, tokenize

    text, checked = check_request(prompt, **settings)
    return tokenize(pair, text, checked)


def one_race(request: Any, mode: dict) -> dict:
    from ..serving.service import race

    final = list(race(request, order=mode["order"], threads=mode["threads"]))[-1]
    spec, std, t = final.spec, final.std, final.spec.timing
    a, b = spec.summary().tokens_per_s, std.summary().tokens_per_s
    return {"speedup": round(a / b, 3), "spec_tok_s": round(a, 2), "std_tok_s": round(b, 2), "how": t.how,
            "threads": t.threads, "threads_end": t.threads_end, "busy": t.busy, "busy_during": t.busy_during,
            "reliable": t.reliable, "spread": t.spread, "predicted": t.predicted,
            "slowdown": t.slowdown, "why": t.why}


def summary(rows: list[dict]) -> dict:
    sp = [r["speedup"] for r in rows]
    med = statistics.median(sp)
    return {"median": round(med, 3), "spread": round((max(sp) - min(sp)) / med, 3),
            "flagged": sum(not r["reliable"] for r in rows), "races": len(rows),
            "spec_tok_s": round(statistics.median(r["spec_tok_s"] for r in rows), 2),
            "std_tok_s": round(statistics.median(r["std_tok_s"] for r in rows), 2)}


def run(races: int, hogs: int, switch_s: float, conditions: list[str], out: Path | None,
        modes: list[str] | None = None) -> dict:
    from .. import hardware  # noqa: F401  (installs the probe: load_pair's "auto" execution)
    from ..models import load_pair
    from ..serving.service import default_preset

    prompt, settings = _example()
    pair = load_pair(default_preset())
    request = _request(pair, prompt, settings)
    machine = pair.probe.machine.get("label", "") if pair.probe else ""
    print(f"{pair.draft_name} -> {pair.target_name}, target {pair.target_exec}, on {machine}", file=sys.stderr)
    one_race(request, MODES["interleaved"])  # warm up
    report: dict = {"machine": machine, "example": prompt, "settings": settings, "conditions": {}}
    chosen = {name: mode for name, mode in MODES.items() if not modes or name.split(",")[0] in modes}
    for cond in conditions:
        rows: dict[str, list[dict]] = {m: [] for m in chosen}
        with Load(cond, hogs, switch_s):
            for i in range(races):
                for name, mode in (chosen.items() if i % 2 == 0 else reversed(chosen.items())):  # alternating order
                    row = one_race(request, mode)
                    rows[name].append(row)
                    print(cond, name, json.dumps(row), file=sys.stderr, flush=True)
        report["conditions"][cond] = {m: {"summary": summary(r), "races": r} for m, r in rows.items()}
        if out:
            out.write_text(json.dumps(report, indent=1))
    _print(report)
    return report


def _print(report: dict) -> None:
    print(f"\nRace under load: {report['example'][:50]}… on {report['machine']}")
    print("| condition | race | speedups | median | spread | flagged | spec / std tok/s (median) |")
    print("|---|---|---|---|---|---|---|")
    for cond, modes in report["conditions"].items():
        for mode, d in modes.items():
            s = d["summary"]
            sps = ", ".join(f"{r['speedup']:.2f}" for r in d["races"])
            print(f"| {cond} | {mode} | {sps} | **{s['median']:.2f}×** | {s['spread']:.0%} | {s['flagged']} of "
                  f"{s['races']} | {s['spec_tok_s']:.1f} / {s['std_tok_s']:.1f} |")


def worker() -> None:  # pragma: no cover - the second specviz process of the "second" condition
    from .. import hardware  # noqa: F401  (installs the probe: load_pair's "auto" execution)
    from ..models import load_pair
    from ..serving.service import default_preset, race

    prompt, settings = _example()
    pair = load_pair(default_preset())
    request = _request(pair, prompt, settings)
    while True:
        list(race(request))


if __name__ == "__main__":  # pragma: no cover
    if "--worker" in sys.argv:
        worker()
