"""The offline packs' caches written straight from the GGUF (specviz.models.gguf_convert) are transformers'
conversion to the byte: tokenizer files, config, generation config, model.safetensors -- so the weights every
execution is built from, and so every logit and token, are unchanged.  The tokenizer also encodes a corpus
(code, unicode, chat-template specials, typed specials) to the same ids as transformers' converted one.

The real-pack tests convert each pack both ways (transformers' way takes minutes on a 2-core CPU);
``SPECVIZ_REFERENCE_CACHE=<a cache root converted by transformers>`` reuses one instead.
"""

from __future__ import annotations

import filecmp
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from specviz.models import gguf_tokenizer
from specviz.models.gguf_file import GGUFFile

CORPUS = [
    "def is_prime(n):\n    if n < 2:\n        return False\n    return all(n % d for d in range(2, int(n ** 0.5) + 1))\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // C++\r\n\tx->y = &z;",
    "naïve café, Ελληνικά, русский, 日本語のテキスト, 中文字符, 한국어, emoji 🚀🔥👍🏽, ZWJ 👨‍👩‍👧",
    "   leading spaces and trailing   \n\n\n  multiple\n\nnewlines\t\ttabs",
    "numbers 1234567890 3.14159 -42 1e-10 0xFF 1_000_000",
    "it's we're they've I'm you'll he'd IT'S WE'RE",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|> <|repo_name|> <|file_sep|>",
    "".join(chr(c) for c in range(32, 0x250, 3)),
    "\x00\x01\x7f byte oddities \ufeff BOM \u200b zero width",
]
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


@pytest.fixture(scope="module")
def both_ways(tmp_path_factory):
    """{pack key: (the cache directory transformers' conversion wrote, the one the direct conversion wrote)}."""
    from specviz.models import convert

    out = {}
    written: list[Path] = []  # ~8 GB of caches: removed when the module ends, pass or fail (CI's disk is finite)
    before = os.environ.get("SPECVIZ_CACHE")
    reference = os.environ.get("SPECVIZ_REFERENCE_CACHE")
    try:
        try:
            for key in PACKS:
                pack = _pack(key)
                written.append(tmp_path_factory.mktemp(f"direct-{key}"))
                os.environ["SPECVIZ_CACHE"] = str(written[-1])
                direct = convert._convert_pack(pack, direct=True)
                if reference:
                    theirs = Path(reference) / "models" / direct.name
                else:
                    written.append(tmp_path_factory.mktemp(f"transformers-{key}"))
                    os.environ["SPECVIZ_CACHE"] = str(written[-1])
                    theirs = convert._convert_pack(pack, direct=False)
                out[key] = (theirs, direct)
        finally:
            if before is None:
                os.environ.pop("SPECVIZ_CACHE", None)
            else:
                os.environ["SPECVIZ_CACHE"] = before
        yield out
    finally:
        for path in written:
            shutil.rmtree(path, ignore_errors=True)


@pytest.mark.real_model
@pytest.mark.slow
@pytest.mark.parametrize("key", PACKS)
def test_the_direct_cache_is_transformers_conversion_to_the_byte(both_ways, key):
    import json

    theirs, direct = both_ways[key]
    assert json.loads((direct / "specviz.json").read_text())["converter"] == "gguf-direct"
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "chat_template.jinja", "model.safetensors"):
        assert filecmp.cmp(theirs / name, direct / name, shallow=False), name
    marker = lambda d: {k: v for k, v in json.loads((d / "specviz.json").read_text()).items()  # noqa: E731
                        if k not in ("convert_seconds", "converter")}
    assert marker(theirs) == marker(direct)


@pytest.mark.real_model
@pytest.mark.slow
@pytest.mark.parametrize("key", PACKS)
def test_the_tokenizer_gives_the_same_ids(both_ways, key):
    from specviz.models.tokens import converted_tokenizer

    theirs, direct = (converted_tokenizer(d) for d in both_ways[key])
    assert theirs is not None and direct is not None
    for text in CORPUS:
        assert direct.encode(text) == theirs.encode(text), text
        assert direct.encode(text, split_special_tokens=True) == theirs.encode(text, split_special_tokens=True)
        chat = [{"role": "user", "content": text}]
        assert (direct.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)
                == theirs.apply_chat_template(chat, add_generation_prompt=True, return_dict=False))
        ids = theirs.encode(text)
        assert direct.decode(ids) == theirs.decode(ids)
    assert direct.get_vocab() == theirs.get_vocab()
    assert direct.eos_token_id == theirs.eos_token_id and direct.pad_token_id == theirs.pad_token_id


@pytest.mark.real_model
@pytest.mark.slow
def test_the_targets_records_are_cut_as_gguf_py_reads_them(both_ways, tmp_path):
    """The Q4_K / Q6_K records cut during the direct conversion equal those made from gguf-py's reader (the
    way q4k.extract read them before)."""
    import gguf
    import torch
    from safetensors.torch import load_file

    from specviz.models import OFFLINE_PACKS, q4k, q6k
    from specviz.models.packs import reassemble

    _, direct = both_ways["qwen2.5-coder-1.5b"]
    ours = q4k.records_file(direct)
    if not ours.exists():
        pytest.skip("no records cut here (the kernel is not for this CPU)")
    path = reassemble(OFFLINE_PACKS["qwen2.5-coder-1.5b"], tmp_path / "target.gguf")
    reader = gguf.GGUFReader(str(path))
    stored = load_file(str(ours))
    seen = 0
    for t in reader.tensors:
        name = q4k._hf_name(t.name)
        if name is not None and name != "lm_head" and t.tensor_type == gguf.GGMLQuantizationType.Q4_K:
            assert torch.equal(stored[name], q4k.records(np.asarray(t.data))), name
            seen += 1
        elif name is not None and t.tensor_type == gguf.GGMLQuantizationType.Q6_K:
            assert torch.equal(stored[name + q4k.Q6K_SUFFIX], q6k.records(np.asarray(t.data))), name
            seen += 1
    assert seen == len(stored) > 0


@pytest.mark.real_model
@pytest.mark.parametrize("key", PACKS)
def test_a_shipped_pack_maps_in_parts_and_knows_its_size(key):
    """The ready pair's reading of a shipped pack (specviz.models.first_start): its parts mapped, checked and read
    as one file (the header lies in the first part), holding the numbers its preset says (the size of the memory
    asked for at a server's start), every quantized tensor dequantized by the compiled path as gguf-py does."""
    gguf_py = pytest.importorskip("gguf")
    import torch

    from specviz.models import gguf_dequant, packs

    pack = _pack(key)
    split = GGUFFile(f"{key}.gguf", parts=packs.mapped(pack))
    try:
        assert sum(int(np.prod(info.shape)) for info in split.tensors.values()) == pack.values
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
