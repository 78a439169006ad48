"""GGUF blocks dequantized to the bit of gguf-py's ``dequantize``, in a fraction of its time.

gguf-py's ``dequantize`` (numpy, one thread, a float32 array per intermediate step) took 34 s for the 1.5B
target's Q4_K / Q6_K matrices and 17 s for the 0.5B draft's on the 2-core AMD EPYC (Zen 3): a third of the
first start.  Here the same arithmetic runs in gguf-py's order and in float32, so every value is gguf-py's
value, bit for bit (tests/test_gguf_dequant.py compares them on random blocks, the shipped files through
their caches in tests/test_gguf_convert.py), two ways:

* in C (``csrc/gguf_dequant.c``, compiled once by the machine's C compiler in ~0.3 s into the specviz cache
  and called through ctypes, which lets go of the interpreter lock), writing float32, bfloat16 or float32
  holding bfloat16 values straight into the tensor: no intermediate array.  gguf-py has no compiled path and
  ggml's (llama.cpp's) is not a requirement;
* in torch where there is no compiler (or ``SPECVIZ_KERNEL=0``): over row chunks that stay in the cache, cast
  to the asked dtype as each chunk is done.

Measured on that EPYC, the target's 339 tensors on one thread, into memory already touched: torch 92 M
values/s (Q4_K) and 62 (Q6_K); C ~2,500 (float32) and ~2,900 (bfloat16).  Into fresh memory both pay the
page faults, which on that VM cost more than the arithmetic (6 GB of float32: ~9 s; 3 GB of bfloat16: ~1.3 s).
Types this module does not know go to gguf-py as before (:func:`dequantize`).
"""

from __future__ import annotations

import ctypes
import logging
import threading
import warnings
from pathlib import Path

import numpy as np
import torch

from . import cbuild

log = logging.getLogger("specviz.models")

QK_K = 256
Q4_K, Q5_0, Q6_K, Q8_0 = 12, 6, 14, 8
# bytes per block and values per block
LAYOUT = {Q4_K: (144, QK_K), Q6_K: (210, QK_K), Q5_0: (22, 32), Q8_0: (34, 32)}
CHUNK_VALUES = 1 << 20  # ~4 MB of float32 intermediates per chunk: cache-sized, and enough work per op


def _f16(b: torch.Tensor) -> torch.Tensor:
    """Two uint8 columns (little-endian) read as float16, widened to float32: (n, 2) -> (n, 1)."""
    return b.contiguous().view(torch.float16).to(torch.float32)


# torch's bitwise ops on uint8 are ~30x slower than on int32 (not vectorised): the wide parts of a block are
# read through tables (a byte -> its values as float32, exact small integers), the narrow ones widened first.
_BYTE = torch.arange(256, dtype=torch.int32)
_NIBBLES = torch.stack((_BYTE & 0x0F, _BYTE >> 4), dim=1).to(torch.float32)  # byte -> (low, high)
_CRUMBS = torch.stack([(_BYTE >> s) & 3 for s in (0, 2, 4, 6)], dim=1).to(torch.float32) * 16  # byte -> 4 x (2 bits)<<4


def _table(table: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(n, k) bytes -> (n, k, table width) float32 values."""
    n, k = b.shape
    return table.index_select(0, b.reshape(-1).to(torch.int32)).reshape(n, k, table.shape[1])


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    d = _f16(blocks[:, :2])
    x = blocks[:, 2:].contiguous().view(torch.int8).to(torch.float32)
    return x * d


def _q5_0(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    d = _f16(blocks[:, :2])
    qh = blocks[:, 2:6].contiguous().view(torch.int32).view(n, 1)  # the 32 high bits (the sign bit is bit 31: masked)
    qh = ((qh >> torch.arange(32, dtype=torch.int32)) & 1).to(torch.float32) * 16
    ql = _table(_NIBBLES, blocks[:, 6:]).transpose(1, 2).reshape(n, 32)  # 16 low nibbles, then 16 high
    return d * (ql + qh - 16)  # (q | h << 4) - 16, an exact integer either way


def _scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = scales.shape[0]
    s = scales.to(torch.int32).reshape(n, 3, 4)
    d, m, m_d = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat((d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)), dim=-1)
    mn = torch.cat((m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)), dim=-1)
    return sc, mn


def _q4_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    sc, m = _scale_min(blocks[:, 4:16])
    d = (d * sc.to(torch.float32)).reshape(n, 8, 1)
    dm = (dmin * m.to(torch.float32)).reshape(n, 8, 1)
    # 4 runs of 32 bytes: a run's 32 low nibbles, then its 32 high ones
    qs = _table(_NIBBLES, blocks[:, 16:]).reshape(n, 4, 32, 2).transpose(2, 3).reshape(n, 8, 32)
    return (d * qs - dm).reshape(n, QK_K)


def _q6_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    scales = blocks[:, 192:208].contiguous().view(torch.int8).to(torch.float32)
    d = (_f16(blocks[:, 208:210]) * scales).reshape(n, 16, 1)
    # 2 halves of 64 low-bit bytes: a half's 64 low nibbles, then its 64 high ones -> 8 runs of 32
    ql = _table(_NIBBLES, blocks[:, :128]).reshape(n, 2, 64, 2).transpose(2, 3).reshape(n, 8, 32)
    # 2 halves of 32 high-bit bytes: bits 0-1 of the 32, then 2-3, 4-5, 6-7 -> 8 runs of 32
    qh = _table(_CRUMBS, blocks[:, 128:192]).reshape(n, 2, 32, 4).transpose(2, 3).reshape(n, 8, 32)
    q = ql + qh - 32  # (ql | qh << 4) - 32, an exact integer either way
    return (d * q.reshape(n, 16, 16)).reshape(n, QK_K)


_KERNELS = {Q4_K: _q4_k, Q6_K: _q6_k, Q5_0: _q5_0, Q8_0: _q8_0}


def known(ggml_type: int) -> bool:
    return ggml_type in _KERNELS


SOURCE = Path(__file__).with_name("csrc") / "gguf_dequant.c"
CFLAGS = ("-O3", "-shared", "-fPIC", "-ffp-contract=off")  # no fused multiply-add: numpy rounds each product
_OUT = {torch.float32: 0, torch.bfloat16: 1}  # the C function's kinds; 2: float32 holding bfloat16 values
_LIB: dict[str, ctypes.CDLL | None] = {}
_LIB_LOCK = threading.Lock()


def _compiler() -> str | None:
    return cbuild.compiler()


def _build() -> ctypes.CDLL | None:
    from .kernels import switched_off

    if switched_off():
        return None
    loaded, why = cbuild.shared_library(SOURCE, CFLAGS, "gguf-dequant", _compiler)  # _compiler: a test replaces it
    if loaded is None:
        if why == cbuild.NO_COMPILER:
            log.info("No C compiler here: GGUF blocks are dequantized by torch (slower)")
        else:
            log.info("The C dequantizer could not be built (%s): GGUF blocks are dequantized by torch (slower)", why)
        return None
    fn = loaded.specviz_dequantize
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
    fn.restype = ctypes.c_int
    return loaded


def library() -> ctypes.CDLL | None:
    """The compiled dequantizer (built on first use, once per cache), or None where it cannot be built."""
    with _LIB_LOCK:
        if "lib" not in _LIB:
            _LIB["lib"] = _build()
        return _LIB["lib"]


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...], dtype: torch.dtype,
               widen: torch.dtype | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """The tensor stored in ``raw`` (its bytes, as the GGUF holds them) as ``dtype``, of ``shape``: gguf-py's
    float32 values cast to ``dtype`` (``widen``: then held as that wider dtype, the same values), written into
    ``out`` where given (contiguous, of that shape and dtype).  Types not in :data:`LAYOUT` are dequantized by
    gguf-py."""
    if ggml_type not in _KERNELS:
        from gguf import GGMLQuantizationType
        from gguf import dequantize as gguf_dequantize

        values = torch.from_numpy(gguf_dequantize(raw, GGMLQuantizationType(ggml_type)))
        return cast(values.reshape(shape), dtype, widen, out)
    nbytes, per = LAYOUT[ggml_type]
    raw = np.ascontiguousarray(raw).view(np.uint8)
    n_blocks = raw.size // nbytes
    if widen in (None, dtype):
        kind = _OUT.get(dtype)
    else:
        kind = 2 if (dtype, widen) == (torch.bfloat16, torch.float32) else None
    if kind is not None and (lib := library()) is not None:
        made = torch.empty(shape, dtype=widen or dtype) if out is None else out
        if made.dtype != (widen or dtype) or made.numel() != n_blocks * per or not made.is_contiguous():
            raise ValueError(f"out is {made.dtype} {tuple(made.shape)}, not {widen or dtype} {tuple(shape)} contiguous")
        if lib.specviz_dequantize(raw.ctypes.data, ggml_type, 0, n_blocks, made.data_ptr(), kind) != 0:
            raise ValueError(f"ggml type {ggml_type} is not one the C dequantizer knows")
        return made.reshape(shape)
    with warnings.catch_warnings():  # a read-only map of the file: only ever read here
        warnings.simplefilter("ignore", UserWarning)
        blocks = torch.from_numpy(raw.reshape(-1, nbytes))
    values_out = torch.empty(blocks.shape[0] * per, dtype=dtype)
    step = max(1, CHUNK_VALUES // per)
    kernel = _KERNELS[ggml_type]
    for i in range(0, blocks.shape[0], step):
        values = kernel(blocks[i:i + step])
        values_out[i * per:(i + values.shape[0]) * per] = values.reshape(-1)  # the cast to dtype, as it is copied
    return cast(values_out.reshape(shape), dtype, widen, out)


def cast(values: torch.Tensor, dtype: torch.dtype, widen: torch.dtype | None = None,
         out: torch.Tensor | None = None) -> torch.Tensor:
    """``values`` cast to ``dtype``, then held as ``widen`` where given (the same values), written into ``out``
    where given: what :func:`dequantize` returns, for a tensor dequantized otherwise (float32/float16 ones)."""
    values = values.to(dtype)
    if widen is not None:
        values = values.to(widen)
    return values if out is None else out.copy_(values.reshape(out.shape))
