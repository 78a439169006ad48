"""The target's executions (specviz.models.executions) and the probe that chooses one.

Batch invariance is the requirement: a k-token verify pass must score every position as a
one-token step would, or speculative decoding no longer samples the target's distribution.  The
int8 execution must meet it exactly (integer accumulation, per-token scales, query-by-query
attention); the float ones within rounding."""

from __future__ import annotations

import pytest
import torch

from specviz.core.engine import standard_decode
from specviz.core.kv import CachedLM
from specviz.core.settings import DecodeSettings
from specviz.hardware import probe
from specviz.hardware.machine import Machine, this_machine
from specviz.models import executions, int8
from specviz.models.tiny import build_tiny_pair
from tests.drafted import speculative_decode
from test_engine import PROMPT, assert_matches, make_pair, next_dist

pytestmark = pytest.mark.skipif(not int8.int8_available(), reason="this torch has no fbgemm int8 kernels")


def _tiny_target(dtype=torch.bfloat16):
    pair = build_tiny_pair(vocab_size=40, sharpness=3.0)
    return pair, pair.target.to(dtype)


def _verify_and_steps(model, ids: list[int], start: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of positions start..start+k-1 scored in one verify pass, and one token at a time."""
    dev = torch.device("cpu")
    with torch.inference_mode():
        a = CachedLM(model, dev)
        a.feed(ids[:start])
        verify = a.feed(ids[:start + k], keep=k).logits.float()
        b = CachedLM(model, dev)
        b.feed(ids[:start])
        steps = torch.stack([b.feed(ids[:start + i + 1]).logits[-1].float() for i in range(k)])
    return verify, steps


def _tv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return 0.5 * (a.softmax(-1) - b.softmax(-1)).abs().sum(-1)


IDS = torch.randint(5, 40, (30,), generator=torch.Generator().manual_seed(3)).tolist()


def test_token_int8_linear_is_bit_identical_in_any_batch():
    w = torch.randn(96, 64) * 0.05
    lin = int8.TokenInt8Linear(int8.int8_channel_weight(w), torch.randn(96))
    x = torch.randn(7, 64) * torch.logspace(-2, 2, 7)[:, None]  # rows of very different magnitudes
    batch = lin(x)
    assert torch.equal(batch, torch.cat([lin(x[i:i + 1]) for i in range(7)]))
    assert torch.equal(lin(x[None])[0], batch)  # [1, k, in] as the models call it
    # and it is a faithful int8 linear: close to the float product
    ref = x @ w.T + lin.bias
    assert ((batch - ref).norm(dim=-1) / ref.norm(dim=-1)).max() < 0.05
    # fbgemm's plain dynamic linear is not invariant: the reason this class exists
    plain = int8.int8_linear(torch.nn.Linear(64, 96).requires_grad_(False))
    assert not torch.equal(plain(x), torch.cat([plain(x[i:i + 1]) for i in range(7)]))


def test_int8_target_scores_a_verify_pass_exactly_as_steps():
    _, bf16 = _tiny_target()
    model = executions.apply(bf16, "int8", copy_model=True)
    assert model.config._attn_implementation == "specviz_invariant"
    for start, k in ((10, 6), (17, 3), (1, 8)):
        verify, steps = _verify_and_steps(model, IDS, start, k)
        assert torch.equal(verify, steps), (start, k)
    # the merged prompt pass (prompt + drafts in one forward) too
    with torch.inference_mode():
        merged = CachedLM(model, torch.device("cpu")).feed(IDS[:16], keep=6).logits.float()
    assert torch.equal(merged, _verify_and_steps(model, IDS, 10, 6)[1])


def test_int8_target_scores_tree_nodes_exactly_as_steps_along_their_path():
    _, bf16 = _tiny_target()
    model = executions.apply(bf16, "int8", copy_model=True)
    dev = torch.device("cpu")
    prefix = IDS[:12]
    # a root child 7 with children 8 and 9; 9 has child 10; a second root child 11
    tokens, parents = [7, 8, 9, 10, 11], [-1, 0, 0, 2, -1]
    with torch.inference_mode():
        lm = CachedLM(model, dev)
        lm.feed(prefix[:-1])
        tree = lm.feed_tree(prefix, tokens, parents).logits.float()  # row 0: prefix's last; then the nodes
        for node, path in ((3, [7, 9, 10]), (1, [7, 8]), (4, [11])):
            seq = CachedLM(model, dev)
            seq.feed(prefix[:-1])
            seq.feed(prefix)
            for i, tok in enumerate(path):
                logits = seq.feed(prefix + path[:i + 1]).logits[-1].float()
            assert torch.equal(tree[1 + node], logits), node


@pytest.mark.parametrize("name", ["bf16", "fp32"])
def test_float_executions_verify_within_rounding(name):
    _, bf16 = _tiny_target()
    model = executions.apply(bf16, name, copy_model=True)
    verify, steps = _verify_and_steps(model, IDS, 10, 6)
    assert _tv(verify, steps).max() <= 0.02


def test_twin_leaves_the_loaded_model_untouched():
    _, bf16 = _tiny_target()
    before = {k: v.clone() for k, v in bf16.state_dict().items()}
    for name in ("fp32", "int8"):
        out = executions.apply(bf16, name, copy_model=True)
        assert out is not bf16
    assert bf16.config._attn_implementation != "specviz_invariant"
    after = bf16.state_dict()
    assert all(after[k].dtype == torch.bfloat16 and torch.equal(after[k], v) for k, v in before.items())


def test_speculative_sampling_with_an_int8_target_is_exact():
    """χ² on the first two tokens with the int8 target: the rule samples the int8 model exactly
    (transformers' Llama: the int8 execution converts its linears)."""
    pair = make_pair(kind="llama")
    pair.target = executions.apply(pair.target, "int8")
    from specviz.core.sampling import Warp

    warp, exact = Warp(1.0), {}
    p1 = next_dist(pair.target, PROMPT, warp)
    for x1 in range(6):
        p2 = next_dist(pair.target, PROMPT + [x1], warp)
        for x2 in range(6):
            if p1[x1] * p2[x2] > 0:
                exact[(x1, x2)] = float(p1[x1] * p2[x2])
    samples = [tuple(t.id for t in speculative_decode(
        pair, PROMPT, DecodeSettings(gamma=3, temperature=1.0, max_new_tokens=2, seed=s)).tokens) for s in range(1200)]
    assert_matches(samples, exact)


def test_greedy_text_is_standard_text_with_an_int8_target():
    pair = build_tiny_pair(vocab_size=40, sharpness=3.0)
    pair.target = executions.apply(pair.target, "int8")
    ids = pair.tokenizer("the cat sat on").input_ids
    for gamma in (2, 5):
        s = DecodeSettings(gamma=gamma, temperature=0.0, max_new_tokens=30)
        assert [t.id for t in speculative_decode(pair, ids, s).tokens] == \
            [t.id for t in standard_decode(pair, ids, s).tokens]


# ---- the probe's arithmetic --------------------------------------------------------------


def test_interpolation_and_expected_tokens():
    curve = {1: 100.0, 2: 120.0, 4: 200.0, 8: 280.0}
    assert probe.interpolate(curve, 3) == 160.0 and probe.interpolate(curve, 16) == 440.0
    assert probe.interpolate(curve, 1) == 100.0
    assert probe.expected_tokens(0.0, 5) == 1.0 and probe.expected_tokens(1.0, 5) == 6.0
    assert probe.expected_tokens(0.5, 1) == pytest.approx(1.5)


def test_choice_follows_the_speculative_rate_not_the_one_token_step():
    """bf16 steps faster but is compute-bound (T(k) = k·T(1)); int8 steps slower but verifies
    k tokens for little more than one: at α = 0.8 int8 predicts the higher speculative rate."""
    curves = {"bf16": {1: 90.0, 2: 180.0, 4: 360.0, 8: 720.0}, "int8": {1: 100.0, 2: 104.0, 4: 110.0, 8: 130.0}}
    choice, predicted = probe.choose(curves, draft_ms=20.0, alpha=0.8)
    assert choice == "int8" and predicted["int8"]["gamma"] > predicted["bf16"]["gamma"] == 1
    assert predicted["bf16"]["standard"] > predicted["int8"]["standard"]  # ... although bf16's step is faster
    # without a draft time, the fastest step wins
    assert probe.choose(curves, None, 0.8)[0] == "bf16"
    # the bound the probe prunes with never undercuts the rate a full curve gives
    for name, c in curves.items():
        assert probe.best_possible(c[1], 20.0, 0.8) >= predicted[name]["rate"] - 1e-3


def test_verify_factor():
    p = probe.Probe({}, "m", {"bf16": {1: 100.0, 2: 200.0, 8: 800.0}}, 20.0, 0.8, "bf16")
    assert p.verify_factor("bf16", 6) == pytest.approx(6.0) and p.verify_factor("int8", 6) is None


# ---- the probe on a model ------------------------------------------------------------------


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_probe_times_chooses_and_remembers(cache):
    _, bf16 = _tiny_target()
    built = []

    def build(name):
        built.append(name)
        return executions.apply(bf16, name, copy_model=True)

    result, model = probe.probe_target(bf16, "tiny-target", torch.bfloat16, 40, build=build, draft_ms=0.1, alpha=0.8,
                                       candidates=("bf16", "fp32", "int8"), busy=lambda: False)
    assert result.measured and result.choice in ("bf16", "int8") and "fp32" not in built  # int8 dominates fp32
    assert set(result.curves) == {"bf16", "int8"} and all(1 in c for c in result.curves.values())
    assert all(v > 0 for c in result.curves.values() for v in c.values())
    assert (model.config._attn_implementation == "specviz_invariant") == (result.choice == "int8")
    # remembered for this machine, torch and model: a warm start reads it
    again = probe.known(this_machine("cpu"), "tiny-target", torch.bfloat16)
    assert again is not None and again.choice == result.choice
    assert again.curves == {e: {k: round(v, 1) for k, v in c.items()} for e, c in result.curves.items()}
    assert probe.known(this_machine("cpu"), "other-model", torch.bfloat16) is None


def test_full_probe_times_every_execution(cache):
    _, bf16 = _tiny_target()
    result, _ = probe.probe_target(bf16, "tiny", torch.bfloat16, 40, draft_ms=0.1, alpha=0.8, full=True,
                                   build=lambda e: executions.apply(bf16, e, copy_model=True),
                                   candidates=("bf16", "fp32", "int8"), busy=lambda: False)
    assert set(result.curves) == {"bf16", "fp32", "int8"}
    assert all(tuple(c) == probe.FULL_KS for c in result.curves.values())


def test_probe_on_a_busy_machine_measures_nothing(cache, monkeypatch):
    _, bf16 = _tiny_target()
    monkeypatch.setattr(probe.VerifyTimer, "__init__", lambda *a, **k: pytest.fail("timed on a busy machine"))
    result, model = probe.probe_target(bf16, "tiny", torch.bfloat16, 40, draft_ms=0.1, alpha=0.8,
                                       build=lambda e: executions.apply(bf16, e, copy_model=True),
                                       candidates=("bf16", "fp32", "int8"), busy=lambda: True)
    assert not result.measured and result.choice == probe.fallback(this_machine("cpu"))
    assert probe.known(this_machine("cpu"), "tiny", torch.bfloat16) is None  # nothing recorded


def test_machine_key_changes_with_what_changes_timings(monkeypatch):
    a = this_machine("cpu")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    b = this_machine("cpu")
    assert a.key != b.key and "emulated" in b.isa_label and b.isa <= ("avx2", "fma")
    amx = Machine("cpu", "Xeon", ("amx_bf16", "avx512f", "avx2"), 2, "2.13")
    avx2 = Machine("cpu", "EPYC", ("avx2", "fma"), 2, "2.13")
    # Whether bf16 is native is read from the label (service.machine_class: the replay key's machine class).
    assert "no native bf16" in avx2.describe() and "no native bf16" not in amx.describe()
    # Unmeasured, every CPU runs int8: it won on both kinds measured (README, This machine).
    assert probe.fallback(amx) == probe.fallback(avx2) == "int8"
    assert probe.fallback(Machine("cuda", "NVIDIA H100", (), 0, "2.13")) == "bf16"
    assert "AVX2" in avx2.describe() and "AMX" in amx.describe()


def test_unknown_execution_is_refused_clearly():
    from specviz.models import ModelError

    with pytest.raises(ModelError, match="not available on cpu"):
        executions.check("bf16+graphs", torch.device("cpu"))
    assert executions.check(" INT8 ", torch.device("cpu")) == "int8" and executions.check(None, torch.device("cpu")) == "auto"


def test_fidelity_report_against_the_reference():
    from types import SimpleNamespace

    from specviz.hardware import fidelity

    ref = build_tiny_pair(vocab_size=40, sharpness=3.0)
    same = fidelity.compare(ref, ref, [("the cat", False), ("a dog", True)], tokens=12)
    assert 0 < same["positions"] <= 24 and same["max_tv"] == 0.0 and same["greedy_agree"] == 1.0
    other = SimpleNamespace(**{**ref.__dict__, "target": executions.apply(ref.target, "int8", copy_model=True)})
    cost = fidelity.compare(ref, other, [("the cat", False), ("a dog", True)], tokens=12)
    assert 0.0 < cost["mean_tv"] <= cost["max_tv"] < 0.5 and 0.0 <= cost["greedy_agree"] <= 1.0
    assert "mean TV" in fidelity.summary_line({"exec": "int8", **cost})


def test_fused_int8_projections_are_bit_identical_to_separate_ones():
    """q/k/v and gate/up share one int8 product each; every output column is computed alone."""
    _, bf16 = _tiny_target()
    fused = executions.apply(bf16, "int8", copy_model=True)
    attn = fused.model.layers[0].self_attn
    assert isinstance(attn.q_proj, int8.FusedPart) and isinstance(fused.model.layers[0].mlp.up_proj, int8.FusedPart)
    separate = int8.quantize_int8(executions.twin(bf16, torch.float32, keep_linears=True), kind="token")
    for m in separate.modules():  # undo the fusion: every linear its own product
        for group in int8.FUSED_GROUPS:
            for i, name in enumerate(group):
                part = getattr(m, name, None)
                if isinstance(part, int8.FusedPart):
                    lin = part.shared.linear
                    start = sum(part.shared.sizes[:i])
                    w = lin.qweight()  # its int8 values, whatever form they run in (fbgemm's, or specviz's kernel)
                    sub = w[start:start + part.out_features]
                    bias = None if lin.bias is None else lin.bias[start:start + part.out_features]
                    setattr(m, name, int8.TokenInt8Linear(sub, bias))
    assert not any(isinstance(m, int8.FusedPart) for m in separate.modules())
    x = torch.tensor([IDS[:11]])
    with torch.inference_mode():
        assert torch.equal(fused(x).logits, separate(x).logits)


def test_a_learned_head_still_recognises_and_reads_an_int8_target():
    from specviz.speculator.model import head_fingerprint

    _, bf16 = _tiny_target()
    q = executions.apply(bf16, "int8", copy_model=True)
    assert head_fingerprint(q) == head_fingerprint(bf16)  # trained on the loaded target: still found
    rows = torch.tensor([0, 3, 17])
    w = bf16.get_output_embeddings().weight.detach().float()[rows]
    got = q.get_output_embeddings().dequantized(rows)
    assert got.shape == w.shape and ((got - w).abs().max(1).values <= w.abs().max(1).values / 127 + 1e-6).all()


def test_an_int8_model_keeps_its_embedding_in_half_precision_with_identical_logits():
    """The embedding is a lookup: its bf16 table widened only where a pass reads it gives the logits
    the float32 table gave, for half the memory (issue 33: RSS at rest)."""
    import copy

    _, bf16 = _tiny_target()
    model = executions.apply(bf16, "int8", copy_model=True)
    emb = model.get_input_embeddings()
    assert isinstance(emb, int8.CompactEmbedding) and emb.weight.dtype == torch.bfloat16
    wide = copy.deepcopy(model)
    wide.get_input_embeddings().__class__ = torch.nn.Embedding
    wide.get_input_embeddings().weight = torch.nn.Parameter(emb.weight.detach().float(), requires_grad=False)
    with torch.inference_mode():
        a = CachedLM(model, torch.device("cpu")).feed(IDS[:20], keep=20).logits
        b = CachedLM(wide, torch.device("cpu")).feed(IDS[:20], keep=20).logits
    assert a.dtype == torch.float32 and torch.equal(a, b)
    draft = int8.quantize_int8(copy.deepcopy(bf16), kind="dynamic")  # the draft's dynamic int8 too
    assert draft.get_input_embeddings().weight.dtype == torch.bfloat16
