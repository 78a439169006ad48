"""Speculative and standard decoding loops that record every step as a trace.

The speculative loop is Leviathan et al. 2023, Algorithm 1 (Chen et al. 2023),
with Yin et al.'s (NeurIPS 2024) over-acceptance threshold ε:

    draft x_1..x_γ ~ q autoregressively            (a Drafter)
    p_1..p_{γ+1} = target(prefix + x_1..x_γ)         (one forward pass)
    accept x_i while u_i < b_i = min(1, (p_i(x_i) + ε) / q_i(x_i))
    first rejection: emit a correction ~ residual   (Decoding-OPT; p for UNO)
    all accepted: emit a bonus ~ p_{γ+1}

Both models keep a KV cache holding a prefix of the emitted text; each forward
feeds only the tokens the cache does not hold yet, and a rejection crops the
cache back to the accepted prefix.  The engine knows nothing of the UI: it
yields events and returns a `Trace` of plain data.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol

import torch
from transformers import DynamicCache

from .sampling import Warp, rule_stats, sample, verdicts
from .settings import DecodeSettings
from .trace import DraftToken, Extra, Position, Round, Token, Trace


class Clock:
    """Wall clock that waits for the GPU before reading, so timings are true."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.t0 = self.now_abs()

    def now_abs(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def __call__(self) -> float:
        return self.now_abs() - self.t0


class CachedLM:
    """A causal LM plus a KV cache holding a prefix of a token sequence."""

    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.model = model
        self.device = device
        self.cache = DynamicCache()
        self.cached = 0  # number of tokens of the sequence held in the cache

    def forward(self, ids: list[int], keep_logits: int = 1) -> torch.Tensor:
        """Feed ids[cached:] and return the logits of the last `keep_logits` of them [k, V]."""
        new = ids[self.cached :]
        assert new, "nothing new to feed"
        x = torch.tensor([new], dtype=torch.long, device=self.device)
        out = self.model(input_ids=x, past_key_values=self.cache, use_cache=True, logits_to_keep=keep_logits)
        self.cached = len(ids)
        return out.logits[0, -keep_logits:]

    def prefill(self, ids: list[int]) -> None:
        """Fill the cache with all but the last token (which the next forward feeds)."""
        if len(ids) > 1:
            self.forward(ids[:-1], keep_logits=1)

    def rollback(self, n: int) -> None:
        """Keep only the first n tokens in the cache."""
        if self.cached > n:
            self.cache.crop(-(self.cached - n))  # transformers 5: a negative count of tokens to drop
            self.cached = n

    def free(self) -> None:
        self.cache = DynamicCache()
        self.cached = 0


# ---- drafters -------------------------------------------------------------------


@dataclass
class Proposal:
    """γ (or fewer) drafted tokens with their full draft distributions q_i."""

    tokens: list[int] = field(default_factory=list)
    q: list[torch.Tensor] = field(default_factory=list)  # each [V], float32
    forwards: int = 0


class Drafter(Protocol):
    """Anything that proposes draft tokens with their distributions.

    A deterministic drafter (prompt-lookup n-grams, say) proposes one-hot q;
    the acceptance rule stays exact.  The verify/accept code only sees
    Proposals, so new drafters plug in here without touching it.
    """

    name: str

    def start(self, ids: list[int]) -> None: ...

    def propose(
        self, ids: list[int], gamma: int, warp: Warp, gen: torch.Generator, on_token: Callable[[int, float], None]
    ) -> Proposal: ...

    def rollback(self, n: int) -> None: ...

    def free(self) -> None: ...


class ModelDrafter:
    """The classic drafter: a small causal LM sampled autoregressively."""

    def __init__(self, model: torch.nn.Module, device: torch.device, name: str = "draft model", eos_ids=()):
        self.lm = CachedLM(model, device)
        self.name = name
        self.eos_ids = set(eos_ids)

    def start(self, ids: list[int]) -> None:
        self.lm.free()
        self.lm.prefill(ids)

    def propose(self, ids, gamma, warp, gen, on_token) -> Proposal:
        prop = Proposal()
        seq = list(ids)
        for _ in range(gamma):
            q = warp(self.lm.forward(seq)[-1])
            prop.forwards += 1
            x = sample(q, gen, warp.greedy)
            prop.tokens.append(x)
            prop.q.append(q)
            seq.append(x)
            on_token(x, float(q[x]))
            if x in self.eos_ids:  # a draft is truncated at EOS
                break
        return prop

    def rollback(self, n: int) -> None:
        self.lm.rollback(n)

    def free(self) -> None:
        self.lm.free()


# ---- events ---------------------------------------------------------------------


@dataclass
class Event:
    """What a decoding generator yields.

    kind: "draft" (a token was just drafted; `round` is the partial round),
    "round" (a round finished: verdicts known), "done" (the trace is final).
    """

    kind: str
    trace: Trace
    round: Round | None = None


def _text_of(tokenizer: Any) -> Callable[[int], str]:
    def piece(tok: int) -> str:
        try:
            return tokenizer.decode([tok], skip_special_tokens=False)
        except Exception:  # a token the tokenizer cannot render: show its id
            return f"<{tok}>"

    return piece


class _Detok:
    """Incremental detokenisation of the emitted text, so the pieces of multi-byte
    characters split over several tokens join into the right string."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""

    def push(self, tok: int) -> str:
        self.ids.append(tok)
        full = self.tokenizer.decode(self.ids, skip_special_tokens=False)
        if full.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
            return ""
        if full.startswith(self.text):
            piece = full[len(self.text) :]
        else:  # the tokenizer re-spaced earlier text; fall back to the token alone
            piece = self.tokenizer.decode([tok], skip_special_tokens=False)
        self.text = full
        return piece


def _new_trace(kind, pair, prompt, prompt_ids, settings: DecodeSettings, drafter_name: str) -> Trace:
    return Trace(
        kind=kind,
        prompt=prompt,
        prompt_tokens=len(prompt_ids),
        settings=settings.as_dict(),
        models={
            "preset": getattr(pair, "preset", ""),
            "draft": getattr(pair, "draft_name", ""),
            "target": getattr(pair, "target_name", ""),
            "drafter": drafter_name if kind == "speculative" else "",
            "dtype": str(getattr(pair, "dtype", "")).replace("torch.", ""),
            "draft_quant": str(getattr(pair, "draft_quant", None) or "none"),
        },
        device=pair.device_label() if hasattr(pair, "device_label") else str(pair.device),
    )


def _warp_for(settings: DecodeSettings) -> Warp:
    return Warp(settings.temperature, settings.top_k, settings.top_p)


def _generator(settings: DecodeSettings, device: torch.device) -> torch.Generator:
    # On the model's device, so sampling never copies a vocabulary vector to the host.
    gen = torch.Generator(device=device)
    gen.manual_seed(settings.seed)
    return gen


# ---- speculative decoding ---------------------------------------------------------


def speculative_stream(
    pair: Any,
    prompt_ids: list[int],
    settings: DecodeSettings,
    *,
    prompt: str = "",
    drafter: Drafter | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    detail: bool = True,
) -> Iterator[Event]:
    """Speculative decoding as a stream of events; the last event is "done".

    detail=False skips the full-vocabulary statistics (r, TV, bias), to measure
    what tracing costs.
    """
    device = pair.device
    eos = set(pair.eos_token_ids)
    drafter = drafter or ModelDrafter(pair.draft, device, name=pair.draft_name, eos_ids=eos)
    target = CachedLM(pair.target, device)
    warp, gen = _warp_for(settings), _generator(settings, device)
    piece, detok = _text_of(pair.tokenizer), _Detok(pair.tokenizer)
    trace = _new_trace("speculative", pair, prompt, prompt_ids, settings, drafter.name)
    eps, gamma, budget = settings.epsilon, settings.gamma, settings.max_new_tokens
    ids = list(prompt_ids)
    n_prompt = len(ids)
    clock = Clock(device)
    try:
        with torch.inference_mode():
            drafter.start(ids)
            trace.draft_prefill = clock()
            target.prefill(ids)
            trace.t_prefill = clock()
            trace.target_prefill = trace.t_prefill - trace.draft_prefill
            done = False
            while not done:
                if should_stop():
                    trace.stop_reason = "stopped"
                    break
                n_gen = len(ids) - n_prompt
                rnd = Round(index=len(trace.rounds), n_before=n_gen, t_start=clock())
                # Never draft past the token budget: the round emits at most γ_eff + 1 tokens.
                gamma_eff = min(gamma, budget - n_gen - 1)

                # 1. Draft.
                pending: list[Event] = []

                def on_token(tok: int, q_x: float) -> None:
                    t_s = time.perf_counter()
                    rnd.draft.append(DraftToken(tok, piece(tok), q_x))
                    pending.append(Event("draft", trace, rnd))
                    trace.t_tracing += time.perf_counter() - t_s

                prop = drafter.propose(ids, gamma_eff, warp, gen, on_token) if gamma_eff > 0 else Proposal()
                t_drafted = clock()
                rnd.t_draft = t_drafted - rnd.t_start
                rnd.draft_forwards = prop.forwards
                yield from pending
                k = len(prop.tokens)

                # 2. Verify: one target forward over the uncached suffix + the k drafts.
                t_v0 = clock()
                p_all = warp(target.forward(ids + prop.tokens, keep_logits=k + 1))  # p_1..p_{k+1}
                # No drafts (the token budget left room for one token only): a plain
                # target step, not a bonus.
                n_acc, extra_kind, extra_dist = k, ("bonus" if k else "target"), p_all[k]
                if k:
                    q_all = torch.stack(prop.q)
                    v = verdicts(p_all[:k], q_all, eps, settings.variant, detail=False)
                    if detail:  # the explainer's statistics, timed as tracing cost
                        t_s = time.perf_counter()
                        v.reject_prob, v.tv, v.bias = rule_stats(p_all[:k], q_all, v.b, v.fallback)
                        trace.t_tracing += time.perf_counter() - t_s
                    xs = torch.tensor(prop.tokens, device=device)
                    rows = torch.arange(k, device=device)
                    b_x = v.b[rows, xs].tolist()
                    p_x = p_all[rows, xs].tolist()
                    q_x = q_all[rows, xs].tolist()
                    u = torch.rand(k, generator=gen, device=device).tolist()
                    for i in range(k):
                        ok = u[i] < b_x[i]
                        rnd.positions.append(
                            Position(i + 1, q_x[i], p_x[i], b_x[i], u[i], ok,
                                     float(v.reject_prob[i]), float(v.tv[i]), float(v.bias[i]))
                        )
                        if not ok:
                            n_acc, extra_kind, extra_dist = i, "correction", v.fallback[i]
                            break

                accepted = prop.tokens[:n_acc]
                for tok in accepted:
                    rnd.emitted.append(Token(tok, detok.push(tok), "accepted"))
                ids.extend(accepted)
                # An accepted EOS ends the text; otherwise add the correction or bonus token.
                if any(tok in eos for tok in accepted):
                    done, trace.stop_reason = True, "eos"
                else:
                    y = sample(extra_dist, gen, warp.greedy)
                    rnd.extra = Extra(y, piece(y), extra_kind, float(p_all[n_acc][y]))
                    rnd.emitted.append(Token(y, detok.push(y), extra_kind))
                    ids.append(y)
                    if y in eos:
                        done, trace.stop_reason = True, "eos"

                # 3. Roll both caches back to the accepted prefix (the correction or
                # bonus token is not in either cache yet; the next round feeds it).
                keep = n_prompt + n_gen + n_acc
                target.rollback(keep)
                drafter.rollback(keep)
                rnd.t_end = clock()
                rnd.t_verify = rnd.t_end - t_v0
                if not done and len(ids) - n_prompt >= budget:
                    done, trace.stop_reason = True, "max_new_tokens"
                trace.rounds.append(rnd)
                trace.t_total = rnd.t_end
                yield Event("round", trace, rnd)
    finally:
        # Free the KV caches whether the run finished, failed or was cancelled.
        target.free()
        drafter.free()
    trace.t_total = clock() if not trace.rounds else trace.rounds[-1].t_end
    yield Event("done", trace)


# ---- standard decoding ---------------------------------------------------------------


def standard_stream(
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
    target = CachedLM(pair.target, device)
    warp, gen = _warp_for(settings), _generator(settings, device)
    piece, detok = _text_of(pair.tokenizer), _Detok(pair.tokenizer)
    trace = _new_trace("standard", pair, prompt, prompt_ids, settings, "")
    ids = list(prompt_ids)
    n_prompt = len(ids)
    clock = Clock(device)
    try:
        with torch.inference_mode():
            target.prefill(ids)
            trace.t_prefill = trace.target_prefill = clock()
            while len(ids) - n_prompt < settings.max_new_tokens:
                if should_stop():
                    trace.stop_reason = "stopped"
                    break
                rnd = Round(index=len(trace.rounds), n_before=len(ids) - n_prompt, t_start=clock())
                p = warp(target.forward(ids)[-1])
                y = sample(p, gen, warp.greedy)
                rnd.extra = Extra(y, piece(y), "target", float(p[y]))
                rnd.emitted.append(Token(y, detok.push(y), "target"))
                ids.append(y)
                rnd.t_end = clock()
                rnd.t_verify = rnd.t_end - rnd.t_start
                trace.rounds.append(rnd)
                trace.t_total = rnd.t_end
                yield Event("round", trace, rnd)
                if y in eos:
                    trace.stop_reason = "eos"
                    break
    finally:
        target.free()
    trace.t_total = clock() if not trace.rounds else trace.rounds[-1].t_end
    yield Event("done", trace)


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
