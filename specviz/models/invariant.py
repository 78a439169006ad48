"""Batch-invariant attention: each query attends exactly as it would alone.

A verify pass scores k positions in one forward; a standard step scores one.  Speculative decoding
samples the target's distribution only if each position's logits do not depend on how many other
tokens shared the pass.  In float that holds up to rounding: SDPA's kernels block and order their
sums by the query count, so a position differs by ~1e-6 between the two.  Through bf16 linears
that stays ~1e-6 (TV ~0.01 between a verify pass and steps).  Through int8 linears it does not:
one activation pushed across a rounding boundary moves by a whole quantum, and 28 layers later the
distributions differ by TV ~0.1 (measured on the default 1.5B target with per-token int8).

So the int8 target attends query by query: query i (at absolute position P) takes exactly the keys
it may see -- the prefix 0..P for a causal pass, or the rows its 4D mask allows (token trees),
gathered in order -- and runs SDPA with one query and no mask, the very call a one-token step
makes at that position.  With the integer linears of :class:`specviz.models.int8.TokenInt8Linear`
(exact accumulation, per-token scales) every position's logits are then bit-identical whatever
else was in the pass.  Cost: one small SDPA call per query per layer (microseconds each), against
a forward of ~100 ms.

Registered with transformers' attention and mask interfaces as ``"specviz_invariant"``; a model
opts in with ``model.set_attn_implementation("specviz_invariant")`` (or its config's
``_attn_implementation``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NAME = "specviz_invariant"


def invariant_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                        **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: query [B, H, q, d], key/value [B, Hkv, L, d] (the cache's
    keys, the new ones last); mask None (causal, aligned at the end), bool (True: may attend) or
    additive float (0: may attend) of shape [B or 1, 1, q, L].  Returns [B, q, H, d]."""
    batch, heads, q_len, _ = query.shape
    length = key.shape[2]
    gqa = heads != key.shape[1]
    if batch != 1:
        raise RuntimeError("batch-invariant attention runs one sequence at a time")
    rows = []
    for i in range(q_len):
        if attention_mask is None:
            n = length - q_len + i + 1
            k_i, v_i = key[:, :, :n], value[:, :, :n]
        else:
            row = attention_mask[0, 0, i]
            allowed = row if row.dtype == torch.bool else row == 0
            idx = allowed.nonzero().squeeze(-1)
            n = idx.numel()
            if n and int(idx[-1]) == n - 1:  # a prefix: a view, as in a one-token step
                k_i, v_i = key[:, :, :n], value[:, :, :n]
            else:  # a tree node: the prefix and its ancestors, in order
                k_i, v_i = key.index_select(2, idx), value.index_select(2, idx)
        rows.append(F.scaled_dot_product_attention(query[:, :, i:i + 1], k_i, v_i, scale=scaling, enable_gqa=gqa))
    out = rows[0] if q_len == 1 else torch.cat(rows, dim=2)
    return out.transpose(1, 2).contiguous(), None


_REGISTERED = False


def register() -> str:
    """Make ``"specviz_invariant"`` an attention implementation transformers knows (idempotent)."""
    global _REGISTERED
    if not _REGISTERED:
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

        AttentionInterface.register(NAME, invariant_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
        _REGISTERED = True
    return NAME


def make_invariant(model: torch.nn.Module) -> torch.nn.Module:
    """Switch ``model``'s attention to the batch-invariant one (in place).  A bare model (:mod:`.bare`) only
    records the name: registering it imports transformers' modelling code, which its full model does."""
    if not getattr(model, "bare", False):
        register()
    model.set_attn_implementation(NAME)
    return model
