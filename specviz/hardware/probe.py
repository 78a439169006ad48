"""The execution probe: time each candidate execution of the target, choose by the speculative rate.

For a target and each execution this machine offers (:mod:`.executions`), the probe times a
one-token step and verify passes over k new tokens after a 60-token prefix: the *verify-cost
curve* T(k).  With the draft's one-token step t_d and the pair's typical acceptance α, Leviathan
et al.'s Theorem 3.8 with a measured verify cost gives the expected rate of speculative decoding at
draft length γ,

    rate(γ) = E[tokens per round] / (γ·t_d + T(γ+1)),   E = (1 − α^(γ+1)) / (1 − α),

and the chosen execution is the one with the highest rate at its best γ -- not the fastest
one-token step: on an AVX2-only CPU bf16's T(6) is ~5 T(1) while int8's is ~1.5 T(1).  Standard
decoding then runs on the same execution (so every race and every exactness claim is same-model).

Results are cached in ``<cache>/probe.json`` per machine (CPU model, ISA, threads, emulation, or
GPU), torch version, model and dtype; a warm start reads them and measures nothing.  A probe taken
while the machine is busy is not a measurement of the machine (issue 65: one taken beside the test
suite recorded T(1) = 1,420 ms where the quiet probe of the same start took 51.4 ms, and every later
start drew "This machine" and its choices from it).  So on a CPU:

- busy before it starts (:func:`.quiet.busy_before`), nothing is measured or recorded;
- busy while it runs -- other processes' CPU over the probe's own window, :class:`specviz.models.busy.Watch`
  -- its timings are recorded only as a *flagged* record (``"measured": false``, ``"busy"``: the reading,
  and the timings it discarded), which no choice is made from (:func:`trusted`) and the page shows as
  not measured;

either way the execution is ``fallback``'s (int8 on a CPU) and measured on a quieter start.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Protocol

import torch

from .curves import interpolate, monotone
from .machine import Machine, this_machine
from .timer import FULL_KS, PREFIX, PROBE_KS, VerifyTimer, draft_step_ms, verify_curve  # noqa: F401 (re-exported)

log = logging.getLogger("specviz.models")

GAMMAS = range(1, 11)
PROBE_FORMAT = 4  # 2: the int8 target runs its chains on the lean, traced forward (models.lean): other curves;
# 3: its int8 linears are one call each on specviz's kernel (int8_linear): a few ms less a pass;
# 4: the machine is watched while it is probed (issue 65): a record from before may hold timings taken under load


class Verdict(Protocol):
    """What watches a measurement (specviz.models.busy.Watch, or Stated): why it was crowded, or None."""

    def verdict(self, threads: int) -> dict | None: ...


@dataclass
class Probe:
    """One target's measured executions on one machine, and the choice made from them."""

    machine: dict
    model: str
    curves: dict[str, dict[int, float]]  # execution -> {tokens fed: ms}
    draft_ms: float | None  # the draft's one-token step (its own execution), ms
    alpha: float  # the pair's typical acceptance used for the choice
    choice: str
    predicted: dict[str, dict] = field(default_factory=dict)  # execution -> {rate, gamma, standard}
    seconds: float = 0.0  # what measuring cost, building the executions included
    build_seconds: float = 0.0  # of which building the chosen execution (a start running it pays that anyway)
    measured: bool = True  # False: chosen from the ISA on a busy machine (nothing measured, or flagged: ``busy``)
    # The chosen execution timed on one thread (where the machine has more): {"curve": {k: ms}, "draft_ms": ms}.
    # A race on a busy machine runs on one thread (hardware.load) and is priced by these.
    one_thread: dict | None = None
    # The bandwidth bound (hardware.roofline): MB of weights a one-token step reads, per execution timed, and the
    # draft's; the machine's copy bandwidth (bytes read and written), GB/s.  None / {} in probes made before.
    step_mb: dict[str, float] = field(default_factory=dict)
    draft_mb: float | None = None
    copy_gbps: float | None = None
    # execution -> "gguf" where it ran on the GGUF's matrices as stored (models.q4k), as ModelPair.target_weights says
    weights: dict[str, str] = field(default_factory=dict)
    # The compute side of the roofline (hardware.peak, hardware.roofline): the CPU's int8 multiply-add peaks timed with
    # the curves ({"threads", "gmacs": {isa: {threads: GMAC/s}}, "absent": {isa: why}}; "why" where none could be)
    # and one token's multiply-adds in the target's products.  None in probes made before.
    peak: dict | None = None
    token_macs: int | None = None
    # Set where the machine was busy while it was probed (a flagged record, never chosen from): the reading of other
    # work over the probe (busy.Watch.verdict) and what was timed meanwhile ("step_ms", "draft_ms", "copy_gbps").
    busy: dict | None = None
    # Set where nothing was to choose (one candidate) on a server's start: the execution runs at once, and is timed
    # after serving, between runs (hardware.choose.measure_after_serving); never recorded as such.
    after_serving: bool = False

    def __post_init__(self) -> None:
        if self.busy:
            self.measured = False
        # never a curve that dips (curves.monotone): a cached probe from before, or one written by hand; its
        # predicted rates then follow the raised curve (the choice made stays: the model was built as chosen)
        raised = {e: monotone(c) for e, c in self.curves.items()}
        if raised != self.curves and self.predicted and self.draft_ms:
            self.predicted = choose(raised, self.draft_ms, self.alpha)[1]
        self.curves = raised
        if isinstance(self.one_thread, dict) and isinstance(self.one_thread.get("curve"), dict):
            self.one_thread = {**self.one_thread, "curve": monotone(self.one_thread["curve"])}

    def bound_ms(self, mb: float | None) -> float | None:
        """The ms ``mb`` MB of weights take to stream at the copy bandwidth (MB / (GB/s) = ms); None unmeasured."""
        return mb / self.copy_gbps if mb and self.copy_gbps else None

    def bound_ratio(self, execution: str | None = None) -> float | None:
        """T(1) of ``execution`` (the chosen one) over the time its weights take to stream at the copy
        bandwidth: 1.0 would be the bound itself; None where not measured."""
        e = execution or self.choice
        t1, bound = (self.curves.get(e) or {}).get(1), self.bound_ms(self.step_mb.get(e))
        return t1 / bound if t1 and bound else None

    def as_dict(self) -> dict:
        d = asdict(self)
        d["curves"] = {e: {str(k): round(v, 1) for k, v in c.items()} for e, c in self.curves.items()}
        if self.one_thread:
            d["one_thread"] = {"curve": {str(k): round(v, 1) for k, v in self.one_thread["curve"].items()},
                               "draft_ms": self.one_thread.get("draft_ms")}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Probe":
        d = dict(d)
        d["curves"] = {e: {int(k): float(v) for k, v in c.items()} for e, c in d.get("curves", {}).items()}
        one = d.get("one_thread")
        d["one_thread"] = ({"curve": {int(k): float(v) for k, v in one["curve"].items()}, "draft_ms": one.get("draft_ms")}
                           if isinstance(one, dict) and isinstance(one.get("curve"), dict) else None)
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def costs(self, execution: str, threads: int | None = None) -> tuple[dict[int, float], float | None, int | None] | None:
        """(T(k) curve in ms, the draft's step in ms, the threads they hold for) for ``execution`` on
        ``threads`` threads: the one-thread timings when one is asked and they exist, the probe's own
        (every core) otherwise; None where this execution was not timed."""
        cores = (self.machine or {}).get("threads")
        one = self.one_thread or {}
        if threads == 1 and cores != 1 and execution == self.choice and one.get("curve"):
            return one["curve"], one.get("draft_ms"), 1
        curve = self.curves.get(execution)
        if not curve or 1 not in curve:
            return None
        return curve, self.draft_ms, cores

    def verify_factor(self, execution: str, k: int) -> float | None:
        """T(k) / T(1): what a k-token verify pass costs in one-token steps."""
        c = self.curves.get(execution)
        return None if not c or 1 not in c else interpolate(c, k) / c[1]


def expected_tokens(alpha: float, gamma: int) -> float:
    """Leviathan et al. eq. (1): expected tokens per round, (1 − α^(γ+1)) / (1 − α)."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def predicted_rate(curve: dict[int, float], draft_ms: float, alpha: float) -> dict:
    """The best γ's expected speculative tokens/s on this verify-cost curve, and standard decoding's."""
    best = max(GAMMAS, key=lambda g: expected_tokens(alpha, g) / (g * draft_ms + interpolate(curve, g + 1)))
    cost = best * draft_ms + interpolate(curve, best + 1)
    return {"gamma": best, "rate": round(1000 * expected_tokens(alpha, best) / cost, 3),
            "standard": round(1000 / curve[min(curve)], 3)}


def choose(curves: dict[str, dict[int, float]], draft_ms: float | None, alpha: float) -> tuple[str, dict]:
    """The execution with the highest predicted speculative rate (the fastest step without a draft time)."""
    if draft_ms is None:
        predicted = {e: {"rate": round(1000 / c[min(c)], 3)} for e, c in curves.items()}
    else:
        predicted = {e: predicted_rate(c, draft_ms, alpha) for e, c in curves.items()}
    return max(predicted, key=lambda e: predicted[e]["rate"]), predicted



# --------------------------------------------------------------------------------------------------
# The cache
# --------------------------------------------------------------------------------------------------


def _probe_path():
    from ..models.cache_paths import cache_dir

    return cache_dir() / "probe.json"


def probe_key(machine: Machine, model: str, dtype: torch.dtype) -> str:
    """Where a probe is remembered: the machine, the model, the dtype, and on a CPU whether the int8 linears
    run on specviz's own kernels (specviz.models.kernels), which source -- other products, other curves:
    measured again."""
    from ..models import kernels

    parts = [f"v{PROBE_FORMAT}", machine.key, model, str(dtype).removeprefix("torch.")]
    if machine.kind == "cpu" and kernels.ready():
        parts.append(f"kernel-{kernels.source_digest()}")
        from ..models import q4k

        if q4k.enabled():  # asked for: an int8 target from a GGUF takes its Q4_K matrices as stored, other curves
            parts.append(f"q4k-v{q4k.FORMAT}")
            from ..models import hugepages

            if hugepages.enabled():  # and streams them from huge pages: faster steps, a higher copy bandwidth
                parts.append("thp2")  # 2: the draft's records too (its step, draft_ms, is faster: measured again)
    return "|".join(parts)


def read_probes() -> dict:
    try:
        return json.loads(_probe_path().read_text())
    except (OSError, ValueError):
        return {}


def known(machine: Machine, model: str, dtype: torch.dtype) -> Probe | None:
    """The record for this machine, model and dtype, flagged or not (what the page shows)."""
    entry = read_probes().get(probe_key(machine, model, dtype))
    try:
        return Probe.from_dict(entry) if entry else None
    except (TypeError, ValueError):
        return None


def is_trusted(probe: Probe | None) -> bool:
    """Whether ``probe`` is a measurement of the machine: measured, and not flagged busy."""
    return probe is not None and probe.measured and not probe.busy


def trusted(machine: Machine, model: str, dtype: torch.dtype) -> Probe | None:
    """The record execution choices are made from: :func:`known`'s where it is a measurement, never a flagged one
    (busy while probed) nor one chosen from the ISA."""
    probe = known(machine, model, dtype)
    return probe if is_trusted(probe) else None


def remember(probe: Probe, machine: Machine, model: str, dtype: torch.dtype) -> None:
    """Store ``probe`` (atomically; only a cache: failures are ignored).  A flagged probe never replaces a
    measurement."""
    entries = read_probes()
    key = probe_key(machine, model, dtype)
    if probe.busy and isinstance(entries.get(key), dict) and entries[key].get("measured", True) \
            and not entries[key].get("busy") and entries[key].get("curves"):
        return
    entries[key] = probe.as_dict()
    try:
        path = _probe_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"probe.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entries, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass


# --------------------------------------------------------------------------------------------------
# Probing a target
# --------------------------------------------------------------------------------------------------


def fallback(machine: Machine) -> str:
    """The execution to use without measuring: bf16 on a GPU, int8 on every CPU.  Measured on both
    kinds of 2-core CPU with the default pair: on the AVX2 EPYC bf16 is compute-bound (T(6) = 4.5 T(1));
    on the AMX Xeon bf16's verify is flat but its step costs 175 ms against int8's 82, and the bench
    ran the best policy at 17.4 tok/s with int8 against 14.2 with bf16 (README, This machine)."""
    return "bf16" if machine.kind == "cuda" else "int8"


def unmeasured(machine: Machine, name: str, alpha: float, candidates: tuple[str, ...],
               draft_ms: float | None = None, busy: dict | None = None) -> Probe:
    """What a busy CPU runs without measuring (its timings would mean nothing): :func:`fallback`'s execution,
    so that a quieter start measures.  ``busy``: why a probe that ran is not a measurement (then recorded,
    flagged, by the caller); without it nothing was timed and nothing is recorded."""
    choice = fallback(machine) if fallback(machine) in candidates else candidates[0]
    if busy:
        log.warning("The machine was busy while %s was probed (other work: %s cores of %s, over %s s): its timings "
                    "are not a measurement of the machine, kept only as a flagged record; running the target as %s "
                    "(will measure on a quiet start)", name, busy.get("other_cores"), busy.get("cores"),
                    busy.get("seconds"), choice)
    else:
        log.info("The machine is busy; running the target as %s without measuring (will measure on a quiet start)",
                 choice)
    return Probe(machine.as_dict(), name, {}, draft_ms, alpha, choice, measured=False, busy=busy)


def best_possible(step_ms: float, draft_ms: float | None, alpha: float) -> float:
    """An upper bound on an execution's speculative rate from its one-token step alone (a verify
    pass never costs less than a step): lets the probe stop timing an execution that cannot win."""
    if draft_ms is None:
        return 1000 / step_ms
    return max(1000 * expected_tokens(alpha, g) / (g * draft_ms + step_ms) for g in GAMMAS)


def probe_target(model: torch.nn.Module, name: str, dtype: torch.dtype, vocab: int, *,
                 build: Callable[[str], torch.nn.Module], draft_ms: float | None, alpha: float,
                 candidates: tuple[str, ...], ks: tuple[int, ...] = PROBE_KS, full: bool = False,
                 busy: Callable[[], bool] | None = None, watch: Verdict | None = None,
                 draft_bytes: int | None = None) -> tuple[Probe, torch.nn.Module]:
    """Time ``model`` (as loaded: ``candidates[0]``) and ``build(execution)`` for the other candidates,
    choose, remember the result; return it with the chosen model (the others are dropped).

    The likeliest winner is timed first (int8 where bf16 is not native); every other execution's
    one-token step is timed, and its verify curve only if that step leaves it a chance to win
    (:func:`best_possible`) -- so a cold start on the 2-core EPYC spends ~10-15 s here, not a
    minute.  ``full=True`` times every curve over ``FULL_KS`` (the roofline's curves).
    ``build(e)`` returns the model executing as ``e`` (a copy where the weights change).  The bytes each
    execution's step reads and the machine's copy bandwidth are kept for the bandwidth bound, and on a CPU its int8
    multiply-add peaks (:mod:`.peak`) and a token's multiply-adds for the compute bound (:mod:`.roofline`;
    ``draft_bytes``: the draft's step's).

    On a CPU the machine must be quiet: ``busy()`` says whether other processes compete for the cores before it
    starts (this machine's reading by default, :func:`.quiet.busy_before`; then nothing is measured:
    :func:`fallback`), and ``watch`` (started by the caller where ``draft_ms`` was timed just before; by default
    :func:`.quiet.watch`, which a stated ``busy`` stands in for) whether they did while it ran: then the
    timings are recorded only as a flagged record, and :func:`fallback`'s execution runs."""
    from ..models import q4k
    from . import quiet
    from .peak import measure_peaks
    from .roofline import copy_bandwidth, step_bytes, token_macs

    machine = this_machine(machine_device(model))
    cpu = machine.kind == "cpu"
    if cpu and (busy() if busy is not None else quiet.busy_before()):
        probe = unmeasured(machine, name, alpha, candidates, draft_ms)
        return probe, (model if probe.choice == candidates[0] else build(probe.choice))
    watch = watch or quiet.watch(busy)
    threads = torch.get_num_threads()
    t0 = time.perf_counter()
    ks = FULL_KS if full else ks
    first = fallback(machine)
    order = sorted(candidates, key=lambda e: (e != first, candidates.index(e)))
    if not full and "int8" in order and "fp32" in order:
        # fp32 reads four times int8's bytes per step and fbgemm's int8 kernels multiply at least as fast
        # as fp32 FMAs on every x86 CPU: fp32 cannot win where int8 runs, and building it (6 GB of new
        # pages) costs ~17 s on the 2-core EPYC.  `full=True` (the roofline CLI) times it anyway.
        order.remove("fp32")
    curves: dict[str, dict[int, float]] = {}
    sizes: dict[str, float] = {}
    weights: dict[str, str] = {}
    models: dict[str, torch.nn.Module] = {}
    builds: dict[str, float] = {}
    for execution in order:
        t_build = time.perf_counter()
        m = model if execution == candidates[0] else build(execution)
        t_build = builds[execution] = time.perf_counter() - t_build
        timer = VerifyTimer(m, vocab)
        step = timer.curve((1,))
        if full or not curves or best_possible(step[1], draft_ms, alpha) >= max(
                choose(curves, draft_ms, alpha)[1][e]["rate"] for e in curves):
            step = timer.curve(ks, known=None if full else step, reps=3 if full else 1)
        timer.close()
        curves[execution] = step
        sizes[execution] = round(step_bytes(m) / 1e6, 3)
        if q4k.in_use(m):
            weights[execution] = "gguf"
        log.info("Target %s as %s: %s ms for %s tokens (built in %.1f s)", name, execution,
                 "/".join(f"{v:.0f}" for v in step.values()), "/".join(map(str, step)), t_build)
        models[execution] = m
        best = choose(curves, draft_ms, alpha)[0]
        for e in list(models):  # keep only the best so far: bounded memory
            if e != best:
                del models[e]
        del m
        gc.collect()
    crowd = watch.verdict(threads) if cpu else None
    copy_gbps = None if crowd else round(copy_bandwidth(machine_device(model)) / 1e9, 2)
    peak = measure_peaks(threads) if cpu and not crowd else None  # the int8 multiply-add peaks: ~0.1-0.3 s
    crowd = crowd or (watch.verdict(threads) if cpu else None)  # the copy and the peaks were timed in the window too
    if crowd:
        timed = {"step_ms": {e: round(c[min(c)], 1) for e, c in curves.items()},
                 "draft_ms": None if draft_ms is None else round(draft_ms, 1), "copy_gbps": copy_gbps, "peak": peak}
        probe = unmeasured(machine, name, alpha, candidates, busy=crowd | timed)
        probe.seconds = round(time.perf_counter() - t0, 1)
        remember(probe, machine, name, dtype)
        keep = probe.choice
        return probe, (models[keep] if keep in models else model if keep == candidates[0] else build(keep))
    choice, predicted = choose(curves, draft_ms, alpha)
    probe = Probe(machine.as_dict(), name, curves, draft_ms, alpha, choice, predicted,
                  seconds=round(time.perf_counter() - t0, 1), build_seconds=round(builds[choice], 1), step_mb=sizes,
                  draft_mb=None if draft_bytes is None else round(draft_bytes / 1e6, 3),
                  copy_gbps=copy_gbps, weights=weights, peak=peak, token_macs=token_macs(model))
    log.info("Target %s runs as %s (predicted %s); probing took %.1f s, %.1f s of it building %s (which a start "
             "running %s pays anyway)", name, choice, ", ".join(f"{e} {p['rate']:.2f} tok/s" for e, p in predicted.items()),
             probe.seconds, probe.build_seconds, choice, choice)
    remember(probe, machine, name, dtype)
    return probe, models[choice]


def machine_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device
