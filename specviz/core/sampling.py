"""Logits -> probabilities, the acceptance rule, and the residual.

Both decoders (speculative and standard) and both models go through the same
`warp` so that p and q are computed identically.  Notation: p = target,
q = draft (Leviathan et al.; Chen et al. and Yin et al. swap the letters).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Warp:
    """Temperature, top-k and top-p, applied identically to draft and target."""

    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits [..., V] -> probabilities [..., V] in float32."""
        if self.temperature <= 0:
            # Greedy: a one-hot distribution on the argmax, so the same acceptance rule
            # applies (b = 1 on a match, else ε).  Written into zeros directly: a float32
            # copy of the logits and an int64 one-hot would cost more than the argmax.
            top = logits.argmax(-1, keepdim=True)
            return torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter_(-1, top, 1.0)
        logits = logits.float()
        logits = logits / self.temperature
        if self.top_k and self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if self.top_p < 1.0:
            # Keep the smallest set of most likely tokens whose mass reaches top_p
            # (the top token is always kept).
            sorted_p, order = torch.sort(probs, dim=-1, descending=True)
            mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p
            drop_sorted = mass_before >= self.top_p
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            probs = probs.masked_fill(drop, 0.0)
            probs = probs / probs.sum(-1, keepdim=True)
        return probs


def sample(probs: torch.Tensor, generator: torch.Generator, greedy: bool = False) -> int:
    """Draw one token id from a probability vector [V].

    In greedy mode every distribution (p, q, the residual) is one-hot, so its
    argmax *is* the sample; skipping multinomial saves ~5 ms per call over a
    150k vocabulary on a CPU."""
    if greedy:
        return int(probs.argmax())
    return int(torch.multinomial(probs, 1, generator=generator).item())


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p − q)) row-wise; falls back to p where p ≤ q everywhere
    (then no rejection is possible in exact arithmetic, but rounding may still
    produce one, and p is the right distribution to fall back on)."""
    diff = (p - q).clamp_min(0.0)
    mass = diff.sum(-1, keepdim=True)
    return torch.where(mass > 1e-12, diff / mass.clamp_min(1e-30), p)


@dataclass
class Verdicts:
    """The acceptance rule evaluated on full vocabulary vectors for k positions.

    b[i, x] = min(1, (p_i(x) + ε) / q_i(x)) is the acceptance probability of
    token x at position i; r_i = 1 − Σ_x q_i(x) b_i(x) is the rejection
    probability; P_i is the distribution a rejection samples from (Decoding-OPT:
    the residual norm(max(0, p − q·b)) = norm(max(0, p − q)); Decoding-UNO: p);
    A_i = q_i·b_i + r_i·P_i is the emitted-token distribution, and
    bias_i = TV(A_i, p_i) (zero for OPT at ε = 0: the exactness of the method).
    """

    b: torch.Tensor  # [k, V]
    reject_prob: torch.Tensor  # [k]
    tv: torch.Tensor  # [k]  TV(p_i, q_i)
    fallback: torch.Tensor  # [k, V]  P_i
    bias: torch.Tensor  # [k]  TV(A_i, p_i)


def acceptance_probs(p: torch.Tensor, q: torch.Tensor, epsilon: float) -> torch.Tensor:
    """b(x) = min(1, (p(x) + ε) / q(x)); where q(x) = 0 the value never matters (set 1)."""
    return torch.where(q > 0, ((p + epsilon) / q.clamp_min(1e-30)).clamp(max=1.0), torch.ones_like(q))


def verdicts(p: torch.Tensor, q: torch.Tensor, epsilon: float, variant: str = "opt", detail: bool = True) -> Verdicts:
    """Evaluate the rule for rows of p, q [k, V] (float32).

    With detail=False only b and the fallback are computed (the tracing
    statistics r, TV and bias are left as NaN)."""
    b = acceptance_probs(p, q, epsilon)
    fallback = p if variant == "uno" else residual(p, q)
    if not detail:
        nan = torch.full(p.shape[:-1], float("nan"))
        return Verdicts(b, nan, nan, fallback, nan)
    reject_prob, tv, bias = rule_stats(p, q, b, fallback)
    return Verdicts(b, reject_prob, tv, fallback, bias)


def greedy_rule(target_tokens: list[int], tokens: list[int], epsilon: float) -> list[tuple[float, ...]]:
    """The rule and its tracing statistics in greedy mode, from token ids alone.

    Greedy p and q are one-hot (p on the target's argmax t, q on the drafted x), so every
    quantity `verdicts` and `rule_stats` would compute over [k, V] vectors has a closed
    form: on a match b(x) = 1, r = 0, TV = 0, bias = 0; otherwise b(x) = min(1, ε),
    r = 1 − b(x), TV(p, q) = 1, the residual is one-hot on t, and the emitted
    distribution b(x)·δ_x + r·δ_t lies b(x) away from p in TV.  Skipping the vectors saves
    tens of milliseconds a round on a CPU with a 150k vocabulary.  Values are rounded to
    float32 as the vector path's are.  Returns (b(x), p(x), q(x), r, TV, bias) per position."""
    out = []
    for t, x in zip(target_tokens, tokens):
        if t == x:
            out.append((1.0, 1.0, 1.0, 0.0, 0.0, 0.0))
        else:
            b = float(torch.tensor(min(1.0, epsilon), dtype=torch.float32))
            r = float(torch.tensor(1.0, dtype=torch.float32) - torch.tensor(b, dtype=torch.float32))
            out.append((b, 0.0, 1.0, r, 1.0, b))
    return out


def rule_stats(p: torch.Tensor, q: torch.Tensor, b: torch.Tensor, fallback: torch.Tensor):
    """Tracing statistics of the rule: (r, TV(p, q), TV(A, p)) per row.

    Not needed to decode, only to explain: the engine times this separately
    to report what tracing costs."""
    qb = q * b
    reject_prob = (1.0 - qb.sum(-1)).clamp(0.0, 1.0)
    tv = 0.5 * (p - q).abs().sum(-1)
    emitted = qb + reject_prob.unsqueeze(-1) * fallback
    bias = 0.5 * (emitted - p).abs().sum(-1)
    return reject_prob, tv.clamp(0.0, 1.0), bias.clamp(0.0, 1.0)



# --------------------------------------------------------------------------------------------------
# The chain's rule, whole: judge k drafted tokens against the target's k + 1 distributions
# --------------------------------------------------------------------------------------------------


@dataclass
class Judged:
    """One drafted position as the rule judged it: x drawn from q, accepted when u < b(x)."""

    i: int  # 1-based position in the draft
    q: float  # q(x)
    p: float  # p(x)
    b: float  # b(x) = min(1, (p(x) + ε) / q(x))
    u: float  # the uniform draw
    accepted: bool
    reject_prob: float  # r = 1 − Σ q·b (what the explainer shows; NaN-free)
    tv: float  # TV(p, q)
    bias: float  # TV(emitted distribution, p): 0 for OPT at ε = 0


@dataclass
class ChainVerdict:
    """What the token-wise rule (Leviathan et al., Algorithm 1; Yin et al.'s ε) made of one chain.

    ``accepted`` drafted tokens are kept; then ``token`` follows: a *correction* drawn from the
    residual at the first rejection, a *bonus* drawn from p_{k+1} when all k pass, or the target's
    own token when nothing was drafted (``kind`` "target").  ``token`` is None when the kept
    tokens end in a stop token (nothing may follow an end of text)."""

    accepted: int
    token: int | None
    kind: str | None  # "correction" | "bonus" | "target" | None
    p_token: float  # p(token) at its position (1.0 under greedy decoding)
    judged: list[Judged]  # the positions judged: all k, or up to and including the first rejection
    tracing_seconds: float = 0.0  # time spent on the explainer's statistics (r, TV, bias), not on deciding


def verify_chain(*, tokens: list[int], q: torch.Tensor | None, logits: torch.Tensor, warp: Warp,
                 epsilon: float, variant: str, generator: torch.Generator,
                 stop_tokens: frozenset[int] | set[int] = frozenset()) -> ChainVerdict:
    """Judge a drafted chain; a pure function of its inputs and the generator's state.

    Shapes: ``tokens`` k drafted ids; ``q`` [k, V] the draft's (warped) distributions they were
    drawn from (None when k = 0 or under greedy decoding, where only ids matter); ``logits``
    [k + 1, V] the target's raw logits at the k drafted positions and the one after them.
    Randomness, in this order: k uniforms u (always, also under greedy decoding, so a seed gives
    the same draws whatever the temperature), then one draw for the correction or bonus token.
    """
    k = len(tokens)
    tracing = 0.0
    if warp.greedy:  # one-hot p and q: the rule from token ids alone (greedy_rule)
        target_ids = logits.argmax(-1).tolist()  # the target's token at each position
        rows = greedy_rule(target_ids[:k], tokens, epsilon)
    else:
        p_all = warp(logits)  # p_1 .. p_{k+1}
        rows = []
        if k:
            assert q is not None and q.shape[0] == k, "q must hold one distribution per drafted token"
            v = verdicts(p_all[:k], q, epsilon, variant, detail=False)
            t0 = time.perf_counter()  # the explainer's statistics, timed as tracing cost
            v.reject_prob, v.tv, v.bias = rule_stats(p_all[:k], q, v.b, v.fallback)
            tracing = time.perf_counter() - t0
            xs = torch.tensor(tokens, device=logits.device)
            at = torch.arange(k, device=logits.device)
            rows = list(zip(v.b[at, xs].tolist(), p_all[at, xs].tolist(), q[at, xs].tolist(),
                            v.reject_prob.tolist(), v.tv.tolist(), v.bias.tolist()))
    u = torch.rand(k, generator=generator, device=logits.device).tolist() if k else []
    judged: list[Judged] = []
    n = k
    for i, (b_x, p_x, q_x, r_i, tv_i, bias_i) in enumerate(rows):
        ok = u[i] < b_x
        judged.append(Judged(i=i + 1, q=q_x, p=p_x, b=b_x, u=u[i], accepted=ok, reject_prob=r_i, tv=tv_i,
                             bias=bias_i))
        if not ok:
            n = i
            break
    kind = "correction" if n < k else ("bonus" if k else "target")
    if n and tokens[n - 1] in stop_tokens:
        return ChainVerdict(n, None, None, 0.0, judged, tracing)
    if warp.greedy:  # the residual of one-hot p and q is p: the target's own token
        return ChainVerdict(n, target_ids[n], kind, 1.0, judged, tracing)
    dist = v.fallback[n] if n < k else p_all[k]
    y = sample(dist, generator)
    return ChainVerdict(n, y, kind, float(p_all[n][y]), judged, tracing)
