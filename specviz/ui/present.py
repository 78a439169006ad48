"""Presenter mode (issue 22, part 3): the page on a projector, driven from the keyboard.

The toggle ("Presenter mode" in the page's header, or ``?present=1`` in the URL, read by
specviz.ui.links) puts the class ``sv-present`` on the page's <body>: the style sheet
(``assets/style.css``, "presenter mode") enlarges the round view, the race and the narration, puts
the plots two to a row, and hides the settings column behind a "Settings" drawer; the script in
``assets/present.js`` (loaded in the page's <head>) scales the plots' text and lets keys drive step mode:

    ← / →        previous / next round
    space        play / pause (the next round every 1.8 s, up to the last)
    Home / End   first / last round
    Escape       close the settings drawer

Keys are ignored while focus is in a text field.  They click the step-mode buttons, so a key does
what its button does.  The Play button reads "⏸ Pause" while it plays, and a pause stops on the round
shown (a round already asked for is stepped back from).  The same script keeps tooltips inside the
viewport (placed when shown).

The step events (the four buttons and the round's views) are ``QUIET``: no "processing" overlay fades the
narration at each step (on a projector it flickered at every round of a play).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SCRIPT_PATH = Path(__file__).resolve().parents[2] / "assets" / "present.js"
QUIET = {"show_progress": "hidden"}  # the step events' Gradio options (app.py)
KEYS = {"ArrowLeft": "#sv-prev", "ArrowRight": "#sv-next", "Home": "#sv-first", "End": "#sv-last", " ": "play/pause"}
TOGGLE_JS = "(on) => { window.svPresent && window.svPresent.set(on); }"
DRAWER_JS = "() => { window.svPresent && window.svPresent.drawer(); }"
PLAY_JS = "() => { window.svPresent && window.svPresent.togglePlay(); }"
# Step mode: the rounds panel scrolls (itself only, never the page) to the round on screen and marks it, so a deep
# link to round 3 of a long run opens the panel on round 3, not on the last rounds (issue 56).  Retried for a
# moment: the panel's HTML may arrive in the same update as the step.
SCROLL_ROUND_JS = """(i) => {
  const n = Math.max(1, Math.floor(Number(i) || 1));
  let tries = 0;
  const go = () => {
    const body = document.querySelector('#sv-rounds .sv-rounds-body');
    const el = body && body.querySelector(`.sv-round[data-round="${n}"]`);
    if (!el) { if (tries++ < 20) setTimeout(go, 100); return; }
    body.querySelectorAll('.sv-round--stepped').forEach((r) => r.classList.remove('sv-round--stepped'));
    el.classList.add('sv-round--stepped');
    const off = el.getBoundingClientRect().top - body.getBoundingClientRect().top - 8;
    body.scrollBy({ top: off, behavior: 'instant' });
  };
  go();
}"""


def head() -> str:
    """The <script> the page's <head> carries (empty if the file is missing)."""
    try:
        js = SCRIPT_PATH.read_text(encoding="utf-8")
    except OSError:
        return ""
    safe = js.replace("</script", "<\\/script")  # the script cannot end its own tag
    return f"<script>{safe}</script>"


def first_round() -> int:
    return 1


def last_round(state: Any) -> int:
    """The last round of what is shown (1 when nothing is)."""
    spec = (state or {}).get("spec") if state is not None else None
    return max(len(getattr(spec, "rounds", None) or []), 1)
