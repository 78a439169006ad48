"""Speculative and standard decoding loops that record every step as a trace.

The speculative loop is Leviathan et al. 2023, Algorithm 1 (Chen et al. 2023),
with Yin et al.'s (NeurIPS 2024) over-acceptance threshold ε:

    draft x_1..x_k ~ q, k ≤ γ chosen by a policy    (a Drafter, streamed)
    p_1..p_{γ+1} = target(prefix + x_1..x_γ)         (one forward pass)
    accept x_i while u_i < b_i = min(1, (p_i(x_i) + ε) / q_i(x_i))
    first rejection: emit a correction ~ residual   (Decoding-OPT; p for UNO)
    all accepted: emit a bonus ~ p_{γ+1}

Each drafted token is yielded as an event the moment it exists; the policy
(specviz.core.policy) and EOS decide when to stop asking the drafter for more.
Both models keep a KV cache holding a prefix of the emitted text; each forward
feeds only the tokens the cache does not hold yet, and a rejection crops the
cache back to the accepted prefix.  The engine knows nothing of the UI: it
yields events and returns a `Trace` of plain data.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from ..trace import DraftToken, Extra, Position, Round, Token, Trace
from .drafting import DraftContext, Drafter
from .kv import PromptStopped, cached_lm, feed_prompt
from .policy import RoundReport, make_policy
from .sampling import Warp, sample
from .picture import pictures
from .verify import verify_chain
from .settings import GAMMA_MAX_DYNAMIC, DecodeSettings
from .text import Detokenizer, token_text
from .tree_round import TreeRun


class Clock:
    """Seconds since the run started, waiting for the GPU before reading so timings are true.

    The engine is a generator: while a consumer holds an event (a page redraw, say)
    the run is paused, and `hold()` keeps that time out of every later reading, so
    the trace measures the decoding, not the page."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.t0 = self._now()

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def __call__(self) -> float:
        return self._now() - self.t0

    def hold(self, event: "Event") -> Iterator["Event"]:
        """Yield an event; the time until the consumer asks for the next one is not counted."""
        t = time.perf_counter()
        yield event
        self.t0 += time.perf_counter() - t


@dataclass
class Event:
    """What a decoding generator yields.

    kind: "draft" (a token was just drafted; `round` is the partial round),
    "round" (a round finished: verdicts known), "done" (the trace is final).
    """

    kind: str
    trace: Trace
    round: Round | None = None


def _new_trace(kind, pair, prompt, prompt_ids, settings: DecodeSettings, drafter_name: str) -> Trace:
    return Trace(
        kind=kind,
        prompt=prompt,
        prompt_tokens=len(prompt_ids),
        settings=settings,
        models={
            "preset": getattr(pair, "preset", ""),
            "draft": getattr(pair, "draft_name", ""),
            "target": getattr(pair, "target_name", ""),
            "drafter": drafter_name if kind == "speculative" else "",
            "dtype": str(getattr(pair, "dtype", "")).replace("torch.", ""),
            "draft_quant": str(getattr(pair, "draft_quant", None) or "none"),
            # How the target executed and on which machine (models.executions / hardware.machine);
            # recordings from before these keys simply lack them.
            "target_exec": str(getattr(pair, "target_exec", "") or ""),
            "machine": _machine_label(pair),
            # "gguf": the target's GGUF matrices multiplied as stored (models.q4k); absent: its own
            **({"target_weights": pair.target_weights} if getattr(pair, "target_weights", "") else {}),
        },
        device=pair.device_label() if hasattr(pair, "device_label") else str(pair.device),
    )


# The machine's description for a trace whose pair has no probe (which knows its machine): set by
# specviz.hardware when it is imported (the core imports no hardware).
_DESCRIBE_MACHINE: list[Callable[[torch.device], str]] = []


def set_machine_describer(describe: Callable[[torch.device], str]) -> None:
    _DESCRIBE_MACHINE[:] = [describe]


def _machine_label(pair: Any) -> str:
    probe = getattr(pair, "probe", None)
    if probe is not None:
        return str(probe.machine.get("label", ""))
    device = getattr(pair, "device", None)
    if device is None or not _DESCRIBE_MACHINE:
        return ""
    return _DESCRIBE_MACHINE[0](device)


def _warp_for(settings: DecodeSettings) -> Warp:
    return Warp(settings.temperature, settings.top_k, settings.top_p)


def _generator(settings: DecodeSettings, device: torch.device) -> torch.Generator:
    # On the model's device, so sampling never copies a vocabulary vector to the host.
    gen = torch.Generator(device=device)
    gen.manual_seed(settings.seed)
    return gen


def _relay(steps: Iterator[None], clock: Clock, trace: Trace, rnd: Round) -> Iterator[Event]:
    """A round's progress ticks as "draft" events (consumer time kept off the clock); returns
    what the round returned."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value
        yield from clock.hold(Event("draft", trace, rnd))


# ---- speculative decoding ---------------------------------------------------------


def _speculative_events(
    pair: Any,
    prompt_ids: list[int],
    settings: DecodeSettings,
    *,
    prompt: str = "",
    drafter: Drafter,
    should_stop: Callable[[], bool] = lambda: False,
) -> Iterator[Event]:
    """Speculative decoding as a stream of events; the last event is "done".

    ``drafter``: built by the caller for the pair (specviz.drafters.make_drafter(pair, settings) for
    settings.drafter); the engine imports no drafter."""
    device = pair.device
    eos = set(pair.eos_token_ids)
    policy = make_policy(settings)
    is_tree = drafter.round_kind == "tree"
    # A backend's steps where it has some for this run (models.compiled, models.lean; trees only where they
    # take them), else the eager cache.
    need = len(prompt_ids) + settings.max_new_tokens + max(GAMMA_MAX_DYNAMIC, settings.tree_nodes if is_tree else 0) + 1
    target = cached_lm(pair.target, device, need, trees=is_tree)
    warp, gen = _warp_for(settings), _generator(settings, device)
    detok = Detokenizer(pair.tokenizer)
    piece = functools.partial(token_text, pair.tokenizer)
    trace = _new_trace("speculative", pair, prompt, prompt_ids, settings, drafter.name)
    eps, budget = settings.epsilon, settings.max_new_tokens
    ids = list(prompt_ids)
    n_prompt = len(ids)
    clock = Clock(device)
    # A tree drafter's rounds draft, verify and roll back in specviz.core.tree_round.
    tree = TreeRun(drafter=drafter, target=target, ids=ids, warp=warp, gen=gen, device=device, eos=eos, piece=piece,
                   detok=detok, clock=clock, mode=settings.tree_mode) if is_tree else None
    try:
        done, hidden = False, None
        try:
            # A long prompt is fed in chunks with a stop check between them (core.kv.feed_prompt): the run's
            # Stop, time budget or closed page ends its prompt pass within one chunk.
            drafter.start(ids, should_stop)
            trace.draft_prefill = clock()
            # The target's prompt pass is merged into the first verify pass (one pass fewer, as in
            # transformers' assisted generation; a tree's mask lets the prompt attend causally and
            # the nodes attend to it), except for a drafter that reads the target's hidden state
            # before it drafts (the learned head).  A long prompt's chunks but the last go first.
            feed_prompt(target, ids, should_stop)
            if drafter.needs_hidden:
                # The target's hidden state that produced ids[-1], for drafters that read it.
                hidden = target.prefill(ids, hidden=drafter.needs_hidden)
        except PromptStopped:
            done, trace.stop_reason = True, "stopped"
            trace.draft_prefill = trace.draft_prefill or clock()
        trace.t_prefill = clock()
        trace.target_prefill = trace.t_prefill - trace.draft_prefill
        while not done:
            if should_stop():
                trace.stop_reason = "stopped"
                break
            n_gen = len(ids) - n_prompt
            rnd = Round(index=len(trace.rounds), n_before=n_gen, t_start=clock())
            # Never draft past the token budget: the round emits at most limit + 1 tokens.
            room = budget - n_gen - 1
            limit = min(policy.limit(), room)
            if tree is not None:
                if (yield from _relay(tree.round(rnd, limit, settings.gamma, policy), clock, trace, rnd)):
                    done, trace.stop_reason = True, "eos"
                trace.t_tracing, tree.tracing = trace.t_tracing + tree.tracing, 0.0
                if not done and len(ids) - n_prompt >= budget:
                    done, trace.stop_reason = True, "max_new_tokens"
                trace.rounds.append(rnd)
                trace.t_total = rnd.t_end
                yield from clock.hold(Event("round", trace, rnd))
                continue

            # 1. Draft, one token at a time, each shown as soon as it exists.
            tokens: list[int] = []
            qs: list[torch.Tensor] = []
            beliefs: list[torch.Tensor | None] = []  # the drafter's raw logits (the picture, greedy runs)
            confs: list[float] = []
            rnd.draft_stop = "none"
            if limit > 0:
                ctx = DraftContext(ids, limit, warp, gen, device, hidden if drafter.needs_hidden else None)
                steps = drafter.draft(ctx)
                rnd.draft_stop = "exhausted"
                try:
                    for step in steps:
                        tokens.append(step.token)
                        qs.append(step.q)
                        beliefs.append(step.logits)
                        confs.append(step.confidence)
                        rnd.draft_forwards += step.forwards
                        t_s = time.perf_counter()
                        rnd.draft.append(DraftToken(step.token, piece(step.token), float(step.q[step.token]),
                                                    step.confidence))
                        trace.t_tracing += time.perf_counter() - t_s
                        rnd.t_draft = clock() - rnd.t_start
                        yield from clock.hold(Event("draft", trace, rnd))
                        # Stop on EOS for every drafter: nothing after an end of text can be emitted.
                        if step.token in eos:
                            why = "eos"
                        elif len(tokens) >= limit:
                            why = "budget" if room < policy.limit() else "limit"
                        else:
                            why = policy.stop(confs)  # the draft-length policy (draft side only)
                        if why:
                            rnd.draft_stop = why
                            break
                finally:
                    steps.close()
            t_v0 = clock()
            rnd.t_draft = t_v0 - rnd.t_start
            k = len(tokens)

            # 2. Verify: one target forward over the uncached suffix + the k drafts.
            fed = len(ids) + k - target.cached
            # The first pass also reads what is left of the prompt (a long one's chunks were fed before it).
            rnd.prompt_fed = max(0, n_prompt - 1 - target.cached) if not trace.rounds else 0
            out = target.feed(ids + tokens, keep=k + 1, hidden=drafter.needs_hidden)
            verdict = verify_chain(tokens=tokens, q=torch.stack(qs) if qs and not warp.greedy else None,
                                   logits=out.logits, warp=warp, epsilon=eps, variant=settings.variant,
                                   generator=gen, stop_tokens=eos, rule=settings.rule)
            trace.t_tracing += verdict.tracing_seconds
            rnd.positions.extend(Position(**vars(j)) for j in verdict.judged)
            t_s = time.perf_counter()  # the acceptance picture's numbers: tracing
            for pos, pic in zip(rnd.positions, _pictures(tokens, qs, beliefs, out.logits, verdict, warp, settings,
                                                          piece)):
                pos.picture = pic
            trace.t_tracing += time.perf_counter() - t_s
            for d, o in zip(rnd.draft, verdict.odds):  # for "same draft, three rules"
                d.p, d.h = o.p, o.h
            n_acc = verdict.accepted
            for tok in tokens[:n_acc]:
                rnd.emitted.append(Token(tok, detok.push(tok), "accepted"))
            ids.extend(tokens[:n_acc])
            if verdict.token is None:  # the accepted draft ended in EOS: the text ends there
                done, trace.stop_reason = True, "eos"
            else:
                y = verdict.token
                rnd.extra = Extra(y, piece(y), verdict.kind, verdict.p_token)
                rnd.emitted.append(Token(y, detok.push(y), verdict.kind))
                ids.append(y)
                if out.hidden is not None:
                    hidden = out.hidden[n_acc]
                if y in eos:
                    done, trace.stop_reason = True, "eos"

            # 3. Roll both caches back to the accepted prefix (the correction or
            # bonus token is not in either cache yet; the next round feeds it).
            keep = n_prompt + n_gen + n_acc
            target.crop(keep)
            drafter.rollback(keep)
            rnd.t_end = clock()
            rnd.t_verify = rnd.t_end - t_v0
            policy.observe(RoundReport(
                verdicts=[(confs[pos.i - 1], pos.accepted) for pos in rnd.positions], drafted=k,
                t_draft=rnd.t_draft, draft_forwards=rnd.draft_forwards, fed=fed,
                t_verify=None if rnd.prompt_fed else rnd.t_verify))
            if not done and len(ids) - n_prompt >= budget:
                done, trace.stop_reason = True, "max_new_tokens"
            trace.rounds.append(rnd)
            trace.t_total = rnd.t_end
            yield from clock.hold(Event("round", trace, rnd))
    finally:
        # Free the KV caches whether the run finished, failed or was cancelled.
        target.free()
        drafter.free()
    trace.t_total = clock() if not trace.rounds else trace.rounds[-1].t_end
    yield Event("done", trace)


def _pictures(tokens, qs, beliefs, logits, verdict, warp, settings, piece):
    """The acceptance picture at each judged position (specviz.core.picture)."""
    if not verdict.judged:
        return []
    p_all = verdict.p_all if verdict.p_all is not None else warp(logits)  # the rule's own, when it has them
    if warp.greedy:  # q: one-hot at the drafts, which pictures reads where it needs it
        q = None
        p1 = torch.softmax(logits.float(), -1)
        q1 = [torch.softmax(b.float(), -1) if b is not None else None for b in beliefs]
    else:
        q, p1, q1 = torch.stack(qs), None, None
    return pictures(tokens=tokens, n_judged=len(verdict.judged), p_all=p_all, q=q, rule=settings.rule,
                    variant=settings.variant, emitted=verdict.token, piece=piece, p1=p1, q1=q1,
                    weights=verdict.weights)


# ---- standard decoding ---------------------------------------------------------------


def _standard_events(
    pair: Any,
    prompt_ids: list[int],
    settings: DecodeSettings,
    *,
    prompt: str = "",
    should_stop: Callable[[], bool] = lambda: False,
) -> Iterator[Event]:
    """The baseline: the same target and sampling code, one token per forward pass."""
    device = pair.device
    eos = set(pair.eos_token_ids)
    target = cached_lm(pair.target, device, len(prompt_ids) + settings.max_new_tokens + 1)
    warp, gen = _warp_for(settings), _generator(settings, device)
    detok = Detokenizer(pair.tokenizer)
    piece = functools.partial(token_text, pair.tokenizer)
    trace = _new_trace("standard", pair, prompt, prompt_ids, settings, "")
    ids = list(prompt_ids)
    n_prompt = len(ids)
    clock = Clock(device)
    try:
        # No separate prompt pass: the first step feeds the prompt and gives the first token
        # (one pass fewer, as transformers' generate does; the speculative loop does the same).
        trace.t_prefill = trace.target_prefill = 0.0
        try:  # a long prompt's chunks but the last, with a stop check between them (core.kv.feed_prompt)
            feed_prompt(target, ids, should_stop)
        except PromptStopped:
            trace.stop_reason = "stopped"
            budget = 0
        else:
            budget = settings.max_new_tokens
        if target.cached:  # the chunks' time is the prompt's pass; the rest of it is in the first step, as before
            trace.t_prefill = trace.target_prefill = clock()
        while len(ids) - n_prompt < budget:
            if should_stop():
                trace.stop_reason = "stopped"
                break
            rnd = Round(index=len(trace.rounds), n_before=len(ids) - n_prompt, t_start=clock())
            rnd.prompt_fed = max(0, n_prompt - 1 - target.cached) if not trace.rounds else 0
            p = warp(target.feed(ids).logits[-1])
            y = sample(p, gen, warp.greedy)
            rnd.extra = Extra(y, piece(y), "target", float(p[y]))
            rnd.emitted.append(Token(y, detok.push(y), "target"))
            ids.append(y)
            rnd.t_end = clock()
            rnd.t_verify = rnd.t_end - rnd.t_start
            trace.rounds.append(rnd)
            trace.t_total = rnd.t_end
            yield from clock.hold(Event("round", trace, rnd))
            if y in eos:
                trace.stop_reason = "eos"
                break
    finally:
        target.free()
    trace.t_total = clock() if not trace.rounds else trace.rounds[-1].t_end
    yield Event("done", trace)


def stepwise_inference(events: Iterator[Event]) -> Iterator[Event]:
    """Run each step of an engine generator in inference mode, the mode never held across a yield.

    A ``with torch.inference_mode():`` around a loop that yields would hand the mode to whoever holds
    the event, and two such generators interleaved (specviz.core.race) exit their blocks out of order:
    the second to finish restores the mode the first had set, leaving the thread in inference mode
    after the race (it broke training later in the same process)."""
    try:
        while True:
            with torch.inference_mode():
                try:
                    event = next(events)
                except StopIteration:
                    return
            yield event
    finally:
        with torch.inference_mode():
            events.close()  # a cancelled run: the engine's `finally` frees its caches


def speculative_stream(pair: Any, prompt_ids: list[int], settings: DecodeSettings, **kw: Any) -> Iterator[Event]:
    """Speculative decoding as a stream of events; the last event is "done" (see _speculative_events)."""
    return stepwise_inference(_speculative_events(pair, prompt_ids, settings, **kw))


def standard_stream(pair: Any, prompt_ids: list[int], settings: DecodeSettings, **kw: Any) -> Iterator[Event]:
    """Standard decoding as a stream of events; the last event is "done" (see _standard_events)."""
    return stepwise_inference(_standard_events(pair, prompt_ids, settings, **kw))


def _final(stream: Iterator[Event]) -> Trace:
    trace = None
    for ev in stream:
        trace = ev.trace
    assert trace is not None
    return trace


def speculative_decode(pair, prompt_ids, settings, **kw) -> Trace:
    """Run speculative decoding to the end and return its trace."""
    return _final(speculative_stream(pair, prompt_ids, settings, **kw))


def standard_decode(pair, prompt_ids, settings, **kw) -> Trace:
    """Run standard decoding to the end and return its trace."""
    return _final(standard_stream(pair, prompt_ids, settings, **kw))
