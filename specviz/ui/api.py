"""The named API endpoint ``/trace``: one decode, streamed, returned as a JSON recording."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from typing import Iterator

import gradio as gr

from ..models import ModelError
from ..service import MODEL_LOCK, InputError, describe_error, race
from ..trace import recording_to_json
from .form import RunForm

log = logging.getLogger("specviz.app")
API_STREAM_S = 0.5  # the API sends the recording so far at most twice a second


def api_trace(prompt: str, preset: str = "", gamma: int = 5, epsilon: float = 0.0,
              temperature: float = 0.0, top_p: float = 1.0, max_new_tokens: int = 32, seed: int = 0,
              variant: str = "opt", standard: bool = True, drafter: str = "model", policy: str = "constant",
              tau: float = 0.4, branches: int = 2, tree_nodes: int = 16,
              tree_mode: str = "best-first") -> Iterator[dict]:
    """Run speculative decoding (and, unless standard=False, the standard baseline) and
    return the recording: {"schema": "specviz.recording", "speculative": trace, "standard": trace}.

    drafter: "model" (the pair's draft model), "prompt-lookup" (n-grams of the text so far) or
    "tree" (a token tree of depth gamma, at most tree_nodes nodes, grown by tree_mode "iid":
    `branches` i.i.d. draft sequences merged, or "best-first": top-`branches` children of the
    most likely nodes; exact only: epsilon 0, variant "opt", policy "constant").
    policy: the draft length per round, "constant" (always γ) or "heuristic", "confidence" (stop
    below the drafter's confidence tau), "adaptive" (stop when a token is not worth its cost),
    for which gamma is the maximum (up to 32).

    While decoding, the recording so far is streamed (marked "partial": true) at most twice a
    second; the last output is the finished recording (what `Client.predict` returns).
    Cancelling the job (`Job.cancel()`) stops decoding within about one round."""
    form = RunForm(preset=preset, prompt=prompt, gamma=gamma, epsilon=epsilon, temperature=temperature, top_p=top_p,
                   max_new_tokens=max_new_tokens, seed=seed, variant=variant, drafter=drafter, policy=policy, tau=tau,
                   branches=branches, tree_nodes=tree_nodes, tree_mode=tree_mode)
    try:
        form.check()  # before loading any model
        if not isinstance(standard, bool):
            raise InputError(f"standard must be true or false, not a {type(standard).__name__}.")
        req = form.request()
    except Exception as exc:
        if not isinstance(exc, (InputError, ModelError)):
            log.exception("api run failed")
        raise gr.Error(describe_error(exc), print_exception=False)
    spec = std = None
    last = time.perf_counter()
    try:
        # A cancelled job closes this generator at a yield: closing `updates` ends the
        # engine's loop (its `finally` frees the KV caches), then the lock is released.
        with MODEL_LOCK, contextlib.closing(race(req, standard=standard)) as updates:
            for up in updates:
                spec, std = up.spec, up.std
                now = time.perf_counter()
                if up.phase != "done" and now - last >= API_STREAM_S:
                    last = now
                    yield {**json.loads(recording_to_json(spec, std)), "partial": True}
    except Exception as exc:  # out of memory, a broken model…: a clean error, the server carries on
        log.exception("api run failed")
        raise gr.Error(describe_error(exc), print_exception=False)
    yield json.loads(recording_to_json(spec, std))
