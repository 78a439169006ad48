"""The target's int8 execution: batch-invariant linears (see :class:`TokenInt8Linear`).

:mod:`.int8` quantizes a model's linears (either kind) and caches their weights; this module holds
what makes the *target's* int8 exact for speculative decoding -- per-token activation scales
through a fixed-range row, per-channel weights -- and the fusion of linears that read one input.
"""

from __future__ import annotations

import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import torch

# fbgemm's linear with a *fixed* activation quantization (fp32 in, fp32 out): each token, divided by its
# own max |x|, lies in [-1, 1] and is quantized as round(63 x) + 64, i.e. into 1..127.  Seven bits, as
# fbgemm's dynamic linear uses with reduce_range: AVX2 without VNNI multiplies u8 by s8 in pairs
# summed into int16 (vpmaddubsw), and 2 x 127 x 128 still fits where 2 x 255 x 128 would saturate.
_STATIC_LINEAR = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32
ACT_SCALE, ACT_ZERO = 1.0 / 63.0, 64

WORKERS = 2  # weight packing is single-threaded inside torch: two Python threads halve the time


def in_threads(fn: Callable, items: list, workers: int = WORKERS) -> list:
    with warnings.catch_warnings(), ThreadPoolExecutor(max_workers=max(1, min(workers, os.cpu_count() or 1))) as pool:
        warnings.simplefilter("ignore")
        return list(pool.map(fn, items))


class TokenInt8Linear(torch.nn.Module):
    """A batch-invariant int8 linear: per-channel int8 weights, one activation scale per token.

    fbgemm's dynamic linear picks one activation scale (and zero point) for the whole input from
    its min and max, so a position's output depends on the other tokens in the same pass: a target
    run that way scores a 6-token verify pass differently from six one-token steps (TV 0.16-0.20 on
    the default pair), and speculative decoding would no longer sample the target's distribution.
    Here each token is first divided by its own max |x| (so every row lies in [-1, 1]) and quantized
    with a *fixed* scale and zero point (fbgemm's static-input linear with float output): no
    quantization parameter depends on the batch, every row is quantized the same way alone or in a
    batch, integer accumulation is exact, and the output row is multiplied back by its token's scale.
    Same kernels as the dynamic linear, and faster (no min/max pass over the input); a position's
    output is bit-identical in any batch.

    Per-channel weight scales (one per output row) also keep the target closer to its bf16 self
    than one scale per matrix.
    """

    def __init__(self, qweight: torch.Tensor, bias: torch.Tensor | None, pack: bool = True):
        super().__init__()
        self.out_features, self.in_features = qweight.shape
        self._qweight: torch.Tensor | None = qweight  # until packed (fusing needs the int8 values)
        self._packed = None
        self.bias = bias
        if pack:
            self.pack()

    def pack(self) -> None:
        """Hand the weights to fbgemm (its packed layout; ~7 ms per million weights on one core)."""
        if self._packed is None:
            self._packed = torch.ops.quantized.linear_prepack(self._qweight, None)
            self._qweight = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is None:
            self.pack()
        shape = x.shape
        rows = x.reshape(-1, self.in_features).float()
        scale = rows.abs().amax(-1, keepdim=True).clamp_(min=1e-30)
        y = _STATIC_LINEAR(rows / scale, ACT_SCALE, ACT_ZERO, self._packed)
        y.mul_(scale)
        if self.bias is not None:
            y.add_(self.bias)
        return y.reshape(*shape[:-1], self.out_features)

    def dequantized(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The float32 weight (or some of its rows) the int8 values stand for: what a reader of the
        head's weight (the learned draft head) gets from an int8 target."""
        qweight = self._qweight if self._qweight is not None else torch.ops.quantized.linear_unpack(self._packed)[0]
        values, scales = qweight.int_repr(), qweight.q_per_channel_scales().to(torch.float32)
        if rows is not None:
            values, scales = values[rows], scales[rows]
        return values.to(torch.float32) * scales[:, None]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, per-token activations"


class _SharedProduct:
    """One int8 product serving several linears that read the same input (q/k/v; gate/up)."""

    def __init__(self, linear: TokenInt8Linear, sizes: list[int]):
        self.linear, self.sizes = linear, sizes
        self._input: torch.Tensor | None = None  # held, so its identity cannot be reused meanwhile
        self._parts: tuple[torch.Tensor, ...] = ()
        self._served: set[int] = set()

    def part(self, x: torch.Tensor, index: int) -> torch.Tensor:
        if x is not self._input or index in self._served:
            self._input, self._served = x, set()
            self._parts = self.linear(x).split(self.sizes, dim=-1)
        self._served.add(index)
        out = self._parts[index]
        if len(self._served) == len(self.sizes):  # every member served: let go of the tensors
            self._input, self._parts, self._served = None, (), set()
        return out


class FusedPart(torch.nn.Module):
    """A member of fused int8 linears (q_proj of q/k/v, say): its slice of one shared product.
    Integer accumulation and per-channel dequantization are per output column, so the slice is
    bit-identical to the member's own product; three small fbgemm calls become one wider one."""

    def __init__(self, shared: _SharedProduct, index: int, in_features: int):
        super().__init__()
        self.shared, self.index = shared, index
        self.in_features, self.out_features = in_features, shared.sizes[index]
        if index == 0:
            self.fused = shared.linear  # registered once, so model.modules() sees the packed weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared.part(x, self.index)


FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def fuse_token_linears(model: torch.nn.Module) -> int:
    """Fuse the unpacked TokenInt8Linear members of each group in FUSED_GROUPS (same input) into one
    product (in place); returns how many groups were fused."""
    fused = 0
    for module in list(model.modules()):
        for names in FUSED_GROUPS:
            members = [getattr(module, n, None) for n in names]
            if not all(isinstance(m, TokenInt8Linear) and m._qweight is not None for m in members):
                continue
            if len({m.in_features for m in members}) != 1:
                continue
            qw = [m._qweight for m in members]
            weight = torch._make_per_channel_quantized_tensor(
                torch.cat([q.int_repr() for q in qw]), torch.cat([q.q_per_channel_scales() for q in qw]),
                torch.zeros(sum(q.shape[0] for q in qw), dtype=torch.long), 0)
            biases = [m.bias if m.bias is not None else torch.zeros(m.out_features) for m in members]
            bias = torch.cat(biases) if any(m.bias is not None for m in members) else None
            shared = _SharedProduct(TokenInt8Linear(weight, bias, pack=False), [m.out_features for m in members])
            for i, name in enumerate(names):
                setattr(module, name, FusedPart(shared, i, members[0].in_features))
            fused += 1
    return fused


def pack_all(model: torch.nn.Module) -> None:
    """Pack every unpacked TokenInt8Linear of ``model`` (two threads)."""
    todo = [m for m in model.modules() if isinstance(m, TokenInt8Linear) and m._packed is None]
    in_threads(lambda m: m.pack(), sorted(todo, key=lambda m: -m.in_features * m.out_features))


def int8_channel_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` as a per-channel (axis 0) symmetric qint8 tensor, scale = max|w_row| / 127.5."""
    weight = weight.detach()
    scale = (weight.abs().amax(1).to(torch.float64) / 127.5).clamp(min=torch.finfo(torch.float32).eps)
    # Rounded by hand, row by row in bf16/fp32 blocks (quantize_per_channel takes ~4x longer on
    # 2 cores): q = round(w / s) with s rounded to float32 as the kernels use it.
    inv = (1.0 / scale.to(torch.float32))[:, None]
    q = torch.empty(weight.shape, dtype=torch.int8)
    for start in range(0, weight.shape[0], 4096):
        block = weight[start:start + 4096].to(torch.float32) * inv[start:start + 4096]
        q[start:start + 4096] = block.round_().clamp_(-128, 127).to(torch.int8)
    return torch._make_per_channel_quantized_tensor(q, scale.to(torch.float32).to(torch.float64),
                                                    torch.zeros(weight.shape[0], dtype=torch.long), 0)
