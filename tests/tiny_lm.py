"""A small causal transformer for the statistical tests, in a dozen tensor ops per forward.

The exactness tests (χ² against the target's exact joint distribution) run an engine thousands of times
on a vocabulary of six tokens.  On a 2-layer LlamaForCausalLM from transformers each forward costs
~1.8 ms, nearly all of it module plumbing (output capturing, mask construction, config lookups, RoPE
caches) around kernels that take microseconds; the χ² tests spent ~8 minutes of the suite there.

:class:`TinyLM` is the same kind of model -- token and position embeddings, causal self-attention over a
real ``transformers.DynamicCache``, an MLP, a sharpened output head -- behind the call
signature :class:`specviz.core.kv.CachedLM` and the drafters use (``input_ids``, ``past_key_values``,
``use_cache``, ``logits_to_keep``, ``output_hidden_states``, a 4D float ``attention_mask`` and
``position_ids`` for token trees).  What the tests check therefore still goes through the engine's real
cache handling: every fed token is written by ``DynamicCache.update``, rollbacks are ``DynamicCache.crop``,
tree paths are kept by index-selecting the cache's layers, and a wrong position, mask or stale cache slot
changes the distributions the χ² tests compare against.  The models' own code path (transformers' Llama
and Qwen2) is covered by the real-pair tests and by the chain and tree χ² tests kept on
``tiny_lm(..., kind="llama")``.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn


class TinyLM(nn.Module):
    """A causal LM over ``vocab`` tokens with transformers' call signature (see the module docstring).

    Each layer is attention then a tanh MLP, both residual, without norms: every op costs ~5-10 µs of
    dispatch on a small CPU whatever its size, so the forward is kept to ~15 of them."""

    def __init__(self, vocab: int, hidden: int = 16, layers: int = 1, heads: int = 2, max_positions: int = 128):
        super().__init__()
        self.config = SimpleNamespace(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                      num_attention_heads=heads, max_position_embeddings=max_positions,
                                      _attn_implementation="sdpa")
        self.heads = heads
        self.embed = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(max_positions, hidden)
        self.qkv = nn.ParameterList(nn.Parameter(torch.randn(hidden, 3 * hidden) / hidden**0.5) for _ in range(layers))
        self.o = nn.ParameterList(nn.Parameter(torch.randn(hidden, hidden) / hidden**0.5) for _ in range(layers))
        self.mlp = nn.ParameterList(nn.Parameter(torch.randn(hidden, hidden) / hidden**0.5) for _ in range(layers))
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        nn.init.normal_(self.lm_head.weight, std=hidden**-0.5)
        self.register_buffer("causal", torch.ones(max_positions, max_positions, dtype=torch.bool).tril(),
                             persistent=False)
        # Plain references for the forward: nn.Module's attribute lookup and ParameterList's iteration
        # cost more than this model's arithmetic.  Parameters only: `.to()` keeps a parameter object
        # (it swaps its data) but replaces a buffer, so the causal mask is read from the module.
        self.__dict__["_fast"] = (self.embed.weight, self.positions.weight,
                                  tuple(zip(self.qkv, self.o, self.mlp)), self.lm_head.weight)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def forward(self, input_ids, past_key_values=None, use_cache: bool = False, logits_to_keep: int = 0,
                output_hidden_states: bool = False, attention_mask=None, position_ids=None, **_):
        b, t = input_ids.shape
        embed, positions, layers, head = self._fast
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        pos = positions[past : past + t] if position_ids is None else F.embedding(position_ids, positions)
        h = F.embedding(input_ids, embed) + pos
        mask = attention_mask
        if mask is None and t > 1:  # causal over the cached prefix and the new tokens
            mask = self.causal[past : past + t, : past + t]
        width, heads = h.shape[-1], self.heads
        for layer, (w_qkv, w_o, w_mlp) in enumerate(layers):
            q, k, v = (h @ w_qkv).view(b, t, 3, heads, width // heads).permute(2, 0, 3, 1, 4)
            if past_key_values is not None:
                k, v = past_key_values.update(k, v, layer)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            h = h + a.transpose(1, 2).reshape(b, t, width) @ w_o
            h = h + torch.tanh(h @ w_mlp)
        logits = (h[:, -logits_to_keep:] if logits_to_keep else h) @ head.T
        return SimpleNamespace(logits=logits, hidden_states=(h,) if output_hidden_states else None,
                               past_key_values=past_key_values)
