"""A lean decode path for an int8 draft on the CPU: the decoder's forward in a few tensor ops a layer.

On a 2-core CPU the int8 draft's one-token step is short enough (~25 ms of kernels for Qwen2.5 0.5B)
that transformers' module plumbing around the kernels -- 170 module calls, cache objects, masks,
dtype casts -- took as long again: 45-55 ms a step on the AVX2 EPYC, so the draft cost ~0.6 of the
target's step and speculation barely paid.  Here the same weights (the fused
:class:`~.int8_target.TokenInt8Linear` of q/k/v and gate/up, o, down, the head) run in a plain loop
with a preallocated KV cache, in float32 throughout: the attention is one SDPA call per layer, RoPE a
table lookup.

It is the *draft's* path only: the rule needs just the q the draft sampled from, so this forward need
not match transformers' bit for bit (it does to float rounding: tested).  The target keeps
transformers' forward and the batch-invariant attention (:mod:`.invariant`).

:class:`LeanSteps` has the interface of :class:`.compiled.CompiledSteps`, so
:func:`specviz.core.kv.cached_lm` hands a chain run a :class:`.compiled.StaticLM` over it; token trees
(4D masks) keep the eager :class:`specviz.core.kv.CachedLM`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from .int8_target import FusedPart, TokenInt8Linear

log = logging.getLogger("specviz.models")

ARCHITECTURES = ("qwen2", "llama")
_START = 256  # cache slots allocated first; doubled as a run grows


@dataclass
class _Layer:
    norm_in: torch.Tensor  # [H] RMSNorm weight, float32
    qkv: Callable[[torch.Tensor], torch.Tensor]  # [T, H] -> [T, (nh + 2 kvh) d]
    o: torch.nn.Module
    norm_post: torch.Tensor
    gate_up: Callable[[torch.Tensor], torch.Tensor]  # [T, H] -> [T, 2 I]
    down: torch.nn.Module


def _int8(module: torch.nn.Module) -> bool:
    return isinstance(module, (TokenInt8Linear, FusedPart))


def _fused(members: list[torch.nn.Module]) -> Callable[[torch.Tensor], torch.Tensor]:
    """One call for linears that read the same input: their shared int8 product when fused."""
    first = members[0]
    if isinstance(first, FusedPart) and all(isinstance(m, FusedPart) and m.shared is first.shared for m in members) \
            and len(first.shared.sizes) == len(members):
        return first.shared.linear
    return lambda x: torch.cat([m(x) for m in members], dim=-1)


def unsupported(model: torch.nn.Module) -> str | None:
    """Why the lean path cannot run ``model`` (None: it can)."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in ARCHITECTURES:
        return f"architecture {getattr(cfg, 'model_type', '?')!r} (lean path: {', '.join(ARCHITECTURES)})"
    if getattr(cfg, "use_sliding_window", False):
        return "sliding-window attention"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act!r}"
    rope = getattr(cfg, "rope_scaling", None) or getattr(cfg, "rope_parameters", None) or {}
    if isinstance(rope, dict) and rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        return f"rope scaling {rope.get('rope_type', rope.get('type'))!r}"
    body = getattr(model, "model", None)
    if body is None or not hasattr(body, "layers") or not hasattr(body, "rotary_emb"):
        return "no decoder body"
    for layer in body.layers:
        att, mlp = layer.self_attn, layer.mlp
        linears = [att.q_proj, att.k_proj, att.v_proj, att.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]
        if not all(_int8(m) for m in linears):
            return "linears not int8 (the lean path is for the int8 draft)"
    if next(model.parameters()).device.type != "cpu":
        return "not on the CPU"
    return None


class LeanSteps:
    """A decoder's forward over its own KV cache (``max_len`` tokens at most, allocated as needed)."""

    def __init__(self, model: torch.nn.Module, max_len: int):
        why = unsupported(model)
        if why is not None:
            raise ValueError(f"the lean decode path does not support this model: {why}")
        cfg, body = model.config, model.model
        self.model, self.max_len = model, max_len
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.eps = float(getattr(cfg, "rms_norm_eps", 1e-6))
        self.embed = body.embed_tokens
        self.norm = body.norm.weight.detach().float()
        self.head = model.get_output_embeddings()
        rot = body.rotary_emb
        self.inv_freq = rot.inv_freq.detach().float().cpu()
        self.rope_scale = float(getattr(rot, "attention_scaling", 1.0))
        self.layers = []
        for layer in body.layers:
            att, mlp = layer.self_attn, layer.mlp
            self.layers.append(_Layer(
                norm_in=layer.input_layernorm.weight.detach().float(),
                qkv=_fused([att.q_proj, att.k_proj, att.v_proj]), o=att.o_proj,
                norm_post=layer.post_attention_layernorm.weight.detach().float(),
                gate_up=_fused([mlp.gate_proj, mlp.up_proj]), down=mlp.down_proj))
        self.q_size = self.heads * self.head_dim
        self.kv_size = self.kv_heads * self.head_dim
        self.scaling = self.head_dim ** -0.5
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.capacity = 0
        self.length = 0
        self.in_use = False
        self._cos = self._sin = torch.empty(0)

    # -- the cache --------------------------------------------------------------------------------

    def set_length(self, n: int) -> None:
        """Keep the first ``n`` cached tokens (later slots are overwritten by the next feed)."""
        self.length = n

    def _reserve(self, n: int) -> None:
        if n <= self.capacity:
            return
        cap = max(_START, self.capacity)
        while cap < n:
            cap *= 2
        cap = min(cap, max(self.max_len, n))
        shape = (1, self.kv_heads, cap, self.head_dim)
        for i in range(len(self.layers)):
            k, v = torch.zeros(shape), torch.zeros(shape)
            if self.capacity:
                k[:, :, :self.capacity] = self.keys[i]
                v[:, :, :self.capacity] = self.values[i]
            if i < len(self.keys):
                self.keys[i], self.values[i] = k, v
            else:
                self.keys.append(k)
                self.values.append(v)
        freqs = torch.outer(torch.arange(cap, dtype=torch.float32), self.inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self._cos, self._sin = emb.cos() * self.rope_scale, emb.sin() * self.rope_scale
        self.capacity = cap

    def release(self) -> None:
        """Drop the cache's memory (the next run allocates again)."""
        self.keys, self.values, self.capacity, self.length = [], [], 0, 0

    # -- the forward ------------------------------------------------------------------------------

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * weight

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    @torch.inference_mode()
    def forward(self, ids: list[int], keep: int, hidden: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed ``ids`` after the cache's ``length`` tokens; the logits (and final normed hidden states,
        if asked) of the last ``keep`` of them."""
        start, t = self.length, len(ids)
        if start + t > self.max_len:
            raise RuntimeError(f"the lean KV cache holds {self.max_len} tokens; this run needs more")
        self._reserve(start + t)
        end = start + t
        x = self.embed(torch.tensor(ids, dtype=torch.long)).float()  # [T, H]
        cos, sin = self._cos[start:end][None], self._sin[start:end][None]  # [1, T, d]
        mask = None
        if t > 1:  # query i sees the prefix and new tokens 0..i
            mask = torch.ones(t, end, dtype=torch.bool).tril(diagonal=start)
        for i, layer in enumerate(self.layers):
            qkv = layer.qkv(self._rms(x, layer.norm_in))
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q = self._rope(q.view(t, self.heads, self.head_dim).transpose(0, 1), cos, sin)
            k = self._rope(k.view(t, self.kv_heads, self.head_dim).transpose(0, 1), cos, sin)
            self.keys[i][0, :, start:end] = k
            self.values[i][0, :, start:end] = v.view(t, self.kv_heads, self.head_dim).transpose(0, 1)
            att = F.scaled_dot_product_attention(q[None], self.keys[i][:, :, :end], self.values[i][:, :, :end],
                                                 attn_mask=mask, scale=self.scaling, enable_gqa=True)
            x = x + layer.o(att[0].transpose(0, 1).reshape(t, self.q_size))
            gate, up = layer.gate_up(self._rms(x, layer.norm_post)).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
        self.length = end
        h = self._rms(x[t - keep:], self.norm)
        return self.head(h).float(), (h if hidden else None)

    def feed(self, new: list[int], keep: int, hidden: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`.compiled.CompiledSteps.feed`'s contract: ``new`` after the cache's contents."""
        return self.forward(new, keep, hidden)


def attach(model: torch.nn.Module, max_len: int | None = None) -> LeanSteps | None:
    """Give ``model`` the lean decode path (:func:`specviz.core.kv.cached_lm` then uses it for chains) when
    it supports it; returns the steps, or None (logged) when it does not."""
    why = unsupported(model)
    if why is not None:
        log.info("The lean decode path is off for %s: %s", type(model).__name__, why)
        return None
    cap = max_len or int(getattr(model.config, "max_position_embeddings", 0) or 32768)
    steps = LeanSteps(model, cap)
    model._specviz_steps = steps
    return steps
