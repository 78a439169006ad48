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
same server, alone and then beside adversarial clients that loop over the issue's items 1-4: other
executions and hub presets and a refused value through the API, and, through the page's own events sent as
a browser sends them (scripts/page_events.py), a 7.5 MB recording uploaded from a new session, "Download as
a page" of it, and a γ sweep.  Attendees with a prompt of their own write a new one each try (the same one
again would be a replay).  `--keepers 3` page sessions load a recording before each room and must still have
it at the end.  It reports the honest attendees' p95 with and without the adversaries.  `--launch` starts
the app itself (on a free port, `--env NAME=VALUE` for its settings), waits until the default pair is loaded
and the server idle (a warm start packs its weights in the background), and reports its RSS at rest, at
peak while loading and in each room, and whether any pair was loaded more than once (from the server's
log).  A tiny smoke run:

    python scripts/crowd.py --launch --preset tiny --attendees 2 --seconds 20 --compare --adversaries 1
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from app import EXAMPLES as PAGE_EXAMPLES, example_settings  # noqa: E402
from tests.server import free_port, wait_for_page  # noqa: E402

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
    rec = {"kind": kind, "prompt": prompt[:60], "at": time.time()}
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


# What an adversary loops over: issue 33's items 1-4 and refused values.  Through the public API: another
# execution of the default pair, the hub presets (a download on a server that allows them), a value the
# server must refuse.  Through the page's own events, sent as a browser sends them (scripts/page_events.py):
# a big recording uploaded from a new session (item 2: it used to empty other sessions' store), "Download
# as a page" of it (item 3), and a γ sweep on the default form (item 4).  `--long-runs` adds a 256-token
# unique run: an ordinary visitor may ask for one, so it is not an attack the issue names.
ADVERSARY = [
    ({"target_exec": "int8"}, "other execution"),
    ({"target_exec": "bf16"}, "other execution"),
    ({"preset": "qwen-coder-7b"}, "hub preset"),
    ({"preset": "pythia"}, "hub preset"),
    ({"temperature": 1e-40}, "refused value"),
    ("upload", "big upload from a new session"),
    ("export", "download a big recording as a page"),
    ("sweep", "γ sweep through the page's event"),
]
LONG_RUN = ({"max_new_tokens": 256}, "long unique run")


def big_recording(path: Path, target_bytes: int) -> int:
    """A shipped recording with its rounds repeated until the file is about target_bytes (numbered as a real
    run would be: the loader checks the order)."""
    doc = json.loads((ROOT / "assets" / "traces" / "1-code-greedy.json").read_text())
    rounds, per_round = doc["speculative"]["rounds"], len(json.dumps(doc["speculative"]["rounds"]))
    copies = [dict(r) for r in rounds * max(1, int(target_bytes / per_round))]
    n = 0
    for k, r in enumerate(copies):
        r["index"], r["n_before"] = k, n
        n += len(r["emitted"])
    doc["speculative"]["rounds"] = copies
    text = json.dumps(doc)
    path.write_text(text)
    return len(text)


def page_attack(page, what: str, big: Path, preset: str | None) -> str:
    """One of the page-event attacks, from a new session; its outcome in a few words."""
    from page_events import new_session, text_of

    session = new_session()
    if what in ("upload", "export"):
        r = page.fire(page.event("upload", elem_id="sv-upload"), [page.upload(big)], session)
        if not r["ok"] or what == "upload":
            return "uploaded" if r["ok"] else f"upload: {r['error']}"
        r = page.fire(page.event("click", elem_id="sv-export-page"), [None], session)
        out = text_of(r["output"])
        return "exported" if r["ok"] and ".html" in out else f"export: {r['error'] or re.sub(r'<[^>]+>', '', out)[:100]}"
    dep = page.event("click", label="Run γ sweep")
    over = {"sv-preset": preset} if preset else {}
    r = page.fire(dep, page.defaults(dep, **over), session)
    return "sweep done" if r["ok"] else f"sweep: {r['error']}"


def _attack(step: tuple) -> str:
    """A step's short name for --attacks: exec, preset, refused, upload, export, sweep, long."""
    extra, kind = step
    if isinstance(extra, str):
        return extra
    return {"other execution": "exec", "hub preset": "preset", "refused value": "refused",
            "long unique run": "long"}[kind]


def adversary(url: str, stop: threading.Event, preset: str | None, out: list, lock: threading.Lock, k: int,
              big: Path, long_runs: bool = False, attacks: set[str] | None = None) -> None:
    from gradio_client import Client

    from page_events import Page

    client = Client(url, verbose=False)
    page = Page(url)
    steps = [a for a in ADVERSARY + ([LONG_RUN] if long_runs else []) if not attacks or _attack(a) in attacks]
    n = k * 3  # the adversaries start at different steps
    while not stop.is_set():
        extra, kind = steps[n % len(steps)]
        t0 = time.perf_counter()
        try:
            if isinstance(extra, str):
                outcome = page_attack(page, extra, big, preset)
            else:
                settings = {"preset": preset, **extra} if preset and "preset" not in extra else dict(extra)
                prompt = f"Adversary {k} asks for the {kind} (try {n}): write a long essay about queues."
                client.predict(prompt, api_name="/trace", **settings)
                outcome = "served"
        except Exception as exc:  # refusals are what it should get
            outcome = " ".join(str(exc).split())[:120]
        with lock:
            out.append({"kind": kind, "outcome": outcome, "seconds": time.perf_counter() - t0})
        n += 1


KEEP = "2-chat-greedy.json"  # what a keeper session loads (a shipped recording, many rounds)


def keeper_load(url: str) -> str | None:
    """An honest page session that loads a recording and then only reads it: its session id, or None."""
    from page_events import Page, new_session

    page, session = Page(url), new_session()
    r = page.fire(page.event("upload", elem_id="sv-upload"), [page.upload(ROOT / "assets" / "traces" / KEEP)], session)
    return session if r["ok"] else None


def keeper_still_has_it(url: str, session: str) -> bool:
    """Next ▶ from round 1 shows round 2 while the session's recording is there; round 1 once it is gone."""
    from page_events import Page

    page = Page(url)
    r = page.fire(page.event("click", elem_id="sv-next"), [None, 1], session)
    return bool(r["ok"] and r["output"] and r["output"][0] == 2)


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
        self.launched = time.monotonic()
        threading.Thread(target=self._sample, daemon=True).start()  # from the start: the peak is while it loads
        self.up_s = self.ready_s = self.settled_s = None
        deadline = time.monotonic() + timeout
        wait_for_page(self.proc, self.url, timeout, self.log.name)
        self.up_s = time.monotonic() - self.launched
        if full.get("SPECVIZ_PRELOAD", "1") != "0":  # "at rest" is with the default pair loaded, not before
            while time.monotonic() < deadline and self.proc.poll() is None:
                text = Path(self.log.name).read_text(errors="replace")
                if "default pair ready" in text or "could not preload" in text:
                    self.ready_s = time.monotonic() - self.launched
                    break
                time.sleep(0.5)
            self.settled_s = self._settle(deadline)

    def cpu_s(self) -> float:
        """CPU seconds the server has used so far (user + system)."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return 0.0

    def _settle(self, deadline: float) -> float | None:
        """After the default pair is ready, wait until the server is idle: a warm start serves at once and
        finishes fbgemm's packing in the background (specviz.models.warm, "weights prepared"), and a room
        measured meanwhile would time the slower products and the packing beside it.  Idle: "weights
        prepared" (or its failure) is in the log, or under 0.1 core used over 5 s.  Seconds after launch."""
        last = self.cpu_s()
        while time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(5.0)
            text = Path(self.log.name).read_text(errors="replace")
            used, last = self.cpu_s() - last, self.cpu_s()
            if "weights prepared" in text or "Preparing the fast kernels failed" in text or used < 0.5:
                time.sleep(3.0)  # let the loader's transient buffers go
                return time.monotonic() - self.launched
        return None

    def rss(self) -> int:
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def _sample(self) -> None:
        while not self._stop.wait(0.25):
            self.samples.append((time.monotonic() - self.launched, self.rss()))

    def peak(self, start: float = 0.0, end: float = float("inf")) -> int:
        """The highest RSS sampled between `start` and `end` seconds after launch."""
        return max((r for t, r in list(self.samples) if start <= t <= end), default=0)

    def loads(self) -> dict[str, int]:
        """How often each pair was loaded, from the log ("Loaded A → B on … in N s"; the tiny pair, built in
        process, says nothing of the kind and is not counted)."""
        text = Path(self.log.name).read_text(errors="replace")
        found: dict[str, int] = {}
        for m in re.finditer(r"Loaded (.+?) on .+? in [\d.]+ s(?:.*?the target runs as (\S+))?", text):
            key = m.group(1) + (f" ({m.group(2).rstrip(';,')})" if m.group(2) else "")  # bf16 beside int8: two pairs
            found[key] = found.get(key, 0) + 1
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


def room(args: argparse.Namespace, url: str, plan: list, rng: random.Random, adversaries: int, big: Path) -> dict:
    """One room: every attendee runs its plan (again and again until --seconds have passed), beside
    `adversaries` adversarial clients looping until the attendees are done."""
    results: list[dict] = []
    bad: list[dict] = []
    lock = threading.Lock()
    t0 = time.perf_counter()
    until = time.monotonic() + (args.seconds or 0)

    def honest(k: str, p: str, s: dict, delay: float) -> None:
        # Someone writing prompts writes a new one each time (the same one again, or the one from the room
        # before, would be a replay of its recording).
        def prompt(tries: int) -> str:
            return p if k == "example" else f"{p} Room {'with adversaries' if adversaries else 'alone'}, try {tries}."
        tries = 0
        attendee(url, prompt(tries), s, k, delay, results, lock, args.timeout)
        while time.monotonic() < until:
            tries += 1
            attendee(url, prompt(tries), s, k, 0.0, results, lock, args.timeout)

    threads = [threading.Thread(target=honest, args=(k, p, s, rng.uniform(0, args.spread))) for k, (p, s) in plan]
    keepers = [keeper_load(url) for _ in range(args.keepers)]
    stop_adv = threading.Event()
    attacks = set(args.attacks.split(",")) if args.attacks else None
    advs = [threading.Thread(target=adversary, args=(url, stop_adv, args.preset, bad, lock, j, big, args.long_runs,
                                                     attacks), daemon=True) for j in range(adversaries)]
    for t in advs + threads:
        t.start()
    for t in threads:
        t.join()
    honest_s = time.perf_counter() - t0
    stop_adv.set()  # the adversaries stop after the request in flight; what they started may run on (a sweep
    for t in advs:  # holds its budget, SPECVIZ_SWEEP_SECONDS): they are not waited for long
        t.join(30)
    kept = [bool(s_) and keeper_still_has_it(url, s_) for s_ in keepers]
    outcomes: dict[str, dict[str, int]] = {}
    for b in bad:
        o = re.sub(r"\d+", "N", b["outcome"])[:90]
        outcomes.setdefault(b["kind"], {})[o] = outcomes.setdefault(b["kind"], {}).get(o, 0) + 1
    summary = {**summarise(results), "wall_s": time.perf_counter() - t0, "honest_s": honest_s,
               "load_avg": os.getloadavg(),
               "adversaries": adversaries, "adversary_requests": len(bad), "adversary_outcomes": outcomes,
               "keepers": len(keepers), "keepers_loaded": sum(bool(s_) for s_ in keepers),
               "keepers_kept": sum(kept)}
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
    ap.add_argument("--keepers", type=int, default=3,
                    help="honest page sessions that load a recording first and must still have it at the end")
    ap.add_argument("--long-runs", action="store_true", help="the adversaries also ask for 256-token unique runs")
    ap.add_argument("--big-mb", type=float, default=7.5, help="size of the adversaries' uploaded recording")
    ap.add_argument("--attacks", default=None,
                    help="only these adversary steps, comma-separated: exec,preset,refused,upload,export,sweep,long")
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
    spans = {}
    big = Path(tempfile.mkdtemp(prefix="crowd-")) / "big-recording.json"
    big_bytes = big_recording(big, int(args.big_mb * 2**20)) if args.adversaries else 0
    try:
        rest = server.rss() if server else None
        names = (["alone"] if args.compare or not args.adversaries else []) + (["with adversaries"] if args.adversaries else [])
        for name in names:
            t = time.monotonic() - server.launched if server else 0.0
            rooms[name] = room(args, args.url, plan, random.Random(args.seed), 0 if name == "alone" else args.adversaries,
                               big)
            spans[name] = (t, time.monotonic() - server.launched if server else 0.0)
        after = server.rss() if server else None
    finally:
        if server:
            server.stop()
    results = {name: r.pop("results") for name, r in rooms.items()}
    first = next(iter(rooms))
    out: dict = {"summary": rooms[first], "results": results[first], "rooms": rooms}  # "summary": the first room
    from specviz.hardware.machine import this_machine

    out["machine"], out["cores"] = this_machine().describe(), os.cpu_count()
    out["settings"] = {k: v for k, v in vars(args).items() if k in ("attendees", "unique", "seconds", "adversaries",
                                                                   "keepers", "long_runs", "big_mb", "preset", "env")}
    if server:
        loads = server.loads()
        ready = server.ready_s or server.up_s
        out["server"] = {"up_s": server.up_s, "ready_s": server.ready_s, "settled_s": server.settled_s,
                         "rss_rest_mb": rest / 2**20, "rss_after_rooms_mb": after / 2**20,
                         "rss_peak_loading_mb": server.peak(0, (server.settled_s or ready) + 1) / 2**20,
                         "rss_peak_mb": max(server.peak(), rest) / 2**20,
                         "rss_peak_by_room_mb": {n: server.peak(*sp) / 2**20 for n, sp in spans.items()},
                         "loads": loads, "pair_reloaded": any(n > 1 for n in loads.values()),
                         "tracebacks": server.tracebacks(), "log": server.log.name}
    out["big_recording_bytes"] = big_bytes
    if "alone" in rooms and "with adversaries" in rooms:
        a, b = rooms["alone"]["total_p95_all"], rooms["with adversaries"]["total_p95_all"]
        out["p95_ratio"] = b / a if a and b else None
        for kind in ("example", "unique"):
            a, b = rooms["alone"][kind]["total_p95"], rooms["with adversaries"][kind]["total_p95"]
            out[f"p95_ratio_{kind}"] = b / a if a and b else None
    print(json.dumps({k: v for k, v in out.items() if k != "results"}, indent=2))
    for name, summary in rooms.items():
        print(f"-- {name}:")
        print(report(summary))
        print(f"  keepers: {summary['keepers_kept']} of {summary['keepers_loaded']} still had their recording")
    if "p95_ratio" in out:
        print(f"honest p95 total with adversaries / alone: {out['p95_ratio'] or float('nan'):.2f}× (issue 33: ≤ 1.5×)")
    if server:
        sv = out["server"]
        print(f"server RSS at rest {sv['rss_rest_mb']:.0f} MB, peak while loading {sv['rss_peak_loading_mb']:.0f} MB, "
              f"peak {sv['rss_peak_mb']:.0f} MB; loads {sv['loads']} "
              f"(reloaded: {sv['pair_reloaded']}); {sv['tracebacks']} traceback(s) in {sv['log']}")
    if args.json:
        args.json.write_text(json.dumps({**out, "results_by_room": results}, indent=2))
    clean = all(s["clean"] and s["keepers_kept"] == s["keepers_loaded"] == s["keepers"]
                for s in rooms.values())  # served, or told when to retry; no keeper lost its recording
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
