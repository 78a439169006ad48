"""Token trees: the draft tree (its lossless multi-candidate verification, the rule below, is
:func:`specviz.core.verify.verify_tree`, beside the chain's).

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

import torch

from ...core.verify import ROOT


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
