"""What the page shows for chain and tree runs, and the parts of presenter mode a unit test can see
(issue 22, parts 3 and 5).  The browser checks are in tests/test_present_browser.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specviz.core import engine
from specviz.core.settings import DecodeSettings
from specviz.models import encode_prompt
from specviz.models.tiny import build_tiny_pair
from tests import drafted
from specviz.trace import load_recording
from specviz.ui import links, live

ROOT = Path(__file__).resolve().parents[1]
RECORDINGS = sorted((ROOT / "assets" / "traces").glob("*.json"))
EXAMPLES = json.loads((ROOT / "assets" / "examples.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def tree_run():
    pair = build_tiny_pair()
    ids = encode_prompt(pair, "hello there")
    s = DecodeSettings.checked(gamma=3, max_new_tokens=12, temperature=1.0, seed=2, drafter="tree", branches=2,
                               tree_nodes=6, tree_mode="iid")
    return drafted.speculative_decode(pair, ids, s, prompt="hello there"), engine.standard_decode(pair, ids, s,
                                                                                                prompt="hello there")


def test_chain_runs_hide_the_tree_parts_and_tree_runs_show_them(tree_run):
    chain = live.show_recording(*load_recording(RECORDINGS[0].read_bytes()), "Loaded")
    assert chain.tree_mask_box == {"__type__": "update", "visible": False}
    assert chain.tree_plots == {"__type__": "update", "visible": False}
    tree = live.show_recording(*tree_run, "Loaded")
    assert tree.tree_mask_box["visible"] is True and tree.tree_plots["visible"] is True
    assert tree.plot_tree_size.layout.meta != {"empty": True}  # and they have something to show


@pytest.mark.parametrize("value, on", [("1", True), ("true", True), ("yes", True), ("on", True), ("", False),
                                       ("0", False), ("no", False), ("<b>", False)])
def test_the_present_flag(value, on):
    link = links.parse_link({"present": value, "recording": RECORDINGS[1].stem}, examples=EXAMPLES,
                            recordings=RECORDINGS)
    assert link.present is on and link.recording == RECORDINGS[1]
    if value in ("", "0", "no", "1", "true", "yes", "on"):
        assert not link.notes
    else:
        assert "present" in link.note and "<" not in link.note  # a value it cannot read: a plain note


def test_the_present_flag_alone_and_a_link_query_keeps_it():
    assert links.parse_link({"present": "1"}, examples=EXAMPLES, recordings=RECORDINGS).present
    assert not links.parse_link({}, examples=EXAMPLES, recordings=RECORDINGS).present
    spec, _ = load_recording(RECORDINGS[0].read_bytes())
    q = links.link_query(spec, 3, examples=EXAMPLES, recordings=RECORDINGS, present=True)
    assert q.endswith("&present=1") and "round=3" in q
    assert "present" not in links.link_query(spec, 3, examples=EXAMPLES, recordings=RECORDINGS)


# ---- the charts' layout and legibility (issue 65) --------------------------------------------------------------


def test_step_events_draw_no_processing_overlay():
    """Each step (the four buttons, the round's views) has Gradio's show_progress hidden: the narration no longer
    fades under a "processing" overlay at every step (it flickered on a projector)."""
    import app
    from specviz.ui import present

    assert present.QUIET == {"show_progress": "hidden"}
    demo = app.build()
    ids = {b.elem_id: i for i, b in demo.blocks.items() if getattr(b, "elem_id", None)}
    steps = {ids[e] for e in ("sv-step", "sv-prev", "sv-next", "sv-first", "sv-last")}
    deps = [d for d in demo.config["dependencies"] if d.get("backend_fn") and any(t[0] in steps for t in d["targets"])]
    assert len(deps) == 5 and {d["show_progress"] for d in deps} == {"hidden"}, [(d["targets"], d["show_progress"])
                                                                                for d in deps]
    narration = ids["sv-narration"]
    assert any(narration in d["outputs"] for d in deps)  # the round's views are among them


def test_a_compact_charts_legend_sits_at_its_foot_under_the_x_axis_title():
    """"Draft length per round": the legend was anchored to the plot (y = -0.2 of its height) and sat on the x-axis
    title of a chart whose subtitle took three lines; it now hangs from the figure's foot, below the title's room."""
    from specviz.views import plots as P
    from specviz.views.figures import compact_layout

    spec, _ = load_recording(RECORDINGS[1].read_bytes())
    for fig in (P.draft_lengths(spec), P.acceptance_by_position(spec), P.tokens_per_round_hist(spec)):
        lg = fig.layout.legend
        assert (lg.yref, lg.yanchor, lg.y) == ("container", "bottom", 0.01), fig.layout.title.text
        assert fig.layout.margin.b >= 100  # the x-axis title (~50 px under the plot) and two legend lines
    assert compact_layout(P.go.Figure(), "t", legend=False).layout.margin.b < 100


def test_the_pictures_token_labels_have_room_above_the_u_bar():
    """On a phone the token labels under the bars stand upright: the gap above the u-vs-b bar holds the longest
    (8 px a character), the bars and the u-vs-b bar keep their heights."""
    from specviz.views import acceptance as A
    from specviz.ui import picture_ui

    for rec in RECORDINGS[:3]:
        spec, std = load_recording(rec.read_bytes())
        for i in (1, 2, 3):
            fig = picture_ui.for_step({"spec": spec, "std": std}, i)[1]
            if fig.layout.meta == {"empty": True}:
                continue
            L = fig.layout
            plot = L.height - L.margin.t - L.margin.b
            gap = (L.yaxis.domain[0] - L.yaxis2.domain[1]) * plot
            longest = max(len(t) for t in L.xaxis.ticktext)
            assert gap >= 24 + A.TICK_CHAR_PX * longest - 0.5 and gap >= A.GAP_PX - 0.5, (rec.stem, i, gap, longest)
            assert (L.yaxis2.domain[1] - L.yaxis2.domain[0]) * plot == pytest.approx(0.2 * A.ROWS_PX, abs=0.5)
            assert (L.yaxis.domain[1] - L.yaxis.domain[0]) * plot == pytest.approx(0.8 * A.ROWS_PX, abs=0.5)
    assert A.gap_px(["short"]) == A.GAP_PX and A.gap_px(["◆ ↻ ·abcdefghij"]) == 24 + 8 * 15


@pytest.mark.parametrize("g_opt, line_x, where", [
    (6, 4.45, "top right"),   # the chart: the line left of the star, the label right of it
    (6, 6.0, "top right"),    # the line through the star: under the star, not the label
    (9, 10.5, "top left"),    # the line right of the star
    (12, 3.0, "top left"),    # the star near the right edge: left, the line far enough
    (12, 10.0, None),         # no clear side: no label (the subtitle names γ*)
    (4, 6.0, None),
    (6, None, "top center"), (15, None, "top left"),
])
def test_the_optimal_gammas_label_sits_away_from_the_mean_draft_length_line(g_opt, line_x, where):
    from specviz.views import theory_plots as TP

    assert TP.star_label_position(g_opt, 16, line_x) == where
    if where is None or line_x is None:
        return
    reach = 8  # half the plot: the label on a 400 px phone
    lo, hi = (g_opt + TP.STAR_CLEAR, g_opt + reach) if where == "top right" else (g_opt - reach, g_opt - TP.STAR_CLEAR)
    assert not lo <= line_x <= hi and 0.5 <= lo and hi <= 16.5


def test_the_theory_charts_label_and_line_as_drawn():
    from specviz.views import theory_plots as TP

    fig = TP.speedup_curves(0.88, 0.395, 16, {"alpha": 0.88, "c": 0.395, "gamma": 5, "speedup": 1.03,
                                              "draft_len": 4.45}, v=2.24)
    star = next(t for t in fig.data if t.name == "optimal γ")
    assert star.textposition == "top right" and star.text[0].startswith("γ*=")
    (line,) = [s for s in fig.layout.shapes if s.type == "line" and s.x0 == 4.45]
    assert star.x[0] > line.x0
    fig = TP.speedup_curves(0.88, 0.395, 16, {"alpha": 0.88, "c": 0.395, "gamma": 5, "speedup": 1.03,
                                              "draft_len": 8.0}, v=2.24)
    star = next(t for t in fig.data if t.name == "optimal γ")
    assert star.text is None and star.mode == "markers"  # nowhere clear of the line: the subtitle says it
    assert "optimal γ* = 6" in fig.layout.title.subtitle.text


def _pareto_boxes(fig):
    from specviz.views import theory_plots as TP

    lo, hi = fig.layout.xaxis.range
    span = hi - lo
    boxes = []
    for t in fig.data:
        if t.mode != "markers+text":
            continue
        for x, y, text, where in zip(t.x, t.y, t.text, t.textposition):
            if text:
                boxes.append((text, TP.label_box((x - lo) / span * TP.PHONE_PLOT[0], (y - lo) / span * TP.PHONE_PLOT[1],
                                                 text, where)))
    return boxes, (lo, span)


@pytest.mark.parametrize("crowded", [False, True])
def test_the_pareto_charts_labels_are_apart_clear_of_the_front_and_inside(crowded):
    """"ε=0.2ε=0.2": OPT's and UNO's labels of one ε overlapped, and "ε=0" ran off a phone's plot.  Each ε is
    named once per place, no two labels overlap, none crosses the front or leaves the plot (its right margin
    excepted), at the size of a 400 px phone's plot (wider screens only spread the points)."""
    from specviz.ui import shootout_ui
    from specviz.views import theory_plots as TP

    if crowded:  # OPT on the front, UNO just above it, at five ε close together
        pts = [dict(epsilon=e, variant=v, reject_prob=r, bias=b, tv=1.0) for e, r in
               ((0, 1.0), (0.05, 0.8), (0.1, 0.62), (0.2, 0.45), (0.4, 0.3), (1, 0.0))
               for v, b in (("opt", 1 - r), ("uno", 1 - r + 0.06))]
        fig = TP.pareto_plot(None, pts)
    else:
        fig = shootout_ui.recorded_frame().pareto
    boxes, (lo, span) = _pareto_boxes(fig)
    names = [t for t, _ in boxes]
    assert set(names) == {t for tr in fig.data if tr.mode == "markers+text" for t in tr.hovertext}
    for i, (a, ba) in enumerate(boxes):
        assert ba[0] >= 0 and ba[1] >= 0 and ba[3] <= TP.PHONE_PLOT[1] and ba[2] <= TP.PHONE_PLOT[0] + TP.RIGHT_ROOM, a
        for b, bb in boxes[i + 1:]:
            assert TP._overlap(ba, bb) == 0, (a, b)
        # the front x + y = 1 (fractions of TV): no label box holds a point of it
        for k in range(201):
            fx = k / 200
            px, py = (fx - lo) / span * TP.PHONE_PLOT[0], (1 - fx - lo) / span * TP.PHONE_PLOT[1]
            assert not (ba[0] < px < ba[2] and ba[1] < py < ba[3]), (a, fx)
    if not crowded:
        assert len(names) < sum(len(t.x) for t in fig.data if t.mode == "markers+text")  # a pair shares its label
