"""The classic drafter: a small causal LM sampled one token at a time (Leviathan et al.)."""

from __future__ import annotations

from typing import Any, Iterator

import torch

from ..kv import CachedLM
from ..sampling import sample
from .base import DraftContext, Drafter, DraftStep


class ModelDrafter(Drafter):
    """Draft x_i ~ q_i = warp(draft(prefix + x_<i)), keeping the draft model's KV cache."""

    def __init__(self, model: torch.nn.Module, device: torch.device, name: str = "draft model"):
        self.lm = CachedLM(model, device)
        self.name = name

    @classmethod
    def for_pair(cls, pair: Any, settings: Any) -> "ModelDrafter":
        return cls(pair.draft, pair.device, name=pair.draft_name)

    def start(self, ids: list[int]) -> None:
        self.lm.free()
        self.lm.prefill(ids)

    def draft(self, ctx: DraftContext) -> Iterator[DraftStep]:
        seq = list(ctx.ids)
        for _ in range(ctx.max_tokens):
            logits = self.lm.feed(seq).logits[-1]
            q = ctx.warp(logits)
            x = sample(q, ctx.gen, ctx.warp.greedy)
            # The draft's confidence in its token at temperature 1 (as transformers'
            # assistant_confidence_threshold reads it): meaningful in greedy mode too.
            lf = logits.float()
            conf = float(torch.exp(lf[x] - torch.logsumexp(lf, -1)))  # softmax(lf)[x], without the vector
            seq.append(x)
            yield DraftStep(x, q, conf)

    def rollback(self, n: int) -> None:
        self.lm.crop(n)

    def free(self) -> None:
        self.lm.free()
