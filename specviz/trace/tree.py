"""The token tree of a tree-drafter round, as plain trace data (see specviz.trace.model's schema).

Its own module so that specviz.trace.model only gains an optional `Round.tree` field:
the types are checked by pydantic (a TypeAdapter over these dataclasses), the
tree's shape (parents before children, depths, the path and the visits along
it) by `parse_tree`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, Field, StrictBool, StrictFloat, StrictInt, StrictStr, TypeAdapter, ValidationError

from ..core.settings import TREE_MODES, TREE_NODES_MAX


def _probability(v: float) -> float:
    if not -1e-6 <= v <= 1 + 1e-6:  # NaN fails too
        raise ValueError(f"{v} is not a probability")
    return float(v)


def _seconds(v: float) -> float:
    if not 0 <= v < float("inf"):
        raise ValueError("seconds must be finite and not negative")
    return float(v)


Prob = Annotated[Union[StrictInt, StrictFloat], AfterValidator(_probability)]
Secs = Annotated[Union[StrictInt, StrictFloat], AfterValidator(_seconds)]
Count = Annotated[StrictInt, Field(ge=0)]
Text = Annotated[StrictStr, Field(max_length=1000)]


@dataclass
class TreeNode:
    id: StrictInt
    text: Text
    parent: StrictInt  # -1: a child of the last emitted token
    depth: StrictInt  # 1-based
    q: Prob  # q(x) at the parent (the warped draft distribution)
    conf: Prob | None = None  # the draft's temperature-1 probability of the token
    draws: Count = 1  # i.i.d. draws that landed on this node


PICTURE_MAX = 32  # tokens in one try's acceptance picture


@dataclass
class TryPicture:
    """The acceptance picture of one child tried (version 3; specviz.core.picture.try_picture): the top
    tokens by max(r, q_j), always with the child's token and p's argmax."""

    ids: list[Annotated[StrictInt, Field(ge=0, lt=2**31)]]
    text: list[Text]
    p: list[Prob]  # the target's p at the visited node
    r: list[Prob]  # r before this try (p at the first child; after each rejection norm(max(0, r − q_j)))
    q: list[Prob]  # q_j, what this child was drawn from
    res: list[Prob]  # norm(max(0, r − q_j)): r for the next child, or the correction's distribution


@dataclass
class TreeTry:
    node: StrictInt
    q: Prob  # q_j(x): what the child was drawn from, given the earlier children
    r: Prob  # r(x) before this try (r starts as p and loses each rejected q_j)
    b: Prob  # min(1, r / q)
    u: Prob
    accepted: StrictBool
    picture: TryPicture | None = None  # version 3


@dataclass
class TreeVisit:
    node: StrictInt  # -1: the root
    reject_prob: Prob  # P(every child tried here is rejected)
    tv: Prob  # TV(p, q) at this node
    tries: list[TreeTry] = field(default_factory=list)


@dataclass
class RoundTree:
    mode: Literal[TREE_MODES]
    nodes: Annotated[list[TreeNode], Field(max_length=TREE_NODES_MAX)] = field(default_factory=list)
    visits: list[TreeVisit] = field(default_factory=list)
    path: list[StrictInt] = field(default_factory=list)  # the accepted nodes, root to deepest
    fed: Count = 0  # tokens fed to the target in the verify pass
    t_forward: Secs = 0.0  # seconds of that target forward pass


_ADAPTER = TypeAdapter(RoundTree)


def parse_tree(data: Any, gamma: int) -> RoundTree:
    """Validate a round's "tree" object; ValueError("tree.<where>: <what>") otherwise."""
    try:
        tree = _ADAPTER.validate_python(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in err["loc"])
        raise ValueError(f"tree{where}: {err['msg']}") from None
    nodes = tree.nodes
    for k, n in enumerate(nodes):
        if not -1 <= n.parent < k:
            raise ValueError(f"tree.nodes[{k}].parent: must be -1 or an earlier node")
        if n.depth != (1 if n.parent < 0 else nodes[n.parent].depth + 1) or n.depth > gamma:
            raise ValueError(f"tree.nodes[{k}].depth: does not match its parent or exceeds γ")
    for k, node in enumerate(tree.path):
        if not 0 <= node < len(nodes) or nodes[node].parent != (tree.path[k - 1] if k else -1):
            raise ValueError("tree.path: not a path from the root")
    if len(tree.visits) > len(tree.path) + 1:
        raise ValueError("tree.visits: more visits than nodes on the path")
    for k, v in enumerate(tree.visits):
        if v.node != (tree.path[k - 1] if k else -1):
            raise ValueError(f"tree.visits[{k}].node: visits follow the accepted path")
        for j, t in enumerate(v.tries):
            if not 0 <= t.node < len(nodes) or nodes[t.node].parent != v.node:
                raise ValueError(f"tree.visits[{k}].tries[{j}].node: not a child of the visited node")
            pic = t.picture
            if pic is not None and (len(pic.ids) > PICTURE_MAX or any(
                    len(x) != len(pic.ids) for x in (pic.text, pic.p, pic.r, pic.q, pic.res))):
                raise ValueError(f"tree.visits[{k}].tries[{j}].picture: its lists must all hold the same number "
                                 f"(≤ {PICTURE_MAX}) of tokens")
    return tree


def attention_mask(parents: list[int]) -> list[list[bool]]:
    """Which tree node may attend to which: itself and its ancestors (the prefix is visible to all).
    Row i, column j: node i sees node j.  ``parents[i]``: node i's parent, -1 for a child of the
    prefix's last token.  What the verify pass's 4D mask encodes (specviz.core.kv.CachedLM.feed_tree)."""
    out = []
    for i in range(len(parents)):
        row = [False] * len(parents)
        node = i
        while node >= 0:
            row[node] = True
            node = parents[node]
        out.append(row)
    return out
