"""Speculative vs standard decoding, side by side, replayable in time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..theory.costs import loss_cause
from ..theory.figures import RunFigures, clock_speedup, run_figures
from ._fmt import draft_source, esc, fsec
from .execution import trace_exec_line
from .glossary import title_attr
from .race_words import (CUT_WORDS, noise_sentence, sampling_note, settings_note, stopped_words, theory_line,
                         timing_note, verdict)
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


def _speedup_html(spec: Trace, std: Trace, fig: RunFigures) -> str:
    """The race's headline: the speedup the figures quote, why, theory; and how far the clocks held.

    A race whose timings were flagged (specviz.theory.timing) never states its wall-clock figures as
    measurements: the headline gives the count-based speedup, says how noisy the clocks were, and the "why"
    sentence and the theory line use the probe's v and c (the figures' quoted costs, which every panel reads)."""
    timing = spec.timing
    sp = fig.clock
    s_tps, t_tps = spec.summary().tokens_per_s, std.summary().tokens_per_s
    cause = loss_cause(fig.quoted)
    spans = []
    if fig.flagged:
        spans.append(("sv-speedup-noise", noise_sentence(timing, sp, s_tps, t_tps)))
    else:
        spans.append(("sv-speedup-k", verdict(sp, s_tps, t_tps)))
    if cause:
        spans.append(("sv-speedup-why", f"Why: {cause[1]}."))
    line = theory_line(fig)
    if line:
        spans.append(("sv-speedup-theory", line))
    if timing is not None and not fig.flagged:
        spans.append(("sv-speedup-timing", timing_note(timing, sp)))
    data = f' data-cause="{cause[0]}"' if cause else ""
    data += f' data-reliable="{"false" if fig.flagged else "true"}"' if timing is not None else ""
    data += f' data-clock="{sp:.4f}"'
    if fig.v is not None:
        data += f' data-v="{fig.v_text()}"'
    shown = fig.speedup if fig.speedup is not None else sp  # a flagged race without counts: its clock, disowned
    label = fig.speedup_text() or f"{sp:.2f}×"
    return (
        f'<div class="sv-speedup {"sv-speedup--slow" if shown < 1 else ""}{" sv-speedup--noisy" if fig.flagged else ""}" '
        f'data-speedup="{shown:.4f}"{data}>'
        f'<span class="sv-speedup-v">{label}</span>'
        + "".join(f'<span class="{cls}"{_hover(text)}>{esc(text)}</span>' for cls, text in spans)
        + "</div>"
    )


def _hover(text: str) -> str:
    """A title attribute defining the symbols ``text`` uses (Thm 3.8, α, γ, …), or ""."""
    return title_attr(text, ("v",) if "steps" in text else ())


def race_speedup(spec: Trace | None, std: Trace | None) -> float | None:
    """Measured speedup by the wall clock: speculative tokens/s ÷ standard tokens/s (None if not computable).
    The speedup a page quotes is `run_figures(spec, std).speedup` (the count-based one for a flagged race)."""
    return clock_speedup(spec, std)


_STOP = {"eos": "end of text", "max_new_tokens": "token limit", "stopped": "stopped", "time_limit": "time limit",
         "error": "error"}


def _column(name: str, css: str, trace: Trace | None, side: RaceSide, denom: int, cut: bool = False) -> str:
    """One decoder's column; ``cut``: the race was stopped (an absent side then never started)."""
    if not side.present or trace is None:
        why = (f"Not run: the race was stopped before {name.lower()} decoding began." if cut else
               "Not run yet: each Run races speculative against standard decoding, the two advancing in turns so "
               "both see the same machine.")
        return (
            f'<div class="sv-race-col {css} sv-race-col--absent">'
            f'<div class="sv-race-head"><span class="sv-race-title">{esc(name)}</span>'
            f'<span class="sv-badge sv-badge--idle">not run</span></div>'
            f'<div class="sv-text sv-text--empty">{esc(why)}</div>'
            f"{_stats(None)}</div>"
        )
    if side.error:
        badge = '<span class="sv-badge sv-badge--error">error</span>'
    elif side.finished and trace.stop_reason in CUT_WORDS:  # cut short: amber, with what it decoded first
        why = _STOP.get(trace.stop_reason, trace.stop_reason)
        badge = (f'<span class="sv-badge sv-badge--stopped" title="{esc(CUT_WORDS[trace.stop_reason])} after '
                 f'{side.tokens} tokens">{esc(why)} · {side.tokens} token{"s" if side.tokens != 1 else ""}</span>')
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
    line = trace_exec_line(trace, brief=True)  # how the target executed, and where (in full: the legend)
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
            fsec(side.elapsed) if side.elapsed > 0 else "—",  # a side stopped before its first round: no time
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


def _pending(msg: str) -> str:
    """The headline's place while it has no speedup to show: why, in words."""
    return f'<div class="sv-speedup sv-speedup--pending"><span class="sv-speedup-k">{esc(msg)}</span></div>'


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

    fig = run_figures(spec, std)
    ended = not running_any and (a.present or b.present)
    if ended and fig.cut:  # Stop, or a closed page: what each side decoded before it
        speed = _pending(stopped_words(spec, std))
    elif a.finished and b.finished and not a.error and not b.error and a.present and b.present:
        speed = _speedup_html(spec, std, fig) if fig.clock is not None else _pending("speedup: not enough data")
    else:
        if not a.present and not b.present:
            msg = ("Press Run: speculative and standard decoding race here, advancing in turns so both see the "
                   "same machine.")
        elif not (a.present and b.present):
            msg = "The speedup appears once both decoders have finished."
        else:
            msg = "Speedup appears when both runs finish."
        speed = _pending(msg)
    off = settings_note(spec)  # beside the headline: what this run set off the page's defaults
    if off:
        speed += f'<div class="sv-race-settings">{esc(off)}</div>'
    # (a race cut short: its texts differ because they stopped at different points, whatever the settings)
    note = sampling_note(spec, std) if a.finished and b.finished and a.present and b.present and not fig.cut else ""
    note_html = f'<div class="sv-race-note sv-muted">{esc(note)}</div>' if note else ""

    clock = f'<div class="sv-race-clock">t = {fsec(at_time)}</div>' if at_time is not None else ""
    return (
        f'<div class="sv-race">{clock}{speed}<div class="sv-race-cols">'
        f'{_column("Speculative", "sv-race-spec", spec, a, denom, fig.cut)}'
        f'{_column("Standard", "sv-race-std", std, b, denom, fig.cut)}'
        f"</div>{note_html}</div>"
    )


__all__ = ["race_html", "race_side", "race_speedup", "RaceSide", "noise_sentence", "sampling_note", "theory_line",
           "timing_note", "verdict"]
