"""Token trees: the draft tree and its lossless multi-candidate verification.

A tree round drafts many continuations at once (specviz.drafters.tree.drafter), the
target scores every node in one forward pass with a tree attention mask
(specviz.core.kv.CachedLM.feed_tree), and this rule walks down from the root
(SpecInfer's multi-step speculative sampling; Yin et al.'s batch speculative
decoding).  At a node whose target distribution is p::

    r ← p
    for each child j, in an order fixed before p is seen:
        accept x_j with probability min(1, r(x_j) / q_j(x_j)) → move to that child
        otherwise r ← norm(max(0, r − q_j))
    all children rejected: emit a correction ~ r;  at a leaf: emit a bonus ~ p

q_j is what child j was drawn from given the earlier children:

- "iid" (M draft sequences sampled from q): q_j = q.  Duplicates share a node
  but every draw is a try of its own (a repeated token after a rejection is
  rejected surely: r(x) = 0 by then).
- "best-first" (deterministic top-k children): q_j = δ_{x_j}, so x_j is accepted with
  probability r(x_j), and a rejection zeroes x_j in r and renormalises.
- "unique" (distinct children sampled from q without replacement): q_j is q
  with the earlier children's tokens removed and renormalised, which is what
  child j was drawn from.  A rejection leaves r(x_j) = 0 (rejecting needs
  r(x_j) < q_j(x_j)), so no later child can repeat it anyway.

Either way the emitted token at every node has exactly the target's
distribution (temperature, top-k and top-p included, as the same warp makes p
and q).  In greedy mode p is one-hot, so the walk follows the child equal to
argmax p.  Over-acceptance ε is a chain-only setting (DecodeSettings refuses it
for the tree).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ...core.sampling import residual, sample

ROOT = -1  # the parent index of a child of the last emitted token


@dataclass
class DraftTree:
    """A draft tree as the drafter built it (tensors; the trace keeps plain numbers).

    Nodes are numbered in the order they were created, parents before children."""

    mode: str  # one of core.settings.TREE_MODES ("iid" | "best-first" | "unique"): what each child was drawn from (the rule's q_j)
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # ROOT or an earlier node
    q_tok: list[float] = field(default_factory=list)  # q(x) of the node's token at its parent (warped)
    conf: list[float] = field(default_factory=list)  # the draft's temperature-1 probability of the token
    draws: list[int] = field(default_factory=list)  # i.i.d. draws that landed on this node (1 for best-first, unique)
    # node (ROOT too) -> its children in the order the rule tries them; for "iid" one
    # entry per draw, so a node drawn twice appears twice
    tries: dict[int, list[int]] = field(default_factory=dict)
    dist: dict[int, torch.Tensor] = field(default_factory=dict)  # node -> warped draft distribution q there
    forwards: int = 0  # draft forward passes spent
    passes: list[int] = field(default_factory=list)  # tokens or nodes each of those passes fed
    stop: str | None = None  # why it stopped growing (a key of specviz.core.settings.DRAFT_STOPS)

    def __len__(self) -> int:
        return len(self.tokens)

    def depth(self, node: int) -> int:
        d = 0
        while node != ROOT:
            node, d = self.parents[node], d + 1
        return d

    def add(self, token: int, parent: int, q_tok: float, conf: float) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.q_tok.append(q_tok)
        self.conf.append(conf)
        self.draws.append(0)
        return len(self.tokens) - 1

    def child(self, parent: int, token: int) -> int | None:
        for j in set(self.tries.get(parent, [])):
            if self.tokens[j] == token:
                return j
        return None

    def first_line(self) -> list[int]:
        """The path through every node's first child: the tree's main line while it is drafted."""
        out, node = [], ROOT
        while self.tries.get(node):
            node = self.tries[node][0]
            out.append(node)
        return out

    def subtree(self, keep: list[int]) -> "DraftTree":
        """The tree restricted to `keep` (ancestor-closed), renumbered in the same order."""
        keep = sorted(keep)
        new = {old: k for k, old in enumerate(keep)}
        new[ROOT] = ROOT
        out = DraftTree(self.mode, forwards=self.forwards, passes=self.passes, stop=self.stop)
        for old in keep:
            out.tokens.append(self.tokens[old])
            out.parents.append(new[self.parents[old]])
            out.q_tok.append(self.q_tok[old])
            out.conf.append(self.conf[old])
            out.draws.append(self.draws[old])
        for node, kids in self.tries.items():
            if node in new and any(k in new for k in kids):
                out.tries[new[node]] = [new[k] for k in kids if k in new]
        out.dist = {new[n]: d for n, d in self.dist.items() if n in new}
        return out


@dataclass
class Try:
    """One child tried at a visited node."""

    node: int
    q: float  # q_j(x_j)
    r: float  # r(x_j) before this try
    b: float  # min(1, r / q)
    u: float
    accepted: bool
    picture: Any = None  # what `picture` (verify's argument) made of the try: the acceptance picture


@dataclass
class Visit:
    """The rule at one node of the accepted path."""

    node: int  # ROOT or a tree node
    tries: list[Try]
    reject_prob: float  # P(every child tried here is rejected), over the draft's draws
    tv: float  # TV(p, q) at this node (q = the draft's distribution there)


@dataclass
class TreeVerdict:
    path: list[int]  # accepted nodes, root to deepest
    visits: list[Visit]
    extra: int | None  # the correction or bonus token (None: the path ended in an end of text)
    extra_kind: str  # "correction" | "bonus"
    extra_node: int  # the node whose distribution gave the extra token (ROOT or a tree node)
    extra_dist: torch.Tensor | None  # what it was sampled from (r after the rejections, or p)


def q_for_try(tree: DraftTree, node: int, child: int, like: torch.Tensor) -> torch.Tensor:
    """q_j: the distribution child j was drawn from (`like` gives shape and device)."""
    if tree.mode == "iid":
        return tree.dist[node]
    if tree.mode == "unique":  # q without the children drawn before this one, renormalised
        q = tree.dist[node].clone()
        for k in tree.tries[node]:
            if k == child:
                break
            q[tree.tokens[k]] = 0.0
        return q / q.sum()
    q = torch.zeros_like(like)
    q[tree.tokens[child]] = 1.0
    return q


def all_rejected_prob(p: torch.Tensor, tree: DraftTree, node: int) -> float:
    """P(every child tried at `node` is rejected).  For i.i.d. children the residual
    r_m = norm(max(0, r_{m−1} − q)) does not depend on the tokens drawn, so it is
    Π_m TV(q, r_{m−1}) averaged over the draws (Yin et al.'s batch recursion).
    Otherwise it is the probability given the children drawn, Π_j (1 − min(1, r_j(x_j) / q_j(x_j)))
    (for deterministic children 1 − Σ_j p(x_j)); for children drawn without replacement its
    mean over rounds estimates the probability over the draws without bias."""
    kids = tree.tries.get(node, [])
    if tree.mode == "best-first":
        return float(max(0.0, 1.0 - float(sum(p[tree.tokens[j]] for j in set(kids)))))
    if tree.mode == "unique":
        r, prob = p, 1.0
        for child in kids:
            qj = q_for_try(tree, node, child, p)
            x = tree.tokens[child]
            q_x = float(qj[x])
            prob *= 1.0 - (min(1.0, float(r[x]) / q_x) if q_x > 0 else 1.0)
            if prob <= 0.0:
                return 0.0
            r = residual(r, qj)
        return min(max(prob, 0.0), 1.0)
    q, r, prob = tree.dist[node], p, 1.0
    for _ in kids:
        prob *= float(0.5 * (q - r).abs().sum())
        r = residual(r, q)
    return min(max(prob, 0.0), 1.0)


def verify(tree: DraftTree, p: torch.Tensor, gen: torch.Generator, greedy: bool, eos: set[int],
           picture: Callable[..., Any] | None = None) -> TreeVerdict:
    """Walk the tree with the multi-candidate rule.  p: [len(tree) + 1, V], row 0 the
    target's distribution after the prefix (the root), row i + 1 after node i.  ``picture(p=, r=, q=,
    x=)``, when given, is called at every try (before r moves on) for the explainer's picture."""
    node, path, visits = ROOT, [], []

    def p_at(n: int) -> torch.Tensor:
        return p[n + 1]

    while True:
        kids = tree.tries.get(node, [])
        if not kids:  # a leaf: the verify pass already gave p here, a free token
            return TreeVerdict(path, visits, sample(p_at(node), gen, greedy), "bonus", node, p_at(node))
        pn = p_at(node)
        q_node = tree.dist.get(node)
        tv = float(0.5 * (pn - q_node).abs().sum()) if q_node is not None else float("nan")
        visit = Visit(node, [], all_rejected_prob(pn, tree, node), min(max(tv, 0.0), 1.0))
        visits.append(visit)
        r = pn
        u_all = torch.rand(len(kids), generator=gen, device=pn.device).tolist()
        nxt = None
        for j, child in enumerate(kids):
            x = tree.tokens[child]
            qj = q_for_try(tree, node, child, pn)
            q_x, r_x = float(qj[x]), float(r[x])
            b = min(1.0, r_x / q_x) if q_x > 0 else 1.0
            ok = u_all[j] < b
            pic = picture(p=pn, r=r, q=qj, x=x) if picture is not None else None
            visit.tries.append(Try(child, q_x, r_x, b, u_all[j], ok, pic))
            if ok:
                nxt = child
                break
            r = residual(r, qj)
        if nxt is None:
            return TreeVerdict(path, visits, sample(r, gen, greedy), "correction", node, r)
        node = nxt
        path.append(node)
        if tree.tokens[node] in eos:  # an accepted end of text ends the text: no extra token
            return TreeVerdict(path, visits, None, "", node, None)
