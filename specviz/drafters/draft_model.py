"""The classic drafter: a small causal LM sampled one token at a time (Leviathan et al.)."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch

from ..core.kv import cached_lm, feed_prompt
from ..core.sampling import sample
from ..core.settings import GAMMA_MAX_DYNAMIC
from .base import ChainDrafter, DraftContext, DraftStep


class ModelDrafter(ChainDrafter):
    """Draft x_i ~ q_i = warp(draft(prefix + x_<i)), keeping the draft model's KV cache."""

    def __init__(self, model: torch.nn.Module, device: torch.device, name: str = "draft model",
                 max_new_tokens: int | None = None):
        self.model, self.device = model, device
        self.lm = cached_lm(model, device)  # replaced in start(), once the run's length is known
        self.name = name
        self.max_new_tokens = max_new_tokens

    @classmethod
    def for_pair(cls, pair: Any, settings: Any) -> "ModelDrafter":
        return cls(pair.draft, pair.device, name=pair.draft_name, max_new_tokens=settings.max_new_tokens)

    def start(self, ids: list[int], should_stop: Callable[[], bool] | None = None) -> None:
        from ..models.draft_vocab import prepare

        self.lm.free()
        prepare(self.model, ids)  # a reduced head also keeps this prompt's ids (models.draft_vocab)
        # Compiled steps over the draft's static cache when it has them and the run fits.
        need = None if self.max_new_tokens is None else len(ids) + self.max_new_tokens + GAMMA_MAX_DYNAMIC + 1
        self.lm = cached_lm(self.model, self.device, need)  # lean steps keep the chat template's head (set at load)
        feed_prompt(self.lm, ids, should_stop)  # a long prompt in chunks, stoppable between them
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
            # softmax, not exp(lf[x] - logsumexp(lf)): torch's logsumexp is slow on the -inf of a reduced head
            # (2.13, AMX Xeon: 308 against 75 us over 151,936 logits, 16,384 finite)
            conf = float(torch.softmax(lf, -1)[x])
            seq.append(x)
            yield DraftStep(x, q, conf, logits=lf)

    def rollback(self, n: int) -> None:
        self.lm.crop(n)

    def free(self) -> None:
        self.lm.free()
