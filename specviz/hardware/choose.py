"""Choosing the target's execution at load, with the probe: what ``load_pair(target_exec="auto")`` runs.

The models layer loads a pair and knows the executions (:mod:`specviz.models.executions`) but not this
machine; this module is the chooser it is handed (:func:`specviz.models.loading.set_execution_chooser`,
installed when :mod:`specviz.hardware` is imported).  A probe recorded for this machine is reused
(its choice, its curves) where it is a measurement; otherwise -- nothing recorded, or a record flagged busy
while it was probed -- the candidates are timed (:func:`.probe.probe_target`) on a quiet start, and a busy
start runs the probe's fallback unmeasured.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import torch

from ..models.executions import WORDS
from ..models.loaders import ExecutionRequest, set_execution_chooser
from ..models.pair import report
from ..models.warm import pack_now
from . import probe as hw_probe
from . import probe_once, quiet
from .machine import Machine, this_machine
from .roofline import step_bytes

log = logging.getLogger("specviz.hardware")


def choose_execution(req: ExecutionRequest) -> tuple[torch.nn.Module, str, Any]:
    """The target executing as requested, or as the probe chooses ("auto"): (model, execution, probe).  Only a
    measurement is chosen from (:func:`.probe.trusted`); a record flagged busy is measured again, on a quiet start."""
    requested = req.requested
    machine = this_machine(req.device)
    recorded = hw_probe.known(machine, req.ref, req.dtype)
    cached = recorded if hw_probe.is_trusted(recorded) else None
    if requested == "auto" and cached is not None and cached.choice in req.candidates:
        requested = cached.choice
    if requested == "auto" and cached is None and (unmeasured := _busy_choice(req, recorded)) is not None:
        # Nothing recorded and the machine busy: the timings would mean nothing, so the probe's fallback runs
        # unmeasured, loaded as a known execution is (deferred packing, the int8 weights read from disk),
        # not packed and timed first only for the probe to find it busy (stop 52: such starts took 15-65 s
        # where a warm one takes ~5).  A quiet start measures.
        report(req.progress, 0.0, f"Preparing {req.name} as {WORDS[unmeasured.choice]} (the machine is busy: "
                                  "measured on a quieter start)…")
        return req.apply(unmeasured.choice), unmeasured.choice, unmeasured
    if requested == "auto" and cached is None and req.later and len(req.candidates) == 1:
        # Nothing to choose: the one execution serves at once, its timings are taken after serving, between runs
        # (measure_after_serving): a first start's default race no longer waits ~4 s for them.
        only = req.candidates[0]
        return req.apply(only), only, hw_probe.Probe(this_machine(req.device).as_dict(), req.ref, {}, None,
                                                     req.alpha, only, measured=False, after_serving=True)
    if requested != "auto":
        if requested != req.candidates[0]:
            report(req.progress, 0.0, f"Preparing {req.name} as {WORDS[requested]}…")
        model, probe = req.apply(requested), cached
    else:
        report(req.progress, 0.0, f"Measuring how {req.name} runs fastest on this machine (once)…")
        probe, model = _timed(req.target, req.draft, req.ref, req.dtype, req.vocab, req.alpha, req.candidates,
                              req.build)
        requested = probe.choice
    if probe is not None and probe.measured and requested == probe.choice:
        probe = _completed(probe, model, req.draft, req.vocab, req.dtype)
    return model, requested, probe


def _timed(target: torch.nn.Module, draft: torch.nn.Module, ref: str, dtype: torch.dtype, vocab: int, alpha: float,
           candidates: tuple[str, ...], build: Callable[[str], torch.nn.Module]) -> tuple[hw_probe.Probe, Any]:
    """The probe's timings of ``candidates`` (:func:`.probe.probe_target`), the draft's step timed in its busy
    watch too: (the probe, recorded for this machine, and the chosen model)."""
    pack_now(draft)  # a deferred load (models.warm) packs before it is timed
    watch = quiet.watch()  # the draft's step is timed in the probe's window too
    draft_ms = hw_probe.draft_step_ms(draft, vocab)
    return hw_probe.probe_target(target, ref, dtype, vocab, build=build, draft_ms=draft_ms, alpha=alpha,
                                 candidates=candidates, watch=watch, draft_bytes=step_bytes(draft))


def _completed(probe: hw_probe.Probe, model: Any, draft: torch.nn.Module, vocab: int,
               dtype: torch.dtype) -> hw_probe.Probe:
    """A measured probe with what is timed once per machine: a busy race's one-thread prices, and the bandwidth bound
    and int8 peak where an older probe lacks them."""
    probe = probe_once.add_one_thread(probe, model, draft, vocab, dtype)
    return probe_once.add_bound(probe, model, draft, dtype)


def measure(pair: Any, ref: str, progress: Any = None) -> hw_probe.Probe:
    """Time ``pair``'s target as it runs (its one execution) and its draft, now, with the roofline's figures; the
    probe is recorded for this machine (a busy machine's flagged, :func:`.probe.probe_target`).  The caller holds
    what keeps runs off the models."""
    report(progress, 0.0, f"Measuring how {pair.target_name} runs on this machine (once)…")
    probe, _ = _timed(pair.target, pair.draft, ref, pair.dtype, pair.vocab_size, pair.probe.alpha, (pair.target_exec,),
                      lambda _e: pair.target)
    return _completed(probe, pair.target, pair.draft, pair.vocab_size, pair.dtype) if probe.measured else probe


RETRY_S = 30.0  # a busy machine: the next try this much later
TRIES = 20
IDLE_S = 3.0  # the models' lock free this long: no visitor's run is waiting (a run that waited for the load takes
# the lock within milliseconds of the load's end and holds it to its end: serving.replay's gate)


def _idle(lock: Any, idle_s: float | None = None) -> None:
    """Return once ``lock`` has stayed free for ``idle_s`` seconds (IDLE_S)."""
    idle_s = IDLE_S if idle_s is None else idle_s
    free_since = time.monotonic()
    while time.monotonic() - free_since < idle_s:
        time.sleep(0.05)
        if lock.locked():
            free_since = time.monotonic()


def measure_after_serving(pair: Any, lock: Any, serving: Callable[[], bool]) -> threading.Thread | None:
    """Where ``pair``'s execution was taken unmeasured to serve at once (:attr:`.probe.Probe.after_serving`), time
    it in a daemon thread once the page is served (``serving()`` returns then; False: the process exits), holding ``lock`` (the server's model
    lock: no run meanwhile, ~4 s on 2 cores), on a quiet machine (else again RETRY_S later); the pair's probe is then
    the measurement, recorded for the next start.  None where there is nothing to measure."""
    first = getattr(pair, "probe", None)
    if not isinstance(first, hw_probe.Probe) or first.measured or not first.after_serving:
        return None

    def work() -> None:
        if not serving():
            return
        for _ in range(TRIES):
            _idle(lock)
            with lock:
                if not quiet.busy_before():
                    try:
                        pair.probe = measure(pair, first.model)
                    except Exception as exc:  # noqa: BLE001 -- the pair serves unmeasured, as it did
                        log.warning("Measuring %s after serving failed (%s)", pair.target_name, exc)
                        return
                    if pair.probe.measured:
                        log.info("%s measured after serving: %s", pair.target_name, pair.probe.curves)
                        return
            time.sleep(RETRY_S)
        if getattr(pair.probe, "after_serving", False):  # never quiet: the page says so (a quieter start measures)
            pair.probe = hw_probe.unmeasured(this_machine(pair.device), first.model, first.alpha, (pair.target_exec,))

    thread = threading.Thread(target=work, daemon=True, name="specviz-probe")
    thread.start()
    return thread


def _strict(recorded: hw_probe.Probe | None) -> int | None:
    """The threads a quiet machine must leave free before measuring again, where the last probe was flagged busy
    (:func:`.quiet.busy_before`); None otherwise."""
    return torch.get_num_threads() if recorded is not None and recorded.busy else None


def _busy_fallback(machine: Machine, recorded: hw_probe.Probe | None = None) -> str | None:
    """The probe's fallback where this is a busy CPU (timings would mean nothing), else None (a GPU's are its own)."""
    return hw_probe.fallback(machine) if machine.kind == "cpu" and quiet.busy_before(_strict(recorded)) else None


def _busy_choice(req: ExecutionRequest, recorded: hw_probe.Probe | None = None) -> hw_probe.Probe | None:
    """The unmeasured probe a start on a busy CPU runs (its execution the probe's fallback), or None where the
    machine is quiet.  ``req.planned`` set with nothing trusted recorded: the load saw the machine busy
    (:func:`known_choice`) and may have loaded the target as that already."""
    machine = this_machine(req.device)
    if req.planned is None and _busy_fallback(machine, recorded) is None:
        return None
    return hw_probe.unmeasured(machine, req.ref, req.alpha, req.candidates)


def known_choice(device: torch.device, ref: str, dtype: torch.dtype) -> str | None:
    """The execution "auto" runs for ``ref`` without measuring: a measurement recorded for this machine, or on a busy
    CPU without one the probe's fallback (:func:`_busy_choice`: then the loader need not load the target as bf16 to
    have it measured; the int8 models load straight from their cached weights, models.bare); else None."""
    machine = this_machine(device)
    recorded = hw_probe.known(machine, ref, dtype)
    if hw_probe.is_trusted(recorded):
        return recorded.choice
    return _busy_fallback(machine, recorded)


def describe_machine(device: torch.device) -> str:
    return this_machine(device).describe()


def install() -> None:
    """The probe chooses load_pair's "auto" execution; a trace names this machine (core.engine)."""
    from ..core.engine import set_machine_describer

    set_execution_chooser(choose_execution, known=known_choice)
    set_machine_describer(describe_machine)
