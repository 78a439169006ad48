"""A warm start that serves at once (specviz.models.warm, issue 34): int8 models loaded with their fbgemm
packing deferred run on onednn's product over the same int8 values, bit-identical to the packed
product; the packing then finishes in the background (the draft's steps traced last, under the lock),
and a race run meanwhile is flagged."""

from __future__ import annotations

import copy
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from specviz.core.kv import cached_lm
from specviz.models import int8, lean, warm
from specviz.models.int8_target import TokenInt8Linear, plain_matches, unpacked
from specviz.models.tiny import build_tiny_pair
from specviz.theory.timing import assess_race

pytestmark = pytest.mark.skipif(not int8.int8_available() or not plain_matches(),
                                reason="deferred packing needs onednn's int8 product to be fbgemm's to the bit, which "
                                       "it is not on this CPU (AVX-512 / AMX: other kernels), or this torch has no "
                                       "int8 kernels (not an x86 build)")


@pytest.fixture(autouse=True)
def _fbgemm_and_onednn():
    """These are the deferred packing's tests: fbgemm's packing and onednn's stopgap, without specviz's own
    kernel (which needs no packing: tests/test_kernels.py)."""
    from specviz.models import kernels

    kernels.set_enabled(False)
    yield
    kernels.set_enabled(None)


def _qweight(rows: int, cols: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(rows, cols, generator=gen) * 0.05
    return int8.int8_channel_weight(weight)


@pytest.mark.parametrize("shape", [(96, 64), (320, 896), (64, 1000)])
def test_the_plain_product_is_bit_identical_to_the_packed_one_at_every_batch_size(shape):
    qweight = _qweight(*shape, seed=shape[0])
    bias = torch.randn(shape[0])
    plain, packed = TokenInt8Linear(qweight, bias, pack=False), TokenInt8Linear(qweight.clone(), bias, pack=False)
    plain.plain()
    packed.pack()
    assert plain._plain is not None and plain._packed is None and packed.packed
    gen = torch.Generator().manual_seed(1)
    for m in (1, 2, 3, 6, 17, 64):
        x = torch.randn(m, shape[1], generator=gen) * torch.rand(m, 1, generator=gen) * 20
        x[:, 0] *= 100  # one outlier feature, as real activations have
        assert torch.equal(plain(x), packed(x)), m
    # and the weights it reports (the learned head reads them) are the same values
    assert torch.equal(plain.dequantized(), packed.dequantized())


def _deferred_pair():
    tiny = build_tiny_pair(vocab_size=48, seed=0, hidden=64, target_layers=2, draft_layers=1)
    ref_target = int8.quantize_int8(copy.deepcopy(tiny.target), kind="token")
    ref_draft = int8.int8_draft(copy.deepcopy(tiny.target))  # a lean-capable int8 model as the draft
    target = int8.quantize_int8(copy.deepcopy(tiny.target), kind="token", defer_packing=True)
    draft = int8.int8_draft(copy.deepcopy(tiny.target), defer_packing=True)
    pair = SimpleNamespace(target=target, draft=draft, draft_name="draft", target_name="target")
    return pair, ref_target, ref_draft


def test_a_deferred_load_serves_at_once_and_the_background_finish_changes_no_output():
    pair, ref_target, ref_draft = _deferred_pair()
    ids = torch.randint(0, 48, (1, 9), generator=torch.Generator().manual_seed(2))
    assert unpacked(pair.target) and unpacked(pair.draft)  # nothing packed: every linear runs plain
    assert all(m._plain is not None for m in unpacked(pair.target))
    steps = pair.draft._specviz_steps
    assert steps.trace_deferred and not steps.traced
    with torch.inference_mode():
        before = pair.target(ids).logits
        assert torch.equal(before, ref_target(ids).logits)
        draft_before = cached_lm(pair.draft, torch.device("cpu"), need=32)
        q_before = draft_before.feed(ids[0].tolist(), keep=1).logits
        draft_before.free()
    assert warm.pending(pair) and not warm.preparing(pair)

    lock = threading.Lock()
    thread = warm.finish(pair, lock=lock)
    assert thread is not None and warm.finish(pair, lock=lock) is None  # one finisher per pair
    thread.join(60)
    assert not warm.preparing(pair) and warm.wait(pair, 0)
    assert not unpacked(pair.target) and not unpacked(pair.draft) and not warm.pending(pair)
    assert not steps.trace_deferred and set(steps.traced) == set(lean.TRACED_FEEDS)
    with torch.inference_mode():
        assert torch.equal(pair.target(ids).logits, before)
        lm = cached_lm(pair.draft, torch.device("cpu"), need=32)
        assert torch.equal(lm.feed(ids[0].tolist(), keep=1).logits, q_before)
        lm.free()
        ref = cached_lm(ref_draft, torch.device("cpu"), need=32)
        torch.testing.assert_close(ref.feed(ids[0].tolist(), keep=1).logits, q_before, rtol=1e-5, atol=1e-5)
        ref.free()


def test_the_trace_waits_for_the_lock_and_packing_beside_a_forward_changes_nothing(monkeypatch):
    monkeypatch.setattr(warm, "YIELD_S", 0.0)  # pack beside the run at once: forwards see the switch
    pair, ref_target, _ = _deferred_pair()
    ids = torch.randint(0, 48, (1, 7), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        want = ref_target(ids).logits
    lock = threading.Lock()
    lock.acquire()  # a run holds the model lock: the finisher packs, but does not trace yet
    thread = warm.finish(pair, lock=lock)
    outs = []
    with torch.inference_mode():
        while unpacked(pair.target) or len(outs) < 3:  # forwards while the linears switch under them
            outs.append(pair.target(ids).logits)
    assert all(torch.equal(o, want) for o in outs)
    steps = pair.draft._specviz_steps
    thread.join(0.5)
    assert thread.is_alive() and steps.trace_deferred and warm.preparing(pair)
    lock.release()
    thread.join(60)
    assert not steps.trace_deferred and not warm.preparing(pair)


def test_pack_now_finishes_a_model_before_it_is_timed():
    pair, _, _ = _deferred_pair()
    warm.pack_now(pair.draft)
    assert not unpacked(pair.draft) and pair.draft._specviz_steps.traced


def test_a_race_run_while_the_weights_were_prepared_is_flagged():
    from tests.test_timing import _race  # a judged race of realistic passes

    spec, std = _race()
    assert assess_race(spec, std).reliable
    timing = assess_race(spec, std, preparing=True)
    assert not timing.reliable and "preparing the models' fast kernels" in timing.why
    short = assess_race(spec, None, preparing=True)  # not judged by its passes, still not quoted
    assert not short.reliable


def test_a_sweep_on_a_fresh_server_waits_for_the_fast_kernels(monkeypatch):
    """A sweep measures: started while a pair is still being prepared, it first says why it waits, and waits."""
    from specviz.ui import tabs

    events = []
    monkeypatch.setattr(warm, "preparing_any", lambda: True)
    monkeypatch.setattr(warm, "wait_all", lambda timeout=None: events.append(("waited", timeout)) or True)
    monkeypatch.setattr(tabs, "request_at_gate", lambda *a, **k: (events.append(("gate",)), iter(()))[1])

    class Form:
        def check(self):
            return None

    frames = tabs.enter_gate(Form(), None, "sweep")
    first = next(frames)
    assert "just started" in first.status and events == []
    with pytest.raises(StopIteration):
        next(frames)
    assert events == [("waited", tabs.WARM_WAIT_S), ("gate",)]


def test_packing_waits_for_a_run_to_end_but_not_forever(monkeypatch):
    pair, _, _ = _deferred_pair()
    lock = threading.Lock()
    monkeypatch.setattr(warm, "YIELD_S", 60.0)
    before = len(unpacked(pair.target))
    lock.acquire()  # a run is going: the first linear waits for it
    thread = warm.finish(pair, lock=lock)
    thread.join(0.5)
    assert thread.is_alive() and len(unpacked(pair.target)) == before
    lock.release()  # the run ended: packing goes on, then the trace takes the lock
    thread.join(60)
    assert not unpacked(pair.target) and not warm.preparing(pair)

    other, _, _ = _deferred_pair()
    monkeypatch.setattr(warm, "YIELD_S", 0.05)
    lock.acquire()  # a room that never pauses: each linear still gets packed, YIELD_S later
    thread = warm.finish(other, lock=lock)
    give_up = time.monotonic() + 60
    while unpacked(other.target) or unpacked(other.draft):
        assert time.monotonic() < give_up and thread.is_alive()
        time.sleep(0.05)
    assert other.draft._specviz_steps.trace_deferred  # but the trace needs the lock itself
    lock.release()
    thread.join(60)
    assert not other.draft._specviz_steps.trace_deferred


def test_the_preload_hands_the_lock_over_often_until_the_pair_is_prepared_then_restores(monkeypatch):
    """While the default pair loads beside the page's imports, the interpreter lock is handed over every
    START_SWITCH_S (a background thread's C calls otherwise wait up to 5 ms each); the default comes back once
    the pair is prepared, or when the load fails (logged, shown to the next visitor)."""
    import sys

    from specviz.serving import preload

    default = sys.getswitchinterval()
    seen, release = [], threading.Event()

    def fake_get_pair(preset, serve_early=False):
        seen.append((serve_early, sys.getswitchinterval()))
        release.wait(10)
        if len(seen) > 1:
            raise RuntimeError("no weights here")
        return SimpleNamespace(target=object())  # nothing pending for warm.wait

    monkeypatch.setattr(preload, "get_pair", fake_get_pair)
    for _ in range(2):  # a load that succeeds, then one that fails
        monkeypatch.setattr(preload, "_STARTED", [])
        release.clear()
        thread = preload.start()
        assert preload.start() is thread  # once
        time.sleep(0.05)
        assert sys.getswitchinterval() == pytest.approx(preload.START_SWITCH_S)
        release.set()
        thread.join(10)
        assert not thread.is_alive() and sys.getswitchinterval() == pytest.approx(default)
    assert seen == [(True, pytest.approx(preload.START_SWITCH_S))] * 2


def test_finish_stops_between_two_steps_when_the_process_exits(monkeypatch):
    """At exit (atexit), finish()'s thread stops before its next linear or trace and is waited for: a daemon
    thread still inside a torch op ended the process with "terminate called without an active exception"."""
    pair, _, _ = _deferred_pair()
    packed = []
    real = TokenInt8Linear.pack

    def slow_pack(self):
        packed.append(self)
        time.sleep(0.05)
        real(self)

    monkeypatch.setattr(TokenInt8Linear, "pack", slow_pack)
    monkeypatch.setattr(warm, "_STOPPING", threading.Event())
    todo = len(unpacked(pair.target)) + len(unpacked(pair.draft))
    thread = warm.finish(pair)
    assert thread is not None and thread in warm._THREADS
    time.sleep(0.08)
    warm._stop_at_exit()
    assert not thread.is_alive() and not warm.preparing(pair)  # ended, and said so
    assert 0 < len(packed) < todo  # stopped between two linears


def test_a_server_holds_the_traces_until_its_page_is_served_then_a_grace_period(monkeypatch):
    """While a server builds its page (pure Python under the interpreter lock), finish() packs and keeps the prompt
    heads but traces nothing; once the page is served (warm.serving) it traces, SERVE_GRACE_S later, so the first
    visitors' runs take the model lock before the first trace does."""
    from specviz.models.compiled import steps_of

    pair, _, _ = _deferred_pair()
    monkeypatch.setattr(warm, "_SERVING", threading.Event())
    monkeypatch.setattr(warm, "_SERVED_AT", [])
    monkeypatch.setattr(warm, "SERVE_GRACE_S", 0.3)
    warm.hold_traces()
    traced = []
    for model in (pair.draft, pair.target):
        steps = steps_of(model)
        if steps is None:
            continue
        real = steps.trace
        monkeypatch.setattr(steps, "trace", lambda feeds, _real=real: traced.append(time.monotonic()) or _real(feeds))
    thread = warm.finish(pair)
    assert thread is not None
    deadline = time.monotonic() + 60
    while (unpacked(pair.target) or unpacked(pair.draft)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not unpacked(pair.target) and not unpacked(pair.draft)  # packed while held
    time.sleep(0.5)
    assert traced == [] and warm.preparing(pair)  # ... but not traced
    served = time.monotonic()
    warm.serving()
    thread.join(120)
    assert not thread.is_alive() and not warm.preparing(pair)
    assert traced and min(traced) >= served + 0.3  # after the grace period


def test_the_preload_starts_once_when_two_threads_ask_at_once(monkeypatch):
    """app.py starts the preload from a thread of its own (so its imports overlap Gradio's) and main() asks
    again: whichever comes first starts it, the other gets that thread; held traces are held either way."""
    from specviz.serving import preload

    release = threading.Event()
    calls = []

    def fake_get_pair(preset, serve_early=False):
        calls.append(preset)
        release.wait(10)
        return SimpleNamespace(target=object())

    monkeypatch.setattr(preload, "get_pair", fake_get_pair)
    monkeypatch.setattr(preload, "_STARTED", [])
    monkeypatch.setattr(warm, "_SERVING", threading.Event())
    warm._SERVING.set()
    barrier, got = threading.Barrier(4), []

    def ask():
        barrier.wait()
        got.append(preload.start(hold_traces=True))

    askers = [threading.Thread(target=ask) for _ in range(4)]
    for t in askers:
        t.start()
    for t in askers:
        t.join(10)
    assert len(got) == 4 and len({id(t) for t in got}) == 1
    assert not warm._SERVING.is_set()  # the traces are held until the page is served
    release.set()
    got[0].join(10)
    assert calls == [preload.default_preset()]
