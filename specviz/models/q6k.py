"""The Q4_K_M target's Q6_K matrices as stored (``csrc/q6k.cpp``): v and down in half its layers, and its head.

With :mod:`.q4k` the target's Q4_K matrices already ran as stored; the Q6_K ones were dequantized and quantized
again to per-channel int8 (1.0 byte a weight, 0.43 GB a step, the head 0.23 GB of it).  Here they are multiplied
as GGUF stores them (0.83 bytes a weight: ~0.35 GB), so the target reads what llama.cpp reads for it.  Activations
are quantized per block of 256 as for Q4_K.  Batch-invariant: each output from its own row and token in a fixed
order (:func:`reference` is that order in torch, to the bit; tested).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

QK = 256
GGUF_BLOCK = 210  # ql[128], qh[64], scales[16] (int8), d (fp16)
REC = 212  # the kernel's record: the same with d as float32, its values in the kernel's order (STORED)


def kernel_order(sub: int) -> np.ndarray:
    """A block's 256 values in the kernel's order, for sub-blocks of ``sub`` values (32: Q4_K, 16: Q6_K): the
    value at each position, in weight order.  Group k (positions 32k .. 32k + 31) holds, side by side, the values
    ``sub / 8`` k .. of every sub-block, so one 32-byte product spans all of them (``csrc/q6k.cpp``'s
    ``quantize_blocks`` stores the activations the same way)."""
    side = sub // 8
    return np.array([sub * (p // side) + side * k + p % side for k in range(8) for p in range(32)])


# The record's values in the kernel's order: sub-blocks of 16 (one scale each), two values of each in a 32-byte
# group, packed into ql and qh as GGUF packs its own.  One product then takes the block's scales as they are, in one
# vpmaddwd.  STORED[i]: the value (in weight order) at position i.
STORED = kernel_order(16)
PLACE = np.argsort(STORED)  # PLACE[v]: where value v is stored


def _unpack(ql: np.ndarray, qh: np.ndarray) -> np.ndarray:
    """GGUF's ql [.., 128] and qh [.., 64] as 256 values (0..63) in their order (llama.cpp's dequantize_row_q6_K)."""
    ql, qh = ql.astype(np.uint8), qh.astype(np.uint8)
    out = np.empty((*ql.shape[:-1], QK), dtype=np.uint8)
    for h in range(2):
        a, b, hi = ql[..., 64 * h:64 * h + 32], ql[..., 64 * h + 32:64 * h + 64], qh[..., 32 * h:32 * h + 32]
        base = 128 * h
        out[..., base:base + 32] = (a & 15) | ((hi & 3) << 4)
        out[..., base + 32:base + 64] = (b & 15) | (((hi >> 2) & 3) << 4)
        out[..., base + 64:base + 96] = (a >> 4) | (((hi >> 4) & 3) << 4)
        out[..., base + 96:base + 128] = (b >> 4) | (((hi >> 6) & 3) << 4)
    return out


def _pack(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of :func:`_unpack`: 256 values a block as ql [.., 128] and qh [.., 64]."""
    ql = np.empty((*q.shape[:-1], 128), dtype=np.uint8)
    qh = np.empty((*q.shape[:-1], 64), dtype=np.uint8)
    for h in range(2):
        v = [q[..., 128 * h + 32 * i:128 * h + 32 * i + 32] for i in range(4)]
        ql[..., 64 * h:64 * h + 32] = (v[0] & 15) | ((v[2] & 15) << 4)
        ql[..., 64 * h + 32:64 * h + 64] = (v[1] & 15) | ((v[3] & 15) << 4)
        qh[..., 32 * h:32 * h + 32] = (v[0] >> 4) | ((v[1] >> 4) << 2) | ((v[2] >> 4) << 4) | ((v[3] >> 4) << 6)
    return ql, qh


def records(raw: np.ndarray) -> torch.Tensor:
    """GGUF Q6_K rows (uint8 [N, K/256 * 210]) in the kernel's form, uint8 [N, K/256, 212]: each block's values in
    the kernel's order (:data:`STORED`), packed as GGUF packs them, d widened to float32."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    n = raw.shape[0]
    blocks = raw.reshape(n, -1, GGUF_BLOCK)
    kb = blocks.shape[1]
    out = np.empty((n, kb, REC), dtype=np.uint8)
    out[..., :128], out[..., 128:192] = _pack(_unpack(blocks[..., :128], blocks[..., 128:192])[..., STORED])
    out[..., 192:208] = blocks[..., 192:208]
    d = blocks[..., 208:210].copy().view(np.float16).astype(np.float32)
    out[..., 208:212] = d.view(np.uint8).reshape(n, kb, 4)
    return torch.from_numpy(out)


def _fields(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q int64 [N, KB, 256] (0..63, in weight order), sc int64 [N, KB, 16], d float32 [N, KB]."""
    raw = w.numpy()
    q = torch.from_numpy(_unpack(raw[..., :128], raw[..., 128:192])[..., PLACE].astype(np.int64))  # weight order
    sc = w[..., 192:208].contiguous().view(torch.int8).to(torch.int64)
    d = w[..., 208:212].contiguous().view(torch.float32).squeeze(-1)
    return q, sc, d


def dequantize(w: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """The float32 weight [N, K] (or some rows) a record tensor stands for: llama.cpp's dequantization (the values
    of ``gguf.quants.dequantize``; tested)."""
    if rows is not None:
        w = w[rows]
    q, sc, d = _fields(w)
    n, kb = w.shape[:2]
    scale = (d[..., None] * sc.to(torch.float32)).repeat_interleave(16, dim=-1)
    return (scale * (q - 32).to(torch.float32)).reshape(n, kb * QK)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the kernel makes of float32 rows [M, K]: int8 values (as int64) [M, K], a float32 scale per block of
    256 [M, K/256] and the sums of each 16 values [M, K/16] (the Q4_K kernel's quantization, finer sums)."""
    m, k = x.shape
    blocks = x.reshape(m, k // QK, QK)
    amax = blocks.abs().amax(-1)
    inv = torch.where(amax > 0, torch.tensor(127.0) / amax, torch.zeros_like(amax))
    xq = torch.round(blocks * inv[..., None]).clamp_(-127, 127).to(torch.int64)
    return xq.reshape(m, k), amax / 127.0, xq.reshape(m, k // 16, 16).sum(-1)


def reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`linear` in torch in the kernel's order and lanes (``csrc/q6k.cpp``): its bits (the tests' oracle)."""
    q, sc, d = _fields(w)
    xq, dx, bs = quantize_activations(x)
    m, n, kb = x.shape[0], w.shape[0], w.shape[1]
    xq = xq.reshape(m, kb, 8, 2, 16)  # block, lane l, its two sub-blocks 2l and 2l + 1 (a scale each), 16 values
    qq = q.reshape(n, kb, 8, 2, 16)
    sc2 = sc.reshape(n, kb, 8, 2)
    bs = bs.reshape(m, kb, 8, 2)  # lane l: sums 2l, 2l + 1
    a = torch.zeros(m, n, 8, dtype=torch.float32)
    for b in range(kb):
        per = torch.einsum("mlsk,nlsk->mnls", xq[:, b], qq[:, b])  # [m, n, lane, sub-block]: exact
        lanes = (per * sc2[None, :, b]).sum(-1)  # lane l: sc[2l] . (its q . xq) + sc[2l + 1] . (...)
        j = (sc2[None, :, b] * bs[:, None, b]).sum(-1)  # [m, n, 8]
        total = (lanes - 32 * j).to(torch.float32)
        a = a + (dx[:, None, b] * d[None, :, b])[..., None] * total
    out = a[..., 0]
    for lane in range(1, 8):
        out = out + a[..., lane]
    return out + bias if bias is not None else out


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return torch.ops.specviz.q6k_linear(x, w, bias)


def rows_product(x: torch.Tensor, in_features: int, out_features: int,
                 product: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``product`` (float32 rows [M, in_features] -> [M, out_features]) over ``x``'s last dimension, for the Q4_K and
    Q6_K modules.  The lean steps' 2-D float32 rows go in as they are: a traced step then records the kernel alone,
    with no reshape or cast around it (~3 % of the draft's step)."""
    if x.dim() == 2 and x.dtype == torch.float32 and x.shape[1] == in_features:
        return product(x)
    shape = x.shape
    return product(x.reshape(-1, in_features).to(torch.float32)).reshape(*shape[:-1], out_features)


class Q6KLinear(torch.nn.Module):
    """A linear (the head among them) on Q6_K records.  The records are ``records``, not ``weight``: readers of a
    head's ``weight`` (the learned draft head) take :meth:`dequantized` rows, as from an int8 head."""

    def __init__(self, records_: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        if records_.dtype != torch.uint8 or records_.dim() != 3 or records_.shape[2] != REC:
            raise ValueError("a Q6KLinear needs Q6_K records, uint8 [out, in/256, 212]")
        self.out_features, self.in_features = records_.shape[0], records_.shape[1] * QK
        self.records = records_
        self.bias = bias.to(torch.float32).contiguous() if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rows_product(x, self.in_features, self.out_features, lambda rows: linear(rows, self.records, self.bias))

    def dequantized(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        return dequantize(self.records, rows)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, Q6_K"
