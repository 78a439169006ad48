"""What a race's rounds cost, in standard decoding steps, and why speculation lost when it lost.

Leviathan et al.'s Thm 3.8 counts a round's cost in target steps: γ draft tokens at c steps each
and one verify pass, which the theorem takes to cost one step.  On a memory-bound target it does
(reading the weights dominates: GPUs at batch 1, CPUs with AMX matrix units); on a compute-bound
one (an AVX2-only CPU in bf16) a verify pass over six tokens measured 4.7 steps, and speculation
lost.  So the costs here are measured against the standard run of the same race:

    t_step   the standard run's mean one-token step (its first step, which also reads the prompt,
             left out)
    v        the speculative run's mean verify pass (its prompt pass left out) ÷ t_step: the
             verify factor
    c        a draft token's cost ÷ t_step (not ÷ the verify pass: that would count time in verify
             passes, whose cost is the very thing in question)

and Thm 3.8 is given twice: textbook (v = 1) and with the measured v
(`specviz.theory.formulas.expected_speedup`).  Without a standard run there is no step to divide by: v is
unknown, never assumed, and the textbook figure uses the trace summary's c (÷ the verify pass).

No UI and no models: plain functions of traces.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..trace import Trace, theoretical_speedup

# From this verify factor up, the headline calls the target compute-bound: a memory-bound verify
# pass over a few tokens costs 1.0-1.3 steps (the AMX Xeon: 6 tokens ≈ 1.1 steps).
COMPUTE_BOUND_V = 1.5


def _ratio(cost: float | None, unit: float | None) -> float | None:
    """cost / unit, or None when either is unknown (or the unit is zero)."""
    return None if cost is None or not unit else cost / unit


@dataclass(frozen=True)
class RaceCosts:
    """One race's cost model; every time in seconds, every cost in standard steps."""

    alpha: float | None  # accepted ÷ verified drafts
    gamma: float  # the draft length Thm 3.8 is evaluated at: γ (constant policy) or the mean drafted
    rounds: int
    t_verify: float | None  # mean verify pass, the prompt pass left out
    t_draft_token: float | None  # a draft token's cost: per draft forward, else drafting time per drafted token
    t_step: float | None  # the standard run's mean one-token step (None: no standard run)
    tokens_per_round: float | None  # measured: 1 + accepted ÷ rounds
    drafted_per_round: float | None
    wasted_per_round: float | None  # drafts rejected or discarded per round
    measured: float | None  # speculative tok/s ÷ standard tok/s (the race's speedup)
    round_tokens: int = 0  # the tokens the rounds emitted
    round_seconds: float | None = None  # the rounds' own time: Σ (drafting + verify pass) over the rounds
    prompt_in_rounds: bool = False  # the first verify pass also read the prompt (its time is in round_seconds)
    std_round_tokens: int = 0  # the same for the standard run: its tokens,
    std_round_seconds: float | None = None  # and its rounds' own time (Σ target passes)

    @property
    def v(self) -> float | None:
        """The verify factor: a verify pass's cost in standard steps (None: unknown)."""
        return _ratio(self.t_verify, self.t_step)

    @property
    def c(self) -> float | None:
        """A draft token's cost in standard steps (None without a standard run)."""
        return _ratio(self.t_draft_token, self.t_step)

    @property
    def c_verify(self) -> float | None:
        """A draft token's cost in verify passes (the trace summary's c, all a lone run can give)."""
        return _ratio(self.t_draft_token, self.t_verify)

    @property
    def textbook(self) -> float | None:
        """Thm 3.8 as published (a verify pass costs one step), with c per standard step when a
        standard run measured one, else per verify pass."""
        c = self.c if self.t_step else self.c_verify
        return theoretical_speedup(self.alpha, self.gamma, c, 1.0)

    @property
    def with_verify(self) -> float | None:
        """Thm 3.8 with the measured verify factor v (None when v is unknown)."""
        return theoretical_speedup(self.alpha, self.gamma, self.c, self.v)

    @property
    def drafting_steps(self) -> float | None:
        """Drafting time per round in standard steps (what γc stands for)."""
        if self.c is None:
            return None
        return self.c * (self.drafted_per_round or 0.0)

    @property
    def rounds_tokens_per_s(self) -> float | None:
        """The rounds alone: the tokens they emitted ÷ the time they took (drafting + verify passes)."""
        return self.round_tokens / self.round_seconds if self.round_seconds else None

    @property
    def std_rounds_tokens_per_s(self) -> float | None:
        """The standard run's rounds alone: its tokens ÷ the time of its target passes."""
        return self.std_round_tokens / self.std_round_seconds if self.std_round_seconds else None

    @property
    def rounds_speedup(self) -> float | None:
        """The rounds alone against standard decoding's: tokens ÷ the rounds' own time on each side (Σ drafting
        + verify; Σ target passes), the times the rounds panel shows; what is outside the rounds (a prompt pass
        no round read, tracing, other work) is left out of both.  It was tokens per round ÷ (drafting + v) in
        steps, whose v left out the verify pass that also read the prompt: it said 1.18× where the rounds'
        own times (15.97 s for 18 tokens against 1.2 tokens/s) give 0.94×."""
        mine, theirs = self.rounds_tokens_per_s, self.std_rounds_tokens_per_s
        return mine / theirs if mine and theirs else None


def race_costs(spec: Trace | None, std: Trace | None = None) -> RaceCosts | None:
    """The cost model of a speculative run and (when given) the standard run it raced.
    None when ``spec`` is not a speculative run with rounds."""
    if spec is None or spec.kind != "speculative" or not spec.rounds:
        return None
    s = spec.summary()
    rounds = spec.rounds
    n = len(rounds)
    t_draft = sum(r.t_draft for r in rounds)
    forwards = sum(r.draft_forwards for r in rounds)
    drafted = s.drafted or 0
    if forwards:
        per_token = t_draft / forwards
    elif drafted:  # a drafter without forward passes (prompt lookup): its drafting time per token
        per_token = t_draft / drafted
    else:
        per_token = None
    t_step = None
    measured = None
    std_tokens, std_seconds = 0, None
    if std is not None and std.kind == "standard" and std.rounds:
        ss = std.summary()
        t_step = ss.t_target_forward or None
        a, b = s.tokens_per_s or 0.0, ss.tokens_per_s or 0.0
        measured = a / b if a > 0 and b > 0 else None
        std_tokens, std_seconds = _round_time(std)
    gamma = spec.gamma if spec.settings.policy == "constant" else (s.mean_draft_length or 0.0)
    accepted = s.accepted or 0
    spec_tokens, spec_seconds = _round_time(spec)
    return RaceCosts(
        alpha=s.alpha, gamma=gamma, rounds=n, t_verify=s.t_target_forward, t_draft_token=per_token,
        t_step=t_step, tokens_per_round=1 + accepted / n, drafted_per_round=drafted / n,
        wasted_per_round=(drafted - accepted) / n, measured=measured,
        round_tokens=spec_tokens, round_seconds=spec_seconds,
        prompt_in_rounds=any(r.prompt_fed for r in rounds), std_round_tokens=std_tokens, std_round_seconds=std_seconds)


def _round_time(trace: Trace) -> tuple[int, float]:
    """(tokens the rounds emitted, their own time: Σ drafting + verify pass), as the rounds panel shows them."""
    return sum(len(r.emitted) for r in trace.rounds), sum(r.t_draft + r.t_verify for r in trace.rounds)


def steps(x: float) -> str:
    """A cost in standard steps as the page writes it: '2.6', '1.08'."""
    return f"{x:.1f}" if x >= 1.95 else f"{x:.2f}"


def verify_phrase(v: float) -> str:
    """'each verify pass cost 2.6 standard steps on this machine[: the target is compute-bound here]'."""
    text = f"each verify pass cost {steps(v)} standard steps on this machine"
    if v >= COMPUTE_BOUND_V:
        text += ": the target is compute-bound here"
    return text


def loss_cause(rc: RaceCosts | None) -> tuple[str, str] | None:
    """Why speculation lost this race: (cause, sentence), or None when it did not lose (or there is
    no standard run to measure against).

    Each round costs d + v standard steps (d: its drafting, v: its verify pass) and yields E
    tokens, which standard decoding pays one step each for; all three are measured.  In order:

    - "overhead": the rounds alone beat standard decoding's (the tokens they emitted ÷ their own time,
      Σ drafting + verify, against the standard run's tokens ÷ Σ its target passes:
      `RaceCosts.rounds_speedup`), so the time went outside them: the prompt pass (when no round read it),
      tracing, other work on the machine;
    - "verify": the rounds would have won had a verify pass cost one step (E > d + 1), as Thm 3.8
      assumes: the verify cost decided it;
    - otherwise the rounds lose even with a one-step verify pass (E − 1 < d: the accepted drafts do
      not pay for drafting, i.e. accepted ÷ drafted < c): "acceptance" when fewer than half the
      drafts were accepted, else "draft" (the draft is too slow for the acceptance it gets).
      A verify pass of COMPUTE_BOUND_V steps or more is named as well.
    """
    if rc is None or rc.measured is None or rc.measured >= 1 or rc.v is None or rc.c is None:
        return None
    rs = rc.rounds_speedup
    if rs is not None and rs >= 1:
        outside = ("" if rc.prompt_in_rounds else "the prompt pass, ") + "tracing, other work on this machine"
        return "overhead", (f"the rounds alone ran at {rs:.2f}× standard decoding's ({rc.round_tokens} tokens in "
                            f"{rc.round_seconds:.2f} s of drafting and verifying: {rc.rounds_tokens_per_s:.2f} "
                            f"tokens/s, against {rc.std_round_tokens} tokens in {rc.std_round_seconds:.2f} s of "
                            f"target passes: {rc.std_rounds_tokens_per_s:.2f} tokens/s); the rest went outside "
                            f"them ({outside})")
    tokens, d, drafted = rc.tokens_per_round or 1.0, rc.drafting_steps or 0.0, rc.drafted_per_round or 0.0
    if tokens > d + 1:
        return "verify", verify_phrase(rc.v) + " (Thm 3.8 assumes one)"
    accepted = tokens - 1
    if drafted and accepted < drafted / 2:
        alpha = f"α = {rc.alpha:.2f}: " if rc.alpha is not None else ""
        cause, text = "acceptance", (
            f"low acceptance ({alpha}{accepted:.1f} of {drafted:.1f} drafts per round accepted, "
            f"so a round yielded {tokens:.1f} tokens for {steps(d + rc.v)} standard steps)")
    else:
        cause, text = "draft", (f"the draft is too slow here: drafting cost {steps(d)} standard steps per round "
                                f"(c = {rc.c:.2f} steps per draft token) for {accepted:.1f} accepted drafts")
    if rc.v >= COMPUTE_BOUND_V:
        text += f"; and {verify_phrase(rc.v)}"
    return cause, text


__all__ = ["COMPUTE_BOUND_V", "RaceCosts", "loss_cause", "race_costs", "steps", "verify_phrase"]
