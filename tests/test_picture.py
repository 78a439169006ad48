"""The acceptance picture: its numbers in the trace (specviz.core.picture) and its figure
(specviz.views.acceptance), from real tiny runs under each rule."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from specviz.core.settings import DecodeSettings
from specviz.trace import TraceError, trace_from_json
from specviz.views._fmt import fsig_pair
from specviz.views.acceptance import acceptance_figure, position_choices
from tests.test_engine import PROMPT, make_pair
from tests.drafted import speculative_decode


@pytest.fixture(scope="module")
def pair():
    return make_pair(vocab=40)  # more tokens than a picture shows: the top-k choice matters


def _run(pair, **kw):
    return speculative_decode(pair, PROMPT, DecodeSettings(**{"gamma": 4, "temperature": 1.0, "max_new_tokens": 30,
                                                               "seed": 1, **kw}))


@pytest.mark.parametrize("rule", ["token", "block", "match"])
def test_every_judged_position_keeps_its_picture(pair, rule):
    run = _run(pair, rule=rule)
    rejected = 0
    for rnd in run.rounds:
        for pos in rnd.positions:
            pic = pos.picture
            x = rnd.draft[pos.i - 1].id
            assert x in pic.ids and len(pic.ids) <= 14 and len(set(pic.ids)) == len(pic.ids)
            j = pic.ids.index(x)
            assert math.isclose(pic.p[j], pos.p, rel_tol=1e-3, abs_tol=1e-7) and math.isclose(pic.q[j], pos.q, rel_tol=1e-3)  # 4 digits
            assert sum(pic.p) + pic.rest_p == pytest.approx(1.0, abs=2e-3) and sum(pic.res) <= 1 + 2e-3
            if rule == "token":  # the residual norm(max(0, p − q)): its mass is TV(p, q)
                for a, b, r in zip(pic.p, pic.q, pic.res):
                    assert r == pytest.approx(max(0.0, a - b) / pos.tv, rel=2e-3, abs=1e-3)
            if rule == "match":
                assert pic.res[j] == 0.0  # the target's own sample, given that it is not x
            if not pos.accepted:
                rejected += 1
                y = rnd.extra.id
                assert y in pic.ids and pic.res[pic.ids.index(y)] > 0  # drawn from the residual
    assert rejected > 2


def test_greedy_pictures_keep_both_models_temperature_1_beliefs(pair):
    run = _run(pair, temperature=0.0)
    pos = run.rounds[0].positions[0]
    pic = pos.picture
    assert sorted(pic.p)[-1] == 1.0 and sum(pic.p) == 1.0  # one-hot, as the rule sees it
    assert pic.p1 is not None and pic.q1 is not None and 0 < max(pic.p1) < 1 and 0 < max(pic.q1) < 1
    fig = acceptance_figure(run, run.rounds[0], 0)
    assert "temperature-1 beliefs" in fig.layout.title.text
    assert any(t.name == "greedy's one-hot picks" for t in fig.data)


def test_the_subtitle_has_room_above_the_plot_and_the_card_follows_the_page_theme(pair):
    """Every line of the subtitle fits in the top margin (it was drawn over the y ticks and the bars), and the
    figure is transparent with the page's font colour (it stayed a white card in dark mode)."""
    run = _run(pair)
    for rnd in run.rounds[:4]:
        for k in range(len(rnd.positions)):
            fig = acceptance_figure(run, rnd, k)
            lines = fig.layout.title.text.count("<br>")  # the title, then the subtitle's lines
            assert lines >= 2 and fig.layout.margin.t >= 66 + 17 * lines, (lines, fig.layout.margin.t)
            assert fig.layout.paper_bgcolor == fig.layout.plot_bgcolor == "rgba(0,0,0,0)"
            assert fig.layout.font.color not in (None, "#111827", "black")


def test_the_figure_says_accepted_or_rejected_and_marks_the_correction(pair):
    run = _run(pair)
    rnd = next(r for r in run.rounds if r.positions and not r.positions[-1].accepted)
    fig = acceptance_figure(run, rnd, len(rnd.positions) - 1)
    pos = rnd.positions[-1]
    su, sb = fsig_pair(pos.u, pos.b)  # significant digits: a tiny b is not rounded to 0.000
    assert fig.layout.xaxis2.title.text.startswith(f"u = {su} ≥ b = {sb}: rejected")
    ticks = fig.layout.xaxis.ticktext
    # one glyph per meaning: ◆ the drafted token, ↻ the correction (as on the chips); ★ is the chips' bonus only
    assert any(t.startswith("↻") or t.startswith("◆ ↻") for t in ticks) and any(t.startswith("◆") for t in ticks)
    assert not any("★" in t or "⟲" in t for t in ticks)
    names = [t.name for t in fig.data]
    assert "overlap min(p, q)" in names and any(n.startswith("correction drawn from: residual") for n in names)
    assert f"{1 - pos.tv:.3f}" in fig.layout.title.text  # β = 1 − TV
    choices = position_choices(rnd)
    assert [j for _, j in choices] == list(range(len(rnd.positions))) and choices[-1][0].endswith("rejected")


def test_pictures_survive_a_recording_and_bad_ones_are_refused(pair):
    run = _run(pair, rule="block")
    back = trace_from_json(run.to_json())
    assert back.rounds[0].positions[0].picture == run.rounds[0].positions[0].picture
    doc = json.loads(run.to_json())
    doc["rounds"][0]["positions"][0]["picture"]["p"].append(0.1)  # lists out of step
    with pytest.raises(TraceError, match="same number"):
        trace_from_json(json.dumps(doc))
    old = dataclasses.replace(run.rounds[0], positions=[dataclasses.replace(p, picture=None)
                                                        for p in run.rounds[0].positions])
    assert "predates" in acceptance_figure(run, old, 0).layout.annotations[0].text


def test_the_step_picker_picks_the_last_judged_position(pair):
    from specviz.ui import picture_ui

    run = _run(pair)
    radio, fig = picture_ui.for_step({"spec": run}, 1)
    assert radio.value == len(run.rounds[0].positions) - 1 and radio.visible
    assert picture_ui.for_position({"spec": run}, "nonsense", "x").layout.title.text.startswith("The acceptance")
    radio, _ = picture_ui.for_step(None, 1)
    assert radio.visible is False


def test_every_child_a_tree_tried_keeps_its_picture_with_r_after_a_rejection(pair):
    from specviz.trace import trace_from_json

    run = speculative_decode(pair, PROMPT, DecodeSettings(drafter="tree", tree_mode="iid", branches=3, gamma=3,
                                                          temperature=1.0, max_new_tokens=30, seed=2))
    later = 0
    for rnd in [r for r in run.rounds if r.tree is not None]:
        flat = [(k, j) for k, vis in enumerate(rnd.tree.visits) for j in range(len(vis.tries))]
        assert [n for _, n in position_choices(rnd)] == list(range(len(flat)))
        for n, (k, j) in enumerate(flat):
            t = rnd.tree.visits[k].tries[j]
            pic = t.picture
            x = rnd.tree.nodes[t.node].id
            assert x in pic.ids and pic.q[pic.ids.index(x)] == pytest.approx(t.q, rel=1e-3)
            assert pic.r[pic.ids.index(x)] == pytest.approx(t.r, rel=1e-3, abs=1e-6)
            if j == 0:
                assert pic.r == pic.p  # the first child is judged against p itself
            else:
                later += 1
                prev = rnd.tree.visits[k].tries[j - 1].picture  # r moved on: the last try's residual
                common = [i for i in pic.ids if i in prev.ids]
                for i in common:
                    assert pic.r[pic.ids.index(i)] == pytest.approx(prev.res[prev.ids.index(i)], rel=2e-3, abs=1e-4)
            fig = acceptance_figure(run, rnd, n)
            assert fig.layout.xaxis2.title.text.startswith(f"u = {fsig_pair(t.u, t.b)[0]} ")
            assert ("after a rejection" in fig.layout.title.text) == (j > 0)
            assert "overlap min(r, q)" in [tr.name for tr in fig.data]
    assert later > 0  # the test saw children tried after a rejection
    back = trace_from_json(run.to_json())
    assert back.rounds[0].tree.visits[0].tries[0].picture == run.rounds[0].tree.visits[0].tries[0].picture


def _certain_position_trace(reject_prob: float, accepted: bool = True):
    """One round whose first position has p ≈ q ≈ 1 on the drafted token: the recorded residual is rounding
    noise normalised into a distribution (0.977 on the drafted token itself)."""
    from specviz.trace import Picture
    from tests.synthetic import make_trace

    tr = make_trace(plan=[dict(accept=1, extra="correction", draft=2)])
    rnd = tr.rounds[0]
    x = rnd.draft[0].id
    pos = rnd.positions[0]
    pos.p, pos.q, pos.b, pos.tv, pos.reject_prob = 0.99998, 0.99996, 1.0, reject_prob, reject_prob
    pos.u, pos.accepted = (0.4, True) if accepted else (0.99999, False)
    pos.picture = Picture(ids=[x, 5, 6], text=["x", "a", "b"], p=[0.99998, 1e-5, 1e-5], q=[0.99996, 2e-5, 2e-5],
                          res=[0.977, 0.012, 0.011], rest_p=0.0, rest_q=0.0)
    return tr


def _residual_bars(fig):
    return [t for t in fig.data if (t.name or "").startswith("correction drawn from")]


def test_no_correction_can_happen_where_p_and_q_agree():
    """β = 1.000 and the "correction drawn from residual" bar showed 0.977 on the drafted token: rounding
    noise drawn as a distribution.  Below a tiny rejection chance the picture says no correction can happen."""
    from specviz.views.acceptance import NO_CORRECTION, correction_possible

    assert not correction_possible(2e-5) and not correction_possible(0.0) and correction_possible(0.01)
    assert NO_CORRECTION <= 1e-3
    tr = _certain_position_trace(2e-5)
    fig = acceptance_figure(tr, tr.rounds[0], 0)
    assert not _residual_bars(fig)
    notes = " ".join(a.text for a in fig.layout.annotations)
    assert "no correction can happen here" in notes and "2.00e-05" in notes
    # A position where a rejection is possible keeps its residual bars, and says nothing of the kind.
    tr = _certain_position_trace(0.05)
    fig = acceptance_figure(tr, tr.rounds[0], 0)
    assert len(_residual_bars(fig)) == 1
    assert "no correction" not in " ".join(a.text for a in fig.layout.annotations)
    # The position where the correction was drawn always shows what it was drawn from.
    tr = _certain_position_trace(2e-5, accepted=False)
    tr.rounds[0].positions = tr.rounds[0].positions[:1]
    tr.rounds[0].extra.id = 5
    fig = acceptance_figure(tr, tr.rounds[0], 0)
    assert len(_residual_bars(fig)) == 1


@pytest.mark.parametrize("rule", ["token", "block", "match"])
@pytest.mark.parametrize("with_beliefs", [True, False])
def test_a_greedy_round_reads_its_one_hot_q_only_where_a_picture_needs_it(rule, with_beliefs):
    """Under greedy decoding the engine passes q as None (one-hot at the drafts, never made as [k, V] zeros): every
    picture is the one the materialised one-hot q gives, with beliefs and without, under each rule."""
    import torch

    from specviz.core.picture import _one_hot, pictures

    gen = torch.Generator().manual_seed(3)
    k, vocab = 5, 300
    logits = torch.randn(k + 1, vocab, generator=gen) * 3
    best = logits.argmax(-1)
    p_all = torch.zeros(k + 1, vocab)
    p_all[torch.arange(k + 1), best] = 1.0
    tokens = [int(best[0]), int(best[1]), 7, int(best[3]), 11]  # accepted, accepted, a rejection, ...
    p1 = torch.softmax(logits, -1)
    q1 = [torch.softmax(torch.randn(vocab, generator=gen), -1) if with_beliefs and i != 2 else None for i in range(k)]
    kw = dict(tokens=tokens, n_judged=3, p_all=p_all, rule=rule, variant="opt", emitted=int(best[2]),
              piece=str, p1=p1, q1=q1)
    assert pictures(q=None, **kw) == pictures(q=_one_hot(tokens, p_all), **kw)
