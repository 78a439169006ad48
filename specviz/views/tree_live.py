"""The Live tab's tree panel, as HTML: the tree being drafted, then the last tree round's walk.

Pure functions of a trace (no Gradio): the page (specviz.ui.tree_ui, specviz.ui.live) and the
standalone export (specviz.views.export_frames) draw the same panel from them.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from ..core.settings import round_kind
from .tree import tree_html, tree_narration, tree_steps

if TYPE_CHECKING:
    from specviz.trace import Round, Trace

WALK_STYLE = ("margin:8px 0 2px;padding:4px 10px;border-left:3px solid #f59e0b;font-size:13px;"
              "background:rgba(245,158,11,0.08);border-radius:0 6px 6px 0")  # the walk's narration line
NO_TREE = ""  # the tree panel is empty for chain runs: chain rounds render exactly as before


def is_tree_run(spec: Trace | None) -> bool:
    return bool(spec) and round_kind(spec.settings.drafter) == "tree"


def live_tree(spec: Trace | None, pending: Round | None = None, walk: int | None = None,
              walk_round: int | None = None) -> str:
    """The Live tab's tree panel while a tree run decodes: the round being drafted (its nodes
    so far, pending), else the last finished tree round with its verification walk.

    ``walk``: a finished tree round is drawn at that animation step (see views.tree), with the
    step's narration under it, while the page plays its walk (ui.tree_ui.WALK_STEP_S): the round
    with index ``walk_round``, or the last tree round.  The page plays a walk while the engine goes
    on, so the round walked may not be the last one."""
    if not is_tree_run(spec):
        return NO_TREE
    # The last verdict stays up while the next tree grows below it, so a fast round's walk is seen.
    rounds = [r for r in spec.rounds if r.tree is not None]
    parts = []
    if walk is not None and rounds:
        k = next((i for i, r in enumerate(rounds) if r.index == walk_round), len(rounds) - 1)
        rnd = rounds[k]
        # The tree being walked stays where it was drafted: under the verdict before it.
        parts += [tree_html(rounds[k - 1])] if k > 0 else []
        parts.append(tree_html(rnd, step=walk))
        parts.append(f'<div class="sv-tree-walk" aria-live="polite" data-step="{walk}" data-round="{rnd.index + 1}" '
                     f'style="{WALK_STYLE}">{html.escape(tree_narration(rnd, walk))}</div>')
    else:
        parts += [tree_html(rounds[-1])] if rounds else []
        if pending is not None and pending.tree is not None:
            parts.append(tree_html(pending))
    return f'<div class="sv-trees">{"".join(parts)}</div>' if parts else NO_TREE


def walk_steps(rnd: Round) -> list[int]:
    """The animation steps of a finished tree round's verification walk: each child tried, then
    the correction or bonus (the drafting steps were drawn live as the tree grew)."""
    if rnd.tree is None or not rnd.tree.visits:
        return []
    drafted = max((n.depth for n in rnd.tree.nodes), default=0)
    return list(range(drafted + 1, tree_steps(rnd) + 1))


def last_tree_round(spec: Trace | None) -> Round | None:
    return next((r for r in reversed(spec.rounds) if r.tree is not None), None) if spec else None


__all__ = ["NO_TREE", "WALK_STYLE", "is_tree_run", "last_tree_round", "live_tree", "walk_steps"]
