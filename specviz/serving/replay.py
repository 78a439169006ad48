"""Finished runs served again: a bounded cache of recordings, replayed with their recorded timings.

A workshop room runs the same few examples with the same settings, and every live run of the
default pair costs ~20 s of CPU behind one model lock.  An identical request (same pair, prompt,
validated settings and whether the standard baseline was asked for) is therefore answered from
a recording of the run made the first time: its rounds come back at the times they were
recorded (sped up past `MAX_REPLAY_S`), marked as a replay of a run made at a given time on a
given machine.  A request identical to a run still in progress follows that run instead of
queueing a second one.  Replays never take the model lock.

Live runs go through `LiveGate`: the model lock, with a bounded number of waiters; past that, a
request is told at once how long to wait (`Busy`).  Nothing here imports Gradio.
"""

from __future__ import annotations

import copy
import datetime as _dt
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from ..core.settings import DecodeSettings
from ..models import PRESETS, ModelError, resolve_preset
from ..theory.timing import flagged
from ..trace import Trace, TraceError, load_recording, recording_to_json
from .envvars import env_int, env_number
from .service import CUSTOM_PRESET, MODEL_LOCK, default_preset, recording_execution, replay_execution

log = logging.getLogger("specviz.replay")


MAX_REPLAY_S = env_number("SPECVIZ_MAX_REPLAY_S", 60.0)  # a replay takes at most this long (sped up past it)
CACHE_ENTRIES = env_int("SPECVIZ_CACHE_ENTRIES", 64)
CACHE_BYTES = int(env_number("SPECVIZ_CACHE_MB", 32.0) * 2**20)  # JSON bytes of the cached recordings


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# ---- the key ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunKey:
    """What makes two requests the same run: the pair, the prompt as the models see it, the
    validated settings (seed, drafter and policy included), whether standard decoding runs too and
    how the target executes here, with the class of machine ("int8@no-native-bf16": see
    service.replay_execution; a recording says what it ran as, service.recording_execution)."""

    preset: str
    prompt: str
    settings: DecodeSettings
    standard: bool
    target_exec: str = "auto"


def run_key(preset: Any, prompt: str, settings: DecodeSettings, standard: bool = True,
            target_exec: str = "auto") -> RunKey | None:
    """The key of a validated request, or None for a run that is never served from the cache (a
    custom pair, an unknown preset: the live path reports the error)."""
    if preset is None or (isinstance(preset, str) and preset.strip().lower() in ("", "default")):
        preset = default_preset()
    if not isinstance(preset, str) or preset == CUSTOM_PRESET:
        return None
    try:
        name = resolve_preset(preset)
    except ModelError:
        return None
    return RunKey(name, prompt, settings, bool(standard), replay_execution(name, target_exec))


# ---- the cache --------------------------------------------------------------------------------


@dataclass(eq=False)
class Entry:
    """One run: finished (replayed), or still running (followed), with where and when it was made."""

    key: RunKey
    recorded_at: str | None  # ISO time the run started; None for a shipped recording (not known)
    machine: str = ""
    source: str = "live run"
    spec: Trace | None = None
    std: Trace | None = None
    done: bool = False
    failed: bool = False
    nbytes: int = 0
    version: int = 0  # bumped at every update of a running entry
    spec_done: bool = False  # a running entry's speculative run has ended (the race interleaves both)
    cond: threading.Condition = field(default_factory=threading.Condition, repr=False)

    def marker(self) -> dict[str, str | None]:
        """What the API result and the page say about a replay."""
        return {"recorded_at": self.recorded_at, "machine": self.machine, "source": self.source}


class Abandoned(RuntimeError):
    """The run a request was following stopped or failed; the request may run on its own."""


class RecordingCache:
    """Finished recordings by `RunKey`, least recently used first out, bounded by count and by
    JSON bytes; plus the runs in progress (not bounded here: `LiveGate` bounds them)."""

    def __init__(self, max_entries: int = CACHE_ENTRIES, max_bytes: int = CACHE_BYTES, enabled: bool = True):
        self.max_entries, self.max_bytes, self.enabled = max_entries, max_bytes, enabled
        self._lock = threading.Lock()
        self._done: OrderedDict[RunKey, Entry] = OrderedDict()
        self._running: dict[RunKey, Entry] = {}
        self.hits = self.follows = self.misses = 0

    def __len__(self) -> int:
        return len(self._done)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._done.values())

    def claim(self, key: RunKey | None, machine: str = "") -> tuple[str, Entry | None]:
        """("replay", entry) for a finished run, ("follow", entry) for one in progress, or
        ("lead", entry): run it live and report through `update`, then `finish` or `abandon`.
        ("live", None) when the request is never cached."""
        if key is None or not self.enabled:
            return "live", None
        with self._lock:
            if key in self._done:
                self._done.move_to_end(key)
                self.hits += 1
                return "replay", self._done[key]
            if key in self._running:
                self.follows += 1
                return "follow", self._running[key]
            self.misses += 1
            entry = self._running[key] = Entry(key, now_iso(), machine)
            return "lead", entry

    def clear(self) -> None:
        with self._lock:
            self._done.clear()
            self._running.clear()
            self.hits = self.follows = self.misses = 0

    def update(self, entry: Entry, spec: Trace | None, std: Trace | None, spec_done: bool = False) -> None:
        with entry.cond:
            entry.spec, entry.std, entry.version = spec, std, entry.version + 1
            entry.spec_done = spec_done
            entry.cond.notify_all()

    def finish(self, entry: Entry, spec: Trace | None, std: Trace | None) -> None:
        """The run ended: cache it if it is complete (not stopped, standard there if asked for) and its
        timings held (a race flagged as timed on a disturbed machine is never served again: the
        next identical request runs live).  Followers get the run either way."""
        complete = spec is not None and spec.stop_reason != "stopped" and (std is not None or not entry.key.standard)
        keep = complete and not flagged(spec)
        nbytes = len(recording_to_json(spec, std)) if keep else 0
        with self._lock:
            self._running.pop(entry.key, None)
            if keep and nbytes <= self.max_bytes // 4:  # one run may not flush the whole cache
                entry.nbytes = nbytes
                self._insert(entry)
        with entry.cond:
            entry.spec, entry.std, entry.version = spec, std, entry.version + 1
            entry.done, entry.failed = True, not complete
            entry.cond.notify_all()

    def abandon(self, entry: Entry) -> None:
        with self._lock:
            if self._running.get(entry.key) is entry:
                del self._running[entry.key]
        with entry.cond:
            entry.done = entry.failed = True
            entry.cond.notify_all()

    def add(self, entry: Entry) -> None:
        """A finished recording from elsewhere (a shipped file)."""
        entry.done = True
        entry.nbytes = entry.nbytes or len(recording_to_json(entry.spec, entry.std))
        with self._lock:
            self._insert(entry)

    def _insert(self, entry: Entry) -> None:
        self._done[entry.key] = entry
        self._done.move_to_end(entry.key)
        while self._done and (len(self._done) > self.max_entries or self.nbytes > self.max_bytes):
            self._done.popitem(last=False)

    def seed(self, paths: list[Path]) -> int:
        """Cache shipped recordings under the pair they name (their `models.preset`), keyed by the
        settings they were made with; returns how many were added."""
        added = 0
        for path in paths:
            try:
                data = path.read_bytes()
                spec, std = load_recording(data)
                preset = (spec.models or {}).get("preset", "")
                if spec is None or preset not in PRESETS:
                    continue
                key = RunKey(preset, spec.prompt, spec.settings, std is not None, recording_execution(spec))
                # A file's mtime is when it was checked out, not when it ran: the time is not known.
                self.add(Entry(key, None, spec.device,
                               f"recorded example {path.name}", spec, std, nbytes=len(data)))
                added += 1
            except (OSError, TraceError, ValueError) as exc:
                log.warning("recording %s not cached: %s", path.name, exc)
        return added


# SPECVIZ_REPLAY=0 turns replays off: every request runs live.
CACHE = RecordingCache(enabled=os.environ.get("SPECVIZ_REPLAY", "1") != "0")


# ---- replaying --------------------------------------------------------------------------------


@dataclass
class Snapshot:
    """A run as far as it got at one moment: what a live run would have shown then."""

    spec: Trace | None
    std: Trace | None
    phase: str  # "speculative" | "standard" | "done"


def cut(trace: Trace | None, t: float) -> Trace | None:
    """The trace as it stood t seconds into its run: its rounds finished by then, still running."""
    if trace is None:
        return None
    part = copy.copy(trace)
    part.rounds = [r for r in trace.rounds if r.t_end <= t]
    part.t_total = min(t, trace.t_total)
    return part


def snapshot(trace: Trace | None) -> Trace | None:
    """A copy of a running trace that the run's later rounds do not change (for followers)."""
    if trace is None:
        return None
    part = copy.copy(trace)
    part.rounds = list(trace.rounds)
    return part


def replay_speed(total_s: float, max_s: float = MAX_REPLAY_S) -> float:
    """1 (real time) unless the run took longer than max_s: then as fast as fits in max_s."""
    return max(1.0, total_s / max_s) if total_s > 0 else 1.0


def replay(entry: Entry, max_s: float = MAX_REPLAY_S, clock: Callable[[], float] = time.monotonic,
           sleep: Callable[[float], None] = time.sleep) -> Iterator[Snapshot]:
    """A finished run, round by round at its recorded times, in at most max_s seconds; the last
    snapshot is the whole run.  Both runs advance together, each by its own clock, as the race
    showed them (an old, sequential recording too: its clocks are each run's own)."""
    spec, std = entry.spec, entry.std
    t_spec = spec.t_total if spec else 0.0
    total = max(t_spec, std.t_total if std else 0.0)
    speed = replay_speed(total, max_s)
    times = sorted({r.t_end for t in (spec, std) if t is not None for r in t.rounds})
    t0 = clock()
    for at in times:
        wait = t0 + at / speed - clock()
        if wait > 0:
            sleep(wait)
        yield Snapshot(cut(spec, at), cut(std, at), "speculative" if at < t_spec else "standard")
    wait = t0 + total / speed - clock()
    if wait > 0:
        sleep(wait)
    yield Snapshot(spec, std, "done")


def follow(entry: Entry, poll_s: float = 1.0) -> Iterator[Snapshot | None]:
    """A run in progress, as it goes; None while nothing new has come (every poll_s, so a caller
    can show that it is waiting).  Raises Abandoned if the run stops or fails."""
    seen = -1
    while True:
        with entry.cond:
            if entry.version == seen and not entry.done:
                entry.cond.wait(poll_s)
            version, spec, std, done, failed = entry.version, entry.spec, entry.std, entry.done, entry.failed
        if done and failed:
            raise Abandoned("the identical run this request was following stopped")
        if done:
            yield Snapshot(spec, std, "done")
            return
        if version == seen:
            yield None
            continue
        seen = version
        yield Snapshot(spec, std, "standard" if entry.spec_done else "speculative")


def replay_json(snapshot: Snapshot, entry: Entry) -> dict:
    """The API's view of a replayed snapshot: a recording marked as a replay (partial until done)."""
    doc = json.loads(recording_to_json(snapshot.spec, snapshot.std))
    doc["replay"] = entry.marker()
    if snapshot.phase != "done":
        doc["partial"] = True
    return doc


# ---- live runs: the model lock, with a bounded wait ------------------------------------------


class Busy(RuntimeError):
    """No live run can start soon enough; retry in `retry_s` seconds."""

    def __init__(self, retry_s: float, ahead: int):
        self.retry_s, self.ahead = max(1, round(retry_s)), ahead
        super().__init__(f"The models are busy with {ahead} run{'s' if ahead != 1 else ''} waiting; "
                         f"retry in about {self.retry_s} s (the page's examples are served at once).")


class LiveGate:
    """The model lock for live runs, with at most `max_waiting` requests waiting for it: beyond,
    or after waiting `max_wait_s`, a request gets `Busy` with an estimate of when to retry
    (the mean of the last live runs' durations, times the runs ahead).

    Two priorities: a live run (``priority="live"``) goes before a sweep (``"sweep"``) waiting at
    the same time, and a sweep holding the gate gives it to the live runs waiting between its points
    (`yield_to_live`), so a live run waits behind at most one sweep point."""

    def __init__(self, lock: Any = MODEL_LOCK, max_waiting: int | None = None, max_wait_s: float | None = None):
        self.lock = lock
        self.max_waiting = max_waiting or env_int("SPECVIZ_MAX_WAITING", 8)
        self.max_wait_s = max_wait_s or env_number("SPECVIZ_MAX_WAIT_S", 240.0)
        self._cond = threading.Lock()
        self.waiting = 0
        self.live_waiting = 0  # of `waiting`, the live runs (a sweep lets them go first)
        self.run_s = 30.0  # estimate of one live run, updated from measured ones
        self._held_since: float | None = None

    def retry_s(self) -> float:
        return self.run_s * (self.waiting + 1)

    def enter(self, poll_s: float = 1.0, *, priority: str = "live", bounded: bool = True) -> Iterator[int]:
        """Wait for the lock, yielding the number of requests waiting every poll_s seconds; on
        return the lock is held (release it with `leave`).  Raises Busy (unless not `bounded`: a sweep
        taking the gate back after `yield_to_live` waits its turn however long)."""
        live = priority == "live"
        with self._cond:
            if bounded and self.waiting >= self.max_waiting:
                raise Busy(self.retry_s(), self.waiting)
            self.waiting += 1
            self.live_waiting += live
        try:
            deadline = time.monotonic() + self.max_wait_s
            next_report = time.monotonic() + poll_s
            while True:
                if live:
                    if self.lock.acquire(timeout=poll_s):
                        break
                else:  # a sweep: try only while no live run waits, and give the lock up if one came meanwhile
                    step = min(poll_s, 0.05)
                    if self.live_waiting == 0 and self.lock.acquire(timeout=step):
                        if self.live_waiting == 0:
                            break
                        self.lock.release()
                    time.sleep(step)
                    if time.monotonic() < next_report:
                        continue
                    next_report = time.monotonic() + poll_s
                if bounded and time.monotonic() > deadline:
                    raise Busy(self.retry_s(), self.waiting)
                yield self.waiting
        finally:
            with self._cond:
                self.waiting -= 1
                self.live_waiting -= live
        self._held_since = time.monotonic()

    def yield_to_live(self, poll_s: float = 1.0) -> float:
        """Between two points of a sweep holding the gate: when live runs wait, let them go first, then
        take the gate back (behind any live run still waiting).  Returns the seconds given away (0 when
        no live run waited): the sweep's budget does not count them."""
        if self.live_waiting <= 0:
            return 0.0
        t0 = time.monotonic()
        self.leave()
        for _ in self.enter(poll_s, priority="sweep", bounded=False):
            pass
        log.info("a sweep let live runs go first for %.1f s", time.monotonic() - t0)
        return time.monotonic() - t0

    def leave(self) -> None:
        if self._held_since is not None:
            took = time.monotonic() - self._held_since
            self.run_s = 0.7 * self.run_s + 0.3 * min(max(took, 1.0), 600.0)
            self._held_since = None
        self.lock.release()


GATE = LiveGate()
