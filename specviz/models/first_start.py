"""A first start's ready pair: the offline pair read straight from its GGUFs into memory, served at once.

The first start of a server (a Space wakes up with an empty disk) used to hold its first live run until the
default pair was converted, its int8 weights and Q4_K records made, the kernel compiled and the machine
probed: about 170 s on the 2-core AMD EPYC (Zen 3).  Most of that is preparation for *speed*, not for
*answers*.  This module makes a pair that answers now:

* each pack's parts are read into memory, checked (size and sha256) and parsed (:class:`.gguf_file.GGUFFile`);
  nothing is written;
* the tokenizer is built by ``tokenizers`` from the GGUF's vocabulary and merges (:mod:`.gguf_tokenizer`);
* every tensor is dequantized in torch (:mod:`.gguf_dequant`: gguf-py's values to the bit) into a bf16
  transformers model (the same weights a converted cache holds, byte for byte);

so the target runs as "bf16": the same model as the converted pair's bf16 target, on the stock kernels.  The
server (:mod:`specviz.serving.first_start`) serves it while the full load (conversion, kernel, probe) runs in
the background at a low priority, then swaps the prepared pair in.
"""

from __future__ import annotations

import os
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from . import gguf_convert, gguf_tokenizer
from .convert import needs_conversion, offline_pack
from .gguf_file import GGUFFile
from .packs import read
from .pair import ModelPair, ProgressFn, log, report, span
from .tokens import converted_tokenizer, eos_ids

DTYPE = torch.bfloat16  # what a converted cache holds: the ready target is its bf16 execution
WORKERS = max(1, min(4, os.cpu_count() or 1))  # tensors dequantized at once (gguf_convert.dequantize_all)


def wanted(draft_ref: str, target_ref: str, device: torch.device) -> bool:
    """Whether a ready pair can stand in for this pair's load: two offline packs on a CPU, one at least not
    converted yet (else the load itself is quick)."""
    packs = [offline_pack(ref) for ref in (draft_ref, target_ref)]
    return (device.type == "cpu" and all(p is not None for p in packs)
            and any(needs_conversion(ref) for ref in (draft_ref, target_ref)))


def _model(gguf: GGUFFile, label: str, extra_eos: tuple[str, ...], progress: ProgressFn | None) -> Any:
    import transformers

    gguf_convert.check(gguf)
    config = gguf_convert.model_config(gguf.metadata, DTYPE, "output.weight" not in gguf.tensors)
    t = time.perf_counter()
    state = gguf_convert.dequantize_all(gguf, DTYPE, progress, label, workers=WORKERS)
    log.info("Dequantized %s from its GGUF in %.1f s", label, time.perf_counter() - t)
    model_class = getattr(transformers, config.architectures[0])  # (gguf_convert.ARCHITECTURES: Qwen2ForCausalLM)
    model = model_class.from_pretrained(None, config=config, state_dict=state, dtype=DTYPE)
    del state
    model.generation_config, _ = gguf_convert.generation_config(gguf.metadata, config, extra_eos)
    model.requires_grad_(False)
    return model.eval()


def _read(pack: Any) -> GGUFFile:
    t = time.perf_counter()
    gguf = GGUFFile(f"{pack.key}.gguf", read(pack))
    log.info("Read the GGUF of %s into memory in %.1f s", pack.display, time.perf_counter() - t)
    return gguf


def _tokenizer(metadata: dict[str, Any], label: str) -> Any:
    t = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="specviz-tokenizer-") as tmp:
        gguf_tokenizer.save(metadata, Path(tmp))
        tok = converted_tokenizer(tmp)
    if tok is None:  # (the files this module writes are always read directly)
        raise gguf_tokenizer.Unsupported("tokenizer files not read directly")
    log.info("Tokenizer of %s built in %.1f s (tokenizers, from the GGUF's vocabulary and merges)", label,
             time.perf_counter() - t)
    return tok


def ready_pair(label: str, draft_ref: str, target_ref: str, progress: ProgressFn | None = None) -> ModelPair:
    """The pair ``draft_ref`` -> ``target_ref`` (two offline packs) as bf16 transformers models made in memory
    from their GGUFs.  :class:`.gguf_tokenizer.Unsupported` where a file is not one this module reads, and the
    loaders' ModelError where a pack is missing or damaged."""
    t0 = time.perf_counter()
    from transformers import TokenizersBackend  # noqa: F401  (here: transformers' lazy imports are not thread-safe)

    made: dict[str, tuple[Any, str]] = {}
    # The tokenizer is built (in Rust, mostly without the interpreter lock) while the draft is dequantized,
    # and the target's file is read and checked (hashlib: likewise) meanwhile too.
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="specviz-ready") as pool:
        files = {role: pool.submit(_read, offline_pack(ref)) for role, ref in (("draft", draft_ref), ("target", target_ref))}
        # (its modelling code imported now, while the files are read: that takes the interpreter lock, hashing not)
        getattr(__import__("transformers"), gguf_convert.ARCHITECTURES["qwen2"])
        tokenizer_built: Future | None = None
        vocabulary = None
        for role, ref, (lo, hi) in (("draft", draft_ref, (0.0, 0.3)), ("target", target_ref, (0.3, 0.95))):
            pack = offline_pack(ref)
            step = span(progress, lo, hi)
            report(step, 0.0, f"Reading {pack.display} from its GGUF…")
            gguf = files[role].result()
            try:
                if tokenizer_built is None:
                    tokenizer_built = pool.submit(_tokenizer, gguf.metadata, pack.display)
                    vocabulary = gguf.metadata["tokenizer.ggml.tokens"]
                elif gguf.metadata["tokenizer.ggml.tokens"] != vocabulary:
                    raise gguf_tokenizer.Unsupported("the two packs' vocabularies differ")
                made[role] = (_model(gguf, pack.display, pack.extra_eos, span(step, 0.1, 1.0)), pack.display)
            finally:
                gguf.close()
        tokenizer = tokenizer_built.result()
    (draft, draft_name), (target, target_name) = made["draft"], made["target"]
    widths = {int(m.get_output_embeddings().weight.shape[0]) for m in (draft, target)}
    if len(widths) != 1:
        raise gguf_tokenizer.Unsupported("the two models' heads differ in width")
    eos = eos_ids(tokenizer, target.generation_config)
    ctx = min(int(m.config.max_position_embeddings) for m in (draft, target))
    pair = ModelPair(preset=label, draft_name=draft_name, target_name=target_name, draft=draft, target=target,
                     tokenizer=tokenizer, device=torch.device("cpu"), dtype=DTYPE, draft_quant=None,
                     eos_token_ids=eos, context_length=ctx, vocab_size=widths.pop(),
                     load_seconds=time.perf_counter() - t0, target_exec="bf16")
    report(progress, 1.0, f"Ready: {draft_name} → {target_name} read from their GGUFs in {pair.load_seconds:.1f} s "
           "(bf16; the prepared pair follows)")
    return pair
