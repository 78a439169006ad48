"""Token trees on an invariant target's lean steps (:mod:`.lean`), and a run's LM over them.

A tree pass feeds nodes that each attend to the prefix, their ancestors and themselves.  For the int8
target every position must score bit for bit as the same tokens fed one by one, so each node's visible
keys and values are gathered into the slots a chain would hold them in (the prefix, then its path), and
its query attends in the very SDPA call a one-token step makes there (:meth:`.lean.LeanSteps._attend_one`).
:class:`LeanLM` is :class:`specviz.core.kv.CachedLM`'s interface (feed, prefill, feed_tree, keep_path,
crop, free) over the steps; ``core.kv.cached_lm`` hands one out for the target's runs, trees included.
"""

from __future__ import annotations

from typing import Any

import torch

from .compiled import StaticLM

# The steps are a .lean.LeanSteps (invariant); this module does not import .lean, which imports it.


@torch.inference_mode()
def forward_tree(steps: Any, tokens: list[int], slots: list[int], positions: list[int],
                 visible: list[list[int]], keep: int) -> torch.Tensor:
    """Token-tree nodes (an invariant target's, eagerly): ``tokens`` written at cache ``slots``, RoPE at
    ``positions``, token i attending to the slots ``visible[i]`` (the prefix, its ancestors and itself,
    in order).  Each query's visible keys are gathered to the slots a chain would hold them in, so its
    attention is the very call a one-token step makes there: a node scores exactly as the same tokens
    fed one by one (tested).  The logits of the last ``keep`` [keep, V]."""
    if not steps.invariant:
        raise RuntimeError("token trees on lean steps are for the invariant target")
    need = max(slots) + 1
    if need > steps.max_len:
        raise RuntimeError(f"the lean KV cache holds {steps.max_len} tokens; this run needs more")
    steps._reserve(need)
    attend, listed = None, None
    if steps.glue:  # each query's visible slots listed, in order (csrc/glue.cpp attends over them)
        width = max(len(v) for v in visible)
        listed = (torch.tensor([v + [0] * (width - len(v)) for v in visible], dtype=torch.long),
                  torch.tensor([len(v) for v in visible], dtype=torch.long))
    else:
        cap = steps.capacity
        gathers = [torch.tensor(v, dtype=torch.long) for v in visible]
        masks = [torch.arange(cap)[None, :] < len(v) for v in visible]

        def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
            rows = []
            for j, (idx, mask) in enumerate(zip(gathers, masks)):
                k, v = torch.zeros_like(keys), torch.zeros_like(values)
                k[:, :, :len(idx)], v[:, :, :len(idx)] = keys.index_select(2, idx), values.index_select(2, idx)
                rows.append(steps._attend_one(q, j, k, v, mask))
            return torch.cat(rows, dim=2)

    x = steps._layers(torch.tensor(tokens, dtype=torch.long), torch.tensor(positions, dtype=torch.long),
                      torch.tensor(slots, dtype=torch.long), steps._cos, steps._sin, steps.keys, steps.values, attend,
                      visible=listed)
    return steps.head(steps._rms(x[x.shape[0] - keep:], steps.norm)).float()


def move(steps: Any, sources: list[int], start: int) -> None:
    """Copy the cache's slots ``sources`` (in order) to ``start``, ``start`` + 1, ... in every layer (a
    tree's accepted path becomes a plain prefix)."""
    idx = torch.tensor(sources, dtype=torch.long)
    for cache in (steps.keys, steps.values):
        for layer in cache:
            layer[:, :, start:start + len(sources)] = layer.index_select(2, idx)


class LeanLM(StaticLM):
    """:class:`specviz.core.kv.CachedLM`'s interface over lean steps, token trees included where the steps
    are an invariant target's (:func:`forward_tree`): tree nodes sit after the prefix at
    ``cached + node``, as in CachedLM, and :meth:`keep_path` moves the accepted path's keys and values
    down to a plain prefix."""

    def __init__(self, steps: Any, device: torch.device):
        super().__init__(steps, device)
        self.tree_depths: list[int] = []

    def feed(self, ids: list[int], keep: int = 1, hidden: bool = False):
        assert not self.tree_parents, "the cache holds a tree: keep_path first"
        return super().feed(ids, keep, hidden)

    def feed_tree(self, ids: list[int], tokens: list[int], parents: list[int]):
        from ..core.kv import Fed, add_tree_nodes

        suffix, base, first = add_tree_nodes(self, ids, parents)
        visible = [list(range(self.cached + j + 1)) for j in range(len(suffix))]
        for k in range(len(tokens)):
            path, node = [], first + k
            while node >= 0:  # itself and its ancestors
                path.append(base + node)
                node = self.tree_parents[node]
            visible.append(list(range(base)) + path[::-1])
        slots = list(range(self.cached, base)) + [base + first + k for k in range(len(tokens))]
        positions = list(range(self.cached, base)) + [base - 1 + self.tree_depths[first + k] for k in range(len(tokens))]
        logits = forward_tree(self.steps, suffix + tokens, slots, positions, visible, len(tokens) + (1 if suffix else 0))
        self.cached = base
        self.steps.set_length(base + len(self.tree_parents))
        return Fed(logits)

    def keep_path(self, nodes: list[int]) -> None:
        if nodes:
            move(self.steps, [self.cached + n for n in nodes], self.cached)
        self.cached += len(nodes)
        self.tree_parents, self.tree_depths = [], []
        self.steps.set_length(self.cached)

    def crop(self, n: int) -> None:
        if self.tree_parents:
            self.keep_path([])
        super().crop(n)

    def free(self) -> None:
        self.tree_parents, self.tree_depths = [], []
        super().free()
