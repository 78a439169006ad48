"""A bf16 model that computes in float32: its weights stay bf16 in memory and are widened a block of rows at a
time, so the ready pair (:mod:`.first_start`) runs at float32's speed in bf16's memory.

On a CPU without native bf16 (AVX2) torch's bf16 product is slow: a 61-token pass of the 1.5B target took
~3x float32's time on the 2-core AMD EPYC (Zen 3).  Holding the weights in float32 instead doubles the memory
a first start must fault in, and on that VM (Firecracker) fresh memory costs ~0.5-1 GB/s, whichever thread
asks: 9.6 GB of float32 weights took 17 s, more than all the rest of the pair's making.  Here each linear
widens ROWS_BYTES of its bf16 weight into a scratch block that stays in the cache and multiplies by it
(``torch.mm``: float32's own product, block by block), the embeddings' rows are widened as they are looked up,
and the norms and biases (small) are float32.  Measured there on one 8960 x 1536 matrix: 61 tokens 20.5 ms
(float32 weights: 27.3, bf16: 84.4); one token 7.4 ms (3.5, 1.7).  So the pair's first run (a 61-token
prompt) took 3.6 s where float32 weights took 5.5 s, but each step after it costs more: the 1.5B target's
one-token step ~0.96 s (0.40 on float32 weights), the draft's 0.34 s (0.16); a 32-token race of the ready
pair took 36 s.  It serves only until the prepared pair is in (about three minutes), its races flagged.
Float32 sums in another order than one product over the whole matrix (block by block, the transposed
product): the logits agree with the float32 model's to float32's rounding, not to the bit
(tests/test_upcast.py).
"""

from __future__ import annotations

import threading

import torch

ROWS_BYTES = 4 << 20  # float32 bytes widened at a time: a block that stays in the cache between widening and product
_LOCAL = threading.local()


def _scratch(n: int) -> torch.Tensor:
    """This thread's float32 scratch of at least ``n`` values (kept: fresh memory is what this module saves)."""
    buf = getattr(_LOCAL, "buf", None)
    if buf is None or buf.numel() < n:
        buf = _LOCAL.buf = torch.empty(max(n, ROWS_BYTES // 4), dtype=torch.float32)
    return buf


class UpcastLinear(torch.nn.Linear):
    """A :class:`torch.nn.Linear` with a bf16 weight and float32 inputs, outputs and bias."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        n_out, k = w.shape
        flat = x.reshape(-1, k)
        out_t = torch.empty(n_out, flat.shape[0], dtype=torch.float32)  # the product transposed: rows by block
        rows = max(1, ROWS_BYTES // (4 * k))
        scratch = _scratch(rows * k)
        xt = flat.t()
        for a in range(0, n_out, rows):
            b = min(n_out, a + rows)
            block = scratch[:(b - a) * k].view(b - a, k)
            block.copy_(w[a:b])
            torch.mm(block, xt, out=out_t[a:b])
        out = out_t.t().contiguous()  # (what follows sees float32's layout: a reduction's order may follow it)
        if self.bias is not None:
            out += self.bias
        return out.reshape(*x.shape[:-1], n_out)


def _widen_output(_module: torch.nn.Module, _args: tuple, output: torch.Tensor) -> torch.Tensor:
    return output.float()


def widen(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` (bf16) computing in float32, in place: its linears :class:`UpcastLinear`, its embeddings'
    outputs widened, every other parameter (norms, biases) float32."""
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = UpcastLinear
        elif isinstance(module, torch.nn.Embedding):
            module.register_forward_hook(_widen_output)
            continue
        for name, param in list(module.named_parameters(recurse=False)):
            if name != "weight" or not isinstance(module, UpcastLinear):
                module._parameters[name] = torch.nn.Parameter(param.detach().float(), requires_grad=False)
    return model
