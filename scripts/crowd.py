"""A workshop room, simulated: N attendees press Run at about the same moment.

Each attendee is a gradio_client on loopback calling the app's `/trace` API, most with one
of the page's example prompts and default settings (what a room does), a few with a prompt
of their own.  Reports how many were served, how many were told to retry, and the p50/p95
wait (submit → first output) and total time, for the examples and the unique prompts.

    python app.py &
    python scripts/crowd.py --url http://127.0.0.1:7860/ --attendees 30 --json crowd.json

`--preset tiny` sends every request to the tiny random pair (a quick check of the script and the
server; the examples are then not the shipped recordings, so the first of each runs live).
Exit status 0 when every attendee was served or told when to retry, 1 otherwise.

Only loopback addresses are accepted: this is a load test of your own server.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from app import EXAMPLES as PAGE_EXAMPLES, example_settings  # noqa: E402

# What the page sends for its first four examples: the prompt and the settings the example sets.
EXAMPLES = [(e["prompt"], example_settings(e)) for e in PAGE_EXAMPLES[:4]]


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


RETRY = re.compile(r"retry in about (\d+) s")  # the live gate's refusal (specviz.serving.replay.Busy)


def attendee(url: str, prompt: str, settings: dict, kind: str, delay: float, out: list, lock: threading.Lock,
             timeout: float = 600.0) -> None:
    from gradio_client import Client

    time.sleep(delay)
    rec = {"kind": kind, "prompt": prompt[:60]}
    job = None
    try:
        client = Client(url, verbose=False)
        t0 = time.perf_counter()
        job = client.submit(prompt, api_name="/trace", **settings)
        first = None
        while not job.done():
            if first is None and job.outputs():
                first = time.perf_counter() - t0
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError(f"no result after {timeout:.0f} s")
            time.sleep(0.05)
        result = job.result()
        total = time.perf_counter() - t0
        rec.update(served=True, wait=first if first is not None else total, total=total,
                   replay=bool(result.get("replay")), tokens=result["speculative"]["summary"]["tokens"])
    except Exception as exc:  # "Queue is full", a clear retry message, a timeout: all reported
        msg = " ".join(str(exc).split())[:200]
        retry = RETRY.search(msg)
        rec.update(served=False, error=msg, retry_s=int(retry.group(1)) if retry else None)
        if job is not None and isinstance(exc, TimeoutError):
            job.cancel()
    with lock:
        out.append(rec)


def summarise(results: list[dict]) -> dict:
    out: dict = {"attendees": len(results), "served": sum(r["served"] for r in results)}
    for kind in ("example", "unique"):
        rs = [r for r in results if r["kind"] == kind]
        waits = [r["wait"] for r in rs if r["served"]]
        totals = [r["total"] for r in rs if r["served"]]
        out[kind] = {
            "n": len(rs), "served": len(waits), "replays": sum(r.get("replay", False) for r in rs),
            "told_to_retry": sum(r.get("retry_s") is not None for r in rs),
            "wait_p50": percentile(waits, 0.5), "wait_p95": percentile(waits, 0.95),
            "total_p50": percentile(totals, 0.5), "total_p95": percentile(totals, 0.95),
            "errors": sorted({r["error"] for r in rs if not r["served"] and r.get("retry_s") is None}),
        }
    return out


def report(summary: dict) -> str:
    """The summary in a few lines: served count and p50/p95 waits, examples and unique prompts apart."""
    def s(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f} s"
    lines = [f"{summary['served']} of {summary['attendees']} served in {summary['wall_s']:.0f} s "
             f"(load average {summary['load_avg'][0]:.1f})"]
    for kind, label in (("example", "examples:"), ("unique", "unique prompts:")):
        k = summary[kind]
        lines.append(f"  {label:<16} {k['served']}/{k['n']} served ({k['replays']} replays), "
                     f"{k['told_to_retry']} told to retry, {len(k['errors'])} other error(s); wait to first output "
                     f"p50 {s(k['wait_p50'])}, p95 {s(k['wait_p95'])}; total p50 {s(k['total_p50'])}, "
                     f"p95 {s(k['total_p95'])}")
        lines += [f"    error: {e}" for e in k["errors"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:7860/")
    ap.add_argument("--attendees", type=int, default=30)
    ap.add_argument("--unique", type=int, default=4, help="attendees with a prompt of their own")
    ap.add_argument("--spread", type=float, default=3.0, help="seconds over which the clicks arrive")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--preset", default=None, help="model pair for every request (e.g. tiny); default: the page's")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds an attendee waits for a result")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if urlparse(args.url).hostname not in ("127.0.0.1", "localhost", "::1"):
        ap.error("only a server on this machine (loopback) may be load-tested")
    rng = random.Random(args.seed)
    plan = [("unique", (f"Write a Python function that returns the {i + 2}-th power of a number x (variant {i}).", {}))
            for i in range(args.unique)]
    plan += [("example", rng.choice(EXAMPLES)) for _ in range(args.attendees - args.unique)]
    rng.shuffle(plan)
    if args.preset:
        plan = [(k, (p, {**s, "preset": args.preset})) for k, (p, s) in plan]
    results: list[dict] = []
    lock = threading.Lock()
    threads = [threading.Thread(target=attendee, args=(args.url, p, s, k, rng.uniform(0, args.spread), results, lock,
                                                      args.timeout)) for k, (p, s) in plan]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    summary = {**summarise(results), "wall_s": time.perf_counter() - t0, "load_avg": os.getloadavg()}
    print(json.dumps(summary, indent=2))
    print(report(summary))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "results": results}, indent=2))
    clean = all(r["served"] or r.get("retry_s") is not None for r in results)  # served, or told when to retry
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
