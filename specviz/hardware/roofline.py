"""The roofline of a verify pass: the bandwidth bound (the bytes of weights a step reads ÷ the copy bandwidth) and
the compute bound (k tokens' multiply-adds ÷ the CPU's int8 peak, :mod:`.peak`); T(k) is at least the larger.

A one-token step of a decoder reads every weight once and does two flops with each: on a CPU or a GPU
alike it is limited by memory, not arithmetic, which is the room speculative decoding uses (a pass over
several tokens reads the same weights).  How close an execution comes to that bound, and how small a
draft model can be next to its target (no draft step costs less than its share of the bytes, whatever
its kernels), are measured here: :func:`step_bytes` counts what a step reads in the form the model
executes (int8 values and scales, GGUF's Q4_K / Q6_K records as stored, float weights), and
:func:`copy_bandwidth` times a large copy on the device, counting bytes read and written (the figure a
stream of weights can reach at best; a pure read is somewhat faster on most machines).

A pass over k tokens reads the same bytes but does k times the arithmetic: each weight one multiply-add a token
(:func:`token_macs`, ≈ the parameter count).  At the CPU's measured int8 peak (:mod:`.peak`, for the instruction the
execution's products run) that is k × ``token_ms`` of compute, so
an int8 execution's roofline is max(bandwidth bound, k × token_ms) (:class:`Roofline`): flat up to its knee, then
climbing.  A float execution's products run other instructions, whose peak is not measured: its roofline is the
bandwidth bound alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from ..models import hugepages, kernels
from ..models.int8_target import FusedPart, TokenInt8Linear
from ..models.q4k import Q4KLinear
from ..models.q6k import Q6KLinear


def _product_bytes(module: torch.nn.Module) -> int | None:
    """Bytes a quantized product's kernel reads per step (its stored weights, scales and bias), or None
    for a module of another kind."""
    bias = getattr(module, "bias", None)
    extra = bias.nbytes if isinstance(bias, torch.Tensor) else 0
    if isinstance(module, Q4KLinear):
        return module.weight.nbytes + extra
    if isinstance(module, Q6KLinear):
        return module.records.nbytes + extra
    if isinstance(module, TokenInt8Linear):
        packed = module._packed
        if isinstance(packed, kernels.Weights):
            return packed.blocked.nbytes + packed.wsum.nbytes + packed.wscale.nbytes + extra
        return module.out_features * (module.in_features + 4) + extra  # int8 values, float32 scale a row
    return None


def step_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights one one-token step of ``model`` reads: every product in the form it executes
    (a shared product of fused linears once), the norms and biases, the output head; of the input
    embedding one row (a tied head reads the table as the head)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head_weight = getattr(head, "weight", None)
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        own = _product_bytes(module)
        if own is not None:
            total += own
            continue
        for p in module.parameters(recurse=False):
            if p.data_ptr() in seen:
                continue
            seen.add(p.data_ptr())
            if module is embed and not (isinstance(head_weight, torch.Tensor) and head_weight.data_ptr() == p.data_ptr()):
                total += p[0].nbytes if p.dim() == 2 else p.nbytes  # a token's row
            else:
                total += p.nbytes
    return total


def copy_bandwidth(device: torch.device | str = "cpu", nbytes: int = 256 * 2**20, reps: int = 5) -> float:
    """Copy bandwidth in bytes/s, counting bytes read and written (the best of ``reps`` copies of
    ``nbytes``, after a warm-up; on a GPU the copies are timed with CUDA events, on a CPU with the
    process's threads, as the kernels run, in huge pages where the models' records are put in them)."""
    device = torch.device(device)
    if device.type == "cpu" and hugepages.enabled():  # the memory a target's records stream from (models.hugepages)
        src, dst = hugepages.empty(nbytes).fill_(1), hugepages.empty(nbytes)
    else:
        src = torch.ones(nbytes, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
    dst.copy_(src)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        for _ in range(reps):
            dst.copy_(src)
        end.record()
        torch.cuda.synchronize(device)
        seconds = start.elapsed_time(end) / 1000 / reps
    else:
        seconds = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            dst.copy_(src)
            seconds = min(seconds, time.perf_counter() - t0)
    del src, dst
    return 2 * nbytes / seconds


def bound_ms(nbytes: int | float, bandwidth: float) -> float:
    """The time reading ``nbytes`` takes at ``bandwidth`` bytes/s, in ms."""
    return 1000 * nbytes / bandwidth


_PRODUCTS = (torch.nn.Linear, TokenInt8Linear, Q4KLinear, Q6KLinear)


def token_macs(model: torch.nn.Module) -> int:
    """Multiply-adds one token's products do: every linear's inputs × outputs (a fused product once, the output head
    included; the embedding is a lookup) -- about the parameter count, less an untied embedding table."""
    return sum(m.in_features * m.out_features for m in model.modules()
               if isinstance(m, _PRODUCTS) and not isinstance(m, FusedPart))


@dataclass(frozen=True)
class Roofline:
    """The least time a pass over k tokens can take: max(``bandwidth_ms``, k × ``token_ms``), either part None where
    unmeasured.  ``isa`` and ``gmacs``: the peak ``token_ms`` is taken at (GMAC/s), ``macs`` a token's multiply-adds."""

    bandwidth_ms: float | None
    token_ms: float | None = None
    isa: str = ""
    gmacs: float | None = None
    macs: int | None = None

    def at(self, k: float) -> float | None:
        parts = [x for x in (self.bandwidth_ms, None if self.token_ms is None else k * self.token_ms) if x]
        return max(parts) if parts else None

    def knee(self) -> float | None:
        """The k where arithmetic starts to cost more than reading the weights (None without both parts)."""
        return self.bandwidth_ms / self.token_ms if self.bandwidth_ms and self.token_ms else None

    def ratio(self, k: int, ms: float) -> float | None:
        """A measured T(k) = ``ms`` over the roofline at k: 1.0 would be the roofline itself."""
        floor = self.at(k)
        return ms / floor if floor and ms else None


def compute_ms(macs: float, gmacs: float) -> float:
    """The time ``macs`` multiply-adds take at ``gmacs`` billion a second, in ms."""
    return macs / gmacs / 1e6


def probe_roofline(probe: Any, execution: str | None = None) -> Roofline | None:
    """The roofline of ``execution`` (the probe's choice by default) from a probe's record (a :class:`Probe`): its
    bandwidth bound, and for an int8 execution the compute part at the peak of the instruction its products run here
    (:func:`.peak.kernel_peak`: the GGUF's kernels or int8 rows, at the probe's threads); None where neither was
    measured."""
    from .peak import kernel_peak

    e = execution or probe.choice
    mb, gbps = (probe.step_mb or {}).get(e), probe.copy_gbps
    bandwidth = mb / gbps if mb and gbps else None
    machine = probe.machine or {}
    gguf = (probe.weights or {}).get(e) == "gguf"
    best = kernel_peak(probe.peak, machine.get("threads"), machine.get("isa"), gguf) if e == "int8" else None
    if best is None or not probe.token_macs:
        return Roofline(bandwidth) if bandwidth else None
    isa, gmacs = best
    return Roofline(bandwidth, compute_ms(probe.token_macs, gmacs), isa, gmacs, int(probe.token_macs))


__all__ = ["Roofline", "bound_ms", "compute_ms", "copy_bandwidth", "probe_roofline", "step_bytes", "token_macs"]
