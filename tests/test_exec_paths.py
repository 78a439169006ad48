"""The engine on every execution path this machine has: eager (dynamic KV cache) and steps over a
static KV cache (specviz.models.compiled), on the CPU and, where one is present, on a CUDA GPU
(where the static path replays CUDA graphs).  Exactness (χ²), greedy equality and the cache
arithmetic (padding to a bucket, rollback) must hold on each."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from specviz.core.engine import standard_decode
from specviz.core import kv
from specviz.core.kv import CachedLM, cached_lm
from specviz.core.sampling import Warp
from specviz.core.settings import DecodeSettings
from specviz.models import compiled
from specviz.models.compiled import StaticLM, bucket_for
from tests.drafted import speculative_decode, speculative_stream
from test_engine import PROMPT, CharTokenizer, assert_matches, tiny_lm

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
PATHS = [(d, p) for d in DEVICES for p in ("eager", "static")]


def _pair(device: str, path: str, vocab: int = 6, sharp: float = 40.0):
    dev = torch.device(device)
    pair = SimpleNamespace(
        draft=tiny_lm(vocab, 1, sharp).to(dev), target=tiny_lm(vocab, 2, sharp).to(dev),
        tokenizer=CharTokenizer(), device=dev, eos_token_ids=[], draft_name="tiny-draft",
        target_name="tiny-target", preset="tiny", dtype=torch.float32, draft_quant=None)
    if path == "static":  # CUDA graphs on a GPU; the same static cache, eager, on the CPU
        for model in (pair.draft, pair.target):
            compiled.attach(model, 96, compile=dev.type == "cuda", mode="graph")
    return pair


@pytest.mark.parametrize("device,path", PATHS)
def test_first_two_tokens_follow_the_target(device, path):
    pair = _pair(device, path)
    warp = Warp(1.0)

    @torch.inference_mode()
    def dist(ids):
        return warp(pair.target(torch.tensor([ids], device=pair.device)).logits[0, -1]).cpu()

    p1, exact = dist(PROMPT), {}
    for x1 in range(6):
        p2 = dist(PROMPT + [x1])
        for x2 in range(6):
            if p1[x1] * p2[x2] > 0:
                exact[(x1, x2)] = float(p1[x1] * p2[x2])
    samples = []
    for seed in range(1200):
        s = DecodeSettings(gamma=3, temperature=1.0, max_new_tokens=2, seed=seed)
        samples.append(tuple(t.id for t in speculative_decode(pair, PROMPT, s).tokens))
    assert_matches(samples, exact)


@pytest.mark.parametrize("device,path", PATHS)
def test_greedy_speculative_equals_standard(device, path):
    pair = _pair(device, path, vocab=12, sharp=6.0)
    for gamma in (1, 4, 9):
        s = DecodeSettings(gamma=gamma, temperature=0.0, max_new_tokens=40)
        spec = [t.id for t in speculative_decode(pair, PROMPT, s).tokens]
        std = [t.id for t in standard_decode(pair, PROMPT, s).tokens]
        assert spec == std and len(spec) == 40


@pytest.mark.parametrize("device", DEVICES)
def test_static_steps_match_the_dynamic_cache(device):
    """Feeds of every length (padded to a bucket or not), crops and a refill give the dynamic
    cache's logits; the static path is the one the engine picks when the run fits."""
    dev = torch.device(device)
    model = tiny_lm(20, 3, 4.0).to(dev)
    steps = compiled.attach(model, 64, compile=dev.type == "cuda", mode="graph")
    ids = torch.randint(0, 20, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    ref, lm = CachedLM(model, dev), cached_lm(model, dev, need=60)
    assert isinstance(lm, StaticLM) and steps.in_use
    assert isinstance(cached_lm(model, dev, need=60), CachedLM)  # in use: the next run gets the eager cache
    with torch.inference_mode():
        for end, keep, crop in ((10, 1, None), (13, 3, 11), (16, 5, None), (17, 1, 12), (33, 4, None), (36, 2, 30)):
            a, b = ref.feed(ids[:end], keep=keep).logits, lm.feed(ids[:end], keep=keep).logits
            assert a.shape == b.shape == (keep, 20)
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
            if crop is not None:
                ref.crop(crop), lm.crop(crop)
    lm.free()
    assert not steps.in_use
    assert isinstance(cached_lm(model, dev, need=65), CachedLM)  # a run longer than the cache stays eager
    assert [bucket_for(k) for k in (1, 2, 3, 5, 9, 17, 33)] == [1, 2, 4, 8, 16, 32, None]


def test_engine_runs_chains_on_static_steps_and_trees_eager():
    """The engine hands the static steps to a chain's target and draft, and frees them after the run."""
    pair = _pair("cpu", "static")
    s = DecodeSettings(gamma=3, temperature=0.0, max_new_tokens=8)
    stream = speculative_stream(pair, PROMPT, s)
    next(stream)  # the first drafted token: both caches are taken
    assert compiled.steps_of(pair.target).in_use and compiled.steps_of(pair.draft).in_use
    for _ in stream:
        pass
    assert not compiled.steps_of(pair.target).in_use and not compiled.steps_of(pair.draft).in_use


def test_static_steps_bring_their_own_mask_and_positions(monkeypatch):
    """A captured CUDA graph replays whatever transformers decided in Python at capture.  transformers 5.17
    skips the causal mask for a one-token feed and at offset 0, and a static cache's keys span all its slots,
    so a replayed step attended to slots past the cache's length (on the H100, the graphs left the dynamic
    cache's logits from the second feed on).  The static steps hand the model its positions and a 4D mask
    computed on the device from the cache's length tensor: with transformers made to skip every mask it
    builds itself, the static path still gives the dynamic cache's logits, through crops that leave stale
    slots behind."""
    from transformers.models.llama import modeling_llama

    real = modeling_llama.create_causal_mask

    def skipping(**kw):  # a 4D mask handed in is used as it is; any other is left out (is_causal / none)
        mask = kw.get("attention_mask")
        return mask if mask is not None and mask.dim() == 4 else None

    model = tiny_lm(20, 3, 4.0)
    steps = compiled.attach(model, 64, compile=False)
    ids = torch.randint(0, 20, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    ref, lm = CachedLM(model, torch.device("cpu")), cached_lm(model, torch.device("cpu"), need=60)
    with torch.inference_mode():
        for end, keep, crop in ((10, 1, 8), (11, 1, None), (12, 1, None), (15, 3, 11), (12, 1, None), (20, 2, None)):
            a = ref.feed(ids[:end], keep=keep).logits
            monkeypatch.setattr(modeling_llama, "create_causal_mask", skipping)
            b = lm.feed(ids[:end], keep=keep).logits
            monkeypatch.setattr(modeling_llama, "create_causal_mask", real)
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
            if crop is not None:
                ref.crop(crop), lm.crop(crop)
    lm.free()
    assert not steps.in_use


def test_a_capture_mid_run_leaves_the_runs_cache_as_it_was():
    """A graph is captured when a run first feeds a length no graph has yet (unless attach warmed it up), and
    its warm-ups and capture are passes of their own: they must leave the run's cache as it was.  They used to
    reset it to 0, so on the H100 every feed that met a new bucket mid-run attended to nothing it had fed.
    On the CPU the same scratch passes run eagerly (the GPU adds only the recording around them)."""
    model = tiny_lm(20, 3, 4.0)
    steps = compiled.attach(model, 64, compile=False)
    ids = torch.randint(0, 20, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    ref, lm = CachedLM(model, torch.device("cpu")), cached_lm(model, torch.device("cpu"), need=60)
    with torch.inference_mode():
        for end, keep in ((10, 1), (13, 3), (14, 1), (20, 2)):
            a = ref.feed(ids[:end], keep=keep).logits
            length = steps.length
            for size in (1, 4, 8):  # what _capture runs before recording a graph of `size` tokens
                steps.scratch(steps._eager_logits, torch.zeros(1, size, dtype=torch.long))
                assert steps.length == length
            b = lm.feed(ids[:end], keep=keep).logits
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        with pytest.raises(RuntimeError, match="does not fit"):
            steps.scratch(steps._eager_logits, torch.zeros(1, 60, dtype=torch.long))
    lm.free()


def test_masked_gpu_feeds_keep_sdpa_off_cudnn():
    """On a GPU a masked feed runs with cuDNN's attention (and flash, which takes no custom mask) turned off:
    cuDNN's one-token steps over a static cache were not repeatable on an H100; off the GPU nothing changes."""
    b = torch.backends.cuda
    flags = lambda: (b.cudnn_sdp_enabled(), b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled())  # noqa: E731
    before = flags()
    with kv.repeatable_attention(torch.device("cuda")):
        assert flags() == (False, False, True, True)
    assert flags() == before
    with kv.repeatable_attention("cpu"):
        assert flags() == before


def test_static_steps_and_tree_feeds_run_under_the_repeatable_attention(monkeypatch):
    """Every forward of the static steps (bucketed feeds, a prompt longer than every bucket, a feed asking for
    hidden states) and of an eager tree feed happens inside kv.repeatable_attention."""
    import contextlib

    inside = {"depth": 0, "calls": 0}

    @contextlib.contextmanager
    def recording(device):
        inside["depth"] += 1
        try:
            yield
        finally:
            inside["depth"] -= 1

    monkeypatch.setattr(kv, "repeatable_attention", recording)
    pair = _pair("cpu", "static")

    def check(module, args, kwargs):
        assert inside["depth"] == 1, "a forward ran outside kv.repeatable_attention"
        inside["calls"] += 1

    for model in (pair.target, pair.draft):
        model.register_forward_pre_hook(check, with_kwargs=True)
    lm = cached_lm(pair.target, pair.device, need=80)
    assert isinstance(lm, StaticLM)
    long = PROMPT * (1 + 40 // len(PROMPT))  # longer than every bucket: fed eagerly into the static cache
    with torch.inference_mode():  # as the engine feeds
        lm.prefill(long, hidden=True)
        lm.feed(long + [1, 2, 3])
        lm.feed(long + [1, 2, 3, 4], hidden=True)
        lm.free()
        CachedLM(pair.draft, pair.device).feed_tree(PROMPT, [1, 2, 3], [-1, 0, -1])
    assert inside["calls"] >= 4
