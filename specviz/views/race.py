"""Speculative vs standard decoding, side by side, replayable in time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..theory.costs import RaceCosts, loss_cause, race_costs, steps
from ._fmt import draft_source, esc, fsec
from .execution import trace_exec_line
from .text import looks_like_code, tokens_html

if TYPE_CHECKING:
    from specviz.trace import Round, Trace


@dataclass
class RaceSide:
    """What one column shows at a given moment (all derived from the trace)."""

    present: bool
    finished: bool = False
    running: bool = False
    rounds: list[Round] | None = None
    tokens: int = 0
    elapsed: float = 0.0
    tokens_per_s: float | None = None
    ttft: float | None = None
    target_forwards: int = 0
    error: str | None = None


def race_side(trace: Trace | None, at_time: float | None = None, running: bool = False) -> RaceSide:
    """The state of one decoder at ``at_time`` seconds since start (None: now / the end)."""
    if trace is None:
        return RaceSide(present=False)
    all_rounds = trace.rounds
    rounds = [r for r in all_rounds if at_time is None or r.t_end <= at_time]
    last_end = all_rounds[-1].t_end if all_rounds else 0.0
    t_end = max(trace.t_total, last_end)
    if at_time is None:
        finished = not running
        elapsed = t_end
    else:
        finished = (not running) and at_time >= t_end and len(rounds) == len(all_rounds)
        elapsed = t_end if finished else max(at_time if running else min(at_time, t_end), 0.0)
    tokens = sum(len(r.emitted) for r in rounds)
    if finished and trace.t_total > 0:
        tps = tokens / trace.t_total
    else:
        tps = tokens / elapsed if elapsed > 0 else None
    error = "the run stopped with an error" if trace.stop_reason == "error" else None
    return RaceSide(
        present=True,
        finished=finished,
        running=not finished,
        rounds=rounds,
        tokens=tokens,
        elapsed=elapsed,
        tokens_per_s=tps,
        ttft=rounds[0].t_end if rounds else None,
        target_forwards=sum(r.target_forwards for r in rounds),
        error=error if finished else None,
    )


def verdict(sp: float, spec_tps: float, std_tps: float) -> str:
    """The race's result in plain words: 'speculative is 1.85× faster' or, when it lost,
    'speculative took 1.72× as long per token (0.58× the speed)' (never "0.58× slower")."""
    rates = f"{spec_tps:.1f} ÷ {std_tps:.1f} tokens/s"
    if sp >= 1:
        return f"speculative is {sp:.2f}× faster: {rates}"
    return f"speculative took {1 / sp:.2f}× as long per token ({sp:.2f}× the speed): {rates}"


def theory_line(rc: RaceCosts | None) -> str:
    """Thm 3.8 as published (a verify pass costs one step) beside Thm 3.8 with the measured verify factor."""
    if rc is None or rc.textbook is None:
        return ""
    head = f"theory (Leviathan Thm 3.8): {rc.textbook:.2f}× if a verify pass cost one standard step"
    if rc.with_verify is None or rc.v is None:
        return head + " · verify cost unknown (no standard step measured)"
    return f"{head} · {rc.with_verify:.2f}× with the measured verify cost ({steps(rc.v)} steps)"


def race_speedup(spec: Trace | None, std: Trace | None) -> float | None:
    """Measured speedup: speculative tokens/s ÷ standard tokens/s (None if not computable)."""
    if spec is None or std is None:
        return None
    s, t = spec.summary().tokens_per_s or 0.0, std.summary().tokens_per_s or 0.0
    if s <= 0 or t <= 0:
        return None
    return s / t


_STOP = {"eos": "end of text", "max_new_tokens": "token limit", "stopped": "stopped", "time_limit": "time limit",
         "error": "error"}


def _column(name: str, css: str, trace: Trace | None, side: RaceSide, denom: int) -> str:
    if not side.present or trace is None:
        return (
            f'<div class="sv-race-col {css} sv-race-col--absent">'
            f'<div class="sv-race-head"><span class="sv-race-title">{esc(name)}</span>'
            f'<span class="sv-badge sv-badge--idle">not run</span></div>'
            '<div class="sv-text sv-text--empty">Not run yet: each Run decodes speculatively first, then the '
            'standard way, one after the other so the timings are fair.</div>'
            f"{_stats(None)}</div>"
        )
    if side.error:
        badge = '<span class="sv-badge sv-badge--error">error</span>'
    elif side.finished:
        why = _STOP.get(trace.stop_reason, trace.stop_reason)
        badge = f'<span class="sv-badge sv-badge--done">finished · {esc(why)}</span>'
    else:
        badge = '<span class="sv-badge sv-badge--run">running…</span>'
    models = trace.models or {}
    if trace.kind == "speculative":
        sub = f"{draft_source(trace)} → target {models.get('target', '?')} · γ = {trace.gamma}"
    else:
        sub = f"target {models.get('target', '?')}"
    line = trace_exec_line(trace)  # how the target executed, and where
    if line:
        sub += f" · {line}"
    pct = 100.0 * side.tokens / denom if denom > 0 else 0.0
    pairs = [(tok, r.index + 1) for r in side.rounds or [] for tok in r.emitted]
    text = "".join(t.text for t, _ in pairs)
    mono = " sv-text--mono" if looks_like_code(trace.prompt + text) else ""
    caret = '<span class="sv-caret" aria-hidden="true"></span>' if not side.finished else ""
    body = tokens_html(pairs) + caret
    if not pairs and side.finished:
        body = '<span class="sv-muted">(no tokens)</span>'
    err = f'<div class="sv-race-error">{esc(side.error)}</div>' if side.error else ""
    return (
        f'<div class="sv-race-col {css}" data-tokens="{side.tokens}">'
        f'<div class="sv-race-head"><span class="sv-race-title">{esc(name)}</span>{badge}</div>'
        f'<div class="sv-race-sub">{esc(sub)}</div>'
        f'<div class="sv-race-bar" title="{side.tokens} tokens"><div class="sv-race-fill" style="width:{min(pct, 100):.1f}%"></div>'
        f'<span class="sv-race-count">{side.tokens}</span></div>'
        f'<div class="sv-text sv-race-text{mono}">{body}</div>'
        f"{err}{_stats(side)}</div>"
    )


def _stats(side: RaceSide | None) -> str:
    if side is None:
        vals = ["—"] * 5
    else:
        vals = [
            str(side.tokens),
            fsec(side.elapsed) if side.elapsed > 0 or side.finished else "—",
            f"{side.tokens_per_s:.1f}" if side.tokens_per_s is not None else "—",
            fsec(side.ttft),
            str(side.target_forwards),
        ]
    labels = [
        ("tokens", "new tokens generated"),
        ("wall time", "seconds since start, reading the prompt included"),
        ("tokens/s", "tokens ÷ wall time"),
        ("first token", "time to first token (end of the first round)"),
        ("target passes", "target-model forward passes (the expensive part)"),
    ]
    cells = "".join(
        f'<div class="sv-stat" title="{esc(tip)}"><div class="sv-stat-v">{esc(v)}</div><div class="sv-stat-k">{esc(k)}</div></div>'
        for (k, tip), v in zip(labels, vals)
    )
    return f'<div class="sv-race-stats">{cells}</div>'


def race_html(
    spec: Trace | None,
    std: Trace | None,
    at_time: float | None = None,
    *,
    spec_running: bool = False,
    std_running: bool = False,
) -> str:
    """Two columns, Speculative and Standard, with text so far and stats; the speedup when both are done.

    ``at_time``: seconds since start; each side shows only the tokens of rounds
    that ended by then (the race replay).  None shows everything recorded.
    ``spec_running`` / ``std_running``: the trace is still being produced (live).
    """
    a = race_side(spec, at_time, spec_running)
    b = race_side(std, at_time, std_running)
    full = [t.n_tokens for t in (spec, std) if t is not None]
    running_any = (a.present and not a.finished) or (b.present and not b.finished)
    limits = []
    if running_any:
        for t in (spec, std):
            if t is not None:
                limits.append(t.settings.max_new_tokens)
    denom = max(full + limits + [1])

    if a.finished and b.finished and not a.error and not b.error and a.present and b.present:
        sp = race_speedup(spec, std)
        if sp is not None:
            s_tps, t_tps = spec.summary().tokens_per_s, std.summary().tokens_per_s
            rc = race_costs(spec, std)
            cause = loss_cause(rc)
            spans = [("sv-speedup-k", verdict(sp, s_tps, t_tps))]
            if cause:
                spans.append(("sv-speedup-why", f"Why: {cause[1]}."))
            if theory_line(rc):
                spans.append(("sv-speedup-theory", theory_line(rc)))
            data = f' data-cause="{cause[0]}"' if cause else ""
            speed = (
                f'<div class="sv-speedup {"sv-speedup--slow" if sp < 1 else ""}" data-speedup="{sp:.4f}"{data}>'
                f'<span class="sv-speedup-v">{sp:.2f}×</span>'
                + "".join(f'<span class="{cls}">{esc(text)}</span>' for cls, text in spans)
                + "</div>"
            )
        else:
            speed = '<div class="sv-speedup sv-speedup--pending"><span class="sv-speedup-k">speedup: not enough data</span></div>'
    else:
        if not a.present and not b.present:
            msg = "Press Run: speculative decoding runs first, then standard decoding, and the two race here."
        elif not (a.present and b.present):
            msg = "The speedup appears once both decoders have finished (standard decoding runs second)."
        else:
            msg = "Speedup appears when both runs finish."
        speed = f'<div class="sv-speedup sv-speedup--pending"><span class="sv-speedup-k">{esc(msg)}</span></div>'

    clock = f'<div class="sv-race-clock">t = {fsec(at_time)}</div>' if at_time is not None else ""
    return (
        f'<div class="sv-race">{clock}{speed}<div class="sv-race-cols">'
        f'{_column("Speculative", "sv-race-spec", spec, a, denom)}'
        f'{_column("Standard", "sv-race-std", std, b, denom)}'
        "</div></div>"
    )


__all__ = ["race_html", "race_side", "race_speedup", "RaceSide", "theory_line", "verdict"]
