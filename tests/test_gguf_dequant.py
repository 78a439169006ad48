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


@pytest.fixture(params=["C", "torch"])
def path(request, monkeypatch):
    """Each way the module dequantizes: its compiled C (the machine's compiler: required where the tests run)
    and torch's ops (where there is none)."""
    if request.param == "C":
        assert G.library() is not None, "the C dequantizer did not build (see the log)"
    else:
        monkeypatch.setitem(G._LIB, "lib", None)
    return request.param


@pytest.mark.parametrize("ggml_type", sorted(G.LAYOUT), ids=lambda t: gguf.GGMLQuantizationType(t).name)
@pytest.mark.parametrize("dtype,widen", [(torch.float32, None), (torch.bfloat16, None),
                                         (torch.bfloat16, torch.float32)], ids=["f32", "bf16", "bf16-as-f32"])
def test_both_paths_give_gguf_pys_values_in_every_dtype(ggml_type, dtype, widen, path):
    raw = random_blocks(ggml_type, 40, seed=ggml_type)
    _, per = G.LAYOUT[ggml_type]
    want = torch.from_numpy(gguf.dequantize(raw.reshape(-1), gguf.GGMLQuantizationType(ggml_type)))
    want = want.to(dtype).to(widen or dtype).reshape(-1, 32)
    got = G.dequantize(raw, ggml_type, (40 * per // 32, 32), dtype, widen)
    assert got.dtype == (widen or dtype) and got.shape == want.shape
    bits = torch.int16 if got.dtype == torch.bfloat16 else torch.int32
    assert torch.equal(got.view(bits), want.view(bits)), f"{path}: {int((got != want).sum())} values differ"


def test_no_compiler_leaves_torchs_path(tmp_path, monkeypatch, caplog):
    """Where no C compiler is found the build says so in one line and torch dequantizes (the same values)."""
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    monkeypatch.setattr(G, "_compiler", lambda: None)
    monkeypatch.setattr(G, "_LIB", {})
    with caplog.at_level("INFO", logger="specviz.models"):
        assert G.library() is None
    assert "No C compiler here" in caplog.text
    raw = random_blocks(G.Q4_K, 4)
    got = G.dequantize(raw, G.Q4_K, (4, 256), torch.float32)
    want = torch.from_numpy(gguf.dequantize(raw.reshape(-1), gguf.GGMLQuantizationType.Q4_K)).reshape(4, 256)
    assert torch.equal(got, want)
    assert not list(tmp_path.rglob("*.so"))


def test_the_library_is_built_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    monkeypatch.setattr(G, "_LIB", {})
    assert G.library() is not None
    built = list((tmp_path / "kernels").glob("gguf-dequant-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    monkeypatch.setattr(G, "_LIB", {})
    monkeypatch.setattr(G, "_compiler", lambda: pytest.fail("compiled again"))
    assert G.library() is not None and built[0].stat().st_mtime_ns == stamp
