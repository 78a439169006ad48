"""γ and ε sweeps on the real models: plain generators of results, no UI.

A speedup here is what the race and the shoot-out call one: speculative tokens/s ÷ standard
tokens/s, each over the whole run (the prompt pass included), and every timed run is warm (see
`warm_up`).  The γ sweep's theory is Thm 3.8 with c and the verify factor v measured against the
baseline's standard step (specviz.theory.costs), beside the textbook value.

Every configuration and the standard baseline run `repeats` times, round-robin, and a point is the
median of its repeats with their range (specviz.experiments.repeats).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Callable, Iterable, Iterator

from ..core.engine import speculative_decode, standard_decode
from ..core.settings import DecodeSettings
from ..drafters import make_drafter
from ..serving.service import Request, probe_prices
from ..theory.costs import race_costs
from .repeats import REPEATS, combine, noisy, round_robin

log = logging.getLogger("specviz.sweeps")
GAMMAS = tuple(range(1, 13))
EPSILONS = (0.0, 0.05, 0.1, 0.2, 0.4, 0.8, 1.0)
WARMUP_TOKENS = 4  # per warm-up decode: enough to run each kind of pass once
WARMING_UP = "warming up the models first, untimed…"


def warm_up(req: Request, speculative: Iterable[DecodeSettings] | None = None) -> None:
    """Run standard decoding and each given speculative configuration (default: the request's
    settings) for a few tokens, untimed, before anything is timed.

    The first decodes after a pair loads pay one-time costs (first touches of the weights, kernels
    prepared for new shapes, memory the allocator has not reserved yet).  The γ sweep recorded on
    2026-11-23 timed its standard baseline first thing after loading: 3.17 tok/s, against 4.58 for
    the shoot-out's standard run at the end of the same recording, so every γ measured above
    Thm 3.8 (2.29× against 1.61× at γ = 1; 7.27 ÷ 4.58 = 1.59×).  A configuration that cannot run
    is left to its timed run to report."""
    for s in [None, *(speculative if speculative is not None else [req.settings])]:
        base = req.settings if s is None else s
        short = replace(base, max_new_tokens=min(WARMUP_TOKENS, base.max_new_tokens))
        try:
            if s is None:
                standard_decode(req.pair, req.prompt_ids, short, prompt=req.prompt)
            else:
                speculative_decode(req.pair, req.prompt_ids, short, prompt=req.prompt, drafter=make_drafter(req.pair, short))
        except Exception as exc:  # noqa: BLE001 -- the timed run says why, where the user sees it
            if s is None:
                raise
            log.info("warm-up of %s skipped: %s", s.drafter, exc)


def edit_distance(a: list[int], b: list[int]) -> int:
    """Levenshtein distance between two token sequences."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token, or None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _repeat(r: int, repeats: int) -> str:
    return f" (repeat {r + 1}/{repeats})" if repeats > 1 else ""


STANDARD = None  # the key of the standard run among a sweep's round-robin keys
GAMMA_TIMED = ("tokens_per_s", "speedup", "c", "v", "theoretical_speedup")  # medians over the repeats
SPREAD = ("tokens_per_s", "speedup")  # and these with their range (key_lo, key_hi)


def gamma_sweep(req: Request, gammas=GAMMAS, should_stop: Callable[[], bool] = lambda: False,
                repeats: int = REPEATS) -> Iterator[tuple[float, str, list[dict[str, Any]] | None]]:
    """Yields (fraction done, message, the points so far or None).  The first point is the standard
    run (gamma 0), then one per γ with the measured speedup.

    Each configuration runs `repeats` times, round-robin (specviz.experiments.repeats): standard
    decoding, then every γ, then all again; each repeat's speedup is divided by its own round's
    standard run, and a point is the median of its repeats with their range (speedup_lo/hi,
    tokens_per_s_lo/hi), `repeats` and `noisy` (repeats whose timings were flagged).  The points
    are yielded again after every run, with the repeats they have so far.

    `should_stop` (the sweep's time budget) ends the decode in progress at a round boundary and the
    sweep with it: a run cut short is not counted, and the points keep the repeats they finished."""
    keys: list[int | None] = [STANDARD, *gammas]
    reps: dict[int | None, list[dict[str, Any]]] = {k: [] for k in keys}
    flags: dict[int | None, list[bool]] = {k: [] for k in keys}
    stds: dict[int, Any] = {}
    prices = probe_prices(req.pair)
    n = len(keys) * repeats

    def points() -> list[dict[str, Any]]:
        return [combine(reps[k], GAMMA_TIMED, SPREAD, flags[k]) for k in keys if reps[k]]

    yield 0.0, WARMING_UP, None
    warm_up(req)
    for i, (r, g) in enumerate(round_robin(keys, repeats, should_stop), 1):
        rep = _repeat(r, repeats)
        if g is STANDARD:
            yield (i - 1) / n, f"standard decoding (baseline){rep}…", None
            std = standard_decode(req.pair, req.prompt_ids, req.settings, prompt=req.prompt, should_stop=should_stop)
            if std.stop_reason == "stopped":
                return
            stds[r] = std
            std_tps = std.summary().tokens_per_s
            reps[g].append({"gamma": 0, "tokens_per_s": std_tps})
            flags[g].append(noisy(None, std, prices))
            yield i / n, f"baseline: {std_tps:.2f} tok/s{rep}", points()
            continue
        s = replace(req.settings, gamma=g)
        tr = speculative_decode(req.pair, req.prompt_ids, s, prompt=req.prompt, drafter=make_drafter(req.pair, s),
                                should_stop=should_stop)
        if tr.stop_reason == "stopped":
            return
        msg, res = _gamma_point(g, tr, stds[r])
        reps[g].append(res)
        flags[g].append(noisy(tr, stds[r], prices))
        yield i / n, msg + rep, points()


def _gamma_point(g: int, tr: Any, std: Any) -> tuple[str, dict[str, Any]]:
    """One γ's row: measured speedup, α, c and v per standard step (specviz.theory.costs), and Thm 3.8
    with the measured v (the textbook value follows from α, c and γ with v = 1)."""
    rc = race_costs(tr, std)
    res = {"gamma": g, "tokens_per_s": tr.summary().tokens_per_s, "speedup": rc.measured, "alpha": rc.alpha,
           "c": rc.c, "v": rc.v, "theoretical_speedup": rc.with_verify}
    return f"γ = {g}: {rc.measured or 0:.2f}×", res


def epsilon_sweep(req: Request, epsilons=EPSILONS, should_stop: Callable[[], bool] = lambda: False,
                  repeats: int = REPEATS) -> Iterator[tuple[float, str, list[dict[str, Any]] | None]]:
    """Yields (fraction done, message, the points so far or None): one point per ε and variant, with
    how far the text drifts from the ε = 0 text (first diverging token, edit distance).  Repeats,
    their order, the spread and `should_stop`: as for gamma_sweep (the standard runs divide the
    speedups but are not points here)."""
    eps = sorted(set(epsilons) | {0.0})
    keys: list[tuple[float, str] | None] = [STANDARD, *((e, v) for e in eps for v in ("opt", "uno"))]
    reps: dict[Any, list[dict[str, Any]]] = {k: [] for k in keys}
    flags: dict[Any, list[bool]] = {k: [] for k in keys}
    stds: dict[int, Any] = {}
    prices = probe_prices(req.pair)
    base: list[int] | None = None
    n = len(keys) * repeats

    def points() -> list[dict[str, Any]]:
        return [combine(reps[k], ("tokens_per_s", "speedup"), SPREAD, flags[k]) for k in keys[1:] if reps[k]]

    yield 0.0, WARMING_UP, None
    warm_up(req)
    for i, (r, key) in enumerate(round_robin(keys, repeats, should_stop), 1):
        rep = _repeat(r, repeats)
        if key is STANDARD:
            yield (i - 1) / n, f"standard decoding (baseline){rep}…", None
            std = standard_decode(req.pair, req.prompt_ids, req.settings, prompt=req.prompt, should_stop=should_stop)
            if std.stop_reason == "stopped":
                return
            stds[r] = std
            continue
        e, variant = key
        s = replace(req.settings, epsilon=e, variant=variant)
        tr = speculative_decode(req.pair, req.prompt_ids, s, prompt=req.prompt, drafter=make_drafter(req.pair, s),
                                should_stop=should_stop)
        if tr.stop_reason == "stopped":
            return
        s = tr.summary()
        ids = [t.id for t in tr.tokens]
        if base is None:
            base = ids
        std_tps = stds[r].summary().tokens_per_s
        reps[key].append({"epsilon": e, "variant": variant, "alpha": s.alpha, "speedup": s.tokens_per_s / std_tps,
                          "tokens_per_s": s.tokens_per_s, "mean_bias": s.mean_bias,
                          "reject_prob": s.mean_reject_prob, "mean_tv": (s.sum_tv / s.verified) if s.verified else None,
                          "first_divergence": first_divergence(base, ids), "edit_distance": edit_distance(base, ids)})
        flags[key].append(noisy(tr, stds[r], prices))
        yield i / n, f"ε = {e:g} ({variant.upper()}): α = {s.alpha or 0:.2f}{rep}", points()


TREE_SIZES = (1, 2, 4, 8, 16, 32, 64)


def tree_verify_times(pair: Any, prompt_ids: list[int], sizes=TREE_SIZES, repeats: int = 3,
                      branching: int = 2) -> list[dict[str, Any]]:
    """The target's verify time against the number of tree nodes: for each size, the median
    of `repeats` tree-masked forward passes over the prompt's last token plus a tree of that
    many nodes (node i's parent is (i − 1) // branching: a full tree, as wide as it is deep
    allows), on a cache holding the rest of the prompt, next to the same number of tokens fed as
    a plain causal chain ("t_chain": what the tree mask costs).  A later Sweeps plot reads these rows."""
    import statistics

    import torch

    from ..core.kv import CachedLM

    lm = CachedLM(pair.target, pair.device)
    rows = []
    try:
        with torch.inference_mode():
            lm.prefill(prompt_ids)
            for n in sizes:
                parents = [-1 if i < branching else (i - branching) // branching for i in range(n)]
                tokens = [prompt_ids[i % len(prompt_ids)] for i in range(n)]
                times, chain = [], []
                for _ in range(repeats):
                    times.append(_timed(pair.device, lambda: lm.feed_tree(prompt_ids, tokens, parents)))
                    lm.crop(len(prompt_ids) - 1)  # drop the tree and the last prompt token again
                    # The same number of tokens as a plain causal chain: what the tree mask costs.
                    chain.append(_timed(pair.device, lambda: lm.feed(prompt_ids + tokens, keep=n + 1)))
                    lm.crop(len(prompt_ids) - 1)
                depth = max((1 + _depth(parents, i) for i in range(n)), default=0)
                rows.append({"nodes": n, "depth": depth, "t_verify": statistics.median(times),
                             "t_chain": statistics.median(chain), "repeats": repeats})
    finally:
        lm.free()
    return rows


def _timed(device: Any, fn: Any) -> float:
    import time

    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def _depth(parents: list[int], i: int) -> int:
    d = 0
    while parents[i] >= 0:
        i, d = parents[i], d + 1
    return d
