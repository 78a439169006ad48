"""The probe's timer: a model's forward over k new tokens after a short prefix, timed as the probe times it
(:mod:`.probe`: the target's verify-cost curve T(k); the draft's one-token step)."""

from __future__ import annotations

import time

import torch

from .curves import monotone

PROBE_KS = (1, 2, 4, 8)  # tokens fed; k = 16 too for the roofline (`full=True`)
FULL_KS = (1, 2, 4, 6, 8, 16)
# Tokens in the cache before the timed passes.  Short, because on a compute-bound CPU the prefix's
# own pass is the probe's largest cost (bf16 1.5B on the AVX2 EPYC: ~150 ms a token); the attention
# over 16 or 60 cached tokens costs the same at these sizes.
PREFIX = 16


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class VerifyTimer:
    """Times forwards over k new tokens after a PREFIX-token prefix (fed once) on one model: the
    fastest of ``reps`` after one warm-up pass of that size (the minimum: other processes only ever
    add time).  The GPU is synchronised before every clock read."""

    def __init__(self, model: torch.nn.Module, vocab: int, device: torch.device | None = None):
        from ..core.kv import cached_lm

        self.device = device or next(model.parameters()).device
        gen = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (PREFIX + max(FULL_KS),), generator=gen).tolist()
        self.lm = cached_lm(model, self.device, PREFIX + max(FULL_KS))
        with torch.inference_mode():
            self.lm.feed(self.ids[:PREFIX])

    def _pass(self, k: int) -> float:
        """Seconds of one forward over k new tokens after the prefix (cropped back after it)."""
        _sync(self.device)
        t = time.perf_counter()
        self.lm.feed(self.ids[:PREFIX + k], keep=k)
        _sync(self.device)
        seconds = time.perf_counter() - t
        self.lm.crop(PREFIX)
        return seconds

    def ms(self, k: int, reps: int = 1) -> float:
        return self.curve((k,), reps=reps)[k]

    def curve(self, ks: tuple[int, ...], known: dict[int, float] | None = None, reps: int = 1) -> dict[int, float]:
        """ms for each k of ``ks`` not ``known``: one warm-up pass of each, then ``reps`` timed rounds (the step's
        at least 2), each round passing every length in turn, so that a machine whose speed drifts while it is
        probed (a shared VM: 20 % within minutes) moves every point alike, not the late ones alone (measured on
        the Zen 3 EPYC, one length after another: T(2) = 67.6 ms under T(1) = 89.9); a point still under an earlier
        one (a 2-token pass costs a step within noise there) is raised to it (:func:`.curves.monotone`)."""
        out = dict(known or {})
        todo = [k for k in ks if k not in out]
        want = {k: max(reps, 2) if k == 1 else reps for k in todo}
        times: dict[int, list[float]] = {k: [] for k in todo}
        with torch.inference_mode():
            for k in todo:
                self._pass(k)
            for r in range(max(want.values(), default=0)):
                for k in todo:
                    if r < want[k]:
                        times[k].append(self._pass(k))
        out.update({k: 1000 * min(ts) for k, ts in times.items()})
        return monotone(out)

    def close(self) -> None:
        self.lm.free()


def verify_curve(model: torch.nn.Module, vocab: int, ks: tuple[int, ...] = PROBE_KS) -> dict[int, float]:
    """Milliseconds of a forward over k new tokens after the PREFIX-token prefix, for each k."""
    timer = VerifyTimer(model, vocab)
    try:
        return timer.curve(ks)
    finally:
        timer.close()


def draft_step_ms(model: torch.nn.Module, vocab: int) -> float:
    """The draft's one-token step after the PREFIX-token prefix, ms."""
    timer = VerifyTimer(model, vocab)
    try:
        return timer.ms(1, reps=3)
    finally:
        timer.close()
