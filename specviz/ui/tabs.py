"""The Theory and Sweeps tabs' handlers, and the drafting controls' reactions."""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Iterator

import gradio as gr

from ..core.settings import GAMMA_MAX, GAMMA_MAX_DYNAMIC, SettingsError, parse_integer, parse_number
from ..experiments import sweeps
from ..experiments.repeats import PAGE_SWEEP_REPEATS, REPEATS
from ..experiments.shootout import cost_ratio
from ..models import ModelError, warm
from ..serving.jobs import request_at_gate
from ..serving.replay import GATE, Busy
from ..serving.service import InputError, describe_error
from ..serving.sweep_budget import sweep_budget, time_limit_note, within
from ..theory.figures import RunFigures, best_gamma, run_figures, theory_point
from ..theory.formulas import arithmetic_cost_factor, expected_speedup, expected_tokens_per_round
from ..theory.simulate import synthetic_pair
from ..views.rules import run_rule_expectations
from ..views import html as V
from ..views import sweep_plots as SP
from ..views import theory_plots as TP
from ..views import tree_plots as TRP
from ..views._fmt import mean_draft_length, ranges_text
from .form import POLICY_HELP, RunForm
from .frames import SweepFrame, TheoryFrame

log = logging.getLogger("specviz.app")
THEORY_GAMMA_MAX = 16  # the theory curves' γ axis, longer when a run drafted more on average
BATCH_SEED_MAX = 2**32 - 1  # numpy/torch seeds of the batch simulation


# ---- drafting controls ------------------------------------------------------------------------


def gamma_slider(policy: Any, gamma: Any) -> dict[str, Any]:
    """γ is the draft length of the constant policy and the maximum for the dynamic ones."""
    fixed = policy == "constant"
    top = GAMMA_MAX if fixed else GAMMA_MAX_DYNAMIC
    try:
        value = min(max(int(gamma), 1), top)
    except (TypeError, ValueError, OverflowError):  # NaN, ±inf or text from a forged event
        value = 5
    return dict(maximum=top, value=value, label="Draft length γ" if fixed else "Maximum draft length γ",
                info="tokens drafted per round" if fixed else "the policy stops drafting earlier when it decides to")


def policy_info(policy: Any) -> str:
    return POLICY_HELP.get(policy, "")


# ---- theory ---------------------------------------------------------------------------------


def run_c(spec: Any) -> float | None:
    """The run's cost ratio c (specviz.experiments.shootout.cost_ratio: draft forward ÷ target forward, or a
    lookup's drafting time per token ÷ target forward, which is what γ·c stands for in Thm 3.8)."""
    return cost_ratio(spec)


# ---- the theory inputs' gate: the same checks (and messages) as the run form's settings ---------

THEORY_RANGES = {  # name: (label, low, high, whole number); the sliders have the same bounds
    "alpha": ("α (acceptance rate)", 0.0, 0.99, False),
    "gamma": ("γ (draft length)", 1, THEORY_GAMMA_MAX, True),
    "c": ("c (draft/target time per pass)", 0.0, 1.0, False),
    "c_hat": ("ĉ (draft/target arithmetic)", 0.0, 1.0, False),
    "v": ("v (verify pass ÷ standard step)", 0.5, 8.0, False),
    "vocab": ("vocabulary size", 4, 64, True),
    "closeness": ("draft closeness to target", 0.0, 1.0, False),
    "m_max": ("max drafts M", 2, 32, True),
    "seed": ("seed", 0, BATCH_SEED_MAX, True),
}


# The sliders' steps (app.py builds the sliders with them); the note prints each value with as many
# decimals as its step has, so it reads what the slider shows (c = 0.175, not 0.17).
THEORY_STEPS = {"alpha": 0.01, "c": 0.005, "c_hat": 0.01, "v": 0.05}


def step_decimals(name: str) -> int:
    """Decimals of a Theory slider's step: 0.005 -> 3, 0.01 -> 2, 0.05 -> 2."""
    text = f"{THEORY_STEPS[name]:g}"
    return len(text.split(".")[1]) if "." in text else 0


def slider_text(name: str, value: float) -> str:
    """A Theory slider's value as the slider shows it (its step's decimals)."""
    return f"{value:.{step_decimals(name)}f}"


def theory_inputs(**raw: Any) -> dict[str, Any]:
    """The Theory tab's inputs, checked like the run form's settings (InputError with a clear message)."""
    out: dict[str, Any] = {}
    for name, value in raw.items():
        label, lo, hi, whole = THEORY_RANGES[name]
        try:
            if whole:
                out[name] = parse_integer(label, value, lo, hi)
            else:
                x = parse_number(label, value)
                if not lo <= x <= hi:
                    raise SettingsError(f"{label} must be between {lo:g} and {hi:g}, not {x:g}")
                out[name] = x
        except SettingsError as exc:
            raise InputError(str(exc)) from None
    return out


def theory_views(alpha: Any, gamma: Any, c: Any, c_hat: Any, state: Any, v: Any = 1.0) -> TheoryFrame:
    """The Theory tab from its sliders (v: a verify pass's cost in standard steps; 1 is the textbook)."""
    try:
        x = theory_inputs(alpha=alpha, gamma=gamma, c=c, c_hat=c_hat, v=v)
    except InputError as exc:
        raise gr.Error(str(exc), print_exception=False)
    spec, std = (state or {}).get("spec"), (state or {}).get("std")
    fig = last_run_figures(state)
    measured = None
    if fig is not None:
        # α, c, v and the speedup as every panel quotes them (specviz.theory.figures): a flagged race's are
        # the probe's v and c and its count-based speedup
        measured = {"alpha": fig.alpha, "c": fig.c if fig.c is not None else run_c(spec), "v": fig.v,
                    "gamma": spec.gamma, "speedup": fig.speedup, "draft_len": mean_draft_length(spec),
                    "by": fig.speedup_by}
        if measured["c"] is None or measured["alpha"] is None:
            measured = None
    alpha, c, c_hat, g, vv = x["alpha"], x["c"], x["c_hat"], x["gamma"], x["v"]
    g_opt, sp_opt = best_gamma(alpha, c, vv)
    why = ""
    if sp_opt <= 1:
        why = (" — speculation does not pay here: the verify pass costs too much (v)" if best_gamma(alpha, c)[1] > 1
               else " — speculation does not pay here: the draft is too slow (c) for this acceptance rate (α)")
    verify = f", v = {slider_text('v', vv)}" if vv != 1 else ""
    note = (f"Optimal γ for α = {slider_text('alpha', alpha)}, c = {slider_text('c', c)}{verify}: **γ\\* = {g_opt}**, "
            f"expected speedup **{sp_opt:.2f}×**"
            + why
            + f"  \nAt γ = {g}: {expected_tokens_per_round(alpha, g):.2f} tokens per target pass, expected "
              f"speedup {expected_speedup(alpha, g, c, vv):.2f}×"
            + (f" (textbook, a verify pass = 1 step: {expected_speedup(alpha, g, c):.2f}×)" if vv != 1 else "")
            + f", {arithmetic_cost_factor(alpha, g, c_hat):.2f}× the arithmetic of standard decoding.")
    g_axis = THEORY_GAMMA_MAX
    if measured:
        note += "  \n" + last_run_line(fig, spec, measured["c"])
        g_axis = max(g_axis, math.ceil(measured["draft_len"] or 0), int(measured["gamma"]))
    return TheoryFrame(note=note, speedup=TP.speedup_curves(alpha, c, g_axis, measured, v=vv),
                       tokens=TP.tokens_per_round_curves(alpha, THEORY_GAMMA_MAX, run_rule_expectations(spec)),
                       cost=TP.cost_factor_curve(alpha, c_hat, THEORY_GAMMA_MAX), thm1=TP.theorem1_plot(spec))


def last_run_figures(state: Any) -> RunFigures | None:
    """The figures of the page's last race (specviz.theory.figures), None without a race (no standard run)."""
    spec, std = (state or {}).get("spec"), (state or {}).get("std")
    if not spec or not std or spec.kind != "speculative" or not spec.rounds:
        return None
    return run_figures(spec, std)


def last_run_line(fig: RunFigures, spec: Any, c: float) -> str:
    """The Theory note's line on the last run: its α, c, v, speedup and best γ, as every panel quotes them."""
    dl = mean_draft_length(spec)
    probed = " (this machine's probed cost: the race's clocks were flagged)" if fig.v_source == "probed" else ""
    verify = f", a verify pass = {fig.v_text()} standard steps{probed}" if fig.v is not None else ""
    if fig.speedup is None:
        speed = ("no speedup: stopped before the end" if fig.cut else
                 "no speedup to quote: its clocks were flagged and it has no count-based figure")
    elif fig.speedup_by == "counts":
        speed = (f"count-based speedup {fig.speedup_text()} (the marker, at the mean draft length; the wall clock, "
                 "disturbed, is not quoted)")
    else:
        speed = (f"measured speedup {fig.speedup_text()} (the marker, at the mean draft length; it includes the prompt "
                 "pass, which Thm 3.8 does not model)")
    best = fig.best if fig.c is not None else best_gamma(theory_point("alpha", fig.alpha), theory_point("c", c))
    tail = (f" Best γ under these costs: γ\\* = {best[0]} ({best[1]:.2f}×)." if best is not None and fig.v is not None
            else "")
    return (f"Last run: α = {fig.alpha:.2f}, c = {c:.3f}{verify}, γ = {spec.gamma} ({spec.settings.policy} policy), "
            f"mean draft length {dl or 0:.2f}, {speed}.{tail}")


def use_last_run(state: Any) -> tuple[Any, Any, Any, Any]:
    """(α, γ, c, v) sliders of the Theory tab moved to the last run's figures (specviz.theory.figures): c and v
    per standard step when the run raced a standard run (the probe's for a flagged race, as every panel quotes
    them), else c per verify pass and v left where it is."""
    spec = (state or {}).get("spec")
    s = spec.summary() if spec else None
    fig = last_run_figures(state)
    c = fig.c if fig is not None and fig.c is not None else run_c(spec)
    if s is None or s.alpha is None or c is None:
        return gr.skip(), gr.skip(), gr.skip(), gr.skip()
    g = min(spec.gamma, THEORY_GAMMA_MAX)
    # each slider's value clamped and rounded as the note prints it, as the run's best γ is taken (theory_point)
    v = theory_point("v", fig.v) if fig is not None and fig.v is not None else gr.skip()
    return theory_point("alpha", s.alpha), g, theory_point("c", c), v


def batch_view(vocab: Any, closeness: Any, m_max: Any, seed: Any, tree_runs: Any = None):
    try:
        v = theory_inputs(vocab=vocab, closeness=closeness, m_max=m_max, seed=seed)
    except InputError as exc:
        raise gr.Error(str(exc), print_exception=False)
    vocab, closeness, m_max, seed = v["vocab"], v["closeness"], v["m_max"], v["seed"]
    # Top-k on both models leaves target tokens the draft can never propose, which is
    # what puts a floor under the rejections as M grows (Yin et al., batch SD).
    p, q = synthetic_pair(int(vocab), seed=int(seed), closeness=float(closeness), top_k=max(2, int(vocab) // 2))
    # tree_runs: the session's last i.i.d. tree runs (specviz.ui.tree_ui.remember_batch), drawn beside the formula.
    return TRP.add_batch_points(TP.batch_plot(p, q, int(m_max), 20_000, int(seed)), tree_runs)


# ---- sweeps ---------------------------------------------------------------------------------

# The Sweeps tab's introduction: the γ and ε values a sweep runs, from the sweeps' own lists.
SWEEPS_INTRO = ("Run the prompt and settings of the **Live** tab (drafter and draft-length policy included) many "
                f"times on the loaded models. The γ sweep runs γ = {ranges_text(sweeps.GAMMAS)} and standard "
                "decoding; the ε sweep ε ∈ {" + ", ".join(f"{e:g}" for e in sweeps.EPSILONS) + "}, "
                "Decoding-OPT and UNO. Drafter shoot-out: every drafter in turn, then standard decoding. "
                f"Each sweep runs {PAGE_SWEEP_REPEATS} rounds and the shoot-out {REPEATS}: standard decoding, then every "
                "configuration once, then all again (so background load hits them all alike); a point is the "
                "median of its rounds, each divided by its own round's standard run, with min–max error bars.")


WARM_WAIT_S = 180.0  # at most this long for a fresh server's packing before a sweep (it then runs anyway)


def enter_gate(form: RunForm, report: Callable[..., Any] | None, what: str) -> Iterator[SweepFrame]:
    """Check the form and wait at the live gate (live runs go first: a sweep waits behind them, and gives
    them the gate between its points), showing the queue; returns the request.
    `req = yield from enter_gate(...)`; pair it with `under_gate`."""
    if warm.preparing_any():  # just started: a sweep measures the fast kernels, not the stopgap ones
        yield SweepFrame(status=f"*The server has just started: the {what} begins once the models' fast kernels "
                                "are in place (under a minute)…*")
        warm.wait_all(timeout=WARM_WAIT_S)
    try:
        waits = request_at_gate(form.check(), report, priority="sweep")  # a pair other than the default loads inside
        while True:
            try:
                ahead = next(waits)
            except StopIteration as done:
                req = done.value
                break
            yield SweepFrame(status=f"*Waiting for the models: {ahead} run(s) waiting…*")
    except (InputError, ModelError, Busy) as exc:
        yield SweepFrame(status=f"**The {what} did not start:** {exc}")
        raise gr.Error(str(exc), print_exception=False)
    return req


def under_gate(frames: Iterator[SweepFrame], what: str) -> Iterator[SweepFrame]:
    """Relay a sweep's frames while it holds the gate: a failure is shown and raised, the gate is left
    whatever happens (finished, failed or cancelled)."""
    try:
        yield from frames
    except Exception as exc:
        log.exception("%s failed", what)
        yield SweepFrame(status=f"**The {what} failed:** {describe_error(exc)}")
        raise gr.Error(describe_error(exc), print_exception=False)
    finally:
        GATE.leave()


def sweep(kind: str, form: RunForm, progress: Callable[..., Any] | None = None) -> Iterator[SweepFrame]:
    """γ sweep or ε sweep on the loaded models with the Live tab's form (drafter and policy
    included), with progress; Stop cancels."""
    report = (lambda f, m: progress(f, desc=m)) if progress else None
    if kind == "epsilon" and form.drafter == "tree":  # every point but ε = 0 OPT would be refused mid-sweep
        msg = ("the ε sweep varies ε and Decoding-UNO, which apply to chain drafters only: pick the draft model "
               "or prompt lookup on the Live tab (the γ sweep works with the tree drafter: γ is its depth).")
        yield SweepFrame(status=f"**The sweep did not start:** {msg}")
        raise gr.Error(msg, print_exception=False)
    req = yield from enter_gate(form, report, "sweep")
    results: list[dict] = []
    budget = sweep_budget(gate=GATE)  # from here: the time spent waiting at the gate is not the sweep's
    gen = (sweeps.gamma_sweep if kind == "gamma" else sweeps.epsilon_sweep)(req, should_stop=budget,
                                                                            repeats=PAGE_SWEEP_REPEATS)
    what = f"drafter {req.settings.drafter}, {req.settings.policy} policy"

    def frames() -> Iterator[SweepFrame]:
        for frac, msg, res in gen:  # its decodes stop (and the sweep with them) when the budget is spent
            if report:
                report(frac, msg)
            if res is not None:  # the points so far, each with the repeats it has
                results[:] = res
            yield sweep_frame(kind, results, f"{msg} ({what})")
        if budget.ran_out:
            points = sum(r.get("gamma", 1) > 0 for r in results)  # the γ sweep's baseline is not a point
            log.info("%s sweep stopped at its time limit (%g s) after %d points", kind, budget.seconds, points)
            yield sweep_frame(kind, results, f"{time_limit_note(budget, points)}{repeats_done(results)} ({what})")

    yield from under_gate(frames(), "sweep")


def repeats_done(results: list[dict]) -> str:
    """After a sweep cut short: how many of its rounds the points have ("" after the first round)."""
    ns = [r.get("repeats") or 1 for r in results]
    if not ns or max(ns) <= 1:
        return ""
    n = f"{max(ns)}" if min(ns) == max(ns) else f"{min(ns)}–{max(ns)}"
    return f" Its points have {n} of {PAGE_SWEEP_REPEATS} repeats."


def sweep_frame(kind: str, results: list[dict], msg: str) -> SweepFrame:
    if kind == "gamma":
        runs = [r for r in results if r["gamma"] > 0]
        alphas = [r["alpha"] for r in runs if r["alpha"] is not None]
        alpha = sum(alphas) / len(alphas) if alphas else None
        cs = [r["c"] for r in runs if r.get("c") is not None]
        c = sum(cs) / len(cs) if cs else None
        at = f" · measured at γ = {ranges_text(r['gamma'] for r in runs)}" if runs else ""  # as the data has them
        return SweepFrame(status=f"γ sweep: {msg}{at}", gamma_plot=SP.gamma_sweep_plot(runs, alpha, c))
    opt = [r for r in results if r["variant"] == "opt"]
    tvs = [r["mean_tv"] for r in opt if r.get("mean_tv") is not None]
    points = [{"label": f"ε={r['epsilon']:g}", "epsilon": r["epsilon"], "variant": r["variant"],
               "reject_prob": r["reject_prob"], "bias": r["mean_bias"], "tv": r.get("mean_tv")}
              for r in results if r.get("reject_prob") is not None]
    tv = sum(tvs) / len(tvs) if tvs else None
    return SweepFrame(status=f"ε sweep: {msg}", eps_plot=SP.epsilon_sweep_plot(opt), pareto=TP.pareto_plot(tv, points))


def tree_sweep(form: RunForm, progress: Callable[..., Any] | None = None) -> Iterator[SweepFrame]:
    """The target's verify time against the number of tree nodes (sweeps.TREE_SIZES) on the
    loaded pair and the Live tab's prompt, one size at a time so the plot and progress move."""
    report = (lambda f, m: progress(f, desc=m)) if progress else None
    req = yield from enter_gate(form, report, "measurement")
    rows: list[dict] = []
    sizes = sweeps.TREE_SIZES
    budget = sweep_budget(gate=GATE)

    def frames() -> Iterator[SweepFrame]:
        nonlocal rows
        for k, n in enumerate(within(sizes, budget)):
            msg = f"verify time vs tree nodes: {n} nodes ({k + 1}/{len(sizes)})"
            if report:
                report(k / len(sizes), msg)
            yield SweepFrame(status=msg)
            rows += sweeps.tree_verify_times(req.pair, req.prompt_ids, sizes=(n,))
            yield SweepFrame(tree_plot=TRP.tree_sweep_plot(rows))

    yield from under_gate(frames(), "measurement")
    if budget.ran_out:
        yield SweepFrame(status=f"Verify time vs tree nodes: {time_limit_note(budget, len(rows))}")
        return
    yield SweepFrame(status=f"Verify time vs tree nodes: {len(rows)} sizes measured on the loaded target "
                            "(median of 3 passes each).")
