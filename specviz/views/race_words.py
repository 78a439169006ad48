"""The race's sentences, each chosen by the run it describes: its settings (ε, the variant, temperature),
whether it was stopped, whether its clocks were flagged.  Plain text; the race panel (:mod:`.race`) escapes it.

Every number comes from the run's figures (specviz.theory.figures.run_figures), so a sentence can quote
nothing another panel contradicts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.settings import DecodeSettings
from ..theory.timing import STARTING, starting

if TYPE_CHECKING:
    from specviz.theory.figures import RunFigures
    from specviz.trace import Trace
    from specviz.trace.timing import Timing


def verdict(sp: float, spec_tps: float, std_tps: float) -> str:
    """The race's result in plain words: 'speculative is 1.85× faster' or, when it lost,
    'speculative took 1.72× as long per token (0.58× the speed)' (never "0.58× slower")."""
    rates = f"{spec_tps:.1f} ÷ {std_tps:.1f} tokens/s"
    if sp >= 1:
        return f"speculative is {sp:.2f}× faster: {rates}"
    return f"speculative took {1 / sp:.2f}× as long per token ({sp:.2f}× the speed): {rates}"


def theory_line(fig: RunFigures) -> str:
    """Thm 3.8 as published (a verify pass costs one step) beside Thm 3.8 with the verify factor the page
    quotes (this machine's probed one when the race's own clocks were flagged), and at this machine's limit where the
    probe measured it (the race's verify passes at the roofline, the draft at its bandwidth bound)."""
    if fig.textbook is None:
        return ""
    head = f"theory (Leviathan Thm 3.8): {fig.textbook:.2f}× if a verify pass cost one standard step"
    if fig.with_verify is None or fig.v is None:
        return head + " · verify cost unknown (no standard step measured)"
    source = "this machine's probed" if fig.v_source == "probed" else "the measured"
    line = f"{head} · {fig.with_verify:.2f}× with {source} verify cost ({fig.v_text()} steps)"
    limit = fig.limit
    if limit is not None:
        speedup, v, c = limit
        line += (f" · {speedup:.2f}× at this machine's limit (a verify pass at its roofline, {v:.2f} steps; the "
                 f"draft at its bandwidth bound, c = {c:.2f})")
    return line


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


def exact(spec: Trace) -> bool:
    """Whether the run's rule keeps the target's distribution (ε = 0 and corrections from the residual)."""
    s = spec.settings
    return not (s.epsilon or 0) and s.variant == "opt"


def bias_words(spec: Trace) -> str:
    """Why a run is not exact, in a few words ("" when it is): 'ε = 0.3: biased toward the draft'."""
    s = spec.settings
    parts = []
    if s.epsilon:
        parts.append(f"ε = {s.epsilon:g}: biased toward the draft")
    if s.variant == "uno":
        parts.append("Decoding-UNO: corrections drawn from p, not the residual")
    return " · ".join(parts)


def sampling_note(spec: Trace | None, std: Trace | None) -> str:
    """What the race's two texts say, chosen by the run's settings ("" when there is nothing to say):

    - exact and sampled, texts differ: as expected, each decoder draws its own random numbers, and speculative
      decoding promises the target's distribution, not its text;
    - not exact (ε > 0, Decoding-UNO), texts differ: they differ by design, the rule's bias included, greedy too;
    - otherwise (greedy and exact, or the same texts) nothing."""
    if spec is None or std is None or not spec.rounds or not std.rounds:
        return ""
    if _text(spec) == _text(std):
        return ""
    temperature = getattr(spec.settings, "temperature", 0.0) or 0.0
    if not exact(spec):
        draws = " (and each decoder draws its own random numbers)" if temperature > 0 else ""
        return (f"The two texts differ: this run is not exact ({bias_words(spec)}), so its text follows a "
                f"distribution pulled away from the target's{draws}. With ε = 0 and Decoding-OPT it would follow "
                "the target's distribution" + ("." if temperature > 0 else ", and at temperature 0 its very text."))
    if temperature <= 0:
        return ""
    return (f"The two texts differ, as expected when sampling (temperature {temperature:g} > 0): each decoder draws "
            "its own random numbers, and speculative decoding guarantees that its text follows the same "
            "distribution as the target's, not the same text. At temperature 0 (greedy) the two would match.")


def _text(trace: Trace) -> str:
    return "".join(tok.text for rnd in trace.rounds for tok in rnd.emitted)


# The settings a run may change beyond what an example sets (prompt, temperature, γ, max new tokens, seed),
# in the order the note names them; each with how the note writes a value off the page's default.
_DEFAULTS = DecodeSettings()


def settings_note(spec: Trace | None) -> str:
    """The run's settings that differ from the page's defaults, in words, for beside the headline: "" when
    none do.  'Off the page's defaults: ε = 0.3: biased toward the draft · top-p 0.9'."""
    if spec is None or spec.kind != "speculative":
        return ""
    s, d = spec.settings, _DEFAULTS
    parts = [bias_words(spec)] if not exact(spec) else []
    if s.top_p != d.top_p:
        parts.append(f"top-p {s.top_p:g}")
    if s.top_k != d.top_k:
        parts.append(f"top-k {s.top_k}")
    if s.drafter != d.drafter:
        parts.append(f"drafter: {s.drafter}")
    if s.policy != d.policy:
        parts.append(f"{s.policy} policy (γ at most {s.gamma})" + (f", τ = {s.tau:g}" if s.policy == "confidence"
                                                                     else ""))
    if s.rule != d.rule and s.drafter != "tree":
        parts.append(f"{s.rule} verification rule")
    if s.drafter == "tree":
        parts.append(f"tree: {s.tree_mode}, M = {s.branches}, ≤ {s.tree_nodes} nodes")
    parts = [p for p in parts if p]
    return "Off the page's defaults: " + " · ".join(parts) if parts else ""


def stopped_words(spec: Trace | None, std: Trace | None) -> str:
    """What a stopped race decoded before the stop: 'Stopped before the end: speculative decoded 12 tokens in
    3 rounds, standard 9 tokens. A race cut short gives no speedup, …'."""
    parts = []
    for name, t in (("speculative", spec), ("standard", std)):
        if t is None:
            continue
        if not t.rounds:
            parts.append(f"{name} nothing (it was still reading the prompt)")
            continue
        n, r = t.n_tokens, len(t.rounds)
        rounds = f" in {r} round{'s' if r != 1 else ''}" if t.kind == "speculative" else ""
        parts.append(f"{name} {n} token{'s' if n != 1 else ''}{rounds}")
    decoded = ("Stopped before the end: " + ", ".join(parts) + " decoded before the stop. ") if parts else ""
    return (decoded + "A race cut short gives no speedup, since its two sides stopped at different points of "
            "their texts. Press Run to race again.")


# How a run cut short says so (the rounds panel, the race's badge).
CUT_WORDS = {"stopped": "Stopped", "time_limit": "The job's time limit stopped the run",
             "error": "An error stopped the run"}


def cut_line(trace: Trace) -> str:
    """The rounds panel's last line for a run cut short: what it decoded before ("" when it ran to its end)."""
    why = CUT_WORDS.get(trace.stop_reason or "")
    if why is None:
        return ""
    if not trace.rounds:
        return f"{why} before the first round (it was still reading the prompt): nothing was decoded."
    n = sum(len(r.emitted) for r in trace.rounds)
    return f"{why} after round {len(trace.rounds)}: {n} token{'s' if n != 1 else ''} decoded before it."


__all__ = ["CUT_WORDS", "bias_words", "cut_line", "exact", "noise_sentence", "sampling_note", "settings_note", "stopped_words", "theory_line",
           "timing_note", "verdict"]

