"""The target's linears on GGUF's own Q4_K weights (``csrc/q4k.cpp``): 0.59 bytes a weight where int8 reads 1.0.

The default target ships as a Q4_K_M GGUF: most of its matrices (q, k, o, gate, up in every layer; v and
down in half of them) are Q4_K -- blocks of 256 4-bit values with a 6-bit scale and min per 32 -- the rest
Q6_K.  The int8 execution dequantizes them and quantizes again to int8: 1.55 GB a step.  Here each Q4_K matrix
is multiplied as it is stored (llama.cpp's own numbers: ``w = d * sc * q - dmin * m``), its activations
quantized to int8 per block of 256 (one scale a block, as llama.cpp's Q8_K), and the Q6_K ones stay on the
int8 kernel: ~1.06 GB a step.

Batch-invariant, as every target execution must be: each output is computed alone from its own row and
token, in a fixed order (:func:`reference` is that order in torch, to the bit; tested), so a verify pass
scores every position as a one-token step does.
"""

from __future__ import annotations

import numpy as np
import torch

from .q6k import Q6KLinear, kernel_order, rows_product

QK = 256  # weights per Q4_K block
GGUF_BLOCK = 144  # bytes of a GGUF Q4_K block: d, dmin (fp16), 12 bytes of packed scales and mins, 128 of nibbles
REC = 152  # bytes of the kernel's record: the 128 nibbles, 8 scales, 8 mins, d and dmin as float32

# The record's 256 values in the kernel's order: its 32-value group k (the low, then the high nibbles of each
# 32 bytes) holds, at byte p, sub-block p // 4's values 4k + p % 4.  One 32-byte product then spans all eight
# sub-blocks, so a block's eight products add up in int16 and take their scales in one vpmaddwd
# (``csrc/q4k.cpp``).  STORED[i]: the value (in weight order) at position i; the activations go the same way.
STORED = kernel_order(32)
PLACE = np.argsort(STORED)  # PLACE[v]: where value v is stored


def records(raw: np.ndarray) -> torch.Tensor:
    """GGUF Q4_K rows (uint8 [N, K/256 * 144], as ``gguf.GGUFReader`` maps them) in the kernel's form, uint8
    [N, K/256, 152]: the 4-bit values as stored, each block's in the kernel's order (:data:`STORED`), the 6-bit
    scales and mins unpacked (llama.cpp's ``get_scale_min_k4``), d and dmin widened to float32."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    n = raw.shape[0]
    blocks = raw.reshape(n, -1, GGUF_BLOCK)
    kb = blocks.shape[1]
    d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)
    dmin = blocks[..., 2:4].copy().view(np.float16).astype(np.float32)
    q = blocks[..., 4:16].astype(np.uint8)
    sc = np.empty((n, kb, 8), dtype=np.uint8)
    mn = np.empty((n, kb, 8), dtype=np.uint8)
    sc[..., :4] = q[..., 0:4] & 63
    mn[..., :4] = q[..., 4:8] & 63
    sc[..., 4:] = (q[..., 8:12] & 0x0F) | ((q[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)
    out = np.empty((n, kb, REC), dtype=np.uint8)
    out[..., :128] = _pack(_unpack(blocks[..., 16:])[..., STORED])
    out[..., 128:136] = sc
    out[..., 136:144] = mn
    out[..., 144:148] = d.view(np.uint8).reshape(n, kb, 4)
    out[..., 148:152] = dmin.view(np.uint8).reshape(n, kb, 4)
    return torch.from_numpy(out)


def _unpack(nibbles: np.ndarray) -> np.ndarray:
    """GGUF's 128 bytes of a block as its 256 values in order: 32 bytes a chunk of 64, low nibbles first."""
    nib = nibbles.reshape(*nibbles.shape[:-1], 4, 1, 32)
    return np.concatenate([nib & 0x0F, nib >> 4], axis=-2).reshape(*nibbles.shape[:-1], QK)


def _pack(values: np.ndarray) -> np.ndarray:
    """The inverse of :func:`_unpack`: 256 values (0..15) a block as 128 bytes."""
    v = values.reshape(*values.shape[:-1], 4, 2, 32)
    return (v[..., 0, :] | (v[..., 1, :] << 4)).reshape(*values.shape[:-1], 128)


def quantize(weight: torch.Tensor) -> torch.Tensor:
    """Float weights [N, K] as Q4_K records, uint8 [N, ceil(K/256), 152], made here (the draft's: its GGUF keeps
    its 896-wide rows as Q5_0, which is compute-bound here).  K short of a block is zero-padded: those weights
    are 0 exactly.  Per sub-block of 32: scale (max - min) / 15 and min min(w, 0), each as a 6-bit multiple of
    the block's float32 d or dmin, then q = round((w + min) / scale) in 0..15 (llama.cpp's format, not its
    iterative search: the draft's numbers change, the rule keeps the output exact)."""
    w = weight.detach().to(torch.float32)
    n, k = w.shape
    kb = -(-k // QK)
    w = torch.nn.functional.pad(w, (0, kb * QK - k)).reshape(n, kb, 8, 32)
    low = w.amin(-1).clamp(max=0)
    step_f, min_f = (w.amax(-1) - low) / 15, -low
    d, dmin = step_f.amax(-1) / 63, min_f.amax(-1) / 63

    def six_bits(value: torch.Tensor, unit: torch.Tensor) -> torch.Tensor:
        return torch.where(unit[..., None] > 0, torch.round(value / unit[..., None].clamp(min=1e-30)),
                           torch.zeros_like(value)).clamp_(0, 63)

    sc, mn = six_bits(step_f, d), six_bits(min_f, dmin)
    step, offset = (d[..., None] * sc)[..., None], (dmin[..., None] * mn)[..., None]
    q = torch.where(step > 0, torch.round((w + offset) / step.clamp(min=1e-30)), torch.zeros_like(w))
    q = q.clamp_(0, 15).to(torch.uint8).reshape(n, kb, QK)[..., torch.from_numpy(STORED)]
    out = torch.empty(n, kb, REC, dtype=torch.uint8)
    out[..., :128] = torch.from_numpy(_pack(q.numpy()))
    out[..., 128:136], out[..., 136:144] = sc.to(torch.uint8), mn.to(torch.uint8)
    out[..., 144:148] = d.contiguous().view(torch.uint8).reshape(n, kb, 4)
    out[..., 148:152] = dmin.contiguous().view(torch.uint8).reshape(n, kb, 4)
    return out


def _fields(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A record tensor's parts: q uint8 [N, KB, 256] (0..15, in weight order), sc, mn int32 [N, KB, 8], d, dmin
    float32 [N, KB]."""
    q = torch.from_numpy(_unpack(w[..., :128].numpy())[..., PLACE])  # back in weight order
    sc, mn = w[..., 128:136].to(torch.int32), w[..., 136:144].to(torch.int32)
    d = w[..., 144:148].contiguous().view(torch.float32).squeeze(-1)
    dmin = w[..., 148:152].contiguous().view(torch.float32).squeeze(-1)
    return q, sc, mn, d, dmin


def dequantize(w: torch.Tensor) -> torch.Tensor:
    """The float32 weight [N, K] a record tensor stands for (llama.cpp's dequantization: the same values as
    ``gguf.quants.dequantize`` of the GGUF rows; tested)."""
    q, sc, mn, d, dmin = _fields(w)
    n, kb = w.shape[:2]
    scale = (d[..., None] * sc.to(torch.float32)).repeat_interleave(32, dim=-1)
    low = (dmin[..., None] * mn.to(torch.float32)).repeat_interleave(32, dim=-1)
    return (scale * q.to(torch.float32) - low).reshape(n, kb * QK)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the kernel makes of float32 rows [M, K]: the int8 values (as int32) [M, K], one float32 scale per block
    of 256 [M, K/256] and the sums of each 32 values [M, K/32]."""
    m, k = x.shape
    blocks = x.reshape(m, k // QK, QK)
    amax = blocks.abs().amax(-1)
    inv = torch.where(amax > 0, torch.tensor(127.0) / amax, torch.zeros_like(amax))
    xq = torch.round(blocks * inv[..., None]).clamp_(-127, 127).to(torch.int32)  # round: to nearest even
    return xq.reshape(m, k), amax / 127.0, xq.reshape(m, k // 32, 32).sum(-1)


def fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """float32 a * b + c rounded once, as a fused multiply-add gives it (vfmadd): the product is exact in float64,
    the sum is rounded to odd there (TwoSum's error decides the last bit), and float64 to float32 is then the one
    correct rounding (53 >= 2 x 24 + 2 bits: Boldo and Melquiond's round-to-odd)."""
    p = a.to(torch.float64) * b.to(torch.float64)
    c64 = c.to(torch.float64)
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)  # p + c - s, exactly
    even = (s.view(torch.int64) & 1) == 0
    inexact = (err != 0) & even & torch.isfinite(s)
    s = torch.where(inexact, torch.nextafter(s, torch.where(err > 0, torch.inf, -torch.inf).to(s)), s)
    return s.to(torch.float32)


def reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`linear` in torch, one float32 operation at a time in the kernel's order and over its lanes (see
    ``csrc/q4k.cpp``): its bits (the tests' oracle; slow)."""
    q, sc, mn, d, dmin = _fields(w)
    m, n, kb = x.shape[0], w.shape[0], w.shape[1]
    x = torch.nn.functional.pad(x, (0, kb * QK - x.shape[1]))  # a K short of the last block: zeros
    xq, dx, bs = quantize_activations(x)
    xq = xq.reshape(m, kb, 8, 32).to(torch.int64)  # block, sub-block j, its 32 values
    q = q.reshape(n, kb, 8, 32).to(torch.int64)
    y = dx[..., None] * bs.reshape(m, kb, 8).to(torch.float32)  # [m, kb, 8]
    dsc = d[..., None] * sc.to(torch.float32)  # [n, kb, 8]
    dmn = dmin[..., None] * mn.to(torch.float32)
    a = torch.zeros(m, n, 8, dtype=torch.float32)
    for b in range(kb):
        lanes = torch.einsum("mjk,njk->mnj", xq[:, b], q[:, b]).to(torch.float32)  # exact: sub-block j's sum
        u = lanes * dx[:, None, b, None]
        a = fma(dsc[None, :, b], u, a)
        a = fma(-dmn[None, :, b], y[:, None, b], a)
    out = a[..., 0]
    for lane in range(1, 8):
        out = out + a[..., lane]
    return out + bias if bias is not None else out


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """float32 rows [M, K] times the Q4_K weight ``w`` (records [N, K/256, 152]), plus ``bias``: [M, N]."""
    return torch.ops.specviz.q4k_linear(x, w, bias)


class Q4KLinear(torch.nn.Module):
    """A linear on Q4_K records (several matrices reading one input may share one: their rows stacked).
    ``in_features``: fewer than the records' blocks hold (the rest zero-padded; :func:`quantize`)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, in_features: int | None = None):
        super().__init__()
        if weight.dtype != torch.uint8 or weight.dim() != 3 or weight.shape[2] != REC:
            raise ValueError("a Q4KLinear needs Q4_K records, uint8 [out, in/256, 152]")
        self.out_features, self.in_features = weight.shape[0], in_features or weight.shape[1] * QK
        if not weight.shape[1] * QK - QK < self.in_features <= weight.shape[1] * QK:
            raise ValueError(f"{self.in_features} inputs do not fill {weight.shape[1]} blocks of {QK} but the last")
        self.weight = weight
        self.bias = bias.to(torch.float32).contiguous() if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rows_product(x, self.in_features, self.out_features, lambda rows: linear(rows, self.weight, self.bias))

    def dequantized(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The float32 weight (or some of its rows) the records stand for, as an int8 head gives its own."""
        w = self.weight if rows is None else self.weight[rows]
        return dequantize(w)[:, :self.in_features]

    def rows(self, rows: torch.Tensor, bias: torch.Tensor | None) -> "Q4KLinear":
        """A product of only ``rows`` of the outputs, each the same bits (every output is computed alone)."""
        return Q4KLinear(self.weight[rows].contiguous(), bias, self.in_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, Q4_K"


FORMAT = 3  # of the records (3: values in the kernel's order, STORED): a probe's key names it (other records, other
# curves: measured again)
# The decoder's products of one input, by transformers' names (q4k_draft gives each group one product)
GROUPS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("self_attn", ("o_proj",)),
          ("mlp", ("gate_proj", "up_proj")), ("mlp", ("down_proj",)))


def enabled() -> bool:
    """Whether an int8 target takes its GGUF's matrices as stored (and an int8 draft Q4_K products made here,
    :mod:`.q4k_draft`): wherever specviz's kernel runs, unless ``SPECVIZ_Q4K=0``.  On the Zen 3 EPYC it made
    the target's step ~70 ms where int8's own rows took ~120, and the best speculative run 1.11x llama.cpp's
    plain decoding of the same GGUF (README, "Faster than llama.cpp")."""
    from . import kernels

    return not kernels.switched_off("SPECVIZ_Q4K") and kernels.matches()


def expected() -> bool:
    """:func:`enabled` as far as it can be told without building the kernel now (a first start builds it in
    the background; a question about a replay must not wait a minute for it): the kernel's own check where it
    is built, else whether it is asked for and for this CPU."""
    from . import kernels

    if kernels.switched_off("SPECVIZ_Q4K"):
        return False
    if kernels.ready():
        return kernels.matches()
    return not kernels._why_not(kernels._cpu_flags())


def in_use(model: torch.nn.Module) -> bool:
    return any(isinstance(m, (Q4KLinear, Q6KLinear)) for m in model.modules())
