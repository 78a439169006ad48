"""Class rooms (issue 58, 66): a teacher's page leads, attendees follow, and the room collects its experiments' points.

Rooms live in the server's memory, behind one small interface (`RoomStore`: create, get, join, set_view,
set_experiment, post_point, remove_point, close, results, expire) so that another backing store could replace it
later.  Everything is bounded:

* at most `SPECVIZ_CLASS_ROOMS` rooms at once, and `SPECVIZ_CLASS_ROOMS_PER_CLIENT` opened from one client address
  (serving.clients).  Past either, a room that holds nothing (no attendee, no point) makes way: the client's own
  least recently used one, or any left empty for EMPTY_ROOM_IDLE_S; only when every room holds something is a new
  one refused, in words (issue 62: one client opened all 50 rooms with ``?class=new``);
* at most `SPECVIZ_CLASS_SIZE` attendees a room.  A seat is a person's browser, not a page: its key is a hash of
  an id the browser keeps (`seat_key`), so a reload or a second tab keeps the one seat (issue 66).  An attendee
  silent for ATTENDEE_IDLE_S gives up the seat (an attendee's page asks every second; a hidden tab at least once a
  minute).  A full room seats a newcomer from another address by freeing the least recently seen seat of the
  address holding more than a fair share (the room's size over the addresses seated, the newcomer's counted), so
  one client cannot take every seat, while a whole class behind one NAT still fits;
* the teacher's shown runs are handles on the one trace store (ui.store): their bytes count in
  `SPECVIZ_STORE_MB` like a visitor's, and go when the room goes (``release``);
* a room closes after `SPECVIZ_CLASS_HOURS` without teacher activity.  A room its teacher ends keeps its points,
  read-only, for the teacher's export until then (at most `SPECVIZ_CLASS_ROOMS` ended rooms);
* at most POINTS_PER_ATTENDEE points an attendee in each experiment, and one point per race.  Each experiment
  keeps its own points; a point the teacher removes stays removed (its race is refused if posted again).

A room's code is 9 characters from a 31-letter alphabet without look-alikes (~44.6 bits: not guessable, and
short enough to read off a projector).  Driving the room (its view, experiment, points) takes the teacher's
secret, a separate random token the join link never contains.  A posted point is checked (finite numbers in
range, known experiment, one point per race: serving.room_points); a refused one costs one log line, never a
traceback.
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
from .room_points import (EXPERIMENTS, RANGES, REQUIRED, TEXT_FIELDS, Point, PointRefused, RoomError, check_point,
                          seat_key, seat_over_share, shown)

__all__ = ["EXPERIMENTS", "RANGES", "REQUIRED", "TEXT_FIELDS", "Point", "PointRefused", "Room", "RoomError",
           "RoomStore", "ROOMS", "check_point", "clean_code", "seat_key"]

log = logging.getLogger("specviz.rooms")

CLASS_SIZE = env_int("SPECVIZ_CLASS_SIZE", 100)  # attendees a room
CLASS_HOURS = env_number("SPECVIZ_CLASS_HOURS", 4.0)  # a room closes after this long without the teacher
CLASS_ROOMS = env_int("SPECVIZ_CLASS_ROOMS", 50)  # rooms open at once
CLASS_ROOMS_PER_CLIENT = env_int("SPECVIZ_CLASS_ROOMS_PER_CLIENT", 3)  # rooms opened from one address
ATTENDEE_IDLE_S = 3 * 60  # an attendee whose page has not asked for this long gives up the seat
EMPTY_ROOM_IDLE_S = 10 * 60  # a room with no attendee and no point, its teacher away this long, makes way
POINTS_PER_ATTENDEE = 10  # one point a race, at most this many races an attendee in each experiment
CODE_ALPHABET = "23456789abcdefghjkmnpqrstuvwxyz"  # no 0/o, 1/l/i: read off a projector
CODE_LENGTH = 9  # 31**9 ≈ 2**44.6
VIEWS_KEPT = 3  # the teacher's last few shown runs, so an attendee who explores still sees the one they left with
RESTORE_S = 20.0  # a reopened teacher's page shows the room's view first: its own moves count after this at most


@dataclass
class Room:
    code: str
    secret: str = field(repr=False)
    created: float
    teacher_seen: float
    owner: str = UNKNOWN  # the client address that opened it (serving.clients)
    attendees: dict[str, float] = field(default_factory=dict)  # seat -> last time one of its pages asked
    addresses: dict[str, str] = field(default_factory=dict)  # seat -> its client address
    names: dict[str, int] = field(default_factory=dict)  # seat -> attendee number, in order of joining
    experiment: str | None = None
    points: dict[int, Point] = field(default_factory=dict)
    removed: dict[int, Point] = field(default_factory=dict)  # points the teacher removed: their races stay refused
    restoring: dict[str, float] = field(default_factory=dict)  # a reopened teacher's page -> since (`RESTORE_S`)
    ended: float | None = None  # when its teacher ended it (its points stay for the export until it expires)
    view_key: str = ""  # what the teacher shows (a shipped recording's name, or a run's key in `payloads`)
    step: int = 1
    version: int = 0  # bumped at every change of the view
    points_version: int = 0  # bumped at every point posted or removed
    payloads: dict[str, Any] = field(default_factory=dict, repr=False)  # the teacher's last shown runs
    closed: bool = False
    _ids: int = 0
    _seated: int = 0  # seats ever numbered (an attendee's number)

    def attendee_number(self, session: str) -> int:
        return self.names.get(session, 0)

    def posters(self, experiment: str | None = None) -> int:
        """People who posted (to ``experiment``, else to any)."""
        held = list(self.points.values())  # (one C-level copy: safe beside a post on another thread)
        return len({p.attendee for p in held if experiment is None or p.experiment == experiment})

    def people(self) -> int:
        """The class's attendees, as the bar and the count box both say it: each seated browser, and each that
        posted a point still on the plot (a person who posted and left still counts as having posted)."""
        return len(set(self.attendees) | {p.attendee for p in list(self.points.values())})

    def lifetime_end(self, ttl_s: float) -> float:
        return self.teacher_seen + ttl_s

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
    def results(self, code: str, secret: str) -> Room: ...
    def points(self, code: str, experiment: str | None = None, *, removed: bool = False,
               attendee: str | None = None) -> list[Point]: ...
    def expire(self, now: float | None = None) -> int: ...


def new_code() -> str:
    return "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))


def clean_code(text: Any) -> str:
    """A code as typed or linked: lower case, spaces and dashes dropped ("" when it cannot be one)."""
    if not isinstance(text, str):
        return ""
    code = "".join(ch for ch in text.strip().lower() if ch not in " -")
    return code if len(code) == CODE_LENGTH and all(ch in CODE_ALPHABET for ch in code) else ""


class RoomStore:
    """Rooms in this process's memory (see the module's notes for the bounds).  Thread-safe."""

    def __init__(self, *, max_rooms: int = CLASS_ROOMS, size: int = CLASS_SIZE, hours: float = CLASS_HOURS,
                 per_client: int = CLASS_ROOMS_PER_CLIENT, clock: Callable[[], float] = time.time):
        self.max_rooms, self.size, self.ttl_s, self.per_client = max_rooms, size, hours * 3600, per_client
        self.clock = clock
        self._rooms: dict[str, Room] = {}
        self._ended: dict[str, Room] = {}  # rooms their teachers ended: points kept, read-only, until they expire
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
        for room in [r for r in self._ended.values() if now > r.lifetime_end(self.ttl_s)]:
            del self._ended[room.code]
        return len(stale)

    def expire(self, now: float | None = None) -> int:
        """Close the rooms whose teacher has been away too long; how many."""
        with self._lock:
            return self._expire(self.clock() if now is None else now)

    def teacher(self, code: str, secret: Any) -> Room:
        """The room, when ``secret`` is its teacher's (the teacher's activity keeps it open); RoomError else."""
        room = self.get(code)
        if room is None:
            if clean_code(code) in self._ended:
                raise RoomError("This class has ended.")
            raise RoomError("This class is closed or its code is unknown.")
        self._check_secret(room, secret)
        room.teacher_seen = self.clock()
        return room

    def _check_secret(self, room: Room, secret: Any) -> None:
        if not isinstance(secret, str) or not hmac.compare_digest(secret.encode(), room.secret.encode()):
            self._refusals.warn(log, "refused a teacher action on class %s: wrong secret", room.code)
            raise RoomError("Only the teacher's page can do that.")

    def close(self, code: str, secret: str) -> None:
        """End the class: its attendees' pages let go, its shown runs are released; its points stay, read-only,
        for its teacher's export (`results`) until the class would have expired."""
        room = self.teacher(code, secret)
        with self._lock:
            self._drop(room, "ended by its teacher")
            room.attendees.clear()
            room.addresses.clear()
            room.restoring.clear()
            room.ended = self.clock()
            self._ended[room.code] = room
            while len(self._ended) > self.max_rooms:
                del self._ended[min(self._ended, key=lambda c: self._ended[c].ended or 0.0)]

    def results(self, code: str, secret: Any) -> Room:
        """The room whose points its teacher may read: open, or ended and not yet expired; RoomError else."""
        code = clean_code(code)
        with self._lock:
            self._expire(self.clock())
            room = self._ended.get(code)
        if room is None:
            return self.teacher(code, secret)
        self._check_secret(room, secret)
        return room

    # ---- a teacher's page reopened (a reload, a new tab) ----
    def begin_restore(self, room: Room, page: str) -> None:
        """The teacher's page ``page`` was just (re)opened: until it shows the room's view (or RESTORE_S), what it
        shows is its fresh start, not a move of the teacher's, and must not replace the room's view."""
        now = self.clock()
        with self._lock:
            for p, since in list(room.restoring.items()):
                if now - since > RESTORE_S:
                    del room.restoring[p]
            if room.view_key:
                room.restoring[page] = now

    def restoring(self, room: Room, page: Any) -> bool:
        since = room.restoring.get(page) if isinstance(page, str) else None
        if since is not None and self.clock() - since > RESTORE_S:
            room.restoring.pop(page, None)
            return False
        return since is not None

    def end_restore(self, room: Room, page: Any) -> None:
        room.restoring.pop(page, None)

    # ---- attendees ----
    def join(self, code: str, attendee: str, address: str = UNKNOWN) -> Room:
        """Seat ``attendee`` (a browser's seat, `seat_key`, from client ``address``) in the room, or refresh its
        seat; RoomError when the code names no open room or the room is full."""
        room = self.get(code)
        if room is None:
            raise RoomError(f"No class is open with the code “{shown(code, 20)}”: it may have ended, or the code "
                            "is mistyped. Ask your teacher for the link.")
        now = self.clock()
        with self._lock:
            if attendee not in room.attendees:
                for s, seen in list(room.attendees.items()):  # free the seats of pages gone quiet
                    if now - seen > ATTENDEE_IDLE_S:
                        self._unseat(room, s)
                if len(room.attendees) >= self.size and not self._seat_over_share(room, address):
                    raise RoomError(f"This class is full ({self.size} attendees, SPECVIZ_CLASS_SIZE).")
                if attendee not in room.names:
                    if len(room.names) >= 4 * self.size:  # (made-up ids: numbers only of seats with a point)
                        keep = {*room.attendees, *(p.attendee for p in (*room.points.values(), *room.removed.values()))}
                        room.names = {s: n for s, n in room.names.items() if s in keep}
                    room._seated += 1
                    room.names[attendee] = room._seated
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
        seat, held = seat_over_share(room.attendees, room.addresses, self.size, address, UNKNOWN)
        if seat is None:
            return False
        self._unseat(room, seat)
        log.info("class %s: a seat of an address holding %d made way for another address", room.code, held)
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
                if any(p.race == race and p.attendee == attendee for p in room.removed.values()):
                    raise PointRefused("the teacher removed this race from the plot; run another race to post one")
                mine = [p for p in room.points.values() if p.attendee == attendee]
                if any(p.race == race for p in mine):
                    raise PointRefused("this race is on the teacher's plot already (one point per race)")
                if sum(p.experiment == room.experiment for p in mine) >= POINTS_PER_ATTENDEE:
                    raise PointRefused(f"you have posted {POINTS_PER_ATTENDEE} points to this experiment, the most "
                                       "one attendee may")
                room._ids += 1
                point = Point(room._ids, attendee, race, {"experiment": room.experiment, **checked}, self.clock())
                room.points[point.id] = point
                room.points_version += 1
                self.seen(room, attendee)
                return point
        except PointRefused as exc:
            self._refusals.warn(log, "refused a point for class %s: %s", room.code if room else shown(code, 20), exc)
            raise

    def remove_point(self, code: str, secret: str, point_id: int) -> bool:
        room = self.teacher(code, secret)
        with self._lock:
            gone = room.points.pop(point_id, None) if type(point_id) is int else None  # (not True, not 1.5)
            if gone is not None:
                room.removed[gone.id] = gone
                room.points_version += 1
        return gone is not None

    def points(self, code: str, experiment: str | None = None, *, removed: bool = False,
               attendee: str | None = None) -> list[Point]:
        """Copies of the points of the room with this code, open or ended (those posted to ``experiment``, by
        ``attendee``, when given; the removed ones with ``removed``)."""
        code = clean_code(code)
        with self._lock:
            room = self._rooms.get(code) or self._ended.get(code)
            held = (room.removed if removed else room.points).values() if room is not None else ()
            return [dataclasses.replace(p, values=dict(p.values)) for p in held
                    if (experiment is None or p.experiment == experiment)
                    and (attendee is None or p.attendee == attendee)]

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"rooms": len(self._rooms), "attendees": sum(len(r.attendees) for r in self._rooms.values()),
                    "points": sum(len(r.points) for r in self._rooms.values()), "ended": len(self._ended)}


ROOMS = RoomStore()
