"""Judge a drafted chain: the three verification rules of `specviz.core.rules`, on tensors.

`verify_chain` is a pure function of the drafted tokens, q, the target's logits and the generator's
state; the engine calls it once a round.  Every rule draws its randomness in the same order (k
uniforms, then one draw for the correction or bonus), so one seed gives the same uniforms whatever the
rule: "same draft, same draws, three rules".
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .rules import RULES, DraftOdds
from .sampling import Warp, argmax, greedy_rule, residual, rule_stats, sample, verdicts


@dataclass
class Judged:
    """One drafted position as the rule judged it: x drawn from q; the rule's number b and the uniform u.

    token and match: accepted iff u < b, with b = min(1, (p(x) + ε) / q(x)) or b = p(x).
    block: b = h_i and the kept prefix ends at the last position with u < b, so an earlier position
    is kept even when its own u ≥ b (a later token made up for it)."""

    i: int  # 1-based position in the draft
    q: float  # q(x)
    p: float  # p(x)
    b: float  # the rule's acceptance number at this position (see above)
    u: float  # the uniform draw
    accepted: bool
    reject_prob: float  # token: r = 1 − Σ q·b; match: 1 − Σ q·p; block: 1 − h_i (for this draft)
    tv: float  # TV(p, q)
    bias: float  # TV(emitted distribution, p): 0 for every rule at ε = 0


@dataclass
class ChainVerdict:
    """What a rule made of one chain.

    ``accepted`` drafted tokens are kept; then ``token`` follows: a *correction* at the first
    rejection, a *bonus* drawn from p_{k+1} when all k pass, or the target's own token when nothing
    was drafted (``kind`` "target").  ``token`` is None when the kept tokens end in a stop token
    (nothing may follow an end of text).  ``odds`` holds every drafted token's q(x), p(x) and block's
    h, for the "same draft, three rules" comparison (`specviz.core.rules.expected_kept`)."""

    accepted: int
    token: int | None
    kind: str | None  # "correction" | "bonus" | "target" | None
    p_token: float  # p(token) at its position (1.0 under greedy decoding)
    judged: list[Judged]  # the positions judged: the kept ones, then the first not kept (if any)
    tracing_seconds: float = 0.0  # time spent on the explainer's statistics, not on deciding
    odds: list[DraftOdds] = field(default_factory=list)
    # What the rule computed, kept for the acceptance picture (specviz.core.picture) so it is not computed
    # twice: p_1..p_{k+1} after the warp (None under greedy decoding) and block's weights w_1..w_k.
    p_all: torch.Tensor | None = field(default=None, repr=False, compare=False)
    weights: list[float] | None = field(default=None, repr=False, compare=False)


def block_weights(p_all: torch.Tensor, q: torch.Tensor, p_x: torch.Tensor, q_x: torch.Tensor):
    """Block verification's running weights w_1..w_k and h_1..h_k (see `specviz.core.rules`).

    p_all [k + 1, V], q [k, V]; p_x, q_x [k] the drafted tokens' probabilities.  Returns two
    float lists."""
    k = q.shape[0]
    ratio = (p_x.double() / q_x.double().clamp_min(1e-30)).tolist()
    w, weights = 1.0, []
    for r in ratio:
        w = min(1.0, w * r)
        weights.append(w)
    h = []
    if k > 1:
        wt = torch.tensor(weights[:-1], dtype=p_all.dtype, device=p_all.device).unsqueeze(-1)
        s = torch.minimum(wt * p_all[1:k], q[1:k]).sum(-1).double().tolist()  # S_i, i = 1..k-1
        for w_i, s_i in zip(weights[:-1], s):
            den = 1.0 - s_i
            h.append(1.0 if den <= 1e-12 else min(1.0, max(0.0, (w_i - s_i) / den)))
    h.append(weights[-1])  # h_k = w_k
    return weights, h


def block_residual(w: float, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, w·p − q)): where block verification draws the token after a kept prefix of weight w."""
    diff = (w * p - q).clamp_min(0.0)
    mass = float(diff.sum())
    return diff / mass if mass > 1e-12 else p


def without_token(p: torch.Tensor, x: int) -> torch.Tensor:
    """p with token x removed, renormalised: the target's own sample given that it is not x."""
    rest = p.clone()
    rest[x] = 0.0
    mass = rest.sum()
    return rest / mass if float(mass) > 1e-12 else p


def verify_chain(*, tokens: list[int], q: torch.Tensor | None, logits: torch.Tensor, warp: Warp,
                 epsilon: float, variant: str, generator: torch.Generator,
                 stop_tokens: frozenset[int] | set[int] = frozenset(), rule: str = "token") -> ChainVerdict:
    """Judge a drafted chain under ``rule`` ("token", "block" or "match").

    Shapes: ``tokens`` k drafted ids; ``q`` [k, V] the draft's (warped) distributions they were
    drawn from (None when k = 0 or under greedy decoding, where only ids matter); ``logits``
    [k + 1, V] the target's raw logits at the k drafted positions and the one after them.
    ε and Decoding-UNO apply to the token rule only.
    Randomness, in this order: k uniforms u (always, also under greedy decoding, so a seed gives
    the same draws whatever the temperature or rule), then one draw for the correction or bonus.
    """
    assert rule in RULES, rule
    assert rule == "token" or (epsilon == 0.0 and variant == "opt"), "ε and UNO apply to the token rule only"
    k = len(tokens)
    if warp.greedy:  # one-hot p and q: every rule keeps the prefix matching the target's argmax
        target_ids = argmax(logits).tolist()
        rows = greedy_rule(target_ids[:k], tokens, epsilon)
        odds, whole = [], 1.0
        for t, x in zip(target_ids[:k], tokens):
            whole *= float(t == x)
            odds.append(DraftOdds(q=1.0, p=float(t == x), h=whole))
        u = torch.rand(k, generator=generator, device=logits.device, dtype=torch.float32).tolist() if k else []
        n, judged = _judge_in_order(rows, u)
        kind = "correction" if n < k else ("bonus" if k else "target")
        if n and tokens[n - 1] in stop_tokens:
            return ChainVerdict(n, None, None, 0.0, judged, 0.0, odds)
        return ChainVerdict(n, target_ids[n], kind, 1.0, judged, 0.0, odds)

    p_all = warp(logits)  # p_1 .. p_{k+1}
    if not k:
        y = sample(p_all[0], generator)
        return ChainVerdict(0, y, "target", float(p_all[0][y]), [], 0.0, [], p_all)
    assert q is not None and q.shape[0] == k, "q must hold one distribution per drafted token"
    xs = torch.tensor(tokens, device=logits.device)
    at = torch.arange(k, device=logits.device)
    p_x, q_x = p_all[at, xs], q[at, xs]
    t0 = time.perf_counter()
    weights, h = block_weights(p_all, q, p_x, q_x)
    tracing = 0.0 if rule == "block" else time.perf_counter() - t0  # block decides with h; the others only show it
    odds = [DraftOdds(q=qq, p=pp, h=hh) for qq, pp, hh in zip(q_x.tolist(), p_x.tolist(), h)]
    t0 = time.perf_counter()
    tv = (0.5 * (p_all[:k] - q).abs().sum(-1)).clamp(0.0, 1.0).tolist()
    tracing += time.perf_counter() - t0

    if rule == "token":
        v = verdicts(p_all[:k], q, epsilon, variant, detail=False)
        t0 = time.perf_counter()  # the explainer's statistics, timed as tracing cost
        reject, _, bias = rule_stats(p_all[:k], q, v.b, v.fallback)
        tracing += time.perf_counter() - t0
        rows = list(zip(v.b[at, xs].tolist(), p_x.tolist(), q_x.tolist(), reject.tolist(), tv, bias.tolist()))
        u = torch.rand(k, generator=generator, device=logits.device, dtype=torch.float32).tolist()
        n, judged = _judge_in_order(rows, u)
        dist = v.fallback[n] if n < k else p_all[k]
    elif rule == "match":
        t0 = time.perf_counter()
        reject = (1.0 - (q * p_all[:k]).sum(-1)).clamp(0.0, 1.0).tolist()
        tracing += time.perf_counter() - t0
        rows = list(zip(p_x.tolist(), p_x.tolist(), q_x.tolist(), reject, tv, [0.0] * k))
        u = torch.rand(k, generator=generator, device=logits.device, dtype=torch.float32).tolist()
        n, judged = _judge_in_order(rows, u)
        dist = without_token(p_all[n], tokens[n]) if n < k else p_all[k]
    else:  # block
        u = torch.rand(k, generator=generator, device=logits.device, dtype=torch.float32).tolist()
        n = max((i + 1 for i in range(k) if u[i] < h[i]), default=0)  # τ: the last position that passes
        judged = [Judged(i=i + 1, q=odds[i].q, p=odds[i].p, b=h[i], u=u[i], accepted=i < n,
                         reject_prob=1.0 - h[i], tv=tv[i], bias=0.0) for i in range(min(n + 1, k))]
        dist = block_residual(1.0 if n == 0 else weights[n - 1], p_all[n], q[n]) if n < k else p_all[k]
    kind = "correction" if n < k else "bonus"
    if n and tokens[n - 1] in stop_tokens:
        return ChainVerdict(n, None, None, 0.0, judged, tracing, odds, p_all, weights)
    y = sample(dist, generator)
    return ChainVerdict(n, y, kind, float(p_all[n][y]), judged, tracing, odds, p_all, weights)


def _judge_in_order(rows, u) -> tuple[int, list[Judged]]:
    """Position by position, accepted iff u < b, up to and including the first rejection."""
    judged, n = [], len(rows)
    for i, (b_x, p_x, q_x, r_i, tv_i, bias_i) in enumerate(rows):
        ok = u[i] < b_x
        judged.append(Judged(i=i + 1, q=q_x, p=p_x, b=b_x, u=u[i], accepted=ok, reject_prob=r_i, tv=tv_i,
                             bias=bias_i))
        if not ok:
            n = i
            break
    return n, judged


# ---- token trees: the multi-candidate rule (the tree itself: specviz.drafters.tree.structure.DraftTree) ----
# A tree round drafts many continuations at once, the target scores every node in one pass (a tree
# attention mask: CachedLM.feed_tree), and this rule walks down from the root (SpecInfer's multi-step
# speculative sampling; Yin et al.'s batch speculative decoding); structure.py's docstring derives it.
# ``tree`` is a DraftTree: mode, tokens, tries (node -> children in the order tried), dist (node -> q).

ROOT = -1  # the parent index of a child of the last emitted token


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


def q_for_try(tree: Any, node: int, child: int, like: torch.Tensor) -> torch.Tensor:
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


def all_rejected_prob(p: torch.Tensor, tree: Any, node: int) -> float:
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


def verify_tree(tree: Any, p: torch.Tensor, gen: torch.Generator, greedy: bool, eos: set[int],
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
        u_all = torch.rand(len(kids), generator=gen, device=pn.device, dtype=torch.float32).tolist()
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
