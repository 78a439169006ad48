"""The lean decoder's small ops as specviz's own (csrc/glue.cpp, specviz.models.lean's ``glue``): each against
the torch ops it replaces, each token's row and each query the same bits in any pass, and the lean steps on
them: the same path traced and eager, chain and tree (the int8 target's exactness tests run on it too)."""

from __future__ import annotations

import pytest
import torch

from specviz.models import executions, int8, kernels, lean
from specviz.models.compiled import steps_of
from specviz.models.tiny import build_tiny_pair

needs_kernel = pytest.mark.skipif(not int8.int8_available() or not kernels.matches(policy=False),
                                  reason="specviz's kernel library needs an x86 CPU with AVX2 and a C++ compiler")
pytestmark = needs_kernel
OPS = torch.ops.specviz if hasattr(torch.ops, "specviz") else None
GEN = torch.Generator().manual_seed(0)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def test_rms_add_rms_and_silu_mul_are_the_torch_ops_they_replace():
    x, d = torch.randn(5, 96, generator=GEN), torch.randn(5, 96, generator=GEN)
    w = torch.rand(96, generator=GEN) + 0.5
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    assert torch.allclose(OPS.glue_rms(x, w, 1e-6), ref, rtol=1e-5, atol=1e-6)
    total, normed = OPS.glue_add_rms(x, d, w, 1e-6)
    assert torch.equal(total, x + d)
    assert torch.equal(normed, OPS.glue_rms(x + d, w, 1e-6))
    gu = torch.randn(4, 2 * 70, generator=GEN) * 4
    assert torch.allclose(OPS.glue_silu_mul(gu), torch.nn.functional.silu(gu[:, :70]) * gu[:, 70:], rtol=1e-5, atol=1e-6)
    # a row's result is the same bits alone or among others
    assert torch.equal(OPS.glue_rms(x[2:3], w, 1e-6), OPS.glue_rms(x, w, 1e-6)[2:3])
    assert torch.equal(OPS.glue_silu_mul(gu[1:2]), OPS.glue_silu_mul(gu)[1:2])
    # rows long enough to split across threads mid-row, eight lanes at a time and a stretch's odd last few
    wide = torch.randn(3, 2 * 4099, generator=GEN) * 4
    assert torch.equal(OPS.glue_silu_mul(wide[1:2]), OPS.glue_silu_mul(wide)[1:2])
    assert torch.allclose(OPS.glue_silu_mul(wide), torch.nn.functional.silu(wide[:, :4099]) * wide[:, 4099:],
                          rtol=1e-5, atol=1e-6)


def _attend_case(t: int, nh: int = 4, kvh: int = 2, d: int = 16, cap: int = 32, start: int = 9):
    qkv = torch.randn(t, (nh + 2 * kvh) * d, generator=GEN)
    ang = torch.outer(torch.arange(cap, dtype=torch.float32), torch.rand(d // 2, generator=GEN))
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    keys, values = torch.randn(1, kvh, cap, d, generator=GEN), torch.randn(1, kvh, cap, d, generator=GEN)
    pos = torch.arange(start, start + t)
    return qkv, cos, sin, keys, values, pos


def test_attend_writes_the_roped_keys_and_values_and_is_sdpa_over_the_visible_slots():
    nh, kvh, d, t = 4, 2, 16, 3
    qkv, cos, sin, keys, values, pos = _attend_case(t)
    k0, v0 = keys.clone(), values.clone()
    out = OPS.glue_attend(qkv, cos, sin, pos, keys, values, pos, torch.empty(0, dtype=torch.long), pos + 1,
                          nh, kvh, d ** -0.5)
    q, k, v = qkv.split([nh * d, kvh * d, kvh * d], dim=-1)
    c, s = cos[pos][None], sin[pos][None]
    q = _rope(q.view(t, nh, d).transpose(0, 1), c, s)
    k = _rope(k.view(t, kvh, d).transpose(0, 1), c, s)
    k0[0, :, pos], v0[0, :, pos] = k, v.view(t, kvh, d).transpose(0, 1)
    assert torch.equal(keys, k0) and torch.equal(values, v0)  # RoPE as transformers', to the bit
    mask = torch.arange(keys.shape[2])[None, :] <= pos[:, None]
    ref = torch.nn.functional.scaled_dot_product_attention(q[None], keys, values, attn_mask=mask, scale=d ** -0.5,
                                                           enable_gqa=True)
    assert torch.allclose(out, ref[0].transpose(0, 1).reshape(t, nh * d), rtol=1e-5, atol=1e-6)


def test_a_query_scores_the_same_bits_alone_in_a_pass_and_through_listed_slots():
    nh, kvh, d = 4, 2, 16
    qkv, cos, sin, keys, values, pos = _attend_case(5)
    none = torch.empty(0, dtype=torch.long)
    together = OPS.glue_attend(qkv, cos, sin, pos, keys.clone(), values.clone(), pos, none, pos + 1, nh, kvh, 0.25)
    cache_k, cache_v = keys.clone(), values.clone()
    for j in range(5):  # one token at a time, as steps
        row = OPS.glue_attend(qkv[j:j + 1], cos, sin, pos[j:j + 1], cache_k, cache_v, pos[j:j + 1], none,
                              pos[j:j + 1] + 1, nh, kvh, 0.25)
        assert torch.equal(row, together[j:j + 1]), j
    # the slots listed (a tree node's prefix and path), in the order a chain holds them: the same bits
    seen = torch.stack([torch.arange(pos[-1] + 1)] * 5)
    listed = OPS.glue_attend(qkv, cos, sin, pos, keys.clone(), values.clone(), pos, seen, pos + 1, nh, kvh, 0.25)
    assert torch.equal(listed, together)


def test_attend_refuses_slots_outside_the_cache():
    qkv, cos, sin, keys, values, pos = _attend_case(2)
    with pytest.raises(RuntimeError, match="outside"):
        OPS.glue_attend(qkv, cos, sin, pos, keys, values, pos + 100, torch.empty(0, dtype=torch.long), pos + 1,
                        4, 2, 0.25)


def _int8_target(monkeypatch, glue: bool):
    monkeypatch.setenv("SPECVIZ_GLUE", "1" if glue else "0")
    kernels.set_enabled(True)
    pair = build_tiny_pair(vocab_size=40, sharpness=3.0, seed=2)
    return executions.apply(pair.target.to(torch.bfloat16), "int8", copy_model=True)


def test_the_lean_steps_take_the_glue_where_the_kernel_is_and_not_when_turned_off(monkeypatch):
    from test_lean_target import IDS, _steps_logits

    try:
        on, off = _int8_target(monkeypatch, True), None
        assert steps_of(on).glue and set(steps_of(on).traced) == set(lean.TARGET_FEEDS)
        off = _int8_target(monkeypatch, False)
        assert not steps_of(off).glue
        a, b = _steps_logits(on, IDS, 8, 6), _steps_logits(off, IDS, 8, 6)
        # the same model, the small ops summed in another order: close, not the same bits
        assert (0.5 * (a.softmax(-1) - b.softmax(-1)).abs().sum(-1)).max() < 1e-3
        steps = steps_of(on)
        graphs, steps.traced = steps.traced, {}
        try:
            eager = _steps_logits(on, IDS, 8, 6)
        finally:
            steps.traced = graphs
        assert torch.equal(eager, a)  # traced = eager on the glue
    finally:
        kernels.set_enabled(None)
