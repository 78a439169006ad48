"""One run from a click or an API call to the engine: checked once, then claimed, gated and decoded.

    RunForm (raw values)  --check()-->  Job (checked)  --run_job()-->  Loading, Waiting, Decoding…, Finished
                                                                  or  Replaying…, Finished (an identical run)

The Live tab (`specviz.ui.live.run`) and the `/trace` API (`specviz.ui.api`) both consume
`run_job`'s events and only decide how to show them.  The sweeps take `RunForm.request`.

- **Checked once**: `RunForm.check` validates every value before any model loads (`InputError`);
  the `Job` it returns carries the checked prompt and `DecodeSettings`, and loading only adds the
  checks that need the tokenizer (prompt length).
- **Claimed**: a request identical to a finished run is answered from the recording cache
  (`serving.replay.CACHE`), one identical to a run in progress follows it.
- **Gated**: `GATE` lets one run at a time use the models, with a bounded queue (`Busy`).  The gate
  is left as soon as the engine is done, *before* `Finished` is handed over, so whatever the
  consumer does then (the page's tree walks still to play) never holds the models.
- **One client, a share**: a client (its address) has at most `serving.client_runs.RUNS_PER_CLIENT` live
  runs waiting for or holding the models (`ClientBusy`); a run whose client is gone (its ``should_stop``,
  serving.cancel) leaves the gate's queue at once (issue 62).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Union

from ..core.settings import DecodeSettings
from ..trace import Trace
from .client_runs import CLIENT_RUNS
from .liveness import current_client
from .replay import CACHE, GATE, Abandoned, Entry, RunKey, Snapshot, follow, replay, run_key, snapshot
from .service import (InputError, Request, Update, check_request, check_target_exec, describe_error, get_pair, load_needed,
                      race, tokenize)

log = logging.getLogger("specviz.jobs")
CLAIMS = 3  # a followed run that stops leaves the request to claim again, at most this often


@dataclass(frozen=True)
class RunForm:
    """The raw values of the Live tab's form (or the API's parameters), not yet validated."""

    preset: Any = None  # a preset name or id; "" / None: the default pair
    draft_id: Any = ""  # custom pair only
    target_id: Any = ""
    prompt: Any = ""
    gamma: Any = 5
    epsilon: Any = 0.0
    variant: Any = "opt"
    temperature: Any = 0.0
    top_p: Any = 1.0
    max_new_tokens: Any = 32
    seed: Any = 0
    drafter: Any = "model"
    policy: Any = "constant"
    tau: Any = 0.4
    branches: Any = 2  # the tree drafter only (γ is then the tree's depth)
    tree_nodes: Any = 16
    tree_mode: Any = "best-first"
    target_exec: Any = None  # how the target executes: "auto", "bf16", "int8"…; "" / None: the server's default
    rule: Any = "token"  # the chains' verification rule: "token", "block" or "match"

    def raw_settings(self) -> dict[str, Any]:
        """The decoding settings as sent, for DecodeSettings.checked."""
        skip = ("preset", "draft_id", "target_id", "prompt", "target_exec")
        return {k: v for k, v in asdict(self).items() if k not in skip}

    def check(self, standard: Any = True) -> "Job":
        """Every check that needs no model (InputError), once: run before loading one, so bad input fails fast."""
        text, settings = check_request(self.prompt, **self.raw_settings())
        execution = check_target_exec(self.target_exec)
        if not isinstance(standard, bool):
            raise InputError(f"standard must be true or false, not a {type(standard).__name__}.")
        return Job(form=self, prompt=text, settings=settings, execution=execution, standard=standard)

    def request(self, progress: Callable[[float, str], None] | None = None) -> Request:
        """Check the form, load the pair (reporting progress) and tokenise the prompt: InputError / ModelError."""
        return self.check().request(progress)


@dataclass(frozen=True)
class Job:
    """A checked run: the prompt and settings as the engine will take them, the target's execution,
    and whether the standard baseline runs too."""

    form: RunForm
    prompt: str
    settings: DecodeSettings
    execution: str
    standard: bool = True

    @property
    def key(self) -> RunKey | None:
        return run_key(self.form.preset, self.prompt, self.settings, self.standard, self.execution)

    def request(self, progress: Callable[[float, str], None] | None = None, gated: bool = False) -> Request:
        """Load the pair (once per process) and tokenise the prompt: InputError / ModelError (and Busy when a
        pair other than the default must load and the gate's queue is full; ``gated``: the caller holds it)."""
        f = self.form
        pair = get_pair(f.preset, f.draft_id, f.target_id, progress=progress, target_exec=f.target_exec, gated=gated)
        return tokenize(pair, self.prompt, self.settings)

    @property
    def loads(self) -> bool:
        """Whether this job would load a pair other than the server's default (service.load_needed)."""
        f = self.form
        return load_needed(f.preset, f.draft_id, f.target_id, f.target_exec)


def request_at_gate(job: Job, progress: Callable[[float, str], None] | None = None,
                    priority: str = "live") -> Iterator[int]:
    """The job's request, with the live gate held on return (`GATE.leave()` it), yielding the number
    waiting while it waits: `req = yield from request_at_gate(job)`.

    A pair other than the default that is not loaded yet loads *inside* the gate, as a run would use
    it (issue 33: a visitor's loading must not slow the runs in progress); otherwise the request (the
    prompt's length in tokens) is checked first, so a bad one is refused without waiting."""
    if job.loads:
        for ahead in GATE.enter(priority=priority):
            yield ahead
        try:
            return job.request(progress, gated=True)
        except BaseException:
            GATE.leave()
            raise
    req = job.request(progress)
    for ahead in GATE.enter(priority=priority):
        yield ahead
    return req


# ---- what run_job yields ---------------------------------------------------------------------


@dataclass
class Loading:
    """The models are being loaded (or found loaded)."""


@dataclass
class Waiting:
    """In the gate's queue: `ahead` runs waiting, this one included."""

    ahead: int


@dataclass
class Decoding:
    """One step of the race, live: `update.phase` is "speculative" or "standard"."""

    update: Update


@dataclass
class Replaying:
    """A step of an identical run served from the cache: replayed at its recorded times ("replay") or
    followed while it runs ("follow"); `snapshot` is None while the followed run waits for the models."""

    entry: Entry
    how: str
    snapshot: Snapshot | None


@dataclass
class Finished:
    """The run is over (the models are free again): its traces, and the entry it was replayed from."""

    spec: Trace | None
    std: Trace | None
    replayed: Entry | None = None
    how: str = "live"


JobEvent = Union[Loading, Waiting, Decoding, Replaying, Finished]


class RunFailed(RuntimeError):
    """The run broke while decoding (out of memory, a broken model…); the message is for the user,
    the traceback went to the log."""


class Stalled(RuntimeError):
    """Every identical run this request followed stopped before finishing."""


def run_job(job: Job, progress: Callable[[float, str], None] | None = None,
            should_stop: Callable[[], bool] | None = None, client: str | None = None) -> Iterator[JobEvent]:
    """Run a checked job to its end, yielding what a client shows.  ``should_stop``: the client's cancel flag
    (serving.cancel), read while waiting for the models, between rounds and between a long prompt's chunks: a
    run told to stop while it waits ends with no `Finished`.  ``client``: the address whose share of live runs
    this one takes (serving.client_runs); by default the client of the Gradio event being served (none outside
    one: a run from Python is never limited).

    Raises InputError / ModelError while loading, Busy when the queue is full (ClientBusy when the client has
    its share of live runs), RunFailed when the run breaks, Stalled when followed runs kept stopping.  Closing
    the generator (a cancelled event, Stop) ends the engine's loop within a round, frees its caches and leaves
    the gate."""
    for _ in range(CLAIMS):
        how, entry = CACHE.claim(job.key)
        try:
            if how in ("lead", "live"):
                yield from _live(job, entry, progress, should_stop, client or current_client())
            else:
                yield from _replayed(entry, how)
            return
        except Abandoned:
            continue
    raise Stalled("The identical runs in progress kept stopping; try again.")


def _live(job: Job, entry: Entry | None, progress: Callable[[float, str], None] | None,
          should_stop: Callable[[], bool] | None = None, client: str | None = None) -> Iterator[JobEvent]:
    stop = should_stop or (lambda: False)
    try:
        if stop():  # e.g. a follower whose client left, claiming the run again: it never waits
            return
        yield Loading()
        with CLIENT_RUNS.hold(client, GATE.retry_s()):  # the client's share, until the models are free again
            with contextlib.closing(request_at_gate(job, progress)) as waits:  # closed: it leaves the queue
                while True:
                    if stop():  # the client went away (or pressed Stop) while waiting
                        return
                    try:
                        yield Waiting(next(waits))
                    except StopIteration as done:
                        req = done.value
                        break
            final = Update("done", None)
            try:
                # closing(): a cancelled job ends the engine's loop here (its `finally` frees the KV caches).
                with contextlib.closing(race(req, stop, standard=job.standard)) as updates:
                    for up in updates:
                        if up.phase == "done":
                            final = up
                            continue
                        if entry is not None:
                            CACHE.update(entry, snapshot(up.spec), snapshot(up.std), up.spec_done)
                        yield Decoding(up)
            except Exception as exc:  # out of memory, a broken model…: a clean error, the server carries on
                log.exception("run failed")
                raise RunFailed(describe_error(exc)) from exc
            finally:
                GATE.leave()
        if entry is not None:
            entry.machine = final.spec.device if final.spec is not None else ""
            CACHE.finish(entry, final.spec, final.std)
        yield Finished(final.spec, final.std)
    finally:  # a finished run was already handed to the cache; anything else leaves it
        if entry is not None and not entry.done:
            CACHE.abandon(entry)


def _replayed(entry: Entry, how: str) -> Iterator[JobEvent]:
    for snap in (replay(entry) if how == "replay" else follow(entry)):
        if snap is not None and snap.phase == "done":
            yield Finished(snap.spec, snap.std, replayed=entry, how=how)
            return
        yield Replaying(entry, how, snap)


__all__ = ["CLAIMS", "Decoding", "Finished", "Job", "JobEvent", "Loading", "Replaying", "RunFailed", "RunForm",
           "Stalled", "Waiting", "request_at_gate", "run_job"]
