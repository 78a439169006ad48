"""A first start's ready pair: the offline pair read straight from its GGUFs into memory, served at once.

The first start of a server (a Space wakes up with an empty disk) used to hold its first live run until the
default pair was converted, its int8 weights and Q4_K records made, the kernel compiled and the machine
probed: about 170 s on the 2-core AMD EPYC (Zen 3).  Most of that is preparation for *speed*, not for
*answers*.  This module makes a pair that answers now:

* each pack's parts are read into memory, checked (size and sha256) and parsed (:class:`.gguf_file.GGUFFile`);
  nothing is written;
* the tokenizer is built by ``tokenizers`` from the GGUF's vocabulary and merges (:mod:`.gguf_tokenizer`);
* every tensor is dequantized in torch (:mod:`.gguf_dequant`: gguf-py's values to the bit) and rounded to bf16
  as a converted cache holds it, into transformers models: the draft in bf16, the target in bf16 where the CPU
  has native bf16 (AMX, AVX512-BF16), else in float32 holding the same values (:func:`run_dtype`);

so the pair is the converted pair's bf16 or fp32 execution to the bit, on the stock kernels.  The
server (:mod:`specviz.serving.first_start`) serves it while the full load (conversion, kernel, probe) runs in
the background at a low priority, then swaps the prepared pair in.
"""

from __future__ import annotations

import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from . import executions, gguf_convert, gguf_tokenizer
from .convert import needs_conversion, offline_pack, source_of
from .gguf_file import GGUFFile
from .loading import canonical_head_input
from .packs import read
from .pair import ModelPair, ProgressFn, log, report, span
from .tokens import converted_tokenizer, eos_ids

DTYPE = torch.bfloat16  # what a converted cache holds: every weight is rounded to it, as there
NATIVE_BF16 = frozenset({"amx_bf16", "avx512_bf16"})


def run_dtype(available: int | None = None, params_b: tuple[float, float] | None = None) -> torch.dtype | None:
    """What the ready target runs in: bf16 where the CPU computes it natively, else float32 holding the bf16 values
    -- where the memory ``available`` holds it (:func:`fits`), else bf16; None where not even that fits.
    Without native bf16 (AVX2 CPUs) a prompt's pass is ~3x faster in float32 (the 1.5B target, 45 tokens: 2.1 s
    against 6.2 on the 2-core Zen 3 EPYC), which is most of a first run; one token's step is slower there (380 ms
    against 242), and it takes twice the memory.  The draft stays bf16, as a converted pair loads it."""
    from .kernels import _cpu_flags

    wide = DTYPE if NATIVE_BF16 & _cpu_flags() else torch.float32
    if available is None or params_b is None:
        return wide
    for dtype in dict.fromkeys((wide, DTYPE)):
        if fits(available, params_b, dtype):
            return dtype
    return None


def fits(available: int, params_b: tuple[float, float], dtype: torch.dtype) -> bool:
    """Whether the ready pair (draft bf16, target ``dtype``) and the conversion beside it (the target's bf16
    weights and its Q4_K records, written meanwhile) fit in ``available`` bytes with 4 GB to spare: on the
    24 GB EPYC the fp32 ready pair (7.1 GB) and the conversion (4.1 GB) peaked at 12.9-14.2 GB resident."""
    draft, target = (p * 1e9 for p in params_b)
    ready = 2 * draft + target * torch.finfo(dtype).bits / 8
    converting = 2 * target + 1e9
    return ready + converting + 4e9 <= available


WORKERS = max(1, min(4, os.cpu_count() or 1))  # tensors dequantized at once (gguf_convert.dequantize_all)


def wanted(draft_ref: str, target_ref: str, device: torch.device) -> bool:
    """Whether a ready pair can stand in for this pair's load: two offline packs on a CPU, one at least not
    converted yet (else the load itself is quick)."""
    packs = [offline_pack(ref) for ref in (draft_ref, target_ref)]
    return (device.type == "cpu" and all(p is not None for p in packs)
            and any(needs_conversion(ref) for ref in (draft_ref, target_ref)))


def convert_packs(draft_ref: str, target_ref: str) -> None:
    """Write both packs' converted caches (the prepared pair's load then finds them: :func:`.convert.source_of`)."""
    for ref in (draft_ref, target_ref):
        source_of(ref, None)


def build_kernel() -> None:
    """Compile specviz's kernel where the prepared pair will use it (:func:`.q4k.expected`), not at all elsewhere."""
    from . import kernels, q4k

    if q4k.expected():
        kernels.matches()


def _model(gguf: GGUFFile, label: str, extra_eos: tuple[str, ...], run: torch.dtype, progress: ProgressFn | None) -> Any:
    import transformers

    gguf_convert.check(gguf)
    config = gguf_convert.model_config(gguf.metadata, run, "output.weight" not in gguf.tensors)
    t = time.perf_counter()
    state = gguf_convert.dequantize_all(gguf, DTYPE, progress, label, workers=WORKERS, widen=None if run == DTYPE else run)
    log.info("Dequantized %s from its GGUF in %.1f s", label, time.perf_counter() - t)
    model_class = getattr(transformers, config.architectures[0])  # (gguf_convert.ARCHITECTURES: Qwen2ForCausalLM)
    model = model_class.from_pretrained(None, config=config, state_dict=state, dtype=run)
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


def ready_pair(label: str, draft_ref: str, target_ref: str, progress: ProgressFn | None = None,
               run: torch.dtype | None = None) -> ModelPair:
    """The pair ``draft_ref`` -> ``target_ref`` (two offline packs) as transformers models made in memory from
    their GGUFs; the target in ``run`` (None: :func:`run_dtype`).  :class:`.gguf_tokenizer.Unsupported` where a
    file is not one this module reads, and the loaders' ModelError where a pack is missing or damaged."""
    t0 = time.perf_counter()
    run = run or run_dtype()
    from transformers import TokenizersBackend  # noqa: F401  (here: transformers' lazy imports are not thread-safe)

    made: dict[str, tuple[Any, str]] = {}
    # The target's file is read and checked (hashlib: mostly without the interpreter lock) and the tokenizer
    # built (in Rust: likewise) while the draft is dequantized.
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="specviz-ready") as pool:
        target_file = pool.submit(_read, offline_pack(target_ref))
        draft_file = _read(offline_pack(draft_ref))
        vocabulary = draft_file.metadata["tokenizer.ggml.tokens"]
        tokenizer_built = pool.submit(_tokenizer, draft_file.metadata, offline_pack(draft_ref).display)
        getattr(__import__("transformers"), gguf_convert.ARCHITECTURES["qwen2"])  # its modelling code (lock-bound)
        for role, file, (lo, hi) in (("draft", draft_file, (0.0, 0.3)), ("target", target_file, (0.3, 0.95))):
            pack = offline_pack(draft_ref if role == "draft" else target_ref)
            step = span(progress, lo, hi)
            report(step, 0.0, f"Reading {pack.display} from its GGUF…")
            gguf = file if isinstance(file, GGUFFile) else file.result()
            try:
                if gguf.metadata["tokenizer.ggml.tokens"] != vocabulary:
                    raise gguf_tokenizer.Unsupported("the two packs' vocabularies differ")
                dtype = run if role == "target" else DTYPE  # (the draft: as a converted pair loads it)
                made[role] = (_model(gguf, pack.display, pack.extra_eos, dtype, span(step, 0.1, 1.0)), pack.display)
            finally:
                gguf.close()
        tokenizer = tokenizer_built.result()
    (draft, draft_name), (target, target_name) = made["draft"], made["target"]
    for model in (draft, target):
        canonical_head_input(model)  # (as every loaded pair's: loading._load_once)
    widths = {int(m.get_output_embeddings().weight.shape[0]) for m in (draft, target)}
    if len(widths) != 1:
        raise gguf_tokenizer.Unsupported("the two models' heads differ in width")
    eos = eos_ids(tokenizer, target.generation_config)
    ctx = min(int(m.config.max_position_embeddings) for m in (draft, target))
    pair = ModelPair(preset=label, draft_name=draft_name, target_name=target_name, draft=draft, target=target,
                     tokenizer=tokenizer, device=torch.device("cpu"), dtype=DTYPE, draft_quant=None,
                     eos_token_ids=eos, context_length=ctx, vocab_size=widths.pop(),
                     load_seconds=time.perf_counter() - t0, target_exec=executions.dtype_name(run))
    report(progress, 1.0, f"Ready: {draft_name} → {target_name} read from their GGUFs in {pair.load_seconds:.1f} s "
           f"({pair.target_exec}; the prepared pair follows)")
    return pair
