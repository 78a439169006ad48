"""The page's own events, sent over raw HTTP as the browser sends them (for the load and hostile-input scripts).

The page's events are private to it (no named API), but a visitor's browser calls them by number through
Gradio's queue (`gradio_api/queue/join` with `fn_index` and a `session_hash`), so anyone can send them, with
any values.  `Page(url)` reads the app's config once; `page.event(...)` finds an event by the elem_id (or the
label) of the component that triggers it; `page.fire(...)` sends it from a session and waits for its end.
"""

from __future__ import annotations

import json
import secrets
import urllib.request
from pathlib import Path
from typing import Any

import httpx


def new_session() -> str:
    return secrets.token_hex(8)


class Page:
    def __init__(self, url: str):
        self.url = url if url.endswith("/") else url + "/"
        self.cfg = httpx.get(self.url + "config", timeout=60).json()
        self.components = {c["id"]: c for c in self.cfg["components"]}

    def _matches(self, cid: int, elem_id: str | None, label: str | None) -> bool:
        props = self.components.get(cid, {}).get("props", {})
        return ((elem_id is not None and props.get("elem_id") == elem_id)
                or (label is not None and label in (props.get("value"), props.get("label"))))

    def event(self, trigger: str, *, elem_id: str | None = None, label: str | None = None) -> dict:
        """The dependency a component's `trigger` ("click", "upload", "change"…) runs, with a Python function
        behind it (the first one; events that only run JavaScript are skipped)."""
        for dep in self.cfg["dependencies"]:
            if not dep.get("backend_fn", True):
                continue
            if any(t[1] == trigger and self._matches(t[0], elem_id, label) for t in dep["targets"]):
                return dep
        raise LookupError(f"no {trigger} event on {elem_id or label}")

    def start_event(self) -> dict:
        """The page's start: its load event that opens the URL's deep link (the one that sets presenter mode)."""
        return next(d for d in self.cfg["dependencies"] if d.get("backend_fn", True)
                    and any(t[1] == "load" for t in d["targets"])
                    and any(self.components.get(c, {}).get("props", {}).get("elem_id") == "sv-present-toggle"
                            for c in d["outputs"]))

    def defaults(self, dep: dict, **by_elem_id: Any) -> list:
        """The event's input values as the page starts with them, some replaced (by the inputs' elem_ids)."""
        data = []
        for cid in dep["inputs"]:
            props = self.components.get(cid, {}).get("props", {})
            eid = props.get("elem_id")
            data.append(by_elem_id[eid] if eid in by_elem_id else props.get("value"))
        return data

    def output(self, dep: dict, result: dict, elem_id: str) -> str | None:
        """The text of an event's output, by the output component's elem_id (None: no such output, or no result)."""
        for cid, value in zip(dep["outputs"], result.get("output") or []):
            if self.components.get(cid, {}).get("props", {}).get("elem_id") == elem_id:
                return text_of(value)
        return None

    def upload(self, path: Path) -> dict:
        """Upload a file as the page's file inputs do: the FileData to send in an event."""
        with open(path, "rb") as f:
            up = httpx.post(self.url + "gradio_api/upload", files={"files": (path.name, f, "application/json")},
                            timeout=120)
        up.raise_for_status()
        return {"path": up.json()[0], "orig_name": path.name, "meta": {"_type": "gradio.FileData"}}

    def fire(self, dep: dict, data: list, session: str | None = None, timeout: float = 600.0,
             raw_body: bytes | None = None, query: dict[str, str] | None = None) -> dict:
        """Send the event from `session` and wait for its end: {"ok": bool, "output": [...] or None,
        "error": str or None, "http": status of the join}.  `raw_body` replaces the JSON body (forged ones);
        `query`: the page's query string, sent on the join as Gradio's client sends a deep link's."""
        session = session or new_session()
        body = raw_body if raw_body is not None else json.dumps(
            {"data": data, "fn_index": dep["id"], "session_hash": session, "event_data": None,
             "trigger_id": dep["targets"][0][0]}, allow_nan=True).encode()
        join = httpx.post(self.url + "gradio_api/queue/join", content=body, params=query or None,
                          headers={"Content-Type": "application/json"}, timeout=60)
        if join.status_code != 200:
            return {"ok": False, "output": None, "error": join.text[:300], "http": join.status_code}
        try:
            with urllib.request.urlopen(self.url + f"gradio_api/queue/data?session_hash={session}",
                                        timeout=timeout) as r:
                for line in r:
                    if not line.startswith(b"data: "):
                        continue
                    msg = json.loads(line[6:])
                    if msg.get("msg") == "process_completed":
                        return completed(msg)
        except OSError as exc:
            return {"ok": False, "output": None, "error": f"stream: {exc}", "http": 200}
        return {"ok": False, "output": None, "error": "the stream ended without a result", "http": 200}


def completed(msg: dict) -> dict:
    """An event's result from its "process_completed" message, as `Page.fire` returns it."""
    out = msg.get("output") or {}
    return {"ok": bool(msg.get("success")), "output": out.get("data"), "error": out.get("error"), "http": 200,
            "changed": out.get("changed_state_ids") or []}  # states whose change events a browser now fires


def text_of(output: Any) -> str:
    """Everything an event returned, as one string (to look for a message in)."""
    return json.dumps(output, ensure_ascii=False, default=str)
