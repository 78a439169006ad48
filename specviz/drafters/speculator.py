"""A learned draft head: an MLP speculator reading the target's own hidden state.

Stage i of the speculator proposes the i-th draft token of a round (so the
token's position in the round is its stage), from the target's hidden state at
the position that produced the last emitted token and the tokens drafted so far
(specviz.speculator.model).  The first round of a run has no hidden state yet:
it drafts nothing, so that round is a plain target step, whose verify pass then
provides the state.  At most n_predict (4) tokens per round, whatever γ is.
"""

from __future__ import annotations

import weakref
from typing import Any, Iterator

import torch

from ..core.sampling import sample
from .base import ChainDrafter, DraftContext, DraftStep

# Weights attached to a loaded target, per target: building the drafter for each run then
# costs nothing (attaching gathers V_r rows of the head, tens of MB for the real pair).
_ATTACHED: "weakref.WeakKeyDictionary[torch.nn.Module, Any]" = weakref.WeakKeyDictionary()


class SpeculatorDrafter(ChainDrafter):
    name = "learned head (MLP speculator)"
    needs_hidden = True

    def __init__(self, spec: Any, vocab_size: int):
        self.spec = spec  # an MLPSpeculator attached to the target
        self.vocab_size = vocab_size

    @classmethod
    def for_pair(cls, pair: Any, settings: Any) -> "SpeculatorDrafter":
        from ..models import ModelError
        from ..speculator import store

        spec = _ATTACHED.get(pair.target)
        if spec is None:
            path = store.find(pair.target)
            if path is None:
                raise ModelError(
                    f"No trained speculator matches {pair.target_name}: the shipped one is for the default pair's "
                    f"target. Train one with `python -m specviz.speculator.train --preset <id>`, or pick another "
                    f"drafter.")
            spec, _ = store.load(path)
            if int(spec.vocab_ids.max()) >= pair.vocab_size or spec.config.hidden != _width(pair.target):
                raise ModelError(f"The speculator in {path} does not fit {pair.target_name} (vocabulary or width).")
            spec.to(pair.device).attach(pair.target, spec.vocab_ids.to(pair.device))
            _ATTACHED[pair.target] = spec
        return cls(spec, pair.vocab_size)

    def draft(self, ctx: DraftContext) -> Iterator[DraftStep]:
        if ctx.hidden is None:  # a one-token prompt: no target state yet (a plain target step)
            return
        spec = self.spec
        state = ctx.hidden.unsqueeze(0)
        tok = torch.tensor([ctx.ids[-1]], device=ctx.device)
        for i in range(min(ctx.max_tokens, spec.config.n_predict)):
            state, logits = spec.stage(i, state, tok)
            logits = logits[0].float()
            q_r = ctx.warp(logits)  # over V_r; every other token has q = 0
            j = sample(q_r, ctx.gen, ctx.warp.greedy)
            conf = float(torch.softmax(logits, -1)[j]) if ctx.warp.greedy else float(q_r[j])
            q = torch.zeros(self.vocab_size, dtype=torch.float32, device=ctx.device)
            q[spec.vocab_ids] = q_r
            x = int(spec.vocab_ids[j])
            tok = spec.vocab_ids[j : j + 1]
            yield DraftStep(x, q, conf)


def _width(target: torch.nn.Module) -> int:
    head = target.get_output_embeddings()
    return int(head.in_features if hasattr(head, "in_features") else head.weight.shape[1])
