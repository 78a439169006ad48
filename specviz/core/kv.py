"""A causal LM together with its KV cache: feed new tokens, crop back, free.

Both the target (verify passes) and the draft model (draft steps) keep a cache
holding a prefix of the sequence being decoded.  Each call feeds only the tokens
the cache does not hold yet; after a rejection the cache is cropped back to the
accepted prefix, so no token is ever recomputed.

Token trees (specviz.drafters.tree.structure): `feed_tree` appends tree nodes after the linear
prefix, each attending to the prefix, its ancestors and itself through a 4D
additive float mask [1, 1, Q, P+Q] (0 = may attend, the dtype's minimum
elsewhere) with position_ids = P + depth − 1.  transformers 5 passes a 4D mask
through unchanged (masking_utils._preprocess_mask_arguments) and both the eager
and the sdpa attention add a float mask to the scores (a bool mask would be
added as 0/1 by eager attention, hence the float form); flash attention ignores
custom masks and is refused.  `keep_path` then index-selects the accepted
path's slots in every cache layer, so the cache is a plain prefix again.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from transformers import DynamicCache

# SDPA's backends on a GPU wherever a feed hands it a 4D mask (models.compiled's static steps, whose mask spans
# every slot; token trees here).  On an H100 (torch 2.11, CUDA 13.0) SDPA then chose cuDNN's attention, whose
# one-token steps were not repeatable: a random 1.5B target's greedy standard decoding with CUDA graphs, four
# runs in one process, parted at tokens 62, 65, 65 (39, 39, 39 with cuDNN alone); deterministic cuBLAS changed
# nothing.  With the memory-efficient kernel (or math) all four were equal, and so were two speculative runs; a
# step cost 4.80 ms against cuDNN's 4.46 (math: 5.59).  A run's tokens must not depend on when it ran (the race
# against the separate runs, a replay against a live run).
CUDA_ATTENTION: tuple[str, ...] = ("EFFICIENT_ATTENTION", "MATH")
# A long prompt's pass is fed at most this many tokens at a time (SPECVIZ_PROMPT_CHUNK), with a stop check before
# each chunk, so a run's Stop, its time budget or a closed page ends it within one chunk and the next visitor waits
# at most that long.  A prompt of up to one chunk (every shipped example) is fed whole, as before.
PROMPT_CHUNK = 128
FIRST_CHUNK = 32  # a long prompt's first chunk, which measures this machine's rate for the next ones
CHUNK_SECONDS = 1.0  # what a later chunk should take: a Stop, the time limit or a closed page lands within about it


class PromptStopped(Exception):
    """The prompt's pass was stopped between two chunks (the run's Stop, its time budget, a closed page)."""


def prompt_chunk() -> int:
    try:
        return max(8, int(os.environ.get("SPECVIZ_PROMPT_CHUNK", PROMPT_CHUNK)))
    except ValueError:
        return PROMPT_CHUNK


def feed_prompt(lm: Any, ids: list[int], should_stop: Callable[[], bool] | None, leave: int = 1) -> None:
    """Feed ``ids`` but its last ``leave`` tokens in chunks, checking ``should_stop`` before each, until at most one
    chunk is left uncached (the caller's own pass feeds it, with ``leave``); PromptStopped when told to stop.
    Nothing is fed for a prompt of one :func:`prompt_chunk` or less.

    Chunks are sized by time, not only by tokens: the first is FIRST_CHUNK tokens, each next one what this machine
    feeds in about CHUNK_SECONDS at the rate just measured (at most :func:`prompt_chunk`, at least 8), so a stop
    lands within about that long on a fast machine and on a loaded one alike (a 128-token chunk of the 1.5B target
    took 7.5 s on a 2-core EPYC under load)."""
    end, most = len(ids) - leave, prompt_chunk()
    if end - lm.cached <= most:
        return
    chunk = min(FIRST_CHUNK, most)
    while end - lm.cached > chunk:
        if should_stop is not None and should_stop():
            raise PromptStopped
        t0 = time.perf_counter()
        lm.feed(ids[: lm.cached + chunk])
        per_token = max(time.perf_counter() - t0, 1e-6) / chunk
        chunk = max(8, min(most, int(CHUNK_SECONDS / per_token)))
    if should_stop is not None and should_stop():
        raise PromptStopped


def repeatable_attention(device: torch.device) -> contextlib.AbstractContextManager:
    """The context a masked forward runs in: on a GPU, SDPA held to :data:`CUDA_ATTENTION` (elsewhere nothing)."""
    if torch.device(device).type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, name) for name in CUDA_ATTENTION])


@dataclass
class Fed:
    """What one forward pass returns: logits (and, if asked, last-layer hidden states)
    for the last k fed positions."""

    logits: torch.Tensor  # [k, V]
    hidden: torch.Tensor | None = None  # [k, H], the final (normed) hidden state


def add_tree_nodes(lm: Any, ids: list[int], parents: list[int]) -> tuple[list[int], int, int]:
    """The bookkeeping every ``feed_tree`` shares (``lm``: its ``cached``, ``tree_parents``, ``tree_depths``):
    record the new nodes' parents and depths; returns (the uncached suffix of ``ids``, len(ids), how many
    tree nodes the cache held before)."""
    suffix = ids[lm.cached :]
    if lm.tree_parents:
        assert not suffix, "the prefix must be complete before the tree grows"
    base, first = len(ids), len(lm.tree_parents)
    for par in parents:
        assert -1 <= par < len(lm.tree_parents), "a node's parent must be fed before it"
        lm.tree_parents.append(par)
        lm.tree_depths.append(1 if par < 0 else lm.tree_depths[par] + 1)
    return suffix, base, first


class CachedLM:
    """A causal LM plus a KV cache holding the first `cached` tokens of a sequence."""

    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.model = model
        self.device = device
        self.cache = DynamicCache()
        self.cached = 0
        self.tree_parents: list[int] = []  # tree nodes after the prefix, in cache order (-1 = the prefix's end)
        self.tree_depths: list[int] = []

    def feed(self, ids: list[int], keep: int = 1, hidden: bool = False) -> Fed:
        """Feed ids[cached:]; return the outputs of the last `keep` positions.

        hidden=True also returns the last layer's hidden states (a learned draft
        head reads them); it is off by default because it costs memory traffic."""
        new = ids[self.cached :]
        assert new, "nothing new to feed"
        assert not self.tree_parents, "the cache holds a tree: keep_path first"
        x = torch.tensor([new], dtype=torch.long, device=self.device)
        out = self.model(input_ids=x, past_key_values=self.cache, use_cache=True, logits_to_keep=keep,
                         output_hidden_states=hidden)
        self.cached = len(ids)
        h = out.hidden_states[-1][0, -keep:] if hidden else None
        return Fed(out.logits[0, -keep:], h)

    def prefill(self, ids: list[int], hidden: bool = False) -> torch.Tensor | None:
        """Fill the cache with all but the last token (the next feed gives its logits).

        hidden=True returns the last hidden state of the prefix (the one that predicted
        ids[-1]), so a learned draft head can draft in the very first round."""
        if len(ids) > 1:
            fed = self.feed(ids[:-1], hidden=hidden)
            return fed.hidden[-1] if hidden else None
        return None

    def feed_tree(self, ids: list[int], tokens: list[int], parents: list[int]) -> Fed:
        """Feed ids[cached:] (causally) and then tree nodes under the end of ids.

        parents[i] indexes the tree nodes in this cache (those of earlier feed_tree
        calls since the last keep_path, then these), -1 for a child of ids[-1].
        Returns logits for ids[-1] if it was not cached yet, then one row per new node."""
        suffix, base, first = add_tree_nodes(self, ids, parents)
        past = self.cached + first  # slots already in the cache
        q = len(suffix) + len(tokens)
        emb = self.model.get_input_embeddings()  # its output's dtype: an int8 model's half-precision table reads out fp32
        dtype = getattr(emb, "out_dtype", emb.weight.dtype)
        if getattr(self.model.config, "_attn_implementation", "sdpa") not in ("sdpa", "eager", "specviz_invariant"):
            raise RuntimeError("token trees need eager or sdpa attention (a 4D float mask)")
        mask = torch.full((q, past + q), torch.finfo(dtype).min, dtype=dtype, device=self.device)
        mask[:, : self.cached] = 0.0  # the cached prefix is visible to every new token
        s = len(suffix)
        causal = torch.ones(s, s, dtype=torch.bool, device=self.device).tril()
        mask[:s, self.cached : self.cached + s].masked_fill_(causal, 0.0)
        rows, cols = [], []
        for k in range(len(tokens)):
            node = first + k
            while node >= 0:  # itself and its ancestors
                rows.append(s + k)
                cols.append(self.cached + s + node)
                node = self.tree_parents[node]
        if tokens:
            mask[s:, self.cached : self.cached + s] = 0.0  # the uncached part of the prefix
            mask[rows, cols] = 0.0
        pos = list(range(self.cached, base)) + [base - 1 + self.tree_depths[first + k] for k in range(len(tokens))]
        with repeatable_attention(self.device):
            out = self.model(input_ids=torch.tensor([suffix + tokens], dtype=torch.long, device=self.device),
                             attention_mask=mask[None, None],
                             position_ids=torch.tensor([pos], dtype=torch.long, device=self.device),
                             past_key_values=self.cache, use_cache=True, logits_to_keep=len(tokens) + (1 if s else 0))
        self.cached = base
        return Fed(out.logits[0])

    def keep_path(self, nodes: list[int]) -> None:
        """Keep the prefix and the given tree nodes (a root-to-node path, in order) in
        every cache layer; the cache then holds prefix + path as plain tokens."""
        slots = list(range(self.cached)) + [self.cached + n for n in nodes]
        total = self.cached + len(self.tree_parents)
        if len(slots) < total:
            idx = torch.tensor(slots, dtype=torch.long, device=self.device)
            for layer in self.cache.layers:
                if getattr(layer, "is_sliding", False):
                    raise RuntimeError("token trees need a full (not sliding-window) KV cache")
                if layer.is_initialized and layer.keys.numel():
                    layer.keys = layer.keys.index_select(-2, idx)
                    layer.values = layer.values.index_select(-2, idx)
        self.cached = len(slots)
        self.tree_parents, self.tree_depths = [], []

    def crop(self, n: int) -> None:
        """Keep only the first n tokens in the cache."""
        if self.tree_parents:  # drop the tree first: then the cache is a plain prefix
            self.keep_path([])
        if self.cached > n:
            self.cache.crop(-(self.cached - n))  # transformers 5: a negative count of tokens to drop
            self.cached = n

    def free(self) -> None:
        self.cache = DynamicCache()
        self.cached = 0
        self.tree_parents, self.tree_depths = [], []


# Other ways to hold a model's KV cache, registered by the backends that provide them (the algorithm
# imports no backend): each is asked (model, device, need) and returns an object with CachedLM's
# interface, or None when it has nothing for this model and run.
_BACKENDS: list[Callable[..., Any]] = []  # (model, device, need[, trees=True]) -> an LM or None


def register_backend(lm_for: Callable[[torch.nn.Module, torch.device, "int | None"], Any]) -> None:
    """Let cached_lm ask ``lm_for`` first (once per function, however often it is registered)."""
    if lm_for not in _BACKENDS:
        _BACKENDS.append(lm_for)


def cached_lm(model: torch.nn.Module, device: torch.device, need: int | None = None, *, trees: bool = False):
    """The model with a KV cache for one run: a registered backend's when it has one for this model
    and run (compiled steps over a static cache, :mod:`specviz.models.compiled`, when the loader gave
    the model some, they are free and the run's ``need`` tokens fit; the int8 target's lean steps,
    :mod:`specviz.models.lean`); otherwise a :class:`CachedLM` (eager, dynamic cache).  ``trees``: the
    run feeds token trees (feed_tree, keep_path), which a backend must support to be asked."""
    for lm_for in _BACKENDS:
        lm = lm_for(model, device, need, trees=trees) if trees else lm_for(model, device, need)
        if lm is not None:
            return lm
    return CachedLM(model, device)
