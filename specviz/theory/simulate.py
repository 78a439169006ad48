"""Simulations that check the closed forms of `specviz.theory.formulas`, and the synthetic
distributions they (and the Theory tab) run on.

Each runs the algorithm itself, with the rule from `specviz.core.sampling.verdicts`, never the
formula it checks: Monte Carlo of the idealised round (tokens per round), of Yin et al.'s Thm 1
(rejections along a Markov-chain text) and of one position of the rule (exactness, ε's bias).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..core.sampling import Warp, verdicts
from .formulas import check_alpha, as_dist, check_gamma, torch_generator

__all__ = [
    "simulate_tokens_per_round",
    "RejectionSim",
    "simulate_rejections",
    "synthetic_pair",
    "synthetic_chain",
    "speculative_emit",
]


# ---- Leviathan et al.: tokens per round ----------------------------------------------------------


def simulate_tokens_per_round(alpha: float, gamma: int, rounds: int, rng: np.random.Generator | int | None = None) -> np.ndarray:
    """Monte Carlo of the idealised round: γ i.i.d. Bernoulli(α) acceptances,
    stop at the first rejection, then one correction/bonus token.

    Returns the tokens emitted by each of `rounds` rounds (ints in 1..γ+1);
    their mean estimates `expected_tokens_per_round`, with standard error
    std/√rounds.  Simulates the process directly (uniforms and a running
    product), not via the geometric distribution, so it checks the formula.
    """
    a, g = check_alpha(alpha), check_gamma(gamma)
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    n = int(rounds)
    if n < 1:
        raise ValueError("rounds must be ≥ 1")
    if g == 0:
        return np.ones(n, dtype=np.int64)
    ok = rng.random((n, g)) < a
    # Drafts are only accepted up to the first rejection: a running AND.
    accepted = np.cumprod(ok, axis=1).sum(axis=1)
    return accepted.astype(np.int64) + 1


# ---- Yin et al. Thm 1: rejections along a text ---------------------------------------------------


@dataclass
class RejectionSim:
    """Result of `simulate_rejections` (means over runs, with standard errors)."""

    n_runs: int
    mean_rejections: float
    se_rejections: float
    mean_sum_tv: float  # E[Σ TV over verified positions]: Thm 1's prediction
    se_sum_tv: float
    mean_sum_reject_prob: float  # E[Σ r over verified positions] (= TV sum at ε = 0)
    se_sum_reject_prob: float
    mean_verified: float  # verified positions per run (< T when bonus tokens occur)


def _rows_at(table: torch.Tensor, n: int, prev: torch.Tensor) -> torch.Tensor:
    """Distribution rows for position n: fixed [T, V] or Markov [T, V, V] (row = previous token)."""
    if table.ndim == 2:
        return table[n].expand(prev.shape[0], -1)
    return table[n, prev]


def simulate_rejections(
    p_rows: Any,
    q_rows: Any,
    n_runs: int,
    gen: torch.Generator | int | None = None,
    *,
    gamma: int | None = None,
    epsilon: float = 0.0,
    variant: str = "opt",
) -> RejectionSim:
    """Check Yin et al. Thm 1 by running the algorithm on synthetic distributions.

    p_rows, q_rows: target and draft distributions for T positions, either
    [T, V] (the same at every prefix) or [T, V, V] where row [n, y] is the
    distribution at position n after the previous token y (a Markov chain, the
    abstraction of Yin et al.; the first position conditions on token 0).

    The text is generated sequentially as the real algorithm does: at each
    position draft x ~ q, accept with b(x) (from `specviz.core.sampling.verdicts`),
    otherwise emit a correction from the fallback; the emitted token is the
    context of the next position.  With `gamma`, positions are grouped into
    rounds of γ drafts and after γ acceptances the next position is a bonus
    token ~ p, which is not verified (and so cannot be rejected).

    Returns the mean number of rejections next to the mean of Σ TV over the
    verified positions (equal in expectation at ε = 0 by Thm 1) and of Σ r,
    the rejection probability (equal in expectation for any ε).
    """
    p = as_dist(p_rows, "p_rows")
    q = as_dist(q_rows, "q_rows")
    if p.shape != q.shape or p.ndim not in (2, 3) or (p.ndim == 3 and p.shape[1] != p.shape[2]):
        raise ValueError("p_rows and q_rows must both be [T, V] or [T, V, V]")
    g = None if gamma is None else check_gamma(gamma, lo=1)
    n = int(n_runs)
    if n < 2:
        raise ValueError("n_runs must be ≥ 2")
    gen = torch_generator(gen)
    T, V = p.shape[0], p.shape[-1]
    # Evaluate the rule once for every row: the same code the engine runs.
    v = verdicts(p.reshape(-1, V), q.reshape(-1, V), float(epsilon), variant)
    shape = p.shape[:-1]
    b, fallback = v.b.reshape(p.shape), v.fallback.reshape(p.shape)
    tv, rprob = v.tv.reshape(shape), v.reject_prob.reshape(shape)

    prev = torch.zeros(n, dtype=torch.long)
    run_len = torch.zeros(n, dtype=torch.long)  # drafts accepted so far in the current round
    rejections = torch.zeros(n, dtype=torch.float64)
    sum_tv = torch.zeros(n, dtype=torch.float64)
    sum_r = torch.zeros(n, dtype=torch.float64)
    n_verified = torch.zeros(n, dtype=torch.float64)
    runs = torch.arange(n)
    for t in range(T):
        verified = torch.ones(n, dtype=torch.bool) if g is None else run_len < g
        x = torch.multinomial(_rows_at(q, t, prev), 1, generator=gen).squeeze(1)
        u = torch.rand(n, generator=gen, dtype=torch.float64)
        accept = u < _rows_at(b, t, prev)[runs, x]  # u < b, as in the engine
        correction = torch.multinomial(_rows_at(fallback, t, prev), 1, generator=gen).squeeze(1)
        bonus = torch.multinomial(_rows_at(p, t, prev), 1, generator=gen).squeeze(1)
        token = torch.where(verified, torch.where(accept, x, correction), bonus)
        rejected = verified & ~accept
        rejections += rejected.double()
        sum_tv += verified.double() * (tv[t] if tv.ndim == 1 else tv[t, prev])
        sum_r += verified.double() * (rprob[t] if rprob.ndim == 1 else rprob[t, prev])
        n_verified += verified.double()
        # A rejection or a bonus token ends the round; an acceptance extends it.
        run_len = torch.where(verified & accept, run_len + 1, torch.zeros_like(run_len))
        prev = token

    def mse(x: torch.Tensor) -> tuple[float, float]:
        return float(x.mean()), float(x.std(unbiased=True) / math.sqrt(n))

    m_rej, se_rej = mse(rejections)
    m_tv, se_tv = mse(sum_tv)
    m_r, se_r = mse(sum_r)
    return RejectionSim(n, m_rej, se_rej, m_tv, se_tv, m_r, se_r, float(n_verified.mean()))


# ---- synthetic distributions ---------------------------------------------------------------------


def synthetic_pair(
    vocab: int = 16,
    seed: int = 0,
    closeness: float = 0.7,
    temperature: float = 1.0,
    top_k: int = 0,
    spread: float = 2.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A (p, q) pair of distributions over `vocab` tokens, for demonstrations.

    Target logits z ~ N(0, spread²); draft logits closeness·z + √(1 − closeness²)·z'
    with independent z' (closeness 1 → q = p, 0 → unrelated).  Both go through
    `specviz.core.sampling.Warp(temperature, top_k)`, as the app warps both models
    identically; with top_k > 0 the two keep different token sets, so p puts
    mass where q has none — the situation where batch drafting saturates.
    Returns float64 tensors [vocab].
    """
    if int(vocab) < 2:
        raise ValueError("vocab must be ≥ 2")
    rho = float(closeness)
    if not 0.0 <= rho <= 1.0:
        raise ValueError("closeness must be in [0, 1]")
    g = torch_generator(int(seed))
    z = torch.randn(int(vocab), generator=g, dtype=torch.float64) * spread
    z2 = torch.randn(int(vocab), generator=g, dtype=torch.float64) * spread
    zq = rho * z + math.sqrt(max(0.0, 1.0 - rho * rho)) * z2
    warp = Warp(temperature=float(temperature), top_k=int(top_k))
    return as_dist(warp(z), "p"), as_dist(warp(zq), "q")


def synthetic_chain(
    length: int = 8, vocab: int = 6, seed: int = 0, closeness: float = 0.6, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Markov-chain target and draft: p_rows, q_rows [length, vocab, vocab],
    row [n, y] = distribution at position n after token y (Yin et al.'s
    abstraction), each row a `synthetic_pair`.  For `simulate_rejections`."""
    ps, qs = [], []
    for k in range(int(length) * int(vocab)):
        p, q = synthetic_pair(vocab, seed=int(seed) * 100_003 + k, closeness=closeness, temperature=temperature)
        ps.append(p)
        qs.append(q)
    shape = (int(length), int(vocab), int(vocab))
    return torch.stack(ps).reshape(shape), torch.stack(qs).reshape(shape)


# ---- one position of the rule --------------------------------------------------------------------


def speculative_emit(
    p: Any, q: Any, epsilon: float = 0.0, variant: str = "opt", n: int = 10_000, gen: torch.Generator | int | None = None
) -> torch.Tensor:
    """Run one position of speculative sampling n times; return the emitted tokens [n].

    Draft x ~ q, accept iff u < b(x), else emit y ~ P (the fallback), with b
    and P from `specviz.core.sampling.verdicts`.  Its histogram should match p at
    ε = 0 and `emitted_distribution` at any ε.
    """
    pp, qq = as_dist(p, "p"), as_dist(q, "q")
    gen = torch_generator(gen)
    v = verdicts(pp.unsqueeze(0), qq.unsqueeze(0), float(epsilon), variant)
    m = int(n)
    x = torch.multinomial(qq, m, replacement=True, generator=gen)
    u = torch.rand(m, generator=gen, dtype=torch.float64)
    y = torch.multinomial(v.fallback[0], m, replacement=True, generator=gen)
    return torch.where(u < v.b[0][x], x, y)
