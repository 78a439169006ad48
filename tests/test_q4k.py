"""GGUF's Q4_K matrices as stored (specviz.models.q4k): the kernel against its torch oracle to the bit, batch
invariance, llama.cpp's dequantization, and an int8 target taking them (verify = steps; greedy = standard)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specviz.core.engine import standard_decode
from specviz.core.settings import DecodeSettings
from specviz.models import executions, int8, kernels, lean, q4k, q6k
from tests.drafted import speculative_decode
from tests.gguf_blocks import q4k_encode, q6k_encode
from test_lean_target import _counting, _steps_logits, _verify_logits

needs_kernel = pytest.mark.skipif(not int8.int8_available() or not kernels.matches(policy=False),
                                  reason="specviz's kernel needs an x86 CPU with AVX2 and a C++ compiler")
pytestmark = needs_kernel


@pytest.fixture(autouse=True)
def _kernel_on(monkeypatch):
    monkeypatch.setenv("SPECVIZ_Q4K", "1")  # the default (where the kernel runs), whatever the caller's environment
    kernels.set_enabled(True)
    yield
    kernels.set_enabled(None)


@pytest.fixture(params=["avx2", "vnni"])
def isa(request, monkeypatch):
    """Each kernel test on each instruction set the library was built for: AVX2, and AVX-512 VNNI where the CPU
    has it (the library picks VNNI there: the same bits, tests on both)."""
    if request.param == "vnni" and not kernels.VNNI <= kernels._cpu_flags():
        pytest.skip("this CPU has no AVX-512 VNNI: its kernels cannot run here")
    ops = torch.ops.specviz
    monkeypatch.setattr(q4k, "linear", lambda x, w, bias=None: ops.q4k_linear_isa(x, w, bias, request.param))
    monkeypatch.setattr(q6k, "linear", lambda x, w, bias=None: ops.q6k_linear_isa(x, w, bias, request.param))
    return request.param


def test_q6k_records_are_llama_cpps_values_and_the_kernel_is_its_oracle_to_the_bit(isa):
    import gguf

    gen = np.random.default_rng(1)
    w = gen.standard_normal((24, 1280)).astype(np.float32) * gen.uniform(0.1, 3, (24, 1))
    w[3] = 0.0  # a zero row
    raw = q6k_encode(w)
    rec = q6k.records(raw)
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q6_K)
    assert np.array_equal(q6k.dequantize(rec).numpy(), ref.astype(np.float32))
    assert np.abs(ref - w).max() < 0.1 * np.abs(w).max()  # the encoder's blocks stand for w
    x = torch.randn(7, 1280, generator=torch.Generator().manual_seed(2)) * 3
    x[2, 256:512] = 0.0  # a zero block
    bias = torch.randn(24)
    full = q6k.linear(x, rec, bias)
    for m in range(1, 8):
        assert torch.equal(q6k.linear(x[:m], rec, bias), q6k.reference(x[:m], rec, bias)), m
        assert torch.equal(q6k.linear(x[m - 1:m], rec, bias), full[m - 1:m]), m  # alone = in a pass
    exact = x @ torch.from_numpy(ref).T + bias
    assert ((full - exact).norm() / exact.norm()) < 0.02  # int8 activations per block of 256


def _records(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32) * 0.05
    raw = q4k_encode(w)
    return q4k.records(raw), raw


def test_records_are_llama_cpps_q4k_values():
    import gguf

    for seed in range(3):
        w, raw = _records(37, 512, seed)
        want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_K)
        assert np.array_equal(q4k.dequantize(w).numpy(), want.astype(np.float32))
    # and the encoder above makes blocks near what it encodes (so a model built from them is itself)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((8, 256)).astype(np.float32)
    back = gguf.quants.dequantize(q4k_encode(x), gguf.GGMLQuantizationType.Q4_K)
    assert np.abs(back - x).max() < 0.5 * np.abs(x).max() / 15 * 2


@pytest.mark.parametrize("k", [256, 1280])
def test_the_kernel_is_its_torch_oracle_to_the_bit(k, isa):
    w, _ = _records(29, k, seed=k)
    bias = torch.randn(29)
    x = torch.randn(7, k) * torch.logspace(-3, 3, 7)[:, None]  # rows of very different magnitudes
    x[3] = 0.0  # a zero row: scale 0
    x[5, :256] = 0.0  # a zero block in a row
    for rows in (x[:1], x[:2], x[:3], x[:4], x):
        assert torch.equal(q4k.linear(rows, w, bias), q4k.reference(rows, w, bias))
        assert torch.equal(q4k.linear(rows, w), q4k.reference(rows, w))


@pytest.mark.parametrize("k", [896, 1003])
def test_activations_rounded_at_ties_and_short_blocks_are_the_oracles_bits(k, isa):
    """The activations are quantized eight at a time (AVX2), or one by one when a block's real inputs are not a
    multiple of eight (1003: 235 in the last block; 896: 128, vectorised): the same bits either way, halves
    rounding to even as torch.round does (Q4_K's sums of 32 and Q6_K's of 16 alike)."""
    w = q4k.quantize(torch.randn(19, k) * 0.05)
    x = torch.randn(5, k)
    x[0, :] = torch.arange(k) % 11 - 5.5  # with the block's max at 127 (below), every value a tie: x * 127 / 127
    x[0, ::256] = 127.0
    x[1, -3:] = 1e30  # a block whose max dwarfs the rest: they round to 0
    for rows in (x[:1], x[1:2], x[:4], x):
        assert torch.equal(q4k.linear(rows, w), q4k.reference(rows, w))
    rec6 = q6k.records(q6k_encode(np.random.default_rng(k).standard_normal((7, 768)).astype(np.float32) * 0.05))
    x6 = torch.randn(3, 768)
    x6[0] = torch.arange(768) % 7 - 3.5
    x6[0, ::256] = 127.0
    for rows in (x6[:1], x6):
        assert torch.equal(q6k.linear(rows, rec6), q6k.reference(rows, rec6))


def test_a_token_is_the_same_bits_in_any_pass(isa):
    w, _ = _records(64, 768, seed=1)
    x = torch.randn(9, 768)
    batch = q4k.linear(x, w)
    assert torch.equal(batch, torch.cat([q4k.linear(x[i:i + 1], w) for i in range(9)]))
    for start, size in ((2, 5), (0, 3), (4, 2)):
        assert torch.equal(q4k.linear(x[start:start + size], w), batch[start:start + size])


def test_every_pass_length_is_the_oracles_bits_and_each_tokens_alone(isa):
    """A pass goes through the rows four tokens at a time (AVX2), or two rows at a time against four token pairs and
    the rest (pairs and an odd token) in one more (VNNI): every length from 1 to 19 (8 + 8 + 3, 8 + 7, ...) gives
    each token the oracle's bits, its bits alone, Q4_K and Q6_K, an odd number of rows (the last one alone)."""
    w, _ = _records(21, 512, seed=3)
    rec6 = q6k.records(q6k_encode(np.random.default_rng(4).standard_normal((13, 512)).astype(np.float32) * 0.05))
    x = torch.randn(19, 512, generator=torch.Generator().manual_seed(6)) * torch.logspace(-2, 2, 19)[:, None]
    alone4 = torch.cat([q4k.linear(x[i:i + 1], w) for i in range(19)])
    alone6 = torch.cat([q6k.linear(x[i:i + 1], rec6) for i in range(19)])
    for m in range(1, 20):
        assert torch.equal(q4k.linear(x[:m], w), q4k.reference(x[:m], w)), m
        assert torch.equal(q4k.linear(x[:m], w), alone4[:m]), m
        assert torch.equal(q6k.linear(x[:m], rec6), q6k.reference(x[:m], rec6)), m
        assert torch.equal(q6k.linear(x[:m], rec6), alone6[:m]), m


def test_long_rows_go_two_at_a_time_with_the_same_bits(isa):
    """Where a pass's activations outgrow L1 (tokens x inputs > 32 KB: the down product's 8,960 inputs) the VNNI
    kernels take two rows a pass (Q6_K two token pairs, Q4_K four): every length from 1 to 11 over 64 blocks, an odd
    number of rows, gives each token the oracle's bits and its bits alone."""
    k = 64 * 256
    w, _ = _records(13, k, seed=7)
    rec6 = q6k.records(q6k_encode(np.random.default_rng(8).standard_normal((11, k)).astype(np.float32) * 0.05))
    x = torch.randn(11, k, generator=torch.Generator().manual_seed(9)) * torch.logspace(-2, 2, 11)[:, None]
    alone4 = torch.cat([q4k.linear(x[i:i + 1], w) for i in range(11)])
    alone6 = torch.cat([q6k.linear(x[i:i + 1], rec6) for i in range(11)])
    for m in range(1, 12):
        assert torch.equal(q4k.linear(x[:m], w), alone4[:m]), m
        assert torch.equal(q6k.linear(x[:m], rec6), alone6[:m]), m
    assert torch.equal(alone4, q4k.reference(x, w))
    assert torch.equal(alone6, q6k.reference(x, rec6))


def test_the_product_is_the_dequantized_weights_product_to_int8_rounding():
    w, _ = _records(96, 512, seed=2)
    x = torch.randn(5, 512)
    want = x @ q4k.dequantize(w).T
    got = q4k.linear(x, w)
    assert ((got - want).norm(dim=-1) / want.norm(dim=-1)).max() < 0.02


def test_a_q4klinear_refuses_what_is_not_records():
    with pytest.raises(ValueError, match="Q4_K records"):
        q4k.Q4KLinear(torch.zeros(4, 2, 144, dtype=torch.uint8), None)


@pytest.fixture
def native(tmp_path, monkeypatch):
    """A tiny offline pair loaded as the default one is (models.gguf_native): both on their GGUF's blocks, the
    target a Q4_K_M file's layout (Q4_K matrices; v, down and the head Q6_K), the draft's Q8_0 made Q4_K."""
    from specviz.models import load_pair
    from specviz.models.loading import forget
    from tests.test_models import Q4_K_M, gguf_pack

    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    shape = dict(hidden=256, ffn=256, layers=2)
    draft = gguf_pack(tmp_path, monkeypatch, seed=1, **shape)
    target = gguf_pack(tmp_path, monkeypatch, seed=2, types=Q4_K_M, **shape)
    pair = load_pair(draft=draft.ref, target=target.ref, draft_quant="int8", target_exec="int8")
    yield pair
    forget(pair)


def test_the_target_runs_its_ggufs_blocks_as_stored_traced_and_verifies_as_it_steps(native):
    """Each Q4_K and Q6_K matrix a product on its records (q/k one Q4_K product, v a Q6_K one; gate/up one; the head
    Q6_K); the lean steps' graphs hold them, and a verify pass scores each position as a one-token step does,
    traced or eager."""
    from specviz.models.compiled import steps_of

    model = native.target
    att, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    assert att.q_proj.shared is att.k_proj.shared and isinstance(att.q_proj.shared.linear, q4k.Q4KLinear)
    assert isinstance(att.v_proj, q6k.Q6KLinear) and isinstance(mlp.down_proj, q6k.Q6KLinear)
    assert isinstance(mlp.gate_proj.shared.linear, q4k.Q4KLinear) and isinstance(att.o_proj, q4k.Q4KLinear)
    head = model.get_output_embeddings()
    assert isinstance(head, q6k.Q6KLinear) and head.dequantized(torch.tensor([0, 5])).shape == (2, 256)
    assert "Q4_K" in executions.words(native) and native.target_weights == "gguf"
    steps = steps_of(model)
    assert isinstance(steps, lean.LeanSteps) and steps.invariant and set(steps.traced) == set(lean.TARGET_FEEDS)
    used = _counting(steps)
    ids = torch.randint(5, 250, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    for start, k in ((10, 6), (17, 3), (1, 8)):
        assert torch.equal(_verify_logits(model, ids, start, k), _steps_logits(model, ids, start, k)), (start, k)
    assert used[1] > 10 and used[6] >= 1 and used[3] >= 1 and used[8] >= 1
    graphs, steps.traced = steps.traced, {}
    try:
        eager = _steps_logits(model, ids, 10, 6)
    finally:
        steps.traced = graphs
    assert torch.equal(eager, _steps_logits(model, ids, 10, 6))


def test_greedy_text_is_standard_text_with_both_models_on_their_blocks(native):
    assert q4k.in_use(native.target) and q4k.in_use(native.draft)
    ids = native.tokenizer("def fib(n): de").input_ids
    for gamma in (2, 5):
        s = DecodeSettings(gamma=gamma, temperature=0.0, max_new_tokens=30)
        assert [t.id for t in speculative_decode(native, ids, s).tokens] == \
            [t.id for t in standard_decode(native, ids, s).tokens]


def test_without_the_kernel_or_when_switched_off_the_pack_loads_dequantized(tmp_path, monkeypatch):
    """SPECVIZ_Q4K=0, or no kernel: transformers' model dequantized from the same file (int8 rows, no records)."""
    from specviz.models import load_pair
    from specviz.models.loading import forget
    from tests.test_models import Q4_K_M, gguf_pack

    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    shape = dict(hidden=256, ffn=256, layers=1)
    draft = gguf_pack(tmp_path, monkeypatch, seed=1, **shape)
    target = gguf_pack(tmp_path, monkeypatch, seed=2, types=Q4_K_M, **shape)
    for switch in ("env", "kernel"):
        if switch == "env":
            monkeypatch.setenv("SPECVIZ_Q4K", "0")
        else:
            monkeypatch.setenv("SPECVIZ_Q4K", "1")
            kernels.set_enabled(False)
        pair = load_pair(draft=draft.ref, target=target.ref, draft_quant="int8", target_exec="int8")
        try:
            assert not q4k.in_use(pair.target) and pair.target_weights == "" and pair.target_exec == "int8"
        finally:
            forget(pair)


def test_a_q4k_and_q6k_linear_record_only_their_product_in_a_trace():
    """The lean steps hand the products 2-D float32 rows: the modules then call the kernel alone (no reshape or cast
    recorded in the traced step, ~3 % of the draft's step), with the bits any other input shape gets; rows of another
    width are still refused."""
    w, _ = _records(24, 512, seed=8)
    rec6 = q6k.records(q6k_encode(np.random.default_rng(9).standard_normal((16, 512)).astype(np.float32) * 0.05))
    for mod in (q4k.Q4KLinear(w, torch.randn(24)), q6k.Q6KLinear(rec6, None)):
        x = torch.randn(3, 512)
        assert torch.equal(mod(x), mod(x[None])[0]) and torch.equal(mod(x), mod(x.double()))
        kinds = [n.kind() for n in torch.jit.trace(mod, (x,), check_trace=False).graph.nodes()]
        assert not {"aten::reshape", "aten::to", "aten::view"} & set(kinds), kinds
        assert sum(k.startswith("specviz::") for k in kinds) == 1
        with pytest.raises(RuntimeError):  # rows of another width are refused as before, not read as a short block
            mod(torch.randn(3, 500))
