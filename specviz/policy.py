"""Draft-length policies: how many tokens to draft in a round.

γ is the draft length of the `constant` policy and the maximum for the others.
A policy may look only at the draft side (the drafted tokens and the draft's
confidence in them) and at what earlier rounds measured; it never sees the
target's distribution of the round being drafted, so the acceptance rule stays
exact whatever it decides.

- constant: always γ (Leviathan et al.).
- heuristic: transformers' schedule: +2 after a round whose drafts were all
  accepted, −1 otherwise (within 1…γ), starting from min(γ, 5).
- confidence: stop after a token the draft gave probability < τ (transformers'
  assistant_confidence_threshold; the token itself is still verified).
- adaptive: stop when one more draft token is not worth its cost.  It keeps a
  calibration of "acceptance given the draft's confidence" — a logistic curve
  â(c) = σ(w0 + w1·logit c), fitted to every verdict so far with a pull toward
  â = c worth two observations, so a few verdicts at one confidence inform its
  neighbours (per-bin counts left the middle bins at their prior for most of a
  64-token run, and on a same-family pair a greedy token drafted at confidence
  0.6–0.9 is accepted far more often than that) — and fits the verify pass's time as
  a + b·(tokens fed) and the draft step's time t_d from the run so far.  After
  token i, with P_i = Π_{j≤i} â_j the chance that all i drafts are accepted, the
  round so far expects E_i = 1 + Σ_{j≤i} P_j tokens for T_i = i·t_d + a + b(i+1)
  seconds.  Drafting token i+1 costs t_d + b more and gains P_i·â_{i+1} expected
  tokens (â_{i+1} estimated by â_i: confidences are correlated); draft it only if
  that marginal rate beats the round's average rate E_i / T_i (the stopping rule
  that maximises tokens per second, up to that estimate).  Until a round has been
  measured it stops like the confidence policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .settings import DecodeSettings

STOP_REASONS = {
    "limit": "reached the draft length γ",
    "budget": "reached the token budget",
    "confidence": "the draft's confidence fell below τ",
    "cost": "one more draft token was not worth its cost",
    "eos": "drafted an end-of-text token",
    "exhausted": "the drafter had nothing more to propose",
    "none": "nothing drafted (a plain target step)",
}


class Policy:
    name = "constant"

    def __init__(self, settings: DecodeSettings):
        self.gamma = settings.gamma
        self.tau = settings.tau

    def limit(self) -> int:
        """The most tokens to draft this round."""
        return self.gamma

    def stop(self, confidences: list[float]) -> str | None:
        """After each drafted token: a reason to stop drafting now, or None."""
        return None

    def observe(self, verdicts: list[tuple[float, bool]], drafted: int, t_draft: float, draft_forwards: int,
                fed: int, t_verify: float | None) -> None:
        """After each round: (confidence, accepted) of each verified draft, timings (t_verify None
        when the pass also fed the prompt, so it says nothing about a typical pass)."""


class Heuristic(Policy):
    name = "heuristic"

    def __init__(self, settings: DecodeSettings):
        super().__init__(settings)
        self.current = min(self.gamma, 5)

    def limit(self) -> int:
        return self.current

    def observe(self, verdicts, drafted, t_draft, draft_forwards, fed, t_verify) -> None:
        if not drafted:
            return
        all_ok = len(verdicts) == drafted and all(ok for _, ok in verdicts)
        self.current = min(self.gamma, self.current + 2) if all_ok else max(1, self.current - 1)


class Confidence(Policy):
    name = "confidence"

    def stop(self, confidences: list[float]) -> str | None:
        return "confidence" if confidences[-1] < self.tau else None


@dataclass
class _Fit:
    """Running least squares of t = a + b·n."""

    n: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0

    def add(self, x: float, y: float) -> None:
        self.n += 1
        self.sx += x
        self.sy += y
        self.sxx += x * x
        self.sxy += x * y

    def line(self) -> tuple[float, float] | None:
        if not self.n:
            return None
        mx, my = self.sx / self.n, self.sy / self.n
        var = self.sxx / self.n - mx * mx
        if self.n < 3 or var < 1e-9:  # one size seen so far: assume a flat cost per fed token
            return my, 0.0
        b = max(0.0, (self.sxy / self.n - mx * my) / var)
        return max(my - b * mx, 1e-6), b


class _Calibration:
    """â(c) = σ(w0 + w1·logit c): the chance a draft token of confidence c is accepted, by
    penalised maximum likelihood (Newton steps) over the verdicts seen; the penalty
    (prior / 2)·(w0² + (w1 − 1)²) pulls it toward â = c before there is evidence."""

    def __init__(self, prior: float = 2.0):
        self.prior, self.w0, self.w1 = prior, 0.0, 1.0
        self.xs: list[float] = []
        self.ys: list[float] = []

    @staticmethod
    def _logit(c: float) -> float:
        c = min(max(c, 1e-3), 1 - 1e-3)
        return math.log(c / (1 - c))

    def __call__(self, conf: float) -> float:
        return _sigmoid(self.w0 + self.w1 * self._logit(conf))

    def add(self, verdicts: list[tuple[float, bool]]) -> None:
        if not verdicts:
            return
        self.xs += [self._logit(c) for c, _ in verdicts]
        self.ys += [float(ok) for _, ok in verdicts]
        lam = self.prior
        for _ in range(30):  # Newton with step halving: the objective is concave, each accepted step raises it
            g0, g1 = -lam * self.w0, -lam * (self.w1 - 1.0)
            h00, h01, h11 = lam, 0.0, lam
            for x, y in zip(self.xs, self.ys):
                s = _sigmoid(self.w0 + self.w1 * x)
                g0 += y - s
                g1 += (y - s) * x
                v = s * (1.0 - s)
                h00 += v
                h01 += v * x
                h11 += v * x * x
            det = h00 * h11 - h01 * h01
            d0, d1 = (h11 * g0 - h01 * g1) / det, (h00 * g1 - h01 * g0) / det
            before, step = self._objective(self.w0, self.w1), 1.0
            while step > 1e-4 and self._objective(self.w0 + step * d0, self.w1 + step * d1) < before:
                step /= 2
            self.w0 += step * d0
            self.w1 += step * d1
            if step * (abs(d0) + abs(d1)) < 1e-7:
                break

    def _objective(self, w0: float, w1: float) -> float:
        """Penalised log-likelihood of the verdicts under (w0, w1)."""
        out = -0.5 * self.prior * (w0 * w0 + (w1 - 1.0) ** 2)
        for x, y in zip(self.xs, self.ys):
            z = w0 + w1 * x
            # log σ(z) = −log(1 + e^(−z)), written to stay finite for large |z|
            out -= _softplus(-z) if y else _softplus(z)
        return out


def _softplus(z: float) -> float:
    return z + math.log1p(math.exp(-z)) if z > 0 else math.log1p(math.exp(z))


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


class Adaptive(Confidence):
    name = "adaptive"

    def __init__(self, settings: DecodeSettings):
        super().__init__(settings)
        self.accept_prob = _Calibration()
        self.verify = _Fit()
        self.t_step: float | None = None  # mean seconds per draft forward
        self.steps = 0

    def stop(self, confidences: list[float]) -> str | None:
        line = self.verify.line()
        if line is None or self.t_step is None:  # nothing measured yet: the confidence rule
            return super().stop(confidences)
        a, b = line
        i = len(confidences)
        probs = [self.accept_prob(c) for c in confidences]
        p_all, expected = 1.0, 1.0
        for p in probs:
            p_all *= p
            expected += p_all
        t_so_far = i * self.t_step + a + b * (i + 1)
        gain = p_all * probs[-1]
        return None if gain / max(self.t_step + b, 1e-9) > expected / t_so_far else "cost"

    def observe(self, verdicts, drafted, t_draft, draft_forwards, fed, t_verify) -> None:
        self.accept_prob.add(verdicts)
        if draft_forwards:
            total = (self.t_step or 0.0) * self.steps + t_draft
            self.steps += draft_forwards
            self.t_step = total / self.steps
        elif self.t_step is None and drafted:
            self.t_step = 0.0  # a drafter with no forward passes (lookup): drafting is free
        if t_verify is not None:
            self.verify.add(fed, t_verify)


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (Policy, Heuristic, Confidence, Adaptive)}


def make_policy(settings: DecodeSettings) -> Policy:
    return POLICIES[settings.policy](settings)
