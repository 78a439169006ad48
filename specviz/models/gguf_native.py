"""A model run from its GGUF file as stored: the file is the model, nothing converted, no weight cached on disk.

An offline pack's parts are mapped and checked (:func:`read`), and the model's module tree is built
around the file's own tensors (:class:`.bare.BareCausalLM`, transformers' names):

* every Q4_K and Q6_K matrix -- all of the 1.5B target's, the head included, and the draft's down projections --
  becomes a product on its records (:class:`.q4k.Q4KLinear`, :class:`.q6k.Q6KLinear`), made from the mapped
  blocks in C (:mod:`.gguf_records`) straight into one huge-page region (:mod:`.hugepages`): the q/k/v and
  gate/up members of one kind share one product;
* a matrix the kernels do not take as stored (the draft's Q5_0 and Q8_0 ones: their fifth bit made the kernel
  compute-bound) is dequantized (:mod:`.gguf_dequant`) and quantized to Q4_K records in memory
  (:func:`.gguf_records.quantize_q4k`): a draft's numbers change what it proposes, never what the rule outputs;
* norms and biases are the file's float32 tensors; the token embeddings are dequantized into bfloat16 (gguf-py's
  values, rounded as a converted checkpoint held them), the head's first rows too (the learned head's
  fingerprint, :func:`specviz.speculator.model.head_fingerprint`, finds the same target).

It runs where specviz's kernel does (:func:`.q4k.enabled`); elsewhere a pack is dequantized into a transformers
model in memory (:func:`dequantized`).
"""

from __future__ import annotations

import os
import struct
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from . import gguf_convert, gguf_dequant, gguf_records, gguf_tokenizer, hugepages
from .bare import BareCausalLM, _module, _Norm, _Rotary
from .gguf_file import Q4_K, Q6_K, GGUFFile
from .int8 import CompactEmbedding
from .int8_target import parts_of
from .packs import mapped, unmap
from .packs import read as read_whole
from .pair import ModelError, ProgressFn, log, report
from .q4k import QK, REC as Q4K_REC, Q4KLinear
from .q6k import REC as Q6K_REC, Q6KLinear
from .tokens import converted_tokenizer

# The decoder's products: (module, members) with GGUF's names for them
GROUPS = (("self_attn", (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"))),
          ("self_attn", (("o_proj", "attn_output"),)),
          ("mlp", (("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"))),
          ("mlp", (("down_proj", "ffn_down"),)))
STORED = {Q4_K: (Q4KLinear, Q4K_REC), Q6_K: (Q6KLinear, Q6K_REC)}  # matrices the kernels read as stored
WORKERS = max(1, min(4, os.cpu_count() or 1))  # tensors dequantized at once (dequantized)
CHUNK_ROWS = 8192  # rows read at once (a made matrix's in float32: ~30 MB at 896 wide)


class _Region:
    """One allocation for a model's records, handed out in order (in huge pages where :mod:`.hugepages` is on)."""

    def __init__(self, nbytes: int):
        self.data = hugepages.empty(nbytes) if hugepages.enabled() else torch.empty(nbytes, dtype=torch.uint8)
        self.at = 0

    def take(self, shape: tuple[int, ...]) -> torch.Tensor:
        n = int(np.prod(shape))
        out = self.data[self.at:self.at + n].view(shape)
        self.at += -(-n // 64) * 64  # each on a cache line
        return out


def _kind(gguf: GGUFFile, name: str, stored: tuple[int, ...] = (Q4_K, Q6_K)) -> int:
    """The record form a matrix runs in: its own type where the kernels read it as stored, else Q4_K (made)."""
    t = gguf.tensors[name].ggml_type
    return t if t in stored else Q4_K


def _record_bytes(gguf: GGUFFile, name: str, stored: tuple[int, ...]) -> int:
    rows, width = gguf.tensors[name].shape
    rec = STORED[_kind(gguf, name, stored)][1]
    return -(-rows * -(-width // QK) * rec // 64) * 64


def _fill(gguf: GGUFFile, name: str, out: torch.Tensor, stored: tuple[int, ...]) -> None:
    """Matrix ``name``'s records into ``out`` (uint8 [rows, blocks, record bytes]): as stored, or made."""
    info = gguf.tensors[name]
    rows, width = info.shape
    for first in range(0, rows, CHUNK_ROWS):  # (a chunk across two of the pack's parts is copied: a small copy)
        last = min(rows, first + CHUNK_ROWS)
        raw = gguf.raw(name, last - first, first)
        if info.ggml_type in stored:
            gguf_records.records(raw, info.ggml_type, out=out[first:last])
        else:
            values = gguf_dequant.dequantize(raw, info.ggml_type, (last - first, width), torch.float32)
            gguf_records.quantize_q4k(values, out=out[first:last])
    gguf.release(name)  # read: the file's pages out of the start's resident memory


def _product(gguf: GGUFFile, names: list[str], region: _Region, stored: tuple[int, ...]) -> nn.Module:
    """One product over matrices ``names`` (read by one input, of one record form): their rows stacked."""
    rows = [gguf.tensors[n].shape[0] for n in names]
    width = gguf.tensors[names[0]].shape[1]
    cls, rec = STORED[_kind(gguf, names[0], stored)]
    records = region.take((sum(rows), -(-width // QK), rec))
    start = 0
    for name, n in zip(names, rows):
        _fill(gguf, name, records[start:start + n], stored)
        start += n
    biases = [gguf.tensors.get(name.replace(".weight", ".bias")) for name in names]
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat([_float(gguf, b.name) if b is not None else torch.zeros(n) for b, n in zip(biases, rows)])
    return cls(records, bias) if cls is Q6KLinear else Q4KLinear(records, bias, width)


def _float(gguf: GGUFFile, name: str) -> torch.Tensor:
    """A float32 tensor of the file (a norm, a bias), copied out of the mapping."""
    info = gguf.tensors[name]
    if info.ggml_type != 0:
        raise ValueError(f"{name} is stored as ggml type {info.ggml_type}, not float32")
    return torch.from_numpy(np.array(gguf.raw(name)).view(np.float32).reshape(info.shape))


def build(gguf: GGUFFile, extra_eos: tuple[str, ...] = (), label: str = "", *, draft: bool = False) -> BareCausalLM:
    """The model in ``gguf`` (Qwen2: :func:`.gguf_convert.check`) on its own blocks (the module's docstring).
    ``draft``: its Q6_K matrices made Q4_K as well (a draft's numbers change what it proposes, never what the rule
    outputs; its step is its cost: Q6_K's 0.82 bytes a weight and slower kernel made the 0.5B draft's c 0.42-0.44
    where all-Q4_K gave 0.39-0.41 on a Zen 5 EPYC)."""
    t0 = time.perf_counter()
    stored = (Q4_K,) if draft else (Q4_K, Q6_K)
    gguf_convert.check(gguf)
    tensors = gguf.tensors
    tied = "output.weight" not in tensors
    config = gguf_convert.model_config(gguf.metadata, torch.bfloat16, tied)
    generation, _eos = gguf_convert.generation_config(gguf.metadata, config, extra_eos)
    head_name = "token_embd.weight" if tied else "output.weight"
    layer_groups = [[[f"blk.{i}.{g}.weight" for _, g in members] for _, members in GROUPS]
                    for i in range(config.num_hidden_layers)]
    sizes = [_record_bytes(gguf, n, stored) for groups in layer_groups for names in groups for n in names]
    region = _Region(sum(sizes) + _record_bytes(gguf, head_name, stored) + 64 * (len(sizes) + 1))
    layers = nn.ModuleList()
    for i, groups in enumerate(layer_groups):
        parts: dict[str, dict[str, nn.Module]] = {"self_attn": {}, "mlp": {}}
        for (owner, members), names in zip(GROUPS, groups):
            # members of one record form share a product (q and k Q4_K, v Q6_K: two products)
            for kind in dict.fromkeys(_kind(gguf, n, stored) for n in names):
                chosen = [(hf, n) for (hf, _), n in zip(members, names) if _kind(gguf, n, stored) == kind]
                product = _product(gguf, [n for _, n in chosen], region, stored)
                split = parts_of(product, [tensors[n].shape[0] for _, n in chosen], tensors[chosen[0][1]].shape[1])
                parts[owner].update({hf: module for (hf, _), module in zip(chosen, split)})
        layers.append(_module(self_attn=_module(**{hf: parts["self_attn"][hf] for hf, _ in GROUPS[0][1] + GROUPS[1][1]}),
                              mlp=_module(**{hf: parts["mlp"][hf] for hf, _ in GROUPS[2][1] + GROUPS[3][1]}),
                              input_layernorm=_Norm(_float(gguf, f"blk.{i}.attn_norm.weight")),
                              post_attention_layernorm=_Norm(_float(gguf, f"blk.{i}.ffn_norm.weight"))))
    embed_info = tensors["token_embd.weight"]
    embed = torch.empty(embed_info.shape, dtype=torch.bfloat16)
    for first in range(0, embed_info.shape[0], CHUNK_ROWS):
        raw = gguf.raw(embed_info.name, CHUNK_ROWS, first)
        gguf_dequant.dequantize(raw, embed_info.ggml_type, (raw.shape[0], embed_info.shape[1]), torch.bfloat16,
                                out=embed[first:first + raw.shape[0]])
    gguf.release(embed_info.name)
    head_dim = config.hidden_size // config.num_attention_heads
    # kept in bf16, read out as float32 (every product here takes and gives float32), as an int8 model's is
    embedding = CompactEmbedding(embed.shape[0], embed.shape[1], _weight=embed, _freeze=True)
    body = _module(embed_tokens=embedding, layers=layers,
                   norm=_Norm(_float(gguf, "output_norm.weight")),
                   rotary_emb=_Rotary(float(config.rope_parameters["rope_theta"]), head_dim))
    head = _product(gguf, [head_name], region, stored)
    model = BareCausalLM(config, None, body, head, generation)
    info = tensors[head_name]  # the head's first rows, as a converted checkpoint held them (head_fingerprint)
    model._specviz_head_rows = gguf_dequant.dequantize(gguf.raw(head_name, rows=8), info.ggml_type, (8, info.shape[1]),
                                                       torch.bfloat16)
    model._specviz_hugepages = hugepages.enabled()  # (made in them: nothing to move)
    log.info("%s: %d products on its GGUF's blocks, %.0f MB of records, built in %.1f s", label or gguf.path.name,
             sum(isinstance(m, (Q4KLinear, Q6KLinear)) for m in model.modules()), region.at / 2**20,
             time.perf_counter() - t0)
    return model.requires_grad_(False).eval()


def dequantized(gguf: GGUFFile, extra_eos: tuple[str, ...], dtype: torch.dtype, label: str = "") -> nn.Module:
    """transformers' model of ``gguf`` with every tensor dequantized into memory (gguf-py's values, rounded to bf16
    as a converted checkpoint held them, then held as ``dtype``): where the kernel does not run the blocks as
    stored, or another execution is asked for (float32, bf16, a GPU's).  Nothing is written."""
    import transformers

    t = time.perf_counter()
    gguf_convert.check(gguf)
    config = gguf_convert.model_config(gguf.metadata, dtype, "output.weight" not in gguf.tensors)
    widen = dtype if dtype != torch.bfloat16 else None
    state = gguf_convert.dequantize_all(gguf, torch.bfloat16, widen=widen, workers=WORKERS)
    # the module tree on the meta device, then these very tensors assigned (from_pretrained copied them: the float32
    # 1.5B target peaked 3 GB above what it holds)
    with torch.device("meta"):
        model = getattr(transformers, config.architectures[0])(config)
    model.load_state_dict(state, strict=False, assign=True)
    del state
    if config.tie_word_embeddings:
        model.tie_weights()
    model.to(dtype)
    # RoPE's frequencies, on the CPU and in float32, as from_pretrained leaves them (after the cast, which would
    # round them to bf16)
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ModelError(f"{label or gguf.path.name}: the GGUF lacks {', '.join(left[:4])}")
    model.generation_config, _ = gguf_convert.generation_config(gguf.metadata, config, extra_eos)
    log.info("Dequantized %s from its GGUF (%s) in %.1f s", label or gguf.path.name, dtype, time.perf_counter() - t)
    return model.requires_grad_(False).eval()


def read(pack: Any) -> GGUFFile:
    """The pack's GGUF as its part files mapped and checked (size, sha256): nothing copied; read into memory where
    its header does not lie in the first part."""
    t = time.perf_counter()
    parts = mapped(pack)
    try:
        gguf = GGUFFile(f"{pack.key}.gguf", parts=parts)
        how = "mapped"
    except (struct.error, IndexError, ValueError, UnicodeDecodeError):
        unmap(parts)
        gguf, how = GGUFFile(f"{pack.key}.gguf", read_whole(pack)), "read into memory"
    log.info("Checked the GGUF of %s (%s) in %.1f s", pack.display, how, time.perf_counter() - t)
    return gguf


def tokenizer_of(metadata: dict[str, Any], label: str) -> Any:
    """transformers' tokenizer built by ``tokenizers`` from the GGUF's vocabulary and merges (:mod:`.gguf_tokenizer`)."""
    t = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="specviz-tokenizer-") as tmp:
        gguf_tokenizer.save(metadata, Path(tmp))
        tok = converted_tokenizer(tmp)
    if tok is None:  # (the files this module writes are always read directly)
        raise gguf_tokenizer.Unsupported("tokenizer files not read directly")
    log.info("Tokenizer of %s built in %.1f s (tokenizers, from the GGUF's vocabulary and merges)", label,
             time.perf_counter() - t)
    return tok


def models(draft_pack: Any, target_pack: Any, progress: ProgressFn | None = None
           ) -> tuple[BareCausalLM, BareCausalLM, Any]:
    """(draft, target, tokenizer) of two offline packs, each built on its file's blocks (:func:`build`)."""
    from transformers import TokenizersBackend  # noqa: F401  (here: transformers' lazy imports are not thread-safe)

    packs = {"draft": draft_pack, "target": target_pack}
    made: dict[str, BareCausalLM] = {}
    files: dict[str, Any] = {}
    try:
        # the files read and checked (hashlib: mostly without the interpreter lock) and the tokenizer built (Rust)
        # in threads while this one builds the draft
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="specviz-gguf") as pool:
            files = {role: pool.submit(read, p) for role, p in packs.items()}
            vocabulary = files["draft"].result().metadata
            tokenizer_built = pool.submit(tokenizer_of, vocabulary, draft_pack.display)
            for role, lo in (("draft", 0.0), ("target", 0.4)):
                gguf = files[role].result()
                report(progress, lo, f"Reading {packs[role].display} from its GGUF…")
                if gguf.metadata["tokenizer.ggml.tokens"] != vocabulary["tokenizer.ggml.tokens"]:
                    raise ModelError("The two packs' vocabularies differ: speculative decoding needs one vocabulary.")
                made[role] = build(gguf, packs[role].extra_eos, packs[role].display, draft=role == "draft")
            tokenizer = tokenizer_built.result()
    finally:
        for future in files.values():
            if future.done() and future.exception() is None:
                future.result().close()
    if made["draft"].config.vocab_size != made["target"].config.vocab_size:
        raise ModelError("The two packs' heads differ in width.")
    return made["draft"], made["target"], tokenizer


__all__ = ["build", "dequantized", "models", "read", "tokenizer_of"]
