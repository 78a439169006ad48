"""The int8 draft's lean decode path (specviz.models.lean) against transformers' forward on the same
int8 weights: same logits (to float rounding) through prefills, steps, multi-token feeds, crops
and cache growth; and the engine runs a chain on it with greedy text equal to standard decoding."""

from __future__ import annotations

import copy

import pytest
import torch

from specviz.core.engine import standard_decode
from specviz.core.kv import CachedLM, cached_lm
from specviz.core.settings import DecodeSettings
from specviz.models import int8, lean
from specviz.models.compiled import StaticLM
from specviz.models.tiny import build_tiny_pair
from tests.drafted import speculative_decode

pytestmark = pytest.mark.skipif(not int8.int8_available(), reason="this torch has no fbgemm int8 kernels")


def _int8_model(layers: int = 2, seed: int = 0):
    pair = build_tiny_pair(vocab_size=40, seed=seed, hidden=64, target_layers=layers, draft_layers=1)
    return pair, int8.quantize_int8(copy.deepcopy(pair.target), kind="token")


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_lean_matches_transformers_through_feeds_crops_and_growth(monkeypatch):
    monkeypatch.setattr(lean, "_START", 8)  # grow the cache several times within the test
    _, model = _int8_model()
    ids = torch.randint(0, 40, (70,), generator=torch.Generator().manual_seed(3)).tolist()
    ref = CachedLM(model, torch.device("cpu"))
    steps = lean.attach(model)
    assert steps is not None
    fast = cached_lm(model, torch.device("cpu"), need=100)
    assert isinstance(fast, StaticLM) and fast.steps is steps
    with torch.inference_mode():
        plan = [(12, 12), (13, 1), (17, 4), (18, 1)]  # (length fed up to, positions kept)
        for end, keep in plan:
            _close(ref.feed(ids[:end], keep=keep).logits, fast.feed(ids[:end], keep=keep).logits)
        ref.crop(14), fast.crop(14)  # a rejection: roll back, then feed a different continuation
        _close(ref.feed(ids[:14] + [5, 6, 7], keep=3).logits, fast.feed(ids[:14] + [5, 6, 7], keep=3).logits)
        _close(ref.feed(ids, keep=2).logits, fast.feed(ids, keep=2).logits)  # past 8, 16, 32 and 64 slots
        fed = fast.feed(ids + [1], hidden=True)
        assert fed.hidden is not None and fed.hidden.shape == (1, 64)
    assert steps.capacity >= 71
    fast.free()
    assert not steps.in_use


def test_lean_refuses_what_it_cannot_run():
    pair, model = _int8_model()
    assert lean.unsupported(pair.target) is not None  # float linears: not the int8 draft
    assert lean.attach(pair.target) is None and not hasattr(pair.target, "_specviz_steps")
    assert lean.unsupported(model) is None
    with pytest.raises(ValueError, match="lean"):
        lean.LeanSteps(pair.target, 64)


def test_lean_cache_bound_is_enforced():
    _, model = _int8_model()
    steps = lean.LeanSteps(model, max_len=10)
    with pytest.raises(RuntimeError, match="holds 10 tokens"):
        steps.forward(list(range(11)), keep=1)


def test_lean_caches_are_float32_whatever_torchs_default_dtype_is_meanwhile():
    """torch's default dtype is process-wide, and transformers' from_pretrained sets it to the checkpoint's (bf16)
    while it loads, in whichever thread: a run's cache allocated then must still be float32, with the same logits
    (it was bf16, and the first key written into it raised: seen in a parallel test run)."""
    _, model = _int8_model()
    ids = list(range(5, 17))
    reference = lean.LeanSteps(model, max_len=64)
    want = reference.forward(ids, keep=3)[0]
    steps = lean.LeanSteps(model, max_len=64)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # as local_torch_dtype leaves it while another thread loads a model
    try:
        got = steps.forward(ids, keep=3)[0]
    finally:
        torch.set_default_dtype(default)
    assert all(k.dtype == torch.float32 for k in steps.keys + steps.values) and steps._cos.dtype == torch.float32
    assert torch.equal(got, want)


def test_engine_chain_on_the_lean_draft_keeps_greedy_text():
    pair, draft = _int8_model(layers=2, seed=4)
    int8.int8_draft(draft)  # the loader's path: int8 draft + lean steps
    assert lean.unsupported(draft) is None and hasattr(draft, "_specviz_steps")
    pair = copy.copy(pair)
    pair.draft = draft
    prompt = [5, 6, 7, 8, 9]
    settings = DecodeSettings(gamma=4, temperature=0.0, max_new_tokens=24)
    spec = speculative_decode(pair, prompt, settings)
    std = standard_decode(pair, prompt, settings)
    assert [t.id for t in spec.tokens] == [t.id for t in std.tokens] and len(std.tokens) > 5
    assert len(spec.rounds) < spec.n_tokens  # some drafted tokens were accepted
    assert not draft._specviz_steps.in_use  # the run gave the steps back


def test_traced_steps_equal_the_eager_forward_through_growth(monkeypatch):
    """The traced one- and two-token graphs give the eager _decode's logits bit for bit, also after the
    cache has grown past the capacity they were traced at (no shape in the graph is the cache's)."""
    monkeypatch.setattr(lean, "_START", 8)
    _, model = _int8_model(seed=2)
    traced = lean.LeanSteps(model, 200)
    assert traced.trace() > 0 and set(traced.traced) == {1, 2}
    eager = lean.LeanSteps(model, 200)
    assert eager.traced == {}
    ids = torch.randint(0, 40, (40,), generator=torch.Generator().manual_seed(5)).tolist()
    used = {1: 0, 2: 0}
    calls = {}
    for t, graph in traced.traced.items():  # count the graphs' calls
        def counting(*args, _t=t, _g=graph):
            used[_t] += 1
            return _g(*args)
        calls[t] = counting
    traced.traced = calls
    with torch.inference_mode():
        assert torch.equal(traced.forward(ids[:6], 1)[0], eager.forward(ids[:6], 1)[0])
        at, rolled = 6, set()
        while at < 38:  # one- and two-token feeds, past 8, 16 and 32 slots, with rollbacks
            t = 1 + (at % 3 == 0)
            a, b = traced.forward(ids[at:at + t], 1)[0], eager.forward(ids[at:at + t], 1)[0]
            assert torch.equal(a, b), at
            at += t
            if at % 7 == 0 and at not in rolled:  # a rejection: roll both back two tokens, feed again
                rolled.add(at)
                at -= 2
                traced.set_length(at), eager.set_length(at)
    assert traced.capacity >= 38 and used[1] > 10 and used[2] > 3


def test_traced_steps_are_optional_and_fall_back(monkeypatch):
    _, model = _int8_model()
    assert lean.attach(copy.deepcopy(model), trace=False).traced == {}
    steps = lean.LeanSteps(model, 64)

    def broken(*args, **kwargs):
        raise RuntimeError("no tracer here")

    monkeypatch.setattr(torch.jit, "trace", broken)
    assert steps.trace() == 0.0 and steps.traced == {}
    with torch.inference_mode():
        logits, _ = steps.forward([1, 2, 3], 1)
    assert logits.shape == (1, 40)


def test_the_drafts_shared_prompt_head_is_fed_apart_and_kept_with_the_same_bits():
    """A chat template's fixed head (models.tokens.template_head) is fed as a call of its own and its keys and
    values kept: a later prompt with the same head copies them and feeds only the rest, with the very bits of a
    run that computed them (cleared store); the logits stay transformers' within float tolerance."""
    _, model = _int8_model()
    ref_model = copy.deepcopy(model)
    steps = lean.attach(model, 256, trace=False)
    assert steps is not None
    head = (5, 9, 2, 33, 7, 1, 30, 12, 4, 8)
    steps.shared_prefix = head
    gen = torch.Generator().manual_seed(1)
    prompts = [list(head) + torch.randint(0, 40, (n,), generator=gen).tolist() for n in (7, 12)]
    calls = []
    body = steps._body
    steps._body = lambda tokens, *a, **k: calls.append(len(tokens)) or body(tokens, *a, **k)

    def run(ids: list[int]) -> torch.Tensor:
        steps.set_length(0)
        return steps.forward(ids, keep=1)[0]

    first = run(prompts[0])
    assert calls == [len(head), 7] and list(steps._prefix_kv) == [head]
    calls.clear()
    second = run(prompts[1])
    assert calls == [12]  # the head's keys and values were copied, not computed
    steps._prefix_kv.clear()
    assert torch.equal(run(prompts[1]), second) and torch.equal(run(prompts[0]), first)
    no_head = list(prompts[0])
    no_head[0] = 6  # another head: fed whole, nothing kept for it
    calls.clear()
    run(no_head)
    assert calls == [len(no_head)] and list(steps._prefix_kv) == [head]
    with torch.inference_mode():
        ref = CachedLM(ref_model, torch.device("cpu"))
        _close(ref.feed(prompts[1]).logits[-1:], second[-1:])
