"""Compiled steps over a static KV cache (the GPU path; gpt-fast's recipe in transformers' terms).

On a GPU, small models in eager PyTorch are launch-bound: a 0.5B draft step launches ~400 kernels
and costs nearly what a 1.5B target step does, so the cost ratio c approaches 1.  Capturing the
step in a CUDA graph removes the launches, and a graph needs fixed addresses and shapes: the KV
cache must be preallocated (transformers' ``StaticCache``) and each feed length its own graph.

:class:`CompiledSteps` belongs to one model: one static cache (one run at a time: the service runs
model jobs one after the other) and a compiled forward per *bucket* of new-token counts (1, 2, 4,
8, 16, 32).  A feed of k new tokens runs the graph of the smallest bucket ≥ k, padded with copies
of its last token: the pads sit after the real tokens, so causal attention keeps them out of every
real position, their KV slots lie past the cache's length and are overwritten by the next feed.
Longer feeds (the prompt) and feeds that ask for hidden states run the same model eagerly into the
same static cache.  Rolling back is setting the cache's length: nothing is copied.

:class:`StaticLM` is :class:`specviz.core.kv.CachedLM`'s interface (feed, prefill, crop, free) over it;
``kv.cached_lm`` hands one out when the model has compiled steps and the run fits the cache.
Token trees need a custom 4D mask and index-selected caches: they stay on the eager path.

Off the GPU the same classes run with ``compile=False`` (a static cache, eager steps), which is how
the CPU tests check that padding, rollback and the engine's exactness hold on this path.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch

log = logging.getLogger("specviz.models")

BUCKETS = (1, 2, 4, 8, 16, 32)


def bucket_for(k: int, buckets: tuple[int, ...] = BUCKETS) -> int | None:
    """The smallest bucket holding k new tokens, or None when k is longer than every bucket."""
    return next((b for b in buckets if b >= k), None)


class CompiledSteps:
    """One model's static KV cache and its compiled forwards, one per bucket of feed lengths."""

    def __init__(self, model: torch.nn.Module, max_len: int, *, compile: bool = True,
                 mode: str = "reduce-overhead", buckets: tuple[int, ...] = BUCKETS):
        from transformers import StaticCache

        self.model = model
        self.max_len = int(max_len)
        self.buckets = tuple(sorted(buckets))
        self.compiled = bool(compile)
        self.mode = mode if compile else "eager"
        self.cache = StaticCache(config=model.config, max_cache_len=self.max_len)
        self.length = 0  # tokens the cache holds
        self._held = -1  # what the layers' length tensors say (a padded graph leaves them past `length`)
        self.in_use = False
        device = next(model.parameters()).device
        # Allocate the cache now (its first update would otherwise happen inside a compiled graph).
        with torch.inference_mode():
            model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device), past_key_values=self.cache,
                  use_cache=True, logits_to_keep=1)
        self._held = 1
        self.set_length(0)
        self._forward: Callable[[torch.Tensor], torch.Tensor] = self._eager_logits
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        if compile and mode != "graph":
            import torch._dynamo.config as dynamo_config

            for name in ("recompile_limit", "cache_size_limit"):  # one graph per bucket, and a few spare
                if hasattr(dynamo_config, name):
                    setattr(dynamo_config, name, max(getattr(dynamo_config, name), 4 * len(self.buckets)))
            self._forward = torch.compile(self._eager_logits, mode=mode, fullgraph=True, dynamic=False)
        elif compile:  # "graph": the eager forward captured as one CUDA graph per bucket (no inductor)
            self._forward = self._replay

    def _eager_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self._run(input_ids).logits

    def _run(self, input_ids: torch.Tensor, **extra: Any) -> Any:
        """The model's forward over ``input_ids`` after the cache's contents, with its own positions and mask, in
        the attention a masked GPU feed needs (core.kv.repeatable_attention)."""
        from ..core import kv  # here: importing this module pulls in no transformers

        with kv.repeatable_attention(input_ids.device):
            return self.model(input_ids=input_ids, past_key_values=self.cache, use_cache=True,
                              **self._where(input_ids.shape[1]), **extra)

    def _where(self, size: int) -> dict[str, torch.Tensor]:
        """The feed's positions and its 4D attention mask (slot j visible to new token i iff j <= its
        position), computed on the device from the cache's own length tensor, so a captured graph reads
        the length at each replay.  Left to transformers, both came out of Python-side decisions taken
        once at capture: transformers 5.17 skips the mask for a one-token feed (``q_length == 1``) or at
        offset 0, and a static cache's mask spans all its ``max_len`` slots, so a replayed step attended
        to slots past the cache's length (first seen on the H100: the CUDA-graph steps left the dynamic
        cache's logits from the second feed on)."""
        length = self.cache.layers[0].cumulative_length
        device = length.device
        positions = torch.arange(size, device=device) + length
        visible = torch.arange(self.max_len, device=device)[None, :] <= positions[:, None]
        return {"position_ids": positions[None], "attention_mask": visible[None, None]}

    def _capture(self, size: int) -> tuple:
        """Record the forward over ``size`` tokens as a CUDA graph (inputs and outputs at fixed addresses).
        Captured when a run first feeds ``size`` tokens (unless warm_up did it before): the warm-ups and the
        capture are scratch passes (:meth:`scratch`), so the run's cache is as it was."""
        device = next(self.model.parameters()).device
        static_in = torch.zeros(1, size, dtype=torch.long, device=device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up runs on a side stream, as CUDA graph capture requires
                self.scratch(self._eager_logits, static_in)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        static_out = self.scratch(lambda ids: self._record(graph, ids), static_in)
        return graph, static_in, static_out

    def _record(self, graph: "torch.cuda.CUDAGraph", input_ids: torch.Tensor) -> torch.Tensor:
        with torch.cuda.graph(graph):
            return self._eager_logits(input_ids)

    def scratch(self, forward: Callable[[torch.Tensor], torch.Tensor], input_ids: torch.Tensor) -> torch.Tensor:
        """Run ``forward`` over ``input_ids`` where a capture or a warm-up needs a pass, leaving the cache as
        it was: the pass writes its keys and values into the slots past the cache's length (free: the next
        feed overwrites them), and the length is put back.  (Resetting the cache to 0 here, as before, wiped
        the run's cache whenever a run met a feed length with no graph yet: its replay then attended to
        nothing it had fed, first seen on the H100.)"""
        n = self.length
        if n + input_ids.shape[1] > self.max_len:
            raise RuntimeError(f"the static KV cache holds {self.max_len} tokens; a pass of {input_ids.shape[1]} "
                               f"after {n} does not fit")
        self._held = -1
        self.set_length(n)
        try:
            return forward(input_ids)
        finally:
            self._held = -1
            self.set_length(n)

    def _replay(self, input_ids: torch.Tensor) -> torch.Tensor:
        size = input_ids.shape[1]
        if size not in self._graphs:
            self._graphs[size] = self._capture(size)
        graph, static_in, static_out = self._graphs[size]
        static_in.copy_(input_ids)
        graph.replay()
        return static_out

    def set_length(self, n: int) -> None:
        """Make the cache hold its first n tokens (in place: compiled graphs keep the addresses).
        Writes the layers' length tensors only when they say otherwise (a draft step's steady state
        launches nothing extra)."""
        if n != self._held:
            # The cache was allocated under inference mode (its tensors are inference tensors), and a
            # caller (attach, the GPU report) may set the length outside it: an in-place write to an
            # inference tensor is only allowed inside (first seen on the H100, transformers 5.17).
            with torch.inference_mode():
                for layer in self.cache.layers:
                    length = getattr(layer, "cumulative_length", None)
                    if isinstance(length, torch.Tensor):
                        length.fill_(n)
        self.length = self._held = n

    def warm_up(self, sizes: tuple[int, ...] | None = None) -> None:
        """Compile and capture the graphs of the given buckets now (not in a user's first run)."""
        device = next(self.model.parameters()).device
        with torch.inference_mode():
            for b in sizes or self.buckets:
                for _ in range(3):  # torch.compile's cudagraph trees record on the second or third call
                    self.scratch(self._forward, torch.zeros(1, b, dtype=torch.long, device=device))

    takes_trees = False  # token trees need a custom 4D mask: they stay on the eager cache
    runs_apart = False  # one static cache: two runs cannot both be alive (a race goes one run after the other)

    def for_run(self, need: int) -> "CompiledSteps":
        """The steps a run feeds: these (one static cache, one run at a time)."""
        return self

    def lm(self, device: torch.device) -> "StaticLM":
        """A run's LM over these steps (:func:`static_lm` asks)."""
        return StaticLM(self, device)

    def feed(self, new: list[int], keep: int, hidden: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed ``new`` tokens after the cache's contents; logits (and, if asked, final hidden states)
        of the last ``keep`` of them, as fresh tensors (a graph's outputs are reused by its next replay)."""
        device = next(self.model.parameters()).device
        k, start = len(new), self.length
        if start + k > self.max_len:
            raise RuntimeError(f"the static KV cache holds {self.max_len} tokens; this run needs more")
        size = bucket_for(k, self.buckets)
        if hidden or size is None or start + size > self.max_len:
            out = self._run(torch.tensor([new], dtype=torch.long, device=device), logits_to_keep=keep,
                            output_hidden_states=hidden)
            self._held = start + k
            self.set_length(start + k)
            h = out.hidden_states[-1][0, -keep:] if hidden else None
            return out.logits[0, -keep:], h
        padded = new + [new[-1]] * (size - k)
        logits = self._forward(torch.tensor([padded], dtype=torch.long, device=device))
        self._held = start + size
        self.set_length(start + k)  # the pads' slots lie past the length: the next feed overwrites them
        return logits[0, k - keep:k].clone(), None


class StaticLM:
    """:class:`specviz.core.kv.CachedLM`'s interface over a model's :class:`CompiledSteps`."""

    def __init__(self, steps: CompiledSteps, device: torch.device):
        if steps.in_use:
            raise RuntimeError("this model's static KV cache is in use by another run")
        self.steps = steps
        self.device = device
        self.cached = 0
        self.tree_parents: list[int] = []
        steps.in_use = True
        steps.set_length(0)

    def feed(self, ids: list[int], keep: int = 1, hidden: bool = False):
        from ..core.kv import Fed

        new = ids[self.cached:]
        assert new, "nothing new to feed"
        self.steps.set_length(self.cached)
        logits, h = self.steps.feed(new, keep, hidden)
        self.cached = len(ids)
        return Fed(logits, h)

    def prefill(self, ids: list[int], hidden: bool = False) -> torch.Tensor | None:
        if len(ids) > 1:
            fed = self.feed(ids[:-1], hidden=hidden)
            return fed.hidden[-1] if hidden else None
        return None

    def feed_tree(self, *args, **kwargs):
        raise RuntimeError("token trees run on the eager cache (kv.CachedLM), not on compiled steps")

    def crop(self, n: int) -> None:
        if self.cached > n:
            self.cached = n
            self.steps.set_length(n)

    def free(self) -> None:
        self.cached = 0
        self.steps.set_length(0)
        self.steps.in_use = False


def attach(model: torch.nn.Module, max_len: int, *, compile: bool = True, warm: tuple[int, ...] | None = None,
           mode: str = "reduce-overhead") -> CompiledSteps:
    """Give ``model`` compiled steps over a static cache of ``max_len`` tokens (kv.cached_lm uses them)."""
    steps = CompiledSteps(model, max_len, compile=compile, mode=mode)
    if warm is not None:
        steps.warm_up(warm)
    give_steps(model, steps)
    return steps


def give_steps(model: torch.nn.Module, steps: Any) -> None:
    """Let ``model``'s chain runs use ``steps`` (CompiledSteps or one with its interface, as lean.py's):
    core.kv.cached_lm asks static_lm, registered here, for them."""
    from ..core.kv import register_backend  # here: importing this module pulls in no transformers

    model._specviz_steps = steps
    register_backend(static_lm)


def detach(model: torch.nn.Module) -> None:
    """Drop ``model``'s compiled steps (and with them its static cache and graphs)."""
    if hasattr(model, "_specviz_steps"):
        del model._specviz_steps


def steps_of(model: torch.nn.Module) -> CompiledSteps | None:
    return getattr(model, "_specviz_steps", None)


def static_lm(model: torch.nn.Module, device: torch.device, need: int | None, trees: bool = False) -> StaticLM | None:
    """The model's compiled steps for one run (core.kv.cached_lm asks, once attach registered this):
    when it has some, they are free, the run's ``need`` tokens fit, and they run token trees if it
    feeds some (``trees``: only an invariant target's lean steps take them).  The steps say which cache a
    run gets (``for_run``: lean steps give an invariant target's every run its own) and which LM (``lm``)."""
    steps = steps_of(model)
    if steps is None or need is None or need > steps.max_len:
        return None
    if trees and not steps.takes_trees:
        return None
    run = steps.for_run(need)
    return None if run.in_use else run.lm(device)
