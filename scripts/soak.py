"""Soak a specviz server as a public Space meets it: thousands of ordinary visitors, through the page's own events.

    python scripts/soak.py --visits 5000 --api 1000 --uploads 200 --downloads 100

Starts one server (default settings, on a free loopback port, `--env NAME=VALUE` to change one) through
scripts/soak_server.py, which also writes the server's own bounded state once a second: the store's entries and
bytes, Gradio's sessions, the run cancel flags.  Then, from `--clients` threads at once, each visitor a new
session as a browser tab is:

- plain visits (the page's start event), deep links (`?recording=…&round=…`, `?example=…`, presenter mode, and
  names that do not exist), example recordings picked from the dropdown;
- uploads of a shipped recording, each followed by "Download as a page" (`--downloads` of them) from that session;
- `/trace` API calls (`--preset`, the tiny pair by default so the soak measures the server, not the model: a few
  distinct prompts, the rest identical, answered from the replay cache).

It reports failed events, tracebacks in the server's log, RSS after the first 500 visits and at the end, the peak
sizes of the store and of Gradio's session data, and whether a new visitor's page after the soak is the first
visitor's (its outputs, file names aside).  Exit status 1 when any check fails.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from page_events import Page, new_session, text_of  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.server import free_port, wait_for_page  # noqa: E402

RECORDINGS = sorted((ROOT / "assets" / "traces").glob("*.json"))
LINKS = [{}, {"recording": "2-chat-greedy", "round": "3"}, {"example": "2"}, {"example": "3", "present": "1"},
         {"recording": "no-such-recording"}, {"round": "999999"}, {"recording": "1-code-greedy", "step": "2"}]


class Server:
    def __init__(self, env: dict[str, str], log: Path, stats: Path):
        self.port, self.log_path, self.stats_path = free_port(), log, stats
        full = {**os.environ, "PORT": str(self.port), "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_ANALYTICS_ENABLED":
                "False", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "SPECVIZ_SOAK_STATS": str(stats), **env}
        with open(log, "w") as f:
            self.proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "soak_server.py")], cwd=ROOT,
                                         env=full, stdout=f, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}/"
        try:
            wait_for_page(self.proc, self.url, 600, log)
        except RuntimeError as exc:  # (a script's end: the message, not a traceback)
            raise SystemExit(str(exc)) from None

    def rss(self) -> int:
        return psutil.Process(self.proc.pid).memory_info().rss

    def stats(self) -> list[dict]:
        try:
            return [json.loads(line) for line in self.stats_path.read_text().splitlines() if line.strip()]
        except (OSError, ValueError):
            return []

    def tracebacks(self) -> int:
        return self.log_path.read_text(errors="replace").count("Traceback")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def page_view(output: list | None) -> str:
    """A page's outputs, comparable across sessions: file names and upload paths aside."""
    text = text_of(output)
    text = re.sub(r'"(path|url|orig_name)": "[^"]*"', '"\\1": "…"', text)
    return re.sub(r"specviz-[0-9a-f-]+\.json", "specviz-….json", text)


def trace_call(url: str, preset: str, prompt: str) -> dict:
    r = httpx.post(url + "gradio_api/call/trace", json={"data": [prompt, preset, 3, 0.0, 0.0, 1.0, 8]}, timeout=60)
    if r.status_code != 200:
        return {"ok": False, "error": r.text[:200]}
    event = r.json()["event_id"]
    last = None
    with httpx.stream("GET", url + f"gradio_api/call/trace/{event}", timeout=600) as s:
        for line in s.iter_lines():
            if line.startswith("event:"):
                last = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and last in ("complete", "error"):
                return {"ok": last == "complete", "error": None if last == "complete" else line[5:200]}
    return {"ok": False, "error": "the stream ended without a result"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--visits", type=int, default=5000, help="page visits: plain, deep links and example picks")
    ap.add_argument("--api", type=int, default=1000, help="/trace calls")
    ap.add_argument("--uploads", type=int, default=200, help="recordings uploaded, each from a new session")
    ap.add_argument("--downloads", type=int, default=100, help="'Download as a page' after an upload")
    ap.add_argument("--clients", type=int, default=8, help="visitors at once")
    ap.add_argument("--preset", default="tiny", help="the /trace calls' model pair")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server")
    ap.add_argument("--out", type=Path, default=None, help="write the report as JSON here")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    env = dict(e.split("=", 1) for e in args.env)
    env.setdefault("SPECVIZ_PRELOAD", "0")  # the page's events need no model; /trace loads its pair on demand
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"specviz-soak-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    server = Server(env, work / "server.log", work / "stats.jsonl")
    t0 = time.time()
    failures: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    lock = threading.Lock()

    def note(kind: str, r: dict) -> None:
        with lock:
            counts[kind] = counts.get(kind, 0) + 1
            if not r.get("ok"):
                failures.setdefault(kind, []).append(str(r.get("error"))[:200])

    try:
        page = Page(server.url)
        start = page.start_event()
        pick = page.event("change", elem_id="sv-recordings")
        upload = page.event("upload", elem_id="sv-upload")
        download = page.event("click", elem_id="sv-export-page")
        first = page.fire(start, [], new_session())
        assert first["ok"], first["error"]
        first_view = page_view(first["output"])

        def visit(k: int) -> None:
            s = new_session()
            kind = rng.choice(["plain", "plain", "link", "pick"])
            if kind == "pick":
                r = page.fire(pick, [rng.choice(RECORDINGS).name], s)
            else:
                r = page.fire(start, [], s, query=LINKS[1 + k % (len(LINKS) - 1)] if kind == "link" else None)
                if r["ok"] and "sv-status-error" in text_of(r["output"]):
                    r = {"ok": False, "error": "the page opened with an error"}
            note(f"visit:{kind}", r)

        def uploader(k: int) -> None:
            s = new_session()
            r = page.fire(upload, [page.upload(rng.choice(RECORDINGS))], s)
            note("upload", r)
            if r["ok"] and k < args.downloads:
                note("download", page.fire(download, [None], s))

        prompts = [f"def f{i}(x):" for i in range(4)]

        def api(k: int) -> None:
            note("api", trace_call(server.url, args.preset, prompts[k % len(prompts)]))

        jobs = [("visit", k) for k in range(args.visits)] + [("upload", k) for k in range(args.uploads)] + \
               [("api", k) for k in range(args.api)]
        rng.shuffle(jobs)  # visitors of every kind mixed from the start, as on a public page
        early, rest = jobs[:500], jobs[500:]
        run = {"visit": visit, "upload": uploader, "api": api}
        rss_500 = None
        with cf.ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(lambda j: run[j[0]](j[1]), early))
            time.sleep(2)
            rss_500 = server.rss()
            print(f"after the first 500 events: RSS {rss_500 / 2**20:.0f} MiB", flush=True)
            done = 0
            for _ in pool.map(lambda j: run[j[0]](j[1]), rest):
                done += 1
                if done % 500 == 0:
                    st = (server.stats() or [{}])[-1]
                    print(f"  {done + 500} events, {time.time() - t0:.0f} s: RSS {server.rss() / 2**20:.0f} MiB, "
                          f"store {st.get('store')}, Gradio sessions {st.get('sessions')}", flush=True)
        time.sleep(2)
        last = page.fire(start, [], new_session())
        same = last["ok"] and page_view(last["output"]) == first_view
        rss_end = server.rss()
        stats = server.stats()
        tracebacks = server.tracebacks()
    finally:
        server.stop()
    # (a line written before Gradio made its session store has sessions None: not a size, left out)
    peak = {k: max(((s[k] if isinstance(s[k], dict) else {"n": s[k]}).get("entries" if k == "store" else "n", 0)
                    for s in stats if s.get(k) is not None), default=None) for k in ("store", "sessions")}
    peak_bytes = max((s["store"]["bytes"] for s in stats), default=None)
    report = {
        "cpu": _cpu(), "seconds": round(time.time() - t0, 1), "events": counts,
        "failed": {k: len(v) for k, v in failures.items()}, "failure_examples": {k: v[:3] for k, v in failures.items()},
        "tracebacks": tracebacks, "rss_after_500_mib": round(rss_500 / 2**20, 1),
        "rss_end_mib": round(rss_end / 2**20, 1), "rss_growth": round(rss_end / rss_500 - 1, 3),
        "store_peak_entries": peak["store"], "store_peak_mib": round((peak_bytes or 0) / 2**20, 2),
        "gradio_sessions_peak": peak["sessions"], "new_visitor_page_same_as_first": same,
    }
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    ok = not failures and tracebacks == 0 and same and rss_end <= 1.10 * rss_500
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def _cpu() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
        name = re.search(r"model name\s*:\s*(.*)", text).group(1).strip()
        flags = set(re.search(r"flags\s*:\s*(.*)", text).group(1).split())
        isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8") if f in flags]
        family = int(re.search(r"cpu family\s*:\s*(\d+)", text).group(1))
        model = int(re.search(r"^model\s*:\s*(\d+)", text, re.M).group(1))
        zen = {23: "Zen 1/2", 25: "Zen 3/4", 26: "Zen 5"}.get(family) if "AMD" in name else None
        return (f"{name} (cpu family {family}, model {model}{': ' + zen if zen else ''}), {os.cpu_count()} cores "
                f"({', '.join(isa)})")
    except (OSError, AttributeError):
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
