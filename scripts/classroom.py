"""Load a class (issue 58) through the page's own events: one teacher, N attendees following and racing.

    python scripts/classroom.py --attendees 60

Starts one server (scripts/soak_server.py, the tiny pair offered; or `--url` to use a running one), then:

1. the teacher's page opens (the page's start event), starts a class and sets the experiment "Everyone picks γ";
2. N attendees' pages open and join with the code, each with a browser id of its own (what a browser keeps in its
   localStorage: ui.class_client), and `--tabs` of them open a second tab with the same id (one seat a browser:
   the teacher's page must count N attendees, issue 66); each page polls its room once a second (the page's
   gr.Timer event, with the values a browser sends, the step it shows included) and, as a browser does, fires the
   step's change events when the poll moves its step;
3. the teacher steps through the recording (`--steps` Next presses, `--step-every` seconds apart, each followed by
   the step's change events); the delay from the teacher's page showing a round to each attendee's page showing it
   (its poll returned the step and every change event of the step, the round's views, answered) is measured.
   An attendee whose poll jumps past a round (two Next presses between its polls) skipped it: counted apart,
   neither timed nor missed; a round an attendee never reached is a miss;
4. every attendee runs one race on the tiny pair (γ = 5 for most, a random γ for `--unique` of them: identical
   settings are replayed from the cache) and posts it; told the models are busy, it presses Run again after the
   wait the page says (`--retries` presses at most, as a person would); the teacher's page refreshes its plot
   (its own timer event, every 2 s) and the time from each race's end to its point counted there is measured.

Reports: p50/p95/max of both delays, failed events, tracebacks in the server log, RSS before and after, the CPU,
the attendees the teacher's page counts.  Exit status 1 when a target is missed (p95 follow ≤ 2 s, no round missed, every point
within 5 s, 0 tracebacks, N attendees counted).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import random
import re
import secrets
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from page_events import Page, completed, new_session  # noqa: E402
from soak import Server, _cpu  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FOLLOW = "Follow the teacher"
# One pool of connections for every simulated page (a new client per event cost this script, which shares the
# server's cores, a TLS context and a connection each time; browsers run on the attendees' own machines).
CLIENT = httpx.Client(timeout=60, limits=httpx.Limits(max_connections=256, max_keepalive_connections=256))


def server_cpu(server: Server) -> float:
    """CPU seconds the server process has used (user and system)."""
    t = psutil.Process(server.proc.pid).cpu_times()
    return t.user + t.system


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


class Session:
    """One browser tab: its events go through one event stream (Gradio's queue/data, per session), matched by
    event id, so a poll, a race and a step's change events may be pending at once, as in a browser."""

    def __init__(self, page: Page, name: str | None = None, browser: str | None = None):
        self.page, self.name = page, name or new_session()
        self.browser = browser or secrets.token_hex(12)  # the browser's id (its localStorage): one seat a browser
        self.lock = threading.Lock()
        self.waiting: dict[str, cf.Future] = {}
        self.early: dict[str, dict] = {}
        self.reader: threading.Thread | None = None
        self.known: dict[int, object] = {}  # components' values the page shows (those whose change matters here)

    def _read(self) -> None:
        url = self.page.url + f"gradio_api/queue/data?session_hash={self.name}"
        while True:
            try:
                with urllib.request.urlopen(url, timeout=600) as r:
                    for line in r:
                        if not line.startswith(b"data: "):
                            continue
                        msg = json.loads(line[6:])
                        if msg.get("msg") == "process_completed":
                            result = completed(msg)
                            with self.lock:
                                fut = self.waiting.pop(msg.get("event_id"), None)
                                if fut is None:  # completed before its join's answer was read
                                    self.early[msg.get("event_id")] = result
                            if fut is not None:
                                fut.set_result(result)
            except (OSError, ValueError) as exc:
                with self.lock:
                    pending, self.waiting = self.waiting, {}
                    self.reader = None
                for fut in pending.values():
                    fut.set_result({"ok": False, "output": None, "error": f"stream: {exc}", "http": 200})
                return
            with self.lock:
                if not self.waiting:
                    self.reader = None
                    return

    def fire(self, dep: dict, data: list, timeout: float = 600.0) -> dict:
        body = json.dumps({"data": data, "fn_index": dep["id"], "session_hash": self.name, "event_data": None,
                           "trigger_id": dep["targets"][0][0]}, allow_nan=True).encode()
        fut: cf.Future = cf.Future()
        if dep.get("queue") is False:  # outside the queue: one request, its answer the result (as a browser does)
            try:
                r = CLIENT.post(self.page.url + "gradio_api/run/predict", content=body,
                                headers={"Content-Type": "application/json"}, timeout=timeout)
            except httpx.HTTPError as exc:
                return {"ok": False, "output": None, "error": f"predict: {exc}", "http": 0}
            out = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
            return {"ok": r.status_code == 200, "output": out.get("data"), "error": out.get("error") or
                    (None if r.status_code == 200 else r.text[:300]), "http": r.status_code,
                    "changed": out.get("changed_state_ids") or []}
        try:
            join = CLIENT.post(self.page.url + "gradio_api/queue/join", content=body,
                               headers={"Content-Type": "application/json"}, timeout=60)
        except httpx.HTTPError as exc:
            return {"ok": False, "output": None, "error": f"join: {exc}", "http": 0}
        if join.status_code != 200:
            return {"ok": False, "output": None, "error": join.text[:300], "http": join.status_code}
        event_id = join.json().get("event_id")
        with self.lock:
            if event_id in self.early:
                return self.early.pop(event_id)
            self.waiting[event_id] = fut
            if self.reader is None:
                self.reader = threading.Thread(target=self._read, daemon=True)
                self.reader.start()
        try:
            return fut.result(timeout=timeout)
        except cf.TimeoutError:
            return {"ok": False, "output": None, "error": "timed out", "http": 200}


class Class:
    def __init__(self, page: Page):
        self.page = page
        comps = page.components
        self.by_elem = {p["props"].get("elem_id"): cid for cid, p in comps.items() if p.get("props", {}).get("elem_id")}
        deps = page.cfg["dependencies"]
        self.step_id = self.by_elem["sv-step"]
        ticks = [d for d in deps if d.get("backend_fn", True) and any(t[1] == "tick" for t in d["targets"])]
        self.poll = max(ticks, key=lambda d: len(d["inputs"]))  # the attendee's: the page's follow, state, step
        self.refresh = min(ticks, key=lambda d: len(d["inputs"]))
        # The poll's outputs: a new value there fires their change events in the page (the syncs).
        self.value_changes: dict[int, list[dict]] = {
            cid: [d for d in deps if d.get("backend_fn", True) and [cid, "change"] in [list(t) for t in d["targets"]]]
            for cid in self.poll["outputs"] if comps.get(cid, {}).get("type") == "number"}
        self.state_changes: dict[int, list[dict]] = {}  # a State's id: its change events
        for d in deps:
            for cid, kind in (tuple(t) for t in d["targets"]):
                if kind == "change" and d.get("backend_fn", True) and comps.get(cid, {}).get("type") == "state":
                    self.state_changes.setdefault(cid, []).append(d)
        self.start_page = page.start_event()
        self.start = page.event("click", elem_id="sv-class-start")
        self.join = page.event("click", elem_id="sv-class-join")
        self.experiment = page.event("input", elem_id="sv-class-experiment")
        self.next = page.event("click", elem_id="sv-next")
        self.run = page.event("click", elem_id="sv-run")
        self.post = page.event("click", elem_id="sv-class-post")
        self.step_changes = [d for d in deps if d.get("backend_fn", True)
                             and any(t[0] == self.step_id and t[1] == "change" for t in d["targets"])]

    def data(self, dep: dict, values: dict[int, object]) -> list:
        """The event's inputs as a browser sends them: states as null, the given components' values, defaults."""
        out = []
        for cid in dep["inputs"]:
            props = self.page.components.get(cid, {}).get("props", {})
            out.append(values[cid] if cid in values else props.get("value"))
        return out

    def fire(self, dep: dict, session: Session, values: dict[int, object] | None = None) -> dict:
        return session.fire(dep, self.data(dep, values or {}))

    def output(self, dep: dict, result: dict, cid: int):
        """The value one output got (None: left alone)."""
        data = result.get("output") or []
        try:
            v = data[dep["outputs"].index(cid)]
        except (ValueError, IndexError):
            return None
        if isinstance(v, dict) and v.get("__type__") == "update":
            return v.get("value")
        return v

    def follow(self, dep: dict, result: dict, session: Session, values: dict[int, object],
               depth: int = 0) -> list[tuple[dict, dict]]:
        """What a browser does after an event: it fires the change events of the States the event changed (in
        turn, as their answers come); every (event, result), this one first."""
        done = [(dep, result)]
        if depth >= 3:
            return done
        fired = [d for sid in result.get("changed", []) for d in self.state_changes.get(sid, [])]
        for cid, value in zip(dep["outputs"], result.get("output") or []):
            if cid in self.value_changes and not (isinstance(value, dict) and value.get("__type__") == "update") \
                    and session.known.get(cid) != value:  # a component's new value: its change events
                session.known[cid] = value
                fired += self.value_changes[cid]
        for d in fired:
            done += self.follow(d, self.fire(d, session, values), session, values, depth + 1)
        return done

    def stepped(self, session: Session, step: int) -> list[dict]:
        """What a browser sends when its step slider changed: the step's change events, at once; their answers
        (the round's views), when all have come."""
        with cf.ThreadPoolExecutor(len(self.step_changes)) as pool:
            return list(pool.map(lambda dep: self.fire(dep, session, {self.step_id: step}), self.step_changes))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attendees", type=int, default=60)
    ap.add_argument("--steps", type=int, default=8, help="the teacher's Next presses")
    ap.add_argument("--step-every", type=float, default=3.0)
    ap.add_argument("--unique", type=int, default=6, help="attendees who race a γ of their own (the others γ = 5)")
    ap.add_argument("--race-window", type=float, default=30.0, help="attendees start their races within this many s")
    ap.add_argument("--max-new", type=int, default=16, help="tokens each race generates")
    ap.add_argument("--url", help="a running server (else one is started)")
    ap.add_argument("--out", type=Path, help="write the figures here as JSON")
    ap.add_argument("--follow-only", action="store_true", help="stop after the follow phase (no races)")
    ap.add_argument("--retries", type=int, default=4, help="Run presses per race when told the models are busy")
    ap.add_argument("--tabs", type=int, default=6, help="attendees who open a second tab (the same browser)")
    args = ap.parse_args()

    server = None
    log_dir = Path(tempfile.mkdtemp(prefix="specviz-classroom-"))
    if not args.url:
        server = Server({"SPECVIZ_SHOW_TINY": "1", "SPECVIZ_PRELOAD": "0"}, log_dir / "server.log",
                        log_dir / "stats.jsonl")
        url = server.url
    else:
        url = args.url
    failures: list[str] = []
    fail_lock = threading.Lock()

    def note(what: str, r: dict) -> dict:
        if not r.get("ok"):
            with fail_lock:
                failures.append(f"{what}: {str(r.get('error'))[:200]}")
        return r

    try:
        page = Page(url)
        cls = Class(page)
        from specviz.models import TINY_PRESET

        rss0 = server.rss() if server else None
        load0 = [round(x, 2) for x in os.getloadavg()]  # the machine's load (another job's would disturb the figures)
        teacher = Session(page)
        note("teacher page", cls.fire(cls.start_page, teacher))
        r = note("start a class", cls.fire(cls.start, teacher, {cls.step_id: 1}))
        m = re.search(r'data-code=\\?"(\w+)', json.dumps(r.get("output")))
        if not m:
            raise SystemExit(f"no class code in the start event's answer: {str(r)[:500]}")
        code = m.group(1)
        note("experiment", cls.fire(cls.experiment, teacher, {cls.by_elem["sv-class-experiment"]: "gamma"}))
        print(f"class {code} started; {args.attendees} attendees joining", flush=True)

        sessions = [Session(page) for _ in range(args.attendees)]
        tabs = [Session(page, browser=s.browser) for s in sessions[:max(0, args.tabs)]]  # follow only, no race
        shown = {s: 1 for s in sessions + tabs}  # the step each attendee's page shows
        following = {s: True for s in sessions + tabs}
        racing: set = set()
        polled_at: dict[tuple[Session, int], float] = {}  # the poll's answer carried the round
        seen_at: dict[tuple[Session, int], float] = {}  # the page shows the round: its change events all answered
        skipped: set[tuple[Session, int]] = set()
        stop = threading.Event()

        def render(s: Session, k: int) -> None:
            answers = [note("round view", r) for r in cls.stepped(s, k)]
            if all(r.get("ok") for r in answers):
                seen_at.setdefault((s, k), time.monotonic())

        def open_and_join(s: Session) -> None:
            note("attendee page", cls.fire(cls.start_page, s))
            note("join", cls.fire(cls.join, s, {cls.by_elem["sv-class-code-in"]: code,
                                                cls.by_elem["sv-class-client"]: json.dumps({"id": s.browser})}))

        with cf.ThreadPoolExecutor(16) as ex:
            list(ex.map(open_and_join, sessions + tabs))
        print(f"{len(sessions)} attendees joined ({len(tabs)} with a second tab); RSS {server.rss() / 2**20:.0f} MiB"
              if server else "joined", flush=True)

        def poller(s: str) -> None:
            follow_id = cls.by_elem["sv-class-follow"]
            while not stop.is_set():
                t0 = time.monotonic()
                if s in racing:  # its race's last frame sets the step and its slider: known when the race ends
                    stop.wait(0.2)
                    continue
                values = {follow_id: FOLLOW if following[s] else "Let me explore", cls.step_id: shown[s]}
                # the poll, then (when the page differs from the room's) the sync its State's change fires
                answers = cls.follow(cls.poll, note("poll", cls.fire(cls.poll, s, values)), s, values)
                for dep, r in answers[1:]:
                    note("sync", r)
                new = next((v for dep, r in answers if (v := cls.output(dep, r, cls.step_id)) is not None), None)
                if isinstance(new, dict):
                    new = new.get("value")
                if isinstance(new, (int, float)) and int(new) != shown[s]:
                    before, shown[s] = shown[s], int(new)
                    polled_at.setdefault((s, int(new)), time.monotonic())
                    skipped.update((s, k) for k in range(before + 1, int(new)))
                    # the browser's next tick does not wait for the round's views; the round is shown when they came
                    threading.Thread(target=render, args=(s, int(new)), daemon=True).start()
                if any(cls.output(dep, r, follow_id) == "Let me explore" for dep, r in answers):
                    following[s] = False
                stop.wait(max(0.0, 1.0 - (time.monotonic() - t0)))  # a gr.Timer(1.0): the next tick after this one

        cpu0 = (server_cpu(server) if server else 0.0, time.process_time(), time.monotonic())
        threads = [threading.Thread(target=poller, args=(s,), daemon=True) for s in sessions + tabs]
        for t in threads:
            t.start()
        time.sleep(3)

        # The teacher steps.
        step, shown_at = 1, {}
        for _ in range(args.steps):
            r = note("teacher next", cls.fire(cls.next, teacher, {cls.step_id: step}))
            new = cls.output(cls.next, r, cls.step_id)
            if isinstance(new, (int, float)):
                step = int(new)
            shown_at[step] = time.monotonic()  # the teacher's page shows it; its change events follow
            cls.stepped(teacher, step)
            time.sleep(args.step_every)
        time.sleep(3)
        pairs = [(s, k) for k in shown_at for s in sessions + tabs]
        delays = [seen_at[p] - shown_at[p[1]] for p in pairs if p in seen_at]
        poll_delays = [polled_at[p] - shown_at[p[1]] for p in pairs if p in polled_at]
        skips = sum(1 for p in pairs if p not in seen_at and p in skipped)
        missed = sum(1 for p in pairs if p not in seen_at and p not in skipped)
        pair_figures = {"follow_pairs": len(pairs), "follow_pairs_timed": len(delays), "follow_skipped": skips,
                        "follow_never_seen": missed, "follow_poll_p95_s": pct(poll_delays, .95)}
        cpu_s = {"server": round(server_cpu(server) - cpu0[0], 1) if server else None,
                 "load_script": round(time.process_time() - cpu0[1], 1), "wall": round(time.monotonic() - cpu0[2], 1)}
        print(f"follow to the rendered round: {len(delays)} of {len(pairs)} (attendee, round) pairs timed, "
              f"p50 {pct(delays, .5):.2f} s, p95 {pct(delays, .95):.2f} s, max {max(delays):.2f} s; {skips} skipped, "
              f"{missed} never seen; CPU s {cpu_s}", flush=True)
        if args.follow_only:
            stop.set()
            figures = {"cpu": _cpu(), "attendees": len(sessions), "steps": len(shown_at),
                       "follow_p50_s": pct(delays, .5), "follow_p95_s": pct(delays, .95), "follow_max_s": max(delays),
                       **pair_figures, "follow_cpu_s": cpu_s, "failed_events": len(failures),
                       "failures": failures[:10], "load_avg": [round(x, 2) for x in os.getloadavg()]}
            print(json.dumps(figures, indent=1))
            if args.out:
                args.out.write_text(json.dumps(figures, indent=1))
            return 0 if (figures["follow_p95_s"] or 99) <= 2.0 else 1

        # The experiment: every attendee races once and posts it.
        counts: list[tuple[float, int]] = []
        people: list[int] = []  # the attendees the teacher's page counts

        def teacher_refresh() -> None:
            while not stop.is_set():
                t0 = time.monotonic()
                r = note("teacher refresh", cls.fire(cls.refresh, teacher))
                html = json.dumps(r.get("output"))
                m = re.search(r'data-points=\\"(\d+)', html)
                if m:
                    counts.append((time.monotonic(), int(m.group(1))))
                m = re.search(r'data-people=\\"(\d+)', html)
                if m:
                    people.append(int(m.group(1)))
                stop.wait(max(0.0, 2.0 - (time.monotonic() - t0)))

        threading.Thread(target=teacher_refresh, daemon=True).start()
        unique = set(random.sample(sessions, min(args.unique, len(sessions))))
        ends: list[float] = []
        race_s: list[float] = []
        retried: list[int] = []  # the waits the page said, each time a race was told to retry
        posted = 0

        def race(s: str) -> None:
            nonlocal posted
            time.sleep(random.uniform(0, args.race_window))
            gamma = random.randint(1, 10) if s in unique else 5
            following[s] = False  # Run leaves the teacher's view (the page does so in the browser)
            racing.add(s)
            t0 = time.monotonic()
            settings = {cls.by_elem["sv-preset"]: TINY_PRESET, cls.by_elem["sv-gamma"]: gamma,
                        cls.by_elem["sv-max-new"]: args.max_new}
            for _ in range(args.retries):  # told the models are busy: Run again when the page says, as a person does
                r = cls.fire(cls.run, s, settings)
                wait = re.search(r"retry in about (\d+) s", str(r.get("error") or ""))
                if r.get("ok") or wait is None:
                    break
                with fail_lock:
                    retried.append(int(wait.group(1)))
                time.sleep(min(60, int(wait.group(1))))
            note("race", r)
            end = time.monotonic()
            race_s.append(end - t0)
            new = cls.output(cls.run, r, cls.step_id)  # the race's rounds: the page's step is the race's now
            if isinstance(new, dict):
                new = new.get("value")
            if isinstance(new, (int, float)):
                shown[s] = int(new)
            racing.discard(s)
            p = note("post", cls.fire(cls.post, s))
            if "Posted to the class" in json.dumps(p.get("output"), ensure_ascii=False):
                with fail_lock:
                    ends.append(end)
                    posted += 1
            else:
                with fail_lock:
                    failures.append(f"post refused: {json.dumps(p.get('output'), ensure_ascii=False)[:200]}")

        with cf.ThreadPoolExecutor(len(sessions)) as ex:
            list(ex.map(race, sessions))
        time.sleep(5)
        stop.set()
        ends.sort()
        visible = []
        for k, end in enumerate(ends, 1):
            at = next((t for t, n in counts if n >= k and t >= end), None)
            visible.append((at - end) if at is not None else float("inf"))
        rss1 = server.rss() if server else None
        tracebacks = server.tracebacks() if server else None
        figures = {
            "cpu": _cpu(), "attendees": len(sessions), "steps": len(shown_at),
            "follow_p50_s": pct(delays, .5), "follow_p95_s": pct(delays, .95), "follow_max_s": max(delays),
            **pair_figures, "races": len(race_s), "race_p50_s": pct(race_s, .5),
            "race_p95_s": pct(race_s, .95), "points_posted": posted,
            "races_told_to_retry": len(retried), "retry_waits_s": retried,
            "point_visible_p50_s": pct(visible, .5), "point_visible_p95_s": pct(visible, .95),
            "point_visible_max_s": max(visible) if visible else None,
            "points_on_teacher_page": counts[-1][1] if counts else 0,
            "attendees_on_teacher_page": people[-1] if people else None, "second_tabs": len(tabs),
            "failed_events": len(failures), "tracebacks": tracebacks,
            "rss_before_mib": round(rss0 / 2**20) if rss0 else None, "rss_after_mib": round(rss1 / 2**20) if rss1 else None,
            "follow_cpu_s": cpu_s, "load_avg_before": load0, "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        }
        kinds: dict[str, int] = {}
        for f in failures:
            kind = re.sub(r"\d+", "N", f)[:120]
            kinds[kind] = kinds.get(kind, 0) + 1
        figures["failures_by_kind"] = kinds
        print(json.dumps(figures, indent=1))
        for kind, n in sorted(kinds.items(), key=lambda kv: -kv[1])[:10]:
            print(f"  failed ×{n}:", kind)
        if args.out:
            args.out.write_text(json.dumps(figures, indent=1))
        ok = (figures["follow_p95_s"] or 99) <= 2.0 and all(v <= 5.0 for v in visible) and not tracebacks \
            and posted == len(sessions) and figures["attendees_on_teacher_page"] == len(sessions) and missed == 0
        print("PASS" if ok else "FAIL (targets: p95 follow to the rendered round ≤ 2 s, no round missed, every "
              "point within 5 s, 0 tracebacks, one attendee a browser)")
        return 0 if ok else 1
    finally:
        if server:
            server.stop()
            print(f"server log: {server.log_path}")


if __name__ == "__main__":
    sys.exit(main())
