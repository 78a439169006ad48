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

from . import kernels
from .kernels import _STATIC_LINEAR, ACT_SCALE, ACT_ZERO  # noqa: F401 (the activations' fixed quantization)

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

    def __init__(self, qweight: torch.Tensor | None, bias: torch.Tensor | None, pack: bool = True, *,
                 values: torch.Tensor | None = None, scales: torch.Tensor | None = None):
        """From a per-channel qint8 ``qweight`` [out, in], or from its int8 ``values`` and float64
        ``scales`` (int8 values and their scales as they are: no quantized tensor to build on the way)."""
        super().__init__()
        if qweight is not None:
            values, scales = qweight.int_repr(), qweight.q_per_channel_scales()
        if values is None or scales is None or values.dtype != torch.int8 or values.dim() != 2:
            raise ValueError("a TokenInt8Linear needs a qint8 weight, or int8 values [out, in] and their scales")
        self.out_features, self.in_features = values.shape
        # The int8 values and per-channel scales, until packed (fusing and plain() read them).
        self._int8: tuple[torch.Tensor, torch.Tensor] | None = (values, scales.to(torch.float64))
        self._packed = None  # fbgemm's layout: the fast products
        self._plain: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # onednn's, until packed
        self.bias = bias
        if pack:
            self.pack()

    def qweight(self) -> torch.Tensor:
        """The weight as a per-channel qint8 tensor (what fbgemm packs; unpacked from it once packed)."""
        values, scales = self._values_and_scales()
        return torch._make_per_channel_quantized_tensor(values, scales, torch.zeros(len(scales), dtype=torch.long), 0)

    def _values_and_scales(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The int8 values [out, in] and float64 per-channel scales, whichever form the weights are in now."""
        held = self._int8  # read before _packed: pack() sets _packed before dropping _int8
        if held is not None:
            return held
        if isinstance(self._packed, kernels.Weights):
            return self._packed.values, self._packed.scales
        qweight = torch.ops.quantized.linear_unpack(self._packed)[0]
        return qweight.int_repr(), qweight.q_per_channel_scales()

    def pack(self) -> None:
        """Hand the weights to fbgemm (its packed layout; ~13 ms per million weights on one core on the
        AVX2 EPYC: ~20 s for the 1.5B target).  Safe beside a forward in another thread: the packed
        weights are in place before the other forms are dropped, and both give the same output."""
        held = self._int8
        if self._packed is not None or held is None:  # packed already (or by another thread meanwhile)
            return
        if kernels.int8_rows():  # specviz's own kernel: the int8 values as they are (no packing), fbgemm's bits
            packed = kernels.Weights.of(*held)
        else:
            packed = torch.ops.quantized.linear_prepack(self.qweight(), None)
        if self._packed is None:
            self._packed = packed
        self._plain = None
        self._int8 = None

    def plain(self) -> None:
        """Make the linear runnable at once, without fbgemm's packing: onednn's product over the same
        int8 values, whose layout takes ~1 ns a weight to prepare.  Bit-identical to the packed product
        (integer accumulation, the same dequantization: tested, :func:`plain_matches`) and 2-3x slower
        on the AVX2 EPYC: what a server runs for the first seconds while :meth:`pack` runs in the
        background (:mod:`.warm`)."""
        held = self._int8
        if self._packed is None and self._plain is None and held is not None:
            values, scales = held
            self._plain = (torch.ops.onednn.qlinear_prepack(values, None), scales.to(torch.float32),
                           torch.zeros(self.out_features, dtype=torch.long))

    @property
    def packed(self) -> bool:
        return self._packed is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        plain, packed = self._plain, self._packed  # in this order: pack() sets _packed before dropping _plain
        if packed is None and plain is None:
            self.pack()
            packed = self._packed
        shape = x.shape
        rows = x.reshape(-1, self.in_features).float()
        if isinstance(packed, kernels.Weights):  # all of the below in one call: the same bits, ten ops fewer
            bias = self.bias if self.bias is None or self.bias.dtype == torch.float32 else self.bias.float()
            return packed.linear(rows, bias).reshape(*shape[:-1], self.out_features)
        scale = rows.abs().amax(-1, keepdim=True).clamp_(min=1e-30)
        if packed is not None:
            y = _STATIC_LINEAR(rows / scale, ACT_SCALE, ACT_ZERO, packed)
        else:
            y = _plain_product(rows / scale, plain)
        y.mul_(scale)
        if self.bias is not None:
            y.add_(self.bias)
        return y.reshape(*shape[:-1], self.out_features)

    def dequantized(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The float32 weight (or some of its rows) the int8 values stand for: what a reader of the
        head's weight (the learned draft head) gets from an int8 target."""
        values, scales = self._values_and_scales()
        scales = scales.to(torch.float32)
        if rows is not None:
            values, scales = values[rows], scales[rows]
        return values.to(torch.float32) * scales[:, None]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, per-token activations"


def _plain_product(unit_rows: torch.Tensor, plain: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """What ``_STATIC_LINEAR`` computes, by onednn over its own (cheaply prepared) weight layout: the
    rows quantized with the same fixed scale and zero point (by the same quantizer), u8 x s8 products
    accumulated in int32, dequantized per channel.  fp32 out."""
    weight, scales, zeros = plain
    qx = torch.quantize_per_tensor(unit_rows, ACT_SCALE, ACT_ZERO, torch.quint8).int_repr()
    return torch.ops.onednn.qlinear_pointwise(qx, ACT_SCALE, ACT_ZERO, weight, scales, zeros, None, 1.0, 0,
                                              torch.float32, "none", [], "")


_PLAIN_OK: bool | None = None


def plain_matches() -> bool:
    """Whether onednn's product is available here and bit-identical to fbgemm's (checked once per process
    on random weights and rows, several batch sizes): where it is not, nothing runs plain."""
    global _PLAIN_OK
    if _PLAIN_OK is None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                gen = torch.Generator().manual_seed(0)
                weight = torch.randn(96, 160, generator=gen, dtype=torch.float32)
                scale = (weight.abs().amax(1) / 127.5).to(torch.float64)
                q = (weight / scale[:, None].float()).round().clamp(-128, 127).to(torch.int8)
                qweight = torch._make_per_channel_quantized_tensor(q, scale, torch.zeros(96, dtype=torch.long), 0)
                fast, slow = TokenInt8Linear(qweight, None, pack=False), TokenInt8Linear(qweight, None, pack=False)
                slow.plain()
                fast.pack()
                rows = torch.randn(40, 160, generator=gen, dtype=torch.float32) * torch.rand(40, 1, generator=gen, dtype=torch.float32) * 10
                _PLAIN_OK = slow._plain is not None and all(
                    torch.equal(fast(rows[:m]), slow(rows[:m])) for m in (1, 2, 6, 40))
        except Exception:  # no onednn in this build (an ARM CPU, say): pack at load, as before
            _PLAIN_OK = False
    return _PLAIN_OK


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


def shared_of(members: list) -> _SharedProduct | None:
    """The one shared product ``members`` (linears reading the same input) are all the parts of; None when
    they are not (a lone linear, or members of different products)."""
    first = members[0]
    if isinstance(first, FusedPart) and all(isinstance(m, FusedPart) and m.shared is first.shared for m in members) \
            and len(first.shared.sizes) == len(members):
        return first.shared
    return None


def parts_of(linear: torch.nn.Module, sizes: list[int], in_features: int) -> list[torch.nn.Module]:
    """The members, ``sizes`` outputs wide, of one product ``linear`` (any kind: int8, Q4_K, Q6_K): the product
    itself for a lone member, else the FusedParts of one shared product."""
    if len(sizes) == 1:
        return [linear]
    shared = _SharedProduct(linear, list(sizes))
    return [FusedPart(shared, i, in_features) for i in range(len(sizes))]


def _fused(members: list) -> list[FusedPart] | None:
    """FusedParts of one product for ``members`` (two or more unpacked TokenInt8Linears reading the same
    input: FUSED_GROUPS), in their order; None when they cannot be fused."""
    if not all(isinstance(m, TokenInt8Linear) and m._int8 is not None for m in members):
        return None
    if len({m.in_features for m in members}) != 1:
        return None
    held = [m._int8 for m in members]
    biases = [m.bias if m.bias is not None else torch.zeros(m.out_features, dtype=torch.float32) for m in members]
    bias = torch.cat(biases) if any(m.bias is not None for m in members) else None
    linear = TokenInt8Linear(None, bias, pack=False, values=torch.cat([v for v, _ in held]),
                             scales=torch.cat([sc for _, sc in held]))
    for m in members:
        m._int8 = None  # their values live on in the fused copy only
    return parts_of(linear, [m.out_features for m in members], members[0].in_features)


def fuse_token_linears(model: torch.nn.Module) -> int:
    """Fuse the unpacked TokenInt8Linear members of each group in FUSED_GROUPS (same input) into one
    product (in place); returns how many groups were fused."""
    fused = 0
    for module in list(model.modules()):
        for names in FUSED_GROUPS:
            parts = _fused([getattr(module, n, None) for n in names])
            if parts is not None:
                for name, part in zip(names, parts):
                    setattr(module, name, part)
                fused += 1
    return fused


def fuse_by_name(modules: dict[str, torch.nn.Module]) -> dict[str, torch.nn.Module]:
    """:func:`fuse_token_linears` on linears by module name ("model.layers.0.mlp.gate_proj", ...) before
    they are in a model (a cache read ahead of the model's load fuses in its own thread)."""
    out = dict(modules)
    parents = {name.rpartition(".")[0] for name in modules}
    for parent in parents:
        for names in FUSED_GROUPS:
            full = [f"{parent}.{n}" if parent else n for n in names]
            parts = _fused([modules.get(n) for n in full])
            if parts is not None:
                out.update(zip(full, parts))
    return out


def plain_all(modules: list[torch.nn.Module]) -> None:
    """:meth:`TokenInt8Linear.plain` for every unpacked TokenInt8Linear in ``modules`` (FusedParts: their
    product), where it matches fbgemm's here; their kernel form instead where specviz's kernel is ready."""
    if plain_matches():
        linears = {id(m): m for m in (x.fused if isinstance(x, FusedPart) and x.index == 0 else x for x in modules)
                   if isinstance(m, TokenInt8Linear) and m._packed is None}
        # Where specviz's kernel is built already, its form needs no packing: the linears take it at once.
        in_threads((lambda m: m.pack()) if kernels.int8_rows(built=True) else (lambda m: m.plain()), list(linears.values()))


def unpacked(model: torch.nn.Module) -> list[TokenInt8Linear]:
    """The TokenInt8Linears of ``model`` not packed yet, biggest first."""
    todo = [m for m in model.modules() if isinstance(m, TokenInt8Linear) and m._packed is None]
    return sorted(todo, key=lambda m: -m.in_features * m.out_features)


def pack_all(model: torch.nn.Module, *, defer: bool = False) -> bool:
    """Pack every unpacked TokenInt8Linear of ``model`` (two threads); with ``defer``, where onednn's
    product matches fbgemm's here, only make them runnable (:meth:`TokenInt8Linear.plain`, ~1 s for the
    1.5B target instead of ~10 s) and leave the packing to :func:`.warm.finish`.  Returns whether any
    packing was left."""
    todo = unpacked(model)
    if defer and todo and plain_matches():
        plain_all(todo)  # where specviz's kernel is built already, this is its (instant) packing
        return any(m._packed is None for m in todo)
    in_threads(lambda m: m.pack(), todo)
    return False


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
