"""The tree drafter: the draft model grows a tree of continuations, verified in one target pass.

Three ways to grow it (settings.tree_mode; γ is the depth, settings.tree_nodes the node budget):

- "iid": M = settings.branches draft sequences of length up to γ, each token
  sampled from q (Yin et al.'s batch drafts), merged into a prefix tree:
  sequences that drew the same tokens share nodes, and every draw counts as a
  try of its own in the rule (specviz.drafters.tree.structure).  How many sequences continue at a
  depth is decided before drawing there (the node budget caps it), never from
  the tokens drawn, so the draws at each node stay i.i.d. from q — which the
  rule's exactness needs.  In greedy mode every draw is the argmax, so the tree
  is a chain.
- "best-first" (EAGLE-2's dynamic tree): each expanded node gets its top-k
  children (k = branches) by the draft's probability, the k new nodes with the
  highest cumulative draft probability are expanded at the next depth, and at
  the end the `tree_nodes` nodes with the highest cumulative probability are
  kept (an ancestor always scores at least as high as its descendants, so that
  is a tree).  The children are deterministic: the rule uses one-hot q_j.
- "unique": each expanded node gets up to M = branches distinct children,
  sampled from q without replacement (child j from q without the earlier
  children, renormalised: the rule's q_j), and the M new nodes with the highest
  cumulative draft probability are expanded at the next depth.  How many
  children a node gets is fixed before drawing there (M, the tokens q can give,
  the nodes the budget has left after one is kept for each deeper level), never
  pruned afterwards, so the draws at each node stay as the rule assumes.  In
  greedy mode q is one-hot: a chain.

Each depth level is one draft forward over all the nodes being expanded, with a
tree attention mask (specviz.core.kv.CachedLM.feed_tree).  After the verdict the
draft cache keeps the accepted path only (`keep_path`).  The engine drives this
drafter through `grow` (one yield per depth, so the page can show the tree
growing) instead of the chain contract's `draft`.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator

import torch

from ...core.kv import CachedLM
from ...core.policy import Policy
from ...core.sampling import sample
from ...core.settings import TREE_MODES, DecodeSettings
from ..base import DraftContext, Drafter
from .structure import ROOT, DraftTree


class TreeDrafter(Drafter):
    round_kind = "tree"  # the engine runs a tree round (specviz.core.tree_round) for this drafter

    def __init__(self, model: torch.nn.Module, device: torch.device, mode: str = "best-first", branches: int = 2,
                 max_nodes: int = 16, name: str = "draft model"):
        if mode not in TREE_MODES:
            raise ValueError(f"unknown tree mode {mode!r}")
        self.lm = CachedLM(model, device)
        self.mode, self.branches, self.max_nodes = mode, int(branches), int(max_nodes)
        label = {"iid": f"{self.branches} i.i.d. drafts", "best-first": f"best-first, top-{self.branches}",
                 "unique": f"{self.branches} distinct draws per node"}[mode]
        self.name = f"{name} · tree ({label}, ≤{self.max_nodes} nodes)"
        self.fed: dict[int, int] = {}  # tree node -> its index among the tree nodes in the draft cache

    @classmethod
    def for_pair(cls, pair: Any, settings: Any) -> "TreeDrafter":
        return cls(pair.draft, pair.device, settings.tree_mode, settings.branches, settings.tree_nodes,
                   name=pair.draft_name)

    def start(self, ids: list[int], should_stop: Callable[[], bool] | None = None) -> None:
        from ...core.kv import feed_prompt
        from ...models.draft_vocab import prepare

        self.lm.free()
        prepare(self.lm.model, ids)  # a reduced head also keeps this prompt's ids (models.draft_vocab)
        feed_prompt(self.lm, ids, should_stop)  # a long prompt in chunks, stoppable between them
        self.lm.prefill(ids)

    # ---- growing the tree ------------------------------------------------------------

    def _expand(self, ids: list[int], tree: DraftTree, nodes: list[int], warp: Any) -> dict[int, torch.Tensor]:
        """One draft forward over `nodes` (ROOT alone: the prefix); their raw logits.
        Stores each node's warped distribution in tree.dist."""
        if nodes == [ROOT]:
            tree.passes.append(len(ids) - self.lm.cached)
            logits = self.lm.feed(ids).logits[-1:]
        else:
            parents = [self.fed[tree.parents[n]] if tree.parents[n] != ROOT else -1 for n in nodes]
            start = len(self.lm.tree_parents)
            tree.passes.append(len(nodes))
            logits = self.lm.feed_tree(ids, [tree.tokens[n] for n in nodes], parents).logits
            for k, n in enumerate(nodes):
                self.fed[n] = start + k
        tree.forwards += 1
        out = {}
        for n, row in zip(nodes, logits):
            tree.dist[n] = warp(row)
            out[n] = row
        return out

    def grow(self, ctx: DraftContext, eos: set[int], policy: Policy | None = None) -> Iterator[DraftTree]:
        """Yield the tree after each depth level; the last one is final (≤ ctx.max_tokens deep).
        The draft-length policy decides whether to grow deeper and, for best-first trees, how
        many nodes to keep (None: the constant policy, depth γ and the node budget)."""
        self.fed = {}
        grow = {"iid": self._grow_iid, "best-first": self._grow_best_first, "unique": self._grow_unique}[self.mode]
        yield from grow(ctx, eos, policy or Policy(DecodeSettings()))

    def _grow_iid(self, ctx: DraftContext, eos: set[int], policy: Policy) -> Iterator[DraftTree]:
        tree = DraftTree("iid")
        raw = self._expand(ctx.ids, tree, [ROOT], ctx.warp)
        value = {ROOT: 1.0}  # the chance the walk accepts the node (policy.tree_value along its path)
        alive = [ROOT] * self.branches  # where each sequence stands
        for depth in range(1, ctx.max_tokens + 1):
            # Each draw may add a node: cap the sequences that go on before drawing,
            # by their index only (the draws at a node must stay i.i.d. from q).
            alive = alive[: max(self.max_nodes - len(tree), 0)]
            if not alive:
                tree.stop = "nodes"
                break
            new_alive = []
            for node in dict.fromkeys(alive):  # distinct nodes, in sequence order
                count = alive.count(node)
                q = tree.dist[node]
                if ctx.warp.greedy:
                    xs = [sample(q, ctx.gen, True)] * count
                else:
                    xs = torch.multinomial(q, count, replacement=True, generator=ctx.gen).tolist()
                conf = torch.softmax(raw[node].float(), -1) if ctx.warp.greedy else q
                for x in xs:
                    child = tree.child(node, x)
                    if child is None:
                        child = tree.add(x, node, float(q[x]), float(conf[x]))
                        value[child] = value[node] * policy.tree_value(float(conf[x]), float(q[x]))
                    tree.draws[child] += 1
                    tree.tries.setdefault(node, []).append(child)
                    new_alive.append((node, child))
            # Keep sequence order: sequences at the same node drew in order.
            order = {n: [c for p, c in new_alive if p == n] for n in dict.fromkeys(alive)}
            alive = [order[n].pop(0) for n in alive]
            alive = [n for n in alive if tree.tokens[n] not in eos]  # nothing follows an end of text
            yield tree
            if depth == ctx.max_tokens or not alive:
                tree.stop = "limit" if alive else "eos"
                break
            # Whether to go deeper is decided from what was drawn so far, before any draw
            # below: the draws at each node stay i.i.d. from q.
            # (All or nothing: the sequences that go on are chosen by index only.)
            if not _width(policy, tree, value, sorted(dict.fromkeys(alive), key=lambda n: (-value[n], n))):
                break
            raw = self._expand(ctx.ids, tree, list(dict.fromkeys(alive)), ctx.warp)

    def _grow_best_first(self, ctx: DraftContext, eos: set[int], policy: Policy) -> Iterator[DraftTree]:
        tree = DraftTree("best-first")
        k = self.branches
        raw = self._expand(ctx.ids, tree, [ROOT], ctx.warp)
        value = {ROOT: 1.0}  # the chance the walk accepts the node: policy.tree_value along its path
        frontier = [ROOT]
        for depth in range(1, ctx.max_tokens + 1):
            new = []
            for node in frontier:
                # Rank children by the draft's warped q (the temperature-1 one in greedy
                # mode, where q is one-hot); a token with q = 0 is never worth a node.
                conf = torch.softmax(raw[node].float(), -1)
                rank = conf if ctx.warp.greedy else tree.dist[node]
                probs, toks = torch.topk(rank, min(k, rank.numel()))
                for pr, x in zip(probs.tolist(), toks.tolist()):
                    if pr <= 0:
                        break
                    child = tree.add(x, node, float(tree.dist[node][x]), float(conf[x]))
                    tree.draws[child] = 1
                    tree.tries.setdefault(node, []).append(child)
                    value[child] = value[node] * policy.tree_value(float(conf[x]), pr)
                    new.append(child)
            if not new:
                tree.stop = "exhausted"
                break
            yield tree
            if depth == ctx.max_tokens:
                tree.stop = "limit"
                break
            expand = sorted((n for n in new if tree.tokens[n] not in eos), key=lambda n: (-value[n], n))[:k]
            if not expand:
                tree.stop = "eos"
                break
            # Nothing deeper can enter the final tree once the budget is full of nodes that
            # all score higher than the best candidate (descendants never score higher).
            kept = sorted(value[n] for n in range(len(tree)))[-self.max_nodes :]
            if len(tree) >= self.max_nodes and value[expand[0]] <= kept[0]:
                tree.stop = "nodes"
                break
            width = _width(policy, tree, value, expand)
            if not width:
                break
            expand = expand[:width]  # the policy may expand fewer (each costs a row of the draft pass)
            raw = self._expand(ctx.ids, tree, expand, ctx.warp)
            frontier = expand
        # Verify the most valuable nodes (a node never scores above its parent, and ties go
        # to the older node, so they form a tree): the node budget, or fewer if the policy
        # says more are not worth their verify cost.
        order = sorted(range(len(tree)), key=lambda n: (-value[n], n))
        keep = order[: min(self.max_nodes, policy.tree_keep([value[n] for n in order], tree.forwards))]
        if len(keep) < len(tree):
            renum = {old: new for new, old in enumerate(sorted(keep))}
            tree = tree.subtree(keep)
            self.fed = {renum[n]: slot for n, slot in self.fed.items() if n in renum}
            yield tree

    def _grow_unique(self, ctx: DraftContext, eos: set[int], policy: Policy) -> Iterator[DraftTree]:
        tree = DraftTree("unique")
        k = self.branches
        raw = self._expand(ctx.ids, tree, [ROOT], ctx.warp)
        score = {ROOT: 0.0}  # log of the cumulative draft probability (of the warped q)
        value = {ROOT: 1.0}  # the chance the walk accepts the node (policy.tree_value along its path)
        frontier = [ROOT]
        for depth in range(1, ctx.max_tokens + 1):
            new = []
            # Leave one node of the budget for each level below, so the main line can reach depth γ.
            reserve = ctx.max_tokens - depth
            for i, node in enumerate(frontier):
                q = tree.dist[node]
                # The count is fixed before drawing (exactness): never more than q's support.
                room = self.max_nodes - len(tree)
                m = min(k, int((q > 0).sum()), max(room - reserve, 1 if i == 0 else 0), room)
                if m <= 0:
                    continue
                # Sequential draws without replacement (each from q without the earlier ones,
                # renormalised), in draw order: torch's weighted sampling without replacement.
                xs = torch.multinomial(q, m, replacement=False, generator=ctx.gen).tolist()
                conf = torch.softmax(raw[node].float(), -1) if ctx.warp.greedy else q
                for x in xs:
                    child = tree.add(x, node, float(q[x]), float(conf[x]))
                    tree.draws[child] = 1
                    tree.tries.setdefault(node, []).append(child)
                    score[child] = score[node] + math.log(max(float(q[x]), 1e-30))
                    value[child] = value[node] * policy.tree_value(float(conf[x]), float(q[x]))
                    new.append(child)
            if not new:
                tree.stop = "exhausted"
                break
            yield tree
            expand = sorted((n for n in new if tree.tokens[n] not in eos), key=lambda n: (-score[n], n))[:k]
            if depth == ctx.max_tokens or not expand or len(tree) >= self.max_nodes:
                tree.stop = "limit" if depth == ctx.max_tokens else "eos" if not expand else "nodes"
                break
            if not _width(policy, tree, value, expand):  # all or nothing (the next level's room is fixed)
                break
            raw = self._expand(ctx.ids, tree, expand, ctx.warp)
            frontier = expand

    # ---- after the verdict -------------------------------------------------------------

    def keep_path(self, path: list[int]) -> None:
        """Keep the prefix and the accepted path's nodes that were fed (a prefix of the path:
        a node is fed only to expand it, and its ancestors were expanded before it)."""
        fed = []
        for n in path:
            if n not in self.fed:
                break
            fed.append(self.fed[n])
        self.lm.keep_path(fed)
        self.fed = {}

    def rollback(self, n: int) -> None:
        self.lm.crop(n)

    def free(self) -> None:
        self.lm.free()
        self.fed = {}


def _width(policy: Policy, tree: DraftTree, value: dict[int, float], candidates: list[int]) -> int:
    """How many of `candidates` (best first) the policy expands at the next level; when none,
    the tree stops growing and records the policy's reason."""
    width, why = policy.tree_expand([(value[n], tree.conf[n]) for n in candidates],
                                    [value[n] for n in range(len(tree))], tree.forwards)
    if not width:
        tree.stop = why
    return width
