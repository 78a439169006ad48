"""One round of tree speculative decoding, for the engine's loop (specviz.core.engine).

draft a tree (TreeDrafter.grow, one yield per depth) → one target forward over
the uncached suffix and every node (tree mask) → the multi-candidate rule
(specviz.core.verify.verify_tree) → both caches keep the accepted path only.

The round is recorded twice: `Round.tree` holds the whole tree and the rule at
each visited node; the chain fields hold the accepted path as if it had been a
chain (draft = the path, plus the last child tried where all were rejected;
one Position per visited node; emitted = the path's tokens and the correction
or bonus with the usual origins), so the race and every metric read a tree run
unchanged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from ..trace import DraftToken, Extra, Position, Round, Token
from ..trace.tree import RoundTree, TreeNode, TreeTry, TreeVisit
from .drafting import DraftContext
from .picture import try_picture
from .policy import Policy, RoundReport
from .sampling import Warp, sample
from .verify import ROOT, TreeVerdict, verify_tree


def _nodes(tree: Any, piece: Callable[[int], str]) -> list[TreeNode]:
    depth: list[int] = []
    for par in tree.parents:
        depth.append(1 if par == ROOT else depth[par] + 1)
    return [TreeNode(tok, piece(tok), par, d, min(q, 1.0), min(c, 1.0), n)
            for tok, par, d, q, c, n in zip(tree.tokens, tree.parents, depth, tree.q_tok, tree.conf, tree.draws)]


@dataclass(kw_only=True)
class TreeRun:
    """What a tree round needs from the run it is part of (built once per run, by keyword).

    ``ids`` is the run's token list: each round extends it with what it emitted, as the chain's
    rounds extend theirs in the engine."""

    drafter: Any  # a TreeDrafter
    target: Any  # the target's CachedLM (token trees need its 4D masks)
    ids: list[int]
    warp: Warp
    gen: torch.Generator
    device: torch.device
    eos: set[int]
    piece: Callable[[int], str]  # token id -> its text
    detok: Any  # the run's Detokenizer
    clock: Callable[[], float]
    mode: str  # settings.tree_mode, as the trace names it
    tracing: float = 0.0  # seconds spent on the acceptance pictures since the engine last collected them

    def round(self, rnd: Round, limit: int, gamma: int, policy: Policy) -> Iterator[None]:
        """Draft, verify, emit and roll back; yields after each drafted depth.  Returns
        True when the text ended (an end-of-text token was emitted).  The draft-length
        policy shapes the tree (specviz.core.policy) and learns from the round's verdicts."""
        ids, clock, piece = self.ids, self.clock, self.piece
        tree = None
        passes: list[tuple[int, float]] = []  # (nodes fed, seconds) of each draft pass
        rnd.draft_stop = "none"
        if limit > 0:
            ctx = DraftContext(ids, limit, self.warp, self.gen, self.device)
            t_level = rnd.t_start
            for tree in self.drafter.grow(ctx, self.eos, policy):
                now = clock()
                if tree.forwards > len(passes):  # one draft pass since the last depth: time it
                    passes.append((tree.passes[-1], now - t_level))
                t_level = now
                # While drafting, the chain fields show the tree's main line.
                rnd.draft = [DraftToken(tree.tokens[n], piece(tree.tokens[n]), min(tree.q_tok[n], 1.0),
                                        min(tree.conf[n], 1.0)) for n in tree.first_line()]
                rnd.tree = RoundTree(self.mode, _nodes(tree, piece))
                rnd.draft_forwards = tree.forwards
                rnd.t_draft = clock() - rnd.t_start
                yield
            stop = tree.stop if tree is not None and tree.stop else "exhausted"
            rnd.draft_stop = ("budget" if limit < gamma else "limit") if stop == "limit" else stop
        t_v0 = clock()
        rnd.t_draft = t_v0 - rnd.t_start
        # The first round's pass also reads the prompt: per-pass cost estimates leave it out.
        # (a long prompt's chunks were fed before: the rest of it, core.kv.feed_prompt)
        rnd.prompt_fed = max(0, len(ids) - 1 - self.target.cached) if rnd.index == 0 else 0
        if tree is None or not len(tree):  # nothing drafted: a plain target step
            rnd.tree = None
            rnd.draft = []
            fed = len(ids) - self.target.cached
            p = self.warp(self.target.feed(ids).logits[-1])
            y = sample(p, self.gen, self.warp.greedy)
            rnd.extra = Extra(y, piece(y), "target", float(p[y]))
            rnd.emitted.append(Token(y, self.detok.push(y), "target"))
            keep = len(ids)
            ids.append(y)
            self.target.crop(keep)
            self.drafter.rollback(keep)
            rnd.t_end = clock()
            rnd.t_verify = rnd.t_end - t_v0
            policy.observe(RoundReport(verdicts=[], drafted=0, t_draft=rnd.t_draft, draft_forwards=rnd.draft_forwards,
                                       fed=fed, t_verify=None if rnd.prompt_fed else rnd.t_verify))
            return y in self.eos

        fed = len(ids) - self.target.cached + len(tree)
        out = self.target.feed_tree(ids, tree.tokens, tree.parents)
        p = self.warp(out.logits)  # row 0: after the prefix; row i + 1: after node i
        t_forward = clock() - t_v0
        spent = [0.0]

        def picture(**kw):  # the acceptance picture of each try: the explainer's, timed as tracing
            t0 = time.perf_counter()
            out = try_picture(piece=self.piece, **kw)
            spent[0] += time.perf_counter() - t0
            return out

        v = verify_tree(tree, p, self.gen, self.warp.greedy, self.eos, picture=picture)
        self.tracing += spent[0]
        self._record(rnd, tree, p, v, fed, t_forward)
        base = len(ids)
        for n in v.path:
            tok = tree.tokens[n]
            rnd.emitted.append(Token(tok, self.detok.push(tok), "accepted"))
            ids.append(tok)
        done = v.extra is None  # the path ended in an end of text
        if v.extra is not None:
            y = v.extra
            rnd.extra = Extra(y, piece(y), v.extra_kind, float(p[v.extra_node + 1][y]))
            rnd.emitted.append(Token(y, self.detok.push(y), v.extra_kind))
            ids.append(y)
            done = y in self.eos
        # Both caches keep the prefix and the accepted path (the extra token is fed next round).
        self.target.keep_path(v.path)
        self.drafter.keep_path(v.path)
        assert self.target.cached == base + len(v.path)
        rnd.t_end = clock()
        rnd.t_verify = rnd.t_end - t_v0
        # The first child tried at each visited node is the policy's verdict, as a chain's token is:
        # "the draft's best guess here, at this confidence, was accepted or not".  (A later child is
        # tried only after the first was rejected, so its verdict answers a conditional question
        # and would flatten the calibration.)  The round was "full" when the path reached the bottom.
        depth = max(n.depth for n in rnd.tree.nodes)
        policy.observe(RoundReport(
            verdicts=[(tree.conf[vis.tries[0].node], vis.tries[0].accepted) for vis in v.visits], drafted=depth,
            t_draft=rnd.t_draft, draft_forwards=rnd.draft_forwards, fed=fed,
            t_verify=None if rnd.prompt_fed else rnd.t_verify, full=len(v.path) >= depth,
            passes=passes[1:]))  # the first pass fed the suffix
        return done

    def _record(self, rnd: Round, tree: Any, p: torch.Tensor, v: TreeVerdict, fed: int,
                t_forward: float) -> None:
        piece = self.piece
        visits = [TreeVisit(vis.node, min(max(vis.reject_prob, 0.0), 1.0), vis.tv,
                            [TreeTry(t.node, min(t.q, 1.0), min(t.r, 1.0), t.b, t.u, t.accepted, t.picture)
                             for t in vis.tries])
                  for vis in v.visits]
        rnd.tree = RoundTree(self.mode, _nodes(tree, piece), visits, list(v.path), fed, t_forward)
        # The chain view of the round: one position per visited node.
        rnd.draft, rnd.positions = [], []
        for i, vis in enumerate(v.visits, 1):
            t = vis.tries[-1]  # the accepted try, or the last one rejected
            tok = tree.tokens[t.node]
            rnd.draft.append(DraftToken(tok, piece(tok), min(tree.q_tok[t.node], 1.0), min(tree.conf[t.node], 1.0)))
            p_x = float(p[vis.node + 1][tok])
            rnd.positions.append(Position(i, min(t.q, 1.0), min(p_x, 1.0), t.b, t.u, t.accepted,
                                          min(max(vis.reject_prob, 0.0), 1.0), vis.tv, 0.0))
