"""Judge a drafted chain: the three verification rules of `specviz.core.rules`, on tensors.

`verify_chain` is a pure function of the drafted tokens, q, the target's logits and the generator's
state; the engine calls it once a round.  Every rule draws its randomness in the same order (k
uniforms, then one draw for the correction or bonus), so one seed gives the same uniforms whatever the
rule: "same draft, same draws, three rules".
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .rules import RULES, DraftOdds
from .sampling import Warp, greedy_rule, rule_stats, sample, verdicts


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
        target_ids = logits.argmax(-1).tolist()
        rows = greedy_rule(target_ids[:k], tokens, epsilon)
        odds, whole = [], 1.0
        for t, x in zip(target_ids[:k], tokens):
            whole *= float(t == x)
            odds.append(DraftOdds(q=1.0, p=float(t == x), h=whole))
        u = torch.rand(k, generator=generator, device=logits.device).tolist() if k else []
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
        u = torch.rand(k, generator=generator, device=logits.device).tolist()
        n, judged = _judge_in_order(rows, u)
        dist = v.fallback[n] if n < k else p_all[k]
    elif rule == "match":
        t0 = time.perf_counter()
        reject = (1.0 - (q * p_all[:k]).sum(-1)).clamp(0.0, 1.0).tolist()
        tracing += time.perf_counter() - t0
        rows = list(zip(p_x.tolist(), p_x.tolist(), q_x.tolist(), reject, tv, [0.0] * k))
        u = torch.rand(k, generator=generator, device=logits.device).tolist()
        n, judged = _judge_in_order(rows, u)
        dist = without_token(p_all[n], tokens[n]) if n < k else p_all[k]
    else:  # block
        u = torch.rand(k, generator=generator, device=logits.device).tolist()
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
