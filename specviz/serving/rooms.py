"""Class rooms (issue 58): a teacher's page leads, attendees follow, and the room collects one experiment's points.

Rooms live in the server's memory, behind one small interface (`RoomStore`: create, get, join, set_view,
set_experiment, post_point, remove_point, close, expire) so that another backing store could replace it later.
Everything is bounded:

* at most `SPECVIZ_CLASS_ROOMS` rooms at once, and `SPECVIZ_CLASS_ROOMS_PER_CLIENT` opened from one client address
  (serving.clients).  Past either, a room that holds nothing (no attendee, no point) makes way: the client's own
  least recently used one, or any left empty for EMPTY_ROOM_IDLE_S; only when every room holds something is a new
  one refused, in words (issue 62: one client opened all 50 rooms with ``?class=new``);
* at most `SPECVIZ_CLASS_SIZE` attendees a room.  An attendee silent for ATTENDEE_IDLE_S gives up the seat (an
  attendee's page asks every second; a hidden tab at least once a minute).  A full room seats a newcomer from
  another address by freeing the least recently seen seat of the address holding more than a fair share (the
  room's size over the addresses seated, the newcomer's counted), so one client cannot take every seat, while a
  whole class behind one NAT still fits;
* the teacher's shown runs are handles on the one trace store (ui.store): their bytes count in
  `SPECVIZ_STORE_MB` like a visitor's, and go when the room goes (``release``);
* a room closes after `SPECVIZ_CLASS_HOURS` without teacher activity;
* at most POINTS_PER_ATTENDEE points an attendee and one point per race.

A room's code is 9 characters from a 31-letter alphabet without look-alikes (~44.6 bits: not guessable, and
short enough to read off a projector).  Driving the room (its view, experiment, points) takes the teacher's
secret, a separate random token the join link never contains.  A posted point is checked (finite numbers in
range, known experiment, one point per race); a refused one costs one log line, never a traceback.
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import math
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from .clients import UNKNOWN
from .envvars import env_int, env_number
from .ratelimit import RateLimit

log = logging.getLogger("specviz.rooms")

CLASS_SIZE = env_int("SPECVIZ_CLASS_SIZE", 100)  # attendees a room
CLASS_HOURS = env_number("SPECVIZ_CLASS_HOURS", 4.0)  # a room closes after this long without the teacher
CLASS_ROOMS = env_int("SPECVIZ_CLASS_ROOMS", 50)  # rooms open at once
CLASS_ROOMS_PER_CLIENT = env_int("SPECVIZ_CLASS_ROOMS_PER_CLIENT", 3)  # rooms opened from one address
ATTENDEE_IDLE_S = 3 * 60  # an attendee whose page has not asked for this long gives up the seat
EMPTY_ROOM_IDLE_S = 10 * 60  # a room with no attendee and no point, its teacher away this long, makes way
POINTS_PER_ATTENDEE = 10  # one point a race, at most this many races an attendee
CODE_ALPHABET = "23456789abcdefghjkmnpqrstuvwxyz"  # no 0/o, 1/l/i: read off a projector
CODE_LENGTH = 9  # 31**9 ≈ 2**44.6
VIEWS_KEPT = 3  # the teacher's last few shown runs, so an attendee who explores still sees the one they left with

# The experiments a teacher may set: key -> (title, the task as the attendees read it).
EXPERIMENTS: dict[str, tuple[str, str]] = {
    "gamma": ("Everyone picks γ", "Pick a γ from 1 to 10, choose the example “Chat” and press Run. "
              "Your race lands on the teacher's plot."),
    "epsilon": ("Find the ε where α reaches 0.95", "On the example “Translation, sampled”, raise the over-acceptance ε "
                "until α reaches 0.95; every race you run is a point."),
    "lose": ("Make speculation lose", "Change any setting so that speculative decoding is slower than "
             "standard decoding (a speedup below 1×)."),
}

# A point's checked fields: name -> (low, high); None bounds are open.
RANGES: dict[str, tuple[float, float]] = {
    "alpha": (0.0, 1.0),
    "mean_accepted_length": (0.0, 65.0),
    "c": (0.0, 50.0),
    "speedup": (0.0, 100.0),
    "spread": (0.0, 10.0),
    "gamma": (0.0, 64.0),
    "epsilon": (0.0, 1.0),
    "temperature": (0.0, 2.0),
    "tokens": (0.0, 100_000.0),
}
REQUIRED = ("alpha", "mean_accepted_length", "speedup", "gamma")
TEXT_FIELDS = {"drafter": 40, "policy": 40, "example": 80, "preset": 80, "replayed": 8}


class RoomError(Exception):
    """A room action that cannot be done; the message is for the page."""


class PointRefused(RoomError):
    """A posted point that is not a valid race of this attendee's; the message is for the page."""


@dataclass
class Point:
    id: int
    attendee: str  # the attendee's page (Gradio session); never shown
    race: str  # the race's identity (a hash of its trace): one point per race
    values: dict[str, Any]
    posted: float

    def row(self, who: str = "") -> dict[str, Any]:
        return {"id": self.id, "attendee": who, **self.values, "posted": round(self.posted, 3)}


@dataclass
class Room:
    code: str
    secret: str = field(repr=False)
    created: float
    teacher_seen: float
    owner: str = UNKNOWN  # the client address that opened it (serving.clients)
    attendees: dict[str, float] = field(default_factory=dict)  # session -> last time its page asked
    addresses: dict[str, str] = field(default_factory=dict)  # session -> its client address
    names: dict[str, int] = field(default_factory=dict)  # session -> attendee number, in order of joining
    experiment: str | None = None
    points: dict[int, Point] = field(default_factory=dict)
    view_key: str = ""  # what the teacher shows (a shipped recording's name, or a run's key in `payloads`)
    step: int = 1
    version: int = 0  # bumped at every change of the view
    points_version: int = 0  # bumped at every point posted or removed
    payloads: dict[str, Any] = field(default_factory=dict, repr=False)  # the teacher's last shown runs
    closed: bool = False
    _ids: int = 0

    def attendee_number(self, session: str) -> int:
        return self.names.get(session, 0)

    def posters(self) -> int:
        return len({p.attendee for p in self.points.values()})

    def holds_nothing(self) -> bool:
        """No attendee and no point: closing it loses nobody's work."""
        return not self.attendees and not self.points


class Rooms(Protocol):
    """The interface the page uses; `RoomStore` keeps rooms in memory."""

    def create(self, owner: str = UNKNOWN) -> Room: ...
    def get(self, code: str) -> Room | None: ...
    def join(self, code: str, attendee: str, address: str = UNKNOWN) -> Room: ...
    def set_view(self, code: str, secret: str, key: str, step: int, payload: Any = None) -> Room: ...
    def set_experiment(self, code: str, secret: str, experiment: str | None) -> Room: ...
    def post_point(self, code: str, attendee: str, race: str, values: dict[str, Any]) -> Point: ...
    def remove_point(self, code: str, secret: str, point_id: int) -> bool: ...
    def close(self, code: str, secret: str) -> None: ...
    def expire(self, now: float | None = None) -> int: ...


def new_code() -> str:
    return "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))


def clean_code(text: Any) -> str:
    """A code as typed or linked: lower case, spaces and dashes dropped ("" when it cannot be one)."""
    if not isinstance(text, str):
        return ""
    code = "".join(ch for ch in text.strip().lower() if ch not in " -")
    return code if len(code) == CODE_LENGTH and all(ch in CODE_ALPHABET for ch in code) else ""


def _shown(value: Any, limit: int = 40) -> str:
    text = "".join(ch if ch.isprintable() else "?" for ch in str(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def check_point(values: Any) -> dict[str, Any]:
    """The point's values, checked and normalised; PointRefused (with the reason) when one is not a race's."""
    if not isinstance(values, dict):
        raise PointRefused("a point is a set of named values")
    out: dict[str, Any] = {}
    for name, (lo, hi) in RANGES.items():
        v = values.get(name)
        if v is None:
            if name in REQUIRED:
                raise PointRefused(f"the point has no {name}")
            out[name] = None
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise PointRefused(f"{name} is not a number ({_shown(v)})")
        v = float(v)
        if not math.isfinite(v) or not lo <= v <= hi:
            raise PointRefused(f"{name} = {_shown(v)} is outside {lo:g}…{hi:g}")
        out[name] = v
    if out["gamma"] < 1:
        raise PointRefused("γ is below 1: not a speculative race")
    if out["speedup"] <= 0:
        raise PointRefused("the speedup must be above 0")
    if out["mean_accepted_length"] > out["gamma"] + 1:
        raise PointRefused("more tokens accepted a round than γ + 1: not a real race")
    flagged = values.get("flagged", False)
    if not isinstance(flagged, bool):
        raise PointRefused("flagged is not true or false")
    out["flagged"] = flagged
    for name, limit in TEXT_FIELDS.items():
        v = values.get(name)
        if v is not None and not isinstance(v, str):
            raise PointRefused(f"{name} is not text")
        out[name] = (v or "")[:limit]
    return out


class RoomStore:
    """Rooms in this process's memory (see the module's notes for the bounds).  Thread-safe."""

    def __init__(self, *, max_rooms: int = CLASS_ROOMS, size: int = CLASS_SIZE, hours: float = CLASS_HOURS,
                 per_client: int = CLASS_ROOMS_PER_CLIENT, clock: Callable[[], float] = time.time):
        self.max_rooms, self.size, self.ttl_s, self.per_client = max_rooms, size, hours * 3600, per_client
        self.clock = clock
        self._rooms: dict[str, Room] = {}
        self._lock = threading.Lock()
        # Called with every shown-run payload a room lets go (a newer one, or the room closed): the app sets it to
        # free the payload's trace-store entry (ui.classroom).
        self.release: Callable[[Any], None] = lambda _payload: None
        self._refusals = RateLimit()

    def __len__(self) -> int:
        return len(self._rooms)

    # ---- rooms ----
    def create(self, owner: str = UNKNOWN) -> Room:
        """A new room opened from client address ``owner``; RoomError (for the page) when no room can make way."""
        now = self.clock()
        with self._lock:
            self._expire(now)
            mine = sorted((r for r in self._rooms.values() if r.owner == owner), key=lambda r: r.teacher_seen)
            if len(mine) >= self.per_client:
                empty = next((r for r in mine if r.holds_nothing()), None)
                if empty is None:
                    raise RoomError(f"Classes opened from your address: {len(mine)}, each with attendees or points, "
                                    f"the most one address may hold (SPECVIZ_CLASS_ROOMS_PER_CLIENT). End one first.")
                self._drop(empty, "made way for a new class of the same address")
            if len(self._rooms) >= self.max_rooms:
                idle = sorted((r for r in self._rooms.values()
                               if r.holds_nothing() and now - r.teacher_seen > EMPTY_ROOM_IDLE_S),
                              key=lambda r: r.teacher_seen)
                if not idle:
                    raise RoomError(f"This server already has {self.max_rooms} classes open (SPECVIZ_CLASS_ROOMS): "
                                    "try again later, or ask the host for more.")
                self._drop(idle[0], "made way for a new class (empty and idle)")
            code = new_code()
            while code in self._rooms:  # 2**44 codes: practically never
                code = new_code()
            room = Room(code=code, secret=secrets.token_urlsafe(18), created=now, teacher_seen=now, owner=owner)
            self._rooms[code] = room
        log.info("class %s opened (%d open)", code, len(self._rooms))
        return room

    def get(self, code: str) -> Room | None:
        """The open room with this code (None: unknown, closed or expired)."""
        code = clean_code(code)
        with self._lock:
            room = self._rooms.get(code)
            if room is not None and self._stale(room, self.clock()):
                self._drop(room, "expired")
                return None
            return room

    def is_open(self, code: str) -> bool:
        """Whether a room with this code is open, read without the lock (the trace store asks it while holding its
        own lock, and a room's closing frees store entries while holding this one)."""
        room = self._rooms.get(code)
        return room is not None and not self._stale(room, self.clock())

    def _stale(self, room: Room, now: float) -> bool:
        return room.closed or now - room.teacher_seen > self.ttl_s

    def _drop(self, room: Room, why: str) -> None:
        room.closed = True
        for payload in room.payloads.values():
            self._release(payload)
        room.payloads.clear()
        self._rooms.pop(room.code, None)
        log.info("class %s %s (%d attendees, %d points)", room.code, why, len(room.attendees), len(room.points))

    def _expire(self, now: float) -> int:
        stale = [r for r in self._rooms.values() if self._stale(r, now)]
        for room in stale:
            self._drop(room, "expired")
        return len(stale)

    def expire(self, now: float | None = None) -> int:
        """Close the rooms whose teacher has been away too long; how many."""
        with self._lock:
            return self._expire(self.clock() if now is None else now)

    def teacher(self, code: str, secret: Any) -> Room:
        """The room, when ``secret`` is its teacher's (the teacher's activity keeps it open); RoomError else."""
        room = self.get(code)
        if room is None:
            raise RoomError("This class is closed or its code is unknown.")
        if not isinstance(secret, str) or not hmac.compare_digest(secret.encode(), room.secret.encode()):
            self._refusals.warn(log, "refused a teacher action on class %s: wrong secret", room.code)
            raise RoomError("Only the teacher's page can do that.")
        room.teacher_seen = self.clock()
        return room

    def close(self, code: str, secret: str) -> None:
        room = self.teacher(code, secret)
        with self._lock:
            self._drop(room, "closed by its teacher")

    # ---- attendees ----
    def join(self, code: str, attendee: str, address: str = UNKNOWN) -> Room:
        """Seat ``attendee`` (a page's session, from client ``address``) in the room, or refresh its seat; RoomError
        when the code names no open room or the room is full."""
        room = self.get(code)
        if room is None:
            raise RoomError(f"No class is open with the code “{_shown(code, 20)}”: it may have ended, or the code "
                            "is mistyped. Ask your teacher for the link.")
        now = self.clock()
        with self._lock:
            if attendee not in room.attendees:
                for s, seen in list(room.attendees.items()):  # free the seats of pages gone quiet
                    if now - seen > ATTENDEE_IDLE_S:
                        self._unseat(room, s)
                if len(room.attendees) >= self.size and not self._seat_over_share(room, address):
                    raise RoomError(f"This class is full ({self.size} attendees, SPECVIZ_CLASS_SIZE).")
                room.names.setdefault(attendee, len(room.names) + 1)
            room.attendees[attendee] = now
            room.addresses[attendee] = address
        return room

    @staticmethod
    def _unseat(room: Room, session: str) -> None:
        room.attendees.pop(session, None)
        room.addresses.pop(session, None)

    def _seat_over_share(self, room: Room, address: str) -> bool:
        """Free a seat of the address holding more than a fair share for a newcomer from ``address`` (False: none
        is over its share, the room is full)."""
        held: dict[str, list[str]] = {}
        for s in sorted(room.attendees, key=room.attendees.__getitem__):  # least recently seen first
            held.setdefault(room.addresses.get(s, UNKNOWN), []).append(s)
        share = self.size / len(set(held) | {address})
        over = [a for a, seats in held.items() if a != address and len(seats) > max(1.0, share)]  # one stays
        if not over:
            return False
        victim = max(over, key=lambda a: len(held[a]))
        self._unseat(room, held[victim][0])
        log.info("class %s: a seat of an address holding %d made way for another address", room.code,
                 len(held[victim]))
        return True

    def seen(self, room: Room, attendee: str) -> None:
        if attendee in room.attendees:
            room.attendees[attendee] = self.clock()

    # ---- the teacher's view and experiment ----
    def set_view(self, code: str, secret: str, key: str, step: int, payload: Any = None) -> Room:
        """What the teacher's page shows: ``key`` names it (a shipped recording, or a run whose ``payload`` the room
        keeps for the attendees), at round ``step``."""
        room = self.teacher(code, secret)
        with self._lock:
            step = max(1, int(step)) if isinstance(step, (int, float)) and math.isfinite(step) else 1
            if payload is not None and key not in room.payloads:
                room.payloads[key] = payload
                while len(room.payloads) > VIEWS_KEPT:
                    self._release(room.payloads.pop(next(iter(room.payloads))))
            if (key, step) != (room.view_key, room.step):
                room.view_key, room.step = key, step
                room.version += 1
        return room

    def payload(self, code: str, key: str) -> Any:
        room = self.get(code)
        return room.payloads.get(key) if room is not None else None

    def _release(self, payload: Any) -> None:
        try:
            self.release(payload)
        except Exception:  # noqa: BLE001 -- a failing release must not keep a room open: the store sweeps it
            log.warning("a room's shown run could not be released", exc_info=False)

    def set_experiment(self, code: str, secret: str, experiment: str | None) -> Room:
        room = self.teacher(code, secret)
        if experiment is not None and (not isinstance(experiment, str) or experiment not in EXPERIMENTS):
            raise RoomError("No such experiment.")
        with self._lock:
            room.experiment = experiment
            room.version += 1
        return room

    # ---- points ----
    def post_point(self, code: str, attendee: str, race: str, values: dict[str, Any]) -> Point:
        """One race's point from an attendee of the room; PointRefused (one log line) when it is not acceptable."""
        room = self.get(code)
        try:
            if room is None:
                raise PointRefused("this class is closed")
            if room.experiment is None:
                raise PointRefused("the teacher has not started an experiment")
            if attendee not in room.attendees:
                raise PointRefused("this page has not joined the class")
            if not isinstance(race, str) or not 8 <= len(race) <= 128:
                raise PointRefused("the race has no identity")
            checked = check_point(values)
            with self._lock:
                mine = [p for p in room.points.values() if p.attendee == attendee]
                if any(p.race == race for p in mine):
                    raise PointRefused("this race is on the teacher's plot already (one point per race)")
                if len(mine) >= POINTS_PER_ATTENDEE:
                    raise PointRefused(f"you have posted {POINTS_PER_ATTENDEE} points, the most one attendee may")
                room._ids += 1
                point = Point(room._ids, attendee, race, {"experiment": room.experiment, **checked}, self.clock())
                room.points[point.id] = point
                room.points_version += 1
                self.seen(room, attendee)
                return point
        except PointRefused as exc:
            self._refusals.warn(log, "refused a point for class %s: %s", room.code if room else _shown(code, 20), exc)
            raise

    def remove_point(self, code: str, secret: str, point_id: int) -> bool:
        room = self.teacher(code, secret)
        with self._lock:
            gone = room.points.pop(point_id, None) if type(point_id) is int else None  # (not True, not 1.5)
            if gone is not None:
                room.points_version += 1
        return gone is not None

    def points(self, code: str) -> list[Point]:
        room = self.get(code)
        if room is None:
            return []
        with self._lock:
            return [dataclasses.replace(p, values=dict(p.values)) for p in room.points.values()]

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"rooms": len(self._rooms), "attendees": sum(len(r.attendees) for r in self._rooms.values()),
                    "points": sum(len(r.points) for r in self._rooms.values())}


ROOMS = RoomStore()
