"""Speculative vs standard decoding, side by side, replayable in time."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..theory.costs import RaceCosts, loss_cause, race_costs, steps
from ..theory.timing import STARTING, starting, trusted_speedup
from ._fmt import draft_source, esc, fsec
from .execution import trace_exec_line
from .glossary import title_attr
from .text import looks_like_code, tokens_html

if TYPE_CHECKING:
    from specviz.trace import Round, Trace
    from specviz.trace.timing import Timing


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


def theory_line(rc: RaceCosts | None, probed: bool = False) -> str:
    """Thm 3.8 as published (a verify pass costs one step) beside Thm 3.8 with the measured verify factor
    (``probed``: the probe's, when the race's own clocks were not reliable)."""
    if rc is None or rc.textbook is None:
        return ""
    head = f"theory (Leviathan Thm 3.8): {rc.textbook:.2f}× if a verify pass cost one standard step"
    if rc.with_verify is None or rc.v is None:
        return head + " · verify cost unknown (no standard step measured)"
    source = "this machine's probed" if probed else "the measured"
    return f"{head} · {rc.with_verify:.2f}× with {source} verify cost ({steps(rc.v)} steps)"


def _speedup_html(spec: Trace, std: Trace, sp: float) -> str:
    """The race's headline: the speedup, why, theory; and how far the clocks held (trace.timing).

    A race whose timings were flagged (specviz.theory.timing) never states its wall-clock figures
    as measurements: the headline gives the count-based speedup (the race's own counts at the
    probe's costs), says how noisy the clocks were, and the "why" sentence uses the probe's v and c."""
    timing = spec.timing
    s_tps, t_tps = spec.summary().tokens_per_s, std.summary().tokens_per_s
    rc = race_costs(spec, std)
    noisy = timing is not None and not timing.reliable
    if noisy and rc is not None and rc.t_step:
        rc = replace(rc, measured=timing.predicted,
                     t_verify=timing.v_probe * rc.t_step if timing.v_probe is not None else None,
                     t_draft_token=timing.c_probe * rc.t_step if timing.c_probe is not None else rc.t_draft_token)
    cause = loss_cause(rc)
    shown = trusted_speedup(spec, sp) if noisy and timing.predicted is not None else sp
    spans = []
    if noisy:
        spans.append(("sv-speedup-noise", noise_sentence(timing, sp, s_tps, t_tps)))
    else:
        spans.append(("sv-speedup-k", verdict(sp, s_tps, t_tps)))
    if cause:
        spans.append(("sv-speedup-why", f"Why: {cause[1]}."))
    line = theory_line(rc, probed=noisy)
    if line:
        spans.append(("sv-speedup-theory", line))
    if timing is not None and not noisy:
        spans.append(("sv-speedup-timing", timing_note(timing, sp)))
    data = f' data-cause="{cause[0]}"' if cause else ""
    data += f' data-reliable="{"false" if noisy else "true"}"' if timing is not None else ""
    label = f"≈{shown:.2f}×" if noisy and timing.predicted is not None else f"{shown:.2f}×"
    return (
        f'<div class="sv-speedup {"sv-speedup--slow" if shown < 1 else ""}{" sv-speedup--noisy" if noisy else ""}" '
        f'data-speedup="{sp:.4f}"{data}>'
        f'<span class="sv-speedup-v">{label}</span>'
        + "".join(f'<span class="{cls}"{_hover(text)}>{esc(text)}</span>' for cls, text in spans)
        + "</div>"
    )


def _hover(text: str) -> str:
    """A title attribute defining the symbols ``text`` uses (Thm 3.8, α, γ, …), or ""."""
    return title_attr(text, ("v",) if "steps" in text else ())


def noise_sentence(timing: Timing, sp: float, s_tps: float, t_tps: float) -> str:
    """What the page says of a race timed on a disturbed machine, with the numbers."""
    early = starting(timing)
    if early:  # "the server had just started: this race ran on ..." reads "the server was still starting: ..."
        rest = str(timing.why).removeprefix(STARTING)
        why = f"the server was still starting{rest}" if rest.startswith(":") else str(timing.why)
        head = f"Timings ±{timing.spread:.0%}: {why}."
    else:
        head = f"Timings ±{timing.spread:.0%}: the machine was busy during this race ({timing.why})."
    clock = f" The wall clock said {sp:.2f}× ({s_tps:.1f} ÷ {t_tps:.1f} tokens/s)"
    if timing.predicted is None:
        return head + clock + (", which cannot be trusted; run it again in a few minutes, once the server is ready."
                               if early else ", which cannot be trusted; run it again on a quieter machine.")
    return (head + clock + f"; the count-based {timing.predicted:.2f}× prices this race's own passes with this "
            "machine's probed costs, and is the one to trust here.")


def timing_note(timing: Timing, sp: float) -> str:
    """A reliable race's second opinion and how it was measured."""
    how = {"interleaved": "the two runs interleaved", "sequential": "the runs one after the other",
           "alone": "one run"}.get(timing.how, timing.how)
    text = f"timed with {how}"
    if timing.threads:
        text += f" on {timing.threads} thread{'s' if timing.threads != 1 else ''}"
        if timing.threads_end and timing.threads_end != timing.threads:
            text += (f", then {timing.threads_end} once other work arrived"
                     + (f" (it used {timing.busy_during:.1f} cores)" if timing.busy_during else "")
                     + ": both runs switched at the same moment")
    if not timing.judged:
        return text + "; too short a race to judge its clocks (under half a second a run)"
    text += f", ±{timing.spread:.0%}"
    if timing.busy is not None and timing.busy >= 0.5:
        text += (f"; the machine was busy (other work used {timing.busy:.1f} cores as the race began), so both runs "
                 "shared the same load")
    if timing.predicted is not None:
        text += f" · count-based {timing.predicted:.2f}× (this race's passes at the probe's costs)"
        off = abs(sp / timing.predicted - 1)
        if off > max(timing.spread, 0.05):
            text += (f": {off:.0%} apart; trust the wall clock, which measured these runs now (the probe timed "
                     "short passes at start-up)")
    return text


def race_speedup(spec: Trace | None, std: Trace | None) -> float | None:
    """Measured speedup: speculative tokens/s ÷ standard tokens/s (None if not computable)."""
    if spec is None or std is None:
        return None
    s, t = spec.summary().tokens_per_s or 0.0, std.summary().tokens_per_s or 0.0
    if s <= 0 or t <= 0:
        return None
    return s / t


def sampling_note(spec: Trace | None, std: Trace | None) -> str:
    """The sentence that a sampled race's two texts differ, as expected (plain text); "" when the race is
    greedy, unfinished or its texts are the same.  Speculative decoding promises the target's distribution,
    not the target's text: each decoder draws its own random numbers."""
    if spec is None or std is None or not spec.rounds or not std.rounds:
        return ""
    temperature = getattr(spec.settings, "temperature", 0.0) or 0.0
    if temperature <= 0:
        return ""
    if _text(spec) == _text(std):
        return ""
    return (f"The two texts differ, as expected when sampling (temperature {temperature:g} > 0): each decoder draws "
            "its own random numbers, and speculative decoding guarantees that its text follows the same "
            "distribution as the target's, not the same text. At temperature 0 (greedy) the two would match.")


def _text(trace: Trace) -> str:
    return "".join(tok.text for rnd in trace.rounds for tok in rnd.emitted)


_STOP = {"eos": "end of text", "max_new_tokens": "token limit", "stopped": "stopped", "time_limit": "time limit",
         "error": "error"}


def _column(name: str, css: str, trace: Trace | None, side: RaceSide, denom: int) -> str:
    if not side.present or trace is None:
        return (
            f'<div class="sv-race-col {css} sv-race-col--absent">'
            f'<div class="sv-race-head"><span class="sv-race-title">{esc(name)}</span>'
            f'<span class="sv-badge sv-badge--idle">not run</span></div>'
            '<div class="sv-text sv-text--empty">Not run yet: each Run races speculative against standard '
            'decoding, the two advancing in turns so both see the same machine.</div>'
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

    if a.finished and b.finished and not a.error and not b.error and a.present and b.present:
        if any(t is not None and t.stop_reason == "stopped" for t in (spec, std)):  # Stop, or a closed page
            speed = _pending("Stopped before the end: a race cut short gives no speedup, since its two sides "
                             "stopped at different points of their texts. Press Run to race again.")
        elif (sp := race_speedup(spec, std)) is not None:
            speed = _speedup_html(spec, std, sp)
        else:
            speed = _pending("speedup: not enough data")
    else:
        if not a.present and not b.present:
            msg = ("Press Run: speculative and standard decoding race here, advancing in turns so both see the "
                   "same machine.")
        elif not (a.present and b.present):
            msg = "The speedup appears once both decoders have finished."
        else:
            msg = "Speedup appears when both runs finish."
        speed = _pending(msg)
    note = sampling_note(spec, std) if a.finished and b.finished and a.present and b.present else ""
    note_html = f'<div class="sv-race-note sv-muted">{esc(note)}</div>' if note else ""

    clock = f'<div class="sv-race-clock">t = {fsec(at_time)}</div>' if at_time is not None else ""
    return (
        f'<div class="sv-race">{clock}{speed}<div class="sv-race-cols">'
        f'{_column("Speculative", "sv-race-spec", spec, a, denom)}'
        f'{_column("Standard", "sv-race-std", std, b, denom)}'
        f"</div>{note_html}</div>"
    )


__all__ = ["race_html", "race_side", "race_speedup", "RaceSide", "sampling_note", "theory_line", "verdict"]
