"""A class room's experiments, seats and points (issue 58, 66): who posts (`seat_key`), what one attendee's race
posts, and how it is checked.

A point is computed by the server from a race it holds for the attendee's page (ui.class_views.point_values),
never from values a client sends; still, every value is checked here (finite numbers in range, the text short), so
a forged point costs one log line and never a traceback.  Its settings travel with it (γ, ε, temperature, policy,
drafter), and its costs: c (a draft token) and v (a verify pass), both in standard decoding steps, so the teacher's
plot can draw Thm 3.8 at the class's own measured costs (issue 66: the textbook curve, v = 1, sat above every CPU
point).
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from typing import Any

# The experiments a teacher may set: key -> (title, the task as the attendees read it).
EXPERIMENTS: dict[str, tuple[str, str]] = {
    "gamma": ("Everyone picks γ", "Pick a γ from 1 to 10, choose the example “Chat” and press Run. "
              "Your race lands on the teacher's plot."),
    "epsilon": ("Find the ε where α reaches 0.95", "On the example “Translation, sampled”, raise the over-acceptance ε "
                "until α reaches 0.95; every race you run is a point."),
    "lose": ("Make speculation lose", "Change any setting so that speculative decoding is slower than "
             "standard decoding (a speedup below 1×)."),
}

BROWSER_ID = re.compile(r"[A-Za-z0-9_-]{16,64}")  # the id a browser keeps for its seat (ui.class_client)

# A point's checked fields: name -> (low, high).
RANGES: dict[str, tuple[float, float]] = {
    "alpha": (0.0, 1.0),
    "mean_accepted_length": (0.0, 65.0),
    "c": (0.0, 50.0),  # a draft token's cost, in standard steps
    "v": (0.0, 50.0),  # a verify pass's cost, in standard steps
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
    attendee: str  # the attendee's seat (a hash of the browser's id, serving.rooms.seat_key); never shown
    race: str  # the race's identity (a hash of its trace): one point per race
    values: dict[str, Any]  # the checked values, and "experiment": the experiment it was posted to
    posted: float

    @property
    def experiment(self) -> str:
        return str(self.values.get("experiment") or "")

    def row(self, who: str = "") -> dict[str, Any]:
        return {"id": self.id, "attendee": who, **self.values, "posted": round(self.posted, 3)}


def seat_key(browser: Any, session: Any = "") -> str:
    """A page's seat: the id its browser keeps (every tab and reload of one browser: one seat), hashed, so the id
    itself is kept nowhere and nothing the server shows or logs can be replayed as it; the page's session where
    the browser sent no well-formed id (a script, storage blocked).  A made-up id seats only its sender, once."""
    if isinstance(browser, str) and BROWSER_ID.fullmatch(browser):
        return "b:" + hashlib.sha256(browser.encode()).hexdigest()[:24]
    return "s:" + hashlib.sha256(str(session or "").encode()).hexdigest()[:24]


def seat_over_share(attendees: dict[str, float], addresses: dict[str, str], size: int, address: str,
                    unknown: str = "unknown") -> tuple[str | None, int]:
    """For a newcomer from ``address`` to a full room: the least recently seen seat of the address holding the most
    seats above a fair share (the room's size over the addresses seated, the newcomer's counted; one seat always
    stays), and how many that address holds; (None, 0) when no address is over its share."""
    held: dict[str, list[str]] = {}
    for s in sorted(attendees, key=attendees.__getitem__):  # least recently seen first
        held.setdefault(addresses.get(s, unknown), []).append(s)
    share = size / len(set(held) | {address})
    over = [a for a, seats in held.items() if a != address and len(seats) > max(1.0, share)]
    if not over:
        return None, 0
    victim = max(over, key=lambda a: len(held[a]))
    return held[victim][0], len(held[victim])


def shown(value: Any, limit: int = 40) -> str:
    """A value as a log line or a message may quote it: printable, and short."""
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
            raise PointRefused(f"{name} is not a number ({shown(v)})")
        v = float(v)
        if not math.isfinite(v) or not lo <= v <= hi:
            raise PointRefused(f"{name} = {shown(v)} is outside {lo:g}…{hi:g}")
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
