""""How it works" says what a verify pass costs from this machine's probe (T(k)/T(1)), never from its
instruction set, and the This machine tab names the CPU's AVX-512 units as it does AMX and AVX2."""

from __future__ import annotations

import re

import pytest

from specviz.hardware.machine import Machine
from specviz.hardware.probe import Probe, choose
from specviz.views import how
from specviz.views import machine_words as W

XEON = Machine("cpu", "Intel(R) Xeon(R) Platinum 8481C", ("amx_bf16", "amx_int8", "avx512_bf16", "avx512_vnni",
                                                          "avx512f", "avx_vnni", "avx2", "fma"), 8, "2.5.1")
SKYLAKE = Machine("cpu", "Intel(R) Xeon(R) Gold 6148", ("avx512f", "avx2", "fma"), 4, "2.5.1")
EPYC = Machine("cpu", "AMD EPYC 7B13 64-Core Processor", ("avx2", "fma"), 2, "2.5.1")


def probe(machine: Machine, curve: dict[int, float], execution: str = "bf16") -> Probe:
    curves = {execution: curve}
    choice, predicted = choose(curves, 20.0, 0.8)
    return Probe(machine.as_dict(), "offline:target", curves, 20.0, 0.8, choice, predicted, seconds=3.0)


def _factor(text: str) -> float:
    return float(re.search(r"costs \*\*([\d.]+)\*\* one-token steps", text).group(1))


@pytest.mark.parametrize("curve, words", [
    ({1: 100.0, 2: 102.0, 4: 106.0, 8: 114.0}, "memory-bound here"),
    ({1: 100.0, 2: 125.0, 4: 175.0, 8: 275.0}, "compute-bound here: a verify pass costs several steps"),
    ({1: 100.0, 2: 115.0, 4: 145.0, 8: 205.0}, "partly compute-bound here"),
])
def test_the_verify_cost_comes_from_the_probes_curve_not_the_isa(curve, words):
    """An AMX Xeon was called memory-bound (a verify costs about one step) while its races measured 1.9–2.5
    steps: the sentence now reads the measured curve of the execution the target runs as."""
    p = probe(XEON, curve)
    text = how.verify_sentence(p)
    k = int(re.search(r"a (\d+)-token verify pass", text).group(1))
    lo, hi = max(x for x in curve if x <= k), min(x for x in curve if x >= k)
    expect = (curve[lo] + (curve[hi] - curve[lo]) * ((k - lo) / (hi - lo) if hi != lo else 0)) / curve[1]
    assert _factor(text) == pytest.approx(expect, abs=0.005)
    assert words in text and f"T({k})/T(1)" in text
    assert "AMX (BF16, INT8), AVX-512 (F, VNNI, BF16)" in text  # named, but not the reason
    assert ("fast, not free" in text) == (words != "memory-bound here")
    page = how.how_it_works(p, heads="")
    assert text in page and "CPUs with AMX" not in page and "AMX matrix units" not in page


def test_without_a_measured_curve_nothing_is_assumed():
    assert how.verify_sentence(None) == how.NOT_PROBED and "not been timed" in how.NOT_PROBED
    busy = Probe(XEON.as_dict(), "offline:target", {}, None, 0.8, "bf16", measured=False)
    text = how.verify_sentence(busy)
    assert "could not time" in text and "memory-bound" not in text and "compute-bound" not in text
    one = probe(EPYC, {1: 90.0})
    assert "only the target's one-token step was timed" in how.verify_sentence(one)
    assert "memory-bound" not in how.verify_sentence(one)
    # the page's text: the algorithm, the machine, the glossary, the references, in that order
    page = how.how_it_works(None, heads="### Draft heads\n")
    order = [page.index(s) for s in ("### How speculative decoding works", how.NOT_PROBED, "### Draft heads",
                                     "### Glossary", "**References.**")]
    assert order == sorted(order)


@pytest.mark.parametrize("machine, words", [
    (XEON, "AMX (BF16, INT8), AVX-512 (F, VNNI, BF16), AVX-VNNI, AVX2"),
    (SKYLAKE, "AVX-512 (F), AVX2"),
    (EPYC, "AVX2"),
])
def test_the_machine_tab_names_avx512_as_it_does_amx_and_avx2(machine, words):
    assert W.isa_words(machine.as_dict()) == words
    text = W.machine_text(probe(machine, {1: 100.0, 2: 120.0, 4: 160.0, 8: 240.0}), target="Qwen target")
    assert f"Its CPU has {words}:" in text
    native = "avx512_bf16" in machine.isa or "amx_bf16" in machine.isa
    assert ("native bf16 units." in text) == native and ("no native bf16 units" in text) != native
    busy = Probe(machine.as_dict(), "offline:target", {}, None, 0.8, "int8", measured=False)
    assert f"Its CPU has {words}:" in W.machine_text(busy, target="Qwen target")
    assert W.isa_words({"kind": "cuda", "name": "NVIDIA H200"}) == "" and W.isa_words(None) == ""


def test_the_tab_reads_the_pairs_probe(monkeypatch):
    """machine_ui.how_text: the tab's markdown with the probe of the page's pair, and without one, says so."""
    from specviz.models import TINY_PRESET
    from specviz.ui import machine_ui

    assert how.NOT_PROBED in machine_ui.how_text(TINY_PRESET)  # the tiny pair is never probed
    measured = probe(XEON, {1: 100.0, 2: 125.0, 4: 175.0, 8: 275.0})
    monkeypatch.setattr(machine_ui, "probe_of", lambda preset: measured)
    text = machine_ui.how_text()
    assert "a 6-token verify pass costs **2.25** one-token steps" in text and "compute-bound here" in text
    assert "### Glossary" in text and "### Draft heads" in text
