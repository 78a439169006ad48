"""The Sweeps tab's drafter shoot-out and the recorded sweeps shown when the page opens.

`shootout` runs `specviz.experiments.shootout` on the loaded pair with the Live tab's form (through the live
gate, like the other sweeps; Stop cancels it) and keeps each run's traces in the page's store, so
`show_run` can put any of them on the Live tab (step mode, export).  `recorded_frame` draws
`assets/sweeps.json` without a model.
"""

from __future__ import annotations

import dataclasses
import functools
import html
import logging
from pathlib import Path
from typing import Any, Callable, Iterator

import gradio as gr

from ..experiments import recorded, shootout as SO
from ..serving.replay import GATE
from ..serving.sweep_budget import sweep_budget, time_limit_note
from ..views import shootout as SV
from ..views import sweep_plots as SP
from ..views import theory_plots as TP
from ..views import tree_plots as TRP
from ..views._fmt import ranges_text
from .form import RunForm
from .frames import LiveFrame, SweepFrame
from .live import final_frame, status_html
from .store import STORE, StoreFull
from .tabs import enter_gate, sweep_frame, under_gate

log = logging.getLogger("specviz.app")
POLICY_NOTE = (f"The draft model runs under the **{SO.CHAIN_POLICY}** policy (τ from the Live tab); prompt lookup "
               "and the learned head under the constant policy (drafting them costs next to nothing), the tree with "
               f"its default settings under the **{SO.TREE_POLICY}** policy (γ its greatest depth). All exact "
               "(ε = 0, Decoding-OPT).")
NO_RUNS = "run a shoot-out to step through its runs"


def _pick(runs: dict[str, Any]) -> Any:
    labels = list(runs)
    return gr.Dropdown(choices=labels, value=labels[0] if labels else None, interactive=bool(labels),
                       info="put this run (and the standard run) on the Live tab: step through it, export it"
                       if labels else NO_RUNS)


def shootout(form: RunForm, progress: Callable[..., Any] | None = None) -> Iterator[SweepFrame]:
    """Every drafter in turn on the Live tab's prompt and settings, then standard decoding."""
    report = (lambda f, m: progress(f, desc=m)) if progress else None
    req = yield from enter_gate(form, report, "shoot-out")
    where = f"{req.pair.draft_name} → {req.pair.target_name} on {req.pair.device}"
    rows: list[SO.Row] = []
    budget = sweep_budget(gate=GATE)  # from here: the time spent waiting at the gate is not the shoot-out's

    def frames() -> Iterator[SweepFrame]:
        nonlocal rows
        for frac, msg, rows in SO.run(req, should_stop=budget, repeats=SO.REPEATS):  # a run cut short is dropped
            if report:
                report(frac, msg)
            dicts = SV.rows_of(rows)
            yield SweepFrame(status=f"Drafter shoot-out: {msg}", shootout_table=SV.table_html(dicts, f"Shoot-out: {where}"),
                             shootout_plot=SV.chart(dicts, where))

    yield from under_gate(frames(), "shoot-out")
    std = next((r.trace for r in rows if r.key == SO.STANDARD and r.trace is not None), None)
    # The traces go to the page's bounded store; the page keeps only handles.
    # Each row's trace is its median repeat's, with the standard run of that repeat's round as its partner.
    runs = {r.label: STORE.put(r.trace, r.baseline or std, run=True) for r in rows if r.trace is not None and r.key != SO.STANDARD}
    ran = sum(1 for r in rows if not r.error)
    pick = " Pick a run below to step through it on the Live tab." if runs else ""
    if budget.ran_out:
        log.info("shoot-out stopped at its time limit (%g s) after %d rows", budget.seconds, len(rows))
        yield SweepFrame(status=f"Drafter shoot-out on {where}: {time_limit_note(budget, len(rows))}{pick}",
                         shootout_runs=runs, shootout_pick=_pick(runs))  # the table already shows the finished rows
        return
    reps = max((r.repeats or 0 for r in rows), default=0)
    each = f" (median of {reps} repeats each, run round-robin with standard decoding)" if reps > 1 else ""
    yield SweepFrame(status=f"Drafter shoot-out done: {ran} of {len(rows)} ran on {where}{each}.{pick}",
                     shootout_runs=runs, shootout_pick=_pick(runs))


def show_run(runs: Any, label: Any) -> LiveFrame:
    """One of the shoot-out's runs on the Live tab, with the standard run as its race partner."""
    shown = (runs or {}).get(label) if isinstance(runs, dict) else None
    spec, std = (shown.get("spec"), shown.get("std")) if shown else (None, None)
    if spec is None:
        msg = "That shoot-out run is no longer kept on the server; run the shoot-out again." if shown is not None \
            else f"No shoot-out run to show: {NO_RUNS}."
        return LiveFrame(status=status_html(msg, "warn"))
    return final_frame(spec, std, status_html(f"Shoot-out run: {label} ({spec.n_tokens} tokens).", "ok"))


@functools.cache
def recorded_page_frame() -> SweepFrame:
    """What the Sweeps tab shows when a page loads: the shipped recording and an empty tree-sweep chart, drawn
    once per process (the first page load) and reused: the figures are only read after."""
    return dataclasses.replace(recorded_frame(), tree_plot=TRP.tree_sweep_plot(None))


def recorded_frame(path: str | Path = recorded.DEFAULT_PATH) -> SweepFrame:
    """The shipped recording of a γ sweep, an ε sweep and a shoot-out, every figure marked as recorded;
    a missing or broken file gives a message on the status line and empty figures.  The page builds
    it inside its layout, so it creates no components (the runs' dropdown keeps its initial state)."""
    try:
        rec = recorded.load(path)
    except recorded.RecordedError as exc:
        return SweepFrame(status=f"*No recorded sweeps to show ({Path(path).name}: {exc}). A sweep takes several "
                                 "minutes on a CPU; lower max new tokens on the Live tab to go faster.*",
                          gamma_plot=SP.gamma_sweep_plot(None), eps_plot=SP.epsilon_sweep_plot(None),
                          pareto=TP.pareto_plot(None, None), shootout_table=SV.table_html(None), shootout_plot=SV.chart(None))
    when = rec.when()
    s = rec.settings
    what = (f"{rec.models.get('draft', '?')} → {rec.models.get('target', '?')}, prompt “{rec.prompt[:60]}"
            f"{'…' if len(rec.prompt) > 60 else ''}”, {s.get('max_new_tokens')} new tokens, "
            f"{'greedy' if not s.get('temperature') else 'T = ' + str(s.get('temperature'))}")
    load = f" (load average {rec.load_average[0]:g})" if rec.load_average else ""
    if rec.repeats and rec.repeats > 1:
        load += (f" · every point the median of {rec.repeats} repeats run round-robin with standard decoding "
                 "(error bars and brackets: min–max)")
    gammas = [r.gamma for r in rec.gamma if r.gamma > 0]  # 0: the standard baseline
    what += f"; γ sweep at γ = {ranges_text(gammas)}" if gammas else "; no γ sweep recorded"
    shootout_what = what  # the shoot-out chart's subtitle: its own prompt and settings, not the ε sweep's
    if rec.epsilon_prompt or rec.epsilon_settings:  # the ε sweep ran on a sampled prompt of its own
        es, ep = rec.epsilon_settings or s, rec.epsilon_prompt or rec.prompt
        what += (f"; ε sweep on “{ep[:50]}{'…' if len(ep) > 50 else ''}”, "
                 f"{'greedy' if not es.get('temperature') else 'T = ' + str(es.get('temperature'))}, "
                 f"γ = {es.get('gamma')}, {es.get('max_new_tokens')} new tokens")
    if any(r.gamma > 0 for r in rec.gamma) and not any(r.v for r in rec.gamma):
        # Recorded before sweeps warmed up (specviz.experiments.sweeps.warm_up) and measured the verify factor.
        load += (" · this γ sweep timed its standard baseline cold, first thing after loading (compare the "
                 "shoot-out's standard tok/s), so its speedups read high, and its theory is the textbook one")
    g = sweep_frame("gamma", [r.model_dump() for r in rec.gamma], "")
    e = sweep_frame("epsilon", [r.model_dump() for r in rec.epsilon], "")
    rows = SV.rows_of(rec.shootout)
    for fig in (g.gamma_plot, e.eps_plot, e.pareto):
        SV.mark_recorded(fig, when)
    return SweepFrame(
        status=f"**Showing results {html.escape(when)}**{load}: {html.escape(what)}. A sweep or shoot-out you run "
               "replaces them.",
        gamma_plot=g.gamma_plot, eps_plot=e.eps_plot, pareto=e.pareto,
        shootout_table=SV.table_html(rows, f"Shoot-out {when}"),
        shootout_plot=SV.mark_recorded(SV.chart(rows, shootout_what), when))
