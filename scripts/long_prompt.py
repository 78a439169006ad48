"""A long prompt against a running server: is every run bounded and cancellable?

    python scripts/long_prompt.py [--tokens 2000] [--job-seconds 20] [--preset PRESET]

Starts the app (default settings but SPECVIZ_JOB_SECONDS, the default pair preloaded) and measures:

1. **Bounded**: a prompt of ``--tokens`` tokens with 4 new tokens through `/trace`: the seconds until the
   server answers, and the stop reason the recording gives (``time_limit`` when the budget ran out; the
   recording is partial, with the rounds it finished).
2. **Cancelled by a disconnect**: the same prompt started with the page's own Run event from a new session; the
   client closes its stream after ``--hold`` seconds, and a short `/trace` run is asked for at once: the seconds
   it waited for the models (its answer's time less its own run's) is how long the abandoned run went on.
(The memory admission, a load refused when the memory available cannot hold it, is tested on its own:
tests/test_sharing.py.)

Prints a JSON report (the CPU named) and writes it with ``--out``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from page_events import Page, new_session  # noqa: E402
from soak import Server, _cpu  # noqa: E402

def long_prompt(tokens: int) -> str:
    """About ``tokens`` tokens of code (Qwen's tokenizer: ~4 characters a token here), then a question."""
    # Numbers: Qwen's tokenizer reads each digit as a token, so ~2,000 tokens fit the page's 8,000 characters.
    n = max(1, int(tokens / 5.0))  # "417, " is about 5 tokens
    body = "readings = [" + ", ".join(str(100 + (37 * i) % 900) for i in range(n)) + "]\n"
    return body + "What is the largest reading? Answer in one sentence."


def _open_stream(url: str, path: str) -> http.client.HTTPConnection:
    """A GET whose response is read in the background (a browser's open stream)."""
    host, port = urllib.parse.urlsplit(url).hostname, urllib.parse.urlsplit(url).port
    conn = http.client.HTTPConnection(host, port, timeout=600)
    conn.request("GET", path)
    return conn


def _drain(conn: http.client.HTTPConnection) -> None:
    try:
        resp = conn.getresponse()
        while resp.read(256):
            pass
    except (OSError, AttributeError, ValueError, http.client.HTTPException):  # hung up: the visitor went away
        pass


def _hang_up(conn: http.client.HTTPConnection) -> None:
    """Close the connection now, as a closed browser tab does (no draining of the stream)."""
    try:
        conn.sock.shutdown(socket.SHUT_RDWR)
    except (OSError, AttributeError):
        pass
    conn.close()


def trace(url: str, prompt: str, preset: str, max_new: int) -> tuple[float, dict | None, str | None]:
    t0 = time.perf_counter()
    r = httpx.post(url + "gradio_api/call/trace", json={"data": [prompt, preset, 4, 0.0, 0.0, 1.0, max_new]},
                   timeout=60)
    event = r.json()["event_id"]
    last, data = None, None
    with httpx.stream("GET", url + f"gradio_api/call/trace/{event}", timeout=900) as s:
        for line in s.iter_lines():
            if line.startswith("event:"):
                last = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and last in ("complete", "error"):
                data = line[5:].strip()
                break
    took = time.perf_counter() - t0
    if last != "complete":
        return took, None, data
    return took, json.loads(data)[0], None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--job-seconds", type=float, default=20.0)
    ap.add_argument("--hold", type=float, default=4.0, help="seconds before the page's client goes away")
    ap.add_argument("--preset", default="", help="the pair ('' = the server's default)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    work = Path("/tmp") / f"specviz-long-{int(time.time())}"
    work.mkdir(parents=True, exist_ok=True)
    env = {"SPECVIZ_JOB_SECONDS": f"{args.job_seconds:g}", "SPECVIZ_REPLAY": "0"}
    server = Server(env, work / "server.log", work / "stats.jsonl")
    report: dict = {"cpu": _cpu(), "job_seconds": args.job_seconds, "prompt_tokens_asked": args.tokens}
    try:
        t0 = time.perf_counter()  # the default pair: loaded by a first short run (not timed below)
        took, rec, err = trace(server.url, "def f(x):", args.preset, 1)
        report["first_short_run_s"] = round(time.perf_counter() - t0, 1)
        if rec is None:
            raise SystemExit(f"the first run failed: {err}")
        prompt = long_prompt(args.tokens)
        took, rec, err = trace(server.url, prompt, args.preset, 4)
        spec = (rec or {}).get("speculative") or {}
        report["bounded"] = {"answered_after_s": round(took, 1), "error": err,
                             "prompt_tokens": spec.get("prompt_tokens"), "stop_reason": spec.get("stop_reason"),
                             "rounds": len(spec.get("rounds", [])),
                             "standard_stop_reason": ((rec or {}).get("standard") or {}).get("stop_reason")}
        print(json.dumps(report["bounded"]), flush=True)

        # 2. the page's Run from a session whose client goes away
        page = Page(server.url)
        run = page.event("click", elem_id="sv-run")
        session = new_session()
        data = page.defaults(run, **{"sv-prompt": prompt, "sv-max-new": 4})
        body = json.dumps({"data": data, "fn_index": run["id"], "session_hash": session, "event_data": None,
                           "trigger_id": run["targets"][0][0]}).encode()
        httpx.post(page.url + "gradio_api/queue/join", content=body, headers={"Content-Type": "application/json"},
                   timeout=60)
        stream = _open_stream(page.url, f"/gradio_api/queue/data?session_hash={session}")
        # A browser's page also holds Gradio's heartbeat open; its end is how the server knows the page closed.
        beat = _open_stream(page.url, f"/gradio_api/heartbeat/{session}")
        deadline = time.perf_counter() + args.hold
        for conn in (stream, beat):
            threading.Thread(target=_drain, args=(conn,), daemon=True).start()
        time.sleep(max(0.0, deadline - time.perf_counter()))
        gone = time.perf_counter()
        for conn in (stream, beat):  # the visitor closes the page: its event stream and its heartbeat end at once
            _hang_up(conn)
        report["disconnected_at"] = time.strftime("%H:%M:%S")
        took, rec, err = trace(server.url, "def g(y):", args.preset, 1)
        own = ((rec or {}).get("speculative") or {}).get("t_total", 0.0) + \
            (((rec or {}).get("standard") or {}).get("t_total", 0.0))
        report["disconnect"] = {"held_s": args.hold, "next_run_answered_after_s": round(time.perf_counter() - gone, 1),
                                "next_run_own_s": round(own, 2), "error": err,
                                "waited_for_the_abandoned_run_s": round(took - own, 1),
                                "without_a_cancel_it_would_wait_s": round(max(0.0, args.job_seconds - args.hold), 1)}
        print(json.dumps(report["disconnect"]), flush=True)

        # 3. the chunks' time here: a prompt past one chunk, one new token (the target's chunks before its first
        # pass, core.kv.feed_prompt; sized by time, so "one_chunk_s" is their mean over two)
        two = long_prompt(270)
        took, rec, err = trace(server.url, two, args.preset, 1)
        spec = (rec or {}).get("speculative") or {}
        report["chunk"] = {"prompt_tokens": spec.get("prompt_tokens"), "target_chunks_s": spec.get("target_prefill"),
                           "one_chunk_s": round((spec.get("target_prefill") or 0.0) / 2, 2),
                           "draft_prompt_s": spec.get("draft_prefill"), "error": err}
        print(json.dumps(report["chunk"]), flush=True)
        log = (work / "server.log").read_text(errors="replace")
        report["tracebacks"] = log.count("Traceback")
    finally:
        server.stop()
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
