"""The closed forms, as plain functions (the notation and the papers: specviz.theory).

Leviathan et al.'s tokens per round, Thm 3.8 (wall time, with a verify factor v), Thm 3.11
(arithmetic) and the choice of γ; Yin et al.'s Thm 1 (expected rejections = Σ TV, with its running
sums along a real run) and Thms 4–5 (the rejection / bias Pareto front).  The simulations that
check them are in `specviz.theory.simulate`, the batch drafts of Thm 3 in `specviz.theory.batch`.

The acceptance rule itself is never re-implemented here: it comes from `specviz.core.sampling`
(`verdicts`), the code the engine runs.  The argument checks (`check_alpha`, `check_gamma`, `_cost`, `as_dist`,
`torch_generator`) are shared by the three modules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from ..core.sampling import verdicts
from ..trace import Trace, theoretical_speedup

__all__ = [
    "expected_tokens_per_round",
    "expected_speedup",
    "speculation_helps",
    "optimal_gamma",
    "arithmetic_cost_factor",
    "sweep_theory",
    "expected_rejections",
    "Theorem1Series",
    "theorem1_series",
    "running_tv_vs_rejections",
    "tv_distance",
    "emitted_distribution",
    "pareto_front",
    "tradeoff_point",
    "pareto_points",
]


# ---- argument checks -----------------------------------------------------------------------------


def check_alpha(alpha: float) -> float:
    a = float(alpha)
    if not (math.isfinite(a) and 0.0 <= a <= 1.0):
        raise ValueError(f"alpha must be a probability in [0, 1], not {alpha!r}")
    return a


def check_gamma(gamma: int, lo: int = 0) -> int:
    if isinstance(gamma, bool) or int(gamma) != gamma or gamma < lo:
        raise ValueError(f"gamma must be a whole number ≥ {lo}, not {gamma!r}")
    return int(gamma)


def _cost(c: float, name: str = "c") -> float:
    x = float(c)
    if not (math.isfinite(x) and x >= 0.0):
        raise ValueError(f"{name} must be a finite number ≥ 0, not {c!r}")
    return x


def as_dist(x: Any, name: str) -> torch.Tensor:
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


def torch_generator(gen: torch.Generator | int | None) -> torch.Generator:
    if isinstance(gen, torch.Generator):
        return gen
    g = torch.Generator()
    g.manual_seed(0 if gen is None else int(gen))
    return g


def tv_distance(p: Any, q: Any) -> float:
    """Total variation distance ½ Σ_x |p(x) − q(x)| between two vectors."""
    return float(0.5 * (as_dist(p, "p") - as_dist(q, "q")).abs().sum())


# ---- Leviathan et al.: tokens per round, speedup, cost, choice of γ ------------------------------


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
    a, g = check_alpha(alpha), check_gamma(gamma)
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
    a, g, cc, vv = check_alpha(alpha), check_gamma(gamma), _cost(c), _cost(v, "v")
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
    return check_alpha(alpha) > _cost(c)


def optimal_gamma(alpha: float, c: float, gamma_max: int = 64, v: float = 1.0) -> tuple[int, float]:
    """The integer γ in 1..gamma_max maximising Thm 3.8 (with verify factor v), and its speedup.

    There is no closed form (Leviathan et al. §3.5), so this is a brute-force
    maximisation; ties go to the smaller γ (cheaper, same speed).  When no γ
    helps (α ≤ c, see `speculation_helps`) the returned speedup is ≤ 1 and the
    γ is the least bad one (usually 1): plain decoding is then faster.
    Paper examples, reproduced: c = 0.05, α = 0.6 → γ* = 4 (1.92×); α = 0.8 →
    γ* = 8 (3.09×); c = 0.1, α = 0.8 → γ* = 6 (2.47×).
    """
    a, cc, gmax = check_alpha(alpha), _cost(c), check_gamma(gamma_max, lo=1)
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
    g = check_gamma(gamma)
    return (g * _cost(c_hat, "c_hat") + g + 1) / expected_tokens_per_round(alpha, g)


def sweep_theory(alpha: float, c: float, gammas: Iterable[int] | None = None, c_hat: float | None = None,
                 v: float = 1.0) -> dict[str, list]:
    """Thm 3.8 (and tokens per round, and Thm 3.11 if c_hat is given) over γ.

    Returns lists keyed gamma, tokens_per_round, speedup (and cost_factor),
    ready for plotting; gammas defaults to 1..16.  v: the verify factor, one value for every γ
    (a measured v belongs to the draft length it was measured at; on a compute-bound target it
    grows with γ).
    """
    gs = [check_gamma(g) for g in (range(1, 17) if gammas is None else gammas)]
    out: dict[str, list] = {
        "gamma": gs,
        "tokens_per_round": [expected_tokens_per_round(alpha, g) for g in gs],
        "speedup": [expected_speedup(alpha, g, c, v) for g in gs],
    }
    if c_hat is not None:
        out["cost_factor"] = [arithmetic_cost_factor(alpha, g, c_hat) for g in gs]
    return out


# ---- Yin et al. Thm 1: expected rejections = Σ TV ------------------------------------------------


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


# ---- one position of the rule: exactness and over-acceptance -------------------------------------


def emitted_distribution(p: Any, q: Any, epsilon: float = 0.0, variant: str = "opt") -> torch.Tensor:
    """A = q·b + r·P, the distribution of the token one position emits
    (Yin et al. §4; in our letters).  Equals p for OPT at ε = 0 (exactness)."""
    pp, qq = as_dist(p, "p"), as_dist(q, "q")
    v = verdicts(pp.unsqueeze(0), qq.unsqueeze(0), float(epsilon), variant)
    return (qq * v.b[0] + v.reject_prob[0] * v.fallback[0]).clone()


# ---- Yin et al. Thms 4–5: the rejection / bias Pareto front --------------------------------------


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
    pp, qq = as_dist(p, "p"), as_dist(q, "q")
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
