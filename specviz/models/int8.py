"""The int8 draft: dynamic int8 quantisation and the "is it faster" decision.

On CPU (``draft_quant="auto"``) every nn.Linear of the draft becomes a dynamic int8 linear (int8
weights, activations quantized on the fly, float32 in and out -- so an int8 draft's logits are
float32 while ``ModelPair.dtype`` is the target's dtype).  On the 2-core Xeon this was written on, a
decode step of the 0.5B draft takes ~56 ms in int8 against ~133 ms in bf16, but the draft gets less
faithful: on a code snippet the mean TV(p, q) to the 1.5B target rose from 0.10 (bf16 draft) to
0.16 (int8), i.e. acceptance drops by ~6 points.  Pass ``draft_quant=None`` to study the
unquantized draft.

Decision: whether int8 is faster is measured once per machine/torch/draft and remembered in
``<cache>/quant.json``.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import platform
import time
import warnings
from pathlib import Path
from typing import Callable

import torch

from .cache_paths import cache_dir
from .int8_target import (FUSED_GROUPS, WORKERS, FusedPart, TokenInt8Linear, int8_channel_weight,  # noqa: F401
                          fuse_by_name, fuse_token_linears, in_threads, pack_all, plain_all, unpacked)
from .pair import short_error

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------------
# Quantizing linears
# --------------------------------------------------------------------------------------------------


def _int8_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` as a per-tensor symmetric qint8 tensor, scale = max|w| / 127.5 (quantize_dynamic's
    default observer).  Every tensor here has an explicit dtype: see :func:`int8_linear`."""
    weight = weight.detach().to(torch.float32)
    lo, hi = torch.aminmax(weight)
    scale = float(torch.clamp(torch.maximum(-lo, hi) / 127.5, min=torch.finfo(torch.float32).eps))
    return torch.quantize_per_tensor(weight, scale, 0, torch.qint8)


def _int8_module(qweight: torch.Tensor, bias: torch.Tensor | None) -> torch.nn.Module:
    """A dynamic int8 linear holding ``qweight`` [out, in] and a float32 ``bias`` (packs the weight)."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

    # A 1x1 placeholder, then the real sizes: avoids packing a full-size empty weight.
    module = DynamicQuantizedLinear(1, 1, bias_=bias is not None, dtype=torch.qint8)
    module.out_features, module.in_features = qweight.shape
    module.set_weight_bias(qweight, bias)
    return module


def _float_bias(linear: torch.nn.Linear) -> torch.Tensor | None:
    return None if linear.bias is None else linear.bias.detach().to(torch.float32)


def int8_linear(linear: torch.nn.Linear) -> torch.nn.Module:
    """``linear`` as a dynamically quantized int8 linear (weights int8, activations quantized per call).

    Bit-for-bit what ``torch.ao.quantization.quantize_dynamic`` produces with its default qconfig
    (per-tensor symmetric qint8 weights, scale = max|w| / 127.5), built by hand because:
    * quantize_dynamic packs every weight twice (its constructor packs an empty full-size
      placeholder first), which doubles the ~3 s it takes for the 0.5B draft;
    * its observers create tensors in torch's *default* dtype, which transformers changes globally
      while loading a model -- and we quantize the draft in a thread while the target loads.
    Every tensor here has an explicit dtype.  The kernels are fbgemm/onednn's, CPU only.
    """
    return _int8_module(_int8_weight(linear.weight), _float_bias(linear))


_INT8_OK: bool | None = None


def int8_available() -> bool:
    """Whether this torch build has the dynamic int8 kernels (deprecated in favour of torchao)."""
    global _INT8_OK
    if _INT8_OK is None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # deprecation notices are not actionable for users
                probe = int8_linear(torch.nn.Linear(4, 4))
                probe(torch.ones(1, 4))
            _INT8_OK = True
        except Exception as exc:
            log.warning("int8 dynamic quantization is unavailable in this torch (%s); the draft stays unquantized",
                        short_error(exc, 200))
            _INT8_OK = False
    return _INT8_OK


def _linears(model: torch.nn.Module) -> list[tuple[str, torch.nn.Linear]]:
    """The model's plain nn.Linear modules, biggest first (that order balances the worker threads)."""
    found = [(name, m) for name, m in model.named_modules() if type(m) is torch.nn.Linear]
    return sorted(found, key=lambda item: -item[1].weight.numel())


KINDS = ("dynamic", "token")  # per-tensor dynamic / batch-invariant per-token (targets and drafts)
# The draft's kind: per-token like the target's -- faster than "dynamic" (fbgemm's static-input linear
# skips the min/max pass; q/k/v and gate/up fused) and closer to the draft's bf16 self -- and it
# lets the lean decode path (:mod:`.lean`) run the draft's steps.
DRAFT_KIND = "token"


def _quantizer(kind: str) -> tuple[Callable[[torch.Tensor], torch.Tensor], Callable]:
    """(weight -> qint8 tensor, (qweight, bias) -> module) for an int8 kind."""
    if kind == "token":  # unpacked: fuse_token_linears may merge them first; pack_all packs
        return int8_channel_weight, lambda q, b: TokenInt8Linear(q, b, pack=False)
    if kind == "dynamic":
        return _int8_weight, _int8_module
    raise ValueError(f"unknown int8 kind {kind!r}")


def quantize_int8(model: torch.nn.Module, kind: str = "dynamic", *, defer_packing: bool = False,
                  pack: bool = True) -> torch.nn.Module:
    """Replace every nn.Linear of ``model`` (in place) by an int8 one; the rest becomes float32,
    since the quantized kernels take and return float32 activations.

    ``kind``: "dynamic" (fbgemm's dynamic linear: per-tensor weight and activation scales, fastest
    to build; fine for a draft, whose rule only needs the q it sampled from) or "token"
    (:class:`TokenInt8Linear`: per-channel weights, per-token activations, batch-invariant: what a
    target needs).  The weights are quantized in threads (0.5B draft: 3.7 s -> 2.1 s on 2 cores).
    ``defer_packing`` ("token" only): leave fbgemm's packing to :mod:`.warm` (the
    linears run on onednn's bit-identical product meanwhile).  ``pack=False``: not packed at all here, for a
    caller that first swaps most of them for GGUF products (:func:`.int8_target.pack_all` then packs what is left: on
    an AVX-512 CPU, whose int8 rows are fbgemm's, packing the 1.5B target's rows only to drop them took 5.3 s).
    """
    to_weight, to_module = _quantizer(kind)
    linears = _linears(model)
    modules = in_threads(lambda linear: to_module(to_weight(linear.weight), _float_bias(linear)),
                         [linear for _, linear in linears])
    for (name, _), module in zip(linears, modules):
        model.set_submodule(name, module)
    if kind == "token":
        fuse_token_linears(model)
        if pack:
            pack_all(model, defer=defer_packing)
    halves = {name: m.weight.detach() for name, m in model.named_modules()
              if type(m) is torch.nn.Embedding and m.weight.dtype in (torch.bfloat16, torch.float16)}
    # The rest in float32, but not the half-precision embeddings (a 151,936-row table: ~0.9 GB and ~1.5 s
    # to widen, only to be dropped): they become CompactEmbeddings over their own values.
    kept = {id(model.get_submodule(name)) for name in halves}
    for module in model.modules():
        if id(module) not in kept:
            module._apply(lambda t: t.float() if t.is_floating_point() else t, recurse=False)
    model.eval()
    for name, weight in halves.items():
        compact_embedding(model.get_submodule(name), weight)
    return model


class CompactEmbedding(torch.nn.Embedding):
    """An input embedding kept in the half precision its values came in, read out as float32.

    The int8 models compute in float32 (the kernels take and return it), but the embedding is a
    lookup: widening the 151,936 rows ahead of time kept 0.93 GB (1.5B target) and 0.54 GB (0.5B
    draft) of float32 whose values are exactly the bf16 ones; widening only the rows a pass looks up
    gives bit-identical activations for half the memory."""

    out_dtype = torch.float32

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002  (nn.Embedding's name)
        return super().forward(input).to(self.out_dtype)


def compact_embedding(module: torch.nn.Embedding, half: torch.Tensor) -> None:
    """Turn ``module`` (float32 now) into a :class:`CompactEmbedding` over ``half`` (its values before
    widening), in place."""
    module.__class__ = CompactEmbedding
    module.weight = torch.nn.Parameter(half, requires_grad=False)


def int8_draft(model: torch.nn.Module, *, defer_packing: bool = False) -> torch.nn.Module:
    """The draft in int8 (:data:`DRAFT_KIND`, in place), with the lean decode path for its chain steps
    where the architecture allows it (:func:`.lean.attach`)."""
    from . import hugepages, lean, q4k_draft

    model = quantize_int8(model, kind=DRAFT_KIND, defer_packing=defer_packing, pack=False)
    swapped = q4k_draft.use(model)  # unless SPECVIZ_Q4K=0: its matrices as Q4_K, made here (0.6 bytes a weight)
    pack_all(model, defer=defer_packing)  # the int8 rows it left (none packed first only to be dropped)
    if swapped:
        log.info("%d of the draft's products run on Q4_K records made from its int8 rows", swapped)
        # streamed from memory each step, as the target's: in 2 MiB pages its products ran ~7 % faster (Zen 3);
        # a server's load leaves the move to models.warm, before the traces (which hold what they see)
        hugepages.place(model, later=defer_packing)
    # A trace holds fbgemm's packed weights: after packing.  A server (defer_packing) traces after it began
    # serving (models.warm.finish): ~1-2 s of Python less before its first run, which takes the eager lean
    # steps meanwhile (the same bits).
    lean.attach(model, trace=not defer_packing and not unpacked(model))
    return model


# --------------------------------------------------------------------------------------------------
# Deciding whether int8 is worth it on this machine
# --------------------------------------------------------------------------------------------------


def int8_plan(quant: str | None, name: str, dtype: torch.dtype) -> str | None:
    """What to do with the draft ``name``: None (keep it as loaded), "int8", or "measure" (time both,
    once).  ``quant``: None, "int8" or "auto" as given to load_pair."""
    if quant is None or not int8_available():
        return None
    if quant != "auto":
        return quant
    known = known_int8_decision(name, dtype)
    if known is None and machine_busy():
        # Timing on a busy machine means nothing (see measure_int8) and is slow: go with int8,
        # which is faster here whenever the machine is idle and never slower, and measure later.
        log.info("The machine is busy; using an int8 draft without measuring (will measure on a quiet start)")
        known = True
    return "measure" if known is None else ("int8" if known else None)


def decode_step_ms(lms: list[torch.nn.Module], vocab: int, context: int = 60, steps: int = 6) -> list[float]:
    """Median milliseconds per single-token decode step after a ``context``-token prefill (= drafting),
    for each model.  Steps alternate between the models so that load from other processes on a
    shared machine slows them alike and the comparison stays fair."""
    ids = torch.randint(0, vocab, (1, context), generator=torch.Generator().manual_seed(0))
    times: list[list[float]] = [[] for _ in lms]
    with torch.inference_mode():
        pasts = [m(ids, use_cache=True).past_key_values for m in lms]
        tok = ids[:, -1:]
        for i in range(steps + 2):  # two warm-up steps
            for k, m in enumerate(lms):
                t = time.perf_counter()
                pasts[k] = m(tok, past_key_values=pasts[k], use_cache=True).past_key_values
                if i >= 2:
                    times[k].append(time.perf_counter() - t)
    return [1000 * sorted(ts)[len(ts) // 2] for ts in times]


def _quant_key(name: str, dtype: torch.dtype) -> str:
    return "|".join([name, str(dtype).removeprefix("torch."), platform.machine(), cpu_model(),
                     str(torch.get_num_threads()), torch.__version__])


def cpu_model() -> str:
    """The CPU's model name (for timing caches, training cards and specviz.hardware.machine)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _read_quant_decisions() -> dict:
    try:
        return json.loads((cache_dir() / "quant.json").read_text())
    except (OSError, ValueError):
        return {}


def known_int8_decision(name: str, dtype: torch.dtype) -> bool | None:
    """The recorded "int8 is faster" answer for this draft, dtype, machine and torch (None: unknown)."""
    entry = _read_quant_decisions().get(_quant_key(name, dtype))
    return None if entry is None else bool(entry.get("int8"))


def machine_busy() -> bool:
    """Other processes keep the cores busy (their CPU over a short window above 3/4 of the cores); this process's
    own work -- a first start's conversion, its kernel's compiler -- is not counted (:mod:`.busy`)."""
    from .busy import machine_busy as other_work_busy

    return other_work_busy()


def starved(cpu_seconds: float, wall_seconds: float) -> bool:
    """Whether this process got much less CPU than its torch threads could use (a busy machine)."""
    threads = min(torch.get_num_threads(), os.cpu_count() or 1)
    return cpu_seconds < 0.6 * threads * wall_seconds


def measure_int8(name: str, draft: torch.nn.Module, dtype: torch.dtype, vocab: int) -> tuple[bool, torch.nn.Module]:
    """Decide "auto" the first time on this machine: time the draft as loaded against an int8 copy,
    keep the faster, and remember the answer in <cache>/quant.json.

    Returns (use int8, the draft to use).  Measured here (Xeon with AMX, 2 cores, idle): int8 56,
    bf16 133, fp32 154 ms/token -- but CPUs with better bf16 kernels may differ, hence measuring.

    A measurement on a busy machine says nothing: when other processes compete for the cores,
    PyTorch's worker threads wait on each other and both variants crawl at the same ~1.5 s/token.
    We detect that from the CPU time we actually got.  Then int8 is used (never slower, and
    faster whenever the machine is not starved) and nothing is recorded, so a quieter start
    measures again.
    """
    quantized = int8_draft(copy.deepcopy(draft))

    def timed(measure: Callable[[], list[float]]) -> tuple[list[float], bool]:
        wall, cpu = time.perf_counter(), time.process_time()
        result = measure()
        return result, starved(time.process_time() - cpu, time.perf_counter() - wall)

    # A short probe first: on a starved machine the full measurement would take tens of seconds.
    _, busy = timed(lambda: decode_step_ms([draft], vocab, context=16, steps=1))
    if not busy:
        (base_ms, int8_ms), busy = timed(lambda: decode_step_ms([draft, quantized], vocab))
    if busy:
        log.info("Draft %s: timing skewed by other processes competing for the CPU; using int8 for now, "
                 "measuring again next start", name)
        return True, quantized
    faster = int8_ms < 0.9 * base_ms  # a clear win only: int8 also makes the draft less faithful
    log.info("Draft %s: %.0f ms/token in %s, %.0f ms/token in int8 -> %s", name, base_ms,
             str(dtype).removeprefix("torch."), int8_ms, "int8" if faster else "no quantization")
    decisions = _read_quant_decisions()
    decisions[_quant_key(name, dtype)] = {"int8": faster, "base_ms": round(base_ms, 1), "int8_ms": round(int8_ms, 1)}
    try:
        path = cache_dir() / "quant.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"quant.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(decisions, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass  # only a cache: measuring again next time is fine
    return faster, quantized if faster else draft
