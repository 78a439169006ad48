"""Deep links: the page's URL opens an example or a shipped recording at a round, in step mode.

    ?recording=1-code-greedy&round=7     a shipped recording (assets/traces/<name>.json), round 7
    ?example=2&round=3                   an example (its label, or its place in the list from 1), round 3
                                         (its shipped recording when it has one)
    ?step=3                              "step" is another name for "round"
    ?present=1                           presenter mode (large text, settings in a drawer, keys
                                         drive step mode; see specviz.ui.present); with any of the above

Whatever a URL holds, the page opens: a value that names nothing, or is not a round number, is
ignored and the status line says so in a short note (never an error); so is a query too long to
read (over 8 KB: specviz.serving.long_urls).  "Copy link" in step mode
writes the query for what is on screen (`link_query`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlencode

import gradio as gr

from ..serving.long_urls import TOO_LONG
from . import live
from .frames import round_number

MAX_SHOWN = 40  # characters of a bad value echoed in a note
_PLAIN = re.compile(r"[^\w .,:;()=+\-/]")  # what a note may echo of a value, the rest becomes "?"


@dataclass(frozen=True)
class Link:
    recording: Path | None = None
    example: dict | None = None
    round: int | None = None
    notes: tuple[str, ...] = ()
    present: bool = False  # presenter mode

    @property
    def note(self) -> str:
        return " · ".join(self.notes)


def _shown(value: Any) -> str:
    text = _PLAIN.sub("?", str(value))
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 1] + "…"


def _first(params: Mapping[str, Any], *names: str) -> str | None:
    for name in names:
        value = params.get(name)
        if isinstance(value, (list, tuple)):
            value = value[0] if value else None
        if value is not None:
            return str(value).strip()
    return None


_ON, _OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def parse_link(params: Mapping[str, Any] | None, *, examples: list[dict], recordings: list[Path]) -> Link:
    """The link in a URL's query parameters; what it cannot use goes to ``notes``."""
    params = params or {}
    notes: list[str] = []
    rec = ex = rnd = None
    too_long = _first(params, TOO_LONG)  # the server dropped an over-long query (specviz.serving.long_urls)
    if too_long is not None:
        known = too_long.isascii() and too_long.isdigit() and len(too_long) <= 12
        notes.append(f"it is too long ({int(too_long):,} characters)" if known else "it is too long")
    name = _first(params, "recording")
    if name:
        stem = name.removesuffix(".json")
        rec = next((p for p in recordings if p.stem == stem), None)
        if rec is None:
            notes.append(f"no recording named “{_shown(name)}”")
    label = _first(params, "example")
    if label:
        if label.isascii() and label.isdigit() and len(label) <= 4 and 1 <= int(label) <= len(examples):
            ex = examples[int(label) - 1]
        else:
            ex = next((e for e in examples if e["label"].casefold() == label.casefold()), None)
        if ex is None:
            notes.append(f"no example “{_shown(label)}”")
    step = _first(params, "round", "step")
    if step:
        if step.isascii() and step.isdigit() and len(step) <= 6 and int(step) >= 1:
            rnd = int(step)
        else:
            notes.append(f"“{_shown(step)}” is not a round number")
    present = (_first(params, "present") or "").casefold()
    if present not in _ON + _OFF:
        notes.append(f"“{_shown(present)}” is not present=1 or 0")
    if rec is None and ex is not None:  # an example opens its shipped recording, when it has one
        rec = next((p for p in recordings if _prompt_of(p) == ex["prompt"]), None)
    return Link(rec, ex, rnd, tuple(f"link ignored: {n}" for n in notes), present=present in _ON)


@functools.lru_cache(maxsize=64)
def _recorded(path: Path) -> tuple[str | None, str, int]:
    """(prompt, settings as JSON, rounds) of a shipped recording's speculative run ((None, "", 0) if unreadable)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))["speculative"]
        return doc.get("prompt"), json.dumps(doc.get("settings"), sort_keys=True), len(doc.get("rounds", []))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None, "", 0


def _prompt_of(path: Path) -> str | None:
    return _recorded(path)[0]


def link_query(spec: Any, round_: Any, *, examples: list[dict], recordings: list[Path], present: Any = False) -> str:
    """The query string that opens what is shown at this round: the shipped recording it is, else the
    example whose prompt it ran, else the round alone (and presenter mode, when ``present``)."""
    params: dict[str, Any] = {}
    prompt = getattr(spec, "prompt", None)
    if prompt:
        rec = next((p for p in recordings if _prompt_of(p) == prompt and _same_run(p, spec)), None)
        if rec is not None:
            params["recording"] = rec.stem
        else:
            idx = next((i for i, e in enumerate(examples, 1) if e["prompt"] == prompt), None)
            if idx is not None:
                params["example"] = idx
    params["round"] = round_number(round_, len(getattr(spec, "rounds", None) or []) or 2**31)
    if present is True:
        params["present"] = 1
    return urlencode(params)


def _same_run(path: Path, spec: Any) -> bool:
    """Is ``spec`` the speculative run recorded in ``path`` (same prompt, settings as stored, rounds)?"""
    prompt, settings, n = _recorded(path)
    stored = json.loads(settings) if settings else {}
    mine = {k: v for k, v in spec.settings.as_dict().items() if k in (stored or {})}
    return prompt == spec.prompt and stored == mine and n == len(spec.rounds)


COPY_LABEL = "Copy a link to this round"


def link_target(spec: Any, *, examples: list[dict], recordings: list[Path]) -> tuple[str, str]:
    """What "Copy a link" can link to for the run shown, and how it differs: ("recording", "") when it is a
    shipped recording; ("example", "γ = 4 here, 5 there") when it ran an example's prompt with other settings (or
    live: the link opens the shipped recording, another run); ("none", "") when no link can open it (a prompt of
    its own: the link would open the first shipped recording)."""
    prompt = getattr(spec, "prompt", None)
    if not prompt:
        return "none", ""
    rec = next((p for p in recordings if _prompt_of(p) == prompt), None)
    if rec is not None and _same_run(rec, spec):
        return "recording", ""
    if rec is None and not any(e["prompt"] == prompt for e in examples):
        return "none", ""
    return "example", _differs(rec, spec) if rec is not None else ""


def _differs(path: Path, spec: Any) -> str:
    """The settings in which ``spec`` differs from the recording in ``path``: 'γ = 4 here, 5 there'."""
    stored = json.loads(_recorded(path)[1] or "{}") or {}
    mine = spec.settings.as_dict()
    names = {"gamma": "γ", "epsilon": "ε", "temperature": "temperature", "max_new_tokens": "max new tokens",
             "seed": "seed", "top_p": "top-p", "drafter": "drafter", "policy": "policy", "rule": "rule"}
    diffs = [f"{names.get(k, k)} = {mine[k]} here, {stored[k]} there" for k in names if k in stored and k in mine
             and mine[k] != stored[k]]
    return "; ".join(diffs) or f"{len(spec.rounds)} rounds here, {_recorded(path)[2]} there"


def copy_button(spec: Any, *, examples: list[dict], recordings: list[Path]) -> dict[str, Any]:
    """The "Copy a link" button's label for the run shown: a link that opens another run says so (a live run of
    an example links to its shipped recording, whose round N is another round), and a run no link can open
    says that instead (its button is then off)."""
    kind, differs = link_target(spec, examples=examples, recordings=recordings)
    if kind == "example":
        first = differs.split("; ")[0]
        return dict(value=f"Copy a link to the shipped recording, not this run{f' ({first})' if first else ''}",
                    interactive=True)
    if kind == "none" and spec is not None:
        return dict(value="No link opens this run: export its trace to share it", interactive=False)
    return dict(value=COPY_LABEL, interactive=True)


def open_link(link: Link, recordings: list[Path]) -> Any:
    """The Live tab's frame for a link: its recording (else the first shipped one) at its round, in step
    mode, and the link's notes on the status line."""
    frame = live.load_example_recording(recordings, link.recording.name if link.recording else None)
    shown = frame.state if hasattr(frame.state, "get") else None  # SKIP: nothing could be shown
    spec = shown.get("spec") if shown is not None else None
    n = len(spec.rounds) if spec else 0
    notes = list(link.notes)
    if link.round is not None and n:
        if link.round > n:
            notes.append(f"link: round {link.round} is past the last round, {n}")
        frame = dataclasses.replace(frame, step=gr.Slider(minimum=1, maximum=max(n, 2), value=min(link.round, n), step=1,
                                                          interactive=True, label=f"Round (1–{n})"))
    if notes:
        where = spec or (shown.get("std") if shown is not None else None)
        label = f"Recorded example ({link.recording.stem if link.recording else recordings[0].stem})"
        frame = dataclasses.replace(frame, status=live.status_html(f"{label} · {' · '.join(notes)}",
                                                                   "ok" if where else "info"))
    return frame
