"""The token trees on the page: the tree drafter's controls, the live tree, step mode, plots, the API."""

from __future__ import annotations

import inspect
import re
import time

import gradio as gr
import pytest

from specviz.models import TINY_PRESET
from specviz.serving.service import InputError
from specviz.trace import Trace, trace_from_dict
from specviz.ui import api, live, tabs, tree_ui
from specviz.ui.form import RunForm
from specviz.ui.frames import SKIP
from specviz.views.tree import tree_steps

TREE = dict(preset=TINY_PRESET, prompt="hello there", drafter="tree", gamma=3, branches=3, tree_nodes=9,
            max_new_tokens=12, temperature=1.0, seed=4)


@pytest.fixture(scope="module")
def frames():
    # Draw every event: the test needs the frames drawn while the tree is still being drafted.
    mp = pytest.MonkeyPatch()
    mp.setattr(live, "UI_THROTTLE_S", 0.0)
    mp.setattr(tree_ui, "WALK_STEP_S", 0.01)  # the walk's frames, without its pace
    try:
        yield list(live.run(RunForm(**TREE, tree_mode="iid")))
    finally:
        mp.undo()


def test_the_form_carries_the_tree_settings_and_refuses_chain_only_ones():
    s = RunForm(**TREE, tree_mode="iid").check().settings
    assert (s.drafter, s.branches, s.tree_nodes, s.tree_mode, s.gamma) == ("tree", 3, 9, "iid", 3)
    with pytest.raises(InputError, match="ε"):
        RunForm(**TREE, epsilon=0.2).check()
    with pytest.raises(InputError, match="tree nodes"):
        RunForm(**{**TREE, "tree_nodes": 65}).check()


def test_a_tree_run_draws_nodes_as_drafted_then_the_verdict(frames):
    trees = [f.tree for f in frames if f.tree is not SKIP and f.tree]
    # While drafting: a tree whose nodes are all pending (no verdict yet) and no "verify pass" line.
    drafting = [t for t in trees if 'data-status="pending"' in t and "verify pass" not in t]
    assert drafting, "no frame showed a tree still being drafted"
    sizes = [t.count("data-node=") for t in drafting]
    assert min(sizes) < max(sizes), "the drafted tree never grew from one frame to the next"
    last = frames[-1]
    spec: Trace = last.state["spec"]
    tree_rounds = [r for r in spec.rounds if r.tree is not None]
    assert tree_rounds and all(len(r.tree.nodes) <= 9 for r in tree_rounds)
    # The finished panel: the last tree round's verdict (accepted or rejected children, the extra token).
    assert 'data-status="accepted"' in last.tree or 'data-status="rejected"' in last.tree
    assert "sv-extra" in last.tree and "data-status=\"pending\"" not in last.tree
    assert last.tree_mask.data and last.tree_mask.data[0].type == "heatmap"
    assert len(last.tree_mask.data[0].z) == len(tree_rounds[-1].tree.nodes)


WALK = re.compile(r'<div class="sv-tree-walk" aria-live="polite" data-step="(\d+)"[^>]*>([^<]*)</div>')


def test_the_verification_walk_plays_step_by_step_after_each_verify_pass(frames):
    spec: Trace = frames[-1].state["spec"]
    tree_rounds = [r for r in spec.rounds if r.tree is not None and r.tree.visits]
    walks = [(f, WALK.search(f.tree)) for f in frames if f.tree is not SKIP and f.tree and "sv-tree-walk" in f.tree]
    assert walks, "no frame played a verification walk"
    steps = [int(m.group(1)) for _, m in walks]
    # Every tried child and the extra token of every tree round, in order: one frame each.
    expect = [k for r in tree_rounds for k in tree_ui.walk_steps(r)]
    assert steps == expect
    for rnd in tree_rounds:
        depth = max(n.depth for n in rnd.tree.nodes)
        assert tree_ui.walk_steps(rnd)[0] == depth + 1 and tree_ui.walk_steps(rnd)[-1] == tree_steps(rnd)
    # Mid-walk: some nodes already have their verdict, others still wait (pending); the narration
    # says which child of how many was tried.
    mid = [(f, m) for f, m in walks if ('data-status="accepted"' in f.tree or 'data-status="rejected"' in f.tree)
           and 'data-status="pending"' in f.tree.split("sv-tree-walk")[0].rsplit('class="sv-tree"', 1)[-1]]
    assert mid, "no walk frame showed a tree part-verified"
    assert all(re.search(r"child \d+ of \d+ \(.*\) (accepted|rejected)|correction|bonus", m.group(2)) for _, m in walks)
    assert all("the target&#x27;s verdict, step " in f.status for f, _ in walks)
    # A walk ends on the finished round: its extra token shown, nothing pending.
    last_walk = walks[-1][0].tree.rsplit('class="sv-tree"', 1)[-1]
    assert "sv-extra" in last_walk and 'data-status="pending"' not in last_walk


class FakeTime:
    """Stands in for the `time` module of the engine and the Live tab: a clock that moves only when read
    (10 µs a reading) or slept on (by the time asked), so what the trace counts is decided by the code,
    never by how busy the machine is."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1e-5
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.0)

    def __getattr__(self, name):
        return getattr(time, name)


def test_walks_play_outside_the_model_gate_and_off_the_decoding_clock(monkeypatch):
    from specviz.core import engine
    from specviz.serving.service import MODEL_LOCK

    clock = FakeTime()
    for mod in (engine, live, tree_ui):
        monkeypatch.setattr(mod, "time", clock)
    monkeypatch.setattr(live, "UI_THROTTLE_S", 0.0)
    monkeypatch.setattr(tree_ui, "WALK_STEP_S", 0.15)
    slept = []  # (seconds, whether the models were held) of every pause between walk steps
    real_sleep = clock.sleep
    monkeypatch.setattr(clock, "sleep", lambda s: (slept.append((s, MODEL_LOCK.locked())), real_sleep(s)))
    frames = list(live.run(RunForm(**{**TREE, "max_new_tokens": 8}, tree_mode="unique")))
    spec = frames[-1].state["spec"]
    walked = [r for r in spec.rounds if r.tree is not None and r.tree.visits]
    steps = [k for r in walked for k in tree_ui.walk_steps(r)]
    shown = [int(m.group(1)) for f in frames if f.tree is not SKIP and f.tree and (m := WALK.search(f.tree))]
    assert len(walked) >= 2 and shown == steps  # every step of every walk, in order
    # The engine never waited for a walk: the clock moves only when slept on, so every step after the
    # first waited until decoding was over -- and those pauses were taken with the models released.
    assert slept and not any(held for _, held in slept)
    assert sum(s for s, _ in slept) >= 0.15 * (len(steps) - 1) - 0.01  # less the clock readings between steps
    # Nor is any of it on the run's recorded clock: rounds follow each other within a few readings.
    for k, r in enumerate(spec.rounds[:-1]):
        gap = spec.rounds[k + 1].t_start - r.t_end
        assert 0 <= gap < 0.01, (k, gap)
    assert spec.t_total < 0.15


def test_tree_plots_come_from_the_tree_rounds(frames):
    last = frames[-1]
    spec = last.state["spec"]
    tree_rounds = [r for r in spec.rounds if r.tree is not None]
    sizes = last.plot_tree_size.data[0]
    assert list(sizes.y) == [len(r.tree.nodes) for r in tree_rounds]
    verify = last.plot_tree_verify.data[0]
    # The first round's pass also read the prompt: the verify-time scatter leaves it out.
    assert tree_rounds[0].prompt_fed > 0 and all(not r.prompt_fed for r in tree_rounds[1:])
    assert list(verify.x) == [r.tree.fed for r in tree_rounds[1:]]
    assert list(verify.y) == [r.tree.t_forward for r in tree_rounds[1:]]


def test_step_mode_narrates_every_step_of_a_tree_round(frames):
    spec = frames[-1].state["spec"]
    i = next(k for k, r in enumerate(spec.rounds) if r.tree is not None)
    narration, body = live.step_views(spec, i + 1)
    assert 'class="sv-tree"' in body and "sv-tree-narration" in narration
    from specviz.views.tree import tree_steps
    assert narration.count("<li>") == tree_steps(spec.rounds[i])
    assert "rejected" in narration or "accepted" in narration
    # The round's own line narrates the tree (its size), not the accepted path as a chain.
    assert f"the draft model grew a token tree of {len(spec.rounds[i].tree.nodes)} node" in narration
    assert "proposed" not in narration and "draft length" not in narration
    # The mask follows the selected round.
    assert len(tree_ui.mask_for(spec, i + 1).data[0].z) == len(spec.rounds[i].tree.nodes)


def test_chain_runs_have_no_tree_panel(monkeypatch):
    monkeypatch.setattr(live, "UI_THROTTLE_S", 0.0)
    frames = list(live.run(RunForm(preset=TINY_PRESET, prompt="hello", gamma=3, max_new_tokens=6)))
    assert all(f.tree in (SKIP, "") for f in frames)
    assert frames[-1].plot_tree_size.layout.meta == {"empty": True}
    assert 'class="sv-round' in frames[-1].rounds  # chain rounds as before


def test_drafter_controls_lock_eps_and_uno_for_trees():
    ups = tree_ui.drafter_controls("tree", 0.3)
    assert ups["tree_row"]["visible"] is True
    assert ups["epsilon"]["interactive"] is False and ups["epsilon"]["value"] == 0
    assert ups["variant"]["value"] == "opt" and "chain drafters only" in ups["variant"]["info"]
    chain = tree_ui.drafter_controls("model", 0.3)
    assert chain["tree_row"]["visible"] is False and chain["epsilon"]["interactive"] is True
    assert ups["rule"]["value"] == "token" and ups["rule"]["interactive"] is False  # trees: their own rule
    block = tree_ui.drafter_controls("model", 0.3, "block")  # block and match: exact, no ε, no UNO
    assert block["epsilon"]["interactive"] is False and block["epsilon"]["value"] == 0
    assert block["variant"]["value"] == "opt" and block["rule"]["interactive"] is True
    assert tree_ui.gamma_labels("tree", tabs.gamma_slider("constant", 4))["label"] == "Tree depth γ"
    assert tree_ui.gamma_labels("model", tabs.gamma_slider("constant", 4))["label"] == "Draft length γ"


def test_api_takes_the_tree_parameters_at_the_end():
    # `request` is Gradio's (the client's session, for its cancel flag), never an API parameter
    names = [n for n in inspect.signature(api.api_trace).parameters if n != "request"]
    # appended in the order they arrived, so positional callers keep working: the tree's, target_exec, rule
    assert names[-5:] == ["branches", "tree_nodes", "tree_mode", "target_exec", "rule"]
    assert names[:-5] == ["prompt", "preset", "gamma", "epsilon", "temperature", "top_p", "max_new_tokens", "seed",
                          "variant", "standard", "drafter", "policy", "tau"]
    out = list(api.api_trace("abc abc", preset=TINY_PRESET, gamma=2, max_new_tokens=6, standard=False,
                             drafter="tree", branches=2, tree_nodes=4, tree_mode="best-first"))
    spec = trace_from_dict(out[-1]["speculative"])
    assert spec.settings.tree_nodes == 4 and spec.settings.tree_mode == "best-first"
    assert any(r.tree is not None and 1 <= len(r.tree.nodes) <= 4 for r in spec.rounds)
    with pytest.raises(gr.Error, match="chain"):
        list(api.api_trace("abc", preset=TINY_PRESET, drafter="tree", variant="uno"))


def test_tree_sweep_measures_each_size(monkeypatch):
    from specviz.experiments import sweeps
    monkeypatch.setattr(sweeps, "TREE_SIZES", (1, 4))
    out = list(tabs.tree_sweep(RunForm(preset=TINY_PRESET, prompt="hello there")))
    plots = [f.tree_plot for f in out if f.tree_plot is not SKIP]
    assert len(plots) == 2 and list(plots[-1].data[0].x) == [1, 4]
    assert all(y > 0 for y in plots[-1].data[0].y)
    assert "2 sizes measured" in out[-1].status


def test_theory_batch_curve_shows_the_last_iid_tree_runs(frames):
    spec = frames[-1].state["spec"]
    point = tree_ui.batch_point(spec)
    firsts = [r.tree.visits[0] for r in spec.rounds if r.tree is not None and r.tree.visits]
    assert point == {"M": 3, "rounds": len(firsts),
                     "rejected": sum(not any(t.accepted for t in v.tries) for v in firsts)}
    history = tree_ui.remember_batch([], {"spec": spec})
    history = tree_ui.remember_batch(history, {"spec": None})  # a chain run or no run adds nothing
    assert history == [point]
    fig = tabs.batch_view(8, 0.5, 6, 0, history)
    ours = [t for t in fig.data if t.name and "tree runs" in t.name]
    assert len(ours) == 1 and list(ours[0].x) == [3]
    assert ours[0].y[0] == pytest.approx(point["rejected"] / point["rounds"])
    assert not any("tree runs" in (t.name or "") for t in tabs.batch_view(8, 0.5, 6, 0).data)


def test_the_epsilon_sweep_refuses_the_tree_drafter_clearly():
    gen = tabs.sweep("epsilon", RunForm(**TREE))
    first = next(gen)
    assert "chain drafters only" in first.status
    with pytest.raises(gr.Error, match="chain drafters only"):
        next(gen)
