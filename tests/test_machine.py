"""How the target executes, on the page and in the API: the "Target execution" setting
(SPECVIZ_TARGET_EXEC, the form, the /trace parameter), the pair line naming the execution and the
machine, and the "This machine" panel drawn from the execution probe (hand-made probes here; the
real probe is tested in test_executions.py)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import pytest
import torch

from specviz.models.executions import WORDS, offered
from specviz.hardware.machine import Machine
from specviz.hardware.probe import Probe, choose
from specviz.models import TINY_PRESET, load_pair
from specviz.serving import service
from specviz.serving.service import InputError, check_target_exec, default_target_exec
from specviz.trace import load_recording
from specviz.ui import machine_ui
from specviz.ui.form import RunForm
from specviz.views import machine as M
from specviz.views import machine_words as W
from specviz.views.chips import legend_html
from specviz.views.execution import pair_exec_line, short_machine, trace_exec_line
from tests.synthetic import XSS, make_trace

FIXTURES = Path(__file__).parent / "fixtures"
HARDWARE = FIXTURES / "hardware"
EPYC = Machine("cpu", "AMD EPYC 7B13 64-Core Processor", ("avx2", "fma"), 2, "2.5.1")
CURVES = {  # bf16 compute-bound (T(k) climbs), int8 nearly flat, fp32 only its step timed
    "bf16": {1: 80.0, 2: 150.0, 4: 300.0, 8: 600.0},
    "int8": {1: 100.0, 2: 110.0, 4: 130.0, 8: 170.0},
    "fp32": {1: 210.0},
}


def make_probe(curves=None, draft_ms: float | None = 25.0, alpha: float = 0.8, machine: Machine = EPYC) -> Probe:
    curves = curves or CURVES
    choice, predicted = choose(curves, draft_ms, alpha)
    return Probe(machine.as_dict(), "offline:target", curves, draft_ms, alpha, choice, predicted, seconds=12.0)


@pytest.fixture(autouse=True)
def _fresh_default(monkeypatch):
    """SPECVIZ_TARGET_EXEC unset and its (memoised) reading forgotten, before and after each test."""
    monkeypatch.delenv("SPECVIZ_TARGET_EXEC", raising=False)
    service._default_target_exec.cache_clear()
    yield
    service._default_target_exec.cache_clear()


def _cpu_only():
    if torch.cuda.is_available():
        pytest.skip("checks the CPU's executions")


# ---- the setting ---------------------------------------------------------------------------------


def test_the_environment_sets_the_default_execution(monkeypatch, caplog):
    _cpu_only()
    assert default_target_exec() == "auto"
    monkeypatch.setenv("SPECVIZ_TARGET_EXEC", " INT8 ")
    service._default_target_exec.cache_clear()
    assert default_target_exec() == "int8" and check_target_exec("") == "int8" and check_target_exec(None) == "int8"
    for raw in ("int4", "bf16+graphs"):  # unknown, and a GPU execution on a CPU server: auto, with a warning
        monkeypatch.setenv("SPECVIZ_TARGET_EXEC", raw)
        service._default_target_exec.cache_clear()
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert default_target_exec() == "auto"
            assert default_target_exec() == "auto"
        warned = [r.getMessage() for r in caplog.records if "SPECVIZ_TARGET_EXEC" in r.getMessage()]
        assert len(warned) == 1 and repr(raw) in warned[0], warned  # once per value, not once per request


def test_a_requested_execution_is_checked_once_with_a_clear_message():
    _cpu_only()
    assert check_target_exec(" FP32 ") == "fp32" and check_target_exec("auto") == "auto"
    with pytest.raises(InputError, match=r"Unknown target execution 'warp': this machine offers auto, bf16, fp32"):
        check_target_exec("warp")
    with pytest.raises(InputError, match="Unknown target execution 'fp16\\+graphs'"):
        check_target_exec("fp16+graphs")  # CUDA only
    with pytest.raises(InputError, match="must be text"):
        check_target_exec(3)
    with pytest.raises(InputError, match="Unknown target execution"):
        RunForm(prompt="hi", target_exec="warp").check()  # before any model loads
    assert "target_exec" not in RunForm(prompt="hi", target_exec="int8").raw_settings()


def test_the_form_passes_the_execution_to_the_loader(monkeypatch):
    seen = {}

    def fake_load_pair(preset=None, **kw):
        seen.update(kw, preset=preset)
        return load_pair(TINY_PRESET)
    monkeypatch.setattr(service, "load_pair", fake_load_pair)
    req = RunForm(preset=TINY_PRESET, prompt="hello", max_new_tokens=4, target_exec="FP32").request()
    assert seen["target_exec"] == "fp32" and seen["preset"] == TINY_PRESET and req.prompt_ids
    RunForm(preset=TINY_PRESET, prompt="hello", max_new_tokens=4).request()
    assert seen["target_exec"] == "auto"  # the server's default
    assert service.loaded_execution(TINY_PRESET)[:2] == ("fp32", None)  # the tiny pair: its dtype, no probe


def test_the_api_refuses_an_unknown_execution_without_a_traceback():
    from specviz.ui import api

    with pytest.raises(gr.Error) as err:
        next(api.api_trace("hello", preset=TINY_PRESET, target_exec="turbo"))
    assert "Unknown target execution 'turbo'" in str(err.value.message) and err.value.print_exception is False


def test_the_execution_is_part_of_a_replayed_request():
    from specviz.serving.replay import run_key

    settings = RunForm(prompt="hi").check().settings
    assert run_key(TINY_PRESET, "hi", settings) == run_key(TINY_PRESET, "hi", settings, target_exec="auto")
    assert run_key(TINY_PRESET, "hi", settings, target_exec="int8") != run_key(TINY_PRESET, "hi", settings)



def test_a_target_on_its_gguf_matrices_is_never_replayed_as_int8s_own(monkeypatch):
    """SPECVIZ_Q4K=1: the int8 target multiplies its GGUF's matrices as stored -- other numbers and timings,
    so a recording made on int8's own rows (the shipped ones) must not answer its requests, nor the reverse."""
    from specviz.models import DEFAULT_PRESET, q4k, resolve_preset
    from specviz.serving.replay import run_key

    preset = resolve_preset(DEFAULT_PRESET)
    settings = RunForm(prompt="hi").check().settings
    monkeypatch.setattr(service, "_EXECUTIONS", {})
    monkeypatch.setattr(service, "_WEIGHTS", {})
    monkeypatch.setattr(q4k, "expected", lambda: False)
    own = run_key(preset, "hi", settings, target_exec="int8")
    monkeypatch.setattr(q4k, "expected", lambda: True)  # asked for: before the pair loads, predicted
    stored = run_key(preset, "hi", settings, target_exec="int8")
    assert own.target_exec.startswith("int8@") and stored.target_exec.startswith("int8+gguf@") and own != stored
    assert run_key(preset, "hi", settings, target_exec="fp32").target_exec.startswith("fp32@")  # int8 only
    assert run_key(TINY_PRESET, "hi", settings, target_exec="int8").target_exec.startswith("int8@")  # no GGUF

    # once loaded, the pair says what it did (a GGUF without Q4_K matrices keeps int8's own rows)
    pair = SimpleNamespace(target_exec="int8", target_weights="", probe=None, target_name="t", dtype=torch.bfloat16)
    service._remember_execution(preset, pair)
    assert run_key(preset, "hi", settings).target_exec == own.target_exec
    service._remember_execution(preset, SimpleNamespace(**{**vars(pair), "target_weights": "gguf"}))
    assert run_key(preset, "hi", settings).target_exec == stored.target_exec

    # a recording names its weights, and seeds the cache under that key only
    trace = make_trace()
    trace.models.update(target_exec="int8", machine="AMD EPYC, AVX2 (no native bf16), 2 threads")
    assert service.recording_execution(trace) == "int8@no-native-bf16"
    assert trace_exec_line(trace, recorded=True).startswith(f"target: {WORDS['int8']}, recorded on AMD EPYC")
    trace.models["target_weights"] = "gguf"
    assert service.recording_execution(trace) == "int8+gguf@no-native-bf16"
    # and says so in words, without int8's own measured precision cost
    from specviz.models.executions import Q4K_WORDS

    assert trace_exec_line(trace, recorded=True) == f"target: {Q4K_WORDS}, recorded on AMD EPYC, AVX2 (no native bf16), 2 threads"
    assert trace_exec_line(trace, brief=True) == "target: int8 (its GGUF's matrices as stored) on AMD EPYC, AVX2 (no native bf16), 2 threads"
    line = pair_exec_line(SimpleNamespace(target_exec="int8", target_weights="gguf", probe=make_probe(),
                                          device=torch.device("cpu")))
    assert line.startswith(f"target: {Q4K_WORDS} on AMD EPYC") and "mean TV" not in line


def test_the_engine_records_the_targets_weights():
    from tests.drafted import speculative_stream

    pair = load_pair(TINY_PRESET)
    settings = RunForm(prompt="hi", max_new_tokens=4).check().settings
    ids = pair.tokenizer("hi")["input_ids"]
    last = list(speculative_stream(pair, ids, settings))[-1].trace
    assert "target_weights" not in last.models  # its own weights: recordings as before
    pair.target_weights = "gguf"
    try:
        last = list(speculative_stream(pair, ids, settings))[-1].trace
    finally:
        pair.target_weights = ""
    assert last.models["target_weights"] == "gguf"

def test_the_page_offers_the_setting_and_the_tab():
    import app

    demo = app.build()
    by_id = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
    choices = by_id["sv-target-exec"].choices
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert [v for _, v in choices] == ["auto", *offered(device)] and by_id["sv-target-exec"].value == "auto"
    assert dict((v, label) for label, v in choices)["int8" if device.type == "cpu" else "bf16+graphs"] in WORDS.values()
    assert {"sv-machine-plot", "sv-machine-note", "sv-machine-compare"} <= set(by_id)


# ---- the pair line -------------------------------------------------------------------------------


def test_the_pair_line_names_the_execution_machine_and_how_it_was_chosen():
    probe = make_probe()
    assert probe.choice == "int8"
    pair = SimpleNamespace(target_exec="int8", probe=probe, device=torch.device("cpu"), dtype=torch.bfloat16)
    line = pair_exec_line(pair)
    from specviz.views.execution import precision_cost

    cost = precision_cost("int8")  # the shipped fidelity measurement, when there is one
    assert cost.startswith("vs the bf16 target: mean TV")
    assert line == (f"target: {WORDS['int8']} on AMD EPYC 7B13 64-Core Processor, AVX2 (no native bf16), 2 threads "
                    f"(chosen by measuring this machine; {cost})")
    forced = pair_exec_line(SimpleNamespace(target_exec="bf16", probe=probe, device=torch.device("cpu")))
    assert forced.startswith("target: bf16 on AMD EPYC") and "the probe here would choose int8" in forced
    busy = Probe(EPYC.as_dict(), "offline:target", {}, None, 0.8, "int8", measured=False)
    assert "machine was busy, nothing measured" in pair_exec_line(SimpleNamespace(target_exec="int8", probe=busy,
                                                                                   device=torch.device("cpu")))
    # No probe: the machine is this one, described on the spot.
    none = pair_exec_line(SimpleNamespace(target_exec="fp32", probe=None, device=torch.device("cpu")))
    assert none.startswith("target: float32 on ") and none.endswith("(as set, nothing measured)")


def test_the_tiny_pair_names_its_dtype():
    line = pair_exec_line(load_pair(TINY_PRESET))
    assert line.startswith("target: float32 on ") and "torch" not in line


def test_the_line_for_a_trace_and_for_an_old_recording():
    tr = make_trace()
    tr.models.update(target_exec="int8", machine=EPYC.describe())
    from specviz.views.execution import precision_cost

    cost = f" ({precision_cost('int8')})" if precision_cost("int8") else ""
    assert trace_exec_line(tr) == f"target: {WORDS['int8']} on {short_machine(EPYC.describe())}{cost}"
    recorded = trace_exec_line(tr, recorded=True)
    assert recorded == f"target: {WORDS['int8']}, recorded on {short_machine(EPYC.describe())}{cost}"
    spec, _ = load_recording((FIXTURES / "v1-recording.json").read_bytes())
    assert "target_exec" not in spec.models and "machine" not in spec.models
    assert trace_exec_line(spec, recorded=True) == ("target: bfloat16, recorded on cpu (this recording is older: it "
                                                    "does not say how the target ran or on which machine)")
    assert trace_exec_line(None) == ""
    # brief: the execution's name and the machine, nothing more
    assert trace_exec_line(tr, brief=True) == f"target: int8 on {short_machine(EPYC.describe())}"
    assert trace_exec_line(spec, recorded=True, brief=True) == "target: bfloat16, recorded on cpu"


def test_the_legend_and_the_recording_status_carry_the_line_escaped():
    from specviz.ui.live import show_recording

    tr = make_trace()
    tr.models.update(target_exec="int8", machine=XSS)
    html = legend_html(tr)
    assert 'class="sv-legend-exec"' in html and "on &lt;script&gt;" in html and "<script" not in html
    old, _ = load_recording((FIXTURES / "v1-recording.json").read_bytes())
    frame = show_recording(old, None, "Loaded old.json")
    assert "target: bfloat16, recorded on cpu" in frame.status and "older" not in frame.status  # said in the legend
    assert "this recording is older: it does not say how the target ran" in legend_html(old)
    if frame.export:
        Path(frame.export).unlink(missing_ok=True)


def test_the_first_view_spells_out_the_execution_once():
    """The int8 sentence "(per-channel weights, per-token activations; … mean TV 0.033 …)" appeared three
    times on the page (the status line, both race columns' headers, the legend): the legend says it in full,
    the others name the execution and the machine."""
    from specviz.ui.live import show_recording
    from specviz.views.race import race_html
    from tests.synthetic import make_std_trace

    spec, std = make_trace(), make_std_trace()
    for t in (spec, std):
        t.models.update(target_exec="int8", machine=EPYC.describe())
    frame = show_recording(spec, std, "Recorded example")
    page = frame.status + race_html(spec, std) + legend_html(spec)
    assert page.count("per-channel weights") == 1 and "per-channel weights" in legend_html(spec)
    assert page.count("mean TV") == (1 if "mean TV" in legend_html(spec) else 0)
    assert race_html(spec, std).count("target: int8 on AMD EPYC 7B13") == 2 and "target: int8" in frame.status
    if frame.export:
        Path(frame.export).unlink(missing_ok=True)


# ---- the panel -----------------------------------------------------------------------------------


def _curves_of(fig, recorded: bool = False):
    return {t.meta["execution"]: t for t in fig.data
            if isinstance(t.meta, dict) and "execution" in t.meta and bool(t.meta["recorded"]) == recorded}


def test_the_figure_carries_the_measured_curves_and_marks_the_chosen_one():
    probe = make_probe()
    fig = M.verify_cost_figure(probe, target="Qwen target")
    mine = _curves_of(fig)
    assert set(mine) == set(CURVES)
    for execution, curve in CURVES.items():
        assert list(mine[execution].x) == sorted(curve) and list(mine[execution].y) == [curve[k] for k in sorted(curve)]
    assert mine["int8"].name == "int8 (chosen)" and mine["int8"].meta["chosen"]
    assert mine["int8"].line.width > max(mine[e].line.width for e in ("bf16", "fp32"))
    assert "could not win" in mine["fp32"].name  # a single point: only its step was timed
    assert fig.layout.title.text == M.TITLE and fig.layout.meta["chosen"] == "int8"
    sub = fig.layout.title.subtitle.text  # the machine and the pass, in lines that fit a 400 px wide page
    assert sub.startswith("on this machine: AMD EPYC 7B13 64-Core") and "Processor" in sub and "Qwen target" in sub
    assert all(len(line) <= M.SUB_WRAP for line in sub.split("<br>")), sub
    refs = {t.meta["reference"]: t for t in fig.data if isinstance(t.meta, dict) and "reference" in t.meta}
    assert set(refs["step"].y) == {100.0} and list(refs["step"].x) == [1, 8]  # flat at the chosen T(1)
    assert set(refs["draft"].y) == {25.0}
    assert any(a.text == "draft step<br>c = 0.25" for a in fig.layout.annotations)  # 25 ms / 100 ms
    assert fig.layout.yaxis.type != "log"


def test_the_figure_draws_the_one_thread_curve_a_busy_race_runs_with():
    probe = make_probe()
    assert not [t for t in M.verify_cost_figure(probe).data if isinstance(t.meta, dict) and "one_thread" in t.meta]
    probe.one_thread = {"curve": {1: 150.0, 2: 190.0, 4: 300.0}, "draft_ms": 40.0}
    fig = M.verify_cost_figure(probe)
    (one,) = [t for t in fig.data if isinstance(t.meta, dict) and "one_thread" in t.meta]
    assert list(one.x) == [1, 2, 4] and list(one.y) == [150.0, 190.0, 300.0] and one.line.dash == "dot"
    assert "one thread" in one.name and _curves_of(fig)["int8"].y[0] == CURVES["int8"][1]  # the chosen curve kept


def test_the_figure_adds_the_recorded_machines_asked_for():
    recorded = M.load_recorded(HARDWARE)
    fig = M.verify_cost_figure(make_probe(), [r for r in recorded if r.key == "amx-xeon"])
    theirs = [t for t in fig.data if isinstance(t.meta, dict) and t.meta.get("recorded")]
    doc = json.loads((HARDWARE / "amx-xeon.json").read_text())
    assert {t.meta["execution"] for t in theirs} == set(doc["curves"])
    bf16 = next(t for t in theirs if t.meta["execution"] == "bf16")
    assert list(bf16.y) == [doc["curves"]["bf16"][str(k)] for k in bf16.x]
    assert bf16.name == "bf16 · AMX Xeon (recorded, its choice)" and bf16.line.dash == "dash"
    assert doc["note"].split()[0] in bf16.hovertemplate
    assert len(_curves_of(fig)) == len(CURVES)  # this machine's curves are still all there


def test_without_a_probe_the_figure_shows_the_recorded_machines_or_says_why_it_is_empty():
    recorded = M.load_recorded(HARDWARE)
    fig = M.verify_cost_figure(None, recorded)
    assert not _curves_of(fig) and len(_curves_of(fig, recorded=True)) >= 2
    assert "not measured on this machine" in fig.layout.title.text
    assert M.verify_cost_figure(None, []).layout.meta["empty"] is True


def test_the_text_gives_this_machines_verify_factors_and_predicted_rates():
    probe = make_probe()
    gamma = probe.predicted["int8"]["gamma"]
    k = gamma + 1
    text = W.machine_text(probe, execution="int8", target="Qwen target")
    assert "AMD EPYC 7B13 64-Core Processor" in text and "memory-bound" in text
    for execution in ("bf16", "int8"):  # from the curves, as the probe computes it
        assert f"**{probe.verify_factor(execution, k):.2f}** one-token steps" in text
    assert f"**Verify factor T({k})/T(1)** (γ = {gamma})" in text
    assert "only its one-token step was timed, T(1) = 210 ms: even with a flat verify pass at most" in text  # fp32
    pred = probe.predicted["int8"]
    assert f"**{pred['rate']:.1f} tokens/s** with speculation" in text
    assert f"**{pred['standard']:.1f} tokens/s** standard decoding" in text
    assert "**c = 0.25**" in text
    forced = W.machine_text(probe, execution="bf16")
    assert "runs as **bf16**, as set (the probe would choose int8)" in forced


def test_the_text_says_plainly_when_there_is_no_probe():
    recorded = M.load_recorded(HARDWARE)
    text = W.machine_text(None, why_none="Nothing ran here yet.", recorded=recorded)
    assert text.startswith("Nothing ran here yet.") and "Verify factor" not in text
    assert "**AVX2 EPYC**" in text and "Test fixture: made-up figures shaped like a 2-core AVX2" in text
    busy = Probe(EPYC.as_dict(), "offline:target", {}, None, 0.8, "int8", measured=False)
    text = W.machine_text(busy, target="Qwen target")
    assert "busy when Qwen target loaded" in text and "nothing was measured" in text and WORDS["int8"] in text


def test_recorded_machines_are_read_from_whatever_files_exist(tmp_path, caplog):
    names = [(r.key, r.name, r.choice_label) for r in M.load_recorded(HARDWARE)]
    assert names == [("amx-xeon", "AMX Xeon", "AMX Xeon (recorded)"),
                     ("avx2-epyc", "AVX2 EPYC", "AVX2 EPYC (recorded)")]
    shutil.copy(HARDWARE / "avx2-epyc.json", tmp_path / "epyc.json")
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "empty.json").write_text(json.dumps({"machine": {}, "curves": {}}))
    # Curves measured from runs rather than by the probe: no α, no prediction, no choice.
    runs = {"machine": {"kind": "cpu", "name": "Intel(R) Xeon(R) Processor", "isa": ["amx_bf16", "avx2"],
                        "label": "Intel(R) Xeon(R) Processor, AMX, 2 threads"},
            "curves": {"bf16": {"1": 186.5, "4": 192.5, "9": 208.2}}, "note": "medians of recorded runs"}
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    # The bench's and the fidelity check's results live there too: skipped, and not called broken.
    (tmp_path / "bench-x.json").write_text(json.dumps({"machine": "a CPU", "configs": {}}))
    with caplog.at_level(logging.WARNING, logger="specviz.views"):
        loaded = M.load_recorded(tmp_path)
    assert [r.key for r in loaded] == ["epyc", "runs"]
    assert (loaded[1].name, loaded[1].probe.choice, loaded[1].probe.curves["bf16"][4]) == ("AMX Xeon", "bf16", 192.5)
    # T(6) between the points at 4 and 9: 192.5 + 15.7 × 2/5 = 198.8 ms, 1.07 × T(1)
    assert "AMX Xeon** (Intel(R) Xeon(R) Processor, AMX, 2 threads): chose bf16; T(6)/T(1): bf16 1.07 — medians" in (
        W.machine_text(None, recorded=loaded))
    warned = {w for r in caplog.records for w in r.getMessage().split()}
    assert {"broken.json", "empty.json"} <= warned and "bench-x.json" not in warned
    assert M.load_recorded(tmp_path / "missing") == []


def test_a_llamacpp_recording_is_drawn_and_named_as_the_reference(tmp_path):
    """llama.cpp's curves (scripts/llamacpp_curves.py) sit beside the machines' probes: drawn as a recorded
    curve named by its machine, and listed as the reference a CPU user would pick, with its note."""
    doc = {"name": "llama.cpp", "reference": "llama.cpp",
           "machine": {"kind": "cpu", "name": "AMD EPYC", "isa": ["avx2"], "label": "AMD EPYC, AVX2, 2 threads"},
           "curves": {"llama.cpp Q4_K_M": {"1": 100.0, "2": 150.0, "4": 250.0, "6": 350.0, "8": 450.0}},
           "choice": "llama.cpp Q4_K_M", "draft_ms": 40.0, "note": "its verify climbs with k"}
    (tmp_path / "llamacpp-x.json").write_text(json.dumps(doc))
    (rec,) = M.load_recorded(tmp_path)
    assert rec.reference == "llama.cpp" and rec.name == "llama.cpp"
    text = W.machine_text(None, recorded=[rec])
    assert "**Recorded on other machines and by llama.cpp**" in text
    assert ("**llama.cpp** (AMD EPYC, AVX2, 2 threads), the reference a CPU user would pick: T(6)/T(1): "
            "llama.cpp Q4_K_M 3.50 — its verify climbs with k.") in text
    fig = M.verify_cost_figure(make_probe(), [rec])
    (theirs,) = [t for t in fig.data if isinstance(t.meta, dict) and t.meta.get("recorded")]
    assert theirs.name == "llama.cpp Q4_K_M · AVX2 EPYC (recorded)" and list(theirs.y)[:2] == [100.0, 150.0]
    # the legend (a line an entry on a phone) sits at the container's foot, where plotly makes room for it
    assert fig.layout.legend.yref == "container" and fig.layout.legend.yanchor == "bottom"


def test_the_shipped_machines_load_with_what_their_probes_measured(caplog):
    """assets/hardware: both machines' probes load without a warning (the bench's and the fidelity
    check's results beside them are passed over), each with all three CPU executions, and the text
    says what each chose: int8 on both (on the AMX Xeon bf16's verify is flat, but its step costs
    about twice int8's)."""
    with caplog.at_level(logging.WARNING, logger="specviz.views"):
        shipped = {r.key: r for r in M.load_recorded()}
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    assert set(shipped) == {"epyc-avx2", "epyc-avx2-2026-11-26", "xeon-amx", "xeon-amx-2026-11-28",
                            "llamacpp-epyc-avx2", "llamacpp-xeon-amx"}
    llamas = [shipped.pop("llamacpp-epyc-avx2"), shipped.pop("llamacpp-xeon-amx")]  # on the same GGUF files
    for llama in llamas:  # (scripts/llamacpp_curves.py): its verify climbs, on the AVX2 EPYC and the AMX Xeon
        assert llama.reference == "llama.cpp" and M.verify_factor(llama.probe.curves[llama.probe.choice], 6) > 2
        assert "its own greedy speculation" in llama.note and llama.probe.draft_ms
    assert "AMX off" in llamas[1].note  # its native build faulted in ggml's AMX path there
    for rec in shipped.values():
        assert set(rec.probe.curves) == {"bf16", "fp32", "int8"} and rec.probe.choice == "int8"
    xeon, epyc = shipped["xeon-amx"].probe, shipped["epyc-avx2"].probe
    assert M.verify_factor(xeon.curves["bf16"], 6) < 1.1 < 4 < M.verify_factor(epyc.curves["bf16"], 6)
    assert xeon.curves["int8"][1] < 0.6 * xeon.curves["bf16"][1]
    vnni = shipped["xeon-amx-2026-11-28"].probe  # the same kind of machine with the Q4_K kernels' VNNI form: a
    assert vnni.curves["int8"][1] < 0.6 * xeon.curves["int8"][1]  # step well under fbgemm's int8 rows' there
    assert vnni.curves["int8"][1] < 0.8 * llamas[1].probe.curves[llamas[1].probe.choice][1]  # and llama.cpp's
    text = W.machine_text(None, recorded=[*shipped.values(), *llamas])
    assert "**AMX Xeon**" in text and "**AVX2 EPYC**" in text and text.count("chose int8") == 4
    assert "**llama.cpp** (AMD EPYC" in text and "the reference a CPU user would pick" in text
    assert "**llama.cpp** (Intel" in text
    labels = [label for label, _ in machine_ui.compare_choices()]  # "Compare with": each a name of its own
    assert len(set(labels)) == len(labels) and "AMX Xeon, 2026-11-28 (recorded)" in labels, labels


def test_the_tab_for_the_tiny_pair_says_so_and_still_compares():
    frame = machine_ui.machine_views(TINY_PRESET, [], folder=HARDWARE)
    assert frame.note.startswith(machine_ui.TINY_WHY)
    assert len(_curves_of(frame.plot, recorded=True)) >= 2 and not _curves_of(frame.plot)


def test_the_tab_shows_the_loaded_pairs_probe_and_the_ticked_machines(monkeypatch):
    probe = make_probe()
    name = service.DEFAULT_PRESET
    monkeypatch.setitem(service._EXECUTIONS, name, ("int8", probe, "Qwen target"))
    frame = machine_ui.machine_views(name, ["avx2-epyc"], folder=HARDWARE)
    assert "(chosen)" in _curves_of(frame.plot)["int8"].name
    assert {t.meta["recorded"] for t in frame.plot.data if isinstance(t.meta, dict) and t.meta.get("recorded")} == {
        "AVX2 EPYC"}
    assert f"{probe.verify_factor('bf16', probe.predicted['int8']['gamma'] + 1):.2f}" in frame.note
    # Forced without a probe: said plainly, the recorded machines drawn instead.
    monkeypatch.setitem(service._EXECUTIONS, name, ("fp32", None, "Qwen target"))
    monkeypatch.setattr(machine_ui, "_cached_probe", lambda name: None)
    frame = machine_ui.machine_views(name, [], folder=HARDWARE)
    assert "runs as **float32**, as set" in frame.note and "nothing was timed" in frame.note
    assert _curves_of(frame.plot, recorded=True) and not _curves_of(frame.plot)
    # Not loaded yet, nothing cached: the probe runs on the first load.
    monkeypatch.delitem(service._EXECUTIONS, name)
    assert "has not run on this server" in machine_ui.machine_views(name, [], folder=HARDWARE).note


def test_zero_gpu_spaces_run_the_target_eagerly_in_bf16(monkeypatch):
    """ZeroGPU lends the GPU only inside spaces.GPU calls: no probe, no CUDA graphs at load."""
    from specviz.serving import service

    service._default_target_exec.cache_clear()
    monkeypatch.delenv("SPECVIZ_TARGET_EXEC", raising=False)
    monkeypatch.setenv("SPACE_ID", "someone/specviz")
    monkeypatch.setenv("SPACES_ZERO_GPU", "1")
    assert service.default_target_exec() == "bf16"
    monkeypatch.setenv("SPECVIZ_TARGET_EXEC", "auto")  # an operator who asks for the probe gets it
    assert service.default_target_exec() == "auto"
    monkeypatch.delenv("SPACES_ZERO_GPU")
    monkeypatch.delenv("SPECVIZ_TARGET_EXEC")
    assert service.default_target_exec() == "auto"
    service._default_target_exec.cache_clear()


def test_a_lower_precision_is_named_with_what_it_costs(tmp_path, monkeypatch):
    import json

    from specviz.hardware import fidelity
    from specviz.views.execution import exec_line, precision_cost

    monkeypatch.setattr(fidelity, "FIDELITY_DIR", tmp_path)
    assert precision_cost("int8") == ""  # nothing measured: nothing claimed
    (tmp_path / "fidelity-int8.json").write_text(json.dumps({"exec": "int8", "mean_tv": 0.0412, "greedy_agree": 0.953}))
    assert precision_cost("int8") == ("vs the bf16 target: mean TV 0.041 a position, greedy tokens agree 95% on "
                                      "the shipped prompts")
    line = exec_line("int8", "AMD EPYC, AVX2 (no native bf16), 2 threads (torch 2.13.0+cpu)", how="chosen by measuring")
    assert line.startswith("target: int8 (per-channel") and "(chosen by measuring; vs the bf16 target: mean TV 0.041" in line
    assert "torch" not in line and precision_cost("bf16") == ""


def test_one_thread_is_one_thread():
    """The machine's words count its threads: "1 thread", "2 threads" (a race cut to one thread says so)."""
    import dataclasses

    one = dataclasses.replace(EPYC, threads=1)
    assert one.describe() == "AMD EPYC 7B13 64-Core Processor, AVX2 (no native bf16), 1 thread (torch 2.5.1)"
    assert EPYC.describe().endswith(", 2 threads (torch 2.5.1)")
