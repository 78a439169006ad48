"""What a class's page keeps in its browser (issue 66): who it is across reloads and tabs.

* **The browser's id** (localStorage ``specviz-browser``: random, made by the browser once): sent with the page's
  load and with Join, it gives one seat a person, however many tabs or reloads (serving.room_points.seat_key
  hashes it; the server keeps and shows no id).  An id the browser does not send (a script, storage blocked)
  falls back to the page's session: one seat a page, as before.
* **The teacher's secret**, keyed by the class's code (localStorage ``specviz-class-teacher:<code>``), and this
  tab's class (sessionStorage ``specviz-class-teacher``): a reload of the teacher's page, or the class's link
  opened in a new tab of the teacher's browser, reopens the teacher's page of the same class; a reload of
  ``?class=new`` reopens this tab's class instead of making another.
* **The address**: once a page is in a class, its URL becomes ``?class=CODE`` (history.replaceState), so a reload
  comes back to the class.  The secret stays out of the address bar (a projected browser would show it to the
  room) unless the browser cannot store it; then the URL keeps ``&teacher=SECRET``.

The server writes what the browser must keep into a hidden textbox (``ident``, JSON), whose change runs
`IDENT_JS`; the browser sends what it kept as a hidden textbox's value (``client``, JSON) that `CLIENT_JS` fills.
"""

from __future__ import annotations

import json
from typing import Any

from ..serving.room_points import BROWSER_ID

# The browser's side of `client`: its id (made once), the teacher's secret it holds for the URL's class, and, for
# ?class=new, this tab's own class (reopened rather than a new one made).  Any input values pass through.
CLIENT_JS = r"""
(...args) => {
  const q = new URLSearchParams(window.location.search);
  const out = {id: "", teacher: "", reopen: ""};
  try {
    let id = localStorage.getItem("specviz-browser") || "";
    if (!/^[A-Za-z0-9_-]{16,64}$/.test(id)) {
      const bytes = new Uint8Array(18);
      crypto.getRandomValues(bytes);
      id = Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
      localStorage.setItem("specviz-browser", id);
    }
    out.id = id;
    const code = (q.get("class") || "").toLowerCase().replace(/[\s-]/g, "");
    if (code === "new") {
      const mine = sessionStorage.getItem("specviz-class-teacher") || "";
      const secret = mine ? localStorage.getItem("specviz-class-teacher:" + mine) : "";
      if (mine && secret) { out.reopen = mine; out.teacher = secret; }
    } else if (code) {
      out.teacher = localStorage.getItem("specviz-class-teacher:" + code) || "";
    }
  } catch (e) {}
  args[args.length - 1] = JSON.stringify(out);
  return args;
}
"""

# The browser's side of `ident`: keep the teacher's secret, put the class's code in the URL, forget a class gone.
IDENT_JS = r"""
(v) => {
  let d = null;
  try { d = JSON.parse(v || "null"); } catch (e) { return; }
  if (!d || !d.code) return;
  const key = "specviz-class-teacher:" + d.code;
  const u = new URL(window.location.href);
  if (d.role === "gone") {
    try {
      localStorage.removeItem(key);
      const here = sessionStorage.getItem("specviz-class-teacher");
      if (here === d.code) sessionStorage.removeItem("specviz-class-teacher");
    } catch (e) {}
    return;
  }
  u.searchParams.set("class", d.code);
  u.searchParams.delete("teacher");
  if (d.secret) {
    let kept = false;
    try {
      localStorage.setItem(key, d.secret);
      sessionStorage.setItem("specviz-class-teacher", d.code);
      kept = localStorage.getItem(key) === d.secret;
    } catch (e) {}
    if (!kept) u.searchParams.set("teacher", d.secret);
  }
  if (u.toString() !== window.location.href) window.history.replaceState(window.history.state, "", u.toString());
}
"""

# The projected card over the whole window, and full screen where the browser allows it (the teacher's "Project the
# code" button); a click or Esc returns.
PROJECT_JS = r"""
() => {
  const el = document.querySelector("#sv-class-card");
  if (!el) return;
  const off = () => {
    el.classList.remove("sv-projecting");
    if (document.fullscreenElement === el) document.exitFullscreen().catch(() => {});
  };
  if (el.classList.contains("sv-projecting")) { off(); return; }
  el.classList.add("sv-projecting");
  el.onclick = off;
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") off(); }, {once: true});
  el.addEventListener("fullscreenchange", () => { if (!document.fullscreenElement) off(); });
  if (el.requestFullscreen) el.requestFullscreen().catch(() => {});
}
"""


def parse_client(text: Any) -> dict[str, str]:
    """What a browser sent in ``client``: {"id", "teacher", "reopen"}, each "" when missing or malformed."""
    out = {"id": "", "teacher": "", "reopen": ""}
    try:
        data = json.loads(text) if isinstance(text, str) and len(text) < 1000 else None
    except ValueError:
        data = None
    if isinstance(data, dict):
        for k in out:
            v = data.get(k)
            out[k] = v if isinstance(v, str) and len(v) <= 200 else ""
    if not BROWSER_ID.fullmatch(out["id"]):
        out["id"] = ""
    return out


def ident(st: Any, gone: str = "") -> str:
    """What the browser keeps for the page's class (`IDENT_JS`): its code and role, the secret for the teacher's
    page (its own, already on its private link); ``gone``: a code whose kept secret the browser should forget."""
    if gone:
        return json.dumps({"code": gone, "role": "gone"})
    if not isinstance(st, dict) or not st.get("code"):
        return ""
    out = {"code": st["code"], "role": st.get("role", "")}
    if st.get("role") in ("teacher", "ended") and st.get("secret"):
        out["secret"] = st["secret"]
    return json.dumps(out)
