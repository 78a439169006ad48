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

With the tree drafter γ is the tree's greatest depth, and after each depth
level the policy decides how many of the best frontier nodes the next draft
pass expands — none stops the tree (`tree_expand`; i.i.d. and unique trees go on
with all or none) — and, for best-first trees, how many of the drafted nodes the
target verifies (`tree_keep`).  A node's *value* is the chance the walk accepts
it: the product of tree_value(confidence) over its path (constant, heuristic
and confidence policies: the draft's own probabilities, EAGLE-2's cumulative
score; adaptive: its calibrated acceptance).  The values sum to the tree's
expected accepted length, so the adaptive policy keeps the most valuable nodes
while one more is worth its verify slot, and expands a node while its expected
best child is worth what it adds to the draft pass (a first node: a whole pass;
each further one: the pass's extra row, fitted from timed tree levels) — the
chain rule above, with a tree's sums.  All of it reads the draft side and past
rounds only, so the tree's rule stays exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .settings import DRAFT_STOPS, DecodeSettings  # noqa: F401  (DRAFT_STOPS: the reasons a policy gives)

@dataclass
class RoundReport:
    """What a policy observes after each round (:meth:`Policy.observe`)."""

    verdicts: list[tuple[float, bool]]  # (confidence, accepted) per verified draft; a tree: the first child tried at each visited node
    drafted: int  # tokens drafted (a tree: its depth)
    t_draft: float  # seconds spent drafting
    draft_forwards: int  # the drafter's forward passes
    fed: int  # tokens the verify pass fed
    t_verify: float | None  # seconds; None when the pass also fed the prompt (it says nothing of a typical pass)
    full: bool | None = None  # the accepted path reached the draft length (None: every verdict an acceptance, one per draft)
    passes: list[tuple[int, float]] = field(default_factory=list)  # a tree's draft passes that expanded nodes: (nodes fed, seconds)

    @property
    def all_accepted(self) -> bool:
        if self.full is not None:
            return self.full
        return len(self.verdicts) == self.drafted and all(ok for _, ok in self.verdicts)


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

    def observe(self, report: RoundReport) -> None:
        """After each round: what it drafted, what was accepted, what it cost."""

    # ---- trees: the drafter asks these while growing (draft side only) --------------------

    def tree_value(self, confidence: float, rank_prob: float) -> float:
        """The chance a drafted node is accepted once its parent was: the draft's own
        probability (rank_prob: warped q, or the temperature-1 one in greedy mode)."""
        return rank_prob

    def tree_expand(self, candidates: list[tuple[float, float]], values: list[float], levels: int) -> tuple[int, str | None]:
        """How many of `candidates` ((value, confidence) of the nodes the next level could
        expand, best first) to expand: (n, None), or (0, a reason to stop growing).
        `values`: every node's value so far; `levels`: draft passes this round has spent."""
        return len(candidates), None

    def tree_keep(self, values: list[float], levels: int) -> int:
        """How many nodes (the most valuable ones; `values` sorted best first) to verify."""
        return len(values)


class Heuristic(Policy):
    name = "heuristic"

    def __init__(self, settings: DecodeSettings):
        super().__init__(settings)
        self.current = min(self.gamma, 5)

    def limit(self) -> int:
        return self.current

    def observe(self, report: RoundReport) -> None:
        if not report.drafted:
            return
        self.current = min(self.gamma, self.current + 2) if report.all_accepted else max(1, self.current - 1)


class Confidence(Policy):
    name = "confidence"

    def stop(self, confidences: list[float]) -> str | None:
        return "confidence" if confidences[-1] < self.tau else None

    def tree_expand(self, candidates, values, levels) -> tuple[int, str | None]:
        # The most valuable frontier node's own token, as the chain reads its last token.
        if candidates and candidates[0][1] < self.tau:
            return 0, "confidence"
        return len(candidates), None


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

    def _var(self) -> float:
        mx = self.sx / self.n
        return self.sxx / self.n - mx * mx

    def has_slope(self) -> bool:
        """Enough points at different sizes to fit b (else line() assumes b = 0)."""
        return self.n >= 3 and self._var() >= 1e-9

    def line(self) -> tuple[float, float] | None:
        if not self.n:
            return None
        mx, my = self.sx / self.n, self.sy / self.n
        if not self.has_slope():  # one size seen so far: assume a flat cost per fed token
            return my, 0.0
        b = max(0.0, (self.sxy / self.n - mx * my) / self._var())
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
        self.draft_rows = _Fit()  # tree rounds: a draft pass's seconds against the nodes it fed

    def stop(self, confidences: list[float]) -> str | None:
        measured = self._measured()
        if measured is None:  # nothing measured yet: the confidence rule
            return super().stop(confidences)
        a, b, t_step = measured
        i = len(confidences)
        probs = [self.accept_prob(c) for c in confidences]
        p_all, expected = 1.0, 1.0
        for p in probs:
            p_all *= p
            expected += p_all
        t_so_far = i * t_step + a + b * (i + 1)
        gain = p_all * probs[-1]
        return None if gain / max(t_step + b, 1e-9) > expected / t_so_far else "cost"

    def _measured(self) -> tuple[float, float, float] | None:
        """(a, b, t_step): the verify pass's a + b·fed and the draft pass's time, once measured."""
        line = self.verify.line()
        return None if line is None or self.t_step is None else (*line, self.t_step)

    def tree_value(self, confidence, rank_prob) -> float:
        return self.accept_prob(confidence) if self._measured() else rank_prob

    def _best_keep(self, values: list[float], levels: int) -> tuple[int, float]:
        """(n, rate): the n most valuable nodes that maximise expected tokens per second
        (1 + Σ values) / (levels·t_step + a + b·(n + 1))."""
        a, b, t_step = self._measured()  # type: ignore[misc]
        best, total = (0, 1.0 / (levels * t_step + a + b)), 1.0
        for n, v in enumerate(values, 1):
            total += v
            rate = total / (levels * t_step + a + b * (n + 1))
            if rate > best[1]:
                best = (n, rate)
        return best

    def tree_keep(self, values, levels) -> int:
        if not self._measured():
            return len(values)
        return max(self._best_keep(values, levels)[0], 1)

    def _draft_pass(self, rows: int) -> float:
        """Seconds of a draft pass over `rows` tree nodes; until passes of different widths
        have been timed, each row is charged as a whole pass (so a second node is expanded
        only when it is worth a pass of its own, which then times a wider pass)."""
        if not self.draft_rows.has_slope():
            return (self.t_step or 0.0) * rows
        a, b = self.draft_rows.line()  # type: ignore[misc]
        return a + b * rows

    def tree_expand(self, candidates, values, levels) -> tuple[int, str | None]:
        measured = self._measured()
        if measured is None:
            return super().tree_expand(candidates, values, levels)
        _, b, _ = measured
        _, rate = self._best_keep(sorted(values, reverse=True), levels)
        # A node's best child is worth about its own value times its acceptance (confidences
        # along a path are correlated, as for the chain).  The first node expanded costs a
        # draft pass, each further one the pass's extra row; each adds a verify slot.
        n = 0
        for i, (v, c) in enumerate(candidates):
            extra = self._draft_pass(i + 1) - (self._draft_pass(i) if i else 0.0)
            if v * self.accept_prob(c) / max(extra + b, 1e-9) <= rate:
                break
            n += 1
        return n, None if n else "cost"

    def observe(self, report: RoundReport) -> None:
        self.accept_prob.add(report.verdicts)
        for rows, seconds in report.passes or []:
            self.draft_rows.add(rows, seconds)
        if report.draft_forwards:
            total = (self.t_step or 0.0) * self.steps + report.t_draft
            self.steps += report.draft_forwards
            self.t_step = total / self.steps
        elif self.t_step is None and report.drafted:
            self.t_step = 0.0  # a drafter with no forward passes (lookup): drafting is free
        if report.t_verify is not None:
            self.verify.add(report.fed, report.t_verify)


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (Policy, Heuristic, Confidence, Adaptive)}


def make_policy(settings: DecodeSettings) -> Policy:
    return POLICIES[settings.policy](settings)
