"""Tests for specviz.theory (formulas, simulate, batch), specviz.views.theory_plots and sweep_plots.

Each formula is checked against an independent computation: a Monte Carlo of
the process it describes, a brute-force search, or the same quantity written
out separately in numpy.  Seeds are fixed, so the statistical tests are
deterministic; tolerances are a few standard errors.
"""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from specviz import theory as th
from specviz.core.settings import DecodeSettings
from specviz.trace import Position, Round, Token, Trace, theoretical_speedup
from specviz.views import sweep_plots as sp
from specviz.views import theory_plots as tp

PAPER_EXAMPLES = [  # Leviathan et al. §3.5: (c, α) -> (γ*, speedup)
    (0.05, 0.6, 4, 1.92),
    (0.05, 0.8, 8, 3.09),
    (0.1, 0.8, 6, 2.47),
]


# ---- independent reference implementations (numpy, written out) ------------------------------


def np_tokens(alpha: float, gamma: int) -> float:
    # Σ_{k=0..γ} α^k: P(at least k drafts accepted) summed, the tail-sum formula.
    return float(sum(alpha**k for k in range(gamma + 1)))


def np_rule(p: np.ndarray, q: np.ndarray, eps: float, variant: str):
    """b, r, fallback P and A = q·b + r·P written directly from the notes."""
    b = np.where(q > 0, np.minimum(1.0, (p + eps) / np.where(q > 0, q, 1.0)), 1.0)
    r = 1.0 - float((q * b).sum())
    if variant == "uno":
        P = p
    else:
        d = np.maximum(0.0, p - q)
        P = d / d.sum() if d.sum() > 1e-12 else p
    return b, r, P, q * b + r * P


def np_batch_exact(p: np.ndarray, q: np.ndarray, M: int) -> list[float]:
    out, r, prob = [], p.copy(), 1.0
    for _ in range(M):
        prob *= 0.5 * np.abs(q - r).sum()
        out.append(prob)
        d = np.maximum(0.0, r - q)
        r = d / d.sum() if d.sum() > 1e-12 else r
    return out


def pair(vocab=8, seed=0, closeness=0.5, top_k=0, temperature=1.0):
    p, q = th.synthetic_pair(vocab, seed=seed, closeness=closeness, top_k=top_k, temperature=temperature)
    return p, q, p.numpy(), q.numpy()


# ---- tokens per round, speedup, cost ------------------------------------------------------------


@pytest.mark.parametrize("alpha,gamma", [(0.3, 2), (0.6, 4), (0.8, 8), (0.95, 5), (0.0, 3)])
def test_tokens_per_round_vs_monte_carlo(alpha, gamma):
    exp = th.expected_tokens_per_round(alpha, gamma)
    assert exp == pytest.approx(np_tokens(alpha, gamma), rel=1e-12)
    sims = th.simulate_tokens_per_round(alpha, gamma, 200_000, np.random.default_rng(1234))
    assert sims.min() >= 1 and sims.max() <= gamma + 1
    se = sims.std(ddof=1) / math.sqrt(sims.size)
    assert abs(sims.mean() - exp) <= 4 * se + 1e-12


def test_tokens_per_round_edges():
    assert th.expected_tokens_per_round(1.0, 5) == 6.0
    assert th.expected_tokens_per_round(0.7, 0) == 1.0
    assert th.expected_tokens_per_round(0.0, 5) == 1.0
    assert (th.simulate_tokens_per_round(1.0, 5, 100, 0) == 6).all()
    with pytest.raises(ValueError):
        th.expected_tokens_per_round(1.2, 3)
    with pytest.raises(ValueError):
        th.expected_tokens_per_round(0.5, -1)


@pytest.mark.parametrize("alpha,gamma,c", [(0.6, 4, 0.05), (0.8, 8, 0.05), (0.3, 1, 0.5), (1.0, 3, 0.1)])
def test_speedup_matches_formula_and_trace(alpha, gamma, c):
    s = th.expected_speedup(alpha, gamma, c)
    assert s == pytest.approx(np_tokens(alpha, gamma) / (gamma * c + 1), rel=1e-12)
    assert s == theoretical_speedup(alpha, gamma, c)  # one implementation, shared with the run summary
    assert th.expected_speedup(alpha, 0, c) == 1.0


@pytest.mark.parametrize("alpha,gamma,c", [(0.6, 4, 0.05), (0.8, 8, 0.05), (0.3, 1, 0.5), (1.0, 3, 0.1)])
def test_a_verify_factor_of_one_is_the_textbook_theorem(alpha, gamma, c):
    assert th.expected_speedup(alpha, gamma, c, 1.0) == th.expected_speedup(alpha, gamma, c)
    assert th.expected_speedup(alpha, gamma, c, v=1.0) == theoretical_speedup(alpha, gamma, c)


def test_the_verify_factor_by_hand():
    """α = 0.8, γ = 4, c = 0.05, a verify pass of 2.6 steps: E = (1 − 0.8⁵)/0.2 = 3.3616 tokens per
    round for 4·0.05 + 2.6 = 2.8 steps: 1.2006× (the textbook says 3.3616 / 1.2 = 2.8013×)."""
    assert th.expected_speedup(0.8, 4, 0.05, 2.6) == pytest.approx(3.3616 / 2.8, rel=1e-12)
    assert th.expected_speedup(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2, rel=1e-12)
    # Every draft accepted (α = 1): γ + 1 tokens.
    assert th.expected_speedup(1.0, 3, 0.1, 2.0) == pytest.approx(4 / 2.3)
    # A verify pass as dear as the tokens it can yield: no gain even with free drafts.
    assert th.expected_speedup(1.0, 4, 0.0, 5.0) == pytest.approx(1.0)


def test_dividing_the_draft_by_the_verify_pass_overstates_by_v():
    """What the page showed before: c measured against the verify pass, textbook formula.  That
    counts time in verify passes, so it is v times Thm 3.8 with c and v per standard step."""
    alpha, gamma, c, v = 0.95, 5, 0.25, 2.6
    per_verify = th.expected_speedup(alpha, gamma, c / v)
    assert per_verify == pytest.approx(v * th.expected_speedup(alpha, gamma, c, v))
    assert per_verify > 1 > th.expected_speedup(alpha, gamma, c, 4.7)  # the EPYC's bf16 verify over 6 tokens


def test_verify_factor_is_checked_and_moves_the_optimal_gamma():
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            th.expected_speedup(0.8, 4, 0.05, bad)
    # A dearer verify pass is worth amortising over longer drafts.
    g1, s1 = th.optimal_gamma(0.8, 0.05, 64)
    g3, s3 = th.optimal_gamma(0.8, 0.05, 64, v=3.0)
    assert g3 > g1 and s3 < s1
    assert th.sweep_theory(0.8, 0.05, [2, 5], v=3.0)["speedup"] == [th.expected_speedup(0.8, g, 0.05, 3.0) for g in (2, 5)]


@pytest.mark.parametrize("c,alpha,g_star,speedup", PAPER_EXAMPLES)
def test_optimal_gamma_paper_examples(c, alpha, g_star, speedup):
    g, s = th.optimal_gamma(alpha, c)
    assert g == g_star
    assert round(s, 2) == speedup


@settings(max_examples=60, deadline=None, derandomize=True)
@given(alpha=st.floats(0.0, 0.99), c=st.floats(0.0, 1.5), gmax=st.integers(1, 40))
def test_optimal_gamma_vs_brute_force(alpha, c, gmax):
    gs = np.arange(1, gmax + 1)
    speed = np.array([np_tokens(alpha, int(g)) for g in gs]) / (gs * c + 1)
    g, s = th.optimal_gamma(alpha, c, gmax)
    assert s == pytest.approx(speed.max(), rel=1e-9)
    assert speed[g - 1] >= speed.max() * (1 - 1e-9)
    # Some γ beats plain decoding exactly when α > c.
    assert th.speculation_helps(alpha, c) == (alpha > c)
    if alpha > c + 1e-9:  # (1 + α rounds to 1 for a tiny α)
        assert s > 1.0
    else:
        assert s <= 1.0 + 1e-12


def test_gamma_one_lower_bound():
    # Leviathan et al.: if α > c, γ = 1 gives (1 + α)/(1 + c).
    assert th.expected_speedup(0.5, 1, 0.2) == pytest.approx(1.5 / 1.2)


@pytest.mark.parametrize("alpha,gamma,c_hat", [(0.6, 4, 0.05), (0.8, 8, 0.0), (0.2, 3, 1.0)])
def test_arithmetic_cost_factor(alpha, gamma, c_hat):
    f = th.arithmetic_cost_factor(alpha, gamma, c_hat)
    ref = (1 - alpha) * (gamma * c_hat + gamma + 1) / (1 - alpha ** (gamma + 1))
    assert f == pytest.approx(ref, rel=1e-12)
    assert f >= 1.0


def test_sweep_theory():
    sw = th.sweep_theory(0.7, 0.1, [1, 2, 3], c_hat=0.1)
    assert sw["gamma"] == [1, 2, 3]
    assert sw["speedup"] == [th.expected_speedup(0.7, g, 0.1) for g in (1, 2, 3)]
    assert sw["tokens_per_round"][2] == pytest.approx(np_tokens(0.7, 3))
    assert len(sw["cost_factor"]) == 3
    assert th.sweep_theory(0.7, 0.1)["gamma"] == list(range(1, 17))


# ---- Yin et al. Thm 1 -----------------------------------------------------------------------------------


def test_expected_rejections_sums_tv():
    assert th.expected_rejections([0.1, 0.2, float("nan"), 0.3]) == pytest.approx(0.6)
    assert th.expected_rejections(torch.tensor([0.5, 0.25])) == pytest.approx(0.75)
    assert th.expected_rejections([]) == 0.0


@pytest.mark.parametrize("gamma", [None, 1, 3])
def test_theorem1_by_simulation_markov_chain(gamma):
    # Several positions whose distributions depend on the previous token, generated
    # sequentially (accepted draft or correction becomes the context).
    P, Q = th.synthetic_chain(length=10, vocab=5, seed=3, closeness=0.5)
    sim = th.simulate_rejections(P, Q, 6000, 7, gamma=gamma)
    se = math.hypot(sim.se_rejections, sim.se_sum_tv)
    assert abs(sim.mean_rejections - sim.mean_sum_tv) <= 4 * se
    assert sim.mean_sum_tv == pytest.approx(sim.mean_sum_reject_prob, abs=1e-9)  # r = TV at ε = 0
    if gamma is None:
        assert sim.mean_verified == 10
    else:
        assert sim.mean_verified < 10  # bonus positions are not verified


def test_theorem1_fixed_rows_against_numpy_sum():
    # Context-free rows: Σ TV is a constant, computed independently.
    rows = [th.synthetic_pair(6, seed=s, closeness=0.4) for s in range(8)]
    P = torch.stack([p for p, _ in rows])
    Q = torch.stack([q for _, q in rows])
    tv_sum = sum(0.5 * np.abs(p.numpy() - q.numpy()).sum() for p, q in rows)
    sim = th.simulate_rejections(P, Q, 8000, 11)
    assert sim.mean_sum_tv == pytest.approx(tv_sum, rel=1e-9)
    assert abs(sim.mean_rejections - tv_sum) <= 4 * sim.se_rejections


def test_rejections_with_over_acceptance():
    # With ε > 0 the rejection count follows Σ r (r = 1 − Σ q·b) and falls below Σ TV.
    P, Q = th.synthetic_chain(length=8, vocab=5, seed=5, closeness=0.5)
    sim = th.simulate_rejections(P, Q, 6000, 3, epsilon=0.1)
    assert abs(sim.mean_rejections - sim.mean_sum_reject_prob) <= 4 * math.hypot(sim.se_rejections, sim.se_sum_reject_prob)
    assert sim.mean_rejections < sim.mean_sum_tv - 10 * sim.se_rejections


def _pos(i, tv, accepted, r=None):
    return Position(i=i, q=0.5, p=0.4, b=0.8, u=0.3 if accepted else 0.9, accepted=accepted,
                    reject_prob=tv if r is None else r, tv=tv, bias=0.0)


def make_trace(epsilon=0.0) -> Trace:
    """Round 0: accept, reject at 2 (+ correction).  Round 1: accept both, bonus.
    Round 2: reject at 1."""
    rounds = [
        Round(0, 0, positions=[_pos(1, 0.1, True), _pos(2, 0.6, False)],
              emitted=[Token(1, "a", "accepted"), Token(2, "b", "correction")]),
        Round(1, 2, positions=[_pos(1, 0.2, True), _pos(2, 0.3, True)],
              emitted=[Token(3, "c", "accepted"), Token(4, "d", "accepted"), Token(5, "e", "bonus")]),
        Round(2, 5, positions=[_pos(1, 0.5, False, r=0.4)], emitted=[Token(6, "f", "correction")]),
    ]
    return Trace("speculative", "hi", 1, DecodeSettings(gamma=2, epsilon=epsilon), {}, "cpu", rounds=rounds, t_total=1.0)


def test_running_tv_vs_rejections_on_trace():
    idx, cum_tv, cum_rej = th.running_tv_vs_rejections(make_trace())
    assert idx == [0, 1, 2, 3, 5]  # position 4 was a bonus token: never verified
    assert cum_tv == pytest.approx([0.1, 0.7, 0.9, 1.2, 1.7])
    assert cum_rej == [0, 1, 1, 1, 2]
    assert cum_tv[-1] == pytest.approx(make_trace().summary().sum_tv)
    assert cum_rej[-1] == make_trace().summary().rejections
    assert th.running_tv_vs_rejections(None) == ([], [], [])
    std = Trace("standard", "hi", 1, DecodeSettings(), {}, "cpu", rounds=[Round(0, 0, emitted=[Token(1, "a", "target")])])
    assert th.running_tv_vs_rejections(std) == ([], [], [])


# ---- exactness of one position of the rule ---------------------------------------------------------------------


def test_emitted_token_is_p_at_epsilon_zero():
    p, q, pn, qn = pair(vocab=8, seed=2, closeness=0.3, temperature=2.0)
    n = 40_000
    ys = th.speculative_emit(p, q, 0.0, "opt", n, 99)
    counts = np.bincount(ys.numpy(), minlength=8)
    assert (n * pn >= 5).all()
    assert chisquare(counts, n * pn).pvalue > 1e-3
    assert np.allclose(th.emitted_distribution(p, q, 0.0).numpy(), pn, atol=1e-12)


@pytest.mark.parametrize("eps,variant", [(0.05, "opt"), (0.2, "opt"), (0.0, "uno"), (0.05, "uno")])
def test_emitted_token_matches_A_with_over_acceptance(eps, variant):
    p, q, pn, qn = pair(vocab=8, seed=4, closeness=0.3, temperature=2.0)
    _, _, _, A = np_rule(pn, qn, eps, variant)
    assert np.allclose(th.emitted_distribution(p, q, eps, variant).numpy(), A, atol=1e-12)
    n = 40_000
    counts = np.bincount(th.speculative_emit(p, q, eps, variant, n, 5).numpy(), minlength=8)
    assert chisquare(counts, n * A).pvalue > 1e-3
    # The test has power: the output is measurably not p.
    assert chisquare(counts, n * pn).pvalue < 1e-6


# ---- Yin et al. Thms 4–5: Pareto front -------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pareto_identity_for_opt(seed):
    p, q, pn, qn = pair(vocab=12, seed=seed, closeness=0.5)
    tv = 0.5 * np.abs(pn - qn).sum()
    for eps in [0.0, 1e-3, 0.01, 0.05, 0.2, 1.0]:
        r, bias = th.tradeoff_point(p, q, eps, "opt")
        b, r_np, _, A = np_rule(pn, qn, eps, "opt")
        assert r == pytest.approx(r_np, abs=1e-12)
        assert bias == pytest.approx(0.5 * np.abs(A - pn).sum(), abs=1e-12)
        assert bias == pytest.approx(np.maximum(0.0, qn * b - pn).sum(), abs=1e-12)  # Thm 4–5's bias formula
        assert r + bias == pytest.approx(tv, abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_uno_above_the_front(seed):
    p, q, pn, qn = pair(vocab=12, seed=seed, closeness=0.5)
    tv = 0.5 * np.abs(pn - qn).sum()
    r, bias = th.tradeoff_point(p, q, 0.0, "uno")
    assert bias > 1e-3 and r + bias > tv + 1e-3  # biased even at ε = 0
    for eps in [0.01, 0.05, 0.2]:
        r, bias = th.tradeoff_point(p, q, eps, "uno")
        assert r + bias >= tv - 1e-12


def test_pareto_front_and_points():
    xs, ys = th.pareto_front(0.4, n=5)
    assert (xs[0], ys[0]) == (0.0, 0.4)
    assert xs[-1] == pytest.approx(0.4) and ys[-1] == pytest.approx(0.0)
    assert all(x + y == pytest.approx(0.4) for x, y in zip(xs, ys))
    p, q, _, _ = pair()
    pts = th.pareto_points(p, q, [0.0, 0.1])
    assert [(d["variant"], d["epsilon"]) for d in pts] == [("opt", 0.0), ("opt", 0.1), ("uno", 0.0), ("uno", 0.1)]
    with pytest.raises(ValueError):
        th.pareto_front(1.5)


# ---- Yin et al. Thm 3: batch drafts ------------------------------------------------------------------------------


@pytest.mark.parametrize("top_k", [0, 8])
def test_batch_recursion_vs_monte_carlo(top_k):
    p, q, pn, qn = pair(vocab=24, seed=3, closeness=0.5, top_k=top_k)
    M = 12
    exact = th.batch_rejection_exact(p, q, M)
    assert exact == pytest.approx(np_batch_exact(pn, qn, M), abs=1e-12)
    mc, se = th.batch_rejection_mc(p, q, M, 20_000, 17)
    for e, f, s in zip(exact, mc, se):
        assert abs(f - e) <= 4 * max(s, math.sqrt(e * (1 - e) / 20_000)) + 1e-9
    assert all(b <= a + 1e-12 for a, b in zip(exact, exact[1:]))  # more drafts never hurt
    floor = th.batch_rejection_floor(p, q)
    assert exact[0] == pytest.approx(0.5 * np.abs(pn - qn).sum())  # M = 1 is ordinary SD: TV
    assert exact[-1] > 0 and exact[-1] >= floor - 1e-12


def test_batch_levels_off_at_the_floor():
    # Top-k applied to both models leaves p mass where q is 0: never drafted, so
    # some rejections remain however many drafts are tried.
    p, q, pn, qn = pair(vocab=32, seed=3, closeness=0.5, top_k=8)
    floor = th.batch_rejection_floor(p, q)
    assert floor == pytest.approx(pn[qn == 0].sum()) and floor > 0.05
    exact = th.batch_rejection_exact(p, q, 30)
    assert exact[0] > exact[4] > floor
    assert exact[-1] == pytest.approx(floor, abs=1e-9)
    # Full support: still positive at M = 30, and the decrease has slowed to a crawl.
    p2, q2, _, _ = pair(vocab=32, seed=3, closeness=0.5)
    e2 = th.batch_rejection_exact(p2, q2, 30)
    assert e2[-1] > 0.01 and e2[-1] / e2[-2] > 0.9 > e2[1] / e2[0]


def test_batch_procedure_is_exact():
    p, q, pn, qn = pair(vocab=8, seed=6, closeness=0.3, temperature=2.0)
    n = 30_000
    _, tokens = th.batch_sample(p, q, 4, n, 21)
    counts = np.bincount(tokens.numpy(), minlength=8)
    assert chisquare(counts, n * pn).pvalue > 1e-3


def test_synthetic_pair():
    p, q = th.synthetic_pair(10, seed=1, closeness=1.0)
    assert torch.allclose(p, q) and p.dtype == torch.float64
    assert float(p.sum()) == pytest.approx(1.0)
    a = th.synthetic_pair(10, seed=1, closeness=0.2)
    b = th.synthetic_pair(10, seed=1, closeness=0.2)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert th.tv_distance(*th.synthetic_pair(10, 1, 0.9)) < th.tv_distance(*th.synthetic_pair(10, 1, 0.1))
    p, q = th.synthetic_pair(10, seed=1, closeness=0.5, top_k=3)
    assert int((p > 0).sum()) == 3 and int((q > 0).sum()) == 3


# ---- plots ---------------------------------------------------------------------------------------------------------


def by_name(fig: go.Figure, name: str):
    found = [t for t in fig.data if (t.name or "").replace("<br>", " ") == name]  # long names wrap for phones
    assert found, f"no trace named {name!r} in {[t.name for t in fig.data]}"
    return found[0]


def is_message(fig: go.Figure) -> bool:
    return isinstance(fig, go.Figure) and not fig.data and bool(fig.layout.annotations)


@pytest.mark.parametrize("c,alpha,g_star,speedup", PAPER_EXAMPLES)
def test_speedup_curves_marks_optimum(c, alpha, g_star, speedup):
    fig = tp.speedup_curves(alpha, c, gamma_max=16)
    opt = by_name(fig, "optimal γ")
    assert (opt.x[0], opt.y[0]) == th.optimal_gamma(alpha, c, 16)
    assert opt.x[0] == g_star
    curve = by_name(fig, "expected speedup")
    assert list(curve.y) == [th.expected_speedup(alpha, g, c) for g in range(1, 17)]
    assert by_name(fig, "expected tokens per round").yaxis == "y2"
    assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text


def test_speedup_curves_measured_and_edge_cases():
    fig = tp.speedup_curves(0.7, 0.1, 12, measured={"alpha": 0.7, "c": 0.1, "gamma": 5, "speedup": 2.1})
    m = by_name(fig, "measured (spec ÷ standard tok/s)")
    assert (m.x[0], m.y[0]) == (5, 2.1)
    # α and c default to the measured run's own.
    fig = tp.speedup_curves(None, None, measured={"alpha": 0.6, "c": 0.05, "gamma": 4, "speedup": 1.5})
    assert by_name(fig, "optimal γ").x[0] == 4
    assert "no γ helps" in tp.speedup_curves(0.1, 0.3).layout.title.subtitle.text.replace("<br>", " ")
    assert is_message(tp.speedup_curves(None, None))
    assert is_message(tp.speedup_curves(None, 0.1, measured={}))
    assert is_message(tp.speedup_curves(2.0, 0.1))  # bad input: a message, not an exception


def test_tokens_and_cost_plots():
    fig = tp.tokens_per_round_curves([0.5, 0.8], gamma_max=6)
    c = by_name(fig, "α = 0.80")
    assert list(c.y) == pytest.approx([np_tokens(0.8, g) for g in range(7)])
    assert by_name(tp.tokens_per_round_curves(0.6), "α = 0.60")
    assert is_message(tp.tokens_per_round_curves(None)) and is_message(tp.tokens_per_round_curves([]))
    fig = tp.cost_factor_curve(0.7, 0.05, 8)
    assert list(fig.data[0].y) == pytest.approx([th.arithmetic_cost_factor(0.7, g, 0.05) for g in range(1, 9)])
    assert is_message(tp.cost_factor_curve(None, 0.1))


def test_theorem1_plot():
    fig = tp.theorem1_plot(make_trace())
    actual = by_name(fig, "actual rejections")
    assert list(actual.x) == pytest.approx([0.1, 0.7, 0.9, 1.2, 1.7])
    assert list(actual.y) == [0, 1, 1, 1, 2]
    assert by_name(fig, "y = x (Thm 1)")
    fig = tp.theorem1_plot(make_trace(epsilon=0.1))
    assert by_name(fig, "Σ r (expected at this ε)")
    assert is_message(tp.theorem1_plot(None))
    assert is_message(tp.theorem1_plot(Trace("speculative", "", 0, DecodeSettings(), {}, "cpu")))
    assert is_message(tp.theorem1_plot("not a trace"))


def test_pareto_plot():
    p, q, pn, qn = pair(vocab=12, seed=1)
    tv = th.tv_distance(p, q)
    pts = th.pareto_points(p, q, [0.0, 0.05])
    fig = tp.pareto_plot(tv, pts)
    front = by_name(fig, "Pareto front: rejection + bias = TV")
    assert front.y[0] == pytest.approx(tv) and front.x[-1] == pytest.approx(tv)
    opt = by_name(fig, "Decoding-OPT")
    assert list(opt.x) == [d["reject_prob"] for d in pts if d["variant"] == "opt"]
    assert by_name(fig, "Decoding-UNO")
    assert is_message(tp.pareto_plot(None, None)) and is_message(tp.pareto_plot(None, []))
    assert len(tp.pareto_plot(None, pts).data) == 2  # points without a front
    assert len(tp.pareto_plot(tv, [{"variant": "opt"}]).data) == 1  # incomplete points skipped


def test_pareto_points_with_their_own_tv_land_on_the_front_at_every_epsilon():
    """The recorded ε sweep: each run's rejection and bias are over its own positions, so each is drawn as a fraction
    of that run's TV; Decoding-OPT then sits on x + y = 1 (never inside the shade), UNO on or above it."""
    import json
    from pathlib import Path

    from specviz.ui.tabs import sweep_frame

    rows = json.loads((Path(__file__).resolve().parents[1] / "assets" / "sweeps.json").read_text())["epsilon"]
    fig = sweep_frame("epsilon", rows, "recorded").pareto
    opt, uno = by_name(fig, "Decoding-OPT"), by_name(fig, "Decoding-UNO")
    for x, y in zip(opt.x, opt.y):
        assert x + y == pytest.approx(1.0, abs=0.01)
    assert all(x + y >= 1.0 - 0.01 for x, y in zip(uno.x, uno.y))
    assert "own positions" in fig.layout.title.subtitle.text.replace("<br>", " ")
    assert fig.layout.xaxis.range[1] > max(opt.x) and fig.layout.yaxis.range[1] > max(opt.y)  # no label cut


def test_batch_plot():
    p, q, _, _ = pair(vocab=16, seed=2, top_k=6)
    fig = tp.batch_plot(p, q, M_max=6, n_mc=2000, seed=1)
    assert list(by_name(fig, "exact: Π TV(q, r<sub>m−1</sub>)").y) == pytest.approx(th.batch_rejection_exact(p, q, 6))
    assert len(by_name(fig, "Monte Carlo (2,000 runs)").y) == 6
    assert "Monte Carlo" in fig.layout.title.subtitle.text.replace("<br>", " ")
    assert is_message(tp.batch_plot(None, None))
    assert is_message(tp.batch_plot([1.0, -1.0], [0.5, 0.5]))


def test_gamma_sweep_plot():
    results = [{"gamma": g, "speedup": 1.0 + 0.1 * g, "alpha": 0.7, "c": 0.1} for g in (4, 1, 2, 8)]
    fig = sp.gamma_sweep_plot(results, None, None)
    meas = by_name(fig, "measured (spec ÷ standard tok/s)")
    assert list(meas.x) == [1, 2, 4, 8]
    assert by_name(fig, "optimal γ").x[0] == th.optimal_gamma(0.7, 0.1, 8)[0]
    assert by_name(fig, "Thm 3.8, textbook: verify = 1 step (α=0.70, c=0.10)")
    assert "verify cost not measured" in fig.layout.title.subtitle.text.replace("<br>", " ")
    assert is_message(sp.gamma_sweep_plot(None, 0.7, 0.1))
    assert is_message(sp.gamma_sweep_plot([], None, None))
    assert is_message(sp.gamma_sweep_plot([{"gamma": None}], None, None))
    # No α / c: measured points only.
    fig = sp.gamma_sweep_plot([{"gamma": 2, "speedup": 1.3}], None, None)
    assert [t.name for t in fig.data] == ["measured (spec ÷ standard tok/s)"]


def test_gamma_sweep_plot_draws_theory_with_the_verify_cost_measured_at_each_gamma():
    """The recorded sweep's measured speedups sat above the textbook curve; with v per γ the theory
    is Thm 3.8 with that γ's verify factor, and the textbook curve stays, dashed, beside it."""
    vs = {1: 1.05, 2: 1.1, 4: 1.3, 8: 2.0}
    results = [{"gamma": g, "speedup": 1.0 + 0.1 * g, "alpha": 0.9, "c": 0.2, "v": v} for g, v in vs.items()]
    fig = sp.gamma_sweep_plot(results, None, None)
    curve = by_name(fig, "Thm 3.8 with the verify cost measured at each γ")
    assert list(curve.x) == [1, 2, 4, 8]
    assert list(curve.y) == pytest.approx([th.expected_speedup(0.9, g, 0.2, v) for g, v in vs.items()])
    textbook = by_name(fig, "Thm 3.8, textbook: verify = 1 step (α=0.90, c=0.20)")
    assert textbook.line.dash == "dash" and textbook.y[7] == pytest.approx(th.expected_speedup(0.9, 8, 0.2))
    own = by_name(fig, "Thm 3.8 at each run's own α, c, v")
    assert list(own.y) == pytest.approx(list(curve.y))
    best = max(vs, key=lambda g: th.expected_speedup(0.9, g, 0.2, vs[g]))
    assert by_name(fig, "optimal γ").x[0] == best
    assert "1.05–2.00 standard steps" in fig.layout.title.subtitle.text.replace("<br>", " ")


def test_theory_tab_draws_the_verify_factor_beside_the_textbook():
    fig = tp.speedup_curves(0.8, 0.05, 16, None, v=2.6)
    with_v = by_name(fig, "expected speedup (verify = 2.60 steps)")
    assert with_v.y[3] == pytest.approx(th.expected_speedup(0.8, 4, 0.05, 2.6))
    assert by_name(fig, "textbook (verify = 1 step)").y[3] == pytest.approx(th.expected_speedup(0.8, 4, 0.05))
    assert "verify = 2.60 steps" in fig.layout.title.subtitle.text.replace("<br>", " ")
    # No γ pays when a verify pass costs more than every draft accepted could yield.
    assert "no γ helps" in tp.speedup_curves(0.5, 0.05, 16, None, v=2.5).layout.title.subtitle.text.replace("<br>", " ")
    assert [t.name for t in tp.speedup_curves(0.8, 0.05).data if t.name.startswith("textbook")] == []


def test_epsilon_sweep_plot():
    results = [
        {"epsilon": e, "alpha": 0.5 + e, "speedup": 1.5 + e, "mean_bias": e / 2, "first_divergence": 10, "edit_distance": 3}
        for e in (0.1, 0.0, 0.2)
    ]
    fig = sp.epsilon_sweep_plot(results)
    assert list(by_name(fig, "alpha (OPT)").x) == [0.0, 0.1, 0.2]
    assert list(by_name(fig, "mean_bias (OPT)").y) == [0.0, 0.05, 0.1]
    assert "edit distance: 3" in by_name(fig, "speedup (OPT)").text[0]
    results.append({"epsilon": 0.0, "alpha": 0.4, "speedup": 1.2, "mean_bias": 0.1, "variant": "uno"})
    assert by_name(sp.epsilon_sweep_plot(results), "alpha (UNO)")
    assert is_message(sp.epsilon_sweep_plot(None)) and is_message(sp.epsilon_sweep_plot([]))
    assert is_message(sp.epsilon_sweep_plot([{"alpha": 0.3}]))
