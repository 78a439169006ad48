"""GGUF Q4_K and Q6_K blocks made in numpy for the tests (gguf-py dequantizes them but does not make them)."""

from __future__ import annotations

import numpy as np


def q4k_encode(w: np.ndarray) -> np.ndarray:
    """A float matrix [N, K] (K a multiple of 256) as GGUF Q4_K rows, uint8 [N, K/256 * 144]: per 32 values a
    6-bit scale and min, per 256 an fp16 d and dmin, as llama.cpp lays them out (a plain encoder, not its
    search: the tests need valid blocks near w, not the best ones)."""
    n, k = w.shape
    sub = w.reshape(n, k // 256, 8, 32).astype(np.float32)
    lo, hi = sub.min(-1), sub.max(-1)
    mins = np.maximum(-lo, 0.0)
    scales = np.maximum(hi + mins, 1e-8) / 15
    d = (scales.max(-1) / 63).astype(np.float16)
    dmin = (np.maximum(mins.max(-1), 1e-8) / 63).astype(np.float16)
    sc = np.clip(np.round(scales / d[..., None].astype(np.float32)), 1, 63).astype(np.uint8)
    mn = np.clip(np.round(mins / dmin[..., None].astype(np.float32)), 0, 63).astype(np.uint8)
    step = d[..., None].astype(np.float32) * sc
    off = dmin[..., None].astype(np.float32) * mn
    q = np.clip(np.round((sub + off[..., None]) / step[..., None]), 0, 15).astype(np.uint8).reshape(n, k // 256, 4, 64)
    nibbles = q[..., :32] | (q[..., 32:] << 4)  # chunk c: values 0..31 low, 32..63 high
    packed = np.empty((n, k // 256, 12), dtype=np.uint8)
    packed[..., 0:4] = sc[..., :4] | ((sc[..., 4:] >> 4) << 6)
    packed[..., 4:8] = mn[..., :4] | ((mn[..., 4:] >> 4) << 6)
    packed[..., 8:12] = (sc[..., 4:] & 0x0F) | ((mn[..., 4:] & 0x0F) << 4)
    out = np.concatenate([d[..., None].view(np.uint8), dmin[..., None].view(np.uint8), packed,
                          nibbles.reshape(n, k // 256, 128)], axis=-1)
    return out.reshape(n, -1)


def q6k_encode(w: np.ndarray) -> np.ndarray:
    """A float matrix [N, K] as GGUF Q6_K rows, uint8 [N, K/256 * 210]: per 16 values an int8 scale, per 256 an
    fp16 d, 6-bit values q - 32 split into ql (low 4 bits) and qh (high 2), as llama.cpp lays them out (a plain
    encoder: valid blocks near w)."""
    n, k = w.shape
    sub = w.reshape(n, k // 256, 16, 16).astype(np.float32)
    scales = np.maximum(np.abs(sub).max(-1), 1e-8) / 31
    d = (scales.max(-1) / 127).astype(np.float16)
    sc = np.clip(np.round(scales / d[..., None].astype(np.float32)), 1, 127).astype(np.int8)
    step = d[..., None].astype(np.float32) * sc
    q = (np.clip(np.round(sub / step[..., None]), -32, 31) + 32).astype(np.uint8).reshape(n, k // 256, 2, 4, 32)
    q1, q2, q3, q4 = q[:, :, :, 0], q[:, :, :, 1], q[:, :, :, 2], q[:, :, :, 3]  # [n, kb, half, 32]
    ql = np.concatenate([(q1 & 15) | ((q3 & 15) << 4), (q2 & 15) | ((q4 & 15) << 4)], axis=-1)  # [n, kb, 2, 64]
    qh = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6)  # [n, kb, 2, 32]
    out = np.concatenate([ql.reshape(n, k // 256, 128), qh.reshape(n, k // 256, 64), sc.view(np.uint8),
                          d[..., None].view(np.uint8)], axis=-1)
    return out.reshape(n, -1)
