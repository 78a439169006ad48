"""The int8 multiply-add peak (specviz.hardware.peak, csrc/int8_peak.c): a plausible figure for each instruction set
this CPU has, a refusal -- never a SIGILL -- for one it lacks, and "peak not measured" without a compiler."""

from __future__ import annotations

import math

import pytest

from specviz.hardware import peak
from specviz.hardware.machine import cpu_flags

HERE = [isa for isa in peak.ISAS if not peak.refusal(isa)]
# What the CPU's flags promise: the loops the kernels run must be measurable wherever the flags say so.
PROMISED = [isa for isa, spec in peak.ISAS.items() if set(spec.flags) <= cpu_flags()]


def test_every_instruction_set_the_cpu_has_is_measured():
    assert peak.library()[0] is not None, f"the peak loop did not build: {peak.library()[1]}"
    assert HERE == PROMISED  # the C code's own CPUID/XCR0 check agrees with /proc/cpuinfo
    if "avx2" in cpu_flags():
        assert "avx2" in HERE


@pytest.mark.parametrize("isa", HERE)
def test_the_peak_is_a_plausible_rate_on_one_thread_and_on_two(isa):
    for threads in (1, 2):
        rate = peak.measure(isa, threads, reps=3)
        # Between 1 GMAC/s (a loaded VM's slowest) and 100 TMAC/s (far above any CPU core's int8 units today).
        assert math.isfinite(rate) and 1e9 < rate < 1e14, (isa, threads, rate)


def test_a_wider_instruction_is_never_slower_per_instruction_than_avx2():
    """A sanity check of the counting: vpdpbusd zmm (64 multiply-adds) does more a second than vpmaddubsw's
    three-instruction group (32) wherever both exist (here on a loaded machine: the best of a few runs)."""
    if "avx512_vnni_512" not in HERE:
        pytest.skip("no AVX-512 VNNI here")
    assert peak.measure("avx512_vnni_512", 1, reps=5) > peak.measure("avx2", 1, reps=5)


def test_an_instruction_set_the_cpu_lacks_is_refused_not_run(monkeypatch):
    lacking = [isa for isa in peak.ISAS if isa not in HERE]
    if not lacking:
        pytest.skip("this CPU has every instruction set of the loop (AMX included)")
    isa = lacking[0]  # AMX on the 2-core EPYC
    assert peak.refusal(isa).startswith("the CPU has no")
    with pytest.raises(peak.Refused, match=isa):
        peak.measure(isa)
    # Even where the caller believes the CPU has it (a wrong flags list), the C code asks CPUID itself and refuses.
    monkeypatch.setattr(peak, "refusal", lambda name, flags=None: "")
    with pytest.raises(peak.Refused, match="the CPU lacks it|not enabled|not compiled"):
        peak.measure(isa)
    lib = peak.library()[0]
    assert lib.specviz_int8_peak(peak.ISAS[isa].code, 10, 1) < 0
    assert lib.specviz_int8_peak(99, 10, 1) == -1  # an unknown code: refused too
    monkeypatch.undo()
    with pytest.raises(peak.Refused, match="unknown"):
        peak.measure("sse9")


def test_the_record_lists_each_instruction_set_measured_or_absent():
    record = peak.measure_peaks(2)
    assert set(record["gmacs"]) == set(HERE) and set(record["absent"]) == set(peak.ISAS) - set(HERE)
    for figures in record["gmacs"].values():
        assert set(figures) == {"1", "2"} and all(v > 1 for v in figures.values())
    if "amx" not in HERE:
        assert "amx" in record["absent"]
    assert record["seconds"] < 2.0  # ~0.1-0.3 s on the 2-core EPYC; 0.5 s budgeted, slack for a loaded machine
    best = peak.kernel_peak(record)
    assert best is not None and best[0] in peak.KERNEL_ISAS and best[0] != "amx"
    assert best[1] == max(c["2"] for isa, c in record["gmacs"].items() if isa in peak.KERNEL_ISAS)
    assert peak.kernel_peak(record, isa_flags=["avx2", "fma"])[0] == "avx2"  # an AVX2 emulation hides AVX-512
    if "avx512_vnni" in cpu_flags():  # int8 rows (fbgemm) and the GGUF kernels' passes run zmm vpdpbusd
        assert peak.kernel_peak(record, isa_flags=["avx512_vnni", "avx2"])[0] == "avx512_vnni_512"
        assert peak.kernel_peak(record, isa_flags=["avx512_vnni", "avx2"], gguf=True)[0] == "avx512_vnni_512"
        assert peak.kernel_peak(record, isa_flags=["avx512f", "avx2"], gguf=True)[0] == "avx2"
    assert peak.kernel_peak({"gmacs": {}, "why": "peak not measured"}) is None and peak.kernel_peak(None) is None


def test_without_a_compiler_the_record_says_peak_not_measured(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    monkeypatch.setattr(peak, "_LIB", {})
    monkeypatch.setattr(peak, "_compiler", lambda: None)
    record = peak.measure_peaks(2)
    assert record["gmacs"] == {} and record["why"] == "peak not measured: no C compiler here"
    assert not list(tmp_path.rglob("*.so"))
    assert peak.kernel_peak(record) is None


def test_the_loop_is_built_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    monkeypatch.setattr(peak, "_LIB", {})
    assert peak.library()[0] is not None
    built = list((tmp_path / "kernels").glob("int8-peak-*.so"))
    assert len(built) == 1
    monkeypatch.setattr(peak, "_LIB", {})
    monkeypatch.setattr(peak, "_compiler", lambda: pytest.fail("compiled again"))
    assert peak.library()[0] is not None
