"""A warm start that serves at once: fbgemm's packing finished in the background.

Packing the int8 weights into fbgemm's layout costs ~13 ms per million weights on one core of the
AVX2 EPYC: ~20 s of CPU for the 1.5B target and ~6 s for the 0.5B draft, at every start, because the
packed layout cannot be stored.  A server that loads with ``defer_packing`` instead makes every int8
linear runnable through onednn's product over the same int8 values (a layout that takes ~1 ns a weight
to prepare, :meth:`.int8_target.TokenInt8Linear.plain`), serves, and packs here, one linear at a time,
swapping each in as it is done, in threads at the lowest CPU priority that also step aside while a run
holds the model lock.  Both products are bit-identical (integer accumulation and the same
dequantization; :func:`.int8_target.plain_matches` checks it once per process, and the loader packs at
load where it does not hold), so a run's tokens and probabilities never depend on which product ran;
only its speed does (2-3x slower products until packed), and a race that ran while packing is flagged
(:func:`preparing`).

Then the chat template's head is fed to both models and its keys and values kept
(:meth:`.lean.LeanSteps.keep_prefix`: every chat prompt begins with it), and both models' Q4_K / Q6_K records are
moved to huge pages (:mod:`.hugepages`).  Last, the models' short feeds
are traced (:meth:`.lean.LeanSteps.trace`: the target's step and verify passes, the draft's one- and
two-token steps): that writes into their KV caches, so it runs holding the server's model lock, between
runs.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from . import hugepages
from .compiled import steps_of
from .int8_target import unpacked
from .lean import LeanSteps

log = logging.getLogger("specviz.models")

_PENDING: dict[int, threading.Event] = {}  # id(target model) -> set once its pair is fully prepared
_DONE: set[int] = set()  # id(target model) of pairs found fully prepared at load (said once in the log)
_GUARD = threading.Lock()
_THREADS: list[threading.Thread] = []  # finish()'s threads, stopped between two steps when the process exits
_STOPPING = threading.Event()
EXIT_WAIT_S = 5.0  # at exit, wait this long for a step in progress (one linear, one trace) to end


# A server's start: its page is built in the main thread, pure Python under the interpreter lock, while this
# module's thread would trace the models' steps -- torch.jit.trace, pure Python too (measured on the AVX2 EPYC,
# 2026-11-26: the draft's first trace took 2.6 s beside the page's build instead of 0.4 s, and the first
# visitor's run then waited for it).  The server holds the traces until its page is served (:func:`hold_traces`,
# :func:`serving`), and a moment longer, so that the first visitors' runs take the model lock first.
_SERVING = threading.Event()
_SERVING.set()  # nothing held: a bench, a test, a CLI traces at once
SERVE_GRACE_S = 1.0
HOLD_MAX_S = 120.0  # a page never served (a failed launch) holds nothing longer than this
_SERVED_AT: list[float] = []


def hold_traces() -> None:
    """A server's page is being built: :func:`finish` packs and keeps the prompt heads, but traces nothing
    until :func:`serving` (or HOLD_MAX_S)."""
    _SERVING.clear()


def serving() -> None:
    """The server's page is up: traces may begin, SERVE_GRACE_S from now."""
    _SERVED_AT[:] = [time.monotonic()]
    _SERVING.set()


def _wait_for_serving() -> None:
    deadline = time.monotonic() + HOLD_MAX_S
    while not _SERVING.wait(0.2):
        _step()
        if time.monotonic() > deadline:
            return
    while _SERVED_AT and time.monotonic() < _SERVED_AT[0] + SERVE_GRACE_S:
        _step()
        time.sleep(0.05)


def served() -> bool:
    """Wait until the server's page is served (and SERVE_GRACE_S more), at most HOLD_MAX_S; False where the
    process is exiting meanwhile."""
    try:
        _wait_for_serving()
    except _Stopped:
        return False
    return True


class _Stopped(Exception):
    """The process is exiting: finish() stops between two steps."""


def _step() -> None:
    if _STOPPING.is_set():
        raise _Stopped


@atexit.register
def _stop_at_exit() -> None:
    """Stop finish()'s threads before the interpreter goes: a daemon thread still inside a torch op then
    ended the process with "terminate called without an active exception"."""
    _STOPPING.set()
    deadline = time.monotonic() + EXIT_WAIT_S
    for thread in list(_THREADS):
        thread.join(max(0.0, deadline - time.monotonic()))


def preparing(pair: Any) -> bool:
    """Whether ``pair``'s fast kernels are still being put in place (its runs are slower meanwhile)."""
    event = _PENDING.get(id(getattr(pair, "target", None)))
    return event is not None and not event.is_set()


def flag_until(pair: Any) -> threading.Event:
    """Flag ``pair``'s runs as made while the server prepares (:func:`preparing`) until the event returned is
    set."""
    with _GUARD:
        event = _PENDING[id(pair.target)] = threading.Event()
    return event


def wait(pair: Any, timeout: float | None = None) -> bool:
    """Wait until ``pair`` is fully prepared (True), or ``timeout`` seconds passed (False)."""
    event = _PENDING.get(id(getattr(pair, "target", None)))
    return event is None or event.wait(timeout)


def preparing_any() -> bool:
    """Whether any loaded pair is still being prepared."""
    return any(not event.is_set() for event in list(_PENDING.values()))


def wait_all(timeout: float | None = None) -> bool:
    """Wait until every pair being prepared is done (True), or ``timeout`` seconds passed (False)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for event in list(_PENDING.values()):
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not event.wait(left):
            return False
    return True


def _untraced(model: torch.nn.Module) -> Any:
    """The model's lean steps if they exist and are not traced yet (a deferred draft), else None."""
    steps = steps_of(model)
    return steps if isinstance(steps, LeanSteps) and steps.trace_deferred else None


def pending(pair: Any) -> bool:
    """Whether anything of ``pair`` was left for :func:`finish` (unpacked linears, an untraced draft, records
    not yet in huge pages)."""
    models = [m for m in (getattr(pair, "target", None), getattr(pair, "draft", None)) if m is not None]
    return any(unpacked(m) or _untraced(m) is not None or hugepages.pending(m) for m in models)


def pack_now(model: torch.nn.Module) -> None:
    """Finish ``model`` in this thread (before timing it: the probe): pack what is left, trace its steps."""
    for linear in unpacked(model):
        linear.pack()
    if hugepages.pending(model):  # before the trace, which holds the records it sees
        hugepages.rehome(model)
    steps = _untraced(model)
    if steps is not None and not steps.in_use:
        steps.trace()


YIELD_S = 3.0  # a linear waits at most this long for a run to end before it is packed beside it


def _until_free(lock: Any) -> None:
    """Wait while a run holds ``lock``, at most YIELD_S seconds (a busy room still gets its kernels)."""
    deadline = time.monotonic() + YIELD_S
    while lock is not None and getattr(lock, "locked", lambda: False)() and time.monotonic() < deadline:
        time.sleep(0.05)


def _pack_between_runs(linear: Any, lock: Any) -> None:
    """Pack ``linear`` when no run holds ``lock`` (a run has both cores to itself: the first visitors' runs
    are not slowed twice over), or after YIELD_S seconds of waiting, so a busy room still gets packed."""
    _until_free(lock)
    _step()
    linear.pack()


def lowest_priority() -> None:
    """This thread at the lowest CPU priority (Linux: a thread is a task with its own nice value), so the
    packing takes only CPU time nothing else wants: the page's start and the first runs go first."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):  # not Linux, or not allowed: it still yields to runs between linears
        pass


def _keep_heads(models: list[torch.nn.Module], lock: Any) -> None:
    """Compute the chat template head's keys and values of each model's lean steps now (a server's page is
    still being built, typically), each holding ``lock``: no visitor's prompt pass feeds them then."""
    for model in models:
        steps = steps_of(model)
        if not hasattr(steps, "keep_prefix"):
            continue
        _until_free(lock)
        _step()
        with lock if lock is not None else contextlib.nullcontext():
            t0 = time.perf_counter()
            if steps.keep_prefix():
                log.info("Kept the %s's %d-token prompt head in %.1f s", steps.role, len(steps.shared_prefix),
                         time.perf_counter() - t0)


def finish(pair: Any, *, lock: Any = None, workers: int = 1) -> threading.Thread | None:
    """Pack what ``pair``'s load left unpacked (the target's linears first: they carry most of a race's
    time), in a daemon thread with ``workers`` threads, each linear between runs where it can (while a
    run holds ``lock``, at most YIELD_S seconds later); then trace the draft's steps holding ``lock`` (the
    server's model lock: no run is using the draft's cache then).  Idempotent: returns the thread it
    started, or None when nothing was left or another call started it."""
    with _GUARD:
        key = id(pair.target)
        if key in _PENDING:
            return None
        if not pending(pair):  # nothing to pack (specviz's kernel) and every model traced at load
            if key not in _DONE:
                _DONE.add(key)
                log.info("%s → %s: weights prepared at load (nothing left to pack)", pair.draft_name,
                         pair.target_name)
            return None
        event = _PENDING[key] = threading.Event()

    def work() -> None:
        t0 = time.perf_counter()
        try:
            models = [m for m in (pair.target, pair.draft) if m is not None]  # the target's linears first
            todo = [linear for model in models for linear in unpacked(model)]
            # The packers run at the lowest priority; this thread, which traces holding the model lock
            # afterwards, keeps its own (a lock held at the lowest priority would stall runs behind it).
            with ThreadPoolExecutor(max_workers=max(1, workers), initializer=lowest_priority,
                                    thread_name_prefix="specviz-pack") as pool:
                list(pool.map(lambda m: _pack_between_runs(m, lock), todo))
            _keep_heads(models, lock)  # on the packed products (specviz's kernel: packed at load)
            _wait_for_serving()
            for model in filter(hugepages.pending, models):  # the models' records into huge pages (same bits:
                _until_free(lock)  # a run meanwhile reads either copy), before the traces, which hold what they see
                _step()
                hugepages.rehome(model)
            for model in models[::-1]:  # the draft's two feeds first: a round takes several draft steps
                steps = _untraced(model)
                # One feed length at a time, each holding the lock (~1 s for the target's): a run that
                # arrives meanwhile waits for one trace, not all nine (it then runs the eager forward, the
                # same bits); the whole target took ~10 s and held up a warm start's first run.
                for t in steps.feeds if steps is not None else ():
                    _until_free(lock)
                    _step()
                    with lock if lock is not None else contextlib.nullcontext():
                        if not steps.in_use:
                            steps.trace((t,))
                    time.sleep(0.05)  # a lock is not fair: let a run that waited take it before the next trace
            log.info("%s → %s: weights prepared (packed, %d linears) in %.1f s after serving began",
                     pair.draft_name, pair.target_name, len(todo), time.perf_counter() - t0)
        except _Stopped:
            pass  # the process is exiting
        except Exception as exc:  # noqa: BLE001 -- the onednn path stays correct, only slower
            log.warning("Preparing the fast kernels failed (%s); the models run on the slower products", exc)
        finally:
            event.set()

    thread = threading.Thread(target=work, daemon=True, name="specviz-pack")
    _THREADS[:] = [t for t in _THREADS if t.is_alive()] + [thread]
    thread.start()
    return thread
