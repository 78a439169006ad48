"""The Challenges tab's board: every challenge with its status, task, hint and the why, and the latest
verdict on the learner's runs under it.  Plain HTML from plain data (specviz.experiments.challenges);
colours are the page's CSS variables, with fallbacks, so the board reads in light and dark themes."""

from __future__ import annotations

from typing import Mapping, Sequence

from ..experiments.challenges import CHALLENGES, Challenge, Verdict
from ._fmt import esc

DONE = "✓ done"
NOT_YET = "not yet"
CARD = ("border:1px solid var(--sv-border,#e5e7eb);border-radius:10px;padding:10px 14px;margin:0 0 10px;"
        "background:var(--sv-panel,#fff)")
BADGE = "display:inline-block;border-radius:999px;padding:1px 10px;font-size:12.5px;font-weight:600;margin-left:8px"
BADGES = {True: f"{BADGE};background:var(--sv-accepted-bg,#dcfce7);color:var(--sv-accepted-fg,#14532d)",
          False: f"{BADGE};background:var(--sv-discarded-bg,#f3f4f6);color:var(--sv-discarded-fg,#5f6673)"}
VERDICT = "margin:8px 0 2px;padding:6px 10px;border-radius:6px;font-size:13.5px;border-left:4px solid"
VERDICTS = {True: f"{VERDICT} var(--sv-accepted-bd,#16a34a);background:var(--sv-hl-accepted,rgba(22,163,74,.13))",
            False: f"{VERDICT} var(--sv-pending-bd,#d97706);background:var(--sv-panel-2,#f8fafc)"}


def _card(n: int, ch: Challenge, done: str | None, latest: Verdict | None) -> str:
    passed = done is not None
    badge = f'<span style="{BADGES[passed]}" data-status="{"done" if passed else "open"}">' \
            f'{DONE if passed else NOT_YET}</span>'
    answer = ('<div class="sv-muted" style="font-size:13px;margin-top:4px">Answer with the choice just below this '
              'challenge, then check.</div>' if ch.answers else "")
    if passed:
        verdict = f'<div style="{VERDICTS[True]}"><b>Passed</b>: {esc(done)}</div>'
    elif latest is not None:
        verdict = f'<div style="{VERDICTS[False]}"><b>Not yet</b>: {esc(latest.message)}</div>'
    else:
        verdict = ""
    return (f'<div class="sv-challenge" data-key="{esc(ch.key)}" style="{CARD}">'
            f'<div style="font-weight:650;font-size:15.5px">{n}. {esc(ch.title)}{badge}</div>'
            f'<div style="margin-top:4px">{esc(ch.task)}</div>{answer}{verdict}'
            f'<details style="margin-top:6px"><summary style="cursor:pointer">Hint</summary>'
            f'<div style="margin:4px 0 0 14px">{esc(ch.hint)}</div></details>'
            f'<details style="margin-top:2px"{" open" if passed else ""}><summary style="cursor:pointer">What you '
            f'should see, and why</summary><div style="margin:4px 0 0 14px">{esc(ch.why)}</div></details></div>')


def board_html(done: Mapping[str, str] | None = None, latest: Mapping[str, Verdict] | None = None, *,
               keys: Sequence[str] | None = None, head: bool = True) -> str:
    """The board, or the challenges named in `keys` (in the catalogue's order and numbering).  done: {key: the
    message of the verdict that passed it} (this session's progress); latest: the last check's verdicts, shown
    under the challenges not done yet; head: the "n of N done" line first."""
    done, latest = done or {}, latest or {}
    n_done = sum(1 for c in CHALLENGES if c.key in done)
    top = (f'<div class="sv-challenges-head" style="margin:0 0 10px;font-weight:600">{n_done} of {len(CHALLENGES)} '
           f'done</div>' if head else "")
    cards = "".join(_card(i, c, done.get(c.key), latest.get(c.key)) for i, c in enumerate(CHALLENGES, 1)
                    if keys is None or c.key in keys)
    return f'<div class="sv-challenges">{top}{cards}</div>'


__all__ = ["DONE", "NOT_YET", "board_html"]
