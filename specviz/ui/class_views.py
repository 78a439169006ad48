"""What a class's pages show of its room: the projected card (code, join link, QR code) and the teacher's private
link beside it, the bar and the task, an attendee's own points, the experiments' points (computed from a race the
server holds, never from values a client sends), and every experiment's points as CSV and JSON files.  Plain
functions of a room (class mode's handlers: ui.classroom; the plot: ui.class_plot)."""

from __future__ import annotations

import csv
import hashlib
import html
import io
import json
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

from ..serving import rooms as R
from ..serving.rooms import ROOMS
from ..theory.figures import run_figures
from ..theory.timing import flagged, trusted_speedup
from ..views import html as V
from .class_plot import AXES, label, quantities, reference
from .exports import prune

EXPORT_DIR = Path(tempfile.gettempdir()) / "specviz-class"


# ---- the links and the QR code ------------------------------------------------------------------------------


def page_url(request: Any) -> str:
    """The page's address without its query (the referring page of the event; else the server's own root)."""
    headers = getattr(request, "headers", None) or {}
    ref = headers.get("referer") if hasattr(headers, "get") else None
    if ref:
        parts = urlsplit(ref)
        if parts.scheme in ("http", "https") and parts.netloc:
            return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", "", ""))
    url = getattr(request, "url", None)
    if url is not None:
        parts = urlsplit(str(url))
        return urlunsplit((parts.scheme, parts.netloc, "/", "", ""))
    return "/"


def join_link(base: str, code: str) -> str:
    return f"{base}?{urlencode({'class': code})}"


def qr_svg(text: str) -> str:
    """A QR code of ``text`` as inline SVG, made here (the `qrcode` package; no network); "" without it."""
    try:
        import qrcode
        import qrcode.image.svg
    except ImportError:
        return ""
    img = qrcode.make(text, image_factory=qrcode.image.svg.SvgPathImage, box_size=10, border=2)
    return img.to_string(encoding="unicode")


def spaced(code: str) -> str:
    return f"{code[:3]}-{code[3:6]}-{code[6:]}"


def teacher_html(room: R.Room, base: str) -> str:
    """The card the teacher projects: the code (large), the join link and its QR code; nothing private."""
    link = join_link(base, room.code)
    svg = qr_svg(link)
    qr = (f'<div class="sv-class-qr" role="img" aria-label="QR code of the join link">{svg}</div>' if svg else
          '<p class="sv-muted">(no QR code: the qrcode package is not installed)</p>')
    return (f'<div class="sv-class-card" data-state="open">{qr}<div class="sv-class-join">'
            f'<p class="sv-class-label">Class code</p>'
            f'<p class="sv-class-code" id="sv-class-code" data-code="{room.code}">{spaced(room.code)}</p>'
            f'<p class="sv-class-url">Open <a href="{html.escape(link)}" target="_blank" id="sv-class-join-link">'
            f'{html.escape(base)}<wbr>{html.escape(link[len(base):])}</a><br>or scan the QR code.</p></div></div>')


def private_html(room: R.Room, base: str) -> str:
    """The teacher's own link (under a closed "for you only" section, outside the projected card)."""
    own = f"{base}?{urlencode({'class': room.code, 'teacher': room.secret})}"
    return ('<p class="sv-muted">This browser reopens the class as its teacher after a reload or in a new tab. '
            'On another browser, this link does; whoever has it drives the class, so never project it:</p>'
            f'<code id="sv-class-teacher-link">{html.escape(own)}</code>')


def ended_html(room: R.Room, ttl_s: float, now: float) -> str:
    hours = max(0.0, (room.lifetime_end(ttl_s) - now) / 3600)
    left = f"about {hours:.0f} h" if hours >= 1.5 else f"about {max(1, round(hours * 60))} min"
    return (f'<div class="sv-class-card" data-state="ended"><div class="sv-class-join"><p class="sv-class-label">'
            f'Class <b>{spaced(room.code)}</b> has ended.</p><p>Its points stay here, read-only, for {left}: pick an '
            'experiment to see its points, and <b>Export the points</b> to keep them. A reload of this page comes '
            'back here.</p></div></div>')


# ---- the bar and the task ------------------------------------------------------------------------------------


def task_html(room: R.Room | None) -> str:
    if room is None:
        return ""
    if room.experiment is None:
        return "<p class='sv-muted'>No experiment yet: follow the teacher.</p>"
    title, task = R.EXPERIMENTS[room.experiment]
    return f"<p><b>Experiment: {html.escape(title)}.</b> {html.escape(task)}</p>"


def people_text(room: R.Room) -> str:
    n = room.people()
    return f"{n} attendee{'s' if n != 1 else ''}"


def bar_html(room: R.Room | None, role: str, note: str = "") -> str:
    if room is None or role == "ended":
        if role == "ended" and room is not None:
            note = f"Class {spaced(room.code)} has ended; its points stay in the Class tab for you to export."
        return f'<div class="sv-class-bar-text" data-state="closed">{html.escape(note)}</div>' if note else ""
    who = "You are teaching" if role == "teacher" else "You are in"
    extra = f" · {html.escape(note)}" if note else ""
    return (f'<div class="sv-class-bar-text" data-state="open" data-role="{role}">{who} class '
            f'<b>{spaced(room.code)}</b> · <span class="sv-class-people" data-people="{room.people()}">'
            f'{people_text(room)}</span>{extra}{task_html(room) if role == "attendee" else ""}</div>')


def mine_html(room: R.Room | None, seat: str) -> str:
    """An attendee's own points in the current experiment: those on the teacher's plot, and those the teacher
    removed (a removed race is refused if posted again)."""
    if room is None or not room.experiment:
        return ""
    exp = room.experiment
    on = ROOMS.points(room.code, exp, attendee=seat)  # (every attendee's poll asks: only its own are copied)
    off = ROOMS.points(room.code, exp, removed=True, attendee=seat)
    def listed(ps: list[R.Point]) -> str:
        return ", ".join(f"#{p.id} ({html.escape(quantities(p))})" for p in ps)

    parts = []
    if on:
        parts.append(f"<p class='sv-class-mine' data-posted='{len(on)}'>Posted to the class: {listed(on)}.</p>")
    if off:
        parts.append(f"<p class='sv-class-removed' data-removed='{len(off)}'>Removed by the teacher: {listed(off)}; "
                     f"posting {'it' if len(off) == 1 else 'them'} again is refused.</p>")
    return f"<div class='sv-status'>{''.join(parts)}</div>" if parts else ""


# ---- the experiment's points ----------------------------------------------------------------------------------


def race_identity(spec: Any, std: Any) -> str:
    """A race's identity: its prompt, settings, tokens and clocks, hashed (a replay of it is the same race)."""
    parts = [spec.prompt, json.dumps(spec.settings.as_dict(), sort_keys=True, default=str), spec.n_tokens,
             round(spec.t_total, 6), round(getattr(std, "t_total", 0.0) or 0.0, 6),
             [t for r in spec.rounds for t in r.emitted][:512]]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]


def _cost(x: float | None) -> float | None:
    lo, hi = R.RANGES["v"]
    return x if x is not None and lo <= x <= hi else None  # (nan fails both)


def point_values(spec: Any, std: Any) -> dict[str, Any]:
    """The point a race posts: its settings, α, mean accepted length, its costs c (a draft token) and v (a verify
    pass) in standard steps (theory.costs, as the race's headline measures them), speedup (the one the page quotes:
    the count-based one when its clocks were flagged and it has one) with its uncertainty, and whether it was
    flagged."""
    s = spec.summary()
    rc = run_figures(spec, std).quoted  # c and v as the race's panels quote them (the probe's when flagged)
    sp = V.race_speedup(spec, std)
    # flagged clocks: the count-based figure where the race has one, else the wall clock's, marked flagged (the
    # teacher's plot rings it): a busy room's races are part of the experiment too
    trusted = (trusted_speedup(spec, sp) or sp) if sp else None
    st = spec.settings
    c = _cost(rc.c if rc is not None and rc.c is not None else s.c)
    return {"alpha": s.alpha, "mean_accepted_length": s.mean_accepted_length, "c": c,
            "v": _cost(rc.v if rc is not None else None), "speedup": trusted,
            "spread": getattr(spec.timing, "spread", None) if spec.timing is not None else None,
            "gamma": float(st.gamma), "epsilon": float(st.epsilon), "temperature": float(st.temperature),
            "tokens": float(spec.n_tokens), "flagged": flagged(spec), "drafter": str(st.drafter),
            "policy": str(st.policy), "example": (spec.prompt or "")[:80]}


def count_html(room: R.Room | None, experiment: str | None = None) -> str:
    """Who has posted to the experiment, of the class's attendees (the same count as the bar's)."""
    exp = experiment or (room.experiment if room is not None else None)
    if room is None or not exp:
        n = room.people() if room is not None else 0
        return (f'<p id="sv-class-count" data-points="0" data-posters="0" data-people="{n}">{people_text(room)} · '
                'no experiment</p>' if room is not None else "")
    n = len(ROOMS.points(room.code, exp))
    return (f'<p id="sv-class-count" data-points="{n}" data-posters="{room.posters(exp)}" data-people='
            f'"{room.people()}" data-experiment="{exp}">{room.posters(exp)} of {people_text(room)} '
            f'{"has" if room.posters(exp) == 1 else "have"} posted · '
            f'{n} point{"s" if n != 1 else ""} in “{html.escape(R.EXPERIMENTS[exp][0])}”</p>')


def point_choices(room: R.Room | None, experiment: str | None = None) -> list[tuple[str, int]]:
    exp = experiment or (room.experiment if room is not None else None)
    if room is None or not exp:
        return []
    return [(label(p, room.attendee_number(p.attendee)), p.id) for p in ROOMS.points(room.code, exp)]


def rows(room: R.Room, experiment: str | None = None) -> list[dict[str, Any]]:
    return [p.row(f"attendee {room.attendee_number(p.attendee)}") for p in ROOMS.points(room.code, experiment)]


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")  # what a spreadsheet may read as a formula (OWASP's list)


def csv_cell(value: Any) -> Any:
    """A text cell a spreadsheet would run as a formula (``=HYPERLINK(…)`` in an attendee's prompt), made inert
    with a leading apostrophe; numbers and other text unchanged (issue 62)."""
    return "'" + value if isinstance(value, str) and value.startswith(FORMULA_START) else value


# The export's columns: who and which experiment, the race's settings, what it measured, the rest.
FIELDS = ["id", "attendee", "experiment", "gamma", "epsilon", "temperature", "policy", "drafter", "alpha",
          "mean_accepted_length", "c", "v", "speedup", "spread", "flagged", "tokens", "example", "preset", "replayed",
          "posted"]


def write_points(room: R.Room) -> list[str]:
    """Every experiment's points of the room (open or ended) as a CSV and a JSON file; their paths.  The JSON
    holds each experiment's title, its points and the class's measured α, γ, c, v its reference curve used."""
    data = rows(room)
    EXPORT_DIR.mkdir(parents=True, exist_ok=True)
    prune(EXPORT_DIR, "class-*", 32)
    stem = EXPORT_DIR / f"class-{room.code}-{len(data)}pts"
    fields = [*FIELDS, *(k for k in (*R.RANGES, *R.TEXT_FIELDS) if k not in FIELDS)]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore")
    w.writeheader()
    w.writerows([{k: csv_cell(v) for k, v in row.items()} for row in data])
    csv_path, json_path = stem.with_suffix(".csv"), stem.with_suffix(".json")
    csv_path.write_text(buf.getvalue(), encoding="utf-8")
    experiments = {}
    for key, (title, _) in R.EXPERIMENTS.items():
        mine = [row for row in data if row.get("experiment") == key]
        if mine:
            experiments[key] = {"title": title, "axes": AXES[key][::2], "reference": reference(mine), "points": mine}
    json_path.write_text(json.dumps({"class": room.code, "ended": room.ended is not None,
                                     "current_experiment": room.experiment, "experiments": experiments,
                                     "points": data}, indent=1), encoding="utf-8")
    return [str(csv_path), str(json_path)]
