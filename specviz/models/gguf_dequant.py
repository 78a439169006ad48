"""GGUF blocks dequantized by torch, to the bit of gguf-py's ``dequantize``, in a fraction of its time.

gguf-py's ``dequantize`` (numpy, one thread, a float32 array per intermediate step) took 34 s for the 1.5B
target's Q4_K / Q6_K matrices and 17 s for the 0.5B draft's on the 2-core AMD EPYC (Zen 3): a third of the
first start.  Here the same arithmetic runs in torch, in the same order and in float32 (so every value is
gguf-py's value, bit for bit: tests/test_gguf_dequant.py compares them on random blocks and on the shipped
files), over row chunks that stay in the cache and on every intra-op thread, cast to the asked dtype as each
chunk is done.  Types this module does not know go to gguf-py as before (:func:`dequantize`).
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

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


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The tensor stored in ``raw`` (its bytes, as the GGUF holds them) as ``dtype``, of ``shape``: gguf-py's
    float32 values cast to ``dtype``.  Types not in :data:`LAYOUT` are dequantized by gguf-py."""
    if ggml_type not in _KERNELS:
        from gguf import GGMLQuantizationType
        from gguf import dequantize as gguf_dequantize

        values = torch.from_numpy(gguf_dequantize(raw, GGMLQuantizationType(ggml_type)))
        return values.reshape(shape).to(dtype)
    nbytes, per = LAYOUT[ggml_type]
    with warnings.catch_warnings():  # a read-only map of the file: only ever read here
        warnings.simplefilter("ignore", UserWarning)
        blocks = torch.from_numpy(np.ascontiguousarray(raw).view(np.uint8).reshape(-1, nbytes))
    out = torch.empty(blocks.shape[0] * per, dtype=dtype)
    step = max(1, CHUNK_VALUES // per)
    kernel = _KERNELS[ggml_type]
    for i in range(0, blocks.shape[0], step):
        values = kernel(blocks[i:i + step])
        out[i * per:(i + values.shape[0]) * per] = values.reshape(-1)  # the cast to dtype, as it is copied
    return out.reshape(shape)
