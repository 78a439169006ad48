"""A first start's ready pair: the offline pair read straight from its GGUFs into memory, served at once.

The first start of a server (a Space wakes up with an empty disk) used to hold its first live run until the
default pair was converted, its int8 weights and Q4_K records made, the kernel compiled and the machine
probed: about 170 s on the 2-core AMD EPYC (Zen 3).  Most of that is preparation for *speed*, not for
*answers*.  This module makes a pair that answers now:

* each pack's part files are mapped and checked (size and sha256) and parsed as one file
  (:class:`.gguf_file.GGUFFile`): nothing is copied or written;
* the tokenizer is built by ``tokenizers`` from the GGUF's vocabulary and merges (:mod:`.gguf_tokenizer`);
* every tensor is dequantized (:mod:`.gguf_dequant`: gguf-py's values to the bit) and rounded to bf16, as a
  converted cache holds it, into memory asked for at the server's start and faulted in meanwhile
  (:mod:`.arena`), and made into transformers models that compute in bf16 where the CPU has native bf16 (AMX,
  AVX512-BF16), else in float32 on those bf16 weights (:mod:`.upcast`; :func:`run_dtype`);

so the pair holds the converted pair's weights to the bit and runs on the stock kernels.  The server
(:mod:`specviz.serving.first_start`) serves it while the full load (conversion, kernel, probe) runs in the
background at a low priority, then swaps the prepared pair in.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from . import executions, gguf_convert, gguf_tokenizer, upcast
from .gguf_native import read as _read
from .gguf_native import tokenizer_of as _tokenizer
from .arena import ALIGN, Arena
from .convert import needs_conversion, offline_pack, source_of
from .gguf_file import GGUFFile
from .loading import canonical_head_input
from .pair import ModelPair, ProgressFn, log, report, span
from .tokens import eos_ids

DTYPE = torch.bfloat16  # what a converted cache holds: every weight is rounded to it, as there
NATIVE_BF16 = frozenset({"amx_bf16", "avx512_bf16"})


def run_dtype(available: int | None = None, values_b: tuple[float, float] | None = None) -> torch.dtype | None:
    """What the ready pair computes in: bf16 where the CPU computes it natively, else float32 (:mod:`.upcast`:
    the bf16 weights widened block by block) -- where the memory ``available`` holds the pair (:func:`fits`;
    ``values_b``: the two files' numbers, in billions); None where it does not.  Without native bf16 (AVX2 CPUs)
    a prompt's pass is ~3-4x faster in float32 (61 tokens on the 2-core Zen 3 EPYC: the 1.5B target 3.4 s, the
    0.5B draft 0.7 s; in bf16 the pair's first run took 11 s against 4), which is most of a first run."""
    from .kernels import _cpu_flags

    if available is not None and values_b is not None and not fits(available, values_b):
        return None
    return DTYPE if NATIVE_BF16 & _cpu_flags() else torch.float32


def fits(available: int, values_b: tuple[float, float]) -> bool:
    """Whether the ready pair (both models' weights in bf16) and the conversion beside it (the target's bf16
    weights and its Q4_K records, written meanwhile) fit in ``available`` bytes with 4 GB to spare."""
    draft, target = (v * 1e9 for v in values_b)
    ready = (draft + target) * 2
    converting = 2 * target + 1e9
    return ready + converting + 4e9 <= available


def values_b(draft_ref: str, target_ref: str) -> tuple[float, float]:
    """The numbers in the two packs' tensors, in billions (what the ready pair holds)."""
    return tuple(offline_pack(ref).values / 1e9 for ref in (draft_ref, target_ref))  # type: ignore[return-value]


WORKERS = max(1, min(4, os.cpu_count() or 1))  # tensors dequantized at once (gguf_convert.dequantize_all)


def wanted(draft_ref: str, target_ref: str, device: torch.device) -> bool:
    """Whether a ready pair can stand in for this pair's load: two offline packs on a CPU where specviz's kernel
    does not run them as stored, one at least not converted yet (else the load itself is quick)."""
    from . import q4k

    packs = [offline_pack(ref) for ref in (draft_ref, target_ref)]
    # where specviz's kernel runs, the pair loads from its GGUFs as stored in seconds (models.gguf_native)
    return (device.type == "cpu" and all(p is not None for p in packs) and not q4k.expected()
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


def _model(gguf: GGUFFile, label: str, extra_eos: tuple[str, ...], run: torch.dtype, progress: ProgressFn | None,
           arena: Arena | None = None, target: bool = False) -> Any:
    import transformers

    gguf_convert.check(gguf)
    config = gguf_convert.model_config(gguf.metadata, DTYPE, "output.weight" not in gguf.tensors)
    t = time.perf_counter()
    state = gguf_convert.dequantize_all(gguf, DTYPE, progress, label, workers=WORKERS,
                                        alloc=arena.take if arena is not None else None)
    log.info("Dequantized %s from its GGUF in %.1f s", label, time.perf_counter() - t)
    model_class = getattr(transformers, config.architectures[0])  # (gguf_convert.ARCHITECTURES: Qwen2ForCausalLM)
    model = model_class.from_pretrained(None, config=config, state_dict=state, dtype=DTYPE)  # (keeps these tensors)
    del state
    if run != DTYPE:
        upcast.widen(model)
    elif target:  # (its buffers too -- the rotary frequencies -- as executions.apply leaves a loaded bf16 target)
        model.to(DTYPE)
    model.generation_config, _ = gguf_convert.generation_config(gguf.metadata, config, extra_eos)
    model.requires_grad_(False)
    return model.eval()


_RESERVED: list[tuple[tuple[str, str, torch.dtype], Arena]] = []


def _arena_bytes(draft_ref: str, target_ref: str) -> int:
    """The ready pair's memory (its weights in bf16; 0: a pack's size unknown), with room to align each tensor."""
    values = [offline_pack(ref).values for ref in (draft_ref, target_ref)]
    return 0 if not all(values) else sum(values) * 2 + 4096 * ALIGN


def reserve(draft_ref: str, target_ref: str, run: torch.dtype) -> None:
    """Ask for the ready pair's memory now and have it faulted in (:mod:`.arena`) while the server's imports go
    on: :func:`ready_pair` takes it; :func:`release` lets it go where no ready pair comes."""
    release()
    if nbytes := _arena_bytes(draft_ref, target_ref):
        _RESERVED.append(((draft_ref, target_ref, run), Arena(nbytes, "the ready pair")))


def reserved(draft_ref: str | None = None, target_ref: str | None = None) -> torch.dtype | None:
    """The dtype of a reservation still to be taken (for the pair ``draft_ref`` -> ``target_ref`` where they are
    given: another pair's was chosen for that pair's memory), if any."""
    if not _RESERVED:
        return None
    (draft, target, run), _ = _RESERVED[0]
    return run if draft_ref is None or (draft, target) == (draft_ref, target_ref) else None


def release() -> None:
    while _RESERVED:
        _RESERVED.pop()[1].close()


def _claim(draft_ref: str, target_ref: str, run: torch.dtype) -> Arena | None:
    if _RESERVED and _RESERVED[0][0] == (draft_ref, target_ref, run):
        return _RESERVED.pop()[1]
    release()
    nbytes = _arena_bytes(draft_ref, target_ref)
    return Arena(nbytes, "the ready pair") if nbytes else None


def ready_pair(label: str, draft_ref: str, target_ref: str, progress: ProgressFn | None = None,
               run: torch.dtype | None = None) -> ModelPair:
    """The pair ``draft_ref`` -> ``target_ref`` (two offline packs) as transformers models made in memory from
    their GGUFs, both in ``run`` (None: :func:`run_dtype`).  :class:`.gguf_tokenizer.Unsupported` where a file is
    not one this module reads, and the loaders' ModelError where a pack is missing or damaged."""
    t0 = time.perf_counter()
    run = run or run_dtype()
    packs = {"draft": offline_pack(draft_ref), "target": offline_pack(target_ref)}
    # Both models' memory at once (reserved at the server's start, else now), faulted in by its own thread while
    # the rest goes on (.arena: on the EPYC VM the faults cost more than the dequantization).
    arena = _claim(draft_ref, target_ref, run)
    from transformers import TokenizersBackend  # noqa: F401  (here: transformers' lazy imports are not thread-safe)

    made: dict[str, tuple[Any, str]] = {}
    files: dict[str, Any] = {}
    try:
        # The files are read and checked (hashlib: mostly without the interpreter lock) and the tokenizer built
        # (in Rust: likewise) while this thread imports the model's code and the draft is dequantized.
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="specviz-ready") as pool:
            files = {role: pool.submit(_read, pack) for role, pack in packs.items()}
            getattr(__import__("transformers"), gguf_convert.ARCHITECTURES["qwen2"])  # its modelling code (lock-bound)
            vocabulary = files["draft"].result().metadata["tokenizer.ggml.tokens"]
            tokenizer_built = pool.submit(_tokenizer, files["draft"].result().metadata, packs["draft"].display)
            for role, (lo, hi) in (("draft", (0.0, 0.3)), ("target", (0.3, 0.95))):
                pack = packs[role]
                step = span(progress, lo, hi)
                report(step, 0.0, f"Reading {pack.display} from its GGUF…")
                gguf = files[role].result()
                if gguf.metadata["tokenizer.ggml.tokens"] != vocabulary:
                    raise gguf_tokenizer.Unsupported("the two packs' vocabularies differ")
                made[role] = (_model(gguf, pack.display, pack.extra_eos, run, span(step, 0.1, 1.0), arena,
                                     target=role == "target"), pack.display)
            tokenizer = tokenizer_built.result()
    finally:
        if arena is not None:
            arena.close()
        for future in files.values():  # (the files read, whatever happened)
            if future.done() and future.exception() is None:
                future.result().close()
    (draft, draft_name), (target, target_name) = made["draft"], made["target"]
    for model in (draft, target):
        canonical_head_input(model)  # (as every loaded pair's: loading._load_once)
    widths = {int(m.get_output_embeddings().weight.shape[0]) for m in (draft, target)}
    if len(widths) != 1:
        raise gguf_tokenizer.Unsupported("the two models' heads differ in width")
    eos = eos_ids(tokenizer, target.generation_config)
    ctx = min(int(m.config.max_position_embeddings) for m in (draft, target))
    pair = ModelPair(preset=label, draft_name=draft_name, target_name=target_name, draft=draft, target=target,
                     tokenizer=tokenizer, device=torch.device("cpu"), dtype=run, draft_quant=None,
                     eos_token_ids=eos, context_length=ctx, vocab_size=widths.pop(),
                     load_seconds=time.perf_counter() - t0, target_exec=executions.dtype_name(run))
    report(progress, 1.0, f"Ready: {draft_name} → {target_name} read from their GGUFs in {pair.load_seconds:.1f} s "
           f"({pair.target_exec}; the prepared pair follows)")
    return pair
