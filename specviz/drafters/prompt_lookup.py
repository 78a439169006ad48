"""Drafters beyond the draft model: they plug into the same verify/accept code.

A drafter only has to return tokens with their draft distributions q_i.  A
deterministic guess is the one-hot q = δ_x: the rule then accepts x with
probability min(1, p(x)) = p(x) and otherwise samples from norm(max(0, p − δ_x)),
so the output still has exactly the target's distribution.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..engine import Proposal
from ..sampling import Warp


class PromptLookupDrafter:
    """Prompt-lookup decoding: find the latest earlier occurrence of the last n
    tokens (n = max_ngram … 1) and propose what followed it.  No model, no cost;
    strong on code edits, summaries and anything that copies from the prompt."""

    def __init__(self, vocab_size: int, max_ngram: int = 3, name: str = "prompt lookup"):
        self.vocab_size = vocab_size
        self.max_ngram = max_ngram
        self.name = name

    def start(self, ids: list[int]) -> None:
        pass

    def lookup(self, ids: list[int], gamma: int) -> list[int]:
        for n in range(min(self.max_ngram, len(ids) - 1), 0, -1):
            tail = ids[-n:]
            # Search right to left, excluding the tail itself, for the most recent match.
            for start in range(len(ids) - n - 1, -1, -1):
                if ids[start : start + n] == tail:
                    follow = ids[start + n : start + n + gamma]
                    if follow:
                        return follow
        return []

    def propose(self, ids: list[int], gamma: int, warp: Warp, gen: torch.Generator,
                on_token: Callable[[int, float], None]) -> Proposal:
        prop = Proposal()
        for tok in self.lookup(ids, gamma):
            prop.tokens.append(tok)
            prop.q.append(torch.nn.functional.one_hot(torch.tensor(tok), self.vocab_size).float())
            on_token(tok, 1.0)
        return prop

    def rollback(self, n: int) -> None:
        pass

    def free(self) -> None:
        pass
