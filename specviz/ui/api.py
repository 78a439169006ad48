"""The named API endpoint ``/trace``: one decode, streamed, returned as a JSON recording."""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import time
from typing import Any, Iterator

import gradio as gr

from ..models import ModelError
from ..serving.replay import CACHE, GATE, Abandoned, Busy, Entry, follow, replay, replay_json, run_key, snapshot
from ..serving.service import InputError, describe_error, race
from ..trace import recording_to_json
from .form import RunForm

log = logging.getLogger("specviz.app")
API_STREAM_S = 0.5  # the API sends the recording so far at most twice a second


def api_trace(prompt: str = "", preset: str = "", gamma: int = 5, epsilon: float = 0.0,
              temperature: float = 0.0, top_p: float = 1.0, max_new_tokens: int = 32, seed: int = 0,
              variant: str = "opt", standard: bool = True, drafter: str = "model", policy: str = "constant",
              tau: float = 0.4, branches: int = 2, tree_nodes: int = 16,
              tree_mode: str = "best-first", target_exec: str = "", rule: str = "token") -> Iterator[dict]:
    """Run speculative decoding (and, unless standard=False, the standard baseline) and
    return the recording: {"schema": "specviz.recording", "speculative": trace, "standard": trace}.

    drafter: "model" (the pair's draft model), "prompt-lookup" (n-grams of the text so far) or
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
    Cancelling the job (`Job.cancel()`) stops decoding within about one round."""
    form = RunForm(preset=preset, prompt=prompt, gamma=gamma, epsilon=epsilon, temperature=temperature, top_p=top_p,
                   max_new_tokens=max_new_tokens, seed=seed, variant=variant, drafter=drafter, policy=policy, tau=tau,
                   branches=branches, tree_nodes=tree_nodes, tree_mode=tree_mode, target_exec=target_exec, rule=rule)
    try:
        text, settings = form.check()  # before loading any model
        execution = form.execution()
        if not isinstance(standard, bool):
            raise InputError(f"standard must be true or false, not a {type(standard).__name__}.")
    except InputError as exc:
        raise gr.Error(describe_error(exc), print_exception=False)
    key = run_key(preset, text, settings, standard, execution)
    for _ in range(3):  # a followed run that stops leaves this request to claim again
        how, entry = CACHE.claim(key)
        try:
            if how in ("lead", "live"):
                yield from _live(form, standard, entry)
            else:
                yield from _replayed(entry, how)
            return
        except Abandoned:
            continue
    raise gr.Error("The identical runs in progress kept stopping; try again.", print_exception=False)


def _replayed(entry: Entry, how: str) -> Iterator[dict]:
    last = time.perf_counter()
    for snap in (replay(entry) if how == "replay" else follow(entry)):
        now = time.perf_counter()
        if snap is not None and (snap.phase == "done" or now - last >= API_STREAM_S):
            last = now
            yield replay_json(snap, entry)


def _live(form: RunForm, standard: bool, entry: Entry | None) -> Iterator[dict]:
    try:
        try:
            req = form.request()
            for _ in GATE.enter():
                pass
        except Exception as exc:
            if not isinstance(exc, (InputError, ModelError, Busy)):
                log.exception("api run failed")
            raise gr.Error(describe_error(exc) if not isinstance(exc, Busy) else str(exc), print_exception=False)
        try:
            spec, std = yield from _decode(req, standard, entry)
        finally:
            GATE.leave()
        if entry is not None:
            entry.machine = spec.device
            CACHE.finish(entry, spec, std)
        yield json.loads(recording_to_json(spec, std))
    finally:
        if entry is not None and not entry.done:
            CACHE.abandon(entry)


def _decode(req, standard: bool, entry: Entry | None):
    spec = std = None
    last = time.perf_counter()
    try:
        # A cancelled job closes this generator at a yield: closing `updates` ends the
        # engine's loop (its `finally` frees the KV caches), then the lock is released.
        with contextlib.closing(race(req, standard=standard)) as updates:
            for up in updates:
                spec, std = up.spec, up.std
                if entry is not None and up.phase != "done":
                    CACHE.update(entry, snapshot(spec), snapshot(std))
                now = time.perf_counter()
                if up.phase != "done" and now - last >= API_STREAM_S:
                    last = now
                    yield {**json.loads(recording_to_json(spec, std)), "partial": True}
    except Exception as exc:  # out of memory, a broken model…: a clean error, the server carries on
        log.exception("api run failed")
        raise gr.Error(describe_error(exc), print_exception=False)
    return spec, std


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
