"""The target's records in huge pages (specviz.models.hugepages): moved once at load, the same bits after, the
switch and the machine's THP mode obeyed, the probe and the roofline told."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest
import torch

from specviz.hardware import probe, roofline
from specviz.models import executions, hugepages, int8, invariant, kernels, lean, q4k, q6k
from specviz.models.compiled import steps_of
from specviz.models.tiny import build_tiny_pair
from test_lean_target import _steps_logits, _verify_logits

needs_kernel = pytest.mark.skipif(not int8.int8_available() or not kernels.matches(policy=False),
                                  reason="specviz's kernel needs an x86 CPU with AVX2 and a C++ compiler")


@pytest.fixture
def kernel_on(monkeypatch):
    """specviz's kernel and the GGUF's matrices as stored (the default where the kernel runs), whatever the caller's
    environment."""
    monkeypatch.setenv("SPECVIZ_Q4K", "1")
    kernels.set_enabled(True)
    yield
    kernels.set_enabled(None)


@pytest.fixture
def thp(tmp_path, monkeypatch):
    """The machine's THP mode as a file this test writes (``madvise`` unless it says otherwise)."""
    mode = tmp_path / "enabled"
    mode.write_text("always [madvise] never\n")
    monkeypatch.setattr(hugepages, "THP_MODE", mode)
    monkeypatch.setenv("SPECVIZ_HUGEPAGES", "1")
    return mode


def test_enabled_follows_the_machines_thp_mode_and_the_switch(thp, monkeypatch):
    assert hugepages.enabled()
    thp.write_text("[always] madvise never\n")
    assert hugepages.enabled()
    thp.write_text("always madvise [never]\n")
    assert not hugepages.enabled()
    thp.unlink()  # no THP in this kernel (or not Linux)
    assert not hugepages.enabled()
    thp.write_text("always [madvise] never\n")
    monkeypatch.setenv("SPECVIZ_HUGEPAGES", "0")
    assert not hugepages.enabled()


def test_empty_starts_on_a_huge_page_and_outlives_its_mapping_name():
    t = hugepages.empty(3 * hugepages.HUGE + 5)
    assert t.dtype == torch.uint8 and t.numel() == 3 * hugepages.HUGE + 5
    assert t.data_ptr() % hugepages.HUGE == 0
    t.fill_(7)
    gc.collect()  # the mapping lives as long as the tensor
    assert int(t[-1]) == 7 and int(t.sum()) == 7 * t.numel()


def _native_target(tmp_path, monkeypatch):
    """A tiny Q4_K_M target built on its GGUF's blocks (models.gguf_native), as the default pair's is."""
    from specviz.models import gguf_native
    from specviz.models.gguf_file import GGUFFile
    from tests.test_models import Q4_K_M, write_tiny_gguf

    path = tmp_path / "target.gguf"
    if not path.exists():
        write_tiny_gguf(path, seed=2, hidden=256, ffn=256, layers=2, types=Q4_K_M)
    with GGUFFile(path) as gguf:
        model = gguf_native.build(gguf, (), "tiny")
    invariant.make_invariant(model)
    lean.attach(model, trace=True, invariant=True)
    return model


def _records(model) -> list[torch.Tensor]:
    return [m.weight if isinstance(m, q4k.Q4KLinear) else m.records
            for m in model.modules() if isinstance(m, (q4k.Q4KLinear, q6k.Q6KLinear))]


def _step_logits(model, ids: list[int]) -> torch.Tensor:
    """A chain's draft steps over ``ids`` on the model's lean steps (traced once warm): the last logits of a
    4-token feed, then of each one-token step."""
    steps = steps_of(model)
    with torch.inference_mode():
        steps.set_length(0)
        out = [steps.forward(ids[:4], 1)[0][-1]]
        out += [steps.forward([token], 1)[0][-1] for token in ids[4:]]
        steps.set_length(0)
    return torch.stack(out).float()


@needs_kernel
def test_a_gguf_targets_records_are_made_in_one_huge_page_region_and_score_the_same_bits(tmp_path, thp, kernel_on,
                                                                                         monkeypatch):
    monkeypatch.setenv("SPECVIZ_HUGEPAGES", "0")
    plain = _native_target(tmp_path, monkeypatch)
    monkeypatch.setenv("SPECVIZ_HUGEPAGES", "1")
    made = _native_target(tmp_path, monkeypatch)
    a, b = _records(plain), _records(made)
    assert len(a) == len(b) == 2 * 5 + 1  # per layer q/k, v, o, gate/up, down; the head
    # one region, starting on a huge page, each record on a cache line of it; the plain ones elsewhere
    lo = min(t.data_ptr() for t in b)
    assert lo % hugepages.HUGE == 0 and all(t.data_ptr() % 64 == 0 for t in b)
    assert max(t.data_ptr() + t.nbytes for t in b) - lo < sum(t.nbytes + 64 for t in b)
    assert not any(lo <= t.data_ptr() < lo + hugepages.HUGE for t in a)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not hugepages.pending(made) and hugepages.rehome(made) == 0  # nothing left to move
    ids = torch.randint(5, 250, (30,), generator=torch.Generator().manual_seed(3)).tolist()
    for start, k in ((10, 6), (1, 8)):
        va, vb = _verify_logits(plain, ids, start, k), _verify_logits(made, ids, start, k)
        sa, sb = _steps_logits(plain, ids, start, k), _steps_logits(made, ids, start, k)
        assert torch.equal(va, vb) and torch.equal(sa, sb) and torch.equal(vb, sb), (start, k)


def test_rehome_leaves_a_model_without_records_or_with_the_switch_off(thp, monkeypatch):
    pair = build_tiny_pair(vocab_size=40, hidden=64)
    assert hugepages.rehome(pair.target) == 0  # no Q4_K / Q6_K products
    w = torch.randint(0, 256, (4, 1, q6k.REC), dtype=torch.uint8)
    model = torch.nn.Sequential(q6k.Q6KLinear(w, None))
    monkeypatch.setenv("SPECVIZ_HUGEPAGES", "0")
    assert hugepages.rehome(model) == 0 and model[0].records is w
    monkeypatch.setenv("SPECVIZ_HUGEPAGES", "1")
    assert hugepages.rehome(model) == w.nbytes
    assert model[0].records is not w and torch.equal(model[0].records, w)
    assert model[0].records.data_ptr() % hugepages.HUGE == 0


@needs_kernel
def test_the_probe_is_measured_again_with_huge_pages_and_the_copy_runs_on_them(thp, kernel_on, monkeypatch):
    machine = SimpleNamespace(kind="cpu", key="cpu|test")
    assert kernels.ready()
    on = probe.probe_key(machine, "m", torch.float32)
    monkeypatch.setenv("SPECVIZ_HUGEPAGES", "0")
    off = probe.probe_key(machine, "m", torch.float32)
    assert on == off + "|thp2"
    made = []
    real = hugepages.empty
    monkeypatch.setattr(hugepages, "empty", lambda n: made.append(n) or real(n))
    assert roofline.copy_bandwidth("cpu", nbytes=4 * 2**20, reps=2) > 0 and made == []  # switched off above
    monkeypatch.setenv("SPECVIZ_HUGEPAGES", "1")
    assert roofline.copy_bandwidth("cpu", nbytes=4 * 2**20, reps=2) > 0 and made == [4 * 2**20] * 2


@needs_kernel
def test_a_servers_load_leaves_the_drafts_move_to_the_background_finish_before_its_traces(thp, kernel_on):
    """An int8 draft loaded with transformers gets Q4_K records made here (models.q4k_draft): a server's load leaves
    their move to huge pages to models.warm, before the traces, which then hold the moved records."""
    import threading

    from specviz.models import warm

    pair = build_tiny_pair(vocab_size=40, sharpness=3.0, hidden=256)
    pair.target = executions.apply(pair.target, "int8")
    pair.draft = int8.int8_draft(pair.draft, defer_packing=True)
    drafts = _records(pair.draft)
    assert drafts and hugepages.pending(pair.draft)
    draft_ids = torch.randint(5, 40, (12,), generator=torch.Generator().manual_seed(4)).tolist()
    draft_logits = _step_logits(pair.draft, draft_ids)
    thread = warm.finish(pair, lock=threading.Lock())
    assert thread is not None
    thread.join(60)
    moved = _records(pair.draft)
    assert min(t.data_ptr() for t in moved) % hugepages.HUGE == 0 and not hugepages.pending(pair.draft)
    assert all(x.data_ptr() != y.data_ptr() and torch.equal(x, y) for x, y in zip(drafts, moved))
    assert steps_of(pair.draft).traced and not warm.pending(pair)
    assert torch.equal(_step_logits(pair.draft, draft_ids), draft_logits)  # its traced steps: the same bits


@needs_kernel
def test_pack_now_moves_the_records_before_the_probe_times_the_model(thp, kernel_on):
    from specviz.models import warm

    model = int8.int8_draft(build_tiny_pair(vocab_size=40, sharpness=3.0, hidden=256).draft, defer_packing=True)
    assert hugepages.pending(model)
    warm.pack_now(model)
    assert not hugepages.pending(model) and min(t.data_ptr() for t in _records(model)) % hugepages.HUGE == 0
    assert steps_of(model).traced
