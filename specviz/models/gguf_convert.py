"""A Qwen2 GGUF in transformers' terms: its config, generation config and tensor names, and its tensors dequantized.

What both ways of running an offline pack share (:mod:`.gguf_native`): :func:`model_config` and
:func:`generation_config` are transformers' own classes made from the file's metadata (what its GGUF loading makes
of it); :func:`hf_name` maps GGUF's tensor names to transformers'; :func:`dequantize_all` gives every tensor as
transformers' GGUF loading dequantized it (gguf-py's values, :mod:`.gguf_dequant` to the bit, then cast), for a
model held in memory.  :func:`check` refuses a file this module does not handle (another architecture or
tokenizer: :class:`.gguf_tokenizer.Unsupported`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
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
