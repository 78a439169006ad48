"""The draft model, with prompt lookup first: a free guess where the text repeats itself, the model elsewhere.

Each round looks for the last ``min_ngram`` or more tokens earlier in the text (the prompt and what was decoded,
as :class:`~.prompt_lookup.PromptLookupDrafter` does, longest match first).  Where they occur, the round proposes
what followed them, with no forward pass (q one-hot: the rule accepts x with probability p(x)); where they do not,
the draft model drafts as :class:`~.draft_model.ModelDrafter` does.  Which one drafts depends only on the text so
far, so the output keeps the target's distribution exactly (tested with χ²).  The model's cache simply falls
behind during copied rounds: its next draft feeds the accepted tokens it missed in one pass.

Requiring a match of ``min_ngram`` tokens (5; up to ``max_ngram``, 8) keeps lookup to real repetition (a summary quoting its source, code
reusing its identifiers): prompt lookup alone also guesses from one-token matches, which chat and translation
rarely continue, and then pays a verify pass for nothing.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from .base import ChainDrafter, DraftContext, DraftStep
from .draft_model import ModelDrafter
from .prompt_lookup import PromptLookupDrafter


class HybridDrafter(ChainDrafter):
    """Prompt lookup where the last ``min_ngram``+ tokens occurred before, the draft model otherwise."""

    name = "draft model + prompt lookup"

    def __init__(self, model: ModelDrafter, vocab_size: int, min_ngram: int = 5, max_ngram: int = 8):
        self.model = model
        self.lookup = PromptLookupDrafter(vocab_size, max_ngram=max_ngram)
        self.min_ngram = min_ngram
        self.looked = 0  # rounds proposed by lookup (for the bench and the tests)

    @classmethod
    def for_pair(cls, pair: Any, settings: Any) -> "HybridDrafter":
        return cls(ModelDrafter.for_pair(pair, settings), pair.vocab_size)

    def start(self, ids: list[int], should_stop: Callable[[], bool] | None = None) -> None:
        self.looked = 0
        self.model.start(ids, should_stop)

    def draft(self, ctx: DraftContext) -> Iterator[DraftStep]:
        copied = self.lookup.lookup(ctx.ids, ctx.max_tokens, min_n=self.min_ngram)
        if not copied:
            yield from self.model.draft(ctx)
            return
        self.looked += 1
        yield from self.lookup.steps(copied, ctx)

    def rollback(self, n: int) -> None:
        self.model.rollback(n)

    def free(self) -> None:
        self.model.free()
