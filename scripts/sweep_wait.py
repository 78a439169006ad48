"""How long a live run waits behind a sweep (issue 33: "a live run waits ≤ one sweep point behind a sweep").

In this process, with the page's own handlers: a γ sweep from the Sweeps tab (`ui.tabs.sweep`, as the page
runs it: at the live gate with the sweep's priority, 2 repeats round-robin) holds the models; meanwhile live
runs arrive through the `/trace` handler (`ui.api.api_trace`) at random moments, one at a time.  For each live
run it measures the wait from its request to its holding the gate, and the duration of the sweep point that
was running when it arrived (the sweep's decodes between two of its point boundaries).  A live run waits at
most one point when wait ≤ that point's duration (plus the gate's polling, 0.05 s).

    python scripts/sweep_wait.py --json docs/benchmarks/data/sweep-wait-epyc-avx2.json           # tiny pair
    python scripts/sweep_wait.py --preset "Qwen2.5-Coder 0.5B → 1.5B (offline)" --tokens 32  # the default pair

Exit status 0 when every live run waited at most one point.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default=None, help="model pair (default: the tiny random pair)")
    ap.add_argument("--tokens", type=int, default=48, help="new tokens per sweep point and per live run")
    ap.add_argument("--live", type=int, default=6, help="live runs sent during the sweep")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    import specviz.hardware  # noqa: F401 - the execution chooser, as the app installs it
    from specviz.models import TINY_PRESET
    from specviz.serving import replay, service
    from specviz.serving import sweep_budget as SB
    from specviz.ui import api, tabs
    from specviz.ui.form import RunForm

    preset = args.preset or TINY_PRESET
    replay.CACHE.enabled = False  # every live run runs
    api.API_STREAM_S = 0.0
    service.get_pair(preset)  # loaded before timing anything

    t0 = time.monotonic()
    now = lambda: time.monotonic() - t0  # noqa: E731
    boundaries: list[float] = []  # the sweep's point boundaries (before each point but the first)
    yields: list[tuple[float, float]] = []  # (from, to): the gate given to live runs
    real_between = SB.SweepBudget.between_points

    def between_points(self):
        start = now()
        boundaries.append(start)
        before = self.yielded_s
        real_between(self)
        if self.yielded_s > before:
            yields.append((start, now()))

    SB.SweepBudget.between_points = between_points
    acquired: dict[int, float] = {}
    real_enter = replay.GATE.enter

    def enter(*a, priority="live", **k):
        yield from real_enter(*a, priority=priority, **k)
        if priority == "live":
            acquired[threading.get_ident()] = now()

    replay.GATE.enter = enter

    form = RunForm(preset=preset, prompt="def fibonacci(n):", gamma=4, max_new_tokens=args.tokens)
    sweep_out: dict = {}

    def run_sweep():
        started = now()
        frames = list(tabs.sweep("gamma", form))
        sweep_out.update(started=started, ended=now(), status=frames[-1].status if frames else None)

    sweeper = threading.Thread(target=run_sweep)
    sweeper.start()
    while len(boundaries) < 2 and sweeper.is_alive():  # the sweep holds the gate and has begun its points
        time.sleep(0.01)
    rng = random.Random(args.seed)
    lives = []
    for i in range(args.live):
        if not sweeper.is_alive():
            break
        time.sleep(rng.uniform(0.2, 1.5))
        if not sweeper.is_alive():
            break
        rec: dict = {"asked": now()}

        def live(rec=rec, i=i):
            args_ = (f"Live run {i} during a sweep: write a haiku.", preset, 4, 0.0, 0.0, 1.0, args.tokens, 0, "opt",
                     True)
            for _ in api.api_trace(*args_):
                pass
            rec["got_gate"] = acquired.get(threading.get_ident())
            rec["done"] = now()

        th = threading.Thread(target=live)
        th.start()
        th.join()
        lives.append(rec)
    sweeper.join()
    SB.SweepBudget.between_points = real_between
    replay.GATE.enter = real_enter

    # The point running when each live run arrived: from the last boundary before it to the next one (minus
    # any time the sweep had given away meanwhile).
    edges = [sweep_out["started"]] + boundaries + [sweep_out["ended"]]
    rows = []
    for rec in lives:
        before = max(e for e in edges if e <= rec["asked"])
        after = min((e for e in boundaries if e > rec["asked"]), default=sweep_out["ended"])
        point_s = after - before
        wait = rec["got_gate"] - rec["asked"]
        rows.append({"asked_s": round(rec["asked"], 3), "waited_s": round(wait, 3), "point_s": round(point_s, 3),
                     "left_of_point_s": round(after - rec["asked"], 3),
                     "within_one_point": wait <= point_s + 0.05, "run_s": round(rec["done"] - rec["got_gate"], 3)})
    durations = [b - a for a, b in zip(edges, edges[1:])]
    given = [b - a for a, b in yields]
    points = [d for d in durations]
    out = {"machine": _machine(), "cores": os.cpu_count(), "preset": preset, "tokens": args.tokens,
           "sweep_s": round(sweep_out["ended"] - sweep_out["started"], 2), "sweep_status": sweep_out.get("status"),
           "sweep_steps": len(boundaries) + 1, "point_s_max": round(max(points), 3),
           "point_s_median": round(sorted(points)[len(points) // 2], 3), "live_runs": rows,
           "max_wait_s": round(max(r["waited_s"] for r in rows), 3) if rows else None,
           "gate_given_to_live_s": round(sum(given), 2)}
    for r in rows:
        print(f"live run asked at {r['asked_s']:7.2f} s: waited {r['waited_s']:.2f} s for the gate, "
              f"the point in progress lasted {r['point_s']:.2f} s ({r['left_of_point_s']:.2f} s of it left); "
              f"within one point: {r['within_one_point']}; ran {r['run_s']:.2f} s")
    print(f"sweep: {out['sweep_steps']} decodes in {out['sweep_s']} s (median {out['point_s_median']} s, "
          f"max {out['point_s_max']} s each); {out['sweep_status']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, ensure_ascii=False))
    return 0 if rows and all(r["within_one_point"] for r in rows) else 1


def _machine() -> str:
    from specviz.hardware.machine import this_machine

    return this_machine().describe()


if __name__ == "__main__":
    sys.exit(main())
