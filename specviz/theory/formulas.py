"""The theory behind speculative decoding, as plain functions.

No UI and no models: these functions compute (and check by simulation) the
formulas the workshop teaches, so that every plot of a real run can be put
next to what the theory predicts.

Notation (Leviathan et al. 2023, used throughout specviz): p = target
distribution, q = draft distribution, γ = draft length, α = mean acceptance
probability, c = cost of a draft forward / cost of a standard one-token
target step, v = cost of a verify pass / that step (the verify factor: 1 in
the paper, several steps on a compute-bound CPU), ε = over-acceptance threshold.  Chen et al. (2023) and Yin et al. (NeurIPS
2024) swap p and q; the formulas below are rewritten in our letters.

Sources:
- Leviathan, Kalman, Matias, "Fast Inference from Transformers via
  Speculative Decoding" (ICML 2023): tokens per round, Thm 3.8 (wall time),
  Thm 3.11 (arithmetic operations), choice of γ.
- Yin, Chen, Huang, Wang, "A Theoretical Perspective for Speculative Decoding
  Algorithm" (NeurIPS 2024): Thm 1 (expected rejections = Σ TV), Thm 3 (batch
  drafts), Thms 4–5 (rejection/bias Pareto front under over-acceptance).

The acceptance rule itself is never re-implemented here: it comes from
`specviz.core.sampling` (`verdicts`, `residual`), the code the engine runs.

Why one file of ~600 lines: each formula sits next to the simulation that
checks it, and the tests and the Theory tab read them as one set; splitting
by paper would separate a theorem from its check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from ..core.sampling import Warp, residual, verdicts
from ..trace import Trace, theoretical_speedup

__all__ = [
    "expected_tokens_per_round",
    "expected_speedup",
    "speculation_helps",
    "optimal_gamma",
    "arithmetic_cost_factor",
    "sweep_theory",
    "simulate_tokens_per_round",
    "expected_rejections",
    "Theorem1Series",
    "theorem1_series",
    "running_tv_vs_rejections",
    "RejectionSim",
    "simulate_rejections",
    "tv_distance",
    "synthetic_pair",
    "synthetic_chain",
    "emitted_distribution",
    "speculative_emit",
    "pareto_front",
    "tradeoff_point",
    "pareto_points",
    "batch_rejection_exact",
    "batch_rejection_floor",
    "batch_sample",
    "batch_rejection_mc",
]


# ---- validation -------------------------------------------------------------------


def _alpha(alpha: float) -> float:
    a = float(alpha)
    if not (math.isfinite(a) and 0.0 <= a <= 1.0):
        raise ValueError(f"alpha must be a probability in [0, 1], not {alpha!r}")
    return a


def _gamma(gamma: int, lo: int = 0) -> int:
    if isinstance(gamma, bool) or int(gamma) != gamma or gamma < lo:
        raise ValueError(f"gamma must be a whole number ≥ {lo}, not {gamma!r}")
    return int(gamma)


def _cost(c: float, name: str = "c") -> float:
    x = float(c)
    if not (math.isfinite(x) and x >= 0.0):
        raise ValueError(f"{name} must be a finite number ≥ 0, not {c!r}")
    return x


def _dist(x: Any, name: str) -> torch.Tensor:
    """A probability vector [V] (or rows [..., V]) as float64, renormalised.

    float64 because the batch recursion subtracts nearly equal numbers many
    times; the engine works in float32, which is fine for one position."""
    t = torch.as_tensor(x, dtype=torch.float64)
    if t.ndim < 1 or t.shape[-1] < 1:
        raise ValueError(f"{name} must be a probability vector")
    if not torch.isfinite(t).all() or (t < 0).any():
        raise ValueError(f"{name} must hold finite non-negative numbers")
    mass = t.sum(-1, keepdim=True)
    if (mass <= 0).any():
        raise ValueError(f"{name} has a row with zero mass")
    return t / mass


def tv_distance(p: Any, q: Any) -> float:
    """Total variation distance ½ Σ_x |p(x) − q(x)| between two vectors."""
    return float(0.5 * (_dist(p, "p") - _dist(q, "q")).abs().sum())


# ---- Leviathan et al.: tokens per round, speedup, cost, choice of γ ------------------


def expected_tokens_per_round(alpha: float, gamma: int) -> float:
    """E[tokens emitted per round] = (1 − α^(γ+1)) / (1 − α); γ + 1 at α = 1.

    Leviathan et al. §3.1 (Eq. 1), assuming the acceptances are i.i.d. with
    mean α.  A round emits the accepted drafts plus one correction or bonus
    token, so it is 1 + (number of successes before the first failure, capped
    at γ).

    Thm 3.8 with c = 0 (free drafts) *is* the tokens per round, so this reuses
    the one implementation in `specviz.trace.model.theoretical_speedup` rather than
    writing the formula a second time.
    """
    a, g = _alpha(alpha), _gamma(gamma)
    if g == 0:
        return 1.0  # no drafts: every round is one ordinary decoding step
    return float(theoretical_speedup(a, g, 0.0))


def expected_speedup(alpha: float, gamma: int, c: float, v: float = 1.0) -> float:
    """Expected wall-time improvement factor (Leviathan et al. Thm 3.8), with a verify factor v:

        (1 − α^(γ+1)) / ((1 − α)(γc + v))

    A round drafts γ tokens (γc standard steps) and runs one verify pass (v standard steps), and
    emits (1 − α^(γ+1)) / (1 − α) tokens on average, each of which standard decoding pays one
    step for.  So c = cost(draft token) / cost(standard one-token step) and v = cost(verify pass
    over γ + 1 tokens) / cost(standard one-token step), both measured against the *standard* step.

    v = 1 is the theorem as published: it assumes a verify pass costs one step, which holds when
    the target is memory-bound (reading its weights dominates: GPUs at batch 1, CPUs with AMX
    matrix units).  On a compute-bound CPU (AVX2 only) a verify pass over six tokens measured 4.7
    steps in bf16, and speculation lost; the page measures v for each run (`specviz.theory.costs`).
    Note that dividing the draft's cost by the verify pass instead (c' = c / v) gives the textbook
    value with c', which is v times this one: it counts time in verify passes, not steps.

    Delegates to `specviz.trace.model.theoretical_speedup`, the function the run summary uses, so the
    theory tab and the run summary can never disagree.  γ = 0 is plain decoding (1.0).
    """
    a, g, cc, vv = _alpha(alpha), _gamma(gamma), _cost(c), _cost(v, "v")
    if g == 0:
        return 1.0
    if vv <= 0:
        raise ValueError(f"v must be a finite number > 0, not {v!r}")
    return float(theoretical_speedup(a, g, cc, vv))


def speculation_helps(alpha: float, c: float) -> bool:
    """True iff some γ ≥ 1 gives an expected speedup above 1 (Leviathan et al. §3.5).

    Exactly when α > c: γ = 1 then gives (1 + α)/(1 + c) > 1; and if α ≤ c,
    1 + α + … + α^γ ≤ 1 + γα ≤ 1 + γc for every γ, so no γ helps.
    """
    return _alpha(alpha) > _cost(c)


def optimal_gamma(alpha: float, c: float, gamma_max: int = 64, v: float = 1.0) -> tuple[int, float]:
    """The integer γ in 1..gamma_max maximising Thm 3.8 (with verify factor v), and its speedup.

    There is no closed form (Leviathan et al. §3.5), so this is a brute-force
    maximisation; ties go to the smaller γ (cheaper, same speed).  When no γ
    helps (α ≤ c, see `speculation_helps`) the returned speedup is ≤ 1 and the
    γ is the least bad one (usually 1): plain decoding is then faster.
    Paper examples, reproduced: c = 0.05, α = 0.6 → γ* = 4 (1.92×); α = 0.8 →
    γ* = 8 (3.09×); c = 0.1, α = 0.8 → γ* = 6 (2.47×).
    """
    a, cc, gmax = _alpha(alpha), _cost(c), _gamma(gamma_max, lo=1)
    best_g, best_s = 1, expected_speedup(a, 1, cc, v)
    for g in range(2, gmax + 1):
        s = expected_speedup(a, g, cc, v)
        if s > best_s * (1 + 1e-12):  # strict: ties keep the smaller γ
            best_g, best_s = g, s
    return best_g, best_s


def arithmetic_cost_factor(alpha: float, gamma: int, c_hat: float) -> float:
    """Factor by which total arithmetic operations grow (Leviathan et al. Thm 3.11):

        (1 − α)(γĉ + γ + 1) / (1 − α^(γ+1))

    ĉ = arithmetic operations per token of the draft / of the target.  Each
    round costs γ draft steps (γĉ) plus a target pass over γ + 1 positions,
    and emits E[tokens per round], hence (γĉ + γ + 1) / E[tokens].  It is ≥ 1:
    speculation trades extra (parallel) arithmetic for fewer serial steps.
    """
    g = _gamma(gamma)
    return (g * _cost(c_hat, "c_hat") + g + 1) / expected_tokens_per_round(alpha, g)


def sweep_theory(alpha: float, c: float, gammas: Iterable[int] | None = None, c_hat: float | None = None,
                 v: float = 1.0) -> dict[str, list]:
    """Thm 3.8 (and tokens per round, and Thm 3.11 if c_hat is given) over γ.

    Returns lists keyed gamma, tokens_per_round, speedup (and cost_factor),
    ready for plotting; gammas defaults to 1..16.  v: the verify factor, one value for every γ
    (a measured v belongs to the draft length it was measured at; on a compute-bound target it
    grows with γ).
    """
    gs = [_gamma(g) for g in (range(1, 17) if gammas is None else gammas)]
    out: dict[str, list] = {
        "gamma": gs,
        "tokens_per_round": [expected_tokens_per_round(alpha, g) for g in gs],
        "speedup": [expected_speedup(alpha, g, c, v) for g in gs],
    }
    if c_hat is not None:
        out["cost_factor"] = [arithmetic_cost_factor(alpha, g, c_hat) for g in gs]
    return out


def simulate_tokens_per_round(alpha: float, gamma: int, rounds: int, rng: np.random.Generator | int | None = None) -> np.ndarray:
    """Monte Carlo of the idealised round: γ i.i.d. Bernoulli(α) acceptances,
    stop at the first rejection, then one correction/bonus token.

    Returns the tokens emitted by each of `rounds` rounds (ints in 1..γ+1);
    their mean estimates `expected_tokens_per_round`, with standard error
    std/√rounds.  Simulates the process directly (uniforms and a running
    product), not via the geometric distribution, so it checks the formula.
    """
    a, g = _alpha(alpha), _gamma(gamma)
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


# ---- Yin et al. Thm 1: expected rejections = Σ TV ----------------------------------


def expected_rejections(tvs: Iterable[float] | torch.Tensor | np.ndarray) -> float:
    """Yin et al. Thm 1: E[rejections] = Σ_n E[TV(p_n, q_n)] along the text.

    Given the TV at each verified position (exact sampling, ε = 0), the sum is
    the expected number of rejections.  Non-finite entries (a run traced
    without statistics) are skipped.
    """
    if isinstance(tvs, torch.Tensor):
        tvs = tvs.detach().cpu().numpy()
    vals = np.asarray(tvs if isinstance(tvs, np.ndarray) else list(tvs), dtype=np.float64).ravel()
    return float(vals[np.isfinite(vals)].sum())


@dataclass
class Theorem1Series:
    """Running sums along a run's verified positions, in text order.

    index: 0-based position of the verified token in the generated text
    cum_tv: running Σ TV(p_n, q_n) (Thm 1's prediction at ε = 0)
    cum_reject_prob: running Σ r_n, r = 1 − Σ q·b, the rejection probability
        actually in force (equals TV at ε = 0; smaller for ε > 0)
    cum_var: running Σ r_n (1 − r_n), the variance of the rejection count
        given the text (a sum of Bernoulli(r_n) draws)
    cum_rejections: running count of actual rejections
    """

    index: list[int]
    cum_tv: list[float]
    cum_reject_prob: list[float]
    cum_var: list[float]
    cum_rejections: list[int]


def theorem1_series(trace: Trace | None) -> Theorem1Series:
    """Collect the running sums for Thm 1 from a speculative trace.

    Every verified position (accepted drafts and the rejected one) contributes
    its TV; bonus tokens were never drafted and corrections sit at the
    position of the rejected draft, so neither adds a term — the sum runs over
    verified positions, which is also the exact conditional expectation of
    the rejection count (at each verified position, P(reject | past) = TV at
    ε = 0).  Positions traced without statistics (NaN TV) are skipped.
    """
    out = Theorem1Series([], [], [], [], [])
    if trace is None or not getattr(trace, "rounds", None):
        return out
    tv_sum = r_sum = var_sum = 0.0
    n_rej = 0
    for rnd in trace.rounds:
        for pos in rnd.positions:
            if not (math.isfinite(pos.tv) and math.isfinite(pos.reject_prob)):
                continue
            tv_sum += pos.tv
            r_sum += pos.reject_prob
            var_sum += pos.reject_prob * (1.0 - pos.reject_prob)
            n_rej += 0 if pos.accepted else 1
            out.index.append(rnd.n_before + pos.i - 1)
            out.cum_tv.append(tv_sum)
            out.cum_reject_prob.append(r_sum)
            out.cum_var.append(var_sum)
            out.cum_rejections.append(n_rej)
    return out


def running_tv_vs_rejections(trace: Trace | None) -> tuple[list[int], list[float], list[int]]:
    """(text positions, running Σ TV, running actual rejections) for Thm 1.

    See `theorem1_series`; empty lists for None, a standard-decoding trace or
    a trace without rounds.
    """
    s = theorem1_series(trace)
    return s.index, s.cum_tv, s.cum_rejections


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
    p = _dist(p_rows, "p_rows")
    q = _dist(q_rows, "q_rows")
    if p.shape != q.shape or p.ndim not in (2, 3) or (p.ndim == 3 and p.shape[1] != p.shape[2]):
        raise ValueError("p_rows and q_rows must both be [T, V] or [T, V, V]")
    g = None if gamma is None else _gamma(gamma, lo=1)
    n = int(n_runs)
    if n < 2:
        raise ValueError("n_runs must be ≥ 2")
    gen = _torch_gen(gen)
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


# ---- synthetic distributions ----------------------------------------------------------


def _torch_gen(gen: torch.Generator | int | None) -> torch.Generator:
    if isinstance(gen, torch.Generator):
        return gen
    g = torch.Generator()
    g.manual_seed(0 if gen is None else int(gen))
    return g


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
    g = _torch_gen(int(seed))
    z = torch.randn(int(vocab), generator=g, dtype=torch.float64) * spread
    z2 = torch.randn(int(vocab), generator=g, dtype=torch.float64) * spread
    zq = rho * z + math.sqrt(max(0.0, 1.0 - rho * rho)) * z2
    warp = Warp(temperature=float(temperature), top_k=int(top_k))
    return _dist(warp(z), "p"), _dist(warp(zq), "q")


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


# ---- one position of the rule: exactness and over-acceptance -------------------------------


def emitted_distribution(p: Any, q: Any, epsilon: float = 0.0, variant: str = "opt") -> torch.Tensor:
    """A = q·b + r·P, the distribution of the token one position emits
    (Yin et al. §4; in our letters).  Equals p for OPT at ε = 0 (exactness)."""
    pp, qq = _dist(p, "p"), _dist(q, "q")
    v = verdicts(pp.unsqueeze(0), qq.unsqueeze(0), float(epsilon), variant)
    return (qq * v.b[0] + v.reject_prob[0] * v.fallback[0]).clone()


def speculative_emit(
    p: Any, q: Any, epsilon: float = 0.0, variant: str = "opt", n: int = 10_000, gen: torch.Generator | int | None = None
) -> torch.Tensor:
    """Run one position of speculative sampling n times; return the emitted tokens [n].

    Draft x ~ q, accept iff u < b(x), else emit y ~ P (the fallback), with b
    and P from `specviz.core.sampling.verdicts`.  Its histogram should match p at
    ε = 0 and `emitted_distribution` at any ε.
    """
    pp, qq = _dist(p, "p"), _dist(q, "q")
    gen = _torch_gen(gen)
    v = verdicts(pp.unsqueeze(0), qq.unsqueeze(0), float(epsilon), variant)
    m = int(n)
    x = torch.multinomial(qq, m, replacement=True, generator=gen)
    u = torch.rand(m, generator=gen, dtype=torch.float64)
    y = torch.multinomial(v.fallback[0], m, replacement=True, generator=gen)
    return torch.where(u < v.b[0][x], x, y)


# ---- Yin et al. Thms 4–5: the rejection / bias Pareto front -------------------------------


def pareto_front(tv: float, n: int = 50) -> tuple[list[float], list[float]]:
    """Points of the optimal trade-off line from (0, TV) to (TV, 0).

    Yin et al. Thms 4–5: for any acceptance b ≥ min(1, p/q) with the best
    fallback, P(reject) + bias = TV(p, q), where bias = TV(A, p); no
    rejection-based rule does better.  x = rejection probability, y = bias.
    """
    t = float(tv)
    if not (math.isfinite(t) and 0.0 <= t <= 1.0):
        raise ValueError(f"tv must be in [0, 1], not {tv!r}")
    k = max(2, int(n))
    xs = [t * i / (k - 1) for i in range(k)]
    return xs, [t - x for x in xs]


def tradeoff_point(p: Any, q: Any, epsilon: float, variant: str = "opt") -> tuple[float, float]:
    """(rejection probability, bias) of one position under threshold ε, from `verdicts`.

    OPT (fallback = residual) lands on the Pareto line; UNO (fallback = p)
    lies above it, and is biased even at ε = 0.
    """
    pp, qq = _dist(p, "p"), _dist(q, "q")
    v = verdicts(pp.unsqueeze(0), qq.unsqueeze(0), float(epsilon), variant)
    return float(v.reject_prob[0]), float(v.bias[0])


def pareto_points(p: Any, q: Any, epsilons: Sequence[float], variants: Sequence[str] = ("opt", "uno")) -> list[dict]:
    """`tradeoff_point` for every (ε, variant): dicts ready for `pareto_plot`."""
    out = []
    for variant in variants:
        for eps in epsilons:
            r, bias = tradeoff_point(p, q, eps, variant)
            out.append({"label": f"ε={eps:g}", "epsilon": float(eps), "variant": variant, "reject_prob": r, "bias": bias})
    return out


# ---- Yin et al. Thm 3: batch drafts at one position ----------------------------------------


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
    pp, qq = _dist(p, "p"), _dist(q, "q")
    m_max = _gamma(M, lo=1)
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
    pp, qq = _dist(p, "p"), _dist(q, "q")
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
    pp, qq = _dist(p, "p"), _dist(q, "q")
    m_max, k = _gamma(M, lo=1), int(n)
    gen = _torch_gen(gen)
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
