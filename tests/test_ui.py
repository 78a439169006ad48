"""The UI plumbing: the typed form, the frames and their slots, the drafting controls, the wiring."""

from __future__ import annotations

import dataclasses

import pytest

from specviz.core.settings import GAMMA_MAX, GAMMA_MAX_DYNAMIC, POLICIES, VARIANTS
from specviz.drafters import DRAFTERS
from specviz.models import TINY_PRESET
from specviz.serving.service import InputError
from specviz.ui.form import POLICY_HELP, RunForm
from specviz.ui.frames import SKIP, LiveFrame, Slots
from specviz.ui.tabs import gamma_slider


class Comp:
    """A stand-in component: Slots only needs hashable objects."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"Comp({self.name})"


def test_slots_read_a_form_and_write_only_the_fields_set():
    comps = {f.name: Comp(f.name) for f in dataclasses.fields(RunForm)}
    form_slots = Slots(RunForm, **comps)
    assert form_slots.inputs == set(comps.values())
    values = {c: f"value of {n}" for n, c in comps.items()}
    form = form_slots.read(values)
    assert isinstance(form, RunForm) and form.prompt == "value of prompt" and form.tau == "value of tau"

    outs = {f.name: Comp(f.name) for f in dataclasses.fields(LiveFrame)}
    live = Slots(LiveFrame, **outs)
    assert live.outputs == list(outs.values())
    assert live.write(LiveFrame(status="<b>ok</b>", rounds="")) == {outs["status"]: "<b>ok</b>", outs["rounds"]: ""}
    # nothing set: every output left alone, said as one skip (Gradio reads {} as a missing value: a traceback)
    assert live.write(LiveFrame()) == {outs["status"]: {"__type__": "update"}}
    assert LiveFrame().status is SKIP and not SKIP
    with pytest.raises(TypeError, match="expected a LiveFrame"):
        live.write(form)


def test_slots_refuse_a_wiring_mistake():
    names = [f.name for f in dataclasses.fields(LiveFrame)]
    with pytest.raises(TypeError, match=r"missing \['export'\], unknown \['exprot'\]"):
        Slots(LiveFrame, **{n if n != "export" else "exprot": Comp(n) for n in names})


def test_run_form_validates_into_prompt_and_settings():
    job = RunForm(prompt="  hi\r\n", gamma=24, policy="adaptive", drafter="prompt-lookup", tau="0.3",
                  variant=list(VARIANTS)[1], max_new_tokens=8.0).check()
    prompt, s = job.prompt, job.settings
    assert prompt == "  hi\n" and job.standard is True
    assert (s.gamma, s.policy, s.drafter, s.tau, s.variant, s.max_new_tokens) == (24, "adaptive", "prompt-lookup",
                                                                                 0.3, "uno", 8)
    with pytest.raises(InputError, match="between 1 and 16"):
        RunForm(prompt="hi", gamma=24).check()  # the constant policy's γ stops at 16
    with pytest.raises(InputError, match="drafter must be one of"):
        RunForm(prompt="hi", drafter="oracle").check()
    with pytest.raises(InputError, match="prompt is empty"):
        RunForm(prompt=" ").check()


def test_run_form_request_loads_the_pair_and_tokenises():
    req = RunForm(preset=TINY_PRESET, prompt="hello", max_new_tokens=4).request()
    assert req.prompt == "hello" and req.prompt_ids and req.settings.max_new_tokens == 4
    with pytest.raises(InputError, match="Unknown model preset"):
        RunForm(preset="no such pair", prompt="hello").request()


def test_drafting_controls():
    assert set(POLICY_HELP) == set(POLICIES) and all(POLICY_HELP.values())
    fixed = gamma_slider("constant", 30)
    assert fixed["maximum"] == GAMMA_MAX and fixed["value"] == GAMMA_MAX and fixed["label"] == "Draft length γ"
    for policy in ("heuristic", "confidence", "adaptive"):
        dyn = gamma_slider(policy, 30)
        assert dyn["maximum"] == GAMMA_MAX_DYNAMIC and dyn["value"] == 30
        assert dyn["label"] == "Maximum draft length γ"
    assert gamma_slider("constant", None)["value"] == 5


@pytest.fixture(scope="module")
def page():
    """The page's Blocks, built once, and its components by elem_id."""
    import app

    demo = app.build()
    return demo, {getattr(b, "elem_id", None): b for b in demo.blocks.values()}


def test_the_page_wires_the_form_and_the_drafting_controls(page):
    demo, by_id = page
    drafter = by_id["sv-drafter"]
    assert [value for _, value in drafter.choices] == list(DRAFTERS)  # built from the registry
    assert [label for label, _ in drafter.choices] == [label for label, _ in DRAFTERS.values()]
    assert [value for _, value in by_id["sv-policy"].choices] == list(POLICIES)
    assert [value for _, value in by_id["sv-variant"].choices] == list(VARIANTS.values())
    assert by_id["sv-tau"].visible is False  # shown for the confidence policy only
    assert by_id["sv-gamma"].maximum == GAMMA_MAX
    # Run takes the whole form as one {component: value} dict.
    run_fn = next(fn for fn in demo.fns.values() if by_id["sv-run"]._id in [t[0] for t in fn.targets])
    assert run_fn.inputs_as_dict and len(run_fn.inputs) == len(dataclasses.fields(RunForm))
    assert len(run_fn.outputs) == len(dataclasses.fields(LiveFrame))


def test_run_streams_each_drafted_token_then_the_finished_views(monkeypatch):
    from specviz.ui import live

    monkeypatch.setattr(live, "UI_THROTTLE_S", 0.0)  # draw every event
    frames = list(live.run(RunForm(preset=TINY_PRESET, prompt="hello there", gamma=4, max_new_tokens=10)))
    assert frames[0].updates() == {"status": frames[0].status} and "Loading models" in frames[0].status
    partial = [f.rounds for f in frames if f.rounds and 'sv-round--pending' in f.rounds
               and 'data-status="slot"' in f.rounds and 'data-status="pending"' in f.rounds]
    assert partial, "no frame showed a round with some drafts pending and some still to come"
    legends = [f.legend for f in frames if f.legend is not SKIP]
    assert len(legends) == 2 and 'data-drafter="model"' in legends[0]  # once when decoding starts, once at the end
    last = frames[-1]
    assert 'data-kind="ok"' in last.status and last.state["spec"].n_tokens == 10
    assert set(last.updates()) == {f.name for f in dataclasses.fields(LiveFrame)}  # the finished views: everything


def test_bad_input_stops_a_run_with_a_message_not_a_traceback():
    import gradio as gr

    from specviz.ui import live

    gen = live.run(RunForm(preset=TINY_PRESET, prompt="hi", policy="sometimes"))
    frame = next(gen)  # checked before any model loads
    assert 'data-kind="error"' in frame.status and "draft-length policy must be one of" in frame.status
    with pytest.raises(gr.Error):
        next(gen)


def test_sweeps_use_the_forms_drafter_and_policy():
    from specviz.ui.tabs import sweep

    form = RunForm(preset=TINY_PRESET, prompt="a b a b a b", max_new_tokens=4, drafter="prompt-lookup",
                   policy="adaptive", gamma=20)
    frames = list(sweep("gamma", form))
    assert "(drafter prompt-lookup, adaptive policy)" in frames[-1].status
    plot = frames[-1].gamma_plot
    assert plot is not SKIP and frames[-1].eps_plot is SKIP and frames[-1].pareto is SKIP


def test_a_finished_run_shows_its_result_and_replays_the_race_only_on_request(page):
    """After a live run the race replayed itself in real time from zero, hiding the result: now the run's
    last frame is the finished race, and the replay runs from its button only."""
    from specviz.ui import live
    from tests.synthetic import make_std_trace, make_trace

    demo, by_id = page
    replays = [fn for fn in demo.fns.values() if fn.fn is live.replay]
    assert [fn.targets for fn in replays] == [[(by_id["sv-replay"]._id, "click")]]  # nothing chained after Run
    run_fn = next(fn for fn in demo.fns.values() if by_id["sv-run"]._id in [t[0] for t in fn.targets])
    assert not [fn for fn in demo.fns.values() if fn.trigger_after == run_fn._id and fn.fn is live.replay]
    race = live.final_frame(make_trace(), make_std_trace(), "ok").race
    assert "data-speedup" in race and race.count("sv-badge--done") == 2 and "sv-race-clock" not in race
    assert "Speedup appears when both runs finish" not in race


def test_the_theory_note_prints_each_value_as_its_slider_shows_it(page):
    """The note said c = 0.17 beside a slider at 0.175: values print with their slider's step's decimals."""
    from specviz.ui.tabs import THEORY_STEPS, step_decimals, theory_views

    _, by_id = page
    sliders = {"alpha": "sv-alpha", "c": "sv-t-c", "c_hat": "sv-t-chat", "v": "sv-t-v"}
    assert {k: by_id[e].step for k, e in sliders.items()} == THEORY_STEPS  # the page's sliders use these steps
    assert (step_decimals("c"), step_decimals("alpha"), step_decimals("v")) == (3, 2, 2)
    note = theory_views(0.8, 5, 0.175, 0.05, None, 1.25).note
    assert "Optimal γ for α = 0.80, c = 0.175, v = 1.25:" in note
    assert "c = 0.17:" not in note and "c = 0.17," not in note
    assert by_id["sv-sweeps-intro"].value.startswith("Run the prompt")  # built from sweeps.GAMMAS (test_shootout)


def test_the_example_dropdown_names_the_example_the_form_shows_or_none(page):
    """After a deep link or a loaded recording the prompt changed but "Example prompts" still said
    "Code: Fibonacci": every event that fills the form from a recording now sets the dropdown to the example
    whose prompt it recorded, or blank; setting it does not re-apply the example's settings."""
    import json
    from pathlib import Path

    import app
    from specviz.trace import load_recording
    from specviz.ui.form import example_label

    demo, by_id = page
    example, prompt = by_id["sv-example"], by_id["sv-prompt"]
    chat = next(e for e in app.EXAMPLES if e["label"] == "Chat")
    assert example_label(chat["prompt"], app.EXAMPLES) == "Chat"
    assert example_label(chat["prompt"] + " ", app.EXAMPLES) is None and example_label(None, app.EXAMPLES) is None

    fills = [fn for fn in demo.fns.values() if getattr(fn.fn, "__name__", "") == "fill_form"]
    assert len(fills) == 3 and all(fn.outputs[-1] is example for fn in fills)  # upload, recordings list, page load
    root = Path(app.__file__).resolve().parent
    spec, std = load_recording((root / "assets" / "traces" / "2-chat-greedy.json").read_bytes())
    assert spec.prompt == chat["prompt"] != app.EXAMPLES[0]["prompt"]
    out = fills[0].fn({"spec": spec, "std": std})
    assert out[-1] == "Chat" and out[fills[0].outputs.index(prompt)] == chat["prompt"]
    custom = dataclasses.replace(spec, prompt="A prompt of my own")
    assert fills[0].fn({"spec": custom, "std": std})[-1] is None  # blank: no example says this
    # The page-load link handler leaves the dropdown to fill_form (it set the link's example before).
    loads = [fn for fn in demo.fns.values() if getattr(fn.fn, "__name__", "") == "on_start"]
    assert loads and example not in loads[0].outputs
    # The example's settings are applied on the user's pick only, not when an event sets the dropdown.
    picks = [fn for fn in demo.fns.values() if example in fn.inputs and prompt in fn.outputs]
    assert len(picks) == 1 and picks[0].targets == [(example._id, "input")]
    # Typing a prompt: the dropdown follows in the browser, from a map of the examples' prompts.
    typed = [fn for fn in demo.fns.values() if fn.targets == [(prompt._id, "input")] and example in fn.outputs]
    assert len(typed) == 1 and typed[0].fn is None
    assert json.dumps({e["prompt"]: e["label"] for e in app.EXAMPLES}) in typed[0].js


def test_step_modes_views_are_served_to_every_page_at_once(page):
    """A class's pages step together (issue 58): the round's views (drawn once per recording and round,
    ui.round_memo) are served to every page at once, outside Gradio's queue, in one event that also tells a
    teacher's room the round (every attendee's page fires it too); a picked position only when the visitor picks."""
    from specviz.ui import classroom, picture_ui

    demo, by_id = page
    step = by_id["sv-step"]
    on_step = [fn for fn in demo.fns.values() if (step._id, "change") in [tuple(t) for t in fn.targets]
               and fn.fn is not None]
    assert [fn.fn for fn in on_step] == [classroom.on_step] and on_step[0].queue is False
    assert len(on_step[0].outputs) == 5
    positions = [fn for fn in demo.fns.values() if fn.fn is picture_ui.for_position]
    assert [t[1] for fn in positions for t in fn.targets] == ["input"] and positions[0].queue is False
    assert all(fn.concurrency_limit is None for fn in demo.fns.values() if fn.fn is picture_ui.for_step)
