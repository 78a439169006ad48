"""How a model executes: its precision and kernels, named once for the log, the page and the trace.

Target executions (each batch-invariant, so a k-token verify pass scores every position as a
one-token step would -- the condition for speculative decoding to sample the target's own
distribution; tests/test_executions.py checks it for each):

* ``bf16``  -- as loaded; oneDNN's bf16 kernels (AMX or AVX512-BF16 where present).  A verify pass
  differs from steps only by float rounding (TV ~0.01).
* ``fp32``  -- float32 weights and activations: twice the bytes, but plain FMA kernels on CPUs
  without native bf16.
* ``int8``  -- per-channel int8 weights with per-token activation scales
  (:class:`specviz.models.int8.TokenInt8Linear`) and query-by-query attention
  (:mod:`specviz.models.invariant`): every position bit-identical whatever the pass, and a quarter
  of bf16's bytes per step.  A slightly different model than the bf16 target: the page reports
  by how much (:mod:`specviz.hardware.fidelity`).
* ``bf16+graphs`` (CUDA) -- bf16 with CUDA-graph steps over a static KV cache
  (:mod:`specviz.models.compiled`); ``bf16``/``fp16`` eager otherwise.

Not offered for the target: fbgemm's dynamic int8 as it stands (one activation scale per pass:
verify and steps differ by TV 0.16-0.20), torchao's int8 weight-only (5x slower on an AVX2 EPYC)
and its per-token dynamic int8 (594 ms a step there, TV 0.04-0.14 between verify and steps).
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import torch

from . import compiled, int8, invariant, lean, q4k
from .pair import ModelError

log = logging.getLogger("specviz.models")

CPU_TARGET = ("bf16", "fp32", "int8")
CUDA_TARGET = ("bf16", "bf16+graphs", "fp16", "fp16+graphs")
ALL_TARGET = tuple(dict.fromkeys(CPU_TARGET + CUDA_TARGET))
CHOICES = ("auto",) + ALL_TARGET

WORDS = {
    "bf16": "bf16",
    "fp32": "float32",
    "fp16": "fp16",
    "int8": "int8 (per-channel weights, per-token activations; batch-invariant)",
    "bf16+graphs": "bf16, CUDA graphs over a static KV cache",
    "fp16+graphs": "fp16, CUDA graphs over a static KV cache",
}
# an int8 target that took its GGUF's Q4_K matrices as stored (models.q4k: the default where its kernel runs; SPECVIZ_Q4K=0 turns it off)
Q4K_WORDS = ("int8 with the GGUF's Q4_K and Q6_K matrices as stored (per-block int8 activations; "
             "batch-invariant)")


def words(pair: Any) -> str:
    """A pair's target execution in words, for the page's pair line and the log."""
    name = getattr(pair, "target_exec", "")
    target = getattr(pair, "target", None)
    if name == "int8" and target is not None and q4k.in_use(target):
        return Q4K_WORDS
    return WORDS.get(name, name or str(getattr(pair, "dtype", "")).removeprefix("torch."))


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(dtype, str(dtype))


def candidates(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> tuple[str, ...]:
    """The executions the probe compares for a target loaded as ``dtype``, the loaded one first."""
    loaded = dtype_name(dtype)
    if device.type == "cuda":
        return (loaded, f"{loaded}+graphs")
    return tuple(dict.fromkeys((loaded, "fp32") + (("int8",) if int8.int8_available() else ())))


def offered(device: torch.device) -> tuple[str, ...]:
    return CUDA_TARGET if device.type == "cuda" else CPU_TARGET


def check(name: str | None, device: torch.device) -> str:
    """``name`` if it is a target execution this device offers ("auto" too); a clear error otherwise."""
    name = (name or "auto").strip().lower()
    if name == "auto" or name in offered(device):
        return name
    raise ModelError(f"Target execution {name!r} is not available on {device.type}: use auto or one of "
                     f"{', '.join(offered(device))}.")


def twin(model: torch.nn.Module, dtype: torch.dtype, *, keep_linears: bool = False) -> torch.nn.Module:
    """A copy of ``model`` whose parameters are new ``dtype`` tensors, the original untouched.

    ``copy.deepcopy`` would first copy every bf16 weight and ``.to(dtype)`` then allocate them again
    (17 s for the 1.5B target on the 2-core EPYC, whose fresh pages are slow to fault in); here the
    module tree is copied with every tensor shared, then each parameter is replaced by a converted
    one (tied weights stay tied).  ``keep_linears``: leave nn.Linear weights shared and unconverted
    (an int8 twin quantizes them straight from the original's)."""
    shared = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    out = copy.deepcopy(model, memo=shared)
    converted: dict[int, torch.nn.Parameter] = {}
    for module in out.modules():
        if keep_linears and type(module) is torch.nn.Linear:
            continue
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            if id(param) not in converted:
                # An int8 twin's embedding stays in its half precision (shared, not copied): quantize_int8
                # keeps it so (models.int8.CompactEmbedding), a new Parameter so the original is never touched.
                to = param.dtype if keep_linears and type(module) is torch.nn.Embedding else dtype
                converted[id(param)] = torch.nn.Parameter(param.detach().to(to), requires_grad=False)
            module._parameters[name] = converted[id(param)]
    return out


def apply(model: torch.nn.Module, name: str, *, max_len: int = 4096, copy_model: bool = False,
          defer_packing: bool = False) -> torch.nn.Module:
    """``model`` (loaded in bf16, or fp16 on GPUs without bf16) executing as ``name``.  In place unless
    ``copy_model``.  ``defer_packing``: an int8 target runs at once, its packing left to :mod:`.warm`."""
    loaded = dtype_name(next(model.parameters()).dtype)
    base, graphs = name.removesuffix("+graphs"), name.endswith("+graphs")
    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "int8": torch.float32}
    if base not in dtypes:
        raise ValueError(f"unknown target execution {name!r}")
    if copy_model and base != loaded:  # graphs attach to the model itself (no second copy of a 7B)
        model = twin(model, dtypes[base], keep_linears=base == "int8")
    elif base != "int8":
        model = model.to(dtypes[base])
    if name == "int8":
        from ..speculator.model import head_fingerprint

        fingerprint = head_fingerprint(model)  # a learned head trained on the loaded target still finds it
        model = int8.quantize_int8(model, kind="token", defer_packing=defer_packing)
        model._specviz_head_fingerprint = fingerprint
        model = invariant.make_invariant(model)
        # Runs (chains and trees) take the lean, traced forward with the same batch-invariant attention
        # (models.lean, models.lean_tree); whatever calls the model itself keeps transformers' forward. Its
        # graphs hold the packed weights: traced once packed, which a deferred load leaves to models.warm.
        lean.attach(model, trace=not defer_packing and not int8.unpacked(model), invariant=True)
        return model
    if graphs:
        compiled.attach(model, max_len, compile=True, mode="graph", warm=compiled.BUCKETS[:5])
    return model
