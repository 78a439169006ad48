"""A server's start with nothing to choose serves first and times its one execution afterwards, between runs (issue 63).

The pair on its GGUF's blocks has one execution on a CPU; timing it before the first run cost a cold start ~4 s of
the default race's 31 s.  The chooser now takes that execution unmeasured where the caller serves first (a probe
marked ``after_serving``, never recorded), and :func:`specviz.hardware.choose.measure_after_serving` times it once
the page is served, holding the model lock, and records it for the next start."""

from __future__ import annotations

import threading

import pytest
import torch

from specviz.hardware import choose
from specviz.hardware import probe as hw_probe
from specviz.hardware.machine import this_machine
from specviz.models import executions, int8
from specviz.models.loaders import ExecutionRequest
from specviz.models.tiny import build_tiny_pair


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(int8, "machine_busy", lambda: False)  # the test machine's other work must not decide
    return tmp_path / "cache"


def _request(pair, target, *, later: bool, candidates=("bf16",)) -> ExecutionRequest:
    return ExecutionRequest(target=target, ref="tiny", name="tiny", device=torch.device("cpu"), dtype=torch.bfloat16,
                            requested="auto", draft=pair.draft, vocab=40, alpha=0.8, candidates=candidates,
                            build=lambda e: executions.apply(target, e, copy_model=True),
                            apply=lambda e: executions.apply(target, e), progress=None, later=later)


def test_one_candidate_served_first_is_not_timed_at_load_nor_recorded(cache):
    pair = build_tiny_pair(vocab_size=40, sharpness=3.0)
    target = pair.target.to(torch.bfloat16)
    model, execution, probe = choose.choose_execution(_request(pair, target, later=True))
    assert model is target and execution == "bf16"
    assert probe.after_serving and not probe.measured and not probe.curves
    assert hw_probe.known(this_machine("cpu"), "tiny", torch.bfloat16) is None  # nothing recorded
    # not served first, or several to choose from: measured at load, as before
    _, _, probe = choose.choose_execution(_request(pair, target, later=False))
    assert probe.measured and probe.curves and not probe.after_serving


def test_after_serving_the_execution_is_measured_holding_the_lock_and_recorded(cache):
    tiny = build_tiny_pair(vocab_size=40, sharpness=3.0)
    tiny.target = tiny.target.to(torch.bfloat16)
    _, execution, probe = choose.choose_execution(_request(tiny, tiny.target, later=True))
    tiny.target_exec, tiny.probe, tiny.dtype = execution, probe, torch.bfloat16
    lock, served = threading.Lock(), threading.Event()
    held_while_measuring = []
    real = hw_probe.probe_target

    def watched(*args, **kwargs):
        held_while_measuring.append(lock.locked())
        return real(*args, **kwargs)

    hw_probe.probe_target = watched
    try:
        thread = choose.measure_after_serving(tiny, lock, lambda: served.wait(30) or True)
        assert thread is not None
        thread.join(0.3)
        assert thread.is_alive() and not tiny.probe.measured  # waits for the page to be served
        served.set()
        thread.join(60)
    finally:
        hw_probe.probe_target = real
    assert held_while_measuring == [True]
    assert tiny.probe.measured and tiny.probe.curves.get("bf16") and not tiny.probe.after_serving
    assert hw_probe.trusted(this_machine("cpu"), "tiny", torch.bfloat16) is not None
    assert choose.measure_after_serving(tiny, lock, lambda: True) is None  # measured: nothing more to do


def test_the_page_says_it_is_measured_once_served():
    from specviz.views import execution, how, machine_words

    probe = hw_probe.Probe({"label": "EPYC, 2 threads", "threads": 2}, "offline:x", {}, None, 0.8, "int8",
                           measured=False, after_serving=True)
    assert "once the page is served" in execution.chosen_how("int8", probe)
    assert "timed once the page is served" in machine_words.machine_text(probe, execution="int8")
    assert "busy" not in how.verify_sentence(probe)


def test_a_machine_never_quiet_leaves_the_probe_unmeasured_and_says_busy(cache, monkeypatch):
    tiny = build_tiny_pair(vocab_size=40, sharpness=3.0)
    tiny.target = tiny.target.to(torch.bfloat16)
    _, execution, probe = choose.choose_execution(_request(tiny, tiny.target, later=True))
    tiny.target_exec, tiny.probe, tiny.dtype = execution, probe, torch.bfloat16
    monkeypatch.setattr(int8, "machine_busy", lambda: True)
    monkeypatch.setattr(choose, "TRIES", 2)
    monkeypatch.setattr(choose, "RETRY_S", 0.0)
    monkeypatch.setattr(choose, "IDLE_S", 0.0)
    thread = choose.measure_after_serving(tiny, threading.Lock(), lambda: True)
    thread.join(30)
    assert not thread.is_alive()
    assert not tiny.probe.measured and not tiny.probe.after_serving and not tiny.probe.curves
    assert hw_probe.known(this_machine("cpu"), "tiny", torch.bfloat16) is None  # nothing recorded
