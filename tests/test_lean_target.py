"""The int8 target on the lean, traced forward (specviz.models.lean with ``invariant=True``).

Speculative decoding samples the target's distribution only if a position scores the same in any pass:
a verify pass, the prompt pass merged with the first drafts, a one-token step, a token tree.  Here the
int8 target's lean steps are checked bit for bit for each, traced and eager, across two runs at once (a
race) and across cache capacities; and the engine's greedy text on them equals standard decoding."""

from __future__ import annotations

import pytest
import torch

from specviz.core.engine import standard_decode
from specviz.core.kv import CachedLM, cached_lm
from specviz.core.settings import DecodeSettings
from specviz.models import executions, int8, lean, lean_tree
from specviz.models.compiled import steps_of
from specviz.models.tiny import build_tiny_pair
from tests.drafted import speculative_decode

pytestmark = pytest.mark.skipif(not int8.int8_available(), reason="this torch has no fbgemm int8 kernels")

CPU = torch.device("cpu")
IDS = torch.randint(5, 40, (40,), generator=torch.Generator().manual_seed(3)).tolist()


def _target(seed: int = 0):
    pair = build_tiny_pair(vocab_size=40, sharpness=3.0, seed=seed)
    model = executions.apply(pair.target.to(torch.bfloat16), "int8", copy_model=True)
    return pair, model


def _counting(steps: lean.LeanSteps) -> dict[int, int]:
    """Count each traced graph's calls (the steps' graphs are wrapped in place)."""
    used = {t: 0 for t in steps.traced}
    for t, graph in list(steps.traced.items()):
        def counted(*args, _t=t, _g=graph):
            used[_t] += 1
            return _g(*args)
        steps.traced[t] = counted
    return used


def _steps_logits(model, ids: list[int], start: int, k: int, need: int = 64) -> torch.Tensor:
    lm = cached_lm(model, CPU, need)
    with torch.inference_mode():
        lm.feed(ids[:start])
        out = torch.stack([lm.feed(ids[:start + i + 1]).logits[-1] for i in range(k)])
    lm.free()
    return out


def _verify_logits(model, ids: list[int], start: int, k: int) -> torch.Tensor:
    """Positions start..start+k-1 scored in one verify pass after a prompt pass over ids[:start] (a run's cache)."""
    lm = cached_lm(model, CPU, 64)
    with torch.inference_mode():
        lm.feed(ids[:start])
        verify = lm.feed(ids[:start + k], keep=k).logits
    lm.free()
    return verify


def test_the_int8_target_gets_traced_lean_steps_a_cache_per_run():
    _, model = _target()
    steps = steps_of(model)
    assert isinstance(steps, lean.LeanSteps) and steps.invariant
    assert set(steps.traced) == set(lean.TARGET_FEEDS)  # traced at load (packed: nothing deferred)
    a, b = cached_lm(model, CPU, 64), cached_lm(model, CPU, 64)
    assert isinstance(a, lean_tree.LeanLM) and isinstance(b, lean_tree.LeanLM) and a.steps is not b.steps
    assert a.steps.traced is steps.traced  # shared graphs, separate caches
    a.free(), b.free()


def test_a_verify_pass_and_the_merged_prompt_pass_score_exactly_as_steps_traced_and_eager():
    _, model = _target()
    steps = steps_of(model)
    used = _counting(steps)
    for start, k in ((10, 6), (17, 3), (1, 8), (20, 12)):  # 12: longer than any traced feed (eager)
        assert torch.equal(_verify_logits(model, IDS, start, k), _steps_logits(model, IDS, start, k)), (start, k)
    with torch.inference_mode():  # the prompt and the first drafts in one pass (the engine's first round)
        lm = cached_lm(model, CPU, 64)
        merged = lm.feed(IDS[:16], keep=6).logits
        lm.free()
    assert torch.equal(merged, _steps_logits(model, IDS, 10, 6))
    assert used[1] > 20 and used[6] >= 1 and used[3] >= 1 and used[8] >= 1
    # The eager forward (no graphs) gives the same bits as the graphs.
    graphs, steps.traced = steps.traced, {}
    try:
        assert torch.equal(_steps_logits(model, IDS, 10, 6), _steps_logits(model, IDS, 10, 6).clone())
        eager = _steps_logits(model, IDS, 10, 6)
    finally:
        steps.traced = graphs
    assert torch.equal(eager, _steps_logits(model, IDS, 10, 6))


def test_the_lean_target_is_close_to_transformers_forward_on_the_same_weights():
    """Same model, two forwards: equal up to float rounding (an int8 quantum where a rounding flips)."""
    _, model = _target()
    ref = CachedLM(model, CPU)
    with torch.inference_mode():
        a = ref.feed(IDS[:20], keep=20).logits.float()
        lm = cached_lm(model, CPU, 64)
        b = lm.feed(IDS[:20], keep=20).logits
    assert (a.softmax(-1) - b.softmax(-1)).abs().sum(-1).max() < 0.05


def test_two_runs_fed_in_turn_each_score_as_alone_and_capacity_does_not_matter():
    _, model = _target()
    alone = _steps_logits(model, IDS, 8, 12, need=40)
    big = _steps_logits(model, IDS, 8, 12, need=1000)  # a 1024-slot cache (the tiny model's most): the same bits
    assert torch.equal(alone, big)
    a, b = cached_lm(model, CPU, 40), cached_lm(model, CPU, 300)
    rows = []
    with torch.inference_mode():
        a.feed(IDS[:8])
        for i in range(12):  # in turn with another run, as a race runs standard and speculative decoding
            rows.append(a.feed(IDS[:9 + i]).logits[-1])
            b.crop(3)  # the other run rolls back and feeds something else in between
            b.feed(IDS[:3] + [7] * (1 + i % 4), keep=2)
    a.free(), b.free()
    assert torch.equal(torch.stack(rows), alone)


def test_tree_nodes_score_as_steps_along_their_path_and_the_kept_path_continues_as_a_chain():
    _, model = _target(seed=1)
    prefix = IDS[:12]
    tokens, parents = [7, 8, 9, 10, 11], [-1, 0, 0, 2, -1]  # 7 -> (8, 9 -> 10); 11
    with torch.inference_mode():
        lm = cached_lm(model, CPU, 64, trees=True)
        assert isinstance(lm, lean_tree.LeanLM)
        lm.feed(prefix[:-1])
        tree = lm.feed_tree(prefix, tokens, parents).logits  # row 0: the prefix's last; then the nodes
        assert tree.shape[0] == 1 + len(tokens)
        for node, path in ((3, [7, 9, 10]), (1, [7, 8]), (4, [11]), (0, [7])):
            ref = _steps_logits(model, prefix + path, len(prefix) - 1, len(path) + 1)
            assert torch.equal(tree[0], ref[0])
            assert torch.equal(tree[1 + node], ref[-1]), node
        # a second layer of nodes under node 3 (10), fed in a later call, attends to its whole path
        more = lm.feed_tree(prefix, [12], [3]).logits
        assert torch.equal(more[0], _steps_logits(model, prefix + [7, 9, 10, 12], 11, 5)[-1])
        lm.keep_path([0, 2, 3])  # accept 7, 9, 10: the cache is the plain prefix + path
        assert lm.cached == len(prefix) + 3
        after = lm.feed(prefix + [7, 9, 10, 5, 6], keep=2).logits  # reads the moved keys and values
    ref = _steps_logits(model, prefix + [7, 9, 10, 5, 6], len(prefix) - 1, 6)
    assert torch.equal(after, ref[-2:])


@pytest.mark.parametrize("drafter,extra", [("model", {}), ("tree", {"branches": 2, "tree_nodes": 6})])
def test_greedy_speculative_text_is_standard_text_on_the_lean_target(drafter, extra):
    pair, model = _target(seed=2)
    pair.target = model
    ids = pair.tokenizer("the cat sat on").input_ids
    s = DecodeSettings(gamma=4, temperature=0.0, max_new_tokens=30, drafter=drafter, **extra)
    spec = speculative_decode(pair, ids, s)
    std = standard_decode(pair, ids, s)
    assert [t.id for t in spec.tokens] == [t.id for t in std.tokens] and len(std.tokens) > 5
    assert len(spec.rounds) < spec.n_tokens  # some drafted tokens were accepted


def test_a_deferred_target_is_traced_by_the_warm_finish():
    from specviz.models import warm

    pair = build_tiny_pair(vocab_size=40, sharpness=3.0)
    pair.target = executions.apply(pair.target.to(torch.bfloat16), "int8", copy_model=True, defer_packing=True)
    steps = steps_of(pair.target)
    assert steps.traced == {} and steps.trace_deferred and warm.pending(pair)
    before = _steps_logits(pair.target, IDS, 10, 6)  # eager meanwhile
    steps.shared_prefix = tuple(IDS[:5])  # as the loader sets it (the chat template's head)
    thread = warm.finish(pair)
    assert thread is not None
    thread.join(120)
    assert set(steps.traced) == set(lean.TARGET_FEEDS) and not warm.pending(pair)
    assert list(steps._prefix_kv) == [tuple(IDS[:5])]  # kept first, before any visitor's run
    assert torch.equal(_steps_logits(pair.target, IDS, 10, 6), before)


def test_the_targets_kept_prompt_head_gives_the_same_bits_and_runs_share_it():
    """The invariant target keeps the chat template head's keys and values (models.tokens.template_head), computed
    once (keep_prefix, as a server's warm start does, or by the first run) and shared by every run's copy of the
    steps: a prompt pass after it feeds only the rest, and every logit is bit-identical to a run without it."""
    _, model = _target()
    steps = steps_of(model)
    head = tuple(IDS[:10])  # longer than any traced feed, as is the rest below: both run eagerly (counted)
    with torch.inference_mode():
        lm = cached_lm(model, CPU, 64)
        ref_merged = lm.feed(IDS[:22], keep=6).logits  # the engine's first round: prompt + drafts in one pass
        lm.free()
    ref_steps = _steps_logits(model, IDS, 12, 6)
    steps.shared_prefix = head
    fed = []
    body = steps._body
    steps._body = lambda tokens, *a, **k: fed.append(len(tokens)) or body(tokens, *a, **k)
    try:
        assert steps.keep_prefix() and list(steps._prefix_kv) == [head] and not steps.keep_prefix()
        assert fed == [len(head)] and steps.capacity == 0  # computed through a run's copy: no cache kept here
        fed.clear()
        with torch.inference_mode():
            a, b = cached_lm(model, CPU, 64), cached_lm(model, CPU, 64)  # two runs of a race: both copy the head
            merged_a = a.feed(IDS[:22], keep=6).logits
            merged_b = b.feed(IDS[:22], keep=6).logits
            a.free(), b.free()
        assert torch.equal(merged_a, ref_merged) and torch.equal(merged_b, ref_merged)
        assert fed == [12, 12]  # each run fed the rest only: the head was never fed again
        assert torch.equal(_steps_logits(model, IDS, 12, 6), ref_steps)
        fed.clear()
        other = [IDS[1]] + IDS[1:22]  # another start: fed whole, nothing kept for it
        with torch.inference_mode():
            lm = cached_lm(model, CPU, 64)
            lm.feed(other, keep=2)
            lm.free()
        assert fed == [22] and list(steps._prefix_kv) == [head]
        steps.trace((1,))  # tracing releases the cache, not the kept head
        assert list(steps._prefix_kv) == [head]
    finally:
        steps._body = body
        steps.shared_prefix = ()


def test_a_kept_head_read_from_disk_is_the_same_bits_and_anything_else_computes_it(tmp_path, caplog, monkeypatch):
    """The next start reads the head's keys and values (models.prefix_store) instead of feeding it: the same bits
    as computing them, and runs on them score the same.  A store for other weights, another prefix, or an
    unreadable file computes them again (and replaces the file)."""
    from specviz.models.prefix_store import PrefixStore

    from types import SimpleNamespace

    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    pack = SimpleNamespace(key="tiny", sha256="a" * 64)  # what names a pack's file: its hash
    head = tuple(IDS[:10])
    _, model = _target()
    steps = steps_of(model)
    with torch.inference_mode():
        lm = cached_lm(model, CPU, 64)
        reference = lm.feed(IDS[:22], keep=6).logits
        lm.free()
    steps.shared_prefix = head
    steps.prefix_store = store = PrefixStore.for_pack(pack, role="target", kernel="none")
    fed = []
    body = steps._body
    steps._body = lambda tokens, *a, **k: fed.append(len(tokens)) or body(tokens, *a, **k)
    try:
        assert steps.keep_prefix() and fed == [10]  # computed, then stored
        assert store.path(head).is_file() and store.path(head).parent == tmp_path / "heads"
        computed = steps._prefix_kv.pop(head)
        fed.clear()
        with caplog.at_level("INFO", logger="specviz.models"):
            assert steps.keep_prefix() and fed == []  # a new start: read, not fed
        assert "Read the target's 10-token prompt head" in caplog.text
        read = steps._prefix_kv[head]
        assert all(torch.equal(a, b) for a, b in zip(computed[0] + computed[1], read[0] + read[1]))
        with torch.inference_mode():
            lm = cached_lm(model, CPU, 64)
            assert torch.equal(lm.feed(IDS[:22], keep=6).logits, reference)
            lm.free()
        assert fed == [12]

        # what the bits depend on, changed: another file, so they are computed
        other = PrefixStore.for_pack(SimpleNamespace(key="tiny", sha256="b" * 64), role="target", kernel="none")
        assert other.path(head) != store.path(head)
        assert other.load(head, len(steps.layers)) is None
        assert store.load(tuple(IDS[1:11]), len(steps.layers)) is None  # another prefix
        assert PrefixStore.for_pack(pack, role="target", kernel="glue").path(head) != store.path(head)  # other kernels

        # an unreadable file: a warning, computed again, and replaced by a good one
        store.path(head).write_bytes(b"not a safetensors file")
        steps._prefix_kv.clear()
        fed.clear()
        with caplog.at_level("WARNING", logger="specviz.models"):
            assert steps.keep_prefix() and fed == [10]
        assert "unreadable kept prompt head" in caplog.text
        again = store.load(head, len(steps.layers))
        assert again is not None and all(torch.equal(a, b) for a, b in zip(computed[0], again[0]))
    finally:
        steps._body = body
        steps.shared_prefix = ()
        steps.prefix_store = None
        steps._prefix_kv.clear()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_race_on_the_lean_target_interleaves_and_gives_the_separate_runs_tokens(temperature):
    """The int8 target's runs each have a cache of their own, so the page's race alternates its two runs (it
    went one after the other while the lean steps were taken for the GPU's one static cache), and each run
    gives the tokens it gives alone."""
    from specviz.hardware.load import race_can_interleave
    from specviz.serving import service

    pair, model = _target(seed=2)
    pair.target = model
    assert race_can_interleave(pair)
    ids = pair.tokenizer("the cat sat on").input_ids
    s = DecodeSettings(gamma=4, temperature=temperature, max_new_tokens=24, seed=5)
    final = list(service.race(service.Request(pair, "the cat sat on", list(ids), s)))[-1]
    assert final.spec.timing.how == "interleaved" and final.std.timing.how == "interleaved"
    alone_spec, alone_std = speculative_decode(pair, ids, s), standard_decode(pair, ids, s)
    assert [t.id for t in final.spec.tokens] == [t.id for t in alone_spec.tokens]
    assert [t.id for t in final.std.tokens] == [t.id for t in alone_std.tokens]
    assert not steps_of(model).in_use  # both runs' caches were given back


def test_the_gpus_static_steps_still_race_one_run_after_the_other():
    from specviz.hardware.load import race_can_interleave
    from specviz.models import compiled

    pair = build_tiny_pair(vocab_size=40, sharpness=3.0, seed=0)
    assert race_can_interleave(pair)  # eager: no steps
    compiled.attach(pair.target, 96, compile=False)
    assert not race_can_interleave(pair)
