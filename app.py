"""specviz: watch speculative decoding happen, round by round, with real models.

Thin Gradio UI: layout and events.  Decoding lives in specviz.engine, input
checks in specviz.service, drawing in specviz.views.
"""

from __future__ import annotations

import contextlib
import copy
import html
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Iterator

import gradio as gr

from specviz import hosting, sweeps
from specviz.models import PRESETS, ModelError
from specviz.service import (CUSTOM_PRESET, MODEL_LOCK, InputError, check_request, default_preset,
                             describe_error, get_pair, prepare, race, ui_presets)
from specviz.settings import GAMMA_MAX, MAX_NEW_TOKENS_MAX
from specviz.theory import (arithmetic_cost_factor, expected_speedup,
                            expected_tokens_per_round, optimal_gamma, synthetic_pair)
from specviz.trace import MAX_TRACE_BYTES, Trace, TraceError, load_recording, recording_to_json, save_recording
from specviz.views import html as V
from specviz.views import plots as P
from specviz.views import theory_plots as TP

log = logging.getLogger("specviz.app")
ROOT = Path(__file__).resolve().parent
ASSETS = ROOT / "assets"
EXAMPLES = json.loads((ASSETS / "examples.json").read_text(encoding="utf-8"))
RECORDINGS = sorted((ASSETS / "traces").glob("*.json"))
UI_THROTTLE_S = 0.06  # at most ~16 UI updates a second while decoding
QUEUE_SIZE = max(1, int(os.environ.get("SPECVIZ_QUEUE_SIZE") or 16))  # jobs waiting; more get "queue full"
VARIANTS = {"Decoding-OPT (residual)": "opt", "Decoding-UNO (sample from p)": "uno"}

HOW_IT_WORKS = """
### How speculative decoding works
A big **target** model normally produces one token per forward pass. Speculative decoding adds a small, fast **draft** model:

1. **Draft** — the draft model proposes γ tokens x<sub>1</sub>…x<sub>γ</sub>, one after another, each sampled from its distribution q.
2. **Verify** — the target scores the prompt plus all γ drafts in **one** forward pass, giving its distributions p<sub>1</sub>…p<sub>γ+1</sub>. On a memory-bound machine this costs about as much as producing one token.
3. **Accept or reject** — draft i is accepted with probability b = min(1, (p(x) + ε) / q(x)): always when the target likes the token at least as much as the draft did. A uniform draw u decides; the first rejection ends the round.
4. **Correct or bonus** — at a rejection, a **correction** token is sampled from the residual norm(max(0, p − q)); if all γ were accepted, a **bonus** token is sampled from p<sub>γ+1</sub>. Every round emits at least one token.

With ε = 0 the text has *exactly* the target's distribution (greedy: exactly the target's greedy text). ε > 0 (Yin et al.) accepts more drafts at the price of a measured bias; Decoding-UNO samples from p after a rejection instead of the residual, for comparison.

Notation: p = target, q = draft, as in Leviathan et al.; Chen et al. and Yin et al. swap the two letters.

**References.** Leviathan, Kalman, Matias, *Fast Inference from Transformers via Speculative Decoding* (ICML 2023) ·
Chen et al., *Accelerating Large Language Model Decoding with Speculative Sampling* (2023) ·
Yin et al., *A Theoretical Perspective for Speculative Decoding Algorithm* (NeurIPS 2024) ·
Wertheimer et al., *Accelerating Production LLMs with Combined Token/Embedding Speculators* (IBM, 2024).
"""


def _status(text: str, kind: str = "info") -> str:
    return f'<div class="sv-status sv-status-{kind}" data-kind="{kind}">{html.escape(text)}</div>'


def _gamma_of(tr: Trace | None) -> int:
    return tr.gamma if tr else 0


def _final_views(spec: Trace | None, std: Trace | None):
    """Everything drawn from a finished race: metrics, plots and the step slider."""
    summary = spec.summary() if spec else (std.summary() if std else None)
    n = len(spec.rounds) if spec else 0
    return (
        V.metrics_html(summary, gamma=_gamma_of(spec)),
        P.acceptance_by_position(spec),
        P.tokens_per_round_hist(spec),
        P.round_times(spec),
        P.tokens_vs_time(spec, std),
        P.speedup_bars(spec, std),
        gr.Slider(minimum=1, maximum=max(n, 2), value=1, step=1, interactive=n > 0,
                  label=f"Round (1–{n})" if n else "Round"),
        *step_views(spec, 1),
    )


def step_views(spec: Trace | None, idx) -> tuple[str, str]:
    """Step mode: one recorded round and its narration."""
    if not spec or not spec.rounds:
        return "<p class='sv-muted'>Run or load a trace to step through its rounds.</p>", ""
    i = min(max(int(idx or 1), 1), len(spec.rounds)) - 1
    rnd = spec.rounds[i]
    eps = spec.settings.epsilon
    return V.narrate_html(rnd, spec), V.round_html(rnd, spec.gamma, epsilon=eps, current=True) + V.text_html(
        [t for r in spec.rounds[: i + 1] for t in r.emitted])


def _export_file(spec: Trace | None, std: Trace | None) -> str | None:
    if not spec and not std:
        return None
    return save_recording(spec, std)


# ---- the run ----------------------------------------------------------------------------


def ui_request(preset, draft_id, target_id, prompt, gamma, epsilon, temperature, top_p, max_new_tokens, seed,
               variant, progress):
    """Load the pair (with progress on the page) and validate the form: what Run and the sweeps share."""
    pair = get_pair(preset, draft_id, target_id, progress=lambda f, m: progress(f, desc=m))
    return prepare(pair, prompt, gamma=gamma, epsilon=epsilon, temperature=temperature, top_p=top_p,
                   max_new_tokens=max_new_tokens, seed=seed, variant=VARIANTS.get(variant, variant))


@hosting.gpu(duration=hosting.run_duration)
def run(preset, draft_id, target_id, prompt, gamma, epsilon, temperature, top_p, max_new_tokens, seed, variant,
        request: gr.Request = None, progress=gr.Progress()):
    """Speculative then standard decoding, streamed to the page round by round."""
    session = getattr(request, "session_hash", None)
    blank = gr.skip()
    n_out = 14

    def out(status=blank, rounds=blank, race_=blank, state=blank, rest=None):
        rest = rest or (blank,) * (n_out - 4)
        return (status, rounds, race_, state, *rest)

    try:
        yield out(status=_status("Loading models…"))
        req = ui_request(preset, draft_id, target_id, prompt, gamma, epsilon, temperature, top_p, max_new_tokens,
                         seed, variant, progress)
    except (InputError, ModelError) as exc:
        yield out(status=_status(str(exc), "error"))
        raise gr.Error(str(exc), print_exception=False)

    last = 0.0
    spec = std = None
    try:
        with MODEL_LOCK:
            for up in race(req):
                spec, std = up.spec, up.std
                ev = up.event
                _live_put(session, spec, std, ev)
                now = time.perf_counter()
                final = up.phase == "done" or (ev and ev.kind == "done")
                if not final and now - last < UI_THROTTLE_S:
                    continue
                last = now
                if up.phase == "speculative":
                    pending = ev.round if ev.kind == "draft" else None
                    n = len(spec.rounds)
                    msg = f"Speculative decoding · round {n + (1 if pending else 0)} · {spec.n_tokens} tokens"
                    yield out(_status(msg), V.rounds_html(spec, pending_round=pending),
                              V.race_html(spec, None, spec_running=ev.kind != "done"))
                elif up.phase == "standard":
                    msg = f"Standard decoding (the baseline) · {std.n_tokens} tokens"
                    yield out(_status(msg), blank, V.race_html(spec, std, std_running=ev.kind != "done"))
    except Exception as exc:  # out of memory, a broken model…: end this run cleanly
        log.exception("run failed")
        _live_pop(session)
        yield out(status=_status(describe_error(exc), "error"))
        raise gr.Error(describe_error(exc), print_exception=False)

    _live_pop(session)
    state = {"spec": spec, "std": std}
    summ = spec.summary() if spec else {}
    sp = V.race_speedup(spec, std)
    msg = f"Done: {spec.n_tokens} tokens in {len(spec.rounds)} rounds, α = {summ.get('alpha') or 0:.2f}"
    if sp:
        msg += f", speedup {sp:.2f}× over standard decoding"
    yield out(_status(msg, "ok"), V.rounds_html(spec), V.race_html(spec, std), state,
              (*_final_views(spec, std), _export_file(spec, std)))


# ---- Stop ---------------------------------------------------------------------------------
# Stop cancels the run's event, which ends its generator at once: the run cannot draw its own last
# frame.  So the run leaves its traces so far here (per browser session), and Stop draws them.

_LIVE: OrderedDict[str, tuple] = OrderedDict()  # session -> (spec, std, side still running or None)
_LIVE_LOCK = threading.Lock()
_LIVE_MAX = 64  # sessions; a stopped run's entry is removed by Stop, a finished one by the run


def _live_put(session: str | None, spec, std, ev) -> None:
    if not session:
        return
    side = None if ev is None or ev.kind == "done" else ("std" if std is not None else "spec")
    with _LIVE_LOCK:
        _LIVE[session] = (spec, std, side)
        _LIVE.move_to_end(session)
        while len(_LIVE) > _LIVE_MAX:
            _LIVE.popitem(last=False)


def _live_pop(session: str | None):
    if not session:
        return None
    with _LIVE_LOCK:
        return _LIVE.pop(session, None)


def _as_stopped(tr: Trace | None) -> Trace | None:
    """A copy of a trace cut short by Stop, drawn as finished ('stopped') at its last whole round."""
    if tr is None:
        return None
    tr = copy.copy(tr)
    tr.rounds = list(tr.rounds)
    tr.stop_reason = "stopped"
    if tr.rounds:
        tr.t_total = tr.rounds[-1].t_end
    return tr


def stop_views(current: str | None, state, request: gr.Request = None):
    """Stop pressed: draw the run as far as it got (no round left "verifying…") and say it stopped."""
    skip = gr.skip()
    live = _live_pop(getattr(request, "session_hash", None))
    if live:
        spec, std, side = live
        spec, std = (_as_stopped(spec) if side == "spec" else spec), (_as_stopped(std) if side == "std" else std)
        msg = f"Stopped after {spec.n_tokens if spec else 0} speculative tokens"
        msg += f" and {std.n_tokens} standard tokens" if std else ""
        return (_status(msg + ". Press Run to start again.", "warn"),
                V.rounds_html(spec) if spec else skip, V.race_html(spec, std))
    if current and 'data-kind="info"' in current and "press Run" not in current:  # stopped while loading
        return _status("Stopped. Press Run to start again.", "warn"), skip, skip
    spec, std = (state or {}).get("spec"), (state or {}).get("std")
    if spec or std:  # the replay was stopped: show the finished race
        return skip, skip, V.race_html(spec, std)
    return skip, skip, skip


def replay(state):
    """Replay both runs in real time from their recorded timestamps."""
    spec, std = (state or {}).get("spec"), (state or {}).get("std")
    if not spec and not std:
        yield V.race_html(None, None)
        return
    end = max(t.t_total for t in (spec, std) if t)
    t0 = time.perf_counter()
    while True:
        t = time.perf_counter() - t0
        yield V.race_html(spec, std, at_time=min(t, end))
        if t >= end:
            return
        time.sleep(0.1)


def load_file(file):
    """Load an exported recording and show it as if it had just run."""
    if file is None:
        return (gr.skip(),) * 14
    try:
        path = Path(file if isinstance(file, str) else file.name)
        if path.stat().st_size > MAX_TRACE_BYTES:
            raise TraceError(f"file is too large ({path.stat().st_size:,} bytes; the limit is {MAX_TRACE_BYTES:,})")
        spec, std = load_recording(path.read_bytes())
    except (TraceError, OSError) as exc:
        msg = f"Could not load that file: {exc}"
        return (_status(msg, "error"),) + (gr.skip(),) * 13
    return show_recording(spec, std, f"Loaded {path.name}")


def show_recording(spec: Trace | None, std: Trace | None, label: str):
    state = {"spec": spec, "std": std}
    where = spec or std
    msg = f"{label}: {where.models.get('draft', '')} → {where.models.get('target', '')} on {where.device}"
    return (_status(msg, "ok"), V.rounds_html(spec), V.race_html(spec, std), state,
            *_final_views(spec, std), _export_file(spec, std))


def load_example_recording(name: str | None = None):
    if not RECORDINGS:
        return (gr.skip(),) * 14
    path = next((p for p in RECORDINGS if p.name == name), RECORDINGS[0])
    spec, std = load_recording(path.read_bytes())
    return show_recording(spec, std, f"Recorded example ({path.stem})")


# ---- theory and sweeps ---------------------------------------------------------------------


def theory_views(alpha, gamma, c, c_hat, state):
    spec, std = (state or {}).get("spec"), (state or {}).get("std")
    measured = None
    if spec and std:
        s = spec.summary()
        if s.get("alpha") is not None and s.get("c") is not None:
            measured = {"alpha": s["alpha"], "c": s["c"], "gamma": spec.gamma, "speedup": V.race_speedup(spec, std)}
    g_opt, sp_opt = optimal_gamma(float(alpha), float(c), 64)
    g = max(int(gamma or 1), 1)
    note = (f"Optimal γ for α = {alpha:.2f}, c = {c:.2f}: **γ\\* = {g_opt}**, expected speedup **{sp_opt:.2f}×**"
            + ("" if sp_opt > 1 else " — speculation does not pay here: the draft is too slow (c) for this acceptance rate (α).")
            + f"  \nAt γ = {g}: {expected_tokens_per_round(float(alpha), g):.2f} tokens per target pass, expected "
              f"speedup {expected_speedup(float(alpha), g, float(c)):.2f}×, "
              f"{arithmetic_cost_factor(float(alpha), g, float(c_hat)):.2f}× the arithmetic of standard decoding.")
    if measured:
        note += (f"  \nLast run: α = {measured['alpha']:.2f}, c = {measured['c']:.3f}, γ = {measured['gamma']}, "
                 f"measured speedup {measured['speedup'] or 0:.2f}× (the marker; it includes the prompt prefill, "
                 "which Thm 3.8 does not model).")
    return (note, TP.speedup_curves(float(alpha), float(c), 16, measured), TP.tokens_per_round_curves(float(alpha), 16),
            TP.cost_factor_curve(float(alpha), float(c_hat), 16), TP.theorem1_plot(spec))


def use_last_run(state):
    spec = (state or {}).get("spec")
    s = spec.summary() if spec else {}
    if s.get("alpha") is None or s.get("c") is None:
        return gr.skip(), gr.skip(), gr.skip()
    return round(min(max(s["alpha"], 0.0), 0.99), 2), spec.gamma, round(min(max(s["c"], 0.0), 1.0), 3)


def batch_view(vocab, closeness, m_max, seed):
    # Top-k on both models leaves target tokens the draft can never propose, which is
    # what puts a floor under the rejections as M grows (Yin et al., batch SD).
    p, q = synthetic_pair(int(vocab), seed=int(seed), closeness=float(closeness), top_k=max(2, int(vocab) // 2))
    return TP.batch_plot(p, q, int(m_max), 20_000, int(seed))


@hosting.gpu(duration=hosting.sweep_duration)
def sweep(kind, preset, draft_id, target_id, prompt, gamma, epsilon, temperature, top_p, max_new_tokens, seed, variant,
          progress=gr.Progress()):
    """γ sweep or ε sweep on the loaded models, with progress; Stop cancels."""
    try:
        req = ui_request(preset, draft_id, target_id, prompt, gamma, epsilon, temperature, top_p, max_new_tokens,
                         seed, variant, progress)
    except (InputError, ModelError) as exc:
        yield f"**The sweep did not start:** {exc}", gr.skip(), gr.skip()
        raise gr.Error(str(exc), print_exception=False)
    results = []
    gen = sweeps.gamma_sweep(req) if kind == "gamma" else sweeps.epsilon_sweep(req)
    try:
        with MODEL_LOCK:
            for frac, msg, res in gen:
                progress(frac, desc=msg)
                if res is not None:
                    results.append(res)
                yield _sweep_views(kind, results, msg)
    except Exception as exc:
        log.exception("sweep failed")
        yield f"**The sweep failed:** {describe_error(exc)}", gr.skip(), gr.skip()
        raise gr.Error(describe_error(exc), print_exception=False)


def gamma_sweep_ui(*args, progress=gr.Progress()):
    yield from sweep("gamma", *args, progress=progress)


def epsilon_sweep_ui(*args, progress=gr.Progress()):
    yield from sweep("epsilon", *args, progress=progress)


def recorded_prompt(state):
    tr = (state or {}).get("spec") or (state or {}).get("std")
    return tr.prompt if tr and tr.prompt else gr.skip()


def next_round(state, idx):
    spec = (state or {}).get("spec")
    return min(int(idx or 1) + 1, len(spec.rounds) if spec else 1)


def _sweep_views(kind, results, msg):
    if kind == "gamma":
        runs = [r for r in results if r["gamma"] > 0]
        alpha = sum(r["alpha"] for r in runs if r["alpha"] is not None) / len(runs) if runs else None
        cs = [r["c"] for r in runs if r.get("c") is not None]
        c = sum(cs) / len(cs) if cs else None
        return f"γ sweep: {msg}", TP.gamma_sweep_plot(runs, alpha, c), gr.skip()
    opt = [r for r in results if r["variant"] == "opt"]
    tvs = [r["mean_tv"] for r in opt if r.get("mean_tv") is not None]
    points = [{"label": f"ε={r['epsilon']:g}", "epsilon": r["epsilon"], "variant": r["variant"],
               "reject_prob": r["reject_prob"], "bias": r["mean_bias"]} for r in results if r.get("reject_prob") is not None]
    tv = sum(tvs) / len(tvs) if tvs else None
    return f"ε sweep: {msg}", TP.epsilon_sweep_plot(opt), TP.pareto_plot(tv, points)


# ---- layout ----------------------------------------------------------------------------------


def build() -> gr.Blocks:
    presets = ui_presets()
    with gr.Blocks(title="specviz: speculative decoding, explained live") as demo:
        state = gr.State({})
        gr.HTML('<div class="sv-header"><h1>specviz</h1><p>Speculative decoding, live: a small <b>draft</b> model '
                'guesses γ tokens, the big <b>target</b> model checks them all in one pass. Every round, every '
                'accept and reject, real models, real timings.</p></div>')
        with gr.Tabs():
            with gr.Tab("Live", id="live"):
                with gr.Row():
                    with gr.Column(scale=1, min_width=340, elem_id="sv-controls"):
                        preset = gr.Dropdown(presets, value=default_preset(), label="Model pair (draft → target)",
                                             info=PRESETS[default_preset()].description, elem_id="sv-preset")
                        with gr.Row(visible=False) as custom_row:
                            draft_id = gr.Textbox(label="Draft model", placeholder="org/name or local path")
                            target_id = gr.Textbox(label="Target model", placeholder="org/name or local path")
                        example = gr.Dropdown([e["label"] for e in EXAMPLES], value=EXAMPLES[0]["label"],
                                              label="Example prompts", info="fills in the prompt (and γ, temperature)",
                                              elem_id="sv-example")
                        prompt = gr.Textbox(EXAMPLES[0]["prompt"], label="Prompt", lines=4, max_lines=12,
                                            elem_id="sv-prompt")
                        gamma = gr.Slider(1, GAMMA_MAX, value=5, step=1, label="Draft length γ",
                                          info="tokens the draft proposes per round", elem_id="sv-gamma")
                        epsilon = gr.Slider(0, 1, value=0, step=0.01, label="Over-acceptance ε",
                                            info="0 = exact; accept with min(1, (p+ε)/q)", elem_id="sv-epsilon")
                        variant = gr.Radio(list(VARIANTS), value=list(VARIANTS)[0], label="After a rejection",
                                           elem_id="sv-variant")
                        with gr.Accordion("Sampling and length", open=False, elem_id="sv-sampling"):
                            temperature = gr.Slider(0, 2, value=0, step=0.05, label="Temperature",
                                                    info="0 = greedy (argmax)", elem_id="sv-temperature")
                            top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="Top-p", info="1 = off",
                                              elem_id="sv-top-p")
                            max_new = gr.Slider(4, MAX_NEW_TOKENS_MAX, value=48, step=4, label="Max new tokens",
                                                info="tokens to generate (fewer if the text ends)",
                                                elem_id="sv-max-new")
                            seed = gr.Number(0, label="Seed", precision=0, minimum=0, elem_id="sv-seed")
                        with gr.Row():
                            run_btn = gr.Button("Run", variant="primary", elem_id="sv-run")
                            stop_btn = gr.Button("Stop", variant="stop", elem_id="sv-stop")
                        status = gr.HTML(_status("Pick a prompt and press Run."), elem_id="sv-status")
                        with gr.Accordion("Save or load a run", open=False, elem_id="sv-files"):
                            export = gr.DownloadButton("Export trace (JSON)", value=None, elem_id="sv-export")
                            upload = gr.File(label="Load a trace (.json)", file_types=[".json"], type="filepath",
                                             elem_id="sv-upload")
                            if RECORDINGS:
                                rec = gr.Dropdown([p.name for p in RECORDINGS], value=RECORDINGS[0].name,
                                                  label="Recorded examples", elem_id="sv-recordings")
                    with gr.Column(scale=3, min_width=480):
                        gr.HTML(V.legend_html(), elem_id="sv-legend")
                        rounds = gr.HTML(V.rounds_html(None), elem_id="sv-rounds")
                        race_html = gr.HTML(V.race_html(None, None), elem_id="sv-race")
                        with gr.Row(elem_classes="sv-replay-row"):
                            replay_btn = gr.Button("↻ Replay the race in real time", size="sm", scale=0,
                                                   min_width=240, elem_id="sv-replay")
                with gr.Column(elem_id="sv-stepper"):
                    gr.Markdown("### Step through the rounds")
                    with gr.Row(equal_height=True, elem_classes="sv-step-row"):
                        prev_btn = gr.Button("◀ Previous", size="sm", scale=0, min_width=130, elem_id="sv-prev")
                        step = gr.Slider(1, 2, value=1, step=1, label="Round", interactive=False, elem_id="sv-step")
                        next_btn = gr.Button("Next ▶", size="sm", scale=0, min_width=130, elem_id="sv-next")
                    narration = gr.HTML(step_views(None, 1)[0], elem_id="sv-narration")
                    step_round = gr.HTML(elem_id="sv-step-round")
                gr.Markdown("### Numbers and charts")
                metrics = gr.HTML(V.metrics_html(None), elem_id="sv-metrics")
                with gr.Row():
                    plot_pos = gr.Plot(show_label=False, value=P.acceptance_by_position(None))
                    plot_hist = gr.Plot(show_label=False, value=P.tokens_per_round_hist(None))
                with gr.Row():
                    plot_time = gr.Plot(show_label=False, value=P.round_times(None))
                    plot_curve = gr.Plot(show_label=False, value=P.tokens_vs_time(None, None))
                    plot_speed = gr.Plot(show_label=False, value=P.speedup_bars(None, None))

            with gr.Tab("Theory", id="theory"):
                gr.Markdown("Leviathan et al.'s formulas, with the last run's measurements drawn on the same axes.")
                with gr.Row():
                    t_alpha = gr.Slider(0, 0.99, value=0.8, step=0.01, label="α (acceptance rate)", elem_id="sv-alpha")
                    t_gamma = gr.Slider(1, 16, value=5, step=1, label="γ (draft length)", elem_id="sv-t-gamma")
                    t_c = gr.Slider(0, 1, value=0.15, step=0.005, label="c (draft/target time per pass)",
                                    elem_id="sv-t-c")
                    t_chat = gr.Slider(0, 1, value=0.05, step=0.01, label="ĉ (draft/target arithmetic)",
                                       elem_id="sv-t-chat")
                with gr.Row():
                    last_btn = gr.Button("Use the last run's α, γ, c", size="sm", scale=0, min_width=240,
                                         elem_id="sv-use-last")
                t_note = gr.Markdown(elem_id="sv-theory-note")
                with gr.Row():
                    t_speed = gr.Plot(show_label=False, elem_id="sv-t-speed")
                    t_tokens = gr.Plot(show_label=False, elem_id="sv-t-tokens")
                with gr.Row():
                    t_cost = gr.Plot(show_label=False, elem_id="sv-t-cost")
                    t_thm1 = gr.Plot(show_label=False, elem_id="sv-t-thm1")
                gr.Markdown("#### Batch speculative decoding (Yin et al.): M drafts per position\n"
                            "Synthetic p and q with top-k = vocabulary/2 on both: more drafts mean fewer rejections, "
                            "but the curve levels off at the target mass the draft can never propose.")
                with gr.Row():
                    b_vocab = gr.Slider(4, 64, value=16, step=1, label="Vocabulary size")
                    b_close = gr.Slider(0, 1, value=0.5, step=0.05, label="Draft closeness to target")
                    b_m = gr.Slider(2, 32, value=16, step=1, label="Max drafts M")
                    b_seed = gr.Number(0, label="Seed", precision=0, minimum=0)
                b_plot = gr.Plot(show_label=False)

            with gr.Tab("Sweeps", id="sweeps"):
                gr.Markdown("Run the prompt and settings of the **Live** tab many times on the loaded models. "
                            "γ sweep: γ = 1…12 and standard decoding once. ε sweep: ε ∈ {0, 0.05, 0.1, 0.2, 0.4, 0.8, 1}, "
                            "Decoding-OPT and UNO.")
                with gr.Row():
                    g_btn = gr.Button("Run γ sweep", variant="primary")
                    e_btn = gr.Button("Run ε sweep", variant="primary")
                    sweep_stop = gr.Button("Stop sweep", variant="stop")
                sweep_status = gr.Markdown("*No sweep yet. A sweep takes several minutes on a CPU; lower max new tokens "
                                           "on the Live tab to go faster.*", elem_id="sv-sweep-status")
                g_plot = gr.Plot(show_label=False, value=TP.gamma_sweep_plot(None))
                with gr.Row():
                    e_plot = gr.Plot(show_label=False, value=TP.epsilon_sweep_plot(None))
                    pareto = gr.Plot(show_label=False, value=TP.pareto_plot(None, None))

            with gr.Tab("How it works", id="how"):
                gr.Markdown(HOW_IT_WORKS)

        # ---- events ----
        run_inputs = [preset, draft_id, target_id, prompt, gamma, epsilon, temperature, top_p, max_new, seed, variant]
        views = [status, rounds, race_html, state, metrics, plot_pos, plot_hist, plot_time, plot_curve, plot_speed,
                 step, narration, step_round, export]
        # Progress and errors show on the status line only (the run writes its own messages there);
        # by default Gradio would cover every output with a spinner or an "Error" badge.
        run_evt = run_btn.click(run, run_inputs, views, concurrency_limit=1, concurrency_id="models",
                                show_progress_on=[status], api_visibility="private")
        replay_evt = run_evt.success(replay, [state], [race_html], concurrency_limit=None, api_visibility="private")
        replay_again = replay_btn.click(replay, [state], [race_html], concurrency_limit=None, api_visibility="private")
        # Cancel first, then draw where the run got to (drawing first could be overwritten by a last frame).
        stop_btn.click(None, None, None, cancels=[run_evt, replay_evt, replay_again]).then(
            stop_views, [status, state], [status, rounds, race_html], queue=False, api_visibility="private")

        preset.change(lambda p: (gr.Row(visible=p == CUSTOM_PRESET),
                                 gr.Dropdown(info=PRESETS[p].description if p in PRESETS else "Any causal LM pair "
                                             "sharing one tokenizer")), [preset], [custom_row, preset],
                      api_visibility="private")

        def pick_example(label):
            ex = next((e for e in EXAMPLES if e["label"] == label), None)
            if not ex:
                return gr.skip(), gr.skip(), gr.skip()
            return ex["prompt"], ex.get("temperature", 0.0), ex.get("gamma", 5)
        example.change(pick_example, [example], [prompt, temperature, gamma], api_visibility="private")

        step.change(lambda s, i: step_views((s or {}).get("spec"), i), [state, step], [narration, step_round],
                    api_visibility="private")
        prev_btn.click(lambda i: max(int(i or 1) - 1, 1), [step], [step], api_visibility="private")
        next_btn.click(next_round, [state, step], [step], api_visibility="private")

        # After a recording loads, the prompt box shows the prompt it was recorded with.
        upload.upload(load_file, [upload], views, api_visibility="private").success(
            recorded_prompt, [state], [prompt], api_visibility="private")
        if RECORDINGS:
            rec.change(load_example_recording, [rec], views, api_visibility="private").success(
                recorded_prompt, [state], [prompt], api_visibility="private")
            demo.load(load_example_recording, None, views, api_visibility="private").success(
                recorded_prompt, [state], [prompt], api_visibility="private")

        theory_in = [t_alpha, t_gamma, t_c, t_chat, state]
        theory_out = [t_note, t_speed, t_tokens, t_cost, t_thm1]
        for comp in (t_alpha, t_gamma, t_c, t_chat):
            comp.release(theory_views, theory_in, theory_out, api_visibility="private")
        # A new run or recording moves the theory sliders to its measured α, γ and c, so its
        # measured point sits on the curve drawn from its own numbers.
        state.change(use_last_run, [state], [t_alpha, t_gamma, t_c], api_visibility="private").then(
            theory_views, theory_in, theory_out, api_visibility="private")
        demo.load(theory_views, theory_in, theory_out, api_visibility="private")
        last_btn.click(use_last_run, [state], [t_alpha, t_gamma, t_c], api_visibility="private").then(
            theory_views, theory_in, theory_out, api_visibility="private")
        batch_in = [b_vocab, b_close, b_m, b_seed]
        for comp in batch_in:
            comp.change(batch_view, batch_in, [b_plot], api_visibility="private")
        demo.load(batch_view, batch_in, [b_plot], api_visibility="private")

        g_evt = g_btn.click(gamma_sweep_ui, run_inputs, [sweep_status, g_plot, pareto], concurrency_limit=1,
                            concurrency_id="models", show_progress_on=[sweep_status], api_visibility="private")
        e_evt = e_btn.click(epsilon_sweep_ui, run_inputs, [sweep_status, e_plot, pareto], concurrency_limit=1,
                            concurrency_id="models", show_progress_on=[sweep_status], api_visibility="private")
        sweep_stop.click(None, None, None, cancels=[g_evt, e_evt])

        # The named API endpoint: one decode, streaming then returning both traces as JSON.
        gr.api(api_trace, api_name="trace", concurrency_limit=1, concurrency_id="models")
    demo.queue(max_size=QUEUE_SIZE, default_concurrency_limit=1)
    return demo


API_STREAM_S = 0.5  # the API sends the recording so far at most twice a second


@hosting.gpu(duration=hosting.run_duration)
def api_trace(prompt: str, preset: str = "", gamma: int = 5, epsilon: float = 0.0,
              temperature: float = 0.0, top_p: float = 1.0, max_new_tokens: int = 32, seed: int = 0,
              variant: str = "opt", standard: bool = True) -> Iterator[dict]:
    """Run speculative decoding (and, unless standard=False, the standard baseline) and
    return the recording: {"schema": "specviz.recording", "speculative": trace, "standard": trace}.

    While decoding, the recording so far is streamed (marked "partial": true) at most twice a
    second; the last output is the finished recording (what `Client.predict` returns).
    Cancelling the job (`Job.cancel()`) stops decoding within about one round."""
    try:
        check_request(prompt, gamma=gamma, epsilon=epsilon, temperature=temperature, top_p=top_p,
                      max_new_tokens=max_new_tokens, seed=seed, variant=variant)  # before loading any model
        if not isinstance(standard, bool):
            raise InputError(f"standard must be true or false, not a {type(standard).__name__}.")
        pair = get_pair(preset)
        req = prepare(pair, prompt, gamma=gamma, epsilon=epsilon, temperature=temperature, top_p=top_p,
                      max_new_tokens=max_new_tokens, seed=seed, variant=variant)
    except Exception as exc:
        if not isinstance(exc, (InputError, ModelError)):
            log.exception("api run failed")
        raise gr.Error(describe_error(exc), print_exception=False)
    spec = std = None
    last = time.perf_counter()
    try:
        # A cancelled job closes this generator at a yield: closing `updates` ends the
        # engine's loop (its `finally` frees the KV caches), then the lock is released.
        with MODEL_LOCK, contextlib.closing(race(req, standard=standard)) as updates:
            for up in updates:
                spec, std = up.spec, up.std
                now = time.perf_counter()
                if up.phase != "done" and now - last >= API_STREAM_S:
                    last = now
                    yield {**json.loads(recording_to_json(spec, std)), "partial": True}
    except Exception as exc:  # out of memory, a broken model…: a clean error, the server carries on
        log.exception("api run failed")
        raise gr.Error(describe_error(exc), print_exception=False)
    yield json.loads(recording_to_json(spec, std))


def preload_default() -> None:
    """Load (or convert, the first time) the default pair in the background so the first Run is quick."""
    def work():
        try:
            get_pair(default_preset())
            log.info("default pair ready")
        except Exception as exc:  # shown again, clearly, when someone presses Run
            log.warning("could not preload the default pair: %s", describe_error(exc))
    threading.Thread(target=work, daemon=True, name="preload").start()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    demo = build()
    if os.environ.get("SPECVIZ_PRELOAD", "1") != "0":
        preload_default()
    host, port = hosting.server_address()
    demo.launch(server_name=host, server_port=port,
                css=V.load_css(), theme=gr.themes.Soft(), footer_links=["api", "gradio"])


if __name__ == "__main__":
    main()
