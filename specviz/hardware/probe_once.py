"""What a warm start adds to a cached probe, once per machine (then remembered): the chosen execution timed on one
thread (what a race on a busy machine is priced by), and the roofline's figures (the bandwidth bound, the int8
peaks: :mod:`.peak`) where the probe was made before they were kept.  Neither runs on a busy machine, where timings
mean nothing, and neither is kept where the machine turned busy while it was timed (:mod:`.quiet`: watched as the
probe is)."""

from __future__ import annotations

import logging
import time
from typing import Callable

import torch

from . import quiet, roofline
from .machine import this_machine
from .probe import Probe, machine_device, remember
from .timer import PROBE_KS, VerifyTimer, draft_step_ms

log = logging.getLogger("specviz.models")


def time_one_thread(target: torch.nn.Module, draft: torch.nn.Module | None, vocab: int,
                    ks: tuple[int, ...] = PROBE_KS) -> dict:
    """The target's curve over ``ks`` and the draft's step, each on one thread (the count a race on a
    busy machine uses): {"curve": {k: ms}, "draft_ms": ms or None}.  The process's count is restored."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        timer = VerifyTimer(target, vocab)
        try:
            curve = timer.curve(ks)
        finally:
            timer.close()
        draft_ms = draft_step_ms(draft, vocab) if draft is not None else None
    finally:
        torch.set_num_threads(before)
    return {"curve": {k: round(v, 1) for k, v in curve.items()}, "draft_ms": None if draft_ms is None else round(draft_ms, 1)}


def add_one_thread(probe: Probe, target: torch.nn.Module, draft: torch.nn.Module | None, vocab: int, dtype: torch.dtype,
                   busy: Callable[[], bool] | None = None) -> Probe:
    """``probe`` with its chosen execution timed on one thread too (once per machine: remembered), where
    the machine has more than one and is quiet now, and stayed quiet while it was timed; the probe unchanged
    otherwise.  ``busy``: the machine stated (then not watched), this machine's reading by default."""
    machine = this_machine(machine_device(target))
    if (probe.one_thread or not probe.measured or machine.kind != "cpu" or (probe.machine or {}).get("threads", 1) <= 1
            or (busy() if busy is not None else quiet.busy_before())):
        return probe
    from ..models.warm import pack_now

    t0 = time.perf_counter()
    for model in (target, draft):  # a deferred load (models.warm) packs before it is timed
        if model is not None:
            pack_now(model)
    watch = quiet.watch(busy)
    one = time_one_thread(target, draft, vocab)
    crowd = watch.verdict(1)
    if crowd:
        log.warning("The machine was busy while %s was timed on one thread (other work: %s cores of %s): not kept",
                    probe.model, crowd.get("other_cores"), crowd.get("cores"))
        return probe
    probe.one_thread = one
    log.info("Target %s as %s on one thread: %s ms for %s tokens, draft step %s ms (%.1f s)", probe.model, probe.choice,
             "/".join(f"{v:.0f}" for v in probe.one_thread["curve"].values()), "/".join(map(str, probe.one_thread["curve"])),
             probe.one_thread["draft_ms"], time.perf_counter() - t0)
    remember(probe, machine, probe.model, dtype)
    return probe


def add_bound(probe: Probe, target: torch.nn.Module, draft: torch.nn.Module | None, dtype: torch.dtype,
              busy: Callable[[], bool] | None = None) -> Probe:
    """``probe`` with the roofline's figures where it was made before they were kept: the bytes a step of the chosen
    execution (``target``, as it runs) and of the draft reads and the copy bandwidth (~0.3 s), and on a CPU the int8
    multiply-add peaks (:mod:`.peak`, ~0.1-0.3 s) and a token's multiply-adds; once per machine (remembered), and
    not on a busy machine, where a copy's or a loop's time means nothing."""
    from ..models import q4k
    from .peak import measure_peaks

    device = machine_device(target)
    cpu = device.type == "cpu"
    want_copy, want_peak = not probe.copy_gbps, cpu and probe.peak is None
    if not (want_copy or want_peak) or not probe.measured or not probe.curves or (
            cpu and (busy() if busy is not None else quiet.busy_before())):
        return probe
    watch = quiet.watch(busy)
    threads = int((probe.machine or {}).get("threads") or torch.get_num_threads())
    copy_gbps = round(roofline.copy_bandwidth(device) / 1e9, 2) if want_copy else probe.copy_gbps
    peak = measure_peaks(threads) if want_peak else probe.peak
    crowd = watch.verdict(torch.get_num_threads()) if cpu else None
    if crowd:
        log.warning("The machine was busy while its copy bandwidth and int8 peak were timed (other work: %s cores of "
                    "%s): not kept", crowd.get("other_cores"), crowd.get("cores"))
        return probe
    if want_copy:
        probe.step_mb = {**probe.step_mb, probe.choice: round(roofline.step_bytes(target) / 1e6, 3)}
        probe.draft_mb = round(roofline.step_bytes(draft) / 1e6, 3) if draft is not None else None
        probe.copy_gbps = copy_gbps
        if q4k.in_use(target):
            probe.weights = {**probe.weights, probe.choice: "gguf"}
        log.info("Bandwidth bound of %s: %.0f MB a step at %.1f GB/s", probe.choice, probe.step_mb[probe.choice],
                 probe.copy_gbps)
    probe.peak = peak
    probe.token_macs = probe.token_macs or roofline.token_macs(target)
    if peak:
        log.info("Int8 multiply-add peaks (GMAC/s on 1 / %d threads): %s", threads, peak.get("why") or ", ".join(
            f"{isa} {'/'.join(str(v) for v in c.values())}" for isa, c in peak.get("gmacs", {}).items()))
    remember(probe, this_machine(device), probe.model, dtype)
    return probe
