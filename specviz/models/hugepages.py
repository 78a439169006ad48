"""The models' Q4_K / Q6_K records in transparent huge pages (Linux), where each step streams them from memory.

A one-token step of the Q4_K_M target reads ~1 GB of records, product after product, and the draft's ~330 MB.
In 4 KiB pages the CPU's stream prefetchers stop at every page boundary (and each page costs a TLB walk), so a
core's stream restarts 250,000 times a target step; in 2 MiB pages it runs on.  :func:`rehome` copies a model's
Q4_K / Q6_K records, once at load, into one anonymous region advised ``MADV_HUGEPAGE`` (the same bits, so every
output is the same), and :func:`empty` gives the roofline's copy benchmark the same kind of memory, so the bound
a step is held to is measured on it too.

Measured on the 2-core AMD EPYC (Zen 3, AVX2, a KVM guest; THP mode ``madvise``), eager steps, the two
placements interleaved in one process, medians, ms:

    ==========================================  ==========  ==========
                                                4 KiB       huge pages
    ==========================================  ==========  ==========
    target step, 1 token (8 reps)               93.2, 91.8  85.6, 78.8
    target pass, 4 tokens (8 reps)              170, 136    162, 129
    draft step, reduced head (16 reps; stop 51)  29.7, 25.7  27.9, 23.7
    the draft's 97 products alone (16 reps)     21.4        20.0
    ==========================================  ==========  ==========

Small products gain the most: one 2.2 MB Q4_K product streamed alone ran 183 -> 130 us on two threads, a 0.54 MB
one 60 -> 48 (stop 50 had timed the draft's step at 32.0 / 31.8 ms, within that hour's noise, and left it).
Hand-written, not torch's ``THP_MEM_ALLOC_ENABLE``: that is read once, at torch's first allocation (before
specviz is imported, in any process that imported torch first), and it covers only memory torch allocates,
where the head's records are mapped from their safetensors file.  ``SPECVIZ_HUGEPAGES=0`` leaves the records
where they were loaded.
"""

from __future__ import annotations

import logging
import mmap
import os
from pathlib import Path

import torch

log = logging.getLogger(__name__)

HUGE = 2 << 20  # bytes of one huge page (x86-64's)
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def enabled() -> bool:
    """Whether records are moved to huge pages: on Linux with transparent huge pages not ``never``, unless
    ``SPECVIZ_HUGEPAGES=0``."""
    if os.environ.get("SPECVIZ_HUGEPAGES", "1").strip() == "0" or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        mode = THP_MODE.read_text()
    except OSError:
        return False
    return "[never]" not in mode


def empty(nbytes: int) -> torch.Tensor:
    """uint8 [nbytes], uninitialised, in anonymous memory advised as huge pages and starting on a 2 MiB
    boundary (the pages the kernel can back with one huge page each); the tensor keeps the mapping alive."""
    region = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # a kernel built without THP: plain pages, still correct
        pass
    whole = torch.frombuffer(region, dtype=torch.uint8)  # holds a reference to the mapping
    start = (-whole.data_ptr()) % HUGE
    return whole[start:start + nbytes]


def _owners(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
    from .q4k import Q4KLinear
    from .q6k import Q6KLinear

    return [(m, "weight" if isinstance(m, Q4KLinear) else "records")
            for m in model.modules() if isinstance(m, (Q4KLinear, Q6KLinear))]


def defer(model: torch.nn.Module) -> None:
    """Leave ``model``'s move for later (a server's load: ~1.5 s of huge page faults and copying on two cores,
    off its start's path): :func:`pending` says so until :func:`rehome` runs (:func:`.warm.finish` calls it)."""
    if enabled() and _owners(model):
        model._specviz_hugepages = False


def place(model: torch.nn.Module, *, later: bool) -> None:
    """At load: move ``model``'s records now (:func:`rehome`), or, ``later`` (a server's load), mark them for
    :func:`.warm.finish` (:func:`defer`)."""
    if later:
        defer(model)
    else:
        rehome(model)


def pending(model: torch.nn.Module) -> bool:
    """Whether ``model``'s records were left to move (:func:`defer`) and have not moved yet."""
    return getattr(model, "_specviz_hugepages", None) is False and enabled()


def rehome(model: torch.nn.Module) -> int:
    """Copy ``model``'s Q4_K and Q6_K records into one huge-page region, in place (each product then reads the
    copy: the same values, so a run in progress may read either); returns the bytes moved (0 where
    :func:`enabled` says no, there are none, or they were moved already).  Before any trace of the model: a
    traced graph holds the tensors it was traced with."""
    if not enabled() or getattr(model, "_specviz_hugepages", None) is True:
        return 0
    owners = _owners(model)
    distinct: dict[tuple[int, tuple[int, ...]], torch.Tensor] = {}
    for module, name in owners:
        t = getattr(module, name)
        distinct.setdefault((t.data_ptr(), tuple(t.shape)), t)
    if not distinct:
        return 0
    sizes = {key: -(-t.nbytes // 64) * 64 for key, t in distinct.items()}  # each copy on a cache line
    region = empty(sum(sizes.values()))
    moved, offset = {}, 0
    for key, t in distinct.items():
        copy = region[offset:offset + t.nbytes].view(t.dtype).view(t.shape)
        copy.copy_(t)
        moved[key] = copy
        offset += sizes[key]
    for module, name in owners:  # the loaded tensors are freed as the last module lets go of them
        t = getattr(module, name)
        setattr(module, name, moved[(t.data_ptr(), tuple(t.shape))])
    model._specviz_hugepages = True
    log.info("%d record tensors (%.0f MB) moved to huge pages", len(distinct), offset / 2**20)
    return sum(t.nbytes for t in distinct.values())


__all__ = ["defer", "empty", "enabled", "pending", "place", "rehome"]
