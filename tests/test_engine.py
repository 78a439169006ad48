"""The decoding loops on tiny random models: exactness, greedy equivalence, caches, limits."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from scipy.stats import chisquare
from transformers import LlamaConfig, LlamaForCausalLM

from specviz.core.engine import standard_decode
from specviz.core.sampling import Warp, residual, verdicts
from specviz.core.settings import DecodeSettings, SettingsError
from specviz.trace import trace_from_json
from tests.tiny_lm import TinyLM
from tests.drafted import speculative_decode, speculative_stream


class CharTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(97 + i) for i in ids)


def tiny_lm(vocab: int, seed: int, sharpness: float, hidden: int = 16, kind: str = "llama") -> torch.nn.Module:
    """A random causal LM over ``vocab`` tokens: transformers' 2-layer Llama, or (kind="fast") the
    lean :class:`tests.tiny_lm.TinyLM`, 4x faster a forward, for the χ² runs.  The head is scaled up
    (``sharpness``) so that p and q differ clearly; TinyLM's by sharpness/40: at PROMPT its pair has
    TV(p, q) 0.80 (the Llama's 0.82) and p's peak 0.80 (0.94), and flatter distributions on average."""
    torch.manual_seed(seed)
    if kind == "fast":
        model, scale = TinyLM(vocab, hidden).eval(), sharpness / 40
    else:
        cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128)
        model, scale = LlamaForCausalLM(cfg).eval(), sharpness
    with torch.no_grad():  # sharpen the random distributions so p and q differ clearly
        model.lm_head.weight.mul_(scale)
    return model


def make_pair(vocab=6, draft_seed=1, target_seed=2, sharp=40.0, eos=(), kind="fast"):
    """A tiny draft/target pair; kind="llama" for transformers' Llama (the χ² runs use the fast kind,
    and one chain and one tree test keep the Llama, so the models' own code path is sampled too)."""
    return SimpleNamespace(
        draft=tiny_lm(vocab, draft_seed, sharp, kind=kind), target=tiny_lm(vocab, target_seed, sharp, kind=kind),
        tokenizer=CharTokenizer(), device=torch.device("cpu"), eos_token_ids=list(eos),
        draft_name="tiny-draft", target_name="tiny-target", preset="tiny", dtype=torch.float32, draft_quant=None,
    )


PROMPT = [0, 3, 1, 2]


@torch.inference_mode()
def next_dist(model, ids, warp):
    return warp(model(torch.tensor([ids])).logits[0, -1])


def run_many(pair, settings: DecodeSettings, n: int) -> list[tuple[int, ...]]:
    out = []
    for seed in range(n):
        s = DecodeSettings(**{**settings.as_dict(), "seed": seed})
        out.append(tuple(t.id for t in speculative_decode(pair, PROMPT, s).tokens))
    return out


def assert_matches(samples, probs: dict, min_expected=5.0):
    """Chi-square goodness of fit of samples against the exact distribution `probs`."""
    n = len(samples)
    cells = sorted(probs, key=lambda c: -probs[c])
    obs, exp, rest_o, rest_e = [], [], 0, 0.0
    counts = {c: 0 for c in cells}
    for s in samples:
        assert s in counts, f"sample {s} has probability 0 under the target"
        counts[s] += 1
    for c in cells:  # pool the rare cells so the test is valid
        if probs[c] * n >= min_expected:
            obs.append(counts[c]), exp.append(probs[c] * n)
        else:
            rest_o += counts[c]
            rest_e += probs[c] * n
    if rest_e > 0:
        obs.append(rest_o), exp.append(rest_e)
    exp_sum = sum(exp)
    exp = [e * n / exp_sum for e in exp]
    stat, pval = chisquare(obs, exp)
    assert pval > 1e-3, f"chi-square p={pval:.2e}: {list(zip(obs, [round(e) for e in exp]))}"


@pytest.mark.parametrize("gamma,top_p,kind", [(1, 1.0, "fast"), (2, 1.0, "llama"), (3, 0.8, "fast")])
def test_speculative_sampling_is_exact(gamma, top_p, kind):
    """First two tokens ~ the target's exact joint distribution (ε = 0); one case on transformers' Llama."""
    pair = make_pair(kind=kind)
    warp = Warp(1.0, 0, top_p)
    exact = {}
    p1 = next_dist(pair.target, PROMPT, warp)
    for x1 in range(6):
        if p1[x1] == 0:
            continue
        p2 = next_dist(pair.target, PROMPT + [x1], warp)
        for x2 in range(6):
            if p2[x2] > 0:
                exact[(x1, x2)] = float(p1[x1] * p2[x2])
    # The draft must actually disagree with the target, or the test proves little.
    q1 = next_dist(pair.draft, PROMPT, warp)
    assert 0.5 * (p1 - q1).abs().sum() > 0.2
    samples = run_many(pair, DecodeSettings(gamma=gamma, temperature=1.0, top_p=top_p, max_new_tokens=2), 1500)
    assert_matches(samples, exact)


def test_over_acceptance_matches_recorded_distribution():
    """With ε > 0 the first token follows A = q·b + r·P, and the recorded bias is TV(A, p)."""
    pair = make_pair()
    warp = Warp(1.0)
    eps = 0.15
    p = next_dist(pair.target, PROMPT, warp)
    q = next_dist(pair.draft, PROMPT, warp)
    b = torch.minimum(torch.ones_like(q), (p + eps) / q)
    r = 1 - (q * b).sum()
    a = q * b + r * residual(p[None], q[None])[0]
    settings = DecodeSettings(gamma=1, epsilon=eps, temperature=1.0, max_new_tokens=2)
    traces = [speculative_decode(pair, PROMPT, DecodeSettings(**{**settings.as_dict(), "seed": s})) for s in range(2500)]
    firsts = [(t.tokens[0].id,) for t in traces]
    assert_matches(firsts, {(x,): float(a[x]) for x in range(6) if a[x] > 0})
    tv_ap = 0.5 * float((a - p).abs().sum())
    assert tv_ap > 0.01  # ε really biases this pair
    pos = traces[0].rounds[0].positions[0]
    assert pos.bias == pytest.approx(tv_ap, abs=1e-5)
    assert pos.reject_prob == pytest.approx(float(r), abs=1e-5)
    assert pos.tv == pytest.approx(0.5 * float((p - q).abs().sum()), abs=1e-5)
    # Thms 4-5 (Yin et al.): for OPT, rejection probability + bias = TV(p, q).
    assert pos.reject_prob + pos.bias == pytest.approx(pos.tv, abs=1e-5)


def test_uno_variant_samples_from_p_after_rejection():
    pair = make_pair()
    p = next_dist(pair.target, PROMPT, Warp(1.0))
    q = next_dist(pair.draft, PROMPT, Warp(1.0))
    v = verdicts(p[None], q[None], 0.0, "uno")
    a = q * v.b[0] + v.reject_prob[0] * p
    settings = DecodeSettings(gamma=1, temperature=1.0, max_new_tokens=2, variant="uno")
    firsts = [(t.tokens[0].id,) for t in
              (speculative_decode(pair, PROMPT, DecodeSettings(**{**settings.as_dict(), "seed": s})) for s in range(2000))]
    assert_matches(firsts, {(x,): float(a[x]) for x in range(6) if a[x] > 0})
    assert float(v.bias[0]) > 0.01  # UNO is biased even at ε = 0


@pytest.mark.parametrize("gamma", [1, 2, 4, 7])
def test_greedy_speculative_equals_standard(gamma):
    pair = make_pair(vocab=11, draft_seed=5, target_seed=6, sharp=10.0)
    for prompt in ([1, 2, 3], [4], [7, 7, 0, 1, 9, 10]):
        s = DecodeSettings(gamma=gamma, temperature=0.0, max_new_tokens=30)
        spec = speculative_decode(pair, prompt, s)
        std = standard_decode(pair, prompt, s)
        assert [t.id for t in spec.tokens] == [t.id for t in std.tokens]
        assert spec.n_tokens == 30 and std.n_tokens == 30
        assert spec.summary().rejections > 0  # rollback was exercised


def test_rollback_with_forced_rejections():
    """A draft that always disagrees (ε = 0, greedy) is rejected at position 1
    every round; the caches must still track the text exactly."""
    pair = make_pair(vocab=7, draft_seed=3, target_seed=4, sharp=10.0)
    head = torch.nn.Linear(16, 7, bias=True)
    with torch.no_grad():  # a draft that always proposes token 6
        head.weight.zero_()
        head.bias.copy_(torch.nn.functional.one_hot(torch.tensor(6), 7).float())
    pair.draft.lm_head = head
    s = DecodeSettings(gamma=4, temperature=0.0, max_new_tokens=25)
    spec = speculative_decode(pair, [1, 2], s)
    std = standard_decode(pair, [1, 2], s)
    assert [t.id for t in spec.tokens] == [t.id for t in std.tokens]
    summ = spec.summary()
    assert summ.rejections >= 5
    for rnd in spec.rounds:
        if rnd.rejected_at is not None:
            assert rnd.extra.kind == "correction"
            assert len(rnd.emitted) == rnd.rejected_at


def test_epsilon_one_accepts_every_draft():
    pair = make_pair(vocab=9, draft_seed=8, target_seed=9, sharp=10.0)
    s = DecodeSettings(gamma=16, epsilon=1.0, temperature=0.0, max_new_tokens=12)
    spec = speculative_decode(pair, [2, 5], s)
    draft_only = standard_decode(SimpleNamespace(**{**vars(pair), "target": pair.draft}), [2, 5], s)
    # One round: γ_eff = 11 drafts, all accepted, then the target's bonus token.
    assert len(spec.rounds) == 1
    assert all(pos.accepted and pos.b == 1.0 for pos in spec.rounds[0].positions)
    assert [t.id for t in spec.tokens[:11]] == [t.id for t in draft_only.tokens[:11]]
    assert spec.tokens[-1].origin == "bonus"
    # And the target really disagrees with the draft somewhere, so ε = 1 changed the text.
    std = standard_decode(pair, [2, 5], s)
    assert [t.id for t in std.tokens] != [t.id for t in spec.tokens]


@pytest.mark.parametrize("gamma,max_new", [(1, 1), (3, 2), (5, 7), (4, 13)])
def test_max_new_tokens_is_exact(gamma, max_new):
    pair = make_pair()
    for seed in range(5):
        s = DecodeSettings(gamma=gamma, temperature=1.0, max_new_tokens=max_new, seed=seed)
        tr = speculative_decode(pair, PROMPT, s)
        assert tr.n_tokens == max_new
        assert tr.stop_reason == "max_new_tokens"
        assert all(len(r.draft) <= gamma for r in tr.rounds)


def test_eos_ends_generation_exactly():
    pair = make_pair(eos=[2])
    seen_eos = 0
    for seed in range(30):
        s = DecodeSettings(gamma=4, temperature=1.0, max_new_tokens=40, seed=seed)
        for tr in (speculative_decode(pair, PROMPT, s), standard_decode(pair, PROMPT, s)):
            ids = [t.id for t in tr.tokens]
            if 2 in ids:
                seen_eos += 1
                assert ids.index(2) == len(ids) - 1, "emitted past EOS"
                assert tr.stop_reason == "eos"
            else:
                assert len(ids) == 40
            for rnd in tr.rounds:  # drafts are truncated at EOS
                d = [t.id for t in rnd.draft]
                assert 2 not in d[:-1]
    assert seen_eos > 10


def test_stream_yields_drafts_then_verdicts_and_stops():
    pair = make_pair()
    s = DecodeSettings(gamma=3, temperature=1.0, max_new_tokens=20)
    kinds = [ev.kind for ev in speculative_stream(pair, PROMPT, s)]
    assert kinds[-1] == "done"
    assert kinds[:4] == ["draft", "draft", "draft", "round"]
    calls = {"n": 0}

    def stop():
        calls["n"] += 1
        return calls["n"] > 2

    tr = speculative_decode(pair, PROMPT, s, should_stop=stop)
    assert tr.stop_reason == "stopped" and len(tr.rounds) == 2


def test_trace_records_consistent_numbers_and_round_trips():
    pair = make_pair()
    s = DecodeSettings(gamma=3, temperature=1.0, max_new_tokens=20, seed=3)
    tr = speculative_decode(pair, PROMPT, s, prompt="abc <script>")
    summ = tr.summary()
    assert summ.tokens == 20
    assert summ.accepted + sum(1 for r in tr.rounds if r.extra) == 20
    assert summ.mean_accepted_length == pytest.approx(1 + summ.accepted / summ.rounds)
    for rnd in tr.rounds:
        for pos, d in zip(rnd.positions, rnd.draft):
            assert pos.q == pytest.approx(d.q)
            assert pos.b == pytest.approx(min(1.0, pos.p / pos.q))
            assert pos.accepted == (pos.u < pos.b)
            assert pos.bias == pytest.approx(0.0, abs=1e-5)  # OPT at ε = 0 is exact
            assert pos.reject_prob == pytest.approx(pos.tv, abs=1e-5)
    back = trace_from_json(tr.to_json())
    assert back.to_dict() == tr.to_dict()
    assert back.text == tr.text


def test_settings_validation():
    with pytest.raises(SettingsError, match="γ"):
        DecodeSettings.checked(gamma=0)
    with pytest.raises(SettingsError, match="finite"):
        DecodeSettings.checked(epsilon=float("nan"))
    with pytest.raises(SettingsError, match="top-p"):
        DecodeSettings.checked(top_p=0)
    with pytest.raises(SettingsError, match="max new tokens"):
        DecodeSettings.checked(max_new_tokens=10**9)
    assert DecodeSettings.checked(gamma="5", variant="Decoding-UNO").variant == "uno"


def test_a_different_drafter_plugs_in_and_stays_exact():
    """Prompt lookup (one-hot q, no model) through the same verify/accept code."""
    from specviz.drafters.prompt_lookup import PromptLookupDrafter

    pair = make_pair(vocab=6)
    drafter = PromptLookupDrafter(vocab_size=6)
    assert drafter.lookup([1, 2, 3, 1, 2], 3) == [3, 1, 2]
    prompt = [0, 1, 2, 0, 1, 2, 0, 1]
    greedy = DecodeSettings(gamma=3, temperature=0.0, max_new_tokens=25)
    spec = speculative_decode(pair, prompt, greedy, drafter=PromptLookupDrafter(6))
    std = standard_decode(pair, prompt, greedy)
    assert [t.id for t in spec.tokens] == [t.id for t in std.tokens]
    assert spec.models["drafter"] == "prompt lookup"
    assert spec.summary().verified > 0
    # Sampling: the first token still follows the target's p exactly.
    p = next_dist(pair.target, prompt, Warp(1.0))
    firsts = []
    for seed in range(1500):
        s = DecodeSettings(gamma=2, temperature=1.0, max_new_tokens=2, seed=seed)
        firsts.append((speculative_decode(pair, prompt, s, drafter=PromptLookupDrafter(6)).tokens[0].id,))
    assert_matches(firsts, {(x,): float(p[x]) for x in range(6) if p[x] > 0})


@pytest.mark.parametrize("variant", ["opt", "uno"])
@pytest.mark.parametrize("eps", [0.0, 0.25, 1.0])
def test_greedy_rule_from_token_ids_equals_the_vector_rule(eps, variant):
    """Greedy rounds skip the [k, V] vectors (sampling.greedy_rule): the same b(x), p(x), q(x),
    rejection probability, TV and bias as the rule and its statistics on one-hot p and q."""
    from specviz.core.sampling import greedy_rule, rule_stats, verdicts

    g = torch.Generator().manual_seed(0)
    vocab, k = 50, 12
    t_ids = torch.randint(0, vocab, (k,), generator=g).tolist()
    x_ids = [t if i % 3 else (t + 1) % vocab for i, t in enumerate(t_ids)]  # matches and misses
    onehot = lambda ids: torch.nn.functional.one_hot(torch.tensor(ids), vocab).float()  # noqa: E731
    p, q = onehot(t_ids), onehot(x_ids)
    v = verdicts(p, q, eps, variant, detail=False)
    r, tv, bias = rule_stats(p, q, v.b, v.fallback)
    rows, xs = torch.arange(k), torch.tensor(x_ids)
    want = list(zip(v.b[rows, xs].tolist(), p[rows, xs].tolist(), q[rows, xs].tolist(), r.tolist(), tv.tolist(),
                    bias.tolist()))
    got = greedy_rule(t_ids, x_ids, eps)
    assert len(got) == k and any(w[1] == 0 for w in want) and any(w[1] == 1 for w in want)  # misses and matches
    for a, b in zip(got, want):
        assert a == pytest.approx(b, abs=1e-6)
    # A rejection falls back on the target's own token, for both variants.
    assert all(int(v.fallback[i].argmax()) == t_ids[i] for i in range(k) if x_ids[i] != t_ids[i])
