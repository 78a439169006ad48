"""Prompt-lookup decoding (n-gram matching against the text so far): no model, no cost.

A deterministic guess is the one-hot q = δ_x: the rule then accepts x with
probability min(1, p(x)) = p(x) and otherwise samples from norm(max(0, p − δ_x)),
so the output still has exactly the target's distribution.  Strong on code edits,
summaries and anything that copies from the prompt.
"""

from __future__ import annotations

from typing import Any, Iterator

from .base import ChainDrafter, DraftContext, DraftStep, one_hot


class PromptLookupDrafter(ChainDrafter):
    """Find the latest earlier occurrence of the last n tokens (n = max_ngram … 1)
    and propose what followed it.  Like every drafter it is cut after an end-of-text
    token by the engine, so a match followed by an end-of-turn token and the chat
    template after it never proposes that template."""

    name = "prompt lookup"

    def __init__(self, vocab_size: int, max_ngram: int = 3):
        self.vocab_size = vocab_size
        self.max_ngram = max_ngram

    @classmethod
    def for_pair(cls, pair: Any, settings: Any) -> "PromptLookupDrafter":
        return cls(pair.vocab_size)

    def lookup(self, ids: list[int], n_max: int, min_n: int = 1) -> list[int]:
        """What followed the latest earlier occurrence of the longest tail of ``ids`` (``max_ngram`` … ``min_n``
        tokens) that occurred before, up to ``n_max`` tokens; [] when none did."""
        for n in range(min(self.max_ngram, len(ids) - 1), min_n - 1, -1):
            tail = ids[-n:]
            # Search right to left, excluding the tail itself, for the most recent match.
            for start in range(len(ids) - n - 1, -1, -1):
                if ids[start : start + n] == tail:
                    follow = ids[start + n : start + n + n_max]
                    if follow:
                        return follow
        return []

    def draft(self, ctx: DraftContext) -> Iterator[DraftStep]:
        yield from self.steps(self.lookup(ctx.ids, ctx.max_tokens), ctx)

    def steps(self, tokens: list[int], ctx: DraftContext) -> Iterator[DraftStep]:
        """The looked-up tokens as draft steps: one-hot q, no forward pass."""
        for tok in tokens:
            yield DraftStep(tok, one_hot(tok, self.vocab_size, ctx.device), 1.0, forwards=0)
