"""An MLP speculator (Wertheimer et al. 2024, IBM's `MLPSpeculator`) on a frozen target.

Stage i keeps a state s_i (s_0 = the target's last hidden state h_t, which
produced token x_{t+1}) and reads the token sampled at the previous stage:

    u_i     = A_i(s_i) + (w_e / w_s) · B_i(E[tok_i])      tok_0 = x_{t+1}
    s_{i+1} = GELU(LayerNorm_i(u_i))                        (inner width d)
    logits_i = W_out[V_r] · C_i(s_{i+1})                    proposes token t+2+i

E is the target's own input embedding and W_out its output head, both frozen
and never saved: only A_i, B_i, C_i and the norms are trained (a few MB), which
is what lets the head fit a git repository and train on a CPU.  Two departures
from the paper, both for a CPU: the state is narrower than the target (d < H,
so C_i maps it back into the space the target's head reads), and the head only
scores a restricted vocabulary V_r (the tokens seen in the training corpus and
in the target's top predictions): a [V_r, H] product instead of [V, H] is what
makes a draft token cheap.  The drafter scatters q back into the full
vocabulary with zeros elsewhere, which is still a real distribution, so the
acceptance rule stays exact.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class SpeculatorConfig:
    hidden: int  # H: the target's hidden size (its head's input width)
    inner: int = 384  # d: the speculator's state width
    n_predict: int = 4  # stages, so at most this many draft tokens per round
    tie: bool = False  # stages share B, C, the norm and (after the first) A, as the paper's option:
    #                    4x less to learn from the same data, which matters when data is scarce

    def as_dict(self) -> dict:
        return asdict(self)


class MLPSpeculator(nn.Module):
    """The trainable stages.  The frozen target parts are attached with `attach`."""

    def __init__(self, config: SpeculatorConfig):
        super().__init__()
        self.config = config
        h, d, n = config.hidden, config.inner, config.n_predict
        m = 1 if config.tie else n  # modules per list; stage i uses the one at min(i, m - 1)
        self.proj = nn.ModuleList([nn.Linear(h if i == 0 else d, d, bias=False)
                                   for i in range(min(n, 2) if config.tie else n)])  # A_i
        self.emb_proj = nn.ModuleList([nn.Linear(h, d, bias=False) for _ in range(m)])  # B_i
        self.norm = nn.ModuleList([nn.LayerNorm(d) for _ in range(m)])
        self.out = nn.ModuleList([nn.Linear(d, h, bias=False) for _ in range(m)])  # C_i
        # The paper's fixed mixing weights: the state decays by w_s per stage while each new token
        # adds a comparable share, so later stages still see the hidden state they started from.
        w_s = 0.5 ** (0.5 / n)
        self.mix = math.sqrt((1 - w_s**2) * (d / 2)) / w_s
        self.embed: torch.Tensor | None = None  # [V, H] the target's input embedding (frozen, not saved)
        self.head: torch.Tensor | None = None  # [V_r, H] rows V_r of the target's output head (frozen, not saved)
        self.register_buffer("vocab_ids", torch.zeros(0, dtype=torch.long))  # V_r as full-vocabulary ids

    def attach(self, target: nn.Module, vocab_ids: torch.Tensor) -> "MLPSpeculator":
        """Read the frozen embedding and head from the target (no copy of the embedding;
        the head's V_r rows are gathered once so each draft token reads only those)."""
        self.vocab_ids = vocab_ids.to(torch.long)
        self.embed = target.get_input_embeddings().weight.detach()
        head = target.get_output_embeddings()
        if hasattr(head, "weight"):
            self.head = head.weight.detach()[self.vocab_ids].contiguous()
        else:  # an int8 target (models.int8.TokenInt8Linear): the rows its int8 values stand for
            self.head = head.dequantized(self.vocab_ids.cpu()).to(self.vocab_ids.device)
        return self

    def stage(self, i: int, state: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One stage for a batch: state [B, H or d], tokens [B] (full-vocabulary ids) ->
        (the next state [B, d], logits over V_r [B, V_r])."""
        assert self.embed is not None and self.head is not None, "call attach(target, vocab_ids) first"
        a, k = self.proj[min(i, len(self.proj) - 1)], min(i, len(self.out) - 1)
        dt = a.weight.dtype
        e = self.embed[tokens].to(dt)
        u = a(state.to(dt)) + self.mix * self.emb_proj[k](e)
        state = nn.functional.gelu(self.norm[k](u))
        g = self.out[k](state)
        logits = g.to(self.head.dtype) @ self.head.T
        return state, logits

    def forward(self, hidden: torch.Tensor, tokens: torch.Tensor) -> list[torch.Tensor]:
        """Teacher-forced training pass: hidden [B, H] = h_t, tokens [B, n] = x_{t+1..t+n}
        -> n logits [B, V_r], stage i predicting x_{t+2+i}."""
        state, out = hidden, []
        for i in range(self.config.n_predict):
            state, logits = self.stage(i, state, tokens[:, i])
            out.append(logits)
        return out


def head_fingerprint(target: nn.Module) -> str:
    """A short hash of a few rows of the target's output head: weights trained on one
    target must not silently run on another with the same shapes."""
    known = getattr(target, "_specviz_head_fingerprint", None)  # a target re-executed (int8) keeps its source's
    if known:
        return known
    rows = getattr(target, "_specviz_head_rows", None)  # a bare model's (models.bare): its head is not loaded as such
    w = (rows if rows is not None else target.get_output_embeddings().weight.detach()[:8]).float().contiguous()
    return hashlib.sha256(w.numpy().tobytes()).hexdigest()[:16]
