"""The bandwidth bound (specviz.hardware.roofline): the bytes a step reads in the form the model executes, the
copy bandwidth, and what the probe keeps of both, drawn and said on the This machine tab."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from specviz.hardware import roofline
from specviz.hardware.probe import Probe, choose
from specviz.models import executions, q4k
from specviz.models.q6k import Q6KLinear
from specviz.models.tiny import build_tiny_pair
from specviz.views import machine as M
from specviz.views import machine_words as W
from tests.test_machine import CURVES, EPYC


def _float_bytes(model: torch.nn.Module) -> int:
    return sum(p.nbytes for p in model.parameters())


def _qwen(tied: bool, vocab: int = 300, hidden: int = 64) -> torch.nn.Module:
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    return Qwen2ForCausalLM(cfg).to(torch.bfloat16)


def test_a_float_step_reads_every_weight_once_and_one_row_of_an_untied_embedding():
    untied = _qwen(tied=False)
    table = untied.model.embed_tokens.weight
    assert roofline.step_bytes(untied) == _float_bytes(untied) - table.nbytes + table[0].nbytes
    tied = _qwen(tied=True)  # the head is the table: read whole, once
    assert tied.lm_head.weight.data_ptr() == tied.model.embed_tokens.weight.data_ptr()
    assert roofline.step_bytes(tied) == _float_bytes(tied)
    assert roofline.step_bytes(untied.float()) == 2 * roofline.step_bytes(_qwen(tied=False))


def test_quantized_products_count_what_their_kernels_read():
    w = torch.randn(40, 512)
    bias = torch.randn(40)
    lin = q4k.Q4KLinear(q4k.quantize(w), bias)
    assert roofline._product_bytes(lin) == 40 * 2 * q4k.REC + 40 * 4  # 152 bytes per row and block of 256
    records = torch.zeros(8, 1, 212, dtype=torch.uint8)
    assert roofline._product_bytes(Q6KLinear(records, None)) == 8 * 212
    assert roofline._product_bytes(torch.nn.Linear(4, 4)) is None  # a float linear: its parameters
    # The int8 execution of a tiny target: its products read ~1 byte a weight where bf16 read 2, each fused
    # product once; the embedding's one row and the norms stay float.
    pair = build_tiny_pair(vocab_size=40)
    bf16 = pair.target.to(torch.bfloat16)
    int8 = executions.apply(bf16, "int8", copy_model=True)
    weights = sum(m.weight.numel() for m in bf16.modules() if isinstance(m, torch.nn.Linear))
    small = roofline.step_bytes(int8)
    assert weights < small < 1.4 * weights  # int8 values, row scales and sums, blocked layout's padding
    assert small < 0.75 * roofline.step_bytes(bf16)


def test_copy_bandwidth_is_a_rate_and_the_bound_its_quotient():
    bw = roofline.copy_bandwidth("cpu", nbytes=8 * 2**20, reps=3)
    assert math.isfinite(bw) and bw > 1e8  # bytes/s read and written
    assert roofline.bound_ms(2e9, 20e9) == pytest.approx(100.0)


def _probe(**kw) -> Probe:
    choice, predicted = choose(CURVES, 25.0, 0.8)
    return Probe(EPYC.as_dict(), "offline:target", CURVES, 25.0, 0.8, choice, predicted, seconds=12.0, **kw)


def test_the_probe_keeps_the_bound_and_old_probes_read_without_it():
    probe = _probe(step_mb={"int8": 1500.0, "bf16": 3000.0}, draft_mb=400.0, copy_gbps=20.0)
    assert probe.choice == "int8"
    assert probe.bound_ratio() == pytest.approx(100.0 / 75.0)  # T(1) 100 ms over 1500 MB at 20 GB/s = 75 ms
    assert probe.bound_ratio("bf16") == pytest.approx(80.0 / 150.0)
    again = Probe.from_dict(probe.as_dict())
    assert again.step_mb == probe.step_mb and again.copy_gbps == 20.0 and again.draft_mb == 400.0
    old = probe.as_dict()
    for key in ("step_mb", "draft_mb", "copy_gbps"):
        del old[key]
    before = Probe.from_dict(old)
    assert before.step_mb == {} and before.copy_gbps is None and before.bound_ratio() is None


def test_the_tab_draws_and_says_the_bound():
    probe = _probe(step_mb={"int8": 1500.0}, draft_mb=400.0, copy_gbps=20.0)
    text = W.machine_text(probe, execution="int8", target="Qwen target")
    assert "**The bandwidth bound**" in text and "reads 1,500 MB" in text and "(20.0 GB/s" in text
    assert "takes 75 ms: T(1) = 100 ms is **1.33×** that" in text
    # the draft's 400 MB at 20 GB/s: 20 ms, 0.20 of the 100 ms step, against the measured 25 / 100
    assert "(0.27 of the target's bytes): even at the bound its step would cost c = 0.20" in text
    assert "(measured: c = 0.25)" in text
    fig = M.verify_cost_figure(probe)
    bound = [t for t in fig.data if (t.meta or {}).get("reference") == "bound"]
    assert len(bound) == 1 and list(bound[0].y) == [75.0, 75.0] and "1,500 MB" in bound[0].name
    plain = _probe()
    assert "bandwidth bound" not in W.machine_text(plain, execution="int8")
    assert not [t for t in M.verify_cost_figure(plain).data if (t.meta or {}).get("reference") == "bound"]


def test_the_probe_measures_the_bytes_of_each_execution_and_the_bandwidth(tmp_path, monkeypatch):
    from specviz.hardware import probe as hw_probe

    monkeypatch.setattr(hw_probe, "_probe_path", lambda: tmp_path / "probe.json")
    bf16 = build_tiny_pair(vocab_size=40).target.to(torch.bfloat16)
    result, _ = hw_probe.probe_target(bf16, "tiny", torch.bfloat16, 40, draft_ms=0.1, alpha=0.8, full=True,
                                      build=lambda e: executions.apply(bf16, e, copy_model=True),
                                      candidates=("bf16", "fp32", "int8"), busy=lambda: False, draft_bytes=123_456)
    assert set(result.step_mb) == {"bf16", "fp32", "int8"}
    assert result.step_mb["bf16"] == pytest.approx(roofline.step_bytes(bf16) / 1e6, abs=1e-3)
    assert result.step_mb["fp32"] == pytest.approx(2 * result.step_mb["bf16"], abs=2e-3)
    assert result.step_mb["int8"] < result.step_mb["bf16"]
    assert result.draft_mb == 0.123 and result.copy_gbps > 0.1
    assert result.weights == {}  # a tiny float target has no GGUF records


def test_an_int8_execution_on_the_ggufs_matrices_is_named_so():
    from specviz.models.executions import Q4K_WORDS, WORDS

    gguf = _probe(weights={"int8": "gguf"})
    text = W.machine_text(gguf, execution="int8")
    row = next(line for line in text.splitlines() if line.startswith("- **int8**"))
    assert Q4K_WORDS[len("int8 "):] in row and WORDS["int8"][len("int8 "):] not in row
    assert Probe.from_dict(gguf.as_dict()).weights == {"int8": "gguf"}
    own = W.machine_text(_probe(), execution="int8")
    assert WORDS["int8"][len("int8 "):] in next(line for line in own.splitlines() if line.startswith("- **int8**"))


def test_an_older_probe_gets_the_bound_once_on_a_quiet_start(tmp_path, monkeypatch):
    from specviz.hardware import probe as hw_probe
    from specviz.hardware import probe_once
    from specviz.hardware.machine import this_machine

    monkeypatch.setattr(hw_probe, "_probe_path", lambda: tmp_path / "probe.json")
    pair = build_tiny_pair(vocab_size=40)
    target = pair.target.to(torch.bfloat16)
    old = Probe(this_machine("cpu").as_dict(), "tiny", {"bf16": {1: 5.0, 2: 6.0}}, 2.0, 0.8, "bf16")
    busy = probe_once.add_bound(Probe.from_dict(old.as_dict()), target, pair.draft, torch.bfloat16, busy=lambda: True)
    assert busy.copy_gbps is None and busy.step_mb == {}  # a busy machine's copy would mean nothing
    got = probe_once.add_bound(old, target, pair.draft, torch.bfloat16, busy=lambda: False)
    assert got.step_mb == {"bf16": round(roofline.step_bytes(target) / 1e6, 3)}
    assert got.draft_mb == round(roofline.step_bytes(pair.draft) / 1e6, 3) and got.copy_gbps > 0.1
    kept = hw_probe.known(this_machine("cpu"), "tiny", torch.bfloat16)
    assert kept is not None and kept.copy_gbps == got.copy_gbps  # remembered: the next start measures nothing
    monkeypatch.setattr(roofline, "copy_bandwidth", lambda *a, **k: pytest.fail("measured again"))
    assert probe_once.add_bound(kept, target, pair.draft, torch.bfloat16, busy=lambda: False).copy_gbps == got.copy_gbps


# ---- the compute side: the int8 peak (hardware.peak) and the roofline max(bandwidth, k × compute) ----------------

PEAK = {"threads": 2, "gmacs": {"avx2": {"1": 100.0, "2": 200.0}, "avx512_vnni_256": {"1": 200.0, "2": 400.0},
                               "avx512_vnni_512": {"1": 400.0, "2": 800.0}},
        "absent": {"amx": "the CPU has no amx_tile, amx_int8"}, "seconds": 0.1}


def test_the_roofline_is_the_larger_of_the_bandwidth_and_the_compute_bound():
    assert roofline.compute_ms(1.5e9, 150.0) == pytest.approx(10.0)  # 1.5 G multiply-adds at 150 GMAC/s
    roof = roofline.Roofline(bandwidth_ms=50.0, token_ms=10.0)
    assert [roof.at(k) for k in (1, 4, 5, 6, 8)] == [50.0, 50.0, 50.0, 60.0, 80.0]
    assert roof.knee() == 5.0
    assert roof.ratio(8, 168.0) == pytest.approx(2.1)  # "T(8) = 2.1× its roofline"
    alone = roofline.Roofline(bandwidth_ms=50.0)  # no peak: the bandwidth bound alone, flat
    assert alone.at(8) == 50.0 and alone.knee() is None and alone.ratio(2, 75.0) == 1.5
    assert roofline.Roofline(None, 10.0).at(3) == 30.0 and roofline.Roofline(None).at(3) is None


def test_a_tokens_multiply_adds_are_its_products_weights():
    untied = _qwen(tied=False)
    linears = sum(m.weight.numel() for m in untied.modules() if isinstance(m, torch.nn.Linear))
    assert roofline.token_macs(untied) == linears
    # ≈ the parameter count: all of it but the embedding table and the norms' and biases' few values
    params = sum(p.numel() for p in untied.parameters()) - untied.model.embed_tokens.weight.numel()
    assert 0.97 * params < linears <= params
    pair = build_tiny_pair(vocab_size=40)
    bf16 = pair.target.to(torch.bfloat16)
    int8 = executions.apply(bf16, "int8", copy_model=True)  # fused q/k/v and gate/up: each product once
    assert roofline.token_macs(int8) == roofline.token_macs(bf16) > 0


def test_the_probes_roofline_takes_the_kernels_fastest_peak_for_int8_only():
    probe = _probe(step_mb={"int8": 1500.0, "bf16": 3000.0}, copy_gbps=20.0, peak=PEAK, token_macs=1_600_000_000)
    roof = roofline.probe_roofline(probe)
    # EPYC's recorded flags are AVX2 only: the VNNI figure is not one its products can run
    assert (roof.isa, roof.gmacs, roof.bandwidth_ms, roof.token_ms) == ("avx2", 200.0, 75.0, 8.0)
    vnni = _probe(step_mb={"int8": 1500.0}, copy_gbps=20.0, peak=PEAK, token_macs=1_600_000_000)
    vnni.machine = {**vnni.machine, "isa": ["avx512_vnni", "avx512f", "avx2"]}
    assert roofline.probe_roofline(vnni).isa == "avx512_vnni_512" and roofline.probe_roofline(vnni).token_ms == 2.0
    vnni.weights = {"int8": "gguf"}  # the GGUF's Q4_K / Q6_K kernels: passes two tokens a zmm, vpdpbusd
    assert roofline.probe_roofline(vnni).isa == "avx512_vnni_512" and roofline.probe_roofline(vnni).token_ms == 2.0
    vnni.machine = {**vnni.machine, "isa": ["avx512f", "avx2"]}  # Skylake-SP: fbgemm's zmm vpmaddubsw, not timed
    assert roofline.probe_roofline(vnni).isa == "avx2"  # ...but the GGUF's kernels run their AVX2 form there
    vnni.weights = {}
    assert roofline.probe_roofline(vnni) == roofline.Roofline(75.0)
    assert roofline.probe_roofline(probe, "bf16") == roofline.Roofline(150.0)  # bf16: the bandwidth bound alone
    unmeasured = _probe(step_mb={"int8": 1500.0}, copy_gbps=20.0, peak={"gmacs": {}, "why": "peak not measured: x"},
                        token_macs=1_600_000_000)
    assert roofline.probe_roofline(unmeasured) == roofline.Roofline(75.0)
    assert roofline.probe_roofline(_probe()) is None
    again = Probe.from_dict(probe.as_dict())
    assert again.peak == PEAK and again.token_macs == 1_600_000_000
    old = probe.as_dict()
    del old["peak"], old["token_macs"]
    before = Probe.from_dict(old)
    assert before.peak is None and roofline.probe_roofline(before) == roofline.Roofline(75.0)


def test_the_tab_draws_the_compute_line_and_says_where_each_tk_stands():
    # T(k) of int8: 100, 110, 130, 170 ms; roofline max(75, k × 8 ms): 75, 75, 75, 75 (knee at k = 9.4)
    probe = _probe(step_mb={"int8": 1500.0}, draft_mb=400.0, copy_gbps=20.0, peak=PEAK, token_macs=1_600_000_000)
    probe.curves["int8"] = {1: 100.0, 2: 110.0, 4: 130.0, 8: 170.0, 16: 260.0}
    fig = M.verify_cost_figure(probe)
    line = [t for t in fig.data if (t.meta or {}).get("reference") == "roofline"]
    assert len(line) == 1 and not [t for t in fig.data if (t.meta or {}).get("reference") == "bound"]
    assert list(line[0].x) == [1, 9.375, 16] and list(line[0].y) == [75.0, 75.0, 128.0]  # flat, then k × 8 ms
    assert "roofline of int8" in line[0].name and "200 GMAC/s" in line[0].name
    text = W.machine_text(probe, execution="int8", target="Qwen target")
    assert "**The roofline**" in text and "**200 GMAC/s** on 2 threads (AVX2 vpmaddubsw + vpmaddwd" in text
    assert "T(k) ≥ max(75 ms, k × 8.00 ms): flat up to k ≈ 9, then climbing" in text
    assert "T(1) = 1.3×, T(2) = 1.5×, T(4) = 1.7×, T(8) = 2.3×, T(16) = 2.0× its roofline" in text
    assert "AMX tdpbusd tiles absent (the CPU has no amx_tile, amx_int8)" in text
    assert ("GMAC/s on 1 / 2 threads: AVX2 vpmaddubsw + vpmaddwd 100 / 200; AVX-512 VNNI vpdpbusd, 256-bit 200 / 400"
            in text)
    # no peak measured (no compiler): the bandwidth bound alone, flat, said so
    bare = _probe(step_mb={"int8": 1500.0}, copy_gbps=20.0, token_macs=1_600_000_000,
                  peak={"threads": 2, "gmacs": {}, "absent": {}, "why": "peak not measured: no C compiler here"})
    words = W.machine_text(bare, execution="int8")
    assert "the int8 peak was not measured (peak not measured: no C compiler here)" in words
    assert "Measured against it: T(1) = 1.3×" in words
    assert [t for t in M.verify_cost_figure(bare).data if (t.meta or {}).get("reference") == "bound"]


def test_the_probe_times_the_peak_with_the_curves_and_an_older_probe_gets_it_once(tmp_path, monkeypatch):
    from specviz.hardware import peak
    from specviz.hardware import probe as hw_probe
    from specviz.hardware import probe_once
    from specviz.hardware.machine import this_machine

    monkeypatch.setattr(hw_probe, "_probe_path", lambda: tmp_path / "probe.json")
    pair = build_tiny_pair(vocab_size=40)
    bf16 = pair.target.to(torch.bfloat16)
    result, _ = hw_probe.probe_target(bf16, "tiny", torch.bfloat16, 40, draft_ms=0.1, alpha=0.8,
                                      build=lambda e: executions.apply(bf16, e, copy_model=True),
                                      candidates=("bf16", "int8"), busy=lambda: False)
    assert result.token_macs == roofline.token_macs(bf16)
    assert result.peak["threads"] == torch.get_num_threads()
    assert set(result.peak["gmacs"]) | set(result.peak["absent"]) == set(peak.ISAS)
    # a probe from before the peak was kept: measured once on a quiet start, then remembered
    old = Probe(this_machine("cpu").as_dict(), "tiny", {"bf16": {1: 5.0, 2: 6.0}}, 2.0, 0.8, "bf16", copy_gbps=9.0,
                step_mb={"bf16": 1.0})
    assert probe_once.add_bound(Probe.from_dict(old.as_dict()), bf16, pair.draft, torch.bfloat16,
                                busy=lambda: True).peak is None
    got = probe_once.add_bound(old, bf16, pair.draft, torch.bfloat16, busy=lambda: False)
    assert got.peak["gmacs"] and got.copy_gbps == 9.0 and got.token_macs == roofline.token_macs(bf16)
    kept = hw_probe.known(this_machine("cpu"), "tiny", torch.bfloat16)
    assert kept is not None and kept.peak == got.peak
    monkeypatch.setattr(peak, "measure_peaks", lambda *a, **k: pytest.fail("measured again"))
    assert probe_once.add_bound(kept, bf16, pair.draft, torch.bfloat16, busy=lambda: False).peak == got.peak
