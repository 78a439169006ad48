"""An offline pack's cache written straight from its GGUF: no transformers model, no second read of the file.

:mod:`.convert` used to hand the GGUF to transformers: ``AutoTokenizer`` (its GGUF tokenizer converter) and
``AutoModelForCausalLM`` (a model built, every tensor dequantized, copied into a plain model, saved).  On the
2-core AMX Xeon that was 29 + 38 s for the 0.5B draft and 17 + 35 s for the 1.5B target; then the int8 target
reassembled and parsed the GGUF once more for its Q4_K / Q6_K records (:func:`.q4k.prepare`).

Here the file is mapped once (:class:`.gguf_file.GGUFFile`, ~0.2 s for the metadata) and:

* the tokenizer is built by ``tokenizers`` from the vocabulary and merges (:mod:`.gguf_tokenizer`);
* every tensor is dequantized as transformers' GGUF loading dequantized it (gguf-py's ``dequantize`` to
  float32, then cast to bf16) -- the same functions, so the same bits -- and written
  under transformers' names with safetensors, as ``save_pretrained`` writes them;
* ``config.json`` and ``generation_config.json`` are transformers' own classes saved;
* where the int8 target will take its GGUF matrices as stored, their records are cut from the same mapping
  (:func:`.q4k.extract_from`), so :func:`.q4k.prepare` finds them.

The files are those transformers' conversion wrote, byte for byte (tests/test_gguf_convert.py compares both),
so everything loaded from them -- int8 rows, Q4_K records made from them, logits, tokens -- is unchanged.
A GGUF this module does not handle (another architecture or tokenizer) raises :class:`.gguf_tokenizer.Unsupported`
and :mod:`.convert` converts it through transformers as before.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import gguf_dequant, gguf_tokenizer
from .gguf_file import F16, F32, GGUFFile

log = logging.getLogger("specviz.models")

ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM"}
_LAYER = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
          "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
          "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
          "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
          "attn_output.weight": "self_attn.o_proj.weight", "ffn_gate.weight": "mlp.gate_proj.weight",
          "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight"}
_TOP = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight",
        "output_norm.weight": "model.norm.weight"}


def hf_name(name: str) -> str:
    """transformers' parameter name for a Qwen2 GGUF tensor."""
    if name in _TOP:
        return _TOP[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER:
        return f"model.layers.{parts[1]}.{_LAYER[parts[2]]}"
    raise gguf_tokenizer.Unsupported(f"tensor {name!r}")


def check(gguf: GGUFFile) -> None:
    arch = gguf.metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise gguf_tokenizer.Unsupported(f"architecture {arch!r}")
    gguf_tokenizer.check(gguf.metadata)
    for name in gguf.tensors:
        hf_name(name)


def dequantized(gguf: GGUFFile, name: str, dtype: torch.dtype, widen: torch.dtype | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """Tensor ``name`` as ``dtype``, as transformers' GGUF loading makes it for a Qwen2 file
    (``modeling_gguf_pytorch_utils.load_gguf_checkpoint``): gguf-py's float32 dequantization, then the cast
    (:mod:`.gguf_dequant` computes the same values; ``widen``: then held as that wider dtype; ``out``: written
    there)."""
    info = gguf.tensors[name]
    raw = gguf.raw(name)
    if info.ggml_type == F32:
        values = torch.from_numpy(raw.view(np.float32).copy())
    elif info.ggml_type == F16:
        values = torch.from_numpy(raw.view(np.float16).astype(np.float32))
    else:
        return gguf_dequant.dequantize(raw, info.ggml_type, info.shape, dtype, widen, out)
    return gguf_dequant.cast(values.reshape(info.shape), dtype, widen, out)


def dequantize_all(gguf: GGUFFile, dtype: torch.dtype, progress=None, label: str = "",
                   workers: int = 0, widen: torch.dtype | None = None,
                   alloc: Callable[[tuple[int, ...], torch.dtype], torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of the file as ``dtype``, under transformers' names (``widen``: then held as that wider
    dtype, the same values; ``alloc(shape, dtype)``: where each is written, e.g. :meth:`.arena.Arena.take`).  ``workers`` = 0: one tensor at a time, each on every intra-op thread; n: n tensors
    at a time, each on one thread (no barrier between threads to spin at where other work shares the cores:
    measured beside a busy process, 4x faster on 2 cores)."""
    names = list(gguf.tensors)

    def make(name: str) -> torch.Tensor:
        out = alloc(gguf.tensors[name].shape, widen or dtype) if alloc is not None else None
        made = dequantized(gguf, name, dtype, widen, out)
        gguf.release(name)  # read: the file's pages out of this process's resident memory
        return made

    def collect(made: Any) -> dict[str, torch.Tensor]:
        state: dict[str, torch.Tensor] = {}
        for i, (name, tensor) in enumerate(zip(names, made)):
            state[hf_name(name)] = tensor
            if progress and i % 16 == 0:  # in order, from this thread: the fractions only grow
                progress(i / len(names), f"{label}: dequantizing tensor {i}/{len(names)}")
        return state

    if workers <= 0:
        return collect(map(make, names))
    threads = torch.get_num_threads()
    try:
        with ThreadPoolExecutor(max_workers=workers, initializer=torch.set_num_threads, initargs=(1,),
                                thread_name_prefix="specviz-dequantize") as pool:
            return collect(pool.map(make, names))
    finally:
        torch.set_num_threads(threads)  # (MKL's count is the process's: set back)


def model_config(metadata: dict[str, Any], dtype: torch.dtype, tied: bool) -> Any:
    """transformers' Qwen2Config for the file (what its GGUF loading made of the same metadata)."""
    from transformers import Qwen2Config

    arch = metadata["general.architecture"]
    get = lambda key, default=None: metadata.get(f"{arch}.{key}", default)  # noqa: E731
    tokens = metadata["tokenizer.ggml.tokens"]
    config = Qwen2Config(
        vocab_size=len(tokens), hidden_size=int(get("embedding_length")), intermediate_size=int(get("feed_forward_length")),
        num_hidden_layers=int(get("block_count")), num_attention_heads=int(get("attention.head_count")),
        num_key_value_heads=int(get("attention.head_count_kv")), max_position_embeddings=int(get("context_length")),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        rope_parameters={"rope_theta": float(get("rope.freq_base")), "rope_type": "default"},
        bos_token_id=_int(metadata.get("tokenizer.ggml.bos_token_id")),
        eos_token_id=_int(metadata.get("tokenizer.ggml.eos_token_id")),
        pad_token_id=_int(metadata.get("tokenizer.ggml.padding_token_id")),
        tie_word_embeddings=tied, architectures=[ARCHITECTURES[arch]], dtype=dtype)
    config._model_name_or_path = metadata.get("general.name", "")  # as transformers names a GGUF config
    return config


def _int(value: Any) -> int | None:
    return int(value) if value is not None else None


def eos_list(metadata: dict[str, Any], extra_tokens: tuple[str, ...]) -> list[int]:
    """What :func:`.tokens.eos_ids` gave for the converted model: the tokenizer's eos, the config's, the extras."""
    ids: list[int] = []
    vocab_index = {t: i for i, t in enumerate(metadata["tokenizer.ggml.tokens"])} if extra_tokens else {}
    for value in (gguf_tokenizer.eos_token_id(metadata), _int(metadata.get("tokenizer.ggml.eos_token_id")),
                  *(vocab_index.get(t) for t in extra_tokens)):
        if isinstance(value, int) and value >= 0 and value not in ids:
            ids.append(value)
    return ids


def generation_config(metadata: dict[str, Any], config: Any, extra_eos: tuple[str, ...]) -> tuple[Any, list[int]]:
    """(transformers' GenerationConfig as the conversion saves it, the eos ids)."""
    from transformers import GenerationConfig

    eos = eos_list(metadata, extra_eos)
    pad = _int(metadata.get("tokenizer.ggml.padding_token_id"))
    return GenerationConfig(bos_token_id=config.bos_token_id,
                            eos_token_id=(eos if len(eos) > 1 else eos[0]) if eos else None,
                            pad_token_id=pad if pad is not None else (eos or [None])[0]), eos


def write_cache(gguf_path: Path, out: Path, *, extra_eos: tuple[str, ...] = (), dtype: torch.dtype = torch.bfloat16,
                records: Path | None = None, records_source: str = "", progress=None, label: str = "") -> dict:
    """Write the converted cache of the GGUF at ``gguf_path`` into the directory ``out`` (config, generation
    config, tokenizer files, ``model.safetensors``; and the Q4_K / Q6_K records at ``records`` when given).
    Returns {"eos_token_ids", "seconds": {phase: s}}.  :class:`.gguf_tokenizer.Unsupported` before anything is
    written where the file is not one this module converts."""
    from safetensors.torch import save_file

    seconds: dict[str, float] = {}
    t = time.perf_counter()
    gguf = GGUFFile(gguf_path)
    try:
        check(gguf)
        meta = gguf.metadata
        seconds["gguf read"] = time.perf_counter() - t
        log.info("Read the GGUF of %s in %.1f s", label or gguf_path.name, seconds["gguf read"])

        t = time.perf_counter()
        tok = gguf_tokenizer.save(meta, out)
        seconds["tokenizer"] = time.perf_counter() - t
        log.info("Tokenizer of %s built in %.1f s (tokenizers, from the GGUF's vocabulary and merges)",
                 label or gguf_path.name, seconds["tokenizer"])
        del tok

        t = time.perf_counter()
        tied = "output.weight" not in gguf.tensors
        config = model_config(meta, dtype, tied)
        config.save_pretrained(str(out))
        generation, eos = generation_config(meta, config, extra_eos)
        generation.save_pretrained(str(out))
        state = dequantize_all(gguf, dtype, progress, label)
        seconds["dequantize"] = time.perf_counter() - t
        t = time.perf_counter()
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        del state
        seconds["safetensors"] = time.perf_counter() - t
        if records is not None:
            from . import q4k

            t = time.perf_counter()
            found = q4k.extract_from(gguf, records, source=records_source)
            seconds["q4k records"] = time.perf_counter() - t
            log.info("Cut %d Q4_K/Q6_K matrices of %s from its GGUF in %.1f s", found, label, seconds["q4k records"])
        log.info("Wrote the cache of %s from its GGUF: %s", label or gguf_path.name,
                 ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))
        return {"eos_token_ids": eos, "seconds": {k: round(v, 2) for k, v in seconds.items()}}
    finally:
        gguf.close()


def marker(pack: Any, eos: list[int], seconds: float, dtype: torch.dtype, cache_format: int) -> str:
    return json.dumps({"format": cache_format, "pack": pack.key, "gguf_sha256": pack.sha256,
                       "dtype": str(dtype).removeprefix("torch."), "eos_token_ids": eos,
                       "convert_seconds": round(seconds, 1), "transformers": __import__("transformers").__version__,
                       "converter": "gguf-direct"}, indent=1)
