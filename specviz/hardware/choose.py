"""Choosing the target's execution at load, with the probe: what ``load_pair(target_exec="auto")`` runs.

The models layer loads a pair and knows the executions (:mod:`specviz.models.executions`) but not this
machine; this module is the chooser it is handed (:func:`specviz.models.loading.set_execution_chooser`,
installed when :mod:`specviz.hardware` is imported).  A probe recorded for this machine is reused
(its choice, its curves); otherwise the candidates are timed once (:func:`.probe.probe_target`).
"""

from __future__ import annotations

from typing import Any

import torch

from ..models.executions import WORDS
from ..models.loading import ExecutionRequest, set_execution_chooser
from ..models.pair import report
from ..models.warm import pack_now
from . import probe as hw_probe
from . import probe_once
from .machine import Machine, this_machine
from .roofline import step_bytes


def choose_execution(req: ExecutionRequest) -> tuple[torch.nn.Module, str, Any]:
    """The target executing as requested, or as the probe chooses ("auto"): (model, execution, probe)."""
    requested = req.requested
    cached = hw_probe.known(this_machine(req.device), req.ref, req.dtype)
    if requested == "auto" and cached is not None and cached.choice in req.candidates:
        requested = cached.choice
    if requested == "auto" and cached is None and (unmeasured := _busy_choice(req)) is not None:
        # Nothing recorded and the machine busy: the timings would mean nothing, so the probe's fallback runs
        # unmeasured, loaded as a known execution is (deferred packing, the int8 weights read from disk),
        # not packed and timed first only for the probe to find it busy (stop 52: such starts took 15-65 s
        # where a warm one takes ~5).  A quiet start measures.
        report(req.progress, 0.0, f"Preparing {req.name} as {WORDS[unmeasured.choice]} (the machine is busy: "
                                  "measured on a quieter start)…")
        return req.apply(unmeasured.choice), unmeasured.choice, unmeasured
    if requested != "auto":
        if requested != req.candidates[0]:
            report(req.progress, 0.0, f"Preparing {req.name} as {WORDS[requested]}…")
        model, probe = req.apply(requested), cached
    else:
        report(req.progress, 0.0, f"Measuring how {req.name} runs fastest on this machine (once)…")
        pack_now(req.draft)  # a deferred load (models.warm) packs before it is timed
        draft_ms = hw_probe.draft_step_ms(req.draft, req.vocab)
        probe, model = hw_probe.probe_target(req.target, req.ref, req.dtype, req.vocab, build=req.build,
                                             draft_ms=draft_ms, alpha=req.alpha, candidates=req.candidates,
                                             draft_bytes=step_bytes(req.draft))
        requested = probe.choice
    if probe is not None and requested == probe.choice:
        # once per machine: a busy race's prices, and the bandwidth bound where an older probe lacks it
        probe = probe_once.add_one_thread(probe, model, req.draft, req.vocab, req.dtype)
        probe = probe_once.add_bound(probe, model, req.draft, req.dtype)
    return model, requested, probe


def _busy_fallback(machine: Machine) -> str | None:
    """The probe's fallback where this is a busy CPU (timings would mean nothing), else None (a GPU's are its own)."""
    from ..models.int8 import machine_busy

    return hw_probe.fallback(machine) if machine.kind == "cpu" and machine_busy() else None


def _busy_choice(req: ExecutionRequest) -> hw_probe.Probe | None:
    """The unmeasured probe a start on a busy CPU runs (its execution the probe's fallback), or None where the
    machine is quiet.  ``req.planned`` set with nothing recorded: the load saw the machine busy (:func:`known_choice`)
    and may have loaded the target as that already."""
    machine = this_machine(req.device)
    if req.planned is None and _busy_fallback(machine) is None:
        return None
    return hw_probe.unmeasured(machine, req.ref, req.alpha, req.candidates)


def known_choice(device: torch.device, ref: str, dtype: torch.dtype) -> str | None:
    """The execution "auto" runs for ``ref`` without measuring: a probe recorded for this machine, or on a busy CPU
    with none the probe's fallback (:func:`_busy_choice`: then the loader need not load the target as bf16 to
    have it measured; the int8 models load straight from their cached weights, models.bare); else None."""
    machine = this_machine(device)
    cached = hw_probe.known(machine, ref, dtype)
    return cached.choice if cached is not None else _busy_fallback(machine)


def describe_machine(device: torch.device) -> str:
    return this_machine(device).describe()


def install() -> None:
    """The probe chooses load_pair's "auto" execution; a trace names this machine (core.engine)."""
    from ..core.engine import set_machine_describer

    set_execution_chooser(choose_execution, known=known_choice)
    set_machine_describer(describe_machine)
