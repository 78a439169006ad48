"""The chain's acceptance rule on its own (specviz.core.sampling.verify_chain): a pure function of
the drafted tokens, q, the target's logits and the generator -- judged here without any model."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import chisquare

from specviz.core import sampling
from specviz.core.sampling import Warp
from specviz.core.verify import verify_chain

V = 5
P = torch.tensor([[0.40, 0.25, 0.20, 0.10, 0.05]])  # target at position 1
Q = torch.tensor([[0.10, 0.50, 0.05, 0.30, 0.05]])  # draft at position 1
BONUS = torch.tensor([[0.05, 0.05, 0.30, 0.30, 0.30]])  # target at position 2


def _logits(probs: torch.Tensor) -> torch.Tensor:
    return probs.log()  # softmax(log p) = p at temperature 1


def _one_hot_logits(ids: list[int]) -> torch.Tensor:
    out = torch.full((len(ids), V), -5.0)
    out[torch.arange(len(ids)), torch.tensor(ids)] = 5.0
    return out


def test_greedy_accepts_the_matching_prefix_then_corrects():
    verdict = verify_chain(tokens=[1, 2, 3], q=None, logits=_one_hot_logits([1, 2, 4, 0]), warp=Warp(0.0),
                           epsilon=0.0, variant="opt", generator=torch.Generator().manual_seed(0))
    assert (verdict.accepted, verdict.token, verdict.kind, verdict.p_token) == (2, 4, "correction", 1.0)
    assert [j.accepted for j in verdict.judged] == [True, True, False]  # judged up to the first rejection
    assert verdict.judged[2].b == 0.0 and verdict.judged[2].tv == 1.0


def test_greedy_all_accepted_gives_the_bonus_and_no_draft_gives_the_targets_token():
    gen = torch.Generator().manual_seed(0)
    verdict = verify_chain(tokens=[1, 2], q=None, logits=_one_hot_logits([1, 2, 3]), warp=Warp(0.0), epsilon=0.0,
                           variant="opt", generator=gen)
    assert (verdict.accepted, verdict.token, verdict.kind) == (2, 3, "bonus")
    verdict = verify_chain(tokens=[], q=None, logits=_one_hot_logits([4]), warp=Warp(0.0), epsilon=0.0,
                           variant="opt", generator=gen)
    assert (verdict.accepted, verdict.token, verdict.kind, verdict.judged) == (0, 4, "target", [])


def test_an_accepted_stop_token_ends_the_chain_with_nothing_after_it():
    verdict = verify_chain(tokens=[1, 2, 3], q=None, logits=_one_hot_logits([1, 2, 0, 0]), warp=Warp(0.0),
                           epsilon=0.0, variant="opt", generator=torch.Generator().manual_seed(0), stop_tokens={2})
    assert (verdict.accepted, verdict.token, verdict.kind) == (2, None, None)


def test_greedy_epsilon_accepts_a_mismatch_with_probability_epsilon():
    gen = torch.Generator().manual_seed(1)
    kept = sum(verify_chain(tokens=[1], q=None, logits=_one_hot_logits([2, 0]), warp=Warp(0.0), epsilon=0.3,
                            variant="opt", generator=gen).accepted for _ in range(4000))
    assert abs(kept / 4000 - 0.3) < 0.03  # ~5 standard deviations


def _first_tokens(n: int, seed: int = 0, **kw) -> list[int]:
    """Draw x ~ q, judge it, record the first emitted token (x if accepted, else the correction)."""
    gen = torch.Generator().manual_seed(seed)
    logits = _logits(torch.cat([P, BONUS]))
    out = []
    for _ in range(n):
        x = int(torch.multinomial(Q[0], 1, generator=gen))
        verdict = verify_chain(tokens=[x], q=Q, logits=logits, warp=Warp(1.0), generator=gen, **kw)
        out.append(x if verdict.accepted else verdict.token)
    return out


def _p_value(tokens: list[int], expected: torch.Tensor) -> float:
    counts = torch.bincount(torch.tensor(tokens), minlength=V).double()
    expected = expected.double() / expected.double().sum()  # float32 sums differ from 1 in the 8th digit
    return float(chisquare(counts.numpy(), (expected * len(tokens)).numpy()).pvalue)


def test_the_rule_emits_exactly_p():
    assert _p_value(_first_tokens(20000, epsilon=0.0, variant="opt"), P[0]) > 1e-3


def test_a_wrong_residual_is_caught(monkeypatch):
    # A planted bug: corrections drawn from p itself instead of norm(max(0, p − q)).
    monkeypatch.setattr(sampling, "residual", lambda p, q: p)
    assert _p_value(_first_tokens(20000, epsilon=0.0, variant="opt"), P[0]) < 1e-6


def test_epsilon_biases_the_output_by_the_predicted_amount():
    eps = 0.2
    tokens = _first_tokens(20000, epsilon=eps, variant="opt")
    v = sampling.verdicts(P, Q, eps, "opt")
    emitted = Q[0] * v.b[0] + v.reject_prob[0] * v.fallback[0]  # A = q·b + r·P
    assert _p_value(tokens, emitted) > 1e-3  # the emitted distribution is A ...
    assert float(v.bias[0]) > 0.05 and _p_value(tokens, P[0]) < 1e-6  # ... which is measurably not p


def test_judged_positions_carry_the_numbers_the_explainer_shows():
    gen = torch.Generator().manual_seed(3)
    verdict = verify_chain(tokens=[1], q=Q, logits=_logits(torch.cat([P, BONUS])), warp=Warp(1.0), epsilon=0.0,
                           variant="opt", generator=gen)
    j = verdict.judged[0]
    assert j.i == 1 and math.isclose(j.q, 0.5, rel_tol=1e-5) and math.isclose(j.p, 0.25, rel_tol=1e-5)
    assert math.isclose(j.b, 0.5, rel_tol=1e-5) and j.accepted == (j.u < j.b)
    assert math.isclose(j.tv, 0.5 * float((P - Q).abs().sum()), rel_tol=1e-5)
    assert j.bias < 1e-6  # OPT at ε = 0 is exact
    if verdict.accepted:
        assert verdict.kind == "bonus" and math.isclose(verdict.p_token, float(BONUS[0, verdict.token]), rel_tol=1e-5)
    else:
        assert verdict.kind == "correction" and P[0, verdict.token] > Q[0, verdict.token]  # from the residual


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_same_generator_state_same_verdict(temperature):
    logits = _logits(torch.cat([P, P, BONUS]))
    runs = [verify_chain(tokens=[0, 2], q=torch.cat([Q, Q]), logits=logits, warp=Warp(temperature), epsilon=0.0,
                         variant="opt", generator=torch.Generator().manual_seed(9)) for _ in range(2)]
    for run in runs:
        run.tracing_seconds = 0.0  # a clock reading, not a decision
    assert runs[0] == runs[1]
