"""The This machine panel's words: what the probe measured here, why the verify factor decides, the roofline (the
bandwidth bound, and the int8 peak's compute bound) with each T(k) against it, and the recorded machines beside it
(the figure is :mod:`.machine`'s)."""

from __future__ import annotations

import math
from typing import Sequence

from ..hardware.curves import interpolate
from ..hardware.peak import words as loop_words
from ..hardware.probe import Probe
from ..hardware.roofline import probe_roofline
from ..theory.figures import RunFigures
from .execution import exec_words
from .machine import DEFAULT_GAMMA, RecordedMachine, draft_ratio, probe_gamma, verify_factor


def _ms(x: float) -> str:
    return f"{x:.0f} ms" if x >= 20 else f"{x:.1f} ms"


def _rate(x: float | None) -> str:
    return "?" if x is None or not math.isfinite(x) else f"{x:.1f}"


# The vector and matrix units that decide how bf16 and int8 products run, as /proc/cpuinfo names them.
_UNITS = (("AMX", (("amx_bf16", "BF16"), ("amx_int8", "INT8"))),
          ("AVX-512", (("avx512f", "F"), ("avx512_vnni", "VNNI"), ("avx512_bf16", "BF16"))),
          ("AVX-VNNI", (("avx_vnni", ""),)),
          ("AVX2", (("avx2", ""),)))


def isa_words(machine: dict | None) -> str:
    """The CPU's matrix and vector units in words: "AMX (BF16, INT8), AVX-512 (F, VNNI, BF16), AVX2"; a CPU
    with AVX-512 F only: "AVX-512 (F), AVX2"; "" for a GPU or when the recording names no flags."""
    if not isinstance(machine, dict) or machine.get("kind") == "cuda":
        return ""
    isa = set(machine.get("isa") or ())
    parts = []
    for unit, flags in _UNITS:
        have = [words for flag, words in flags if flag in isa]
        if have:
            named = [w for w in have if w]
            parts.append(f"{unit} ({', '.join(named)})" if named else unit)
    return ", ".join(parts)


def _units_sentence(machine: dict | None) -> str:
    words = isa_words(machine)
    if not words:
        return ""
    native = {"amx_bf16", "avx512_bf16"} & set(machine.get("isa") or ())
    return (f" Its CPU has {words}: "
            + ("native bf16 units." if native else "no native bf16 units (bf16 products are emulated)."))


WHY = ("Speculative decoding pays only when the target's **verify pass is memory-bound**: reading the "
       "weights costs the same whether the pass scores 1 token or γ + 1, so a pass over k tokens costs "
       "about one one-token step, T(k) ≈ T(1){line}. Where the pass is compute-bound, T(k) climbs with k "
       "and every round's verify pass costs several steps.")


def last_run_words(fig: RunFigures | None, gamma: int | None = None) -> str:
    """The page's last race, in the figures every panel quotes (specviz.theory.figures): its α, c and v and
    the best γ they give (the Theory tab's γ*), set apart from the probe's best γ, which is the probe's
    prediction at the pair's typical α on its own curve.  "" without a race whose v is known."""
    if fig is None or fig.v is None or fig.alpha is None or fig.c is None or fig.best is None:
        return ""
    g, sp = fig.best
    probed = ", this machine's probed cost (its clocks were flagged)" if fig.v_source == "probed" else ""
    ran = f" It ran at γ = {gamma}." if gamma else ""
    return (f"**Your last race:** α = {fig.alpha:.2f}, c = {fig.c:.2f} and a verify pass of {fig.v_text()} standard "
            f"steps{probed} give a **best γ of {g}** ({sp:.2f}× by Thm 3.8), the Theory tab's γ\\*.{ran} The probe's "
            "best γ below is another figure: its prediction at the pair's typical α on this machine's curve.")


def machine_text(probe: Probe | None, *, execution: str = "", target: str = "", why_none: str = "",
                 recorded: Sequence[RecordedMachine] = (), last: str = "") -> str:
    """Markdown for the panel: this machine, why the verify factor T(γ+1)/T(1) decides, each
    execution's factor and the predicted rates from the probe (or, without one, ``why_none``); ``last``:
    the last race's sentence (`last_run_words`), first."""
    parts: list[str] = [last] if last else []
    if probe is None or not probe.curves:
        if probe is not None and getattr(probe, "after_serving", False):
            label = probe.machine.get("label", "this machine")
            parts.append(
                f"**This machine:** {label}.{_units_sentence(probe.machine)} The target runs as "
                f"{exec_words(probe.choice)}, its one execution here; it is timed once the page is served, "
                "between runs (a few seconds), and this panel then shows its curves.")
        elif probe is not None and not probe.measured:
            label = probe.machine.get("label", "this machine")
            parts.append(
                f"**This machine:** {label}.{_units_sentence(probe.machine)} It was busy when {target or probe.model} loaded (other processes "
                "competing for the cores would make any timing meaningless), so **nothing was measured**: the "
                f"target runs as {exec_words(probe.choice)}, chosen from the CPU's features. It is measured on "
                "a quieter start.")
        else:
            parts.append(why_none or "No execution probe has run on this machine for this pair.")
        parts.append(WHY.format(line=": a flat curve"))
    else:
        parts.extend(_measured(probe, execution=execution, target=target))
    if recorded:
        lines = []
        g = probe_gamma(probe) if probe is not None and probe.curves else DEFAULT_GAMMA  # one k for all machines
        for rec in recorded:
            factors = ", ".join(f"{e} {f:.2f}" for e, c in rec.probe.curves.items()
                                if (f := verify_factor(c, g + 1)) is not None)
            note = f" — {rec.note}" if rec.note else ""
            if rec.reference:  # another program on the same GGUF files: what a CPU user would otherwise run
                lines.append(f"- **{rec.name}** ({rec.label}), the reference a CPU user would pick: T({g + 1})/T(1): "
                             f"{factors or 'not measured'}{note}.")
                continue
            lines.append(f"- **{rec.name}** ({rec.label}): chose {rec.probe.choice}; T({g + 1})/T(1): "
                         f"{factors or 'not measured'}{note}.")
        tick = " (tick them under *Compare with*)" if probe is not None and probe.curves else ""
        by = " and by llama.cpp" if any(rec.reference for rec in recorded) else ""
        parts.append(f"**Recorded on other machines{by}**{tick}:\n" + "\n".join(lines))
    return "\n\n".join(parts)


def _measured(probe: Probe, *, execution: str, target: str) -> list[str]:
    label = probe.machine.get("label", "this machine")
    g = probe_gamma(probe)
    k = g + 1
    chosen = probe.choice
    running = execution or chosen
    pred = probe.predicted.get(chosen) or {}
    head = (f"**This machine:** {label}.{_units_sentence(probe.machine)} The target ({target or probe.model}) was timed in "
            f"{len(probe.curves)} execution{'s' if len(probe.curves) != 1 else ''}"
            + (f" in {probe.seconds:.0f} s" if probe.seconds else "")
            + (f" ({probe.build_seconds:.0f} s of it preparing {probe.choice}, which any start running it pays)"
               if probe.build_seconds >= 1 else "")
            + f"; **{chosen}** was chosen: the highest predicted speculative rate at the pair's typical "
              f"acceptance α = {probe.alpha:.2f}.")
    if running != chosen:
        head += f" The target now runs as **{running}**, as set (the probe would choose {chosen})."
    if pred.get("standard"):
        sp = pred["rate"] / pred["standard"] if pred.get("standard") else None
        head += (f" Predicted on {chosen}: **{_rate(pred.get('rate'))} tokens/s** with speculation "
                 f"(γ = {pred.get('gamma', g)}) vs **{_rate(pred.get('standard'))} tokens/s** standard decoding"
                 + (f" ({sp:.2f}×)." if sp else "."))
    parts = [head, WHY.format(line=" (the flat dotted line)")]
    rows = []
    for e, curve in probe.curves.items():
        p = probe.predicted.get(e) or {}
        f = verify_factor(curve, k)
        t1 = curve.get(1)
        beyond = f" (extrapolated past k = {max(curve)})" if f is not None and k > max(curve) else ""
        if f is None:
            cost = f"only its one-token step was timed, T(1) = {_ms(t1)}" if t1 else "not timed"
        else:
            cost = (f"T(1) = {_ms(t1)}, T({k}) = {_ms(interpolate(curve, k))}: a {k}-token verify pass costs "
                    f"**{f:.2f}** one-token steps{beyond}")
        rate = ""
        if p.get("standard") and f is None:  # one point: the prediction assumed a flat curve, a bound
            rate = (f": even with a flat verify pass at most {_rate(p.get('rate'))} tokens/s speculative, "
                    f"{_rate(p.get('standard'))} standard")
        elif p.get("standard"):
            rate = (f"; predicted {_rate(p.get('rate'))} tokens/s speculative (best γ = {p.get('gamma')} at the "
                    f"probe's α = {probe.alpha:.2f}), {_rate(p.get('standard'))} standard")
        elif p.get("rate"):
            rate = f"; {_rate(p.get('rate'))} tokens/s one step at a time"
        words = exec_words(e, probe.weights.get(e, ""))
        words = words[len(e):] if words.startswith(e + " ") else f" ({words})" if words != e else ""
        rows.append(f"- **{e}**{words}{' — chosen' if e == chosen else ''}: {cost}{rate}.")
    parts.append(f"**Verify factor T({k})/T(1)** (γ = {g}), measured here:\n" + "\n".join(rows))
    c = draft_ratio(probe)
    if c is not None:
        parts.append(
            f"The draft's one-token step takes {_ms(probe.draft_ms)}: **c = {c:.2f}** of the chosen target step. "
            f"A round of γ = {g} costs γ·t_d + T(γ+1) = {g} × {_ms(probe.draft_ms)} + "
            f"{_ms(interpolate(probe.curves[chosen], k))} and yields (1 − α^(γ+1)) / (1 − α) tokens on average "
            "(Leviathan et al., Thm 3.8 with the measured verify cost).")
    elif probe.draft_ms is None:
        parts.append("The draft's step was not timed, so the execution was chosen by the fastest one-token step.")
    bound = _bound_words(probe, c)
    if bound:
        parts.append(bound)
    roof = _roofline_words(probe)
    if roof:
        parts.append(roof)
    return parts


def _bound_words(probe: Probe, c: float | None) -> str:
    """The bandwidth bound in words (the dashed line): how far the chosen step is from streaming its weights,
    and the least a draft of its size could cost."""
    ratio, t1 = probe.bound_ratio(), (probe.curves.get(probe.choice) or {}).get(1)
    if ratio is None or not t1:
        return ""
    mb, gbps = probe.step_mb[probe.choice], probe.copy_gbps
    roof = probe_roofline(probe)
    line = "the dashed line's flat part" if roof is not None and roof.token_ms else "the dashed line"
    text = (f"**The bandwidth bound** ({line}): a one-token step of {probe.choice} reads {mb:,.0f} MB of "
            f"weights, and streaming them at this machine's copy bandwidth ({gbps:.1f} GB/s, bytes read and written, "
            f"measured) takes {_ms(probe.bound_ms(mb))}: T(1) = {_ms(t1)} is **{ratio:.2f}×** that.  One token at a time, "
            "decoding waits on memory more than on arithmetic; that is the room a verify pass over several tokens uses.")
    if probe.draft_mb:
        floor = probe.bound_ms(probe.draft_mb) / t1
        text += (f" The draft reads {probe.draft_mb:,.0f} MB a step ({probe.draft_mb / mb:.2f} of the target's bytes): "
                 f"even at the bound its step would cost c = {floor:.2f} of the target's"
                 + (f" (measured: c = {c:.2f})." if c is not None else "."))
    return text


def peak_words(peak: dict | None) -> str:
    """The int8 peaks a probe measured, per instruction set: "GMAC/s on 1 / 2 threads: AVX2 vpmaddubsw + vpmaddwd
    110 / 218; ...; AMX tdpbusd tiles absent (the CPU has no amx_tile, amx_int8)"; its "why" where none was
    measured; "" for a probe made before they were kept."""
    if not isinstance(peak, dict):
        return ""
    if not peak.get("gmacs"):
        return str(peak.get("why") or "peak not measured")
    counts = sorted({int(n) for c in peak["gmacs"].values() for n in c})
    rows = [f"{loop_words(isa)} {' / '.join(f'{c[str(n)]:,.0f}' for n in counts if str(n) in c)}"
            for isa, c in peak["gmacs"].items()]
    rows += [f"{loop_words(isa)} absent ({why})" for isa, why in (peak.get("absent") or {}).items() if isa == "amx"]
    return f"GMAC/s on {' / '.join(map(str, counts))} thread{'s' if counts != [1] else ''}: " + "; ".join(rows)


def _roofline_words(probe: Probe) -> str:
    """The roofline in words: the compute part where it applies (an int8 execution, a peak measured), and where each
    measured T(k) of the chosen execution stands against max(bandwidth bound, k × compute time a token)."""
    roof, curve = probe_roofline(probe), probe.curves.get(probe.choice) or {}
    if roof is None or not curve:
        return ""
    measured = peak_words(probe.peak)
    if roof.token_ms is None:
        why = (f"{probe.choice}'s products run other instructions than int8's, whose peak is not measured"
               if probe.choice != "int8" else "this probe was made before the int8 peak was measured" if not measured
               else f"the int8 peak was not measured ({measured})" if not (probe.peak or {}).get("gmacs")
               else "a token's multiply-adds were not counted")
        head = f"**The roofline** is the bandwidth bound alone here: {why}."
    else:
        knee = roof.knee()
        head = (f"**The roofline** (the dashed line): a pass over k tokens does k × {roof.macs / 1e9:.2f} G int8 "
                f"multiply-adds (one a weight of each product: ≈ the target's parameter count). At this CPU's peak "
                f"for them, **{roof.gmacs:,.0f} GMAC/s** on {probe.machine.get('threads', '?')} threads "
                f"({loop_words(roof.isa)}, the instruction {probe.choice}'s products run here; timed with the curves), "
                f"that is {roof.token_ms:.2f} ms a token, so T(k) ≥ max({_ms(roof.bandwidth_ms or 0)}, k × {roof.token_ms:.2f} ms)"
                + (f": flat up to k ≈ {knee:.0f}, then climbing." if knee else "."))
    stands = ", ".join(f"T({k}) = {ratio:.1f}×" for k, t in sorted(curve.items())
                       if (ratio := roof.ratio(k, t)) is not None)
    text = head + (f" Measured against it: {stands} its roofline." if stands else "")
    if measured and (probe.peak or {}).get("gmacs"):
        text += f" Int8 peaks measured here, {measured}."
    return text


__all__ = ["WHY", "isa_words", "last_run_words", "machine_text", "peak_words"]
