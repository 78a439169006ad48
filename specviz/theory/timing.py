"""Can a race's clocks be trusted?  Noise read from the passes themselves, and a count-based second opinion.

Every forward pass of a race is timed (a round's verify pass, its drafting, each standard step).
On a quiet machine passes that feed the same number of tokens take the same time, within a few
per cent; on a busy one some are stretched by a neighbour's work.  So, per run:

    excess = Σ max(0, t − m) / Σ t      over passes grouped by (kind, tokens fed), m each group's median

is the share of the run's time that its own typical passes do not account for: the uncertainty of
its tokens/s.  The speedup's uncertainty combines both runs' (root sum of squares): ±spread.

The **count-based speedup** prices the race's own counts -- draft passes, verify passes and the
tokens each fed, standard steps -- with the probe's measured costs for this machine and execution
(specviz.hardware.probe: T(k) for a pass feeding k tokens, the draft's step); the prompt passes and
Python's own time between passes is left out (see _priced_time): only counts go in.  It cannot see the load; the wall clock can.  A race is **reliable**
when its spread is small and its measured costs are physically possible (a verify pass over several
tokens is never cheaper than one step).  Otherwise the page says so and trusts the counts.  Where a reliable
race's two figures part by more than DISAGREE, the page says so beside the wall clock, which it quotes: the
probe's prices, not these runs' passes, are then what is off.

No models, no UI: plain functions of traces and of the probe's costs, which the caller hands in (`Prices`:
serving.service.probe_prices reads them off the loaded pair).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable

from ..core.settings import DRAFT_MODEL_DRAFTERS
from ..trace import Trace
from ..trace.timing import Timing
from .costs import race_costs

SPREAD_MAX = 0.15  # above this uncertainty of the speedup, the race is flagged
DISAGREE = 0.25  # measured vs count-based speedup: flagged beyond max(this, 2 × spread)
V_MIN = 0.9  # a verify pass feeding several tokens measured below this many steps: the clocks lied
MIN_GROUP = 3  # passes with the same (kind, tokens fed) needed for a median to judge them by
# A run shorter than this is not judged: its passes last a millisecond or so (a tiny model), where Python's own
# overhead and first-call costs, not the machine's load, make the scatter.
MIN_JUDGED_S = 0.5
# Where a busy machine shows first: the standard step this much slower than the probe's.
BUSY_SLOWDOWN = 1.3


@dataclass(frozen=True)
class Pass:
    """One timed forward pass (or ``weight`` passes sharing a mean: a round's draft steps)."""

    kind: str  # "draft" | "verify" | "step"
    fed: int  # tokens fed (1 for a draft or standard step)
    seconds: float
    weight: int = 1


def passes(trace: Trace) -> list[Pass]:
    """The run's timed passes, the prompt's left out (they are not typical: they feed the prompt)."""
    out: list[Pass] = []
    for r in trace.rounds:
        if trace.kind == "standard":
            if r.target_forwards and not r.prompt_fed:
                out.append(Pass("step", 1, r.t_verify))
            continue
        if r.draft_forwards:
            out.append(Pass("draft", 1, r.t_draft / r.draft_forwards, r.draft_forwards))
        if r.target_forwards and not r.prompt_fed:
            fed = r.tree.fed if r.tree is not None else len(r.draft) + 1
            out.append(Pass("verify", fed, r.t_verify))
    return out


def _weighted_median(items: list[Pass]) -> float:
    return statistics.median([p.seconds for p in items for _ in range(p.weight)])


def medians(ps: list[Pass]) -> dict[tuple[str, int], float]:
    """Each (kind, tokens fed) group's median pass time, for groups of at least MIN_GROUP passes."""
    groups: dict[tuple[str, int], list[Pass]] = {}
    for p in ps:
        groups.setdefault((p.kind, p.fed), []).append(p)
    return {g: _weighted_median(items) for g, items in groups.items() if sum(p.weight for p in items) >= MIN_GROUP}


def excess(ps: list[Pass]) -> float:
    """The share of the judged passes' time above their group's median (0: every pass typical)."""
    med = medians(ps)
    judged = [p for p in ps if (p.kind, p.fed) in med]
    total = sum(p.seconds * p.weight for p in judged)
    if total <= 0:
        return 0.0
    return sum(max(0.0, p.seconds - med[(p.kind, p.fed)]) * p.weight for p in judged) / total


@dataclass(frozen=True)
class Prices:
    """The probe's measured costs in seconds (built by the caller from specviz.hardware.probe)."""

    target: Callable[[int], float]  # a target pass feeding k tokens: the probe's curve T(k), read between points
    draft: float | None  # the draft model's one-token step; None: no draft model (the run's own median is used)
    threads: int | None = None  # the threads the probe ran with (its times hold for those)
    # This machine's limit (hardware.roofline): a pass over k tokens at its roofline, max(the weights at the copy
    # bandwidth, k tokens' multiply-adds at the int8 peak), and the draft's step at its bandwidth bound; None unmeasured
    limit_target: Callable[[int], float] | None = None
    limit_draft: float | None = None


def _priced_time(trace: Trace, prices: Prices, own_draft: float | None) -> float:
    """The run's forward passes, every one priced by the probe: each draft step at its draft step, each verify
    pass and standard step at T(tokens it fed), the prompt's too (merged into the first pass, or fed in chunks
    before it: T(its tokens)), and the draft model's own prompt pass at its step's share of the target's, c × T(n).
    Only counts go in, so two runs with the same counts get the same figure, bit for bit, whatever the machine
    was doing (it varied 1.17-1.34x on three identical races while the prompt's measured time was in it).
    Python's own time between the passes (sampling, the verification rule, the page's tracing) is left out: it
    is not a count, and the wall clock, which includes it, is the figure a quiet race is quoted by."""
    priced = 0.0
    c = (prices.draft / prices.target(1)) if prices.draft else None
    for r in trace.rounds:
        if trace.kind == "standard":
            if r.target_forwards:
                priced += prices.target(1 + r.prompt_fed)
            continue
        if r.draft_forwards:
            price = prices.draft if prices.draft is not None else (own_draft or r.t_draft / r.draft_forwards)
            priced += r.draft_forwards * price
        if r.target_forwards:
            fed = r.tree.fed if r.tree is not None else len(r.draft) + 1
            priced += prices.target(fed + r.prompt_fed)
    first = trace.rounds[0].prompt_fed if trace.rounds else 0
    chunked = max(0, trace.prompt_tokens - 1 - first) if trace.rounds else 0  # a long prompt's chunks, fed before
    if chunked:
        priced += prices.target(chunked)
    if trace.kind != "standard" and trace.draft_prefill > 0 and c is not None and trace.prompt_tokens > 1:
        priced += c * prices.target(trace.prompt_tokens - 1)
    return priced


def event_costs(prices: Prices | None, *, draft_model: bool) -> Callable[[str, Any, float], float] | None:
    """What each engine event of a race should cost at the probe's prices (core.race.interleave's
    ``cost``): a drafted token a draft-model step (nothing for a drafter without one), a finished
    round its target pass over the tokens it fed (the prompt's too, when merged in), the end nothing.
    None without prices (interleave then balances measured time)."""
    if prices is None:
        return None

    def cost(name: str, event: Any, seconds: float) -> float:
        kind, rnd = getattr(event, "kind", ""), getattr(event, "round", None)
        if kind == "draft":
            return (prices.draft or 0.0) if draft_model else 0.0
        if kind != "round" or rnd is None:
            return 0.0
        if name == "standard":
            return prices.target(1 + rnd.prompt_fed)
        fed = rnd.tree.fed if rnd.tree is not None else len(rnd.draft) + 1
        return prices.target(fed + rnd.prompt_fed) if rnd.target_forwards else 0.0

    return cost


def _uses_draft_model(trace: Trace) -> bool:
    """Whether the draft passes are the draft model's (priced by the probe's draft step)."""
    return trace.settings.drafter in DRAFT_MODEL_DRAFTERS


def _factors(fed: list[int], target: Callable[[int], float], draft: float | None,
             draft_model: bool) -> tuple[float | None, float | None]:
    """(v, c) at a pass's price ``target(k)``: the verify passes that fed ``fed`` tokens over the one-token step,
    and the draft model's step (``draft``, where the run drafted with it) over that step; None where unknown."""
    t1 = target(1)
    if not t1:
        return None, None
    v = round(sum(target(k) for k in fed) / len(fed) / t1, 4) if fed else None
    c = round(draft / t1, 4) if draft is not None and draft_model else None
    return v, c


def count_based_speedup(spec: Trace, std: Trace, prices: Prices) -> float | None:
    """The speedup this race's counts predict at the probe's costs (prompt passes as measured, scaled
    to the probe's machine: see _priced_time)."""
    if not spec.rounds or not std.rounds:
        return None
    if not _uses_draft_model(spec):
        prices = Prices(prices.target, None, prices.threads)
    own = medians(passes(spec))
    own_draft = own.get(("draft", 1))
    t_spec, t_std = _priced_time(spec, prices, own_draft), _priced_time(std, prices, None)
    if t_spec <= 0 or t_std <= 0 or not std.n_tokens:
        return None
    return (spec.n_tokens / t_spec) / (std.n_tokens / t_std)


STARTING = "the server had just started"  # how a race timed while the server prepared its models says why


def starting(timing: Timing) -> bool:
    """Whether ``timing`` was flagged because the server was still starting (not a busy machine)."""
    return str(timing.why or "").startswith(STARTING)


def assess_race(spec: Trace, std: Trace | None, *, how: str = "interleaved", threads: int | None = None,
                busy: float | None = None, prices: Prices | None = None, threads_end: int | None = None,
                busy_during: float | None = None, preparing: bool | str = False) -> Timing:
    """How far this race's timings hold (see the module's docstring).  ``threads_end``: the count the
    race dropped to when other work arrived (its prices are for that count).  ``preparing``: the server
    was still packing the models' weights into their fast layout during the race (specviz.models.warm):
    its passes ran on slower products, some of them switching mid-race, so its clocks are not quoted (a
    sentence: why, in those words)."""
    ps_spec = passes(spec)
    fed = [p.fed for p in ps_spec if p.kind == "verify"]
    draft_model = _uses_draft_model(spec)
    v_limit = c_limit = None
    if prices is not None and prices.limit_target is not None and spec.rounds:  # this machine's limit
        v_limit, c_limit = _factors(fed, prices.limit_target, prices.limit_draft, draft_model)
    who = dict(how=how, threads=threads, busy=busy, threads_end=threads_end, busy_during=busy_during,
               v_limit=v_limit, c_limit=c_limit)
    if isinstance(preparing, str):
        warming = preparing
    elif preparing:
        warming = f"{STARTING} and was still preparing the models' fast kernels: some passes ran on slower ones"
    else:
        warming = ""
    if warming:
        who.update(reliable=False, why=warming)
    if spec.t_total < MIN_JUDGED_S or (std is not None and std.t_total < MIN_JUDGED_S):
        return Timing(**who, judged=False)
    e_spec = excess(ps_spec)
    if std is None or not std.rounds or not spec.rounds:
        return Timing(**who, spread=round(e_spec, 4), spread_spec=round(e_spec, 4))
    who.pop("reliable", None), who.pop("why", None)
    ps_std = passes(std)
    e_std = excess(ps_std)
    spread = (e_spec ** 2 + e_std ** 2) ** 0.5
    ran = threads_end or threads
    comparable = prices is not None and (ran is None or prices.threads is None or ran == prices.threads)
    predicted = count_based_speedup(spec, std, prices) if prices is not None else None
    rc = race_costs(spec, std)
    measured = rc.measured if rc is not None else None
    step = medians(ps_std).get(("step", 1))
    slowdown = step / prices.target(1) if comparable and step else None
    v_probe, c_probe = _factors(fed, prices.target, prices.draft, draft_model) if prices is not None else (None, None)

    why = []
    if spread > SPREAD_MAX:
        cause = ("a GPU's passes wait on Python to launch their kernels, and any other work on its CPU stretched "
                 "some of them" if str(spec.device).startswith("cuda") else
                 "other work on the machine stretched some of them")  # H100, eager: ±35% on an idle machine
        why.append(f"passes that fed the same tokens varied by ±{spread:.0%}: {cause}")
    if rc is not None and rc.v is not None and rc.v < V_MIN and (rc.drafted_per_round or 0) >= 1:
        why.append(f"a verify pass measured {rc.v:.2f} standard steps, which cannot be: it reads the same weights "
                    "as a step and more tokens")
    if measured is not None and predicted is not None:
        # Disagreement condemns the clocks only where some kind of pass ran slower than the probe timed it (a
        # steadily slowed draft on an oversubscribed CPU): passes at or under the probe's prices are a
        # measurement, and then it is the probe's prices that are off (timed at start-up), which the
        # timing note says beside the wall clock.
        off = abs(measured / predicted - 1)
        stretched = _slowest_kind(ps_spec, ps_std, prices, _uses_draft_model(spec)) if comparable else 0.0
        if off > max(DISAGREE, 2 * spread) and (why or stretched > BUSY_SLOWDOWN):
            why.append(f"the wall clock's {measured:.2f}× and the count-based {predicted:.2f}× disagree by {off:.0%}")
    if slowdown is not None and slowdown > BUSY_SLOWDOWN and why:
        why.append(f"standard steps ran {slowdown:.1f}× slower than when this machine was probed")
    if warming:
        why.append(warming)
    if threads_end is not None and threads_end != threads and why:
        why.append(f"other work arrived during the race, which then went on with {threads_end} thread"
                   f"{'s' if threads_end != 1 else ''} instead of {threads}")
    return Timing(**who, spread=round(spread, 4), spread_spec=round(e_spec, 4),
                  spread_std=round(e_std, 4), reliable=not why, why="; ".join(why),
                  predicted=None if predicted is None else round(predicted, 4),
                  slowdown=None if slowdown is None else round(slowdown, 4),
                  v_probe=v_probe, c_probe=c_probe)


def _slowest_kind(ps_spec: list[Pass], ps_std: list[Pass], prices: Prices | None, draft_model: bool) -> float:
    """How much slower than the probe's price the slowest kind of pass ran (its median over its price): draft
    steps, each verify size, standard steps.  0 without prices."""
    if prices is None:
        return 0.0
    worst = 0.0
    for (kind, fed), med in {**medians(ps_spec), **{("step", k): v for (_, k), v in medians(ps_std).items()}}.items():
        if kind == "draft":
            price = prices.draft if draft_model else None
        else:
            price = prices.target(fed)
        if price:
            worst = max(worst, med / price)
    return worst


def flagged(trace: Trace | None) -> bool:
    """Whether a race's timings were found unreliable (an old recording, never judged, is not flagged)."""
    return trace is not None and trace.timing is not None and not trace.timing.reliable


def trusted_speedup(spec: Trace, measured: float | None) -> float | None:
    """The speedup a race may be quoted and judged by: its wall-clock ``measured`` figure, or, when its
    timings were flagged, the count-based one (None when it has none: its clocks are never used).
    The headline (views.race), the status line (ui.live) and the challenges share this rule."""
    return spec.timing.predicted if flagged(spec) else measured


__all__ = ["BUSY_SLOWDOWN", "DISAGREE", "MIN_GROUP", "MIN_JUDGED_S", "Pass", "Prices", "SPREAD_MAX", "STARTING", "V_MIN",
           "assess_race", "count_based_speedup", "event_costs", "excess", "flagged", "medians", "passes", "starting",
           "trusted_speedup"]
