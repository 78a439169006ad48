"""The named API endpoint ``/trace``: one decode, streamed, returned as a JSON recording."""

from __future__ import annotations

import contextlib
import inspect
import json
import time
from typing import Any, Callable, Iterator

import gradio as gr

from ..models import ModelError
from ..serving import input_types
from ..serving.cancel import CANCELS
from ..serving.clients import client_key
from ..serving.jobs import Decoding, Finished, JobEvent, Replaying, RunFailed, RunForm, Stalled, run_job
from ..serving.replay import Busy, Snapshot, replay_json
from ..serving.service import InputError
from ..trace import recording_to_json

API_STREAM_S = 0.5  # the API sends the recording so far at most twice a second


def api_trace(prompt: str = "", preset: str = "", gamma: int = 5, epsilon: float = 0.0,
              temperature: float = 0.0, top_p: float = 1.0, max_new_tokens: int = 32, seed: int = 0,
              variant: str = "opt", standard: bool = True, drafter: str = "model", policy: str = "constant",
              tau: float = 0.4, branches: int = 2, tree_nodes: int = 16,
              tree_mode: str = "best-first", target_exec: str = "", rule: str = "token",
              request: gr.Request = None) -> Iterator[dict]:
    """Run speculative decoding (and, unless standard=False, the standard baseline) and
    return the recording: {"schema": "specviz.recording", "speculative": trace, "standard": trace}.

    drafter: "model" (the pair's draft model), "prompt-lookup" (n-grams of the text so far), "hybrid" (prompt
    lookup where the last 5+ tokens occurred before, the draft model otherwise) or
    "tree" (a token tree of depth gamma, at most tree_nodes nodes, grown by tree_mode "iid":
    `branches` i.i.d. draft sequences merged, "best-first": top-`branches` children of the
    most likely nodes, or "unique": `branches` distinct children per expanded node sampled
    without replacement; exact only: epsilon 0, variant "opt", policy "constant").
    policy: the draft length per round, "constant" (always γ) or "heuristic", "confidence" (stop
    below the drafter's confidence tau), "adaptive" (stop when a token is not worth its cost),
    for which gamma is the maximum (up to 32).
    target_exec: how the target model executes: "auto" (measured once on this machine: the execution
    with the fastest predicted speculative rate), or "bf16", "fp32", "int8" on a CPU server and "bf16",
    "fp16", "bf16+graphs", "fp16+graphs" on a GPU one; "" is the server's default (SPECVIZ_TARGET_EXEC,
    else auto).  Standard decoding runs the same execution.  The recording's models.target_exec and
    models.machine say what ran where.

    While decoding, the recording so far is streamed (marked "partial": true) at most twice a
    second; the last output is the finished recording (what `Client.predict` returns).
    A request identical to an earlier one (same pair, prompt, settings, seed, standard) is
    answered from that run's recording, streamed at its recorded times (at most a minute) and
    marked "replay": {"recorded_at": ISO time, "machine": device, "source": ...}.
    When the models are busy with too many runs waiting, the error says when to retry.
    rule: how a chain's drafts are verified, "token" (Leviathan et al.'s token-wise rejection sampling),
    "block" (Sun et al. 2025's block verification) or "match" (keep a draft token only when the target's
    own sample equals it); all exact; epsilon and variant "uno" apply to "token" only, trees take "token".
    A run lasts as long as its client listens for it (serving.liveness), whether it waits for the models or
    decodes.  A gradio_client that exits stops its run within about one round (or one chunk of a long prompt's
    pass); over plain HTTP, a result stream (GET /gradio_api/call/trace/{event_id}) that is dropped, or not
    opened within 3 seconds of the run's start, stops it that long after, plus a round or a chunk.
    `Job.cancel()` ends the job's stream: the run stops at its next round, or, in a long prompt's pass, as a
    dropped stream does (if the client has other jobs under way, at the pass's end).  One client address has
    at most SPECVIZ_RUNS_PER_CLIENT (4) live runs waiting for or using the models; beyond, the error says so
    (replays, and runs following an identical one in progress, are not limited)."""
    form = RunForm(preset=preset, prompt=prompt, gamma=gamma, epsilon=epsilon, temperature=temperature, top_p=top_p,
                   max_new_tokens=max_new_tokens, seed=seed, variant=variant, drafter=drafter, policy=policy, tau=tau,
                   branches=branches, tree_nodes=tree_nodes, tree_mode=tree_mode, target_exec=target_exec, rule=rule)
    session = getattr(request, "session_hash", None)
    # Set by a client that goes away: the app's unload event, or no event stream open (serving.cancel, .liveness).
    flag = CANCELS.start(session)
    try:
        job = form.check(standard=standard)  # before loading any model
        events = run_job(job, should_stop=flag.is_set, client=client_key(request) if request is not None else None)
        with contextlib.closing(events):  # a cancelled job ends at once
            yield from _stream(events, flag.is_set)
    except (InputError, ModelError, Busy, RunFailed, Stalled) as exc:
        raise gr.Error(str(exc), print_exception=False)
    finally:
        CANCELS.finish(session, flag)


def _stream(events: Iterator[JobEvent], stop: Callable[[], bool] = lambda: False) -> Iterator[dict]:
    """The recording so far, at most every API_STREAM_S, then the finished one.  A replay (or a followed run)
    ends when ``stop`` says so: nobody is left to see it."""
    last = time.perf_counter()
    for ev in events:
        if isinstance(ev, Replaying) and stop():
            return
        now = time.perf_counter()
        if isinstance(ev, Finished):
            if ev.replayed is not None:
                yield replay_json(Snapshot(ev.spec, ev.std, "done"), ev.replayed)
            else:
                yield json.loads(recording_to_json(ev.spec, ev.std))
        elif now - last < API_STREAM_S:
            continue
        elif isinstance(ev, Decoding):
            last = now
            yield {**json.loads(recording_to_json(ev.update.spec, ev.update.std)), "partial": True}
        elif isinstance(ev, Replaying) and ev.snapshot is not None:
            last = now
            yield replay_json(ev.snapshot, ev.entry)


class ApiBlocks(gr.Blocks):
    """gr.Blocks whose public endpoints take a short data list from a raw HTTP client
    (POST /gradio_api/call/trace with [] or the first few values): the parameters left out
    get their defaults, as `gradio_client` would send them.  Gradio itself refuses a short
    list with a ValueError whose message never reaches the client ({"error": null})."""

    def validate_inputs(self, block_fn: Any, inputs: list[Any]) -> None:
        need = len(block_fn.inputs)
        if block_fn.api_visibility == "public" and block_fn.fn is not None and len(inputs) < need:
            params = list(inspect.signature(block_fn.fn).parameters.values())[len(inputs):need]
            if any(p.default is p.empty for p in params):
                names = ", ".join(p.name for p in params if p.default is p.empty)
                raise gr.Error(f"Missing values for: {names} (this endpoint takes {need} values, got {len(inputs)}).",
                               print_exception=False)
            inputs.extend(p.default for p in params)  # preprocess_data reads this very list next
        super().validate_inputs(block_fn, inputs)
        input_types.check(block_fn, inputs)  # before Gradio stores a value in the session (issue 62)
