"""The GGUF reader (specviz.models.gguf_file) parses a file as gguf-py does, the tokenizer module knows what it
does not handle, and the shipped packs map in parts and know their size."""

from __future__ import annotations


import numpy as np
import pytest

from specviz.models import gguf_tokenizer
from specviz.models.gguf_file import GGUFFile

PACKS = ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")


def test_the_reader_parses_a_gguf_as_gguf_py_does(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "small.gguf"
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", ["a", "bé", "<|x|>", "Ġc"])
    w.add_array("tokenizer.ggml.token_type", [1, 1, 3, 1])
    w.add_uint32("qwen2.block_count", 2)
    w.add_float32("qwen2.rope.freq_base", 1e6)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    rng = np.random.default_rng(0)
    norm = rng.standard_normal(64).astype(np.float32)
    mat = rng.standard_normal((8, 64)).astype(np.float32)
    q8 = gguf.quants.quantize(mat, gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.attn_norm.weight", norm)
    w.add_tensor("blk.0.attn_q.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with GGUFFile(path) as f:
        assert f.metadata["tokenizer.ggml.tokens"] == ["a", "bé", "<|x|>", "Ġc"]
        assert list(f.metadata["tokenizer.ggml.token_type"]) == [1, 1, 3, 1]
        assert f.metadata["qwen2.block_count"] == 2 and f.metadata["tokenizer.ggml.add_bos_token"] is False
        assert f.tensors["blk.0.attn_q.weight"].shape == (8, 64)
        assert np.array_equal(f.raw("blk.0.attn_norm.weight").view(np.float32).ravel(), norm)
        reader = gguf.GGUFReader(str(path))
        theirs = {t.name: np.asarray(t.data) for t in reader.tensors}
        assert np.array_equal(f.raw("blk.0.attn_q.weight"), theirs["blk.0.attn_q.weight"])


def test_an_unknown_tokenizer_is_left_to_transformers():
    with pytest.raises(gguf_tokenizer.Unsupported):
        gguf_tokenizer.check({"tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "qwen2"})
    with pytest.raises(gguf_tokenizer.Unsupported):
        gguf_tokenizer.check({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "llama-bpe",
                              "tokenizer.ggml.merges": []})


# --- the real packs ---------------------------------------------------------------------------------------------


def _pack(key):
    from specviz.models import OFFLINE_PACKS
    from specviz.models.packs import part_paths
    from specviz.models.pair import ModelError

    pack = OFFLINE_PACKS[key]
    try:
        part_paths(pack)
    except ModelError as exc:
        pytest.skip(str(exc))
    return pack


@pytest.mark.real_model
@pytest.mark.parametrize("key", PACKS)
def test_a_shipped_pack_maps_in_parts_and_dequantizes_as_gguf_py(key):
    """A shipped pack's parts mapped and read as one file (the header lies in the first part), its tensors within
    the pack's bytes, every quantized type dequantized by the compiled path as gguf-py does."""
    gguf_py = pytest.importorskip("gguf")
    import torch

    from specviz.models import gguf_dequant, packs

    pack = _pack(key)
    split = GGUFFile(f"{key}.gguf", parts=packs.mapped(pack))
    try:
        assert len(split.tensors) > 100 and all(info.offset + info.nbytes <= pack.size for info in split.tensors.values())
        assert gguf_dequant.library() is not None
        seen = set()
        for name, info in split.tensors.items():
            if not gguf_dequant.known(info.ggml_type) or info.ggml_type in seen:
                continue
            seen.add(info.ggml_type)  # one tensor of each type (the files' are compared whole in their caches)
            raw = split.raw(name)
            want = torch.from_numpy(gguf_py.dequantize(raw, gguf_py.GGMLQuantizationType(info.ggml_type)))
            got = gguf_dequant.dequantize(raw, info.ggml_type, info.shape, torch.float32)
            assert torch.equal(got.reshape(want.shape).view(torch.int32), want.view(torch.int32)), name
        assert seen >= {gguf_dequant.Q4_K, gguf_dequant.Q6_K} or key != "qwen2.5-coder-1.5b"
    finally:
        split.close()
