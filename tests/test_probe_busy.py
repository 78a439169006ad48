"""A probe taken while the machine is busy is not a measurement of the machine (issue 65).

Beside the README's test command on a busy 2-core machine, the probe recorded T(1) = 1,420 ms (51.4 ms quiet), a
copy bandwidth of 16.8 GB/s (30.6 quiet) and speculation 3x faster at γ 10 as ``"measured": true``; every later
start drew "This machine", the theory and its choices from it.  The probe now watches the machine over its own
window (specviz.models.busy.Watch): a busy probe is kept only as a flagged record, which nothing chooses from, the
page shows as not measured, and a quiet start measures again."""

from __future__ import annotations

import pytest
import torch

from specviz.hardware import choose, quiet, roofline
from specviz.hardware import probe as hw_probe
from specviz.hardware.machine import this_machine
from specviz.models import busy, executions, int8
from specviz.models.loaders import ExecutionRequest
from specviz.models.tiny import build_tiny_pair
from tests.hogs import alive, cpu_hogs

CANDIDATES = ("bf16", "fp32", "int8")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _target() -> torch.nn.Module:
    return build_tiny_pair(vocab_size=40, sharpness=3.0).target.to(torch.bfloat16)


def _probe(target: torch.nn.Module, candidates: tuple[str, ...] = CANDIDATES,
           **kw) -> tuple[hw_probe.Probe, torch.nn.Module]:
    return hw_probe.probe_target(target, "tiny", torch.bfloat16, 40, draft_ms=0.1, alpha=0.8, candidates=candidates,
                                 build=lambda e: executions.apply(target, e, copy_model=True), **kw)


def _cpu() -> object:
    return this_machine("cpu")


class FakeWatch:
    """A watch with a stated verdict (the quiet case must not depend on what else the test machine runs)."""

    def __init__(self, verdict: dict | None):
        self._verdict, self.asked = verdict, []

    def verdict(self, threads: int) -> dict | None:
        self.asked.append(threads)
        return self._verdict


# ---- with real CPU hogs -------------------------------------------------------------------------


def test_a_probe_beside_cpu_hogs_is_flagged_and_nothing_chooses_from_it(cache, monkeypatch):
    """Three busy loops start after the check before the probe (stated quiet here, as a load that starts a second
    later is): the watch over the probe's own window sees them, and the probe is recorded flagged, never chosen
    from, shown as not measured."""
    torch.set_num_threads(busy.core_count())  # the app probes on every core (the fixture restores one thread)
    target = _target()
    with cpu_hogs(3) as pids:  # (one execution timed: under the hogs every pass crawls)
        assert all(alive(p) for p in pids)
        result, model = _probe(target, ("bf16",), busy=lambda: False, watch=busy.Watch())
    machine = _cpu()
    assert not result.measured and result.busy and not result.curves and model is target
    assert result.busy["other_cores"] > result.busy["limit"] and result.busy["threads"] == busy.core_count()
    assert set(result.busy["step_ms"]) == {"bf16"}  # what was timed, kept aside
    stored = hw_probe.read_probes()
    (entry,) = stored.values()
    assert entry["measured"] is False and entry["busy"]["other_cores"] == result.busy["other_cores"]
    assert entry["curves"] == {}
    recorded = hw_probe.known(machine, "tiny", torch.bfloat16)
    assert recorded is not None and recorded.busy and not recorded.measured  # visible, as flagged
    assert hw_probe.trusted(machine, "tiny", torch.bfloat16) is None  # chosen from by nothing
    # a stated quiet start measures again rather than running the flagged record's choice
    monkeypatch.setattr(int8, "machine_busy", lambda: False)
    assert choose.known_choice(torch.device("cpu"), "tiny", torch.bfloat16) is None
    monkeypatch.setattr(int8, "machine_busy", lambda: True)
    assert choose.known_choice(torch.device("cpu"), "tiny", torch.bfloat16) == hw_probe.fallback(machine)


def test_cpu_hogs_from_the_start_leave_nothing_measured(cache):
    """This machine's own checks, before and over the probe: whichever sees the hogs, nothing is a measurement."""
    torch.set_num_threads(busy.core_count())
    target = _target()
    with cpu_hogs(3):
        result, _ = _probe(target, ("bf16",))
    assert not result.measured and not result.curves
    assert hw_probe.trusted(_cpu(), "tiny", torch.bfloat16) is None


# ---- the quiet case and the flagged record, on stated verdicts ---------------------------------------------------


def test_a_quiet_watch_keeps_the_probe(cache):
    watch = FakeWatch(None)
    result, _ = _probe(_target(), ("bf16",), busy=lambda: False, watch=watch)
    assert result.measured and result.busy is None and result.curves and result.copy_gbps
    assert watch.asked == [torch.get_num_threads()] * 2  # after the timings, and after the copy
    assert hw_probe.trusted(_cpu(), "tiny", torch.bfloat16) is not None


def test_a_flagged_probe_never_replaces_a_measurement_and_runs_the_fallback(cache, monkeypatch):
    first, _ = _probe(_target(), ("bf16",), busy=lambda: False, watch=FakeWatch(None))
    crowd = {"other_cores": 1.7, "cores": 2, "threads": 2, "limit": 0.5, "seconds": 3.0}
    monkeypatch.setattr(roofline, "copy_bandwidth", lambda *a: pytest.fail("a busy machine's copy timed"))
    flagged, model = _probe(_target(), ("bf16", "int8"), busy=lambda: False, watch=FakeWatch(crowd))
    assert not flagged.measured and flagged.busy["other_cores"] == 1.7 and flagged.busy["copy_gbps"] is None
    assert flagged.choice == hw_probe.fallback(_cpu()) == "int8" and flagged.draft_ms is None
    assert set(flagged.busy["step_ms"]) == {"bf16", "int8"} and flagged.busy["draft_ms"] == 0.1
    assert (model.config._attn_implementation == "specviz_invariant")  # the fallback runs, whatever the timings said
    kept = hw_probe.trusted(_cpu(), "tiny", torch.bfloat16)
    assert kept is not None and kept.curves == {e: {k: round(v, 1) for k, v in c.items()} for e, c in first.curves.items()}


def test_the_int8_peak_is_timed_inside_the_watch(cache, monkeypatch):
    """The roofline's int8 peak (hardware.peak) is timed with the copy, after the curves and before the last verdict:
    other work over it flags the probe like other work over the curves, and nothing of it is kept as a measurement."""
    from specviz.hardware import peak

    events: list[str] = []

    class Watch(FakeWatch):
        def __init__(self, *verdicts: dict | None):
            super().__init__(None)
            self.verdicts = list(verdicts)

        def verdict(self, threads: int) -> dict | None:
            events.append("verdict")
            self._verdict = self.verdicts.pop(0)
            return super().verdict(threads)

    real = peak.measure_peaks
    monkeypatch.setattr(peak, "measure_peaks", lambda threads: events.append("peak") or real(threads))
    quiet_, _ = _probe(_target(), ("bf16",), busy=lambda: False, watch=Watch(None, None))
    assert events == ["verdict", "peak", "verdict"] and quiet_.measured and quiet_.peak["gmacs"]
    crowd = {"other_cores": 1.7, "cores": 2, "threads": 2, "limit": 0.5, "seconds": 3.0}
    events.clear()  # crowded over the peak's own part of the window: timed, flagged, kept aside only
    late, _ = _probe(_target(), ("bf16",), busy=lambda: False, watch=Watch(None, crowd))
    assert events == ["verdict", "peak", "verdict"] and not late.measured and late.peak is None
    assert late.busy["peak"]["gmacs"]
    events.clear()  # crowded over the curves: the peak is not timed at all
    early, _ = _probe(_target(), ("bf16",), busy=lambda: False, watch=Watch(crowd, crowd))
    assert events == ["verdict"] and early.peak is None and early.busy["peak"] is None


def test_a_stated_machine_is_not_watched(monkeypatch):
    """A test's or an operator's busy() stands for the window too: a stated quiet machine's probe is kept whatever
    else runs (the suite's own tests beside it)."""
    assert isinstance(quiet.watch(lambda: False), busy.Stated) and quiet.watch(lambda: False).verdict(2) is None
    assert quiet.watch(lambda: True).verdict(2) == {"stated": True, "threads": 2}
    assert quiet.stated() is None and isinstance(quiet.watch(), busy.Watch)
    monkeypatch.setattr(int8, "machine_busy", lambda: False)  # as the loader's tests state the machine
    assert quiet.stated() is not None and isinstance(quiet.watch(), busy.Stated)


def test_after_a_flagged_probe_a_start_measures_again_only_on_a_quiet_machine(cache, monkeypatch):
    machine = _cpu()
    flagged = hw_probe.unmeasured(machine, "tiny", 0.8, CANDIDATES, busy={"other_cores": 1.8, "cores": 2})
    hw_probe.remember(flagged, machine, "tiny", torch.bfloat16)
    pair = build_tiny_pair(vocab_size=40, sharpness=3.0)
    target = pair.target.to(torch.bfloat16)

    def request() -> ExecutionRequest:
        return ExecutionRequest(target=target, ref="tiny", name="tiny", device=torch.device("cpu"),
                                dtype=torch.bfloat16, requested="auto", draft=pair.draft, vocab=40, alpha=0.8,
                                candidates=CANDIDATES, build=lambda e: executions.apply(target, e, copy_model=True),
                                apply=lambda e: executions.apply(target, e), progress=None)

    monkeypatch.setattr(int8, "machine_busy", lambda: True)  # still busy: the fallback, unmeasured, record kept
    _, execution, probe = choose.choose_execution(request())
    assert execution == hw_probe.fallback(machine) and not probe.measured and not probe.curves
    assert hw_probe.known(machine, "tiny", torch.bfloat16).busy
    monkeypatch.setattr(int8, "machine_busy", lambda: False)  # quiet: measured, and the record replaced
    _, execution, probe = choose.choose_execution(request())
    assert probe.measured and probe.curves and execution == probe.choice
    assert hw_probe.trusted(machine, "tiny", torch.bfloat16) is not None


def test_the_page_shows_a_flagged_record_as_not_measured():
    from specviz.views import how, machine, machine_words

    flagged = hw_probe.Probe.from_dict({"machine": {"label": "EPYC, AVX2 only, 2 threads", "threads": 2},
                                        "model": "offline:x", "curves": {}, "draft_ms": None, "alpha": 0.8,
                                        "choice": "int8", "measured": False,
                                        "busy": {"other_cores": 1.8, "cores": 2, "step_ms": {"int8": 1420.0}}})
    assert not flagged.measured and not hw_probe.is_trusted(flagged)
    assert "nothing was measured" in machine_words.machine_text(flagged, execution="int8")
    assert "busy" in how.verify_sentence(flagged) and "1420" not in how.verify_sentence(flagged)
    assert "busy" in machine.verify_cost_figure(flagged, machine.load_recorded()).layout.title.text
    assert not machine.verify_cost_figure(flagged).data  # no curve of this machine's drawn
    # a record marked measured but flagged (written by hand, or by an older writer) is still no measurement
    odd = hw_probe.Probe.from_dict({**flagged.as_dict(), "measured": True, "curves": {"int8": {"1": 1420.0}}})
    assert not odd.measured and not hw_probe.is_trusted(odd)
