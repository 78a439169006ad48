"""The three verification rules (specviz.core.rules, specviz.core.verify): exactness, greedy equality,
the planted bug, and the exact "same draft, three rules" expectations.

Two harnesses: a bigram toy (the pure rule, thousands of rounds in seconds: the χ² tests with power),
and the engine on the tiny random pair of test_policies (the rule as the app runs it)."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from specviz.core import verify
from specviz.core.engine import standard_decode
from specviz.core.rules import RULES, DraftOdds, expected_kept
from specviz.core.sampling import Warp
from specviz.core.settings import DecodeSettings, SettingsError
from specviz.core.verify import verify_chain
from tests.test_engine import PROMPT, assert_matches, make_pair
from tests.test_policies import WARPS, assert_joint, exact_joint, first_tokens, pair  # noqa: F401
from tests.drafted import speculative_decode

V, GAMMA, FIRST = 5, 3, 3
_g = torch.Generator().manual_seed(11)
P_LOG = (torch.randn(V, V, generator=_g) * 1.5)  # the target's logits after each previous token
Q_LOG = P_LOG + torch.randn(V, V, generator=_g) * 1.5  # the draft: related, often wrong


# A context-free pair built so that block verification often keeps a prefix of weight w < 1 and then
# draws from norm(max(0, w·p − q)), far from norm(max(0, p − q)): the planted bugs' test bed.
CONTRAST = (torch.tensor([0.7, 0.05, 0.25, 0.0, 0.0]).log().expand(V, V).clone(),
            torch.tensor([0.3, 0.7, 0.0, 0.0, 0.0]).log().expand(V, V).clone())


def _toy_round(prev: int, rule: str, warp: Warp, gen: torch.Generator, tables=None, q_rows=None) -> list[int]:
    """One speculative round of the bigram toy: draft γ tokens from q, judge them, return what it emits.
    q_rows: the draft's warped rows, warp(q_log), when the caller computed them once for many rounds."""
    p_log, q_log = tables or (P_LOG, Q_LOG)
    q_rows = warp(q_log) if q_rows is None else q_rows
    tokens, qs, c = [], [], prev
    for _ in range(GAMMA):
        qd = q_rows[c]
        c = int(torch.multinomial(qd, 1, generator=gen))
        tokens.append(c)
        qs.append(qd)
    logits = p_log[[prev, *tokens]]
    v = verify_chain(tokens=tokens, q=None if warp.greedy else torch.stack(qs), logits=logits, warp=warp,
                     epsilon=0.0, variant="opt", generator=gen, rule=rule)
    return tokens[:v.accepted] + [v.token]


def _toy_first(n: int, rule: str, warp: Warp, seed: int = 0, tables=None) -> list[tuple[int, ...]]:
    gen = torch.Generator().manual_seed(seed)
    q_rows = warp((tables or (P_LOG, Q_LOG))[1])  # the draft's distribution after each token, warped once
    out = []
    for _ in range(n):
        emitted: list[int] = []
        while len(emitted) < FIRST:
            emitted += _toy_round(emitted[-1] if emitted else 0, rule, warp, gen, tables, q_rows)
        out.append(tuple(emitted[:FIRST]))
    return out


def _toy_exact(warp: Warp, tables=None) -> dict[tuple[int, ...], float]:
    p = warp((tables or (P_LOG, Q_LOG))[0]).tolist()
    out = {}
    for xs in itertools.product(range(V), repeat=FIRST):
        prob, prev = 1.0, 0
        for x in xs:
            prob *= p[prev][x]
            prev = x
        if prob > 0:
            out[xs] = prob
    return out


def _toy_p_value(samples, exact, min_expected=5.0) -> float:
    """The χ² p-value of assert_matches (rare cells pooled the same way), returned instead of asserted."""
    n, counts = len(samples), Counter(samples)
    obs, exp, rest_o, rest_e = [], [], 0, 0.0
    for cell, prob in exact.items():
        if prob * n >= min_expected:
            obs.append(counts[cell]), exp.append(prob * n)
        else:
            rest_o, rest_e = rest_o + counts[cell], rest_e + prob * n
    if rest_e > 0:
        obs.append(rest_o), exp.append(rest_e)
    assert sum(obs) == n, "a sample outside the target's support"
    exp = [e * n / sum(exp) for e in exp]
    return float(chisquare(obs, exp).pvalue)


@pytest.mark.parametrize("warp_name", list(WARPS))
@pytest.mark.parametrize("rule", RULES)
def test_each_rule_emits_the_targets_joint_on_the_toy(rule, warp_name):
    warp = WARPS[warp_name]
    assert_matches(_toy_first(3000, rule, warp), _toy_exact(warp))


def test_a_block_residual_without_its_weight_is_caught(monkeypatch):
    # A planted bug: after a kept prefix of weight w < 1, draw from norm(max(0, p − q)) instead of
    # norm(max(0, w·p − q)).
    right = verify.block_residual
    exact = _toy_exact(Warp(1.0), CONTRAST)
    assert _toy_p_value(_toy_first(5000, "block", Warp(1.0), tables=CONTRAST), exact) > 1e-3  # the right one passes
    monkeypatch.setattr(verify, "block_residual", lambda w, p, q: right(1.0, p, q))
    assert _toy_p_value(_toy_first(5000, "block", Warp(1.0), tables=CONTRAST), exact) < 1e-6


def test_block_with_token_wise_h_is_caught(monkeypatch):
    # A second planted bug: h_i = w_i (block's kept prefix chosen as if by weights alone) is not exact.
    monkeypatch.setattr(verify, "block_weights", lambda p_all, q, p_x, q_x: _weights_as_h(p_x, q_x))
    assert _toy_p_value(_toy_first(3000, "block", Warp(1.0), tables=CONTRAST), _toy_exact(Warp(1.0), CONTRAST)) < 1e-6


def _weights_as_h(p_x, q_x):
    w, ws = 1.0, []
    for r in (p_x / q_x).tolist():
        w = min(1.0, w * r)
        ws.append(w)
    return ws, list(ws)


@pytest.mark.parametrize("rule", RULES)
def test_greedy_rules_coincide_on_the_toy(rule):
    gen_a, gen_b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    for prev in range(V):
        assert _toy_round(prev, rule, Warp(0.0), gen_a) == _toy_round(prev, "token", Warp(0.0), gen_b)


# ---- the exact expectations of one draft ---------------------------------------------------------


def _odds_of(tokens, rule="token", seed=0):
    warp = Warp(1.0)
    qs = torch.stack([warp(Q_LOG[c]) for c in [0, *tokens[:-1]]])
    v = verify_chain(tokens=list(tokens), q=qs, logits=P_LOG[[0, *tokens]], warp=warp, epsilon=0.0, variant="opt",
                     generator=torch.Generator().manual_seed(seed), rule=rule)
    return v


@pytest.mark.parametrize("rule", RULES)
def test_expected_kept_is_the_mean_over_the_rules_draws(rule):
    tokens = (1, 3, 2)
    odds = _odds_of(tokens).odds
    mean = sum(_odds_of(tokens, rule, seed).accepted for seed in range(4000)) / 4000
    assert abs(mean - expected_kept(odds)[rule]) < 0.05  # the s.d. of the mean is ≤ 1.5/√4000 ≈ 0.024


def test_averaged_over_drafts_block_keeps_at_least_token_and_token_at_least_match():
    warp = Warp(1.0)
    q = warp(Q_LOG)
    avg = dict.fromkeys(RULES, 0.0)
    per_draft_block_below_token = 0
    for tokens in itertools.product(range(V), repeat=GAMMA):
        prob, prev = 1.0, 0
        for x in tokens:
            prob *= float(q[prev, x])
            prev = x
        e = expected_kept(_odds_of(tokens).odds)
        per_draft_block_below_token += e["block"] < e["token"] - 1e-9
        for r in RULES:
            avg[r] += prob * e[r]
    assert avg["block"] > avg["token"] + 1e-3 > avg["match"]
    assert per_draft_block_below_token > 0  # ... on average: one particular draft can go the other way


def test_the_odds_define_the_expectations_in_closed_form():
    odds = [DraftOdds(q=0.5, p=0.25, h=0.3), DraftOdds(q=0.2, p=0.4, h=0.6)]
    e = expected_kept(odds)
    assert math.isclose(e["token"], 0.5 + 0.5 * 1.0)
    assert math.isclose(e["match"], 0.25 + 0.25 * 0.4)
    assert math.isclose(e["block"], (1 - 0.7 * 0.4) + 0.6)


def test_settings_lock_epsilon_uno_and_trees_to_the_token_rule():
    assert DecodeSettings.checked(rule="block (Sun et al., 2025)").rule == "block"
    for bad in (dict(rule="block", epsilon=0.1), dict(rule="match", variant="uno"), dict(rule="block", drafter="tree"),
                dict(rule="bloc"), dict(rule=["block"])):
        with pytest.raises(SettingsError):
            DecodeSettings.checked(**bad)


# ---- the engine, on the tiny random pair ---------------------------------------------------------


@pytest.mark.parametrize("warp_name", list(WARPS))
@pytest.mark.parametrize("rule", ["block", "match"])
def test_the_engine_emits_the_targets_joint_under_each_rule(pair, rule, warp_name):  # noqa: F811
    warp = WARPS[warp_name]
    samples, rounds = [], []
    for seed in range(400):
        s = DecodeSettings(gamma=GAMMA, temperature=warp.temperature, top_k=warp.top_k, top_p=warp.top_p,
                           max_new_tokens=8, seed=seed, rule=rule)
        toks, rs = first_tokens(pair, s)
        samples.append(toks)
        rounds += rs
    assert_joint(samples, exact_joint(pair, warp))
    assert any(r.extra.kind == "correction" and r.rejected_at >= 2 for r in rounds)
    assert all(d.p is not None and d.h is not None for r in rounds for d in r.draft)


@pytest.mark.parametrize("rule", RULES)
def test_greedy_text_equals_standard_decoding_under_every_rule(rule):
    pair = make_pair()
    for gamma in (1, 3, 6):
        s = DecodeSettings(gamma=gamma, max_new_tokens=20, rule=rule)
        spec = speculative_decode(pair, PROMPT, s)
        assert [t.id for t in spec.tokens] == [t.id for t in standard_decode(pair, PROMPT, s).tokens]
        assert spec.settings.rule == rule
