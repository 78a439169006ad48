"""Draft-length policies shaping token trees: how deep and how wide a tree grows and how many of
its nodes the target verifies (specviz.core.policy's tree_value / tree_expand / tree_keep), the
drafter obeying them, the engine teaching them from tree rounds, and the rule staying exact
(χ² on the joint of three tokens) and greedy-equal when a measured policy prunes the tree."""

from __future__ import annotations

import copy

import pytest
import torch

from specviz.core import engine
from specviz.core.engine import standard_decode
from specviz.core.settings import DRAFT_STOPS as POLICY_STOPS
from specviz.core.policy import Adaptive, RoundReport, Policy, make_policy
from specviz.core.sampling import Warp
from specviz.core.settings import DecodeSettings
from specviz.drafters import DraftContext, make_drafter
from specviz.core.verify import ROOT
from specviz.models.tiny import build_tiny_pair
from specviz.trace import DRAFT_STOPS
from tests.test_engine import assert_matches, make_pair
from tests.test_policies import first_tokens
from tests.test_tree import PREFIX, exact_joint, tree_settings
from tests.drafted import speculative_decode


def measured_adaptive(a: float = 0.1, b: float = 0.01, t_step: float = 0.02,
                      passes: list[tuple[int, float]] | None = None) -> Adaptive:
    """An adaptive policy that has timed verify passes of a + b·fed seconds and draft passes of
    t_step, and seen verdicts that leave its calibration near â = c."""
    pol = make_policy(DecodeSettings(policy="adaptive", gamma=8, drafter="tree"))
    assert isinstance(pol, Adaptive)
    for fed in (2, 4, 6, 8):
        pol.observe(RoundReport(verdicts=[(0.9, True), (0.1, False)], drafted=2, t_draft=2 * t_step, draft_forwards=2,
                                fed=fed, t_verify=a + b * fed, passes=passes))
    assert pol.verify.line() == pytest.approx((a, b))
    return pol


def test_every_tree_stop_reason_is_named_for_the_page_and_the_trace():
    for reason, words in POLICY_STOPS.items():
        assert words.short and words.sentence and reason in DRAFT_STOPS


def test_fixed_policies_grow_what_the_settings_say():
    const = make_policy(DecodeSettings(drafter="tree"))
    cands = [(0.5, 0.05), (0.2, 0.01)]
    assert const.tree_expand(cands, [0.9, 0.5, 0.2], 2) == (2, None)
    assert const.tree_keep([0.9, 0.5, 0.2], 2) == 3
    assert const.tree_value(0.3, 0.7) == 0.7  # the draft's own (rank) probability: EAGLE-2's score
    conf = make_policy(DecodeSettings(drafter="tree", policy="confidence", tau=0.4, gamma=8))
    assert conf.tree_expand([(0.5, 0.39), (0.4, 0.9)], [0.5, 0.4], 1) == (0, "confidence")
    assert conf.tree_expand([(0.5, 0.4), (0.1, 0.1)], [0.5, 0.1], 1) == (2, None)


def test_heuristic_grows_after_a_tree_round_whose_path_reached_the_bottom():
    pol = make_policy(DecodeSettings(drafter="tree", policy="heuristic", gamma=9))
    assert pol.limit() == 5
    # A sibling rejected before the path went on: not every verdict an acceptance, but the path
    # reached the tree's depth, so the round counts as all accepted (+2).
    pol.observe(RoundReport(verdicts=[(0.9, True), (0.3, False), (0.6, True)], drafted=2, t_draft=0.02, draft_forwards=2,
                            fed=6, t_verify=0.1, full=True))
    assert pol.limit() == 7
    pol.observe(RoundReport(verdicts=[(0.9, True), (0.3, False)], drafted=7, t_draft=0.02, draft_forwards=7, fed=6,
                            t_verify=0.1, full=False))
    assert pol.limit() == 6


def test_adaptive_keeps_the_nodes_that_maximise_expected_tokens_per_second():
    pol = measured_adaptive(a=0.1, b=0.01, t_step=0.02)
    assert pol.tree_value(0.7, 0.2) == pytest.approx(pol.accept_prob(0.7))  # calibrated, not the rank prob
    values = [0.9, 0.5, 0.3, 0.05, 0.01]
    levels = 2

    def rate(n: int) -> float:  # (1 + expected accepted tokens) / (draft time + verify time)
        return (1 + sum(values[:n])) / (levels * pol.t_step + 0.1 + 0.01 * (n + 1))

    best = max(range(1, len(values) + 1), key=rate)
    assert pol.tree_keep(values, levels) == best == 3  # the two smallest are not worth a verify slot
    cheap = measured_adaptive(a=0.1, b=0.0001)
    assert cheap.tree_keep(values, levels) == 5  # nearly free slots: keep everything
    fresh = make_policy(DecodeSettings(drafter="tree", policy="adaptive"))
    assert fresh.tree_keep(values, levels) == 5  # nothing measured yet: the node budget decides


def test_adaptive_expands_a_second_node_only_when_its_extra_row_pays():
    cands = [(0.8, 0.9), (0.35, 0.6)]
    values = [0.8, 0.35, 0.05]
    # No pass of two rows timed yet: a second node is charged a whole pass, which it is not worth.
    pol = measured_adaptive(a=0.1, b=0.002, t_step=0.05)
    assert pol.tree_expand(cands, values, 1) == (1, None)
    # Once a wider pass was timed (an extra row costs 3 ms of a 50 ms pass) it is.
    timed = measured_adaptive(a=0.1, b=0.002, t_step=0.05, passes=[(1, 0.05), (2, 0.053), (3, 0.056)])
    assert timed._draft_pass(2) - timed._draft_pass(1) == pytest.approx(0.003)
    assert timed.tree_expand(cands, values, 1) == (2, None)
    # A tree whose best frontier node is unlikely to be reached is not worth another pass at all.
    assert timed.tree_expand([(0.02, 0.1)], [0.3, 0.02], 1) == (0, "cost")
    # Before anything is measured it stops as the confidence policy does (τ = 0.4).
    fresh = make_policy(DecodeSettings(drafter="tree", policy="adaptive"))
    assert fresh.tree_expand([(0.3, 0.3)], [0.3], 1) == (0, "confidence")


class Narrow(Policy):
    """Expands one node a level, stops below depth 3, keeps the four most valuable nodes."""

    def __init__(self):
        super().__init__(DecodeSettings(drafter="tree"))
        self.asked: list[int] = []

    def tree_expand(self, candidates, values, levels):
        self.asked.append(len(candidates))
        return (1, None) if levels < 3 else (0, "cost")

    def tree_keep(self, values, levels):
        assert values == sorted(values, reverse=True)
        return 4


def test_best_first_drafter_expands_and_keeps_what_the_policy_says():
    pair = build_tiny_pair()
    drafter = make_drafter(pair, tree_settings("best-first", 3, gamma=6, tree_nodes=32, temperature=1.0))
    pol = Narrow()
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        drafter.start(PREFIX)
        trees = list(drafter.grow(DraftContext(PREFIX, 6, Warp(1.0), gen, pair.device), eos=set(), policy=pol))
    full, tree = trees[-2], trees[-1]
    assert full.passes[1:] == [1, 1] and full.forwards == 3  # one node expanded per level
    assert pol.asked == [3, 3, 3]  # offered the k best new nodes each time
    assert max(full.depth(n) for n in range(len(full))) == 3 and len(full) == 9 and full.stop == "cost"
    # The four kept nodes are the most probable paths (their cumulative q), and form a tree.
    def cum(t, n):
        out = 1.0
        while n != ROOT:
            out, n = out * t.q_tok[n], t.parents[n]
        return out

    assert len(tree) == 4 and tree.stop == "cost"
    assert sorted(cum(tree, n) for n in range(4)) == pytest.approx(
        sorted(cum(full, n) for n in range(len(full)))[-4:])
    assert all(p == ROOT or p < n for n, p in enumerate(tree.parents))
    drafter.free()


def test_tree_rounds_teach_the_policy():
    """The engine reports each tree round to the policy: the heuristic's depth moves with the
    verdicts, and the adaptive one times the tree's draft passes and prunes trees once measured."""
    pair = make_pair(vocab=11, draft_seed=5, target_seed=6, sharp=10.0, kind="llama")  # the counts are its
    s = tree_settings("best-first", 2, gamma=8, tree_nodes=32, temperature=1.0, max_new_tokens=40,
                      policy="heuristic", seed=3)
    depths = [max(n.depth for n in r.tree.nodes) for r in speculative_decode(pair, [1, 2, 3], s).rounds if r.tree]
    assert depths[0] == 5 and len(set(depths)) > 1
    seen = []
    real = engine.make_policy
    engine.make_policy = lambda settings: seen.append(real(settings)) or seen[-1]
    try:
        tr = speculative_decode(pair, [1, 2, 3], DecodeSettings(**{**s.as_dict(), "policy": "adaptive"}))
    finally:
        engine.make_policy = real
    pol = seen[0]
    assert pol.draft_rows.n > 0 and pol.verify.n >= len(tr.rounds) - 2 and pol.accept_prob.xs
    stops = {r.draft_stop for r in tr.rounds}
    assert stops & {"cost", "confidence"}  # the policy, not only γ, ended trees


def trained_policy() -> Adaptive:
    """A measured adaptive policy that prunes and narrows make_pair()'s trees: with a cheap draft pass (1 ms
    against a 50 ms verify) and confidences of 0.5 counted as likely accepted, most trees stop by cost and
    some reach γ (300 seeds of each case below: 589-616 rounds stop by cost, 11-57 at γ)."""
    pol = measured_adaptive(a=0.05, b=0.001, t_step=0.001, passes=[(1, 0.001), (2, 0.00105), (3, 0.0011)])
    pol.accept_prob.add([(0.5, True), (0.5, True), (0.2, False), (0.8, True)] * 3)
    return pol


@pytest.mark.parametrize("mode,top_p", [("best-first", 1.0), ("best-first", 0.8), ("iid", 1.0)])
def test_trees_shaped_by_a_measured_policy_stay_exact(mode, top_p, monkeypatch):
    """The first three emitted tokens follow the target's exact joint when the adaptive policy
    decides each tree's depth, width and size (a fresh copy of the same measured policy per run)."""
    trained = trained_policy()
    monkeypatch.setattr(engine, "make_policy", lambda settings: copy.deepcopy(trained))
    pair = make_pair()  # trained_policy() is tuned to this pair: it stops trees by cost and by γ
    warp = Warp(1.0, 0, top_p)
    # A budget that never cuts the first round: the policy alone decides its depth (γ = 3).
    base = tree_settings(mode, 3, gamma=3, tree_nodes=16, temperature=1.0, top_p=top_p, max_new_tokens=8,
                         policy="adaptive")
    samples, sizes, stops, tries = [], set(), set(), 0
    for seed in range(1200):
        first, rounds = first_tokens(pair, DecodeSettings(**{**base.as_dict(), "seed": seed}))
        samples.append(first)
        for r in rounds:
            if r.tree:
                sizes.add(len(r.tree.nodes))
                stops.add(r.draft_stop)
                tries += sum(len(v.tries) > 1 for v in r.tree.visits)
    # The policy shaped the trees (some stopped early, sizes vary) and later siblings were tried.
    assert {"cost", "limit"} <= stops and len(sizes) >= 2 and tries > 50
    assert_matches(samples, exact_joint(pair, warp))


@pytest.mark.parametrize("policy", ["adaptive", "confidence", "heuristic"])
def test_greedy_trees_with_dynamic_policies_equal_standard_decoding(policy):
    pair = make_pair(vocab=11, draft_seed=5, target_seed=6, sharp=10.0)
    for prompt in ([1, 2, 3], [7, 7, 0, 1, 9, 10]):
        s = tree_settings("best-first", 3, gamma=10, tree_nodes=24, temperature=0.0, max_new_tokens=40,
                          policy=policy)
        spec = speculative_decode(pair, prompt, s)
        assert [t.id for t in spec.tokens] == [t.id for t in standard_decode(pair, prompt, s).tokens]
        assert spec.summary().rejections > 0
