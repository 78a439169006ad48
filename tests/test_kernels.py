"""specviz's own int8 kernel (specviz/models/csrc/int8_small.cpp, loaded by specviz.models.kernels): fbgemm's
bits at every shape and batch size, a token's output independent of the batch, and the linears, fused
products and traced draft steps running on it.  Built with the machine's compiler on first use (~1 min,
cached); where it cannot be built the linears run on fbgemm, and these tests say why they skip."""

from __future__ import annotations

import copy

import pytest
import torch

from specviz.models import int8, kernels
from specviz.models.int8_target import _STATIC_LINEAR, ACT_SCALE, ACT_ZERO, TokenInt8Linear

needs_kernel = pytest.mark.skipif(not int8.int8_available() or not kernels.matches(policy=False),
                                  reason="specviz's int8 kernel cannot run here (no AVX2, or no compiler: "
                                         "install g++ and ninja to test it); the linears run on fbgemm")


@pytest.fixture(autouse=True)
def _kernel_on():
    """The kernel in use for these tests wherever it is correct (also on an AVX-512 CPU, where the app itself
    prefers fbgemm), then this machine's own choice again."""
    if int8.int8_available() and kernels.matches(policy=False):
        kernels.set_enabled(True)
    yield
    kernels.set_enabled(None)


def _values(rows: int, cols: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    values = torch.randint(-128, 128, (rows, cols), dtype=torch.int8, generator=gen)
    scales = torch.rand(rows, generator=gen, dtype=torch.float64) / 50 + 1e-5
    return values, scales


@needs_kernel
@pytest.mark.parametrize("shape", [(1, 32), (5, 33), (96, 64), (130, 896), (257, 1000), (64, 8960)])
def test_the_kernel_gives_fbgemms_bits_at_every_shape_and_batch_size(shape):
    """Rows not a multiple of the 4-row block, columns not a multiple of 32 (the scalar tail), 1 to 70 tokens
    (the 2-token groups and the odd one), rows with values at both ends of the 7-bit range."""
    values, scales = _values(*shape, seed=shape[0])
    packed = torch.ops.quantized.linear_prepack(torch._make_per_channel_quantized_tensor(
        values, scales, torch.zeros(shape[0], dtype=torch.long), 0), None)
    weights = kernels.Weights.of(values, scales)
    gen = torch.Generator().manual_seed(1)
    for m in (1, 2, 3, 4, 5, 6, 9, 17, 70):
        rows = torch.rand(m, shape[1], generator=gen) * 2 - 1
        rows[:, 0] = 1.0
        rows[:, -1] = -1.0
        assert torch.equal(weights.product(rows), _STATIC_LINEAR(rows, ACT_SCALE, ACT_ZERO, packed)), m


def _torch_layout(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's weight layout in torch: [N4/4, K32/32, 4, 32] blocks, zero-padded, and int32 row sums."""
    n, k = values.shape
    n4, k32 = -(-n // 4) * 4, -(-k // 32) * 32
    padded = torch.nn.functional.pad(values, (0, k32 - k, 0, n4 - n))
    return padded.reshape(n4 // 4, 4, k32 // 32, 32).transpose(1, 2).contiguous(), values.sum(1, dtype=torch.int32)


@needs_kernel
@pytest.mark.parametrize("shape", [(1, 32), (5, 33), (3, 31), (130, 896), (257, 1000), (64, 8960)])
def test_the_kernels_weight_layout_is_torchs_blocking_and_row_sums(shape):
    """The op that lays a linear's weights out at load (``weight_layout``) gives what the torch expression
    gives: the 4 x 32 blocks zero-padded on both sides, and exact row sums at the int8 extremes."""
    values, scales = _values(*shape, seed=shape[1])
    values[0] = -128  # the most negative row sum
    values[-1, : shape[1] // 2] = 127
    blocked, wsum = torch.ops.specviz.weight_layout(values)
    want_blocked, want_sum = _torch_layout(values)
    assert blocked.shape == want_blocked.shape and torch.equal(blocked, want_blocked)
    assert wsum.dtype == torch.int32 and torch.equal(wsum, want_sum)
    assert int(wsum[0]) == (-128 * shape[1] if shape[0] > 1 else 127 * (shape[1] // 2) - 128 * (shape[1] - shape[1] // 2))
    weights = kernels.Weights.of(values[:, :], scales)  # the op, as a load uses it
    assert torch.equal(weights.values, values) and torch.equal(weights.wsum, want_sum)
    strided = torch.zeros(shape[0], shape[1] + 7, dtype=torch.int8)[:, 3 : 3 + shape[1]]
    strided.copy_(values)  # a view with a row stride of its own: laid out as the values it holds
    assert torch.equal(torch.ops.specviz.weight_layout(strided)[0], want_blocked)


@needs_kernel
@pytest.mark.parametrize("shape", [(1, 32), (5, 33), (130, 896), (257, 1000), (64, 8960)])
def test_the_one_call_linear_gives_the_bits_of_its_ops_one_at_a_time(shape):
    """``int8_linear`` (scale by max |x|, quantize, product, scale back, bias) against the Python path it replaced
    in TokenInt8Linear, to the bit: rows of very different magnitudes, an all-zero row (the 1e-30 clamp), values
    on the quantizer's rounding ties (k + 0.5 steps of 1/63), float32 and bf16 biases, 1 to 70 tokens."""
    values, scales = _values(*shape, seed=shape[0] + 7)
    packed = torch.ops.quantized.linear_prepack(torch._make_per_channel_quantized_tensor(
        values, scales, torch.zeros(shape[0], dtype=torch.long), 0), None)
    weights = kernels.Weights.of(values, scales)
    gen = torch.Generator().manual_seed(2)
    for bias in (None, torch.randn(shape[0], generator=gen), torch.randn(shape[0], generator=gen).bfloat16()):
        for m in (1, 2, 3, 6, 17, 70):
            rows = (torch.randn(m, shape[1], generator=gen) * 10 ** torch.randint(-6, 6, (m, 1), generator=gen))
            rows[0, 0] = 1.0  # the max of row 0 ...
            if shape[1] > 2:
                rows[0, 1:3] = torch.tensor([0.5, -1.5]) / 63  # ... and two of its values on rounding ties
            if m > 2:
                rows[1] = 0.0
            scale = rows.abs().amax(-1, keepdim=True).clamp_(min=1e-30)
            plain = _STATIC_LINEAR(rows / scale, ACT_SCALE, ACT_ZERO, packed).mul_(scale)
            if bias is not None:
                plain.add_(bias)
            fused = weights.linear(rows, None if bias is None else bias.float())
            assert torch.equal(fused, plain), (m, None if bias is None else bias.dtype)


@needs_kernel
def test_a_linear_on_the_kernel_runs_in_one_call_with_the_same_bits():
    """TokenInt8Linear takes ``int8_linear`` on the kernel's weights: its output equals fbgemm's packed linear
    (the same values and bias) bit for bit, at 1 and 9 tokens, and a token's row is the same in any batch."""
    values, scales = _values(96, 200, seed=21)
    bias = torch.randn(96, generator=torch.Generator().manual_seed(5))
    fast = TokenInt8Linear(None, bias, values=values, scales=scales)
    kernels.set_enabled(False)
    try:
        slow = TokenInt8Linear(None, bias, values=values.clone(), scales=scales.clone())
        slow.pack()
    finally:
        kernels.set_enabled(True)
    fast.pack()
    assert isinstance(fast._packed, kernels.Weights) and not isinstance(slow._packed, kernels.Weights)
    x = torch.randn(9, 200, generator=torch.Generator().manual_seed(6)) * 3
    calls = []
    real = kernels.Weights.linear
    kernels.Weights.linear = lambda self, rows, b=None: calls.append(rows.shape) or real(self, rows, b)
    try:
        y = fast(x)
    finally:
        kernels.Weights.linear = real
    assert calls == [(9, 200)]
    assert torch.equal(y, slow(x))
    assert torch.equal(fast(x[3:4]), y[3:4])


@needs_kernel
def test_a_tokens_output_is_the_same_bits_in_any_batch():
    values, scales = _values(300, 1536, seed=3)
    weights = kernels.Weights.of(values, scales)
    rows = torch.rand(12, 1536, generator=torch.Generator().manual_seed(4)) * 2 - 1
    batch = weights.product(rows)
    for i in range(12):
        assert torch.equal(weights.product(rows[i:i + 1])[0], batch[i])
        assert torch.equal(weights.product(rows[max(0, i - 2):i + 1])[-1], batch[i])


@needs_kernel
def test_linears_take_the_kernel_form_and_keep_their_weights():
    """A packed TokenInt8Linear holds the int8 values themselves (nothing packed), gives the fbgemm-packed
    linear's output, and still reports its weights (the learned head and the reduced draft head read them)."""
    values, scales = _values(200, 256, seed=5)
    qweight = torch._make_per_channel_quantized_tensor(values, scales, torch.zeros(200, dtype=torch.long), 0)
    bias = torch.randn(200)
    ours = TokenInt8Linear(qweight, bias)
    assert isinstance(ours._packed, kernels.Weights) and torch.equal(ours._packed.values, values)
    kernels.set_enabled(False)
    try:
        theirs = TokenInt8Linear(qweight.clone(), bias)
    finally:
        kernels.set_enabled(True)
    assert not isinstance(theirs._packed, kernels.Weights)
    x = torch.randn(7, 256) * 4
    assert torch.equal(ours(x), theirs(x))
    assert torch.equal(ours.dequantized(), theirs.dequantized())
    assert torch.equal(ours.qweight().int_repr(), values)


@needs_kernel
def test_a_model_on_the_kernel_scores_a_verify_pass_as_its_steps():
    """The int8 target (fused q/k/v and gate/up, the batch-invariant attention) on the kernel: each position
    of a 6-token pass is bit-identical to a one-token step there, and to the fbgemm-packed model."""
    from specviz.core.kv import CachedLM
    from specviz.models.tiny import build_tiny_pair

    tiny = build_tiny_pair(vocab_size=64, seed=0, hidden=64, target_layers=2, draft_layers=1)
    ours = int8.quantize_int8(copy.deepcopy(tiny.target), kind="token")
    kernels.set_enabled(False)
    try:
        theirs = int8.quantize_int8(copy.deepcopy(tiny.target), kind="token")
    finally:
        kernels.set_enabled(True)
    assert any(isinstance(m._packed, kernels.Weights) for m in ours.modules() if isinstance(m, TokenInt8Linear))
    ids = torch.randint(0, 64, (30,), generator=torch.Generator().manual_seed(6)).tolist()
    cpu = torch.device("cpu")
    with torch.inference_mode():
        a, b = CachedLM(ours, cpu), CachedLM(theirs, cpu)
        a.feed(ids[:20]), b.feed(ids[:20])
        verify = a.feed(ids[:26], keep=6).logits
        assert torch.equal(verify, b.feed(ids[:26], keep=6).logits)
        a.crop(20)
        steps = torch.stack([a.feed(ids[:21 + i]).logits[-1] for i in range(6)])
    assert torch.equal(verify, steps)


@needs_kernel
def test_the_lean_draft_traces_through_the_kernel(monkeypatch):
    """torch.jit.trace records the kernel as an operator (torch.ops.specviz.int8_linear), so the traced draft
    steps give the eager ones' logits (the draft on its int8 rows: its Q4_K products' trace, test_q4k_draft)."""
    from specviz.models import lean

    monkeypatch.setenv("SPECVIZ_Q4K", "0")
    from specviz.models.tiny import build_tiny_pair

    tiny = build_tiny_pair(vocab_size=64, seed=1, hidden=64, target_layers=2, draft_layers=1)
    draft = int8.int8_draft(copy.deepcopy(tiny.target))
    eager = lean.attach(copy.deepcopy(draft), 128, trace=False)
    traced = lean.attach(draft, 128, trace=True)
    assert traced is not None and eager is not None
    assert 1 in traced.traced and "specviz::int8_linear" in str(traced.traced[1].inlined_graph)
    ids = torch.randint(0, 64, (20,), generator=torch.Generator().manual_seed(7)).tolist()
    with torch.inference_mode():
        eager.feed(ids[:12], 1, False), traced.feed(ids[:12], 1, False)
        for n in range(12, 20):
            torch.testing.assert_close(eager.feed(ids[n:n + 1], 1, False)[0], traced.feed(ids[n:n + 1], 1, False)[0],
                                       rtol=1e-5, atol=1e-5)


def test_the_kernel_is_for_avx2_cpus_and_avx512_ones_with_vnni_where_int8_rows_stay_on_fbgemm(monkeypatch):
    """Measured against fbgemm's AVX2 path on AVX2 CPUs; on AVX-512 with VNNI the GGUF products run their VNNI
    form and int8 rows fbgemm's (faster there); AVX-512 without VNNI keeps fbgemm for everything."""
    assert kernels._why_not({"avx2", "fma"}) == ""
    assert kernels._why_not({"avx2", "avx512f", "avx512vl", "avx512bw", "avx512_vnni"}) == ""
    assert "without VNNI" in kernels._why_not({"avx2", "avx512f", "avx512vl", "avx512bw"})
    assert "no AVX2" in kernels._why_not({"sse4_2"})
    kernels.set_enabled(None)  # this machine's policy, on a CPU said to be each
    monkeypatch.setattr(kernels, "matches", lambda **_: True)
    monkeypatch.setattr(kernels, "ready", lambda: True)
    monkeypatch.setattr(kernels, "_cpu_flags", lambda: {"avx2", "avx512f", "avx512vl", "avx512bw", "avx512_vnni"})
    assert not kernels.int8_rows() and not kernels.int8_rows(built=True)
    monkeypatch.setattr(kernels, "_cpu_flags", lambda: {"avx2", "fma"})
    assert kernels.int8_rows() and kernels.int8_rows(built=True)


def test_without_a_compiler_the_linears_run_on_fbgemm(monkeypatch, caplog):
    """A host with no compiler (or headers, or ninja): the build fails, the reason is logged once, and the linears
    are packed for fbgemm exactly as before the kernel existed."""
    import logging

    def no_compiler():
        raise RuntimeError("Ninja is required to load C++ extensions")

    state = dict(kernels._STATE)
    monkeypatch.delenv("SPECVIZ_KERNEL", raising=False)  # the build must be tried: SPECVIZ_KERNEL=0 never tries it
    monkeypatch.setattr(kernels, "_build", no_compiler)
    monkeypatch.setattr(kernels, "_why_not", lambda flags: "")
    kernels._STATE.clear()
    try:
        with caplog.at_level(logging.INFO, logger="specviz.models"):
            assert kernels.module() is None and not kernels.matches() and not kernels.ready()
        assert any("could not be built" in r.getMessage() and "Ninja" in r.getMessage() for r in caplog.records)
        if int8.int8_available():
            values, scales = _values(40, 64, seed=9)
            linear = TokenInt8Linear(None, None, values=values, scales=scales)
            assert linear.packed and not isinstance(linear._packed, kernels.Weights)
    finally:
        kernels._STATE.clear()
        kernels._STATE.update(state)


def test_a_build_lock_left_by_a_killed_build_is_removed_not_waited_on(tmp_path):
    """torch's ``load`` waits forever on a ``lock`` file its killed holder never deleted (the app hung at start):
    whoever holds the kernel's own flock removes it and builds."""
    (tmp_path / "lock").write_text("")
    with kernels._build_lock(tmp_path, wait_s=1.0):
        assert not (tmp_path / "lock").exists()


def test_a_live_build_elsewhere_is_waited_for_then_its_death_frees_the_lock(tmp_path):
    """Another process building holds the flock: a second waits at most ``wait_s`` and gives up (fbgemm then
    runs); once that process dies -- killed, not tidied up -- the lock is free at once."""
    import subprocess
    import sys

    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
         "print('held', flush=True); time.sleep(60)", str(tmp_path / "build.lock")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(TimeoutError, match="held the kernel's build"):
            with kernels._build_lock(tmp_path, wait_s=0.5):
                pass
    finally:
        holder.kill()
        holder.wait()
    with kernels._build_lock(tmp_path, wait_s=2.0):
        pass


@needs_kernel
def test_a_server_load_on_the_kernel_leaves_only_the_traces_and_finish_traces_the_draft_first(monkeypatch):
    """With specviz's kernel nothing needs packing, but a server's load (defer_packing) still leaves the traces
    to models.warm.finish -- ~1-2 s of Python less before a warm start's first run -- and the draft's two feeds
    go first (a round takes several draft steps); the traced steps give the eager steps' logits."""
    import threading
    from types import SimpleNamespace

    from specviz.core.kv import cached_lm
    from specviz.models import lean, warm
    from specviz.models.int8_target import unpacked
    from specviz.models.tiny import build_tiny_pair

    tiny = build_tiny_pair(vocab_size=48, seed=0, hidden=64, target_layers=2, draft_layers=1)
    draft = int8.int8_draft(copy.deepcopy(tiny.target), defer_packing=True)
    steps = draft._specviz_steps
    assert not unpacked(draft) and steps.trace_deferred and not steps.traced  # nothing to pack, not traced
    pair = SimpleNamespace(target=int8.int8_draft(copy.deepcopy(tiny.target)), draft=draft,
                           draft_name="draft", target_name="target")
    assert pair.target._specviz_steps.traced and warm.pending(pair)
    ids = torch.randint(0, 48, (9,), generator=torch.Generator().manual_seed(2)).tolist()
    with torch.inference_mode():
        lm = cached_lm(draft, torch.device("cpu"), need=32)
        eager = lm.feed(ids, keep=1).logits
        lm.free()
    order = []
    real = lean.LeanSteps.trace
    monkeypatch.setattr(lean.LeanSteps, "trace", lambda self, *a, **k: order.append(self) or real(self, *a, **k))
    thread = warm.finish(pair, lock=threading.Lock())
    assert thread is not None
    thread.join(60)
    assert order and order[0] is steps and not steps.trace_deferred and set(steps.traced) == set(lean.TRACED_FEEDS)
    with torch.inference_mode():
        lm = cached_lm(draft, torch.device("cpu"), need=32)
        assert torch.equal(lm.feed(ids, keep=1).logits, eager)
        lm.free()


def test_one_switch_reads_the_kernel_variables(monkeypatch):
    """SPECVIZ_KERNEL=0 turns every kernel off (spaces around it too); SPECVIZ_Q4K=0 only the Q4_K products."""
    from specviz.models import q4k
    from specviz.models.kernels import switched_off

    monkeypatch.delenv("SPECVIZ_KERNEL", raising=False)
    monkeypatch.setenv("SPECVIZ_Q4K", "0")
    assert switched_off("SPECVIZ_Q4K") and not switched_off()
    assert not q4k.enabled() and not q4k.expected()
    monkeypatch.setenv("SPECVIZ_Q4K", "1")
    monkeypatch.setenv("SPECVIZ_KERNEL", " 0 ")
    assert switched_off() and switched_off("SPECVIZ_Q4K")
    assert not q4k.expected()
    monkeypatch.setenv("SPECVIZ_KERNEL", "1")
    assert not switched_off() and not switched_off("SPECVIZ_Q4K")
