"""specviz: watch speculative decoding happen, round by round, with real models.

Layout and wiring only.  The handlers are in specviz.ui (they return typed
frames; `Slots` turns them into ``{component: value}`` here), a run's path from
a click to the engine in specviz.serving.jobs, decoding in specviz.core.engine,
drawing in specviz.views.

Why one file of ~500 lines: `build` is the page, top to bottom -- every component
in the order it appears, then every event that connects them -- so that where a
control sits and what it triggers are read in one place; nothing else lives here.
"""

from __future__ import annotations

import functools
import gc
import json
import logging
import os
from pathlib import Path
from typing import Any

LOG_FORMAT = "%(asctime)s %(name)s %(message)s"
if __name__ == "__main__" and os.environ.get("SPECVIZ_PRELOAD", "1") != "0":
    # The default pair starts loading before Gradio is imported: reading its weights overlaps the
    # page's imports (a warm start serves its first run sooner; issue 34).
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    import threading

    def _preload() -> None:  # its imports too (torch, transformers: ~3.4 s) overlap Gradio's in this thread
        from specviz.serving import preload

        preload.start(hold_traces=True)  # traced once the page is served: main() says when

    threading.Thread(target=_preload, name="preload-start", daemon=True).start()

from specviz.ui import quick_gradio  # noqa: E402

quick_gradio.install()  # Gradio's import without rewriting its type stubs: ~2 s less of a start
import gradio as gr  # noqa: E402

from specviz.core.rules import RULE_LABELS
from specviz.core.settings import (BRANCHES_MAX, MAX_NEW_TOKENS_MAX, POLICIES, SEED_MAX, TREE_NODES_MAX, VARIANTS,
                                   DecodeSettings)
from specviz.drafters import DRAFTERS
from specviz.models import PRESETS
from specviz.serving import hosting, long_urls, replay, stream_log, temp_files
from specviz.serving.cancel import CANCELS
from specviz.serving.envvars import env_int
from specviz.serving.rooms import ROOMS
from specviz.serving.service import CUSTOM_PRESET, default_preset, ui_presets
from specviz.ui import (api, challenges_ui, class_layout, classroom, export_ui, links, live, machine_ui,
                        picture_ui, present, shootout_ui, tabs, tree_ui)
from specviz.ui.form import (FORM_FROM_TRACE, PAGE_DEFAULTS, RULE_HELP, RunForm, example_form, example_label,
                             form_duration, form_values,
                             form_sweep_duration)
from specviz.ui.frames import LiveFrame, MachineFrame, Slots, SweepFrame, TheoryFrame
from specviz.ui.live import load_file, show_recording, status_html, step_views  # noqa: F401 (show_recording: tests)
from specviz.ui.class_follow import ROOM_SESSION
from specviz.ui.store import STORE
from specviz.ui.tabs import BATCH_SEED_MAX, batch_view, gamma_slider, policy_info, theory_views, use_last_run
from specviz.views import html as V
from specviz.views import plots as P
from specviz.views import race_plots as RP

log = logging.getLogger("specviz.app")
ROOT = Path(__file__).resolve().parent
ASSETS = ROOT / "assets"
EXAMPLES = json.loads((ASSETS / "examples.json").read_text(encoding="utf-8"))
RECORDINGS = sorted((ASSETS / "traces").glob("*.json"))
# Gradio's queue, for a room: Run and /trace share RUN_WORKERS workers, so replays of identical
# requests (no model lock) start at once while live runs wait for the model lock inside a worker
# (at most replay.LiveGate.max_waiting of them; the others are told when to retry).  QUEUE_SIZE
# more events may wait in Gradio's queue for a worker; beyond, Gradio answers "Queue is full".
QUEUE_SIZE = env_int("SPECVIZ_QUEUE_SIZE", 64)
RUN_WORKERS = env_int("SPECVIZ_WORKERS", 32)
MAX_THREADS = RUN_WORKERS + 24  # every running event holds a thread; the other events need some too
GRADIO_QUEUE_ENV = {"GRADIO_ANALYTICS_MAX_EVENTS": "2000", "GRADIO_ANALYTICS_CACHE_FREQUENCY": "1000"}
MAX_UPLOAD = "10mb"  # Gradio refuses bigger uploads; the page draws recordings up to live.MAX_DRAW_BYTES
STATE_TTL_S = 3 * 3600  # a session's shown run is dropped from the store this long after it last changed
# Gradio keeps, per session, a copy of the page's config with the last value of every output it was
# sent (the race and rounds HTML, the plots' JSON: ~2.4 MiB for a 2 MB recording) until the session is
# evicted, least recently used first, past this many sessions; its own default, 10,000, grew RSS by
# ~5-20 MiB per new session without bound.  A room of 30 fits four times over.
SESSIONS = env_int("SPECVIZ_SESSIONS", 128)
DELETE_CACHE = (900, 3600)  # every 15 min, Gradio deletes its copies of files older than an hour;
# serving.temp_files also keeps them under a total size and count (the oldest go first)
if replay.CACHE.enabled:
    # Identical requests for the page's examples are replayed from the shipped recordings.
    replay.CACHE.seed(RECORDINGS)

# The model-running functions, wrapped for ZeroGPU on a Space (no-ops elsewhere); each takes a RunForm.
run = hosting.gpu(duration=form_duration)(live.run)
sweep = hosting.gpu(duration=form_sweep_duration)(tabs.sweep)
api_trace = hosting.gpu(duration=hosting.run_duration)(api.api_trace)
tree_sweep = hosting.gpu(duration=form_sweep_duration)(tabs.tree_sweep)
shootout = hosting.gpu(duration=form_sweep_duration)(shootout_ui.shootout)




STOPPING = "Stopping… the run ends after its current round (or chunk of the prompt)."
# (only while a run is in progress: Gradio's progress tracker shows on the status line then; with nothing running,
# Stop's drawing leaves the status line as it is, so "Stopping…" would stay)
STOPPING_JS = ("() => { const el = document.querySelector('#sv-status .sv-status'); "
               "const running = document.querySelector('#sv-status [data-testid=\"status-tracker\"]:not(.hide)'); "
               "if (el && running) { "
               "el.className = 'sv-status sv-status-warn'; el.dataset.kind = 'stopping'; "
               f"el.textContent = {json.dumps(STOPPING)}; }} }}")


def example_settings(example: dict) -> dict:
    """The settings the page sends for an example: its own, else the form's defaults."""
    return {k: example.get(k, v) for k, v in PAGE_DEFAULTS.items()}


def build() -> gr.Blocks:
    presets = ui_presets()
    first = example_settings(EXAMPLES[0])  # the form starts as the first example would set it
    with api.ApiBlocks(title="specviz: speculative decoding, explained live", delete_cache=DELETE_CACHE) as demo:
        # The page's state is a handle (ui.store.Shown); the traces live in one bounded store.
        state = gr.State(None, time_to_live=STATE_TTL_S, delete_callback=STORE.drop)
        tree_runs = gr.State([])  # the last i.i.d. tree runs' first-position rejections (Theory tab)
        with gr.Row(elem_id="sv-top", equal_height=True):
            gr.HTML('<div class="sv-header"><h1>specviz</h1><p>Speculative decoding, live: a small <b>draft</b> model '
                    'guesses γ tokens, the big <b>target</b> model checks them all in one pass. Every round, every '
                    'accept and reject, real models, real timings.</p></div>', elem_id="sv-header")
            with gr.Column(scale=0, min_width=190, elem_id="sv-present-box"):  # presenter mode: ui.present
                present_box = gr.Checkbox(False, label="Presenter mode", elem_id="sv-present-toggle",
                                          info="large text; ← → space Home End step the rounds")
                drawer_btn = gr.Button("⚙ Settings", size="sm", elem_id="sv-drawer-btn")
        class_ui = class_layout.build_bar()  # class mode (issue 58): who leads, who follows; hidden outside a class
        with gr.Tabs(overflow_behavior="wrap") as page_tabs:  # every tab's name in view, also on a phone
            with gr.Tab("Live", id="live"):
                with gr.Row():
                    with gr.Column(scale=1, min_width=340, elem_id="sv-controls"):
                        gr.HTML('<p class="sv-hint">Press <b>Run</b> to race speculative against standard '
                                'decoding on the prompt below, live.</p>', elem_id="sv-hint")
                        with gr.Row(elem_id="sv-run-row"):
                            run_btn = gr.Button("Run", variant="primary", elem_id="sv-run")
                            stop_btn = gr.Button("Stop", variant="stop", elem_id="sv-stop")
                        status = gr.HTML(status_html("Pick a prompt and press Run."), elem_id="sv-status")
                        preset = gr.Dropdown(presets, value=default_preset(), label="Model pair (draft → target)",
                                             info=PRESETS[default_preset()].description, elem_id="sv-preset")
                        with gr.Row(visible=False) as custom_row:
                            draft_id = gr.Textbox(label="Draft model", placeholder="org/name or local path")
                            target_id = gr.Textbox(label="Target model", placeholder="org/name or local path")
                        example = gr.Dropdown([e["label"] for e in EXAMPLES], value=EXAMPLES[0]["label"],
                                              label="Example prompts",
                                              info="fills in the prompt and its settings; the others go back to defaults",
                                              elem_id="sv-example")
                        prompt = gr.Textbox(EXAMPLES[0]["prompt"], label="Prompt", lines=4, max_lines=12,
                                            elem_id="sv-prompt")
                        drafter = gr.Dropdown([(label, name) for name, (label, _) in DRAFTERS.items()],
                                              value=DecodeSettings.drafter, label="Drafter",
                                              info="what proposes the draft tokens", elem_id="sv-drafter")
                        policy = gr.Radio(list(POLICIES), value=DecodeSettings.policy, label="Draft-length policy",
                                          info=policy_info(DecodeSettings.policy), elem_id="sv-policy")
                        gamma = gr.Slider(minimum=1, step=1, elem_id="sv-gamma",
                                          **gamma_slider(DecodeSettings.policy, first["gamma"]))
                        tau = gr.Slider(0, 1, value=DecodeSettings.tau, step=0.05, label="Confidence threshold τ",
                                        info="stop drafting after a token the drafter gave a probability below τ",
                                        visible=DecodeSettings.policy == "confidence", elem_id="sv-tau")
                        with gr.Group(visible=DecodeSettings.drafter == "tree", elem_id="sv-tree-controls") as tree_row:
                            branches = gr.Slider(1, BRANCHES_MAX, value=DecodeSettings.branches, step=1,
                                                 label="Branches M", elem_id="sv-branches",
                                                 info="i.i.d.: M draft sequences; best-first: top-M children; distinct: M draws without replacement")
                            tree_nodes = gr.Slider(1, TREE_NODES_MAX, value=DecodeSettings.tree_nodes, step=1,
                                                   label="Node budget", info="the most draft tokens in one tree",
                                                   elem_id="sv-tree-nodes")
                            tree_mode = gr.Radio([("i.i.d. batch drafts", "iid"), ("best-first top-k", "best-first"),
                                                  ("distinct draws (no replacement)", "unique")],
                                                 value=DecodeSettings.tree_mode, label="Tree mode",
                                                 elem_id="sv-tree-mode")
                        epsilon = gr.Slider(0, 1, value=0, step=0.01, label="Over-acceptance ε",
                                            info="0 = exact; accept with min(1, (p+ε)/q)", elem_id="sv-epsilon")
                        variant = gr.Radio(list(VARIANTS.items()), value=DecodeSettings.variant,
                                           label="After a rejection", elem_id="sv-variant")
                        rule = gr.Radio(list(RULE_LABELS.items()), value=DecodeSettings.rule,
                                        label="Verification rule", info=RULE_HELP[DecodeSettings.rule],
                                        elem_id="sv-rule")
                        with gr.Accordion("Sampling and length", open=False, elem_id="sv-sampling"):
                            temperature = gr.Slider(0, 2, value=first["temperature"], step=0.05, label="Temperature",
                                                    info="0 = greedy (argmax)", elem_id="sv-temperature")
                            top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="Top-p", info="1 = off",
                                              elem_id="sv-top-p")
                            max_new = gr.Slider(4, MAX_NEW_TOKENS_MAX, value=first["max_new_tokens"], step=4, label="Max new tokens",
                                                info="tokens to generate (fewer if the text ends)",
                                                elem_id="sv-max-new")
                            seed = gr.Number(first["seed"], label="Seed", precision=0, minimum=0, maximum=SEED_MAX,
                                             elem_id="sv-seed")
                        with gr.Accordion("How the target runs", open=False, elem_id="sv-exec-box"):
                            target_exec = gr.Dropdown(**machine_ui.exec_setting(), elem_id="sv-target-exec")
                        with gr.Accordion("Save or load a run", open=False, elem_id="sv-files"):
                            export = gr.DownloadButton("Export trace (JSON)", value=None, elem_id="sv-export")
                            page_btn = gr.Button("Download as a page (HTML)", elem_id="sv-export-page")
                            page_file = gr.File(label="The run as one page: plays offline, in any browser",
                                                visible=False, interactive=False, elem_id="sv-page-file")
                            upload = gr.File(label="Load a trace (.json)", file_types=[".json"], type="filepath",
                                             elem_id="sv-upload")
                            if RECORDINGS:
                                rec = gr.Dropdown([p.name for p in RECORDINGS], value=RECORDINGS[0].name,
                                                  label="Recorded examples", elem_id="sv-recordings")
                    with gr.Column(scale=3, min_width=480):
                        legend = gr.HTML(V.legend_html(), elem_id="sv-legend")
                        rounds = gr.HTML(V.rounds_html(None), elem_id="sv-rounds")
                        tree_panel = gr.HTML("", elem_id="sv-tree")
                        with gr.Accordion("Tree attention mask", open=False, visible=False,  # tree runs only
                                          elem_id="sv-tree-mask-box") as tree_mask_box:
                            tree_mask = gr.Plot(show_label=False, elem_id="sv-tree-mask")
                        race_html = gr.HTML(V.race_html(None, None), elem_id="sv-race")
                        with gr.Row(elem_classes="sv-replay-row"):
                            replay_btn = gr.Button("↻ Replay the race in real time", size="sm", scale=0,
                                                   min_width=240, elem_id="sv-replay")
                with gr.Column(elem_id="sv-stepper"):
                    gr.Markdown("### Step through the rounds")
                    with gr.Row(equal_height=True, elem_classes="sv-step-row"):
                        first_round_btn = gr.Button("⇤ First", size="sm", scale=0, min_width=90, elem_id="sv-first")
                        prev_btn = gr.Button("◀ Previous", size="sm", scale=0, min_width=130, elem_id="sv-prev")
                        step = gr.Slider(1, 2, value=1, step=1, label="Round", interactive=False, elem_id="sv-step")
                        next_btn = gr.Button("Next ▶", size="sm", scale=0, min_width=130, elem_id="sv-next")
                        play_btn = gr.Button("▶ Play", size="sm", scale=0, min_width=90, elem_id="sv-play")
                        last_round_btn = gr.Button("Last ⇥", size="sm", scale=0, min_width=90, elem_id="sv-last")
                    with gr.Row(elem_classes="sv-link-row"):
                        copy_btn = gr.Button("Copy a link to this round", size="sm", scale=0, min_width=240,
                                             elem_id="sv-copy-link")
                        link_box = gr.Textbox(show_label=False, interactive=False, max_lines=1, scale=1,
                                              placeholder="the link appears here", elem_id="sv-link")
                    narration = gr.HTML(step_views(None, 1)[0], elem_id="sv-narration")
                    step_round = gr.HTML(elem_id="sv-step-round")
                    pos_pick = gr.Radio([], label="The acceptance picture at position", visible=False,
                                        elem_id="sv-pos-pick")
                    picture = gr.Plot(show_label=False, elem_id="sv-picture")
                gr.Markdown("### Numbers and charts")
                metrics = gr.HTML(V.metrics_html(None), elem_id="sv-metrics")
                # Every page load shows a shipped recording here (on_start, below), charts included: empty
                # figures built now would never be seen (and cost ~0.4 s of a start's single-threaded Python).
                empty = (lambda make, *a: None) if RECORDINGS else (lambda make, *a: make(*a))
                with gr.Row(elem_classes="sv-plots"):
                    plot_pos = gr.Plot(show_label=False, value=empty(P.acceptance_by_position, None))
                    plot_hist = gr.Plot(show_label=False, value=empty(P.tokens_per_round_hist, None))
                    plot_draft = gr.Plot(show_label=False, value=empty(P.draft_lengths, None), elem_id="sv-draft-lengths")
                with gr.Row(elem_classes="sv-plots"):
                    plot_time = gr.Plot(show_label=False, value=empty(P.round_times, None))
                    plot_curve = gr.Plot(show_label=False, value=empty(RP.tokens_vs_time, None, None))
                    plot_speed = gr.Plot(show_label=False, value=empty(RP.speedup_bars, None, None))
                with gr.Row(visible=False, elem_classes="sv-plots", elem_id="sv-tree-plots") as tree_plots:  # tree runs only
                    plot_tree_size = gr.Plot(show_label=False, elem_id="sv-tree-sizes")
                    plot_tree_verify = gr.Plot(show_label=False, elem_id="sv-tree-verify")

            with gr.Tab("Theory", id="theory"):
                gr.Markdown("Leviathan et al.'s formulas, with the last run's measurements drawn on the same axes.")
                with gr.Row():
                    steps = tabs.THEORY_STEPS  # the note prints each value with its slider's step's decimals
                    t_alpha = gr.Slider(0, 0.99, value=0.8, step=steps["alpha"], label="α (acceptance rate)",
                                        elem_id="sv-alpha")
                    t_gamma = gr.Slider(1, 16, value=5, step=1, label="γ (draft length)", elem_id="sv-t-gamma")
                    t_c = gr.Slider(0, 1, value=0.15, step=steps["c"], label="c (draft/target time per pass)",
                                    elem_id="sv-t-c")
                    t_chat = gr.Slider(0, 1, value=0.05, step=steps["c_hat"], label="ĉ (draft/target arithmetic)",
                                       elem_id="sv-t-chat")
                    t_v = gr.Slider(0.5, 8, value=1.0, step=steps["v"], label="v (verify pass ÷ standard step)",
                                    info="1 in the paper; measured by each run", elem_id="sv-t-v")
                with gr.Row():
                    last_btn = gr.Button("Use the last run's α, γ, c, v", size="sm", scale=0, min_width=240,
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
                    b_seed = gr.Number(0, label="Seed", precision=0, minimum=0, maximum=BATCH_SEED_MAX)
                b_plot = gr.Plot(show_label=False)

            with gr.Tab("This machine", id="machine") as machine_tab:
                gr.Markdown("How the target model runs on the machine serving this page: its verify pass over k "
                            "tokens, timed in each execution (precision and kernels) the machine offers.")
                compare_with = machine_ui.compare_choices()
                m_compare = gr.CheckboxGroup(compare_with, value=[], label="Compare with",
                                             info="curves measured on other machines, and llama.cpp's on the same model files, shipped with the app",
                                             visible=bool(compare_with), elem_id="sv-machine-compare")
                m_plot = gr.Plot(show_label=False, elem_id="sv-machine-plot")
                m_note = gr.Markdown(elem_id="sv-machine-note")

            with gr.Tab("Sweeps", id="sweeps"):
                gr.Markdown(tabs.SWEEPS_INTRO, elem_id="sv-sweeps-intro")
                with gr.Row():
                    g_btn = gr.Button("Run γ sweep", variant="primary")
                    e_btn = gr.Button("Run ε sweep", variant="primary")
                    tree_btn = gr.Button("Measure verify time vs tree nodes", variant="primary", elem_id="sv-tree-sweep")
                    sh_btn = gr.Button("Run drafter shoot-out", variant="primary", elem_id="sv-shootout-run")
                    sweep_stop = gr.Button("Stop sweep", variant="stop")
                # the shipped recorded sweeps, until a sweep replaces them: drawn at page load (below)
                sweep_status = gr.Markdown(elem_id="sv-sweep-status")
                g_plot = gr.Plot(show_label=False)
                with gr.Row():
                    e_plot = gr.Plot(show_label=False)
                    pareto = gr.Plot(show_label=False)
                gr.Markdown("#### Drafter shoot-out\n" + shootout_ui.POLICY_NOTE)
                sh_table = gr.HTML(elem_id="sv-shootout-table")
                sh_plot = gr.Plot(show_label=False, elem_id="sv-shootout-plot")
                sh_runs = gr.State({})  # {label: handle on the store} of this session's last shoot-out
                with gr.Row(equal_height=True):
                    sh_pick = gr.Dropdown([], label="Shoot-out runs", info=shootout_ui.NO_RUNS, interactive=False,
                                          elem_id="sv-shootout-pick", scale=3)
                    sh_show = gr.Button("Show on the Live tab", size="sm", scale=1, elem_id="sv-shootout-show")
                tree_plot = gr.Plot(show_label=False, elem_id="sv-tree-sweep-plot")

            with gr.Tab("How it works", id="how"):
                # the algorithm, this machine's measured verify cost (its probe), draft heads, the glossary
                how_md = gr.Markdown(machine_ui.how_text(), elem_id="sv-how")

            with gr.Tab("Challenges", id="challenges"):  # guided tasks, checked from the learner's runs
                challenge_tab = challenges_ui.build_tab(state)

            class_layout.build_tab(class_ui)  # start or join a class; the teacher's room and plot

        # ---- events ----
        form = Slots(RunForm, preset=preset, draft_id=draft_id, target_id=target_id, prompt=prompt, gamma=gamma,
                     epsilon=epsilon, variant=variant, temperature=temperature, top_p=top_p, max_new_tokens=max_new,
                     seed=seed, drafter=drafter, policy=policy, tau=tau, branches=branches, tree_nodes=tree_nodes,
                     tree_mode=tree_mode, target_exec=target_exec, rule=rule)
        views = Slots(LiveFrame, status=status, legend=legend, rounds=rounds, race=race_html, state=state,
                      metrics=metrics, plot_pos=plot_pos, plot_hist=plot_hist, plot_draft=plot_draft,
                      plot_time=plot_time, plot_curve=plot_curve, plot_speed=plot_speed, step=step,
                      narration=narration, step_round=step_round, export=export, tree=tree_panel,
                      tree_mask=tree_mask, plot_tree_size=plot_tree_size, plot_tree_verify=plot_tree_verify,
                      tree_mask_box=tree_mask_box, tree_plots=tree_plots)
        theory = Slots(TheoryFrame, note=t_note, speedup=t_speed, tokens=t_tokens, cost=t_cost, thm1=t_thm1)
        sweep_views = Slots(SweepFrame, status=sweep_status, gamma_plot=g_plot, eps_plot=e_plot, pareto=pareto,
                            tree_plot=tree_plot, shootout_table=sh_table, shootout_plot=sh_plot,
                            shootout_runs=sh_runs, shootout_pick=sh_pick)
        # The Sweeps tab's recorded sweeps, drawn once per process at the first page load rather than at start
        # (plotly's figures: ~0.3 s of a start's single-threaded Python); every later load reuses them.
        demo.load(lambda: sweep_views.write(shootout_ui.recorded_page_frame()), None, sweep_views.outputs,
                  api_visibility="private")

        def on_run(values: dict, request: gr.Request = None, progress=gr.Progress()):
            for frame in run(form.read(values), getattr(request, "session_hash", None), progress):
                yield views.write(frame)

        def on_stop(st: Any, request: gr.Request = None):  # what the server knows of the run: never the page's HTML
            return views.write(live.stopped(st, getattr(request, "session_hash", None)))

        # Progress and errors show on the status line only (the run writes its own messages there);
        # by default Gradio would cover every output with a spinner or an "Error" badge.
        run_evt = run_btn.click(on_run, form.inputs, views.outputs, concurrency_limit=RUN_WORKERS, concurrency_id="runs",
                                show_progress_on=[status], api_visibility="private")
        # A finished run shows its result at once (both texts, the speedup); replaying the race in real
        # time is the replay button's, on request.
        replay_evt = replay_btn.click(live.replay, [state], [race_html], concurrency_limit=None,
                                      api_visibility="private")
        # Cancel first, then draw where the run got to (drawing first could be overwritten by a last frame).
        # Stop also sets the run's cancel flag, read inside a long prompt's pass (serving.cancel), which Gradio's
        # cancel (closing the run's generator between two outputs) cannot reach.  The drawing goes through the
        # queue (no limit, so it starts at once): only a queued event's new state fires `state.change` (the
        # acceptance picture, a teacher's room); Gradio 6 sends changed state ids with queued results only.
        # At once, in the browser: the status line says the run is stopping (a round or a prompt chunk may take
        # seconds on a busy machine, and only a generic timer showed meanwhile); Stop's drawing replaces it.
        stop_btn.click(None, None, None, js=STOPPING_JS, api_visibility="private")
        stop_btn.click(stop_pressed, None, None, cancels=[run_evt, replay_evt], queue=False, show_progress="hidden",
                       api_visibility="private").then(
            on_stop, [state], views.outputs, concurrency_limit=None, show_progress="hidden",
            api_visibility="private")
        # A page that closes (a client that goes away) cancels its run in progress: Gradio's supported unload event.
        demo.unload(cancel_run)

        preset.change(lambda p: (gr.Row(visible=p == CUSTOM_PRESET),
                                 gr.Dropdown(info=PRESETS[p].description if p in PRESETS else "Any causal LM pair "
                                             "sharing one tokenizer")), [preset], [custom_row, preset],
                      api_visibility="private")
        # γ is the draft length of the constant policy and the maximum (up to 32) of the others.
        policy.change(lambda p, g, d: {gamma: gr.Slider(**tree_ui.gamma_labels(d, gamma_slider(p, g))),
                                       tau: gr.Slider(visible=p == "confidence"), policy: gr.Radio(info=policy_info(p))},
                      [policy, gamma, drafter], [gamma, tau, policy], api_visibility="private")

        def on_drafter(d, e, p, g, r):  # the tree's controls; ε, UNO, the rule locked (chain only); γ is its depth
            ups = tree_ui.drafter_controls(d, e, r)
            return {tree_row: ups["tree_row"], epsilon: ups["epsilon"], variant: ups["variant"], rule: ups["rule"],
                    gamma: gr.Slider(**tree_ui.gamma_labels(d, gamma_slider(p, g)))}
        drafter.change(on_drafter, [drafter, epsilon, policy, gamma, rule], [tree_row, epsilon, variant, rule, gamma],
                       api_visibility="private")

        def on_rule(d, e, r):  # block and match are exact rules of their own: ε and UNO locked
            ups = tree_ui.drafter_controls(d, e, r)
            return {epsilon: ups["epsilon"], variant: ups["variant"], rule: ups["rule"]}
        rule.change(on_rule, [drafter, epsilon, rule], [epsilon, variant, rule], api_visibility="private")

        # An example sets every setting it names and resets the others to the page's defaults (ε back to 0, the
        # draft model, the constant policy…: ui.form.example_form), so nothing carries over silently from the last
        # run and everyone who picks it sends the same request (served from the recording cache).
        example_form_fields = [form[name] for name in FORM_FROM_TRACE]

        def pick_example(label):
            ex = next((e for e in EXAMPLES if e["label"] == label), None)
            if not ex:
                return [gr.skip()] * len(FORM_FROM_TRACE)
            values = example_form(ex)
            return [values[name] for name in FORM_FROM_TRACE]
        # On the user's pick only (input, not change): when a recording or a link sets the dropdown to the example
        # it shows, the form keeps the recording's settings.
        example.input(pick_example, [example], example_form_fields, api_visibility="private")
        # A prompt typed or edited: the dropdown names the example it now is, else nothing (client-side, no request).
        example_of = json.dumps({e["prompt"]: e["label"] for e in EXAMPLES})
        prompt.input(None, [prompt], [example], js=f"(p) => ({example_of})[p] ?? null", api_visibility="private")

        # A round's views are drawn once per recording and round (ui.round_memo), so a class's pages stepping
        # together are served at once (issue 58): outside Gradio's queue (one request, no event stream, no
        # concurrency limit), as each attendee's page fires these at every step.
        # On a class teacher's page, the same event tells the room the round shown (classroom.teacher_view).
        step.change(classroom.on_step, [class_ui.room, state, step], [narration, step_round, tree_mask, pos_pick,
                                                                      picture], queue=False, api_visibility="private",
                    **present.QUIET)
        step.change(None, [step], None, js=present.SCROLL_ROUND_JS, api_visibility="private")  # the panel follows
        # A position the visitor picks (not one a step picked: that step's picture came with it).
        pos_pick.input(picture_ui.for_position, [state, step, pos_pick], [picture], queue=False,
                       api_visibility="private")
        state.change(picture_ui.for_step, [state, step], [pos_pick, picture], concurrency_limit=None,
                     api_visibility="private")
        # The button says where its link leads: a live run's opens the shipped recording, another run (issue 65).
        state.change(lambda st: gr.Button(**links.copy_button((st or {}).get("spec"), examples=EXAMPLES,
                                                               recordings=RECORDINGS)),
                     [state], [copy_btn], concurrency_limit=None, api_visibility="private")
        copy_btn.click(lambda st, i, pr: links.link_query((st or {}).get("spec"), i, examples=EXAMPLES,
                                                          recordings=RECORDINGS, present=pr),
                       [state, step, present_box], [link_box],
                       api_visibility="private").then(
            None, [link_box], [link_box], api_visibility="private",
            js="(q) => { const u = new URL(window.location.href); u.search = q; const s = u.toString(); "
               "try { navigator.clipboard.writeText(s); } catch (e) {} return s; }")
        prev_btn.click(live.prev_round, [step, state], [step], api_visibility="private", **present.QUIET)
        # Presenter mode (specviz.ui.present, assets/present.js): the toggle, the settings drawer, the keys' buttons.
        present_box.change(None, [present_box], None, js=present.TOGGLE_JS, api_visibility="private")
        drawer_btn.click(None, None, None, js=present.DRAWER_JS, api_visibility="private")
        play_btn.click(None, None, None, js=present.PLAY_JS, api_visibility="private")
        first_round_btn.click(present.first_round, None, [step], api_visibility="private", **present.QUIET)
        last_round_btn.click(present.last_round, [state], [step], api_visibility="private", **present.QUIET)
        # "Download as a page": what the Live tab shows, as one HTML file (an older page hides when it changes).
        # Pages are made outside the model gate, EXPORTS.limit at a time; the others are answered at once (issue 33).
        page_btn.click(export_ui.download_page, [state], [page_file, status], concurrency_limit=8,
                       concurrency_id="exports", api_visibility="private")
        state.change(export_ui.hidden_page, None, [page_file], api_visibility="private")
        next_btn.click(live.next_round, [state, step], [step], api_visibility="private", **present.QUIET)

        # After a recording loads, the form shows what it recorded (prompt and settings), so Run runs
        # what is on screen; an uploaded file is no longer the recording the dropdown names.  "Example prompts"
        # then names the example whose prompt it recorded, or nothing (a custom prompt).
        form_fill = [*(form[name] for name in FORM_FROM_TRACE), example]

        def fill_form(st):
            values = form_values((st or {}).get("spec") or (st or {}).get("std"))
            shown = values.get("prompt")
            return [*(values.get(name, gr.skip()) for name in FORM_FROM_TRACE),
                    example_label(shown, EXAMPLES) if shown is not None else gr.skip()]
        upload_evt = upload.upload(lambda f: views.write(load_file(f)), [upload], views.outputs,
                                   api_visibility="private").success(fill_form, [state], form_fill,
                                                                     api_visibility="private")
        if RECORDINGS:
            def on_recording(name=None):
                if not name:  # cleared after an upload: the uploaded recording stays on screen
                    return {status: gr.skip()}  # (an empty dict would read as one missing value: "Error" everywhere)
                return views.write(live.load_example_recording(RECORDINGS, name))
            rec.change(on_recording, [rec], views.outputs, api_visibility="private").success(
                fill_form, [state], form_fill, api_visibility="private")
            upload_evt.then(lambda: gr.Dropdown(value=None), None, [rec], api_visibility="private")
            # The page's URL may name a recording or an example and a round (specviz.ui.links): step mode there.
            def on_start(request: gr.Request = None):
                params = dict(request.query_params) if request is not None and request.query_params else {}
                link = links.parse_link(params, examples=EXAMPLES, recordings=RECORDINGS)
                out = views.write(links.open_link(link, RECORDINGS))  # the example's label: fill_form, from the prompt
                out[present_box] = True if link.present else gr.skip()
                return out
            demo.load(on_start, None, [*views.outputs, present_box], api_visibility="private").success(
                fill_form, [state], form_fill, api_visibility="private")

        # This machine: the probe of the pair the preset names (loaded or cached; nothing is loaded for it).
        machine = Slots(MachineFrame, note=m_note, plot=m_plot)

        def on_machine(p, compare, st):  # the last race's best γ (theory.figures) set apart from the probe's
            return machine.write(machine_ui.machine_views(p, compare, state=st))
        machine_in = [preset, m_compare, state]
        for evt in (demo.load, machine_tab.select, m_compare.change, preset.change, run_evt.success):
            evt(on_machine, machine_in, machine.outputs, concurrency_limit=None, api_visibility="private")

        theory_in = [t_alpha, t_gamma, t_c, t_chat, state, t_v]

        def on_theory(*args):
            return theory.write(theory_views(*args))
        for comp in (t_alpha, t_gamma, t_c, t_chat, t_v):
            comp.release(on_theory, theory_in, theory.outputs, api_visibility="private")
        # A new run or recording moves the theory sliders to its measured α, γ, c and v, so its
        # measured point sits on the curve drawn from its own numbers.
        state.change(use_last_run, [state], [t_alpha, t_gamma, t_c, t_v], api_visibility="private").then(
            on_theory, theory_in, theory.outputs, api_visibility="private")
        demo.load(on_theory, theory_in, theory.outputs, api_visibility="private")
        demo.load(machine_ui.how_text, None, how_md, api_visibility="private")  # the probe may be newer than the page
        last_btn.click(use_last_run, [state], [t_alpha, t_gamma, t_c, t_v], api_visibility="private").then(
            on_theory, theory_in, theory.outputs, api_visibility="private")
        batch_in = [b_vocab, b_close, b_m, b_seed, tree_runs]
        for comp in batch_in[:4]:
            comp.change(batch_view, batch_in, [b_plot], api_visibility="private")
        demo.load(batch_view, batch_in, [b_plot], api_visibility="private")
        state.change(tree_ui.remember_batch, [tree_runs, state], [tree_runs], api_visibility="private").then(
            batch_view, batch_in, [b_plot], api_visibility="private")

        def on_gamma_sweep(values: dict, progress=gr.Progress()):
            for frame in sweep("gamma", form.read(values), progress):
                yield sweep_views.write(frame)

        def on_epsilon_sweep(values: dict, progress=gr.Progress()):
            for frame in sweep("epsilon", form.read(values), progress):
                yield sweep_views.write(frame)
        g_evt = g_btn.click(on_gamma_sweep, form.inputs, sweep_views.outputs, concurrency_limit=1,
                            concurrency_id="sweeps", show_progress_on=[sweep_status], api_visibility="private")
        e_evt = e_btn.click(on_epsilon_sweep, form.inputs, sweep_views.outputs, concurrency_limit=1,
                            concurrency_id="sweeps", show_progress_on=[sweep_status], api_visibility="private")

        def on_tree_sweep(values: dict, progress=gr.Progress()):
            for frame in tree_sweep(form.read(values), progress):
                yield sweep_views.write(frame)
        t_evt = tree_btn.click(on_tree_sweep, form.inputs, sweep_views.outputs, concurrency_limit=1,
                               concurrency_id="sweeps", show_progress_on=[sweep_status], api_visibility="private")

        def on_shootout(values: dict, progress=gr.Progress()):
            for frame in shootout(form.read(values), progress):
                yield sweep_views.write(frame)
        sh_evt = sh_btn.click(on_shootout, form.inputs, sweep_views.outputs, concurrency_limit=1,
                              concurrency_id="sweeps", show_progress_on=[sweep_status], api_visibility="private")
        sweep_stop.click(None, None, None, cancels=[g_evt, e_evt, t_evt, sh_evt])

        def on_show_run(runs, label):  # a shoot-out run on the Live tab (step mode, export), and go there
            frame = shootout_ui.show_run(runs, label)
            return {**views.write(frame), page_tabs: gr.Tabs(selected="live") if frame.state else gr.skip()}
        sh_show_evt = sh_show.click(on_show_run, [sh_runs, sh_pick], [*views.outputs, page_tabs],
                                    api_visibility="private")
        # The Challenges tab counts the runs this session made (a finished Run, a shoot-out run shown).
        challenges_ui.track(challenge_tab, run_btn, run_evt, state)
        challenges_ui.track(challenge_tab, sh_show, sh_show_evt, state)

        # Class mode: the teacher's page leads, the attendees' follow, races post points (specviz.ui.classroom).
        classroom.wire(class_ui, demo, state=state, step=step, views=views, run_btn=run_btn, run_evt=run_evt,
                       recordings=RECORDINGS)

        # The named API endpoint: one decode, streaming then returning both traces as JSON.
        gr.api(api_trace, api_name="trace", concurrency_limit=RUN_WORKERS, concurrency_id="runs")
    # Gradio summarises its recorded events (a pandas table of up to GRADIO_ANALYTICS_MAX_EVENTS rows, for its
    # monitoring page) after every event by default: tens of ms per event once thousands are recorded, the
    # largest cost of a class's polls (issue 58).  Here: at most 2,000 events, summarised every 1,000 events.
    for name, value in GRADIO_QUEUE_ENV.items():
        os.environ.setdefault(name, value)  # read by the queue made here; the operator's own values stand
    hosting.mark_absent()  # an uninstalled module Gradio tries around every event fails at once (serving.hosting)
    demo.queue(max_size=QUEUE_SIZE, default_concurrency_limit=1)
    # The store's entries belong to Gradio sessions: one Gradio no longer holds (evicted, expired) is freed first
    # when room is needed, whatever dropped it (ui.store, issue 55).
    STORE.alive = functools.partial(session_alive, demo)
    return demo


def cancel_run(request: gr.Request = None) -> None:
    """The page closed: the session's run in progress stops within a round or a prompt chunk."""
    if CANCELS.cancel(getattr(request, "session_hash", None)):
        log.info("a run was cancelled: its page closed")


def stop_pressed(request: gr.Request = None) -> None:
    """Stop pressed: as `cancel_run`, and Stop's drawing (live.stopped) is told whether a run was in progress."""
    if live.press_stop(getattr(request, "session_hash", None)):
        log.info("a run was cancelled: its page pressed Stop")


def session_alive(demo: gr.Blocks, session: str) -> bool:
    """Whether Gradio still holds this session's state (True before the server starts: nothing to judge)."""
    if session.startswith(ROOM_SESSION):  # a class room's shown runs live as long as the room
        return ROOMS.is_open(session[len(ROOM_SESSION):])
    holder = getattr(demo, "state_holder", None)
    return holder is None or session in holder


def preload_default() -> None:
    """Load the default pair in the background so the first Run is quick (specviz.serving.preload)."""
    from specviz.serving import preload

    preload.start(hold_traces=True)  # main() says when the page is served


def launch_options() -> dict[str, Any]:
    """The server's own launch arguments (the page's look aside): upload size, threads, sessions, and the
    middleware that lets the page open whatever its URL holds (serving.long_urls) and serves only the routes
    the page uses (serving.routes)."""
    return dict(max_file_size=MAX_UPLOAD, max_threads=MAX_THREADS, state_session_capacity=SESSIONS,
                app_kwargs=long_urls.app_kwargs())


def main() -> None:
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    stream_log.install()  # a client's queue stream ending early: one line, not gradio's traceback
    # What the imports made lives as long as the server: out of the cycle collector's reach, the full
    # collection after every run (service.release_memory) walks ~0.1 s of objects instead of ~0.25 s.
    # The preload thread may be loading meanwhile: what it holds now is frozen too, and still freed by
    # reference counting when it lets go (only a reference cycle among those objects would stay).
    gc.freeze()
    if os.environ.get("SPECVIZ_PRELOAD", "1") != "0":
        preload_default()  # started already when app.py runs as a script: loading overlaps the imports too
    demo = build()
    temp_files.start(demo)  # Gradio's file copies bounded by size and count too, not only by age
    host, port = hosting.server_address()
    demo.launch(server_name=host, server_port=port, **launch_options(), prevent_thread_lock=True,
                css=V.load_css(), head=present.head(), theme=gr.themes.Soft(), footer_links=["api", "gradio"])
    from specviz.models import warm

    warm.serving()  # the page is served: the preload's traces may begin (they waited: specviz.models.warm)
    demo.block_thread()


if __name__ == "__main__":
    main()
