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

Issue 33 ("one visitor cannot spoil the room"): `--compare --adversaries 3` runs the room twice on the
same server, alone and then beside adversarial clients that loop over what the public API lets a
visitor do to the others (ask for other executions and presets, hold the models with long unique
runs, send refused values) and reports the honest attendees' p95 with and without them.  `--launch`
starts the app itself (on a free port, `--env NAME=VALUE` for its settings) and also reports its RSS
at rest and at peak and whether the attendees' pair was loaded more than once (from the server's log).
The page-only events (uploads from many sessions, "Download as a page", sweeps) have no public API:
tests/test_sharing.py covers them.  A tiny smoke run:

    python scripts/crowd.py --launch --preset tiny --attendees 2 --seconds 20 --compare --adversaries 1
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
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


# What an adversary loops over (issue 33, items 1 and 4 through the public API): another execution of the
# default pair, the hub presets (a download on a server that allows them), a long unique run holding the
# models, and values the server must refuse.
ADVERSARY = [
    ({"target_exec": "int8"}, "other execution"),
    ({"target_exec": "bf16"}, "other execution"),
    ({"preset": "qwen-coder-7b"}, "hub preset"),
    ({"preset": "pythia"}, "hub preset"),
    ({"temperature": 1e-40}, "refused value"),
    ({"max_new_tokens": 256}, "long unique run"),
]


def adversary(url: str, stop: threading.Event, preset: str | None, out: list, lock: threading.Lock, k: int) -> None:
    from gradio_client import Client

    client = Client(url, verbose=False)
    n = 0
    while not stop.is_set():
        extra, kind = ADVERSARY[n % len(ADVERSARY)]
        settings = {"preset": preset, **extra} if preset and "preset" not in extra else dict(extra)
        prompt = f"Adversary {k} asks for the {kind} (try {n}): write a long essay about queues."
        t0 = time.perf_counter()
        try:
            client.predict(prompt, api_name="/trace", **settings)
            outcome = "served"
        except Exception as exc:  # refusals are what it should get
            outcome = " ".join(str(exc).split())[:120]
        with lock:
            out.append({"kind": kind, "outcome": outcome, "seconds": time.perf_counter() - t0})
        n += 1


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """The app launched in a subprocess: its URL, its RSS (sampled) and its log."""

    def __init__(self, env: dict[str, str], timeout: float = 600.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", prefix="crowd-server-", delete=False)
        full = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(self.port),
                "GRADIO_ANALYTICS_ENABLED": "False", **env}
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "app.py")], cwd=ROOT, env=full,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.samples: list[int] = []
        self._stop = threading.Event()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the app exited ({self.proc.returncode}); see {self.log.name}")
            try:
                import urllib.request

                with urllib.request.urlopen(self.url, timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            raise RuntimeError(f"the app did not answer in {timeout:.0f} s; see {self.log.name}")
        threading.Thread(target=self._sample, daemon=True).start()

    def rss(self) -> int:
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            self.samples.append(self.rss())

    def loads(self) -> dict[str, int]:
        """How often each pair was loaded, from the log ("Loaded A → B on … in N s"; the tiny pair, built in
        process, says nothing of the kind and is not counted)."""
        text = Path(self.log.name).read_text(errors="replace")
        found: dict[str, int] = {}
        for m in re.finditer(r"Loaded (.+?) on .+? in [\d.]+ s", text):
            found[m.group(1)] = found.get(m.group(1), 0) + 1
        return found

    def tracebacks(self) -> int:
        return Path(self.log.name).read_text(errors="replace").count("Traceback (most recent call last)")

    def stop(self) -> None:
        self._stop.set()
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def room(args: argparse.Namespace, url: str, plan: list, rng: random.Random, adversaries: int) -> dict:
    """One room: every attendee runs its plan (again and again until --seconds have passed), beside
    `adversaries` adversarial clients looping until the attendees are done."""
    results: list[dict] = []
    bad: list[dict] = []
    lock = threading.Lock()
    t0 = time.perf_counter()
    until = time.monotonic() + (args.seconds or 0)

    def honest(k: str, p: str, s: dict, delay: float) -> None:
        attendee(url, p, s, k, delay, results, lock, args.timeout)
        while time.monotonic() < until:
            attendee(url, p, s, k, 0.0, results, lock, args.timeout)

    threads = [threading.Thread(target=honest, args=(k, p, s, rng.uniform(0, args.spread))) for k, (p, s) in plan]
    stop_adv = threading.Event()
    advs = [threading.Thread(target=adversary, args=(url, stop_adv, args.preset, bad, lock, j), daemon=True)
            for j in range(adversaries)]
    for t in advs + threads:
        t.start()
    for t in threads:
        t.join()
    stop_adv.set()  # the adversaries stop after the request in flight
    for t in advs:
        t.join(args.timeout)
    summary = {**summarise(results), "wall_s": time.perf_counter() - t0, "load_avg": os.getloadavg(),
               "adversaries": adversaries, "adversary_requests": len(bad),
               "adversary_outcomes": sorted({b["outcome"] for b in bad})[:12]}
    served = [r["total"] for r in results if r["served"]]
    summary["total_p95_all"] = percentile(served, 0.95)
    summary["clean"] = all(r["served"] or r.get("retry_s") is not None for r in results)
    summary["results"] = results
    return summary


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
    ap.add_argument("--seconds", type=float, default=0.0, help="attendees keep running until then (0: once each)")
    ap.add_argument("--adversaries", type=int, default=0, help="adversarial clients beside the attendees")
    ap.add_argument("--compare", action="store_true", help="run the room alone first, then with the adversaries")
    ap.add_argument("--launch", action="store_true", help="start the app here (free port) and watch its RSS and log")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the launched app (repeatable)")
    args = ap.parse_args(argv)
    server = None
    if args.launch:
        env = dict(e.split("=", 1) for e in args.env)
        if args.preset == "tiny":
            env = {"SPECVIZ_SHOW_TINY": "1", "SPECVIZ_PRELOAD": "0", **env}
        server = Server(env, args.timeout)
        args.url = server.url
    if urlparse(args.url).hostname not in ("127.0.0.1", "localhost", "::1"):
        ap.error("only a server on this machine (loopback) may be load-tested")
    rng = random.Random(args.seed)
    plan = [("unique", (f"Write a Python function that returns the {i + 2}-th power of a number x (variant {i}).", {}))
            for i in range(args.unique)]
    plan += [("example", rng.choice(EXAMPLES)) for _ in range(args.attendees - args.unique)]
    rng.shuffle(plan)
    if args.preset:
        plan = [(k, (p, {**s, "preset": args.preset})) for k, (p, s) in plan]
    rooms = {}
    try:
        rest = server.rss() if server else None
        if args.compare or not args.adversaries:
            rooms["alone"] = room(args, args.url, plan, random.Random(args.seed), 0)
        if args.adversaries:
            rooms["with adversaries"] = room(args, args.url, plan, random.Random(args.seed), args.adversaries)
    finally:
        if server:
            server.stop()
    results = {name: r.pop("results") for name, r in rooms.items()}
    first = next(iter(rooms))
    out: dict = {"summary": rooms[first], "results": results[first], "rooms": rooms}  # "summary": the first room
    if server:
        loads = server.loads()
        out["server"] = {"rss_rest_mb": rest / 2**20, "rss_peak_mb": max(server.samples + [rest]) / 2**20,
                         "loads": loads, "pair_reloaded": any(n > 1 for n in loads.values()),
                         "tracebacks": server.tracebacks(), "log": server.log.name}
    if "alone" in rooms and "with adversaries" in rooms:
        a, b = rooms["alone"]["total_p95_all"], rooms["with adversaries"]["total_p95_all"]
        out["p95_ratio"] = b / a if a and b else None
    print(json.dumps({k: v for k, v in out.items() if k != "results"}, indent=2))
    for name, summary in rooms.items():
        print(f"-- {name}:")
        print(report(summary))
    if "p95_ratio" in out:
        print(f"honest p95 total with adversaries / alone: {out['p95_ratio'] or float('nan'):.2f}× (issue 33: ≤ 1.5×)")
    if server:
        sv = out["server"]
        print(f"server RSS at rest {sv['rss_rest_mb']:.0f} MB, peak {sv['rss_peak_mb']:.0f} MB; loads {sv['loads']} "
              f"(reloaded: {sv['pair_reloaded']}); {sv['tracebacks']} traceback(s) in {sv['log']}")
    if args.json:
        args.json.write_text(json.dumps({**out, "results_by_room": results}, indent=2))
    clean = all(s["clean"] for s in rooms.values())  # served, or told when to retry
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
