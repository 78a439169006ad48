"""A GGUF's Q4_K and Q6_K matrices as the kernels' records, made at load from the mapped file; float rows as Q4_K.

The kernels (``csrc/q4k.cpp``, ``csrc/q6k.cpp``) read a block's 256 values in their own order with the scales
unpacked (:func:`.q4k.records`, :func:`.q6k.records`: numpy, the reference).  Here the same bytes come from C
(``csrc/gguf_dequant.c``'s second half, the library :mod:`.gguf_dequant` builds with the machine's C compiler in
well under a second, called through ctypes, which lets go of the interpreter lock), a share of the rows in each of :data:`WORKERS` threads, straight from
the mapped GGUF into the tensor the kernel reads: no copy of the file, no cache on disk.  Where there is no
compiler (or ``SPECVIZ_KERNEL=0``, where no kernel would read them anyway) numpy makes them.

:func:`quantize_q4k` makes Q4_K records of float32 rows (a draft's Q5_0 / Q8_0 matrices): :func:`.q4k.quantize`'s
values, from C where it builds.
"""

from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from . import gguf_dequant, q4k, q6k

WORKERS = max(1, min(4, os.cpu_count() or 1))
Q4_K, Q6_K = 12, 14
# ggml type -> (bytes of a GGUF block, bytes of a record, the numpy reference)
FORMS = {Q4_K: (q4k.GGUF_BLOCK, q4k.REC, q4k.records), Q6_K: (q6k.GGUF_BLOCK, q6k.REC, q6k.records)}
_TYPED: set[int] = set()  # the libraries whose functions here were given their argument types
_LOCK = threading.Lock()


def library() -> ctypes.CDLL | None:
    """The compiled functions (:func:`.gguf_dequant.library`: built on first use, once per cache), or None where they
    cannot be built."""
    lib = gguf_dequant.library()
    if lib is None:
        return None
    with _LOCK:
        if id(lib) not in _TYPED:
            lib.specviz_records.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                                            ctypes.c_void_p]
            lib.specviz_records.restype = ctypes.c_int
            lib.specviz_quantize_q4k.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                                 ctypes.c_void_p]
            lib.specviz_quantize_q4k.restype = None
            _TYPED.add(id(lib))
    return lib


def _shares(n: int, workers: int) -> list[tuple[int, int]]:
    step = -(-n // max(1, workers))
    return [(i, min(step, n - i)) for i in range(0, n, step)] if n else []


def _in_threads(fn, shares: list[tuple[int, int]]) -> None:
    if len(shares) <= 1:
        for first, count in shares:
            fn(first, count)
        return
    with ThreadPoolExecutor(max_workers=len(shares), thread_name_prefix="specviz-records") as pool:
        list(pool.map(lambda s: fn(*s), shares))


def _into(made: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    return made if out is None else out.copy_(made)


def _out(shape: tuple[int, ...], out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return torch.empty(shape, dtype=torch.uint8)
    if tuple(out.shape) != shape or out.dtype != torch.uint8 or not out.is_contiguous():
        raise ValueError(f"out is {out.dtype} {tuple(out.shape)}, not uint8 {shape} contiguous")
    return out


def records(raw: np.ndarray, ggml_type: int, workers: int = WORKERS, out: torch.Tensor | None = None) -> torch.Tensor:
    """GGUF Q4_K or Q6_K rows (uint8 [N, K/256 * block bytes], e.g. a mapped tensor's bytes) as the kernel's
    records, uint8 [N, K/256, record bytes] (written into ``out`` where given): :func:`.q4k.records` /
    :func:`.q6k.records`, byte for byte."""
    block, rec, reference = FORMS[ggml_type]
    lib = library()
    if lib is None:
        return _into(reference(raw), out)
    raw = np.ascontiguousarray(raw).view(np.uint8)
    n = raw.shape[0]
    kb = raw.shape[1] // block
    out = _out((n, kb, rec), out)
    src, dst = raw.ctypes.data, out.data_ptr()

    def part(first: int, count: int) -> None:
        lib.specviz_records(src, ggml_type, first * kb, count * kb, dst)

    _in_threads(part, _shares(n, workers))
    return out


def quantize_q4k(weight: torch.Tensor, workers: int = WORKERS, out: torch.Tensor | None = None) -> torch.Tensor:
    """float rows [N, K] as Q4_K records [N, ceil(K/256), 152] (written into ``out`` where given):
    :func:`.q4k.quantize`'s, bit for bit."""
    lib = library()
    if lib is None:
        return _into(q4k.quantize(weight), out)
    w = weight.detach().to(torch.float32).contiguous()
    n, k = w.shape
    out = _out((n, -(-k // q4k.QK), q4k.REC), out)

    def part(first: int, count: int) -> None:
        lib.specviz_quantize_q4k(w.data_ptr(), k, first, count, out.data_ptr())

    _in_threads(part, _shares(n, workers))
    return out
