"""A compact metrics table; every metric carries its definition."""

from __future__ import annotations

from typing import Any

from ..theory.figures import RunFigures
from ..trace import Summary, Trace
from ._fmt import esc, fnum, fsec
from .glossary import glossed, title_attr

_STOP = {
    "eos": "end-of-text token",
    "max_new_tokens": "token limit reached",
    "stopped": "stopped by the user",
    "time_limit": "the job's time limit was reached",
    "error": "error",
}


# The one-letter symbols in the metrics' names (the glossary's hover cannot find single letters in text).
_SYMBOLS = {"Verify factor v": ("v",), "c (cost ratio)": ("c",), "Thm 3.8, textbook": ("c",),
            "Thm 3.8, measured verify": ("c", "v"), "Best γ": ("c", "v")}


def _num(x: Any, fmt: str = "{:.2f}", suffix: str = "") -> str:
    if x is None:
        return "—"
    try:
        return fmt.format(x) + suffix
    except (TypeError, ValueError):
        return str(x)


def metric_rows(summary: Summary, gamma: int | None = None,
                figures: RunFigures | None = None) -> list[tuple[str, str, str, str]]:
    """(group, metric, value, definition) rows, all plain text.  ``figures``: the race's figures
    (specviz.theory.figures.run_figures with the standard run), which put c and Thm 3.8 in standard steps,
    add the verify factor, the speedup the page quotes and the best γ; without a standard run the verify cost
    is "unknown".  A flagged race's v and c are this machine's probed ones, as every panel quotes them."""
    s = summary
    spec = s.kind == "speculative"
    g = f"γ={gamma}" if gamma else "γ"
    rows: list[tuple[str, str, str, str]] = []
    add = rows.append

    add(("Output", "Tokens", _num(s.tokens, "{:d}"), "new tokens generated (prompt excluded)"))
    add(("Output", "Stop reason", _STOP.get(s.stop_reason, str(s.stop_reason or "—")), "why generation ended"))
    if spec:
        add(("Output", "Rounds", _num(s.rounds, "{:d}"), "draft → verify cycles; each costs one target forward pass"))
    add(
        (
            "Output",
            "Target forward passes",
            _num(s.target_forwards, "{:d}"),
            "calls to the big model (the first also reads the prompt)"
            + ("" if spec else ": one per token in standard decoding"),
        )
    )

    add(("Speed", "Wall time", fsec(s.t_total), "start to last token, reading the prompt included"))
    add(("Speed", "Time to first token", fsec(s.ttft), "start to the end of the first round"))
    add(("Speed", "Throughput", _num(s.tokens_per_s, "{:.1f}", " tok/s"), "tokens ÷ wall time"))
    add(("Speed", "Decode throughput", _num(s.decode_tokens_per_s, "{:.1f}", " tok/s"), "after the first round: tokens ÷ time (the prompt's cost left out)"))
    if spec:
        add(("Speed", "Speedup", _speedup_value(figures), _speedup_definition(figures)))
    add(
        (
            "Speed",
            "Target forward time",
            fsec(s.t_target_forward),
            "mean time of one target forward pass" + (" (a verify step)" if spec else " (one token)"),
        )
    )

    if spec:
        add(
            (
                "Acceptance",
                "α (acceptance rate)",
                fnum(s.alpha, 3),
                f"accepted drafts ÷ verified drafts = {(s.accepted if s.accepted is not None else '?')} ÷ {(s.verified if s.verified is not None else '?')} "
                "(drafts after a rejection are never verified)",
            )
        )
        per = s.per_position_acceptance or []
        add(
            (
                "Acceptance",
                "Acceptance by position",
                " · ".join(fnum(v, 2) for v in per) if per else "—",
                "for draft position i = 1…γ: accepted ÷ times position i was verified",
            )
        )
        add(
            (
                "Acceptance",
                "Mean accepted length",
                fnum(s.mean_accepted_length, 2),
                "1 + accepted ÷ rounds: tokens per target pass, counting the correction/bonus (vLLM)",
            )
        )
        add(
            (
                "Acceptance",
                "Drafts",
                f"{(s.drafted if s.drafted is not None else 0)} drafted · {(s.verified if s.verified is not None else 0)} verified · "
                f"{(s.accepted if s.accepted is not None else 0)} accepted · {(s.rejections if s.rejections is not None else 0)} rejected",
                "drafted − verified = discarded after a rejection",
            )
        )
        rounds = s.rounds or 0
        add(
            (
                "Acceptance",
                "Mean draft length",
                fnum((s.drafted if s.drafted is not None else 0) / rounds, 2) if rounds else "—",
                f"drafted ÷ rounds: tokens proposed per round ({g} is the most a round may draft)",
            )
        )
        add(("Acceptance", "Mean β", fnum(s.mean_beta, 3), "1 − mean TV(p, q) = mean Σₓ min(p, q): expected acceptance per position"))
        add(("Acceptance", "Mean rejection prob. r", fnum(s.mean_reject_prob, 3), "r = 1 − Σₓ q(x)·b(x), averaged over verified positions"))
        if s.mean_bias:
            add(("Acceptance", "Mean bias", fnum(s.mean_bias, 4), "TV(output dist., p) per position: 0 for exact (ε = 0) sampling"))

        add(("Cost model", "Draft forward time", fsec(s.t_draft_forward), "mean time of one draft forward pass"))
        fig = figures
        rc = fig.quoted if fig is not None else None
        probed = fig is not None and fig.v_source == "probed"
        if rc is not None and rc.t_step:
            add(("Cost model", "Standard step time", fsec(rc.t_step),
                 "mean one-token step of the standard run in this race (its first, which also reads the prompt, left out)"))
            own = (f"; its clocks were flagged, so this is this machine's probed cost for its passes (they measured "
                   f"{fig.costs.v:.2f})" if probed and fig.costs is not None and fig.costs.v is not None else
                   "; its clocks were flagged, so this is this machine's probed cost for its passes" if probed else "")
            add(("Cost model", "Verify factor v", f"{fig.v_text()} standard steps" if fig.v is not None else "—",
                 "mean verify pass ÷ standard step: what a verify pass costs (Thm 3.8 assumes 1; "
                 "about 1 on a memory-bound target, several on a compute-bound CPU)" + own))
            add(("Cost model", "c (cost ratio)", fnum(fig.c, 3), "a draft token's time ÷ the standard step's time"
                 + ("; probed, as v" if probed else "")))
        else:
            add(("Cost model", "Verify factor v", "unknown",
                 "verify pass ÷ standard step: run standard decoding in the same race to measure a step"))
            add(("Cost model", "c (cost ratio)", fnum(s.c, 3),
                 "draft forward time ÷ verify pass time (no standard step measured to divide by)"))
        theo = fig.textbook if fig is not None and fig.quoted is not None else s.theoretical_speedup
        add(
            (
                "Cost model",
                "Thm 3.8, textbook",
                f"{theo:.2f}×" if theo is not None else "—",
                f"(1 − α^(γ+1)) / ((1 − α)(γc + 1)) with {g}: Leviathan et al. 2023, Thm 3.8 "
                "(a verify pass costs one standard step)",
            )
        )
        wv = fig.with_verify if fig is not None else None
        add(
            (
                "Cost model",
                "Thm 3.8, measured verify",
                f"{wv:.2f}×" if wv is not None else "unknown",
                f"(1 − α^(γ+1)) / ((1 − α)(γc + v)) with {g} and the verify factor v above",
            )
        )
        best = fig.best if fig is not None and fig.v is not None else None
        add(("Cost model", "Best γ", f"γ* = {best[0]} ({best[1]:.2f}×)" if best else "—",
             "the draft length Thm 3.8 gives the most speedup at this α, c and v (γ = 1…16; the Theory tab's γ*)"))
    return rows


def _speedup_value(fig: RunFigures | None) -> str:
    if fig is None or fig.clock is None:
        return "—"
    if fig.cut:
        return "none: stopped before the end"
    return fig.speedup_text() or "none: clocks flagged"


def _speedup_definition(fig: RunFigures | None) -> str:
    """How the quoted speedup was obtained: the wall clock, or the counts when the clocks were flagged."""
    if fig is not None and fig.flagged and fig.clock is not None:
        return (f"count-based: this race's passes at this machine's probed costs (its clocks were flagged; the wall "
                f"clock said {fig.clock:.2f}×)" if fig.counts is not None else
                f"its clocks were flagged and it has no count-based figure (the wall clock said {fig.clock:.2f}×)")
    return "speculative tokens/s ÷ standard tokens/s, by the wall clock (the headline's figure)"


def metrics_html(summary: "Summary | Trace | None", *, gamma: int | None = None,
                 figures: RunFigures | None = None) -> str:
    """The metrics of ``Trace.summary()`` as a compact table, each row with its definition.

    ``summary`` may also be a Trace (its summary is taken, and γ from its settings).  ``figures``:
    the race's figures (specviz.theory.figures.run_figures), for the verify factor, Thm 3.8 with it, the
    speedup and the best γ, the same numbers as the headline's and the Theory tab's.
    """
    if isinstance(summary, Trace):
        gamma = gamma if gamma is not None else getattr(summary, "gamma", None)
        summary = summary.summary()
    if not summary:
        return '<div class="sv-metrics sv-empty">No metrics yet.</div>'
    head = "Speculative decoding" if summary.kind == "speculative" else "Standard decoding"
    out = [f'<table class="sv-metrics"><caption>{esc(head)}</caption><tbody>']
    last_group = None
    for group, name, value, definition in metric_rows(summary, gamma, figures):
        if group != last_group:
            out.append(f'<tr class="sv-metrics-group"><th colspan="3">{esc(group)}</th></tr>')
            last_group = group
        tip = title_attr(name, _SYMBOLS.get(name, ()))
        out.append(
            f'<tr><th scope="row" class="sv-metric-k"{tip}>{esc(name)}</th>'
            f'<td class="sv-metric-v">{esc(value)}</td><td class="sv-metric-d">{glossed(definition)}</td></tr>'
        )
    out.append("</tbody></table>")
    return "".join(out)
