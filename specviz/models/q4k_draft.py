"""The int8 draft's matrices as Q4_K, made here (with the target's GGUF matrices as stored,
wherever specviz's kernel runs; ``SPECVIZ_Q4K=0`` keeps its int8 rows).

A draft's numbers change only what it proposes: the rule accepts with the draft's own q, so the output keeps
the target's distribution whatever the draft computes (tested with chi-squared).  What matters is its cost, c:
the 0.5B int8 draft reads 494 MB a step.  Its GGUF keeps its 896-wide rows as Q5_0, whose fifth bit made the
kernel compute-bound here (8.5-9.6 GB/s), so the draft's int8 rows are quantized once to Q4_K (the last block
of a row zero-padded; :func:`.q4k.quantize`) and multiplied by the target's kernel: ~0.6 bytes a weight,
the step 37 -> 24 ms on the Zen 3 EPYC; its head too (151,936 x 896: 92 MB where int8 read 136; the reduced
vocabulary takes its rows as it takes int8's; the step a further ~10 % less).  (The offline pair's draft is built
on its GGUF's blocks instead, :mod:`.gguf_native`; this serves a draft loaded with transformers.)
"""

from __future__ import annotations

import logging

import torch

from . import q4k
from .int8_target import TokenInt8Linear, parts_of, shared_of

log = logging.getLogger(__name__)

LABEL = "int8+q4k"  # the pair's draft_quant for such a draft
INT8_DRAFTS = ("int8", LABEL)  # the draft_quant of an int8 draft, its matrices int8 or Q4_K


def _product(members: list[torch.nn.Module]) -> tuple[TokenInt8Linear, list[int]] | None:
    """The one int8 product behind ``members`` (fused, or a lone linear) and its members' widths."""
    shared = shared_of(members)
    if shared is not None:
        return shared.linear, list(shared.sizes)
    if len(members) == 1 and isinstance(members[0], TokenInt8Linear):
        return members[0], [members[0].out_features]
    return None


def use(model: torch.nn.Module) -> int:
    """Give the int8 ``model`` Q4_K products for q/k/v, o, gate/up and down (fused members keep sharing one)
    and its head, in place; returns how many products (0: not asked for, where :func:`.q4k.enabled` says no)."""
    if not q4k.enabled():
        return 0
    made = 0

    def q4k_of(linear: torch.nn.Module) -> q4k.Q4KLinear:
        nonlocal made
        made += 1
        return q4k.Q4KLinear(q4k.quantize(linear.dequantized()), linear.bias.float() if linear.bias is not None else None,
                             linear.in_features)

    for layer in getattr(getattr(model, "model", None), "layers", []):
        for part, names in q4k.GROUPS:
            owner = getattr(layer, part)
            found = _product([getattr(owner, n) for n in names])
            if found is None:
                continue
            linear, sizes = found
            for name, member in zip(names, parts_of(q4k_of(linear), sizes, linear.in_features)):
                setattr(owner, name, member)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, TokenInt8Linear):  # 151,936 x 896: 136 MB int8, 92 MB as Q4_K (the step ~10 % less)
        model.set_output_embeddings(q4k_of(head))
    return made
