"""A lean decode path for an int8 draft on the CPU: the decoder's forward in a few tensor ops a layer.

On a 2-core CPU the int8 draft's one-token step is short enough (~25 ms of kernels for Qwen2.5 0.5B)
that transformers' module plumbing around the kernels -- 170 module calls, cache objects, masks,
dtype casts -- took as long again: 45-55 ms a step on the AVX2 EPYC, so the draft cost ~0.6 of the
target's step and speculation barely paid.  Here the same weights (the fused
:class:`~.int8_target.TokenInt8Linear` of q/k/v and gate/up, o, down, the head) run in a plain loop
with a preallocated KV cache, in float32 throughout: the attention is one SDPA call per layer, RoPE a
table lookup.  The one- and two-token feeds (every draft step) then run as TorchScript graphs traced
from the same function: the same kernels without Python's dispatch between ~1,000 small ops.

The draft's forward need not match transformers' bit for bit (the rule needs just the q the draft
sampled from; it does to float rounding: tested).  The int8 *target* runs here too, with
``invariant=True``: each query then attends in its own SDPA call over the whole cache, masked to the
slots at or before it -- the very call a one-token step makes at that position -- so a position's logits
are bit-identical whatever else shared its pass (a verify pass, a prompt pass, a step), as with
transformers' forward and :mod:`.invariant`.  (One SDPA call over several queries is not: its kernel
blocks its sums by the query count.  A masked call does not depend on the cache's capacity: tested.)
On the AVX2 EPYC this took the target's traced one-token step from 132 ms (transformers' forward over
the same int8 products) to ~101 ms.  Every run of the target gets its own cache (:meth:`LeanSteps.for_run`):
a race runs standard and speculative decoding side by side, and both must take the same path.

:class:`LeanSteps` has the interface of :class:`.compiled.CompiledSteps`, so
:func:`specviz.core.kv.cached_lm` hands a run an LM over it (:meth:`LeanSteps.lm`): the draft's chains; the
target's chains and token trees (:mod:`.lean_tree`).  The draft's token trees keep the eager
:class:`specviz.core.kv.CachedLM`.
"""

from __future__ import annotations

import copy
import logging
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F

from . import kernels
from .compiled import give_steps
from .int8_target import FusedPart, TokenInt8Linear, shared_of
from .q4k import Q4KLinear
from .prefix_store import KeptHeads
from .q6k import Q6KLinear

if TYPE_CHECKING:
    from .prefix_store import PrefixStore

log = logging.getLogger("specviz.models")

ARCHITECTURES = ("qwen2", "llama")
_START = 256  # cache slots allocated first; doubled as a run grows
TRACED_FEEDS = (1, 2)  # feed lengths run as a traced graph: a step, and a step after a round that kept every draft
TARGET_FEEDS = tuple(range(1, 10))  # the target's: a step, and verify passes of up to 8 drafted tokens


@dataclass
class _Layer:
    norm_in: torch.Tensor  # [H] RMSNorm weight, float32
    qkv: Callable[[torch.Tensor], torch.Tensor]  # [T, H] -> [T, (nh + 2 kvh) d]
    o: torch.nn.Module
    norm_post: torch.Tensor
    gate_up: Callable[[torch.Tensor], torch.Tensor]  # [T, H] -> [T, 2 I]
    down: torch.nn.Module


def _int8(module: torch.nn.Module) -> bool:
    return isinstance(module, (TokenInt8Linear, FusedPart, Q4KLinear, Q6KLinear))


def _fused(members: list[torch.nn.Module]) -> Callable[[torch.Tensor], torch.Tensor]:
    """One call for linears that read the same input: their shared int8 product when fused."""
    shared = shared_of(members)
    if shared is not None:
        return shared.linear
    return lambda x: torch.cat([m(x) for m in members], dim=-1)


def _products(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder's products, once each: a fused member's shared linear, else the linear itself."""
    seen: dict[int, torch.nn.Module] = {}
    for layer in model.model.layers:
        att, mlp = layer.self_attn, layer.mlp
        for m in (att.q_proj, att.k_proj, att.v_proj, att.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
            m = m.shared.linear if isinstance(m, FusedPart) else m
            seen.setdefault(id(m), m)
    return list(seen.values())


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
            return "linears not int8 (the lean path is for int8 models)"
    if next(model.parameters()).device.type != "cpu":
        return "not on the CPU"
    return None


class LeanSteps(KeptHeads):
    """A decoder's forward over its own KV cache (``max_len`` tokens at most, allocated as needed)."""

    def __init__(self, model: torch.nn.Module, max_len: int, *, invariant: bool = False):
        why = unsupported(model)
        if why is not None:
            raise ValueError(f"the lean decode path does not support this model: {why}")
        cfg, body = model.config, model.model
        self.model, self.max_len = model, max_len
        self.invariant = invariant  # each query attends alone (the target: batch-invariant logits)
        # the small ops between the products as specviz's own (kernels: csrc/glue.cpp), where its library is
        # in use; decided once, so a run's passes, traced or eager, chain or tree, all take the same path
        self.glue = kernels.glue_ready()
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.eps = float(getattr(cfg, "rms_norm_eps", 1e-6))
        self.embed = body.embed_tokens
        self.norm = body.norm.weight.detach().float()
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
        self._cos = self._sin = torch.empty(0, dtype=torch.float32)
        # feed length -> traced _body (one position kept; every position for an invariant target)
        self.traced: dict[int, Callable] = {}
        self.trace_deferred = False  # attach(trace=False) left tracing to later (models.warm)
        # Prompt passes begin with the chat template's fixed head (Qwen's: 24 tokens, about half of a short
        # prompt): fed as a call of its own, its keys and values are kept and copied into later runs' caches (the
        # draft's; and the invariant target's, whose runs' copies share the store: a race feeds the head once).
        self.shared_prefix: tuple[int, ...] = ()  # set at load (models.loading: models.tokens.template_head)
        self._prefix_kv: dict[tuple[int, ...], tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        # where those keys and values are also kept on disk, for the next start (set at load: .prefix_store)
        self.prefix_store: "PrefixStore | None" = None

    def for_run(self, need: int) -> "LeanSteps":
        """The steps a run of ``need`` tokens feeds: these (one cache, one run at a time: the draft), or for
        an invariant target a copy sharing the weights and traced graphs with a cache of its own (a race
        feeds the target from two runs in turn)."""
        if not self.invariant:
            return self
        run = copy.copy(self)
        run.keys, run.values, run.capacity, run.length, run.in_use = [], [], 0, 0, False
        run._reserve(min(need, self.max_len))
        return run

    @property
    def runs_apart(self) -> bool:
        """Whether runs can be alive at once, each on its own cache (:meth:`for_run`): an invariant target's can,
        so a race interleaves its two runs (hardware.load.race_can_interleave asks)."""
        return self.invariant

    @property
    def takes_trees(self) -> bool:
        """Whether a run feeding token trees can use these steps (:func:`.compiled.static_lm` asks)."""
        return self.invariant

    def lm(self, device: torch.device):
        """A run's LM over these steps (:func:`.compiled.static_lm` asks): :class:`.lean_tree.LeanLM`."""
        from .lean_tree import LeanLM

        return LeanLM(self, device)

    @property
    def head(self) -> torch.nn.Module:
        """The model's output head as it is now: applied after the decoder (and outside the traced
        graphs), so a head swapped on the model (:mod:`.draft_vocab`'s reduced one) takes effect at once."""
        return self.model.get_output_embeddings()

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
            # float32 said, not torch's default dtype: that is process-wide, and transformers' from_pretrained
            # sets it to the checkpoint's (bf16) while it loads -- in any thread, beside a run in this one
            k, v = torch.zeros(shape, dtype=torch.float32), torch.zeros(shape, dtype=torch.float32)
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
        """Drop the cache's memory (the next run allocates again); the kept prompt heads stay (the same bits)."""
        self.keys, self.values, self.capacity, self.length = [], [], 0, 0

    # -- the forward ------------------------------------------------------------------------------

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.glue:
            return torch.ops.specviz.glue_rms(x.contiguous(), weight, self.eps)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * weight

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def _decode(self, tokens: torch.Tensor, pos: torch.Tensor, keep: int, cos_table: torch.Tensor,
                sin_table: torch.Tensor, *cache: torch.Tensor, hidden: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The logits of the last ``keep`` of ``tokens`` (:meth:`_body`) and their final normed hidden states."""
        h = self._body(tokens, pos, keep, cos_table, sin_table, *cache)
        return self.head(h).float(), h

    def _body(self, tokens: torch.Tensor, pos: torch.Tensor, keep: int, cos_table: torch.Tensor,
              sin_table: torch.Tensor, *cache: torch.Tensor) -> torch.Tensor:
        """The decoder over ``tokens`` ([T] ids at cache slots ``pos``, [T] consecutive), with RoPE's
        tables ([cap, d]): writes their keys and values into ``cache`` (every layer's keys, then every
        layer's values: [1, kvh, cap, d]) and returns the final normed hidden states of the last ``keep``.
        Attention runs over the whole capacity, masked to the slots at or before each query (later slots
        may hold a rolled-back draft): no shape here depends on the cache's length, so one trace serves
        every step."""
        n = len(self.layers)
        if self.glue:  # each query sees slots 0 .. its own
            x = self._layers(tokens, pos, pos, cos_table, sin_table, cache[:n], cache[n:], None,
                             visible=(torch.empty(0, dtype=torch.long), pos + 1))
            return self._rms(x[x.shape[0] - keep:], self.norm)
        mask = torch.arange(cache[0].shape[2])[None, :] <= pos[:, None]  # [T, cap]

        def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
            if not self.invariant:
                return F.scaled_dot_product_attention(q[None], keys, values, attn_mask=mask, scale=self.scaling,
                                                      enable_gqa=True)
            return torch.cat([self._attend_one(q, j, keys, values, mask[j:j + 1]) for j in range(q.shape[1])], dim=2)

        x = self._layers(tokens, pos, pos, cos_table, sin_table, cache[:n], cache[n:], attend)
        return self._rms(x[x.shape[0] - keep:], self.norm)

    def _attend_one(self, q: torch.Tensor, j: int, keys: torch.Tensor, values: torch.Tensor,
                    mask: torch.Tensor) -> torch.Tensor:
        """Query ``j`` alone ([1, nh, 1, d]): the call a one-token step makes at its position, whatever else
        is in the pass (the invariant target's attention)."""
        return F.scaled_dot_product_attention(q[None, :, j:j + 1], keys, values, attn_mask=mask, scale=self.scaling,
                                              enable_gqa=True)

    def _layers(self, tokens: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor, cos_table: torch.Tensor,
                sin_table: torch.Tensor, keys: tuple, values: tuple, attend: Callable | None,
                visible: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Every decoder layer over ``tokens`` at RoPE positions ``pos``, their keys and values written at
        cache ``slots``; ``attend(q [nh, T, d], keys, values)`` -> [1, nh, T, d] (torch's ops), or with
        :attr:`glue` ``visible`` = (the slots each query sees [T, L] in order, or empty for slots 0..;
        how many [T]) instead.  The residual stream [T, H]."""
        t = tokens.shape[0]
        x = self.embed.weight.index_select(0, tokens).float()  # [T, H]
        if self.glue:
            return self._glued(x, pos, slots, cos_table, sin_table, keys, values, *visible)
        cos, sin = cos_table.index_select(0, pos)[None], sin_table.index_select(0, pos)[None]  # [1, T, d]
        for i, layer in enumerate(self.layers):
            qkv = layer.qkv(self._rms(x, layer.norm_in))
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q = self._rope(q.view(t, self.heads, self.head_dim).transpose(0, 1), cos, sin)
            k = self._rope(k.view(t, self.kv_heads, self.head_dim).transpose(0, 1), cos, sin)
            keys[i].index_copy_(2, slots, k[None])
            values[i].index_copy_(2, slots, v.view(t, self.kv_heads, self.head_dim).transpose(0, 1)[None])
            att = attend(q, keys[i], values[i])
            x = x + layer.o(att[0].transpose(0, 1).reshape(t, self.q_size))
            gate, up = layer.gate_up(self._rms(x, layer.norm_post)).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
        return x

    def _glued(self, x: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor, cos_table: torch.Tensor,
               sin_table: torch.Tensor, keys: tuple, values: tuple, vis: torch.Tensor,
               lens: torch.Tensor) -> torch.Tensor:
        """:meth:`_layers` with the small ops in four calls a layer (csrc/glue.cpp): the residual add and the
        next norm in one, RoPE, the cache write and attention in one, SiLU(gate) * up in one."""
        ops, eps, n = torch.ops.specviz, self.eps, len(self.layers)
        h = ops.glue_rms(x, self.layers[0].norm_in, eps)
        for i, layer in enumerate(self.layers):
            att = ops.glue_attend(layer.qkv(h), cos_table, sin_table, pos, keys[i], values[i], slots, vis, lens,
                                  self.heads, self.kv_heads, self.scaling)
            x, h = ops.glue_add_rms(x, layer.o(att), layer.norm_post, eps)
            out = layer.down(ops.glue_silu_mul(layer.gate_up(h)))
            if i + 1 < n:
                x, h = ops.glue_add_rms(x, out, self.layers[i + 1].norm_in, eps)
            else:
                x = x + out
        return x

    # -- traced steps -------------------------------------------------------------------------------

    def trace(self, feeds: tuple[int, ...] | None = None) -> float:
        """Record :meth:`_body` for feeds of each length in ``feeds`` (default :attr:`feeds`; keeping one
        position, or every position for an invariant target) as a TorchScript graph: the same ops and kernels, run without Python between them.  On a 2-core
        CPU the draft's one-token step is ~25 ms of int8 kernels and ~1,000 small ops whose Python
        dispatch cost ~15 ms more; the graph runs them back to back.  Returns the seconds it took
        (~0.5 s a length); on any failure the eager path stays (logged)."""
        t0 = time.perf_counter()
        feeds = feeds or self.feeds
        self.trace_deferred = False
        why = unsupported(self.model)  # every linear int8 or Q4_K, fused or not: ops a trace records
        if why is not None:
            log.info("The %s's step is not traced: %s", self.role, why)
            return 0.0
        try:
            # A cache a run allocated under inference_mode cannot be written by the tracer: start afresh
            # (the steps are not in use; the next run reserves its own).
            self.release()
            self._reserve(max(feeds))
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for t in feeds:
                    args = (torch.zeros(t, dtype=torch.long), torch.arange(t), self._cos, self._sin, *self.keys,
                            *self.values)
                    holder = _Holder(self, keep=t if self.invariant else 1)
                    self.traced[t] = torch.jit.trace(holder, args, check_trace=False)
            self.release()
        except Exception as exc:  # noqa: BLE001 -- tracing is an optimisation; the eager path is correct
            for t in feeds:  # in place: runs' copies of the steps share this dict
                self.traced.pop(t, None)
            log.warning("Tracing the %s's step failed (%s); it runs eagerly", self.role, exc)
            return 0.0
        seconds = time.perf_counter() - t0
        log.info("Traced the %s's %s-token steps in %.1f s", self.role, "/".join(map(str, feeds)), seconds)
        return seconds

    @property
    def feeds(self) -> tuple[int, ...]:
        """The feed lengths traced: a step and verify passes up to γ = 8 (the target), or a step and a step
        after a round that kept every draft (the draft)."""
        return TARGET_FEEDS if self.invariant else TRACED_FEEDS

    @property
    def role(self) -> str:
        return "target" if self.invariant else "draft"

    @torch.inference_mode()
    def forward(self, ids: list[int], keep: int, hidden: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed ``ids`` after the cache's ``length`` tokens; the logits (and final normed hidden states,
        if asked) of the last ``keep`` of them."""
        shared = self.shared_prefix
        if (self.length == 0 and shared and len(ids) >= len(shared) + keep
                and tuple(ids[:len(shared)]) == shared):
            self._fill_prefix(shared)
            ids = ids[len(shared):]
        start, t = self.length, len(ids)
        if start + t > self.max_len:
            raise RuntimeError(f"the lean KV cache holds {self.max_len} tokens; this run needs more")
        self._reserve(start + t)
        tokens, pos = torch.tensor(ids, dtype=torch.long), torch.arange(start, start + t)
        graph = self.traced.get(t) if keep == 1 or self.invariant else None
        if graph is not None:  # the graph gives the hidden states; the head (swappable) runs after it
            # Unoptimized: TorchScript's profiling executor otherwise spends each graph's first two calls
            # profiling and optimizing it (the target's: ~450 and ~650 ms against ~100 ms, in a visitor's first
            # runs and in the probe's timings), for no faster steady state here (measured: 99 ms a step either way).
            with torch.jit.optimized_execution(False):
                h = graph(tokens, pos, self._cos, self._sin, *self.keys, *self.values)
            h = h[h.shape[0] - keep:]  # an invariant target's graph keeps every position, a draft's its last
            logits = self.head(h).float()
        else:
            logits, h = self._decode(tokens, pos, keep, self._cos, self._sin, *self.keys, *self.values,
                                    hidden=hidden)
        self.length = start + t
        return logits, (h if hidden else None)

    def feed(self, new: list[int], keep: int, hidden: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`.compiled.CompiledSteps.feed`'s contract: ``new`` after the cache's contents."""
        return self.forward(new, keep, hidden)


class _Holder(torch.nn.Module):
    """What :func:`torch.jit.trace` records: :meth:`LeanSteps._body` keeping ``keep`` positions (the head
    runs after the graph).  The tracer takes fbgemm's packed weights only from attributes of the
    traced module, so they are listed here."""

    def __init__(self, steps: LeanSteps, keep: int = 1):
        super().__init__()
        self.steps = [steps]  # a list: not a submodule (the steps are not an nn.Module)
        self.keep = keep
        for n, linear in enumerate(_products(steps.model)):
            if isinstance(linear, TokenInt8Linear):  # a Q4_K product's records are plain tensors: none to pack
                linear.pack()
                setattr(self, f"packed_{n}", linear._packed)

    def forward(self, tokens: torch.Tensor, pos: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor,
                *cache: torch.Tensor) -> torch.Tensor:
        return self.steps[0]._body(tokens, pos, self.keep, cos_table, sin_table, *cache)


def attach(model: torch.nn.Module, max_len: int | None = None, *, trace: bool = True,
           invariant: bool = False) -> LeanSteps | None:
    """Give ``model`` the lean decode path (:func:`specviz.core.kv.cached_lm` then uses it for chains) when
    it supports it; returns the steps, or None (logged) when it does not.  ``trace``: also record its
    short feeds as TorchScript graphs (:meth:`LeanSteps.trace`); without, they run eagerly
    until something traces them (:mod:`.warm`, once the weights are packed: a trace holds fbgemm's).
    ``invariant``: the target's batch-invariant attention (see the module's docstring)."""
    why = unsupported(model)
    if why is not None:
        log.info("The lean decode path is off for %s: %s", type(model).__name__, why)
        return None
    cap = max_len or int(getattr(model.config, "max_position_embeddings", 0) or 32768)
    steps = LeanSteps(model, cap, invariant=invariant)
    if trace:
        steps.trace()
    else:
        steps.trace_deferred = True
    give_steps(model, steps)
    return steps
