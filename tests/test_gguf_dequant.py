"""GGUF blocks dequantized by torch (specviz.models.gguf_dequant) are gguf-py's values, bit for bit.

Random blocks of every type the module handles (random bytes, with finite scales), over more than one chunk,
cast to bf16 and kept in float32: each bit equal to gguf-py's ``dequantize`` (what transformers' GGUF loading
and the converted caches use).  The real files are compared through their caches in tests/test_gguf_convert.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specviz.models import gguf_dequant as G

gguf = pytest.importorskip("gguf")

# (type, byte offsets of the float16 scales in a block)
SCALES = {G.Q4_K: (0, 2), G.Q6_K: (208,), G.Q5_0: (0,), G.Q8_0: (0,)}


def random_blocks(ggml_type: int, n: int, seed: int = 0) -> np.ndarray:
    nbytes, _ = G.LAYOUT[ggml_type]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(n, nbytes), dtype=np.uint8)
    for at in SCALES[ggml_type]:  # finite scales of a realistic size (random bytes give NaN and inf too)
        d = (rng.standard_normal(n) * 0.01).astype(np.float16)
        blocks[:, at:at + 2] = d.view(np.uint8).reshape(n, 2)
    return blocks


@pytest.mark.parametrize("ggml_type", sorted(G.LAYOUT), ids=lambda t: gguf.GGMLQuantizationType(t).name)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_every_value_is_gguf_pys_to_the_bit(ggml_type, dtype, monkeypatch):
    monkeypatch.setattr(G, "CHUNK_VALUES", 4096)  # several chunks, the last one short
    _, per = G.LAYOUT[ggml_type]
    n_blocks = 4096 // per * 3 + 6  # (an even count: whole rows of 64 values)
    raw = random_blocks(ggml_type, n_blocks)
    rows = n_blocks * per // 64
    want = torch.from_numpy(gguf.dequantize(raw.reshape(-1), gguf.GGMLQuantizationType(ggml_type))).reshape(rows, 64)
    got = G.dequantize(raw, ggml_type, (rows, 64), dtype)
    assert got.dtype == dtype and got.shape == (rows, 64)
    want = want.to(dtype)
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    assert torch.equal(got.view(bits), want.view(bits)), f"{int((got != want).sum())} values differ"


def test_a_type_it_does_not_know_goes_to_gguf_py():
    assert not G.known(gguf.GGMLQuantizationType.Q4_0)
    rng = np.random.default_rng(1)
    values = rng.standard_normal((4, 64)).astype(np.float32)
    raw = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q4_0)
    got = G.dequantize(raw, int(gguf.GGMLQuantizationType.Q4_0), (4, 64), torch.float32)
    want = torch.from_numpy(gguf.dequantize(raw, gguf.GGMLQuantizationType.Q4_0)).reshape(4, 64)
    assert torch.equal(got, want)
    assert (got - torch.from_numpy(values)).abs().max() < 0.5  # and it is the matrix, roughly (4 bits)
