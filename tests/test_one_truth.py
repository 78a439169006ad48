"""One truth per quantity (issue 65): every panel gives the same v, speedup and best γ for a run, and every
sentence fits the run it describes.

Each shipped recording, and variants of them (sampled, ε > 0, stopped, flagged as timed on a busy machine), is
drawn by every panel that quotes a derived figure -- the race headline, the metrics table, the speedup bars, the
Theory tab (after "Use last run"), This machine, the exported page, the challenges and the class point -- and the
figures each panel states are read back and compared with `specviz.theory.figures.run_figures`, the one
function that computes them.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import replace
from html import unescape
from pathlib import Path

import pytest

from specviz.experiments.challenge_runs import Run, speedup as challenge_speedup
from specviz.theory.costs import steps
from specviz.theory.figures import best_gamma, run_figures
from specviz.theory.formulas import optimal_gamma
from specviz.trace import load_recording
from specviz.trace.timing import Timing
from specviz.views import html as V
from specviz.views.race_words import sampling_note, settings_note

ROOT = Path(__file__).resolve().parents[1]
TRACES = sorted((ROOT / "assets" / "traces").glob("*.json"))
EXAMPLES = json.loads((ROOT / "assets" / "examples.json").read_text(encoding="utf-8"))
BUSY = "passes that fed the same tokens varied by ±30%: other work on the machine stretched some of them"


def shipped(name: str):
    path = next(p for p in TRACES if p.stem.startswith(name))
    return load_recording(path.read_bytes())


def flagged(spec, std, *, predicted: float | None = 0.87, v_probe: float = 2.61, c_probe: float = 0.42):
    """The race as if timed on a busy machine: its clocks flagged, the probe's costs and counts beside them."""
    spec, std = copy.deepcopy(spec), copy.deepcopy(std)
    spec.timing = std.timing = replace(spec.timing or Timing(), reliable=False, spread=0.3, why=BUSY,
                                       predicted=predicted, v_probe=v_probe, c_probe=c_probe)
    return spec, std


def biased(spec, std, eps: float = 0.3):
    spec = copy.deepcopy(spec)
    spec.settings = replace(spec.settings, epsilon=eps)
    return spec, std


def stopped(spec, std):
    """Stop pressed mid-race: both sides cut after a few rounds."""
    spec, std = copy.deepcopy(spec), copy.deepcopy(std)
    spec.rounds, std.rounds = spec.rounds[:3], std.rounds[:5]
    spec.stop_reason = std.stop_reason = "stopped"
    spec.t_total, std.t_total = spec.rounds[-1].t_end, std.rounds[-1].t_end
    return spec, std


RACES = {
    "greedy": lambda: shipped("1-code"),
    "sampled": lambda: shipped("3-translation"),
    "lost": lambda: shipped("4-slow"),
    "epsilon": lambda: biased(*shipped("3-translation")),
    "stopped": lambda: stopped(*shipped("2-chat")),
    "flagged": lambda: flagged(*shipped("5-code")),
    "flagged, no counts": lambda: flagged(*shipped("2-chat"), predicted=None),
}


def _cell(metrics: str, name: str) -> str:
    m = re.search(rf">{re.escape(name)}</th><td[^>]*>([^<]*)<", metrics)
    assert m, f"no {name!r} row"
    return unescape(m.group(1))


def panels(spec, std) -> dict[str, dict[str, object]]:
    """What each panel states of the run: {panel: {"v": text, "speedup": float or None, "best": γ*}}."""
    from specviz.ui import machine_ui
    from specviz.ui.tabs import theory_views, use_last_run
    from specviz.views import race_plots as RP
    from specviz.views.export_page import export_page

    state = {"spec": spec, "std": std}
    fig = run_figures(spec, std)
    out: dict[str, dict[str, object]] = {}

    race = V.race_html(spec, std)
    head = re.search(r'<div class="sv-speedup [^"]*"([^>]*)>', race)
    attrs = dict(re.findall(r'data-([a-z]+)="([^"]*)"', head.group(1))) if head else {}
    theory_v = re.search(r"verify cost \(([\d.]+) steps\)", unescape(race))
    out["headline"] = {"v": attrs.get("v", theory_v.group(1) if theory_v else None),
                       "speedup": float(attrs["speedup"]) if "speedup" in attrs else None}
    if theory_v:
        assert theory_v.group(1) == attrs.get("v")  # the theory line and the attribute: one v

    metrics = V.metrics_html(spec, figures=fig)
    v_cell, sp_cell, best_cell = _cell(metrics, "Verify factor v"), _cell(metrics, "Speedup"), _cell(metrics, "Best γ")
    sp = re.fullmatch(r"≈?([\d.]+)×", sp_cell)
    best = re.match(r"γ\* = (\d+)", best_cell)
    out["metrics"] = {"v": v_cell.removesuffix(" standard steps") if v_cell not in ("—", "unknown") else None,
                      "speedup": float(sp.group(1)) if sp else None, "best": int(best.group(1)) if best else None}

    bars = RP.speedup_bars(spec, std).layout.meta
    out["bars"] = {"v": steps(bars["v"]) if bars["v"] is not None else None, "speedup": bars["measured"]}

    alpha, gamma, c, v = use_last_run(state)
    note = theory_views(alpha, gamma, c, 0.05, state, v).note
    line = note.split("Last run: ", 1)[1]
    tv = re.search(r"a verify pass = ([\d.]+) standard steps", line)
    tsp = re.search(r"speedup ≈?([\d.]+)×", line)
    tbest = re.search(r"γ\\\* = (\d+)", line)
    out["theory"] = {"v": tv.group(1) if tv else None, "speedup": float(tsp.group(1)) if tsp else None,
                     "best": int(tbest.group(1)) if tbest else None}
    slider = re.search(r"\*\*γ\\\* = (\d+)\*\*", note)  # the sliders moved to the run's own α, c, v
    out["theory sliders"] = {"best": int(slider.group(1))}

    machine = machine_ui.machine_views("tiny", [], state=state).note
    mv = re.search(r"a verify pass of ([\d.]+) standard steps", machine)
    mb = re.search(r"best γ of (\d+)", machine)
    out["this machine"] = {"v": mv.group(1) if mv else None, "best": int(mb.group(1)) if mb else None}

    page = export_page(spec, std)
    assert metrics in page  # the exported page's table is the Live tab's, figure for figure
    out["challenges"] = {"speedup": challenge_speedup(Run(spec=spec, std=std))}

    from specviz.ui.class_views import point_values

    point = point_values(spec, std)
    out["class point"] = {"speedup": point["speedup"], "c": point["c"]}
    if "v" in point:
        out["class point"]["v"] = steps(point["v"]) if point["v"] is not None else None
    return out


@pytest.mark.parametrize("kind", list(RACES))
def test_every_panel_gives_the_same_v_speedup_and_best_gamma(kind):
    spec, std = RACES[kind]()
    fig = run_figures(spec, std)
    found = panels(spec, std)
    want = {"v": fig.v_text() or None, "speedup": fig.speedup, "best": fig.best[0] if fig.best else None, "c": fig.c}
    for panel, said in found.items():
        for quantity, value in said.items():
            expected = want[quantity]
            if quantity == "speedup" and value is not None and expected is not None:
                assert value == pytest.approx(expected, abs=0.006), f"{kind}: {panel} says speedup {value}"
            elif panel == "theory sliders":  # the sliders hold the run's values rounded as they print them
                assert value == expected, f"{kind}: the sliders' γ* {value}, the run's {expected}"
            elif panel in ("headline", "class point") and (fig.cut or quantity == "speedup" and fig.speedup is None):
                pass  # a cut race's headline states no figure; a flagged one without counts shows its clock, disowned
                # (the class refuses to post those: ui.classroom)
            elif quantity == "c":
                assert value == pytest.approx(expected, abs=1e-6), f"{kind}: {panel} says c = {value}, the figures {expected}"
            else:
                assert value == expected, f"{kind}: {panel} says {quantity} = {value}, the figures {expected}"
    if fig.flagged and fig.v is not None:  # the probe's v, everywhere, not the race's own clocks'
        assert fig.v_text() == steps(2.61) != steps(fig.v_measured)


def test_the_theory_sliders_hold_a_run_as_its_best_gamma_is_taken():
    from specviz.ui.tabs import THEORY_RANGES, step_decimals
    from specviz.theory.figures import THEORY_POINT

    for name, (lo, hi, decimals) in THEORY_POINT.items():
        assert THEORY_RANGES[name][1:3] == (lo, hi) and step_decimals(name) == decimals


def test_the_rule_that_picks_the_speedup_to_trust():
    spec, std = shipped("5-code")
    calm = run_figures(spec, std)
    assert calm.speedup_by == "clock" and calm.speedup == pytest.approx(calm.clock) and calm.v_source == "measured"
    busy = run_figures(*flagged(spec, std))
    assert busy.speedup_by == "counts" and busy.speedup == 0.87 and busy.v_source == "probed"
    assert busy.speedup_text() == "≈0.87×" and busy.clock == pytest.approx(calm.clock)
    assert run_figures(*flagged(spec, std, predicted=None)).speedup is None  # its clocks are never quoted
    cut = run_figures(*stopped(spec, std))
    assert cut.cut and cut.speedup is None and cut.clock is not None
    assert run_figures(spec, None).speedup is None and run_figures(None, None).v is None


@pytest.mark.parametrize("alpha, c, v", [(0.96, 0.39, 2.46), (0.6, 0.05, 1.0), (0.8, 0.1, 3.0), (0.3, 0.5, 1.2)])
def test_best_gamma_is_the_theorems_optimum_over_the_pages_gammas(alpha, c, v):
    assert best_gamma(alpha, c, v) == pytest.approx(optimal_gamma(alpha, c, 16, v))
    assert best_gamma(None, c, v) is None and best_gamma(alpha, c, None) == best_gamma(alpha, c, 1.0)


def test_this_machine_sets_the_probes_best_gamma_apart_from_the_runs():
    """This machine said "best γ = 1" beside the Theory tab's γ* = 7: two figures, now each named."""
    from specviz.hardware.probe import Probe
    from specviz.views.machine_words import machine_text

    probe = Probe.from_dict({"model": "t", "machine": {"label": "x"}, "choice": "bf16", "alpha": 0.7, "draft_ms": 20.0,
                             "curves": {"bf16": {1: 100.0, 2: 180.0, 4: 330.0, 8: 640.0}},
                             "predicted": {"bf16": {"gamma": 1, "rate": 9.0, "standard": 10.0}}})
    assert "best γ = 1 at the probe's α = 0.70" in machine_text(probe)


# ---- sentences that fit their run ---------------------------------------------------------------------------


def test_a_biased_race_never_claims_the_targets_distribution():
    spec, std = biased(*shipped("3-translation"))
    if sampling_note(spec, std):  # the texts differ
        note = sampling_note(spec, std)
        assert "guarantees" not in note and "would match" not in note and "ε = 0.3: biased toward the draft" in note
    exact = sampling_note(*shipped("3-translation"))
    assert "guarantees that its text follows the same distribution" in exact
    greedy, std0 = biased(*shipped("2-chat"), eps=0.1)
    greedy.rounds[-1].emitted[-1] = replace(greedy.rounds[-1].emitted[-1], text=" other")  # the texts part
    note = sampling_note(greedy, std0)
    assert note and "not exact" in note and "at temperature 0 its very text" in note and "guarantees" not in note


def test_settings_off_the_pages_defaults_are_named_beside_the_headline():
    spec, std = biased(*shipped("1-code"))
    assert settings_note(spec) == "Off the page's defaults: ε = 0.3: biased toward the draft"
    race = unescape(V.race_html(spec, std))
    assert '<div class="sv-race-settings">Off the page\'s defaults: ε = 0.3: biased toward the draft</div>' in race
    assert settings_note(shipped("1-code")[0]) == ""  # an example as shipped: nothing to say
    uno = copy.deepcopy(spec)
    uno.settings = replace(uno.settings, epsilon=0.0, variant="uno", policy="adaptive", top_p=0.9)
    assert settings_note(uno) == ("Off the page's defaults: Decoding-UNO: corrections drawn from p, not the residual · "
                                  "top-p 0.9 · adaptive policy (γ at most 5)")


def test_picking_an_example_resets_every_other_setting():
    """ε = 0.3 carried over to the next example silently: picking one now resets what it does not set."""
    from specviz.core.settings import DecodeSettings
    from specviz.ui.form import FORM_FROM_TRACE, example_form

    form = example_form(EXAMPLES[2])  # the translation example: T = 0.7, γ = 4, 40 tokens, seed 1
    assert set(form) == set(FORM_FROM_TRACE)
    assert (form["temperature"], form["gamma"], form["max_new_tokens"], form["seed"]) == (0.7, 4, 40, 1)
    d = DecodeSettings()
    assert (form["epsilon"], form["variant"], form["top_p"], form["drafter"], form["policy"], form["rule"]) == (
        0.0, d.variant, 1.0, d.drafter, d.policy, d.rule)
    chat = example_form(EXAMPLES[1])  # sets nothing but its prompt: the page's defaults
    assert (chat["temperature"], chat["gamma"], chat["max_new_tokens"], chat["seed"]) == (0.0, 5, 48, 0)


def test_a_live_runs_link_button_says_it_links_to_the_shipped_recording():
    from specviz.ui import links

    spec, _ = shipped("5-code")
    kw = dict(examples=EXAMPLES, recordings=TRACES)
    assert links.copy_button(spec, **kw)["value"] == links.COPY_LABEL  # the shipped recording itself
    live = copy.deepcopy(spec)
    live.settings = replace(live.settings, gamma=4)  # example 5 with γ changed to 4
    button = links.copy_button(live, **kw)
    assert button["value"] == "Copy a link to the shipped recording, not this run (γ = 4 here, 5 there)"
    assert links.link_query(live, 11, **kw) == "example=5&round=11"  # what the link opens: the shipped one
    own = copy.deepcopy(spec)
    own.prompt = "a prompt of my own"
    assert links.copy_button(own, **kw) == {"value": "No link opens this run: export its trace to share it",
                                            "interactive": False}


def test_a_stopped_runs_panels_say_what_was_decoded_before_the_stop():
    spec, std = stopped(*shipped("2-chat"))
    rounds = V.rounds_html(spec)
    assert "Waiting for the first round" not in rounds
    n = sum(len(r.emitted) for r in spec.rounds)
    assert f"Stopped after round 3: {n} tokens decoded before it." in unescape(rounds)
    race = unescape(V.race_html(spec, std))
    assert "finished · stopped" not in race and "sv-badge--done" not in race and race.count("sv-badge--stopped") == 2
    assert f"speculative {n} tokens in 3 rounds, standard {std.n_tokens} tokens decoded before the stop" in race
    early = copy.deepcopy(spec)  # stopped while reading the prompt
    early.rounds, early.t_total = [], 0.0
    assert "Stopped before the first round" in unescape(V.rounds_html(early))
    col = re.search(r'sv-race-spec".*?sv-race-stats">(.*?)</div></div></div>', V.race_html(early, None), re.S).group(1)
    assert "0.0 ms" not in col and "nothing (it was still reading the prompt)" in unescape(V.race_html(early, None))


# ---- one token notation, one glyph per meaning ----------------------------------------------------------------


def test_one_token_notation_everywhere():
    """↵ and · in the chips, \\x0a or nothing in the rules' header, '.\\n\\n' in the narration, ␣ in the picker:
    now the chips' notation everywhere, from one function; a special token is ⟨im_end⟩, never raw."""
    from specviz.core.text import token_label
    from specviz.trace import Token
    from specviz.views.acceptance import _label
    from specviz.views.rules import rules_html
    from specviz.views.text import tokens_html

    assert token_label(".\n\n") == ".↵↵" and token_label(" a\tb") == "·a⇥b" and token_label("<|im_end|>") == "⟨im_end⟩"
    assert _label(" x\n") == "·x↵" and "␣" not in _label("a b")
    race = tokens_html([(Token(id=1, text="<|im_end|>", origin="target"), 1)])
    assert "<|im_end|>" not in unescape(re.sub(r'title="[^"]*"', "", race)) and "⟨im_end⟩" in race
    spec, _ = shipped("1-code")
    rnd = next(r for r in spec.rounds if any("\n" in d.text for d in r.draft))
    head = re.search(r"<thead>(.*?)</thead>", rules_html(rnd, spec)).group(1)
    assert "↵" in head and "\\x0a" not in head
    narration = V.narrate(rnd, spec)
    assert "\\n" not in narration


def test_one_glyph_per_meaning():
    """★ meant "bonus" on the chips and "drafted" in the acceptance picture, ⟲ and ↻ both "correction"."""
    css = (ROOT / "assets" / "style.css").read_text(encoding="utf-8")
    assert '.sv-chip.sv-bonus::before      { content: "★"; }' in css
    assert '.sv-chip.sv-correction::before { content: "↻"; }' in css
    for path in (ROOT / "specviz" / "views" / "acceptance.py", ROOT / "docs" / "guide.md"):
        text = path.read_text(encoding="utf-8")
        assert "⟲" not in text and "★ drafted" not in text and "★ this child" not in text


def test_the_page_wires_the_example_reset_the_link_button_and_this_machine():
    """app.py: picking an example writes every setting it resets (ε among them), the link button follows the shown
    run, and This machine reads the shown run (its best γ beside the probe's)."""
    import app

    demo = app.build()
    by_id = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
    deps = [d for d in demo.fns.values()]

    def outputs_of(name: str) -> list[set]:
        return [{getattr(o, "elem_id", None) for o in d.outputs} for d in deps if getattr(d.fn, "__name__", "") == name]

    picks = outputs_of("pick_example")
    assert picks and {"sv-epsilon", "sv-variant", "sv-policy", "sv-drafter", "sv-rule", "sv-top-p"} <= picks[0]
    state = next(d for d in deps if by_id["sv-copy-link"] in d.outputs and getattr(d.fn, "__name__", "") == "<lambda>"
                 and any(type(i).__name__ == "State" for i in d.inputs))
    assert state is not None
    machine = [d for d in deps if getattr(d.fn, "__name__", "") == "on_machine"]
    assert machine and all(any(type(i).__name__ == "State" for i in d.inputs) for d in machine)
