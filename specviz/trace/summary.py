"""A run's totals and the metrics the views label, typed: what :meth:`Trace.summary` returns.

alpha: accepted drafts / verified drafts (drafts after the first rejection in a round are never
    verified, so they do not count).
mean_accepted_length: 1 + accepted / rounds (vLLM's definition; counts the correction or bonus token).
c: mean draft forward time / mean target forward time (verify passes), both measured in this run
    (prefill excluded): all one run can give.  Thm 3.8 wants both costs in standard one-token steps;
    with the standard run of the same race, specviz.theory.costs.race_costs gives c per step and the
    verify factor v (what a verify pass costs in steps), as the bench does.
mean_draft_length: tokens drafted per round, over rounds that drafted.
theoretical_speedup: (1 − α^(γ+1)) / ((1 − α)(γc + 1)), Leviathan et al. Theorem 3.8, from this run's
    own α and c: time counted in verify passes, so it overstates the speedup by v when a verify pass
    costs v > 1 steps (the page shows specviz.theory.costs's figures instead).

The speculative-only fields are None for a standard run; :meth:`Summary.as_dict` writes a standard
run's summary without them, as recordings always have.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


def theoretical_speedup(alpha: float | None, gamma: float, c: float | None, v: float | None = 1.0) -> float | None:
    """Leviathan et al. Thm 3.8 with a verify factor: (1 − α^(γ+1)) / ((1 − α)(γc + v)).

    γ may be a mean draft length.  c and v are in units of one standard decoding step: c = a draft
    token's cost, v = a verify pass's cost.  v = 1 (the default) is the textbook theorem, which
    assumes the target scores γ + 1 tokens in the time it produces one (a memory-bound target).
    None when an input is unknown.  `specviz.theory.formulas.expected_speedup` is the checked public face."""
    if alpha is None or c is None or v is None or gamma < 1 or gamma * c + v <= 0:
        return None
    if alpha >= 1.0:
        tokens = gamma + 1.0
    else:
        tokens = (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return tokens / (gamma * c + v)


@dataclass(frozen=True, kw_only=True)
class Summary:
    kind: str  # "speculative" | "standard"
    tokens: int
    rounds: int
    target_forwards: int
    t_total: float
    t_prefill: float
    ttft: float | None  # time to the first token (the end of round 1)
    tokens_per_s: float
    decode_tokens_per_s: float  # after the first round (which reads the prompt): the steady rate
    stop_reason: str
    tracing_overhead: float  # share of the run's time spent on the explainer's statistics
    t_target_forward: float | None  # one typical target pass (rounds that also fed the prompt left out)
    # Speculative runs only:
    drafted: int | None = None
    verified: int | None = None
    accepted: int | None = None
    rejections: int | None = None
    alpha: float | None = None
    mean_beta: float | None = None  # 1 − mean TV(p, q) over verified positions
    mean_accepted_length: float | None = None
    per_position_acceptance: list[float | None] | None = None
    tokens_per_round_hist: list[int] | None = None
    t_draft_forward: float | None = None
    c: float | None = None
    sum_tv: float | None = None
    mean_reject_prob: float | None = None
    mean_bias: float | None = None
    mean_draft_length: float | None = None
    theoretical_speedup: float | None = None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.kind != "speculative":
            for f in fields(self)[SPECULATIVE_FROM:]:
                d.pop(f.name)
        return d


SPECULATIVE_FROM = [f.name for f in fields(Summary)].index("drafted")


def summarize(trace: Any) -> Summary:
    rounds = trace.rounds
    n_tokens = trace.n_tokens
    decode_time = max(trace.t_total - rounds[0].t_end, 1e-9) if rounds else 1e-9
    decode_tokens = n_tokens - len(rounds[0].emitted) if rounds else 0
    # One pass's cost: rounds whose pass also fed the prompt are not typical passes.
    t_verify = [r.t_verify for r in rounds if r.target_forwards and not r.prompt_fed]
    target_fwd = sum(t_verify) / len(t_verify) if t_verify else None
    common = dict(
        kind=trace.kind,
        tokens=n_tokens,
        rounds=len(rounds),
        target_forwards=sum(r.target_forwards for r in rounds),
        t_total=trace.t_total,
        t_prefill=trace.t_prefill,
        ttft=rounds[0].t_end if rounds else None,
        tokens_per_s=n_tokens / trace.t_total if trace.t_total > 0 else 0.0,
        decode_tokens_per_s=decode_tokens / decode_time if decode_tokens > 0 else 0.0,
        stop_reason=trace.stop_reason,
        tracing_overhead=trace.t_tracing / trace.t_total if trace.t_total > 0 else 0.0,
        t_target_forward=target_fwd,
    )
    if trace.kind != "speculative":
        return Summary(**common)

    verified = [pos for r in rounds for pos in r.positions]
    accepted = sum(1 for pos in verified if pos.accepted)
    alpha = accepted / len(verified) if verified else None
    draft_fwd_n = sum(r.draft_forwards for r in rounds)
    draft_fwd = sum(r.t_draft for r in rounds) / draft_fwd_n if draft_fwd_n else None
    c = draft_fwd / target_fwd if (draft_fwd is not None and target_fwd) else None
    gamma = trace.gamma
    drafting = [len(r.draft) for r in rounds if r.draft]
    mean_draft = sum(drafting) / len(drafting) if drafting else None
    per_pos = []
    for i in range(1, gamma + 1):
        tested = [r.positions[i - 1] for r in rounds if len(r.positions) >= i]
        per_pos.append(sum(p.accepted for p in tested) / len(tested) if tested else None)
    hist = [0] * (gamma + 2)
    for r in rounds:
        n = len(r.emitted)
        if n < len(hist):
            hist[n] += 1
    return Summary(
        **common,
        drafted=sum(len(r.draft) for r in rounds),
        verified=len(verified),
        accepted=accepted,
        rejections=sum(1 for pos in verified if not pos.accepted),
        alpha=alpha,
        mean_beta=(1 - sum(p.tv for p in verified) / len(verified)) if verified else None,
        mean_accepted_length=(1 + accepted / len(rounds)) if rounds else None,
        per_position_acceptance=per_pos,
        tokens_per_round_hist=hist,
        t_draft_forward=draft_fwd,
        c=c,
        sum_tv=sum(p.tv for p in verified),
        mean_reject_prob=(sum(p.reject_prob for p in verified) / len(verified)) if verified else None,
        mean_bias=(sum(p.bias for p in verified) / len(verified)) if verified else None,
        mean_draft_length=mean_draft,
        # Thm 3.8 at the draft length actually run: γ for the constant policy, the mean draft length
        # of the rounds that drafted for the dynamic ones.
        theoretical_speedup=theoretical_speedup(
            alpha, gamma if trace.settings.policy == "constant" else (mean_draft or 0.0), c),
    )
