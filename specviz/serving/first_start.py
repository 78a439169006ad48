"""A server's first start: a ready pair serves at once while the prepared default pair is made (issue 55).

A Space's disk is empty at every wake-up.  The prepared default pair (converted caches, int8 weights and Q4_K
records, specviz's kernel compiled, the machine probed) took about 170 s of a 2-core CPU before its first live
run.  Here the server's preload (:mod:`.preload`, through :func:`.service.get_pair`) first makes the *ready
pair* (:func:`specviz.models.first_start.ready_pair`: the same weights as transformers models in bf16 or fp32,
read from the GGUFs into memory) and serves it while the models are converted and specviz's kernel is compiled
in the background at the lowest CPU priority (most of the full load's CPU time).  Then the ready pair is let go
and the prepared pair loads (int8 and Q4_K weights, the probe; runs asked for meanwhile wait for it, as they
waited for every load before): both at once did not fit in a CPU Space's 16 GB.  The ready pair runs in bf16,
or in fp32 where the CPU has no native bf16 and the memory holds it (:func:`specviz.models.first_start.run_dtype`);
there is no ready pair where not even bf16 fits beside the conversion.  A race run on the ready pair says so: its
target is "bf16" or "fp32", and its timings are flagged (the server was still preparing;
:func:`specviz.models.warm.preparing`).

``SPECVIZ_READY=0`` turns this off (the first run then waits for the full load, as before).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable

from ..models import PRESETS, ModelError, ModelPair, warm
from ..models.gguf_tokenizer import Unsupported
from ..theory.timing import STARTING
from .memory import available_bytes

log = logging.getLogger("specviz.app")

_BUILD = threading.Lock()  # held while the ready pair is made: the default's other callers wait for it
_READY: list[ModelPair] = []  # the ready pair, while the prepared pair is being made
_THREADS: list[threading.Thread] = []
_SERVED = threading.Event()  # the ready pair has finished a run (the conversion waits for it, a while)
FIRST_RUN_WAIT_S = 30.0  # the longest the background work waits for that first run


def _is_ready(pair: Any) -> bool:
    ready = _READY[:1]
    return bool(ready) and pair is ready[0]


def words(pair: Any) -> str:
    """Why a race on ``pair`` is not timed like the others, where it ran on the ready pair ("" elsewhere)."""
    if not _is_ready(pair):
        return ""
    return (f"{STARTING}: this race ran on the models read straight from their GGUF files "
            f"(both in {pair.target_exec}, the stock kernels) while their fast form was being prepared")


def ran(pair: Any) -> None:
    """A run on ``pair`` ended: if it was the ready pair's first, the background work may begin."""
    if _is_ready(pair):
        _SERVED.set()


def enabled() -> bool:
    return os.environ.get("SPECVIZ_READY", "1").strip() != "0"


def serving() -> ModelPair | None:
    """The ready pair while the prepared default pair is being made, else None (waits while it is built)."""
    with _BUILD:
        return _READY[0] if _READY else None


def reserve_default() -> None:
    """At a server's first start, before the page's imports (app.py): where the default pair will get a ready
    pair, ask for its memory now so its pages are faulted in meanwhile (specviz.models.arena; :func:`begin`
    takes it, or lets it go).  Imports torch and specviz's models only."""
    import torch

    from ..models import DEFAULT_PRESET, first_start
    from ..models.convert import offline_pack
    from ..models.packs import part_paths

    if not enabled() or torch.cuda.is_available():  # (service.default_preset: the CPU's default is the offline pair)
        return
    preset = PRESETS[DEFAULT_PRESET]
    if not first_start.wanted(preset.draft, preset.target, torch.device("cpu")):
        return
    try:  # (packs not installed: the load says so; no memory asked for)
        for ref in (preset.draft, preset.target):
            part_paths(offline_pack(ref))
    except ModelError:
        return
    run = first_start.run_dtype(available_bytes(), first_start.values_b(preset.draft, preset.target))
    if run is not None:
        first_start.reserve(preset.draft, preset.target, run)


def release() -> None:
    """Let go of memory :func:`reserve_default` asked for and no ready pair took."""
    from ..models import first_start

    first_start.release()


def begin(models: dict[str, Any], execution: str, load_full: Callable[[], ModelPair],
          progress: Callable[[float, str], None] | None = None) -> ModelPair | None:
    """Make the ready pair of ``models`` (load_pair's model arguments) and start ``load_full`` (the prepared
    pair's load) in the background; None, with nothing started, where no ready pair can stand in (its caches
    are on disk already: the load is quick; not two offline packs on a CPU; turned off)."""
    from ..models import first_start, loading

    with _BUILD:
        if _READY or _THREADS or not enabled():
            first_start.release()
            return _READY[0] if _READY else None
        label, draft_ref, target_ref, device = loading.resolve(**models, target_exec=execution)
        if not first_start.wanted(draft_ref, target_ref, device):
            first_start.release()
            return None
        available = available_bytes()
        # (memory reserved at the start for this pair is counted out of what is available now: its dtype was
        # chosen then; another pair's reservation is let go when this one asks for its own, first_start._claim)
        run = (first_start.reserved(draft_ref, target_ref)
               or first_start.run_dtype(available, first_start.values_b(draft_ref, target_ref)))
        if run is None:
            log.info("No ready pair: %.1f GB of memory available is too little beside the conversion; the first "
                     "run waits for the full load", (available or 0) / 1e9)
            return None
        try:
            pair = first_start.ready_pair(label, draft_ref, target_ref, progress, run=run)
        except (Unsupported, ModelError, OSError, MemoryError) as exc:
            first_start.release()
            log.info("No ready pair (%s): the first run waits for the full load", exc)
            return None
        done = warm.flag_until(pair)
        _READY.append(pair)

    def convert() -> None:
        warm.lowest_priority()  # (its OpenMP threads and the compiler inherit it)
        compiling = threading.Thread(target=first_start.build_kernel, daemon=True, name="specviz-kernel")
        compiling.start()
        try:
            first_start.convert_packs(draft_ref, target_ref)
        except Exception as exc:  # noqa: BLE001 -- the full load converts again, and says why it cannot
            log.info("Converting at a low priority failed (%s); the full load tries again", exc)
        compiling.join()

    def work() -> None:
        # The first run goes first (a Space wakes up because someone opened it: their run is the one waited for);
        # beside the conversion's memory traffic and the compiler, it took 10 s instead of ~5 on the 2-core EPYC.
        _SERVED.wait(FIRST_RUN_WAIT_S)
        # The conversion (most of the CPU time) at the lowest priority, in a thread of its own: a thread cannot
        # get its priority back unprivileged, and the rest -- the probe's timings above all -- must not be starved.
        converting = threading.Thread(target=convert, daemon=True, name="specviz-convert")
        converting.start()
        converting.join()
        # The ready pair goes before the prepared pair loads: both at once, with the probe's copies of the target,
        # peaked at 18 GB on the 2-core EPYC (a CPU Space has 16).  Runs asked for meanwhile wait for the load.
        with _BUILD:
            _READY.clear()
        done.set()
        log.info("The models are converted: the ready pair is let go, the prepared pair loads")
        try:
            full = load_full()
            log.info("The prepared pair replaces the ready one (%s)", full.target_exec)
        except Exception as exc:  # noqa: BLE001 -- the next run loads it again and says why it cannot
            log.warning("The prepared pair could not be made: %s", exc)

    thread = threading.Thread(target=work, daemon=True, name="specviz-prepare")
    _THREADS.append(thread)
    thread.start()
    return pair


def wait(timeout: float | None = None) -> bool:
    """Wait until the prepared pair replaced the ready one (True; at once where none was made)."""
    for thread in list(_THREADS):
        thread.join(timeout)
        if thread.is_alive():
            return False
    return True
