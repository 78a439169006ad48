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
from .machine import this_machine
from .roofline import step_bytes


def choose_execution(req: ExecutionRequest) -> tuple[torch.nn.Module, str, Any]:
    """The target executing as requested, or as the probe chooses ("auto"): (model, execution, probe)."""
    requested = req.requested
    cached = hw_probe.known(this_machine(req.device), req.ref, req.dtype)
    if requested == "auto" and cached is not None and cached.choice in req.candidates:
        requested = cached.choice
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


def known_choice(device: torch.device, ref: str, dtype: torch.dtype) -> str | None:
    """The execution "auto" chooses for ``ref`` without measuring (a probe recorded for this machine), or None."""
    cached = hw_probe.known(this_machine(device), ref, dtype)
    return cached.choice if cached is not None else None


def describe_machine(device: torch.device) -> str:
    return this_machine(device).describe()


def install() -> None:
    """The probe chooses load_pair's "auto" execution; a trace names this machine (core.engine)."""
    from ..core.engine import set_machine_describer

    set_execution_chooser(choose_execution, known=known_choice)
    set_machine_describer(describe_machine)
