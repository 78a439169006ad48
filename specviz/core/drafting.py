"""The Drafter contract: what the engine hands a drafter and asks of it (the drafters,
specviz.drafters, implement it; drafters/base.py re-exports it for them).

A drafter proposes tokens for the target to verify.  Each round the engine calls
``draft(ctx)`` and iterates: the drafter *yields* each token with its draft
distribution q (a [V] float32 vector on ``ctx.device``) as soon as it exists, so
the page can show it before the next one is computed.  The engine decides when
to stop (a draft-length policy, the token budget, an EOS) by simply not asking
for the next token, so a drafter never does work that is thrown away.

q must be the distribution the token was really drawn from, after ``ctx.warp``
(a deterministic guess is one-hot): the acceptance rule is exact for any q.
After the verdict the engine calls ``rollback(n)``: only the first n tokens of
the sequence are still valid.  A drafter that sets ``needs_hidden`` receives the
target's last hidden state at the last verified position in ``ctx.hidden``
(computed by the verify pass only when asked for).  Drafters never import the
engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from .sampling import Warp

if TYPE_CHECKING:
    from .settings import DecodeSettings


@dataclass
class DraftContext:
    """What a drafter gets each round."""

    ids: list[int]  # the prompt and every emitted token so far
    max_tokens: int  # the most tokens this round may draft (γ, clipped to the token budget)
    warp: Warp  # temperature / top-k / top-p, the same for draft and target
    gen: torch.Generator  # the run's random generator, on device
    device: torch.device
    hidden: torch.Tensor | None = None  # [H] target hidden state at ids[-2] (which produced ids[-1])


@dataclass
class DraftStep:
    """One drafted token."""

    token: int
    q: torch.Tensor  # [V] the warped draft distribution the token was drawn from
    confidence: float  # the drafter's own probability of the token before warping (temperature 1):
    #                    what confidence-based draft-length policies read, also in greedy mode
    forwards: int = 1  # draft forward passes spent on this token (0 for a lookup)
    logits: torch.Tensor | None = None  # [V] the drafter's raw logits, when it has them: the acceptance
    #                    picture shows its temperature-1 beliefs under greedy decoding (a reference, no copy)


class Drafter:
    """What every drafter has (do-nothing defaults); see the module docstring.  A drafter is a
    :class:`ChainDrafter` (``draft``) or a tree drafter (``grow``, specviz.drafters.tree), as its
    ``round_kind`` declares (and core.settings.DRAFTER_ROUNDS names); the engine dispatches on it."""

    name: str = "drafter"  # shown on the page and stored in the trace
    round_kind: str = "chain"  # "chain" | "tree": which round the engine runs
    needs_hidden: bool = False

    @classmethod
    def for_pair(cls, pair: Any, settings: "DecodeSettings") -> "Drafter":
        """Build the drafter for a loaded model pair (the registry calls this)."""
        raise NotImplementedError

    def start(self, ids: list[int], should_stop: Callable[[], bool] | None = None) -> None:
        """A new run on this prompt (prefill a cache here: a long prompt in chunks, ``core.kv.feed_prompt``,
        checking ``should_stop`` between them)."""

    def rollback(self, n: int) -> None:
        """Only the first n tokens of the sequence are still valid."""

    def free(self) -> None:
        """Release caches (the run ended, failed or was cancelled)."""


class ChainDrafter(Drafter):
    """A drafter that proposes one chain of tokens a round, one :class:`DraftStep` at a time."""

    round_kind = "chain"

    def draft(self, ctx: DraftContext) -> Iterator[DraftStep]:
        """Yield up to ``ctx.limit`` steps; the engine may stop early (close the generator)."""
        raise NotImplementedError


def one_hot(token: int, vocab: int, device: torch.device) -> torch.Tensor:
    """q = δ_x for a deterministic guess: the rule then accepts x with probability p(x)."""
    q = torch.zeros(vocab, dtype=torch.float32, device=device)
    q[token] = 1.0
    return q
