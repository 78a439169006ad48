"""The workshop challenges' checks: pure functions of the runs a learner made (no Gradio, no models).

Each check reads what the traces recorded -- texts, timings, every verified position's p, q, b, u
and acceptance picture, each drafted token's p and block verification's h -- and returns a
`Verdict`: passed or not, and a message that says what was found in which run.  What a run is and
how one is read: `specviz.experiments.challenge_runs`; the challenges' texts and their order:
`specviz.experiments.challenges`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..core.rules import draft_odds, expected_kept
from ..core.text import tok_repr
from ..hardware.curves import interpolate
from ..theory.costs import loss_cause
from ..theory.figures import run_figures
from ..trace import Picture, Round
from ..theory.timing import flagged
from .challenge_runs import (CLEAN_ENDS, MIN_ROUNDS, Given, Run, Verdict, count_based, describe, is_chain, none_yet,
                             not_timed, raced, speculative, speedup, tokens_text)

BIAS_VISIBLE = 0.05  # mean TV(A, p) per verified position from which the ε challenge calls the bias visible
MACHINE_BANDS = {"flat": (0.0, 1.25), "middle": (1.25, 2.0), "steep": (2.0, float("inf"))}  # v, in steps
MACHINE_SLACK = 0.1  # timings jitter: within this of a band's edge, the neighbouring answer counts too
MIN_VERIFIED = 8  # verified positions the ε challenge wants before it trusts a run's mean bias


# ---- 1. exact, even when the draft is wrong -----------------------------------------------------


def check_exact(runs: Sequence[Run], given: Given) -> Verdict:
    greedy = [r for r in speculative(runs) if r.spec.settings.temperature == 0 and r.std is not None and r.std.rounds]
    if not greedy:
        return none_yet("is greedy (temperature 0) with its standard run")
    exact = [r for r in greedy if r.spec.settings.epsilon == 0 and r.spec.settings.variant == "opt"]
    if not exact:
        return Verdict(passed=False, message="Your greedy runs all used ε > 0 or Decoding-UNO, which are not exact: "
                                             "set ε = 0 and Decoding-OPT.")
    ended = [r for r in exact if r.spec.stop_reason in CLEAN_ENDS and r.std.stop_reason in CLEAN_ENDS]
    if not ended:
        return Verdict(passed=False, message="Your greedy runs were stopped before the end: let one finish.")
    wrong = [r for r in ended if (r.spec.summary().rejections or 0) > 0]
    if not wrong:
        return Verdict(passed=False, message=f"In {describe(ended[0])} the draft was never rejected, so the rule "
                                             "never had to correct anything: try a prompt the draft finds harder "
                                             "(the chat example).")
    for r in wrong:
        if r.spec.text == r.std.text:
            n = r.spec.summary().rejections
            return Verdict(passed=True, message=(
                f"{describe(r)}: the draft was rejected {n} time{'s' * (n != 1)}, and the speculative text equals "
                f"the standard text, all {r.spec.n_tokens} tokens."))
    r = wrong[0]
    at = next((i for i, (a, b) in enumerate(zip(r.spec.tokens, r.std.tokens)) if a.id != b.id),
              min(r.spec.n_tokens, r.std.n_tokens))
    return Verdict(passed=False, message=(
        f"In {describe(r)} the texts part at token {at + 1}. Greedy speculation is exact only when the target's "
        "verify pass computes the same logits as its one-token step; a bf16 target sums a several-token pass in "
        "another order, and where two tokens nearly tie the argmax can flip. The int8 target is batch-invariant "
        "(bit-identical), so there the texts match: try another prompt, or the int8 execution."))


# ---- 2. make speculation lose -----------------------------------------------------------------


def check_lose(runs: Sequence[Run], given: Given) -> Verdict:
    timed = raced(runs)
    if not timed:
        return not_timed(runs, f"raced the standard run to the end with at least {MIN_ROUNDS} rounds")
    lost = [r for r in timed if speedup(r) < 1]
    if not lost:
        best = min(timed, key=speedup)
        return Verdict(passed=False, message=(
            f"Speculation won every race so far; your slowest was {describe(best)} at {speedup(best):.2f}× the "
            "standard speed. Raise γ (constant policy), sample at a higher temperature, or pick a prompt the draft "
            "guesses badly."))
    r = lost[0]
    sp = speedup(r)
    cause = loss_cause(run_figures(r.spec, r.std).quoted)  # the headline's "why", at the costs it quotes
    why = f" Why, from the run's own numbers: {cause[1]}." if cause else ""
    return Verdict(passed=True, message=(
        f"{describe(r)} ran at {sp:.2f}× the standard speed{count_based(r)} (speculative took {1 / sp:.2f}× as long "
        "per token)." + why))


# ---- 3. read this machine's verify cost --------------------------------------------------------


def band_of(v: float) -> str:
    return next(k for k, (lo, hi) in MACHINE_BANDS.items() if lo <= v < hi)


def answer_fits(answer: str, v: float) -> bool:
    lo, hi = MACHINE_BANDS[answer]
    return lo - MACHINE_SLACK <= v < hi + MACHINE_SLACK


def probe_factor(run: Run, given: Given, fed: float) -> float | None:
    """T(fed)/T(1) on this machine's probed curve for the run's pair and execution, None when not probed."""
    curve = given.probe_curves.get((run.spec.models.get("preset", ""), run.spec.models.get("target_exec", "")))
    if not curve or not curve.get(1):
        return None
    return interpolate(curve, fed, beyond="flat") / curve[1]


BOUND_WORDS = {"flat": "memory-bound", "middle": "partly compute-bound", "steep": "compute-bound"}


def check_machine(runs: Sequence[Run], given: Given) -> Verdict:
    """The answer is checked against this machine's probed curve for the run's execution at the tokens the
    run fed (the This machine tab's curve), taken on a quiet machine; only where the machine was never
    probed, against the run's own verify factor v -- and then only from a race whose timings held."""
    if given.answer not in MACHINE_BANDS:
        return Verdict(passed=False, message="Pick an answer first (just under the challenge), then check.")
    timed = [r for r in raced(runs) if is_chain(r.spec) and (r.spec.summary().mean_draft_length or 0) >= 3
             and run_figures(r.spec, r.std).v is not None]
    if not timed:
        return not_timed(runs, "raced the standard run with a chain of at least 3 drafted tokens a round")
    r = timed[0]
    fig = run_figures(r.spec, r.std)  # v and c as the race's panels quote them (the probe's for a flagged race)
    rc = fig.costs
    v, fed = fig.v, (r.spec.summary().mean_draft_length or 0) + 1
    pv = probe_factor(r, given, fed)
    if pv is None and flagged(r.spec):
        return not_timed([r], "")
    truth = pv if pv is not None else v
    if not answer_fits(given.answer, truth):
        return Verdict(passed=False, message=(
            f"Not what this machine measured in {describe(r)}. Read it off the This machine tab (the chosen "
            f"execution's curve at k = {tokens_text(fed)} tokens fed ÷ its value at k = 1) or the Live tab's metrics (v)."))
    probe = ""
    if pv is not None:
        probe = f" The probe's curve for this execution gives T({tokens_text(fed)})/T(1) = {pv:.2f}: that is what was checked."
        if band_of(pv) != band_of(v) and not fig.flagged:
            probe += (f" Your race measured v = {fig.v_text()} instead: the probe timed the target on a quiet machine, "
                      "and a race's timings swing when other runs or programs share the cores.")
    pred = ""
    if fig.with_verify is not None and fig.textbook is not None and fig.speedup is not None:
        source = "this machine's probed v" if fig.v_source == "probed" else "your run's v"
        pred = (f" With α = {fig.alpha:.2f} and c = {fig.c:.2f} steps, Thm 3.8 predicts {fig.with_verify:.2f}× with "
                f"{source} against {fig.textbook:.2f}× textbook (v = 1); the race {'counted' if fig.flagged else 'measured'}"
                f" {fig.speedup:.2f}×.")
    if fig.flagged:
        took = (f"{describe(r)}: its clocks were flagged (the machine was busy), so its verify pass over "
                f"{tokens_text(fed)} tokens is quoted at this machine's probed cost, v = {fig.v_text()} standard steps; "
                f"this machine: {BOUND_WORDS[band_of(truth)]}.")
    else:
        took = (f"{describe(r)}: a verify pass over {tokens_text(fed)} tokens on average took {rc.t_verify * 1000:.0f} ms, "
                f"{fig.v_text()} standard steps of {rc.t_step * 1000:.0f} ms (v = {fig.v_text()}); this machine: "
                f"{BOUND_WORDS[band_of(truth)]}.")
    return Verdict(passed=True, message=took + probe + pred)


# ---- 4. a correction the draft did not expect ---------------------------------------------------


@dataclass(frozen=True)
class Correction:
    """One rejection with its picture: the correction's rank under the draft's distribution."""

    run: Run
    rnd: Round
    rank: int | None  # 1, 2, 3…: the correction's place in the draft's ranking; None: not known for sure
    beliefs: list[float]  # the draft's q at the picture's ids (its temperature-1 beliefs in a greedy run)
    pic: Picture
    at: int  # the correction's index in the picture


def correction_rank(pic: Picture, token: int, greedy: bool) -> tuple[int | None, list[float], int] | None:
    """(rank of `token` under the draft, the beliefs used, its index), or None when it is not in the picture.
    The rank is certain when two shown tokens have more q (≥ 3), or none does and q(token) beats all the
    mass outside the picture (1); otherwise None."""
    if token not in pic.ids:
        return None
    q = pic.q1 if greedy and pic.q1 is not None else pic.q
    at = pic.ids.index(token)
    above = sum(1 for j, x in enumerate(q) if j != at and x > q[at])
    if above >= 2:
        return above + 1, q, at
    rest = 1.0 - sum(q) if greedy and pic.q1 is not None else pic.rest_q
    if above == 0 and q[at] > rest:
        return 1, q, at
    if above == 1 and q[at] > rest:
        return 2, q, at
    return None, q, at


def corrections(runs: Sequence[Run]) -> list[Correction]:
    out = []
    for run in speculative(runs):
        greedy = run.spec.settings.temperature == 0
        for rnd in run.spec.rounds:
            if rnd.tree is not None or rnd.extra is None or rnd.extra.kind != "correction" or not rnd.positions:
                continue
            pos = rnd.positions[-1]
            if pos.accepted or pos.picture is None:
                continue
            found = correction_rank(pos.picture, rnd.extra.id, greedy)
            if found is not None:
                out.append(Correction(run, rnd, found[0], found[1], pos.picture, found[2]))
    return out


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def check_correction(runs: Sequence[Run], given: Given) -> Verdict:
    spec_runs = speculative(runs)
    if not spec_runs:
        return none_yet("is a speculative run")
    found = corrections(runs)
    if not found:
        if all(p.picture is None for r in spec_runs for rnd in r.spec.rounds for p in rnd.positions):
            return Verdict(passed=False, message="Your runs keep no acceptance pictures (recordings older than "
                                                 "version 3): make a run of your own.")
        return Verdict(passed=False, message="No draft token of your runs was rejected and corrected yet: sample "
                                             "(temperature 0.7–1) on a prompt the draft finds hard.")
    hit = next((c for c in found if c.rank is not None and c.rank != 2), None)
    if hit is None:
        return Verdict(passed=False, message=(
            f"In all {len(found)} corrections so far the correction was the draft's second choice (or too close to "
            "call). Sample at a higher temperature, or try another prompt: look for a rejection where the target "
            "is much surer of some token than the draft is."))
    pic, at, q, rnd = hit.pic, hit.at, hit.beliefs, hit.rnd
    pos = rnd.positions[-1]
    drafted = rnd.draft[pos.i - 1]
    runner = sorted(range(len(q)), key=lambda j: -q[j])[1]  # the draft's runner-up (rank is certain: ≠ at)
    place = "first" if hit.rank == 1 else _ordinal(hit.rank)
    greedy = hit.run.spec.settings.temperature == 0
    which = "temperature-1 beliefs" if greedy else "q"
    where = (" At temperature 0 the correction is the target's own argmax, whatever the draft ranked second."
             if greedy else f" There p = {pic.p[at]:.2f}, and the correction's distribution gave it {pic.res[at]:.2f}.")
    return Verdict(passed=True, message=(
        f"{describe(hit.run)}, round {rnd.index + 1}, position {pos.i}: the draft proposed {tok_repr(drafted.text)} and the "
        f"target rejected it (u = {pos.u:.2f} ≥ b = {pos.b:.2f}). The draft's second choice was "
        f"{tok_repr(pic.text[runner])} ({which} {q[runner]:.2f}), but the correction was {tok_repr(pic.text[at])}, the draft's "
        f"{place} choice ({which} {q[at]:.2f})." + where))


# ---- 5. same draft, a better rule --------------------------------------------------------------


def check_block(runs: Sequence[Run], given: Given) -> Verdict:
    sampled = [r for r in speculative(runs) if is_chain(r.spec) and r.spec.settings.temperature > 0
               and r.spec.settings.epsilon == 0]
    if not sampled:
        return none_yet("samples (temperature > 0, ε = 0) with a chain drafter")
    tried = []
    for r in sampled:
        per_round = [(rnd, expected_kept(odds)) for rnd in r.spec.rounds if (odds := draft_odds(rnd.draft))]
        if not per_round:
            continue
        n = len(per_round)
        token = sum(e["token"] for _, e in per_round) / n
        block = sum(e["block"] for _, e in per_round) / n
        match = sum(e["match"] for _, e in per_round) / n
        tried.append((r, token, block))
        if block > token + 1e-9:
            worse = [rnd for rnd, e in per_round if e["block"] < e["token"] - 1e-9]
            other = (f" On {len(worse)} of the {n} drafts block alone would have kept less (e.g. round "
                     f"{worse[0].index + 1}): block verification wins on average over drafts, not on every draft."
                     if worse else " On none of them did block keep less than the token rule.")
            return Verdict(passed=True, message=(
                f"{describe(r)}, verified with the {r.spec.settings.rule} rule: on its {n} drafts, block verification "
                f"keeps {block:.3f} drafted tokens per round on average, the token-wise rule {token:.3f} "
                f"(+{(block - token) / token * 100 if token else 0:.1f}%), exact match {match:.3f}." + other))
    if not tried:
        return Verdict(passed=False, message="Your sampled runs keep no drafted p(x) and h (recordings older than "
                                             "version 3): make a run of your own.")
    r, token, block = tried[0]
    return Verdict(passed=False, message=(
        f"On the drafts of {describe(r)} block and token-wise keep the same on average ({block:.3f} vs {token:.3f}): "
        "they differ only where a draft has a doubtful token followed by likely ones. Try a longer γ or another "
        "prompt at temperature 0.7–1."))


# ---- 6. raise ε until the bias shows ----------------------------------------------------------


def check_bias(runs: Sequence[Run], given: Given) -> Verdict:
    over = [r for r in speculative(runs) if r.spec.settings.epsilon > 0 and r.spec.summary().mean_bias is not None]
    if not over:
        return none_yet("used an over-acceptance ε > 0")
    over = [r for r in over if (r.spec.summary().verified or 0) >= MIN_VERIFIED]
    if not over:
        return Verdict(passed=False, message=f"Your runs with ε > 0 verified fewer than {MIN_VERIFIED} draft tokens: "
                                             "make a longer run (more new tokens).")
    best = max(over, key=lambda r: r.spec.summary().mean_bias)
    s = best.spec.summary()
    eps = best.spec.settings.epsilon
    if s.mean_bias < BIAS_VISIBLE:
        return Verdict(passed=False, message=(
            f"Your most biased run, {describe(best)}, moved {s.mean_bias:.3f} of each token's probability away from "
            f"the target's on average (below {BIAS_VISIBLE:g}): raise ε, or sample on a prompt where draft and "
            "target disagree more."))
    exact = [r for r in speculative(runs) if r.spec.settings.epsilon == 0 and r.spec.prompt == best.spec.prompt
             and r.spec.settings.drafter == best.spec.settings.drafter
             and r.spec.settings.temperature == best.spec.settings.temperature]
    versus = ""
    a0 = exact[0].spec.summary().alpha if exact else None
    if a0 is not None and s.alpha is not None:
        versus = (f" α rose from {a0:.2f} at ε = 0 on the same prompt to {s.alpha:.2f}." if s.alpha > a0 else
                  f" α was {a0:.2f} at ε = 0 on the same prompt and {s.alpha:.2f} here: over one short run α is "
                  "noisy, while the rejection probability and the bias below are exact at each position.")
    yin = ""
    if best.spec.settings.variant == "opt" and s.mean_reject_prob is not None and s.verified:
        tv = 1 - (s.mean_beta or 0)
        yin = (f" Rejection probability + bias = {s.mean_reject_prob:.3f} + {s.mean_bias:.3f} = "
               f"{s.mean_reject_prob + s.mean_bias:.3f}, the mean TV(p, q) = {tv:.3f}: the bias is paid for with "
               "rejections saved, one for one.")
    return Verdict(passed=True, message=(
        f"{describe(best)}: at ε = {eps:g} each emitted token's distribution sat {s.mean_bias:.3f} (total variation, "
        f"averaged over {s.verified} verified positions) away from the target's, computed exactly at each position "
        "from the recorded p and q; one text is far too short to show it by counting." + versus + yin))


# ---- 7. a tree that beats the chain ------------------------------------------------------------


def check_tree(runs: Sequence[Run], given: Given) -> Verdict:
    spec_runs = speculative(runs)
    trees = [r for r in spec_runs if r.spec.settings.drafter == "tree"]
    if not trees:
        return none_yet("used the token tree drafter")
    chains = [r for r in spec_runs if r.spec.settings.drafter == "model"]

    def same(a: Run, b: Run) -> bool:
        x, y = a.spec, b.spec
        return (x.prompt == y.prompt and x.models.get("preset") == y.models.get("preset")
                and x.settings.temperature == y.settings.temperature)

    pairs = [(t, c) for t in trees for c in chains if same(t, c)]
    if not pairs:
        return Verdict(passed=False, message="Run the draft model's chain on the same prompt (and temperature) as "
                                             "your tree run, so the two can be compared.")
    fair = [(t, c) for t, c in pairs if t.spec.settings.gamma <= c.spec.settings.gamma]
    if not fair:
        t, c = pairs[0]
        return Verdict(passed=False, message=(
            f"Your tree grew {t.spec.settings.gamma} deep but the chain drafted only γ = {c.spec.settings.gamma}: "
            "compare at the same depth (or a shallower tree)."))
    mal = lambda r: r.spec.summary().mean_accepted_length or 0.0  # noqa: E731
    for t, c in fair:
        if mal(t) > mal(c):
            timing = ""
            st, sc = speedup(t), speedup(c)
            if st is not None and sc is not None:
                timing = (f" In time: the tree ran at {st:.2f}× standard, the chain at {sc:.2f}× — the tree's verify "
                          "pass scores every node, which is cheap only where the target is memory-bound.")
            return Verdict(passed=True, message=(
                f"On “{' '.join(t.spec.prompt.split())[:28]}”: the tree (M = {t.spec.settings.branches}, ≤ "
                f"{t.spec.settings.tree_nodes} nodes, depth {t.spec.settings.gamma}) kept {mal(t):.2f} tokens per "
                f"round against the chain's {mal(c):.2f} at γ = {c.spec.settings.gamma}." + timing))
    t, c = max(fair, key=lambda tc: mal(tc[0]) - mal(tc[1]))
    return Verdict(passed=False, message=(
        f"Your best tree kept {mal(t):.2f} tokens per round, the chain {mal(c):.2f}: give the tree more branches (M) "
        "or nodes, or pick a prompt where the draft's first guess is often wrong but its second is right."))


# ---- 8. prompt lookup pays ------------------------------------------------------------------


def check_lookup(runs: Sequence[Run], given: Given) -> Verdict:
    looked = [r for r in speculative(runs) if r.spec.settings.drafter == "prompt-lookup"]
    if not looked:
        return none_yet("used prompt lookup")
    timed = [r for r in raced(looked)]
    if not timed:
        return not_timed(looked, f"with prompt lookup raced the standard run to the end with at least {MIN_ROUNDS} rounds")
    won = [r for r in timed if speedup(r) > 1]
    if not won:
        r = timed[0]
        drafted = sum(1 for rnd in r.spec.rounds if rnd.draft)
        return Verdict(passed=False, message=(
            f"{describe(r)} ran at {speedup(r):.2f}× standard: only {drafted} of its {len(r.spec.rounds)} rounds "
            "found anything to copy. Ask for output that repeats the prompt (edit a code snippet, repeat a list, "
            "quote the text)."))
    r = won[0]
    s = r.spec.summary()
    return Verdict(passed=True, message=(
        f"{describe(r)} ran at {speedup(r):.2f}× standard{count_based(r)}: {s.mean_accepted_length:.2f} tokens per "
        "target pass, "
        f"α = {s.alpha or 0:.2f}, and drafting cost no model pass at all."))


__all__ = ["BIAS_VISIBLE", "MACHINE_BANDS", "band_of", "check_bias", "check_block", "check_correction", "check_exact",
           "check_lookup", "check_lose", "check_machine", "check_tree", "correction_rank", "corrections"]
