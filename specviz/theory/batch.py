"""Yin et al. Thm 3: batch drafts at one position — M i.i.d. drafts from q verified in turn.

The exact probability that every draft is rejected, its floor, and the Monte Carlo that checks
both (the emitted token is distributed as p: the procedure is exact).  The tree drafter's "iid"
mode is this rule at every node (`specviz.core.verify.verify_tree`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..core.sampling import residual, verdicts
from .formulas import as_dist, check_gamma, torch_generator

__all__ = [
    "batch_rejection_exact",
    "batch_rejection_floor",
    "batch_sample",
    "batch_rejection_mc",
]


def batch_rejection_exact(p: Any, q: Any, M: int) -> list[float]:
    """P(all of the first m i.i.d. drafts from q are rejected), for m = 1..M.

    Drafts are verified in turn against a residual that shrinks after each
    rejection: r_0 = p, r_m = norm(max(0, r_{m−1} − q)).  Draft m is rejected
    with probability TV(q, r_{m−1}) whatever token was drafted (the residual
    does not depend on it), so P(all m rejected) = Π_{k=1..m} TV(q, r_{k−1}).
    (Derived for the notes and checked by `batch_rejection_mc`; the batch
    algorithm is Yin et al. Thm 3.)  Returns a list of length M; [-1] is M.

    The product never increases, and never drops below
    `batch_rejection_floor` (the mass of p where q is 0).  When q covers all
    of p's support it does tend to 0, but only geometrically at rate
    1 − q(x*), x* the token where p/q is largest — slowly when the draft
    rarely proposes it: extra drafts mostly repeat tokens already rejected.
    """
    pp, qq = as_dist(p, "p"), as_dist(q, "q")
    m_max = check_gamma(M, lo=1)
    r, prob, out = pp, 1.0, []
    for _ in range(m_max):
        prob *= float(0.5 * (qq - r).abs().sum())
        out.append(prob)
        r = residual(r, qq)
    return out


def batch_rejection_floor(p: Any, q: Any) -> float:
    """Σ_{x: q(x) = 0} p(x): a lower bound on P(all M drafts rejected) for every M
    (such tokens are never drafted yet are emitted with probability p(x), which
    requires rejecting every draft), and the limit as M → ∞."""
    pp, qq = as_dist(p, "p"), as_dist(q, "q")
    return float(pp[qq <= 0].sum())


def batch_sample(
    p: Any, q: Any, M: int, n: int, gen: torch.Generator | int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Monte Carlo of batch verification at one position, n independent times.

    Up to M drafts x_m ~ q i.i.d.; draft m is accepted with
    min(1, r_{m−1}(x)/q(x)) (`verdicts` of r_{m−1} against q at ε = 0); on
    rejection the residual is updated (`verdicts(...).fallback`); if all M are
    rejected the token is drawn from r_M.  Returns (number of drafts rejected
    before acceptance, in 0..M, [n]; emitted token [n]).  The emitted token is
    distributed as p (the procedure is exact).
    """
    pp, qq = as_dist(p, "p"), as_dist(q, "q")
    m_max, k = check_gamma(M, lo=1), int(n)
    gen = torch_generator(gen)
    n_rejected = torch.zeros(k, dtype=torch.long)
    token = torch.full((k,), -1, dtype=torch.long)
    alive = torch.ones(k, dtype=torch.bool)
    r = pp
    for _ in range(m_max):
        v = verdicts(r.unsqueeze(0), qq.unsqueeze(0), 0.0, "opt")
        x = torch.multinomial(qq, k, replacement=True, generator=gen)
        u = torch.rand(k, generator=gen, dtype=torch.float64)
        acc = alive & (u < v.b[0][x])
        token = torch.where(acc, x, token)
        alive = alive & ~acc
        n_rejected += alive.long()
        r = v.fallback[0]
        if not alive.any():
            break
    last = torch.multinomial(r, k, replacement=True, generator=gen)
    token = torch.where(alive, last, token)
    return n_rejected, token


def batch_rejection_mc(
    p: Any, q: Any, M: int, n: int, gen: torch.Generator | int | None = None
) -> tuple[list[float], list[float]]:
    """Monte Carlo estimate of `batch_rejection_exact`: for m = 1..M, the
    fraction of n runs whose first m drafts were all rejected, and its
    binomial standard error √(f(1 − f)/n)."""
    n_rejected, _ = batch_sample(p, q, M, n, gen)
    k = n_rejected.numel()
    fr = [float((n_rejected >= m).double().mean()) for m in range(1, int(M) + 1)]
    return fr, [math.sqrt(max(f * (1 - f), 0.0) / k) for f in fr]
