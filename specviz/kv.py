"""A causal LM together with its KV cache: feed new tokens, crop back, free.

Both the target (verify passes) and the draft model (draft steps) keep a cache
holding a prefix of the sequence being decoded.  Each call feeds only the tokens
the cache does not hold yet; after a rejection the cache is cropped back to the
accepted prefix, so no token is ever recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache


@dataclass
class Fed:
    """What one forward pass returns: logits (and, if asked, last-layer hidden states)
    for the last k fed positions."""

    logits: torch.Tensor  # [k, V]
    hidden: torch.Tensor | None = None  # [k, H], the final (normed) hidden state


class CachedLM:
    """A causal LM plus a KV cache holding the first `cached` tokens of a sequence."""

    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.model = model
        self.device = device
        self.cache = DynamicCache()
        self.cached = 0

    def feed(self, ids: list[int], keep: int = 1, hidden: bool = False) -> Fed:
        """Feed ids[cached:]; return the outputs of the last `keep` positions.

        hidden=True also returns the last layer's hidden states (a learned draft
        head reads them); it is off by default because it costs memory traffic."""
        new = ids[self.cached :]
        assert new, "nothing new to feed"
        x = torch.tensor([new], dtype=torch.long, device=self.device)
        out = self.model(input_ids=x, past_key_values=self.cache, use_cache=True, logits_to_keep=keep,
                         output_hidden_states=hidden)
        self.cached = len(ids)
        h = out.hidden_states[-1][0, -keep:] if hidden else None
        return Fed(out.logits[0, -keep:], h)

    def prefill(self, ids: list[int]) -> None:
        """Fill the cache with all but the last token (the next feed gives its logits)."""
        if len(ids) > 1:
            self.feed(ids[:-1])

    def crop(self, n: int) -> None:
        """Keep only the first n tokens in the cache."""
        if self.cached > n:
            self.cache.crop(-(self.cached - n))  # transformers 5: a negative count of tokens to drop
            self.cached = n

    def free(self) -> None:
        self.cache = DynamicCache()
        self.cached = 0
