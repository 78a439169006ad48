"""Draft-length policies: exactness beyond the first draft position, and each policy's own decisions.

The exactness tests check the JOINT distribution of the first three emitted tokens
with γ = 3, so accepted drafts at positions 2 and 3, corrections after them, and
rounds cut short by a policy (with the bonus token that follows them) all contribute.  The exact target joint is
enumerated from the tiny target (vocabulary 6: at most 216 continuations).
"""

from __future__ import annotations

import math
import time
from collections import Counter

import pytest
import torch

from specviz.core import engine
from specviz.core.engine import standard_decode
from specviz.core.settings import DRAFT_STOPS
from specviz.core.policy import RoundReport, Adaptive, Confidence, Heuristic, make_policy
from specviz.core.sampling import Warp
from specviz.core.settings import POLICIES, DecodeSettings
from specviz.drafters.draft_model import ModelDrafter
from tests.test_engine import PROMPT, assert_matches, make_pair
from tests.drafted import speculative_decode, speculative_stream

VOCAB, GAMMA, FIRST = 6, 3, 3
TAU = 0.2  # near the median of this pair's draft confidences (quartiles 0.14 and 0.32): stops mid-round often, not always
SAMPLES = 400  # per (policy, warp): the 12 cases take about a minute on a busy 2-core machine
# Enough budget that it never cuts a round that starts before 3 tokens are out, so the
# policies alone decide the draft lengths; the stream is closed once 3 tokens are emitted.
MAX_NEW = 8
WARPS = {"T=1": Warp(1.0), "top-k=3": Warp(1.0, 3), "top-p=0.8": Warp(1.0, 0, 0.8)}


@pytest.fixture(scope="module")
def pair():
    """make_pair's lean random draft and target at sharpness 20: flat enough that the draft is often unsure
    (confidence quartiles 0.14, 0.21, 0.32), so the policies cut rounds; thousands of decodes run here."""
    return make_pair(vocab=VOCAB, sharp=20.0)  # TAU and the counts below are tuned to it


@torch.inference_mode()
def exact_joint(pair, warp: Warp) -> dict[tuple[int, ...], float]:
    """P(x1, ..., x_FIRST) under the target alone, by enumeration (one batched forward per depth)."""
    joint: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(FIRST):
        prefixes = list(joint)
        logits = pair.target(torch.tensor([PROMPT + list(c) for c in prefixes])).logits[:, -1]
        p = warp(logits).tolist()
        joint = {c + (x,): joint[c] * p[i][x] for i, c in enumerate(prefixes) for x in range(VOCAB) if p[i][x] > 0}
    return joint


def marginal(probs: dict[tuple[int, ...], float], idx: tuple[int, ...]) -> dict[tuple[int, ...], float]:
    out: dict[tuple[int, ...], float] = {}
    for cell, p in probs.items():
        key = tuple(cell[i] for i in idx)
        out[key] = out.get(key, 0.0) + p
    return out


def assert_joint(samples: list[tuple[int, ...]], exact: dict[tuple[int, ...], float]) -> None:
    assert_matches(samples, exact)  # the joint of (x1, x2, x3)
    # With a few hundred samples the joint's rare cells are pooled, which costs power; the pairs
    # keep it: a correction drawn from position 1's residual at position 2 passes the joint test
    # on 400 samples (p ≈ 0.007) but fails both pairs (p < 1e-19), measured on the one-layer Llama pair these
    # tests ran on before the lean pair (where UNO's fallback planted as the residual fails all 12 cases, p < 3e-4).
    for idx in ((0, 1), (1, 2)):
        assert_matches([tuple(s[i] for i in idx) for s in samples], marginal(exact, idx))


class Ticks:
    """Stands in for the engine's `time` module: every reading is 1 ms after the previous one.
    The adaptive policy decides from the run's timings; with these its decisions, and so the
    samples of a seed, are the same on every machine and every run (no flaky p-values)."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1e-3
        return self.now


def first_tokens(pair, settings: DecodeSettings):
    """The first FIRST emitted tokens of a speculative run, and the rounds that produced them."""
    stream = speculative_stream(pair, PROMPT, settings)
    try:
        for ev in stream:
            if ev.kind == "round" and ev.trace.n_tokens >= FIRST:
                return tuple(t.id for t in ev.trace.tokens[:FIRST]), ev.trace.rounds
    finally:
        stream.close()  # frees the caches
    raise AssertionError("the run ended before emitting three tokens")


@pytest.mark.parametrize("warp_name", list(WARPS))
@pytest.mark.parametrize("policy", POLICIES)
def test_first_three_tokens_follow_the_target_joint(pair, policy, warp_name, monkeypatch):
    if policy == "adaptive":
        monkeypatch.setattr(engine, "time", Ticks())
    warp = WARPS[warp_name]
    exact = exact_joint(pair, warp)
    samples, rounds, origins = [], [], Counter()
    for seed in range(SAMPLES):
        s = DecodeSettings(gamma=GAMMA, temperature=warp.temperature, top_k=warp.top_k, top_p=warp.top_p,
                           max_new_tokens=MAX_NEW, seed=seed, policy=policy, tau=TAU)
        toks, rs = first_tokens(pair, s)
        samples.append(toks)
        rounds += rs
        origins.update([t.origin for r in rs for t in r.emitted][:FIRST])
    assert_joint(samples, exact)

    # The test reaches past the first position: later drafts were verified and accepted.
    assert sum(1 for r in rounds for pos in r.positions if pos.i >= 2 and pos.accepted) > SAMPLES // 10
    assert any(r.extra.kind == "correction" and r.rejected_at >= 2 for r in rounds)
    if policy in ("confidence", "adaptive") and warp_name != "top-k=3":
        # Rounds the policy cut to one token put bonus tokens among the first three (rarely under
        # top-k = 3, where the draft's first token is confident).
        assert origins["bonus"] > SAMPLES // 20
    # ... and each policy really decided the draft lengths its own way.
    lengths = Counter(len(r.draft) for r in rounds)
    stops = Counter(r.draft_stop for r in rounds)
    if policy == "constant":
        assert set(lengths) == {GAMMA} and set(stops) == {"limit"}
    elif policy == "heuristic":  # γ after all-accepted rounds, fewer after rejections
        assert lengths[GAMMA] and lengths[2] and set(stops) == {"limit"}
    elif policy == "confidence":
        assert stops["confidence"] > len(rounds) // 10 and stops["limit"]
        for r in rounds:  # the rule: stop right after a token the draft gave less than τ
            confs = [d.conf for d in r.draft]
            assert all(c >= TAU for c in confs[:-1])
            if len(confs) < GAMMA:
                assert confs[-1] < TAU and r.draft_stop == "confidence"
            else:  # γ reached: the limit is checked first, whatever the last confidence
                assert r.draft_stop == "limit"
    else:  # adaptive: the confidence rule until it has measured a round, then its cost rule
        assert "cost" in stops and set(stops) <= {"limit", "cost", "confidence"}
        # Round 0's pass also reads the prompt, so the first typical pass is measured in round 1.
        assert rounds[0].prompt_fed and all(r.index <= 1 for r in rounds if r.draft_stop == "confidence")


@pytest.mark.parametrize("policy", POLICIES)
def test_greedy_output_is_the_standard_output_under_every_policy(policy):
    pair = make_pair(vocab=11, draft_seed=5, target_seed=6, sharp=10.0)
    s = DecodeSettings(gamma=4, temperature=0.0, max_new_tokens=30, policy=policy, tau=0.6)
    for prompt in ([1, 2, 3], [7, 7, 0, 1, 9, 10]):
        spec = speculative_decode(pair, prompt, s)
        assert [t.id for t in spec.tokens] == [t.id for t in standard_decode(pair, prompt, s).tokens]
        assert spec.summary().rejections > 0
        assert {r.draft_stop for r in spec.rounds} <= set(DRAFT_STOPS)


# ---- the policy objects, driven directly ------------------------------------------------


def settings(policy: str, gamma: int = 8, tau: float = 0.4) -> DecodeSettings:
    return DecodeSettings(gamma=gamma, policy=policy, tau=tau)


def test_heuristic_schedule_is_transformers_plus_two_minus_one():
    pol = make_policy(settings("heuristic", gamma=8))
    assert isinstance(pol, Heuristic) and pol.limit() == 5  # starts at min(γ, 5)
    seen = []
    for verdicts, drafted in [
        ([(0.9, True)] * 5, 5),  # all accepted: +2
        ([(0.9, True)] * 7, 7),  # +2, capped at γ = 8
        ([(0.9, True), (0.5, False)], 8),  # a rejection: −1
        ([(0.9, True)] * 3, 7),  # drafted 7, only 3 verified (an EOS): not all accepted, −1
        ([(0.2, False)], 6),
    ] + [([(0.2, False)], 1)] * 6:  # floor at 1
        pol.observe(RoundReport(verdicts=verdicts, drafted=drafted, t_draft=0.01, draft_forwards=drafted,
                                fed=drafted + 1, t_verify=0.02))
        seen.append(pol.limit())
    assert seen == [7, 8, 7, 6, 5, 4, 3, 2, 1, 1, 1]
    assert make_policy(settings("heuristic", gamma=3)).limit() == 3
    assert pol.stop([0.01]) is None  # it never stops mid-round


def test_confidence_stops_after_a_token_below_tau():
    pol = make_policy(settings("confidence", tau=0.4))
    assert isinstance(pol, Confidence) and pol.limit() == 8
    assert pol.stop([0.9]) is None
    assert pol.stop([0.9, 0.4]) is None  # τ itself is confident enough
    assert pol.stop([0.9, 0.39]) == "confidence"
    assert make_policy(settings("confidence", tau=0.0)).stop([0.0]) is None  # τ = 0: constant γ


def calibrated_adaptive(conf: float, accepted: int, of: int, t_step: float, t_verify: float) -> Adaptive:
    """An Adaptive policy that has seen `of` verdicts at confidence `conf` (`accepted` accepted),
    draft steps of t_step seconds and verify passes of t_verify seconds (flat in the tokens fed)."""
    pol = make_policy(settings("adaptive", gamma=8))
    assert isinstance(pol, Adaptive)
    verdicts = [(conf, i < accepted) for i in range(of)]
    n = of // 4
    for k in range(4):  # four rounds feeding the same number of tokens: a flat verify cost a = t_verify, b = 0
        pol.observe(RoundReport(verdicts=verdicts[k * n:(k + 1) * n], drafted=n, t_draft=t_step * n, draft_forwards=n,
                                fed=3, t_verify=t_verify))
    return pol


def test_adaptive_stops_like_the_confidence_policy_until_it_has_measured_a_round():
    pol = make_policy(settings("adaptive"))  # τ = 0.4 by default
    assert pol.limit() == 8 and pol.stop([0.01]) == "confidence" and pol.stop([0.9] * 7) is None


def test_adaptive_cost_rule_decides_as_its_formula_says():
    # With a flat verify cost V (b = 0) and acceptance â for every token, after one draft token
    # the round expects E = 1 + â tokens in T = t + V seconds; a second token gains â² for t more.
    # Draft it iff â²/t > (1 + â)/(t + V), i.e. t < t* = â²·V / (1 + â − â²).
    V = 0.05
    probe = calibrated_adaptive(0.85, accepted=60, of=80, t_step=0.01, t_verify=V)
    a_hat = probe.accept_prob(0.85)
    assert abs(a_hat - 60 / 80) < 0.01  # 80 verdicts outweigh the prior (â = c = 0.85) worth two
    t_star = a_hat**2 * V / (1 + a_hat - a_hat**2)
    cheap = calibrated_adaptive(0.85, 60, 80, t_step=0.8 * t_star, t_verify=V)
    dear = calibrated_adaptive(0.85, 60, 80, t_step=1.25 * t_star, t_verify=V)
    assert cheap.stop([0.85]) is None
    assert dear.stop([0.85]) == "cost"


def test_adaptive_stops_early_when_drafting_is_dear_and_acceptance_low():
    dear = calibrated_adaptive(0.35, accepted=10, of=80, t_step=0.05, t_verify=0.06)
    assert dear.stop([0.35]) == "cost"
    cheap = calibrated_adaptive(0.95, accepted=78, of=80, t_step=0.002, t_verify=0.1)
    assert all(cheap.stop([0.95] * i) is None for i in range(1, 8))
    # It learns acceptance per confidence: the same timings, a confident token is worth drafting on.
    mixed = calibrated_adaptive(0.95, accepted=78, of=80, t_step=0.01, t_verify=0.06)
    for _ in range(10):
        mixed.observe(RoundReport(verdicts=[(0.15, False)] * 8, drafted=8, t_draft=0.08, draft_forwards=8, fed=9,
                                  t_verify=0.06))
    assert mixed.stop([0.95]) is None and mixed.stop([0.15]) == "cost"


def test_calibration_is_the_penalised_logistic_fit_and_informs_neighbouring_confidences():
    from specviz.core.policy import _Calibration

    cal = _Calibration()
    assert cal(0.3) == pytest.approx(0.3) and cal(0.9) == pytest.approx(0.9)  # no evidence: â = c
    verdicts = [(0.97, True)] * 30 + [(0.6, True)] * 4 + [(0.55, False)] + [(0.2, False)] * 5 + [(0.25, True)]
    cal.add(verdicts[:20])
    cal.add(verdicts[20:])  # in two rounds, as the engine feeds it: the same fit
    # Stationary point of Σ log-likelihood − (prior / 2)·(w0² + (w1 − 1)²): the gradient vanishes.
    xs = [cal._logit(c) for c, _ in verdicts]
    res = [float(ok) - 1 / (1 + math.exp(-(cal.w0 + cal.w1 * x))) for x, (_, ok) in zip(xs, verdicts)]
    assert abs(sum(res) - cal.prior * cal.w0) < 1e-6
    assert abs(sum(r * x for r, x in zip(res, xs)) - cal.prior * (cal.w1 - 1)) < 1e-6
    # Verdicts at 0.97 and 0.6 (nearly all accepted) lift a confidence never seen, 0.75, above 0.75;
    # the refusals near 0.2 keep low confidences low; the curve rises with confidence.
    assert cal(0.75) > 0.8 and cal(0.2) < 0.35
    assert all(cal(a) < cal(b) for a, b in zip([0.1, 0.3, 0.5, 0.7, 0.9], [0.3, 0.5, 0.7, 0.9, 0.99]))


def test_verify_cost_is_fitted_as_a_line_in_tokens_fed():
    pol = make_policy(settings("adaptive"))
    for fed in (2, 4, 6, 8, 3, 5):
        pol.observe(RoundReport(verdicts=[(0.5, True)], drafted=1, t_draft=0.01, draft_forwards=1, fed=fed,
                                t_verify=0.03 + 0.005 * fed))
    a, b = pol.verify.line()
    assert a == pytest.approx(0.03) and b == pytest.approx(0.005)


class SlowLM(torch.nn.Module):
    """A draft model that takes `delay` seconds more per forward pass: drafting made dear."""

    def __init__(self, inner: torch.nn.Module, delay: float):
        super().__init__()
        self.inner, self.delay = inner, delay

    def forward(self, **kw):
        time.sleep(self.delay)
        return self.inner(**kw)


def test_adaptive_stops_for_cost_on_a_pair_where_drafting_is_dear(pair):
    """Through the engine: a draft forward costs ≥ 30 ms and the target's verify pass a few ms, so a
    second draft token (worth â² < 1 + â tokens) never pays for itself: after its first, measured
    round the adaptive policy drafts one token per round and says why; constant drafts γ regardless."""
    drafter = lambda: ModelDrafter(SlowLM(pair.draft, 0.03), pair.device)  # noqa: E731
    s = DecodeSettings(gamma=4, temperature=1.0, max_new_tokens=16, seed=1, policy="adaptive")
    tr = speculative_decode(pair, PROMPT, s, drafter=drafter())
    # Nothing measured yet: the confidence rule.  Round 0's pass also reads the prompt, so it says
    # nothing about a typical pass: the first one is measured in round 1.
    assert tr.rounds[0].prompt_fed and all(r.draft_stop in ("limit", "confidence") for r in tr.rounds[:2])
    later = [r for r in tr.rounds[2:] if r.draft_stop not in ("budget", "none")]  # the budget cuts the end
    assert len(later) >= 3 and all(r.draft_stop == "cost" and len(r.draft) == 1 for r in later)
    const = speculative_decode(pair, PROMPT, DecodeSettings(**{**s.as_dict(), "policy": "constant"}),
                               drafter=drafter())
    assert {len(r.draft) for r in const.rounds if r.draft_stop != "budget"} <= {0, 4}
    assert sum(len(r.draft) == 4 for r in const.rounds) >= 3
