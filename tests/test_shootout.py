"""The drafter shoot-out (engine side and Sweeps tab), the recorded sweeps shown at page load, the
draft-heads section of "How it works" and the learned head's stages in the token tooltips."""

from __future__ import annotations

import re

import json
from dataclasses import replace
from pathlib import Path

import pytest

from specviz.core.settings import DecodeSettings
from specviz.drafters import DRAFTERS
from specviz.experiments import recorded, shootout
from specviz.models import TINY_PRESET
from specviz.models.tiny import build_tiny_pair
from specviz.serving.replay import GATE
from specviz.serving.service import prepare
from specviz.trace import DraftToken, Position, Round
from specviz.ui import shootout_ui
from specviz.ui.form import RunForm
from specviz.ui.frames import SKIP
from specviz.views import chips, heads
from specviz.views import shootout as SV

ASSET = recorded.DEFAULT_PATH


def test_the_lineup_is_every_drafter_then_standard_all_exact():
    base = DecodeSettings.checked(gamma=20, policy="adaptive", epsilon=0.3, variant="uno", tau=0.25, max_new_tokens=9)
    line = shootout.lineup(base)
    assert [c.key for c in line] == [*DRAFTERS, shootout.STANDARD]
    by = {c.key: c.settings for c in line}
    assert all(s.epsilon == 0.0 and s.variant == "opt" and s.max_new_tokens == 9 for s in by.values())
    assert by["model"].policy == shootout.CHAIN_POLICY and by["model"].gamma == 20 and by["model"].tau == 0.25
    assert shootout.CHAIN_POLICY in next(c.label for c in line if c.key == "model")  # the table says which policy
    d = DecodeSettings()
    tree = by["tree"]
    assert (tree.policy, tree.branches, tree.tree_nodes, tree.tree_mode) == (shootout.TREE_POLICY, d.branches,
                                                                             d.tree_nodes, d.tree_mode)
    assert tree.gamma == 20  # the maximum depth: the form's γ, as the chain's
    assert shootout.TREE_POLICY in next(c.label for c in line if c.key == "tree")
    for s in by.values():  # every contender's settings pass the checks a run applies
        assert DecodeSettings.checked(**s.as_dict()) == s


@pytest.fixture(scope="module")
def rows():
    pair = build_tiny_pair()
    req = prepare(pair, "a b a b a b a", max_new_tokens=10, gamma=3)
    steps = list(shootout.run(req, repeats=1))  # one run each: the rows are that run's (tests/test_sweep_repeats.py: more)
    assert [round(f, 2) for f, _, _ in steps][-1] == 1.0
    return steps[-1][2]


def test_the_shootout_runs_every_drafter_that_can_and_says_why_not(rows):
    assert [r.key for r in rows] == [*DRAFTERS, shootout.STANDARD]
    by = {r.key: r for r in rows}
    std = by["standard"]
    assert not std.error and std.tokens == 10 and std.target_forwards == 10 and std.speedup == 1.0
    for key in ("model", "prompt-lookup", "tree"):
        r = by[key]
        assert not r.error, r.error
        assert r.trace.kind == "speculative" and r.trace.settings.drafter == key  # the trace is kept
        assert 0.0 <= r.alpha <= 1.0 and r.mean_accepted_length >= 1.0 and r.c is not None and r.c >= 0
        assert r.tokens == 10 and r.target_forwards < 10 + 1
        assert r.speedup == pytest.approx(r.tokens_per_s / std.tokens_per_s)
        assert r.same_text is True  # greedy, fp32: exactly the target's text
        s = r.trace.summary()
        assert r.alpha == s.alpha and r.mean_accepted_length == s.mean_accepted_length
    assert by["model"].policy == shootout.CHAIN_POLICY
    head = by["speculator"]  # no trained head for the tiny target: a row that says so
    assert head.trace is None and head.tokens_per_s is None and "No trained speculator" in head.error
    assert json.dumps([r.as_dict() for r in rows])  # the rows are plain JSON (the recording)


def test_the_table_and_chart_show_the_rows(rows):
    dicts = SV.rows_of(rows)
    table = SV.table_html(dicts, "caption")
    assert table.count("<tr data-key=") == len(rows) and 'data-key="speculator" data-error="1"' in table
    assert "did not run: No trained speculator" in table and "confidence" in table
    fig = SV.chart(dicts)
    bars = [t for t in fig.data if t.type == "bar"]
    assert len(bars) == len(SV.METRICS)
    assert list(bars[0].y) == ["draft model", "prompt lookup", "token tree", "model + lookup", "standard"]  # no head
    assert "did not run: learned head" in fig.layout.title.subtitle.text
    empty = SV.chart([])
    assert not empty.data and "run a drafter shoot-out" in empty.layout.annotations[0].text


def test_the_sweeps_tab_runs_the_shootout_and_shows_a_run_on_the_live_tab():
    frames = list(shootout_ui.shootout(RunForm(preset=TINY_PRESET, prompt="hello hello", max_new_tokens=6, gamma=2)))
    assert not GATE.lock.locked()  # the gate was left
    assert any(f.shootout_table is not SKIP and 'data-rows="2"' in f.shootout_table for f in frames)  # it streams
    last = frames[-1]
    assert "done: 5 of 6 ran" in last.status
    runs = last.shootout_runs
    assert len(runs) == 4 and all("learned head" not in k for k in runs)
    label = next(k for k in runs if k.startswith("prompt lookup"))
    shown = shootout_ui.show_run(runs, label)
    assert shown.state.get("spec").settings.drafter == "prompt-lookup" and shown.state.get("std").kind == "standard"
    assert shown.export and Path(shown.export).exists() and "Shoot-out run" in shown.status
    assert 'data-kind="warn"' in shootout_ui.show_run({}, "nothing").status


def test_the_shootout_refuses_bad_input_clearly():
    import gradio as gr

    gen = shootout_ui.shootout(RunForm(preset=TINY_PRESET, prompt="   "))
    assert "did not start" in next(gen).status
    with pytest.raises(gr.Error):
        next(gen)
    assert not GATE.lock.locked()


def test_the_shipped_recording_renders_without_a_model(monkeypatch):
    import specviz.models.loading as loading

    def no_models(*a, **k):
        raise AssertionError("the recorded view must not load models")
    monkeypatch.setattr(loading, "load_pair", no_models)
    rec = recorded.load(ASSET)
    assert rec.gamma and rec.epsilon and rec.shootout and rec.machine and rec.date
    # recorded before the hybrid drafter existed: every row it has is a drafter's (or standard decoding's)
    assert {"model", "prompt-lookup", "tree", "speculator", "standard"} <= {r.key for r in rec.shootout} <= {*DRAFTERS, "standard"}
    frame = shootout_ui.recorded_frame(ASSET)
    when = rec.when()
    assert when.startswith("recorded on ") and when in frame.status
    for fig in (frame.gamma_plot, frame.eps_plot, frame.pareto, frame.shootout_plot):
        plain = re.sub(r"<[^>]+>", " ", fig.layout.title.subtitle.text)  # wrapped for phones: tags between lines
        assert " ".join(when.split()) in " ".join(plain.split())  # every figure is marked
    assert len([t for t in frame.gamma_plot.data if (t.name or "").startswith("measured")]) == 1  # the points
    assert frame.shootout_table.count("<tr data-key=") == len(rec.shootout) and when in frame.shootout_table
    assert frame.shootout_runs is SKIP and frame.shootout_pick is SKIP  # no traces; no components built here
    assert len(recorded.parse(rec.to_json()).gamma) == len(rec.gamma)  # written compactly, reads back


@pytest.mark.parametrize("edit, where", [
    (lambda d: d["gamma"][1].update(alpha=1.7), "gamma.1.alpha"),
    (lambda d: d["shootout"][0].update(tokens_per_s="fast"), "shootout.0.tokens_per_s"),
    (lambda d: d.update(schema="something else"), "not a recording of sweeps"),
    (lambda d: d.pop("machine"), "machine"),
])
def test_a_broken_recording_gives_a_clear_message(tmp_path, edit, where):
    data = json.loads(ASSET.read_text(encoding="utf-8"))
    edit(data)
    bad = tmp_path / "sweeps.json"
    bad.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(recorded.RecordedError, match=where.replace(".", r"\.")):
        recorded.load(bad)
    frame = shootout_ui.recorded_frame(bad)
    assert "No recorded sweeps to show (sweeps.json:" in frame.status and where in frame.status
    assert frame.gamma_plot is not SKIP and frame.shootout_table is not SKIP  # empty views, not a crash


def test_the_recorded_gamma_sweep_says_which_gammas_it_has(tmp_path):
    """The Sweeps tab said γ = 1…12 over a recording of γ = 1–6, 8, 10, 12: the recorded status names
    the γ values in the data, and the tab's introduction the ones a sweep runs (sweeps.GAMMAS)."""
    from specviz.experiments import sweeps
    from specviz.ui.tabs import SWEEPS_INTRO, sweep_frame
    from specviz.views._fmt import ranges_text

    assert ranges_text([12, 1, 2, 3, 4, 5, 6, 8, 10]) == "1–6, 8, 10, 12"
    assert ranges_text(range(1, 13)) == "1–12" and ranges_text([2, 3, 7]) == "2, 3, 7" and ranges_text([]) == "none"
    data = json.loads(ASSET.read_text(encoding="utf-8"))
    shipped = ranges_text(r["gamma"] for r in data["gamma"] if r["gamma"] > 0)
    assert f"γ sweep at γ = {shipped}" in shootout_ui.recorded_frame(ASSET).status
    data["gamma"] = [r for r in data["gamma"] if r["gamma"] in (0, 1, 2, 3, 5, 9)]
    path = tmp_path / "sweeps.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    assert "γ sweep at γ = 1–3, 5; ε sweep on “Translate into French" in shootout_ui.recorded_frame(path).status
    assert f"The γ sweep runs γ = {ranges_text(sweeps.GAMMAS)} and standard decoding;" in SWEEPS_INTRO
    assert "median of its rounds" in SWEEPS_INTRO and "min–max error bars" in SWEEPS_INTRO
    assert "…" not in SWEEPS_INTRO
    # A sweep's own status names the points it measured (one cut short by its time limit has fewer).
    rows = [{"gamma": g, "alpha": 0.5, "c": 0.1} for g in (0, 1, 2, 4)]
    assert sweep_frame("gamma", rows, "done").status.endswith("measured at γ = 1, 2, 4")


def test_unreadable_recordings_are_refused_too(tmp_path):
    bad = tmp_path / "sweeps.json"
    bad.write_text("{not json", encoding="utf-8")
    assert "not JSON" in shootout_ui.recorded_frame(bad).status
    assert "cannot read" in shootout_ui.recorded_frame(tmp_path / "missing.json").status


def test_how_it_works_reads_the_card_and_the_recording():
    card = heads.read_card()
    assert card is not None
    rec = recorded.load(ASSET)
    text = heads.draft_heads_markdown(card, rec)
    assert "2–3×" in text and "Wertheimer" in text
    # The target's own held-out answers, where the card has them (what a run meets); else held-out text.
    own = card["heldout"]["answers"]
    assert f"{own['top1'][0]:.0%}" in text and "own held-out answers" in text and f"{card['model']['params']:,}" in text
    old = {**card, "heldout": {k: v for k, v in card["heldout"].items() if k != "answers"}}
    older = heads.draft_heads_markdown(old, rec)
    assert f"{card['heldout']['top1'][0]:.0%}" in older and "On held-out text" in older
    head = next(r for r in rec.shootout if r.key == "speculator")
    if not head.error:
        assert f"{head.speedup:.2f}×" in text and rec.when() in text
    assert "Wertheimer" in heads.draft_heads_markdown(None, None)  # no card, no recording: the paper only
    no_head = rec.model_copy(update={"shootout": [r for r in rec.shootout if r.key != "speculator"]})
    assert "Run the drafter shoot-out" in heads.draft_heads_markdown(card, no_head)


def _round(n: int) -> Round:
    draft = [DraftToken(10 + i, f"t{i}", 0.5, 0.5) for i in range(n)]
    pos = [Position(i + 1, 0.5, 0.6, 1.0, 0.1, True, 0.2, 0.1, 0.0) for i in range(n - 1)]
    pos.append(Position(n, 0.5, 0.1, 0.2, 0.9, False, 0.2, 0.4, 0.0))
    return Round(0, 0, draft=draft, positions=pos)


def test_hover_says_which_stage_of_the_learned_head_proposed_each_token():
    rnd = _round(3)
    html = chips.round_html(rnd, 4, drafter="speculator")
    for stage in range(3):
        assert f"stage {stage} of the learned head" in html
    assert "stage 3 of" not in html
    pending = chips.round_html(replace(rnd, positions=[]), 4, pending=True, drafter="speculator")
    assert "Proposed by stage 2 of the learned head" in pending
    assert "learned head" not in chips.round_html(rnd, 4, drafter="model")
