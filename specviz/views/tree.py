"""A tree round drawn left to right by depth, step by step, with a narration and its attention mask.

Pure functions of a trace round (``Round.tree``, see specviz.trace.model): no models,
no torch.  The chips reuse the classes of :mod:`specviz.views.chips`: the
accepted path is bold green, children tried and rejected are red (with the
order they were tried in), nodes never visited are grey, and the correction or
bonus ends the path.  Hover a chip for q, r(x), b = min(1, r/q) and u.

``step`` animates a round: steps 1…D show the tree being drafted depth by depth
(pending chips), the next steps each apply the rule to one child, and the last
one adds the correction or bonus token.  ``step=None`` is the finished round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from specviz.trace.tree import attention_mask

from ._fmt import COLORS, esc, fnum, fpair, fsec, fsig, fsig_pair, plural, tok_repr
from .chips import chip_html, tip_html
from .narrate import tree_stop_sentence
from .figures import compact_layout, empty_figure

if TYPE_CHECKING:
    from specviz.trace import Round
    from specviz.trace.tree import RoundTree

MODE_LABELS = {"iid": "i.i.d. drafts", "best-first": "best-first tree", "unique": "distinct draws (no replacement)"}
_ROW = "display:flex;align-items:center;gap:6px"
_CURRENT = ";outline:2px solid #f59e0b;outline-offset:2px;border-radius:8px"
_KIDS = "display:flex;flex-direction:column;gap:4px;padding-left:10px;border-left:2px solid rgba(128,128,128,0.35)"


@dataclass
class _Event:
    """One verification step: child `node` tried at `visit` (try j of n), or the extra token."""

    visit: int
    j: int  # 0-based position among the tries at that visit; -1 for the extra token
    node: int


def _events(rnd: Round) -> list[_Event]:
    tree = rnd.tree
    out = [_Event(k, j, t.node) for k, v in enumerate(tree.visits) for j, t in enumerate(v.tries)]
    if rnd.extra is not None:
        out.append(_Event(len(tree.visits) - 1, -1, -1))
    return out


def _depth(tree: RoundTree) -> int:
    return max((n.depth for n in tree.nodes), default=0)


def tree_steps(rnd: Round) -> int:
    """How many animation steps the round has: one per drafted depth, one per child tried, one
    for the extra token.  ``tree_html(rnd, step=tree_steps(rnd))`` is the finished round."""
    return 0 if rnd.tree is None else _timeline(rnd, None)[2]


def _timeline(rnd: Round, step: int | None) -> tuple[int, list, int, int]:
    """(depth, verification events, total steps, the step clamped to 0..total; None = the end)."""
    depth = _depth(rnd.tree)
    events = _events(rnd)
    total = depth + len(events)
    return depth, events, total, total if step is None else max(0, min(int(step), total))


def _children(tree: RoundTree, node: int) -> list[int]:
    """Children of `node`: in the order tried where it was visited, then creation order."""
    kids = [k for k, n in enumerate(tree.nodes) if n.parent == node]
    for v in tree.visits:
        if v.node == node:
            tried = list(dict.fromkeys(t.node for t in v.tries))
            return tried + [k for k in kids if k not in tried]
    return kids


def _planned(tree: RoundTree, node: int) -> int:
    """How many tries the rule had lined up at `node`: one per child, one per i.i.d. draw (a node
    drawn twice is tried twice).  The visit records only those made before one was accepted."""
    kids = [n for n in tree.nodes if n.parent == node]
    return sum(n.draws for n in kids) if tree.mode == "iid" else len(kids)


def _try_of(tree: RoundTree, node: int):
    """(visit, tries at that visit, the tries of `node` there) or None if never tried."""
    parent = tree.nodes[node].parent
    for v in tree.visits:
        if v.node == parent:
            mine = [(j, t) for j, t in enumerate(v.tries) if t.node == node]
            return (v, mine) if mine else None
    return None


def _node_chip(tree: RoundTree, node: int, status: str, tries_here: list[int], mode: str, current: bool = False) -> str:
    n = tree.nodes[node]
    head = f"Depth {n.depth} · {tok_repr(n.text)}"
    rows = [("id", str(n.id)), ("q(x) at the parent", fsig(n.q))]
    if mode == "iid" and n.draws > 1:
        rows.append(("i.i.d. draws of it", str(n.draws)))
    verdict, note = "", ""
    tried = _try_of(tree, node)
    if tried is not None and status in ("accepted", "rejected"):
        v, mine = tried
        j, t = mine[-1] if status == "rejected" else next((jt for jt in mine if jt[1].accepted), mine[-1])
        rows += [("tried", f"{j + 1} of {_planned(tree, v.node)}"), ("q_j(x)", fsig(t.q)), ("r(x) before the try", fsig(t.r)),
                 ("b = min(1, r/q)", fsig(t.b)), ("u (uniform draw)", fsig(t.u))]
        su, sb = fsig_pair(t.u, t.b)
        verdict = f"u={su} {'<' if t.accepted else '≥'} b={sb} → {'accepted' if t.accepted else 'rejected'}"
    if status == "pending":
        note = "Drafted; the target has not checked the tree yet."
    elif status == "discarded":
        note = "Never visited: the rule took another branch (or stopped above), so it is thrown away."
    badge = ""
    if tries_here:
        order = ",".join(str(j + 1) for j in tries_here)
        badge = f'<span class="sv-tree-ord" title="{esc("tried " + order)}" style="font-size:11px;opacity:0.75">#{esc(order)}</span>'
    chip = chip_html(status, n.text, tip_html(f"{head} · {status}", rows, verdict, note))
    if status == "accepted":  # the accepted path in bold
        chip = chip.replace('<span class="sv-tok">', '<span class="sv-tok" style="font-weight:700">', 1)
    mult = f'<span style="font-size:11px;opacity:0.75">×{n.draws}</span>' if mode == "iid" and n.draws > 1 else ""
    # Mid-walk, the child just tried is ringed so the eye finds the step the narration describes.
    ring, mark = (_CURRENT, ' data-current="1"') if current else ("", "")
    return f'<span style="{_ROW};gap:2px{ring}"{mark} data-node="{node}">{chip}{mult}{badge}</span>'


def _extra_chip(rnd: Round) -> str:
    extra = rnd.extra
    tree = rnd.tree
    if extra.kind == "correction":
        last = tree.visits[-1] if tree.visits else None
        n_tries = len(last.tries) if last else 0
        note = (f"All {plural(n_tries, 'child', 'children')} tried here were rejected, so the target sampled this token "
                f"from what was left of its distribution (the residual r).")
    elif extra.kind == "bonus":
        note = "The accepted path reached a leaf: the verify pass already gave p there, so this token is free."
    else:
        note = "Nothing was drafted: one target step."
    tip = tip_html(f"{extra.kind.capitalize()} · {tok_repr(extra.text)}", [("id", str(extra.id)), ("p(x)", fsig(extra.p))],
               note=note)
    kind = extra.kind if extra.kind in ("correction", "bonus", "target") else "target"
    return f'<span class="sv-extra"><span class="sv-arrow" aria-hidden="true">→</span>{chip_html(kind, extra.text, tip)}</span>'


def tree_html(rnd: Round, step: int | None = None) -> str:
    """The round's tree as nested flex rows (escaped HTML).  ``step``: see the module docstring."""
    tree = rnd.tree
    if tree is None:
        return '<div class="sv-tree sv-empty">This round has no tree (a chain round).</div>'
    depth, events, total, step = _timeline(rnd, step)
    shown_depth = min(step, depth)
    done = events[: max(step - depth, 0)]
    verifying = step > depth
    finished = step >= total and bool(events)  # a round still drafting (no verdict yet) stays pending
    status: dict[int, str] = {}
    tried_at: dict[int, list[int]] = {}
    decided = set()  # nodes where the rule has moved on (a child accepted) or ended (the extra token)
    for e in done:
        if e.j < 0:
            decided.add(tree.path[-1] if tree.path else -1)
            continue
        t = tree.visits[e.visit].tries[e.j]
        status[e.node] = "accepted" if t.accepted else "rejected"
        tried_at.setdefault(e.node, []).append(e.j)
        if t.accepted:
            decided.add(tree.visits[e.visit].node)
    extra_shown = bool(done) and done[-1].j < 0
    # The child the last step tried, while the walk is still under way (not on the finished round).
    current = done[-1].node if done and not finished and done[-1].j >= 0 else None

    def node_status(k: int) -> str:
        if k in status:
            return status[k]
        if finished:
            return "discarded"
        if not verifying:
            return "pending"
        parent = tree.nodes[k].parent
        if parent == -1 or status.get(parent) == "accepted":  # the rule is at the parent, or was
            return "discarded" if parent in decided else "pending"
        return "pending" if node_status(parent) == "pending" else "discarded"

    def subtree(node: int) -> str:
        kids = [k for k in _children(tree, node) if tree.nodes[k].depth <= shown_depth]
        parts = [_node_chip(tree, k, node_status(k), tried_at.get(k, []), tree.mode, current=k == current)
                 for k in kids]
        rows = []
        for k, chip in zip(kids, parts):
            rows.append(f'<div style="{_ROW}">{chip}{subtree(k)}</div>')
        at_end = extra_shown and node == (tree.path[-1] if tree.path else -1)
        if at_end:
            rows.append(f'<div style="{_ROW}">{_extra_chip(rnd)}</div>')
        return f'<div style="{_KIDS}">{"".join(rows)}</div>' if rows else ""

    root = ('<span class="sv-chip sv-chip--mini sv-target" data-status="root" tabindex="0"><span class="sv-tok">prefix</span>'
            + tip_html("The text so far", [], note="The tree's root: every node attends to the whole prefix and to its own ancestors.")
            + "</span>")
    head = (f'<div class="sv-rounds-head"><span>Round {rnd.index + 1} · '
            f'{esc(MODE_LABELS.get(tree.mode, tree.mode))} · '
            f'{esc(plural(len(tree.nodes), "node"))}, depth {depth}</span>'
            + (f'<span>{esc(f"verify pass {fsec(tree.t_forward)} for {tree.fed} tokens")}</span>' if verifying else "")
            + "</div>")
    return (f'<div class="sv-tree" data-step="{step}" data-steps="{total}" style="overflow-x:auto">{head}'
            f'<div style="{_ROW}">{root}{subtree(-1)}</div></div>')


def tree_narration(rnd: Round, step: int | None = None) -> str:
    """One line of plain text for a step (escape it before putting it in HTML)."""
    tree = rnd.tree
    if tree is None:
        return "A chain round: no tree."
    depth, events, total, step = _timeline(rnd, step)
    if step == 0:
        return f"Round {rnd.index + 1}: the draft model grows a tree of up to {depth} levels."
    if step <= depth:
        level = [n for n in tree.nodes if n.depth == step]
        line = (f"Drafting depth {step}: {plural(len(level), 'node')} "
                f"({', '.join(tok_repr(n.text) for n in level[:6])}{', …' if len(level) > 6 else ''})")
        why = (tree_stop_sentence(rnd.draft_stop) or None) if step == depth and rnd.positions else None
        return f"{line}; it stops growing: {why}." if why else f"{line}."
    e = events[step - depth - 1]
    v = tree.visits[e.visit]
    where = "after the prefix" if v.node < 0 else f"at {tok_repr(tree.nodes[v.node].text)}"
    if e.j < 0:
        extra = rnd.extra
        if extra.kind == "bonus":
            return f"The path reached a leaf: bonus {tok_repr(extra.text)} sampled from p {where}, for free."
        return f"Every child {where} was rejected: correction {tok_repr(extra.text)} sampled from the residual r."
    t = v.tries[e.j]
    tok = tok_repr(tree.nodes[e.node].text)
    su, sb = fpair(t.u, t.b)
    head = f"{where[0].upper()}{where[1:]}, child {e.j + 1} of {_planned(tree, v.node)} ({tok}, r={fnum(t.r, 2)}, q={fnum(t.q, 2)})"
    if t.accepted:
        return f"{head} accepted: u={su} < b={sb}; move to {tok}."
    gone = [tok_repr(tree.nodes[x.node].text) for x in v.tries[: e.j + 1]]
    if tree.mode == "iid":
        rest = f"r ← norm(max(0, r − q)) loses q's mass, so {tok} can no longer be accepted here"
    elif tree.mode == "unique":
        gone = ", ".join(dict.fromkeys(gone))
        rest = f"the residual now excludes {gone}, and the next child was drawn from q without {gone}"
    else:
        rest = f"the residual now excludes {', '.join(dict.fromkeys(gone))}"
    return f"{head} rejected: u={su} ≥ b={sb}; {rest}."


def tree_mask_figure(rnd: Round | None) -> go.Figure:
    """Heat map of the verify pass's attention mask: row = a tree node, column = the prefix or a
    node; filled where the row may attend (the prefix, its ancestors and itself)."""
    title = "Tree attention mask"
    if rnd is None or rnd.tree is None or not rnd.tree.nodes:
        return empty_figure(title, "No tree round yet")
    nodes = rnd.tree.nodes
    labels = [f"{k}·d{n.depth} {tok_repr(n.text, 12)}" for k, n in enumerate(nodes)]
    on_path = set(rnd.tree.path)
    mask = attention_mask([n.parent for n in nodes])
    z = [[1.0] + [(1.0 + (a in on_path and k in on_path)) if seen else 0.0 for a, seen in enumerate(row)]
         for k, row in enumerate(mask)]
    fig = go.Figure(go.Heatmap(
        z=z, x=["prefix"] + labels, y=labels, zmin=0, zmax=2, showscale=False, xgap=1, ygap=1,
        colorscale=[[0, "rgba(128,128,128,0.10)"], [0.5, COLORS["bonus"]], [1, COLORS["accepted"]]],
        hovertemplate="%{y} attends to %{x}<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    return compact_layout(fig, title, "key: the prefix and tree nodes", "query: tree node",
                  subtitle="0 where a node may attend, the dtype's minimum elsewhere; green: the accepted path",
                  legend=False)
