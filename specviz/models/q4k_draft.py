"""The int8 draft's matrices as Q4_K, made here (with the target's GGUF matrices as stored,
wherever specviz's kernel runs; ``SPECVIZ_Q4K=0`` keeps its int8 rows).

A draft's numbers change only what it proposes: the rule accepts with the draft's own q, so the output keeps
the target's distribution whatever the draft computes (tested with chi-squared).  What matters is its cost, c:
the 0.5B int8 draft reads 494 MB a step.  Its GGUF keeps its 896-wide rows as Q5_0, whose fifth bit made the
kernel compute-bound here (8.5-9.6 GB/s), so the draft's int8 rows are quantized once to Q4_K (the last block
of a row zero-padded; :func:`.q4k.quantize`) and multiplied by the target's kernel: ~0.6 bytes a weight,
the step 37 -> 24 ms on the Zen 3 EPYC; its head too (151,936 x 896: 92 MB where int8 read 136; the reduced
vocabulary takes its rows as it takes int8's; the step a further ~10 % less).  The records are kept beside the
int8 weights they came from, so a warm start reads them instead (~10 s to make on two cores).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from . import q4k
from .int8_target import TokenInt8Linear, parts_of, shared_of

log = logging.getLogger(__name__)

FORMAT = 2  # of the kept records: bump when q4k.quantize changes (2: values in the kernel's order, q4k.STORED)
LABEL = "int8+q4k"  # the pair's draft_quant for such a draft
INT8_DRAFTS = ("int8", LABEL)  # the draft_quant of an int8 draft, its matrices int8 or Q4_K


def records_file(int8_cache: Path) -> Path:
    """Beside the int8 weights, in the model folder's q4k/ (the folder's own *.safetensors are its checkpoint:
    int8._source_signature)."""
    cache = Path(int8_cache)
    return cache.parent / "q4k" / f"draft-{cache.stem}-v{FORMAT}.safetensors"


def _product(members: list[torch.nn.Module]) -> tuple[TokenInt8Linear, list[int]] | None:
    """The one int8 product behind ``members`` (fused, or a lone linear) and its members' widths."""
    shared = shared_of(members)
    if shared is not None:
        return shared.linear, list(shared.sizes)
    if len(members) == 1 and isinstance(members[0], TokenInt8Linear):
        return members[0], [members[0].out_features]
    return None


def use(model: torch.nn.Module, int8_cache: Path | None = None) -> int:
    """Give the int8 ``model`` Q4_K products for q/k/v, o, gate/up and down (fused members keep sharing one)
    and its head, in place; returns how many products (0: not asked for, where :func:`.q4k.enabled` says no)."""
    from safetensors.torch import load_file, save_file

    if not q4k.enabled():
        return 0
    kept = records_file(int8_cache) if int8_cache is not None else None
    stored = load_file(str(kept)) if kept is not None and kept.exists() else {}
    made, fresh = {}, False

    def q4k_of(key: str, linear: torch.nn.Module) -> q4k.Q4KLinear:
        nonlocal fresh
        records = stored.get(key)
        if not q4k._fits(records, linear, padded=True):  # none kept yet, or another model's
            records, fresh = q4k.quantize(linear.dequantized()), True
        made[key] = records
        return q4k.Q4KLinear(records, linear.bias.float() if linear.bias is not None else None, linear.in_features)

    for i, layer in enumerate(getattr(getattr(model, "model", None), "layers", [])):
        for part, names in q4k.GROUPS:
            owner = getattr(layer, part)
            found = _product([getattr(owner, n) for n in names])
            if found is None:
                continue
            linear, sizes = found
            product = q4k_of(f"model.layers.{i}.{part}.{names[0]}", linear)
            for name, member in zip(names, parts_of(product, sizes, linear.in_features)):
                setattr(owner, name, member)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, TokenInt8Linear):  # 151,936 x 896: 136 MB int8, 92 MB as Q4_K (the step ~10 % less)
        model.set_output_embeddings(q4k_of("lm_head", head))
    if kept is not None and fresh:
        try:
            kept.parent.mkdir(parents=True, exist_ok=True)
            tmp = kept.with_name(kept.name + ".partial")
            save_file(made, str(tmp), metadata={"format": str(FORMAT)})
            tmp.replace(kept)
            q4k.drop_other_formats(kept, f"draft-{Path(int8_cache).stem}-v*.safetensors")
        except OSError as exc:  # a read-only cache: made again at the next load
            log.warning("Could not keep the draft's Q4_K records at %s: %s", kept, exc)
    return len(made)
