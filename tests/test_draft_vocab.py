"""The draft's reduced vocabulary (specviz.models.draft_vocab): the kept rows give the full head's logits
bit for bit and -inf elsewhere; the lean path's traced steps equal its eager forward with the reduced
head; speculative decoding stays exact (χ²) although the target samples ids the draft cannot propose;
greedy text equals standard decoding on the lean int8 draft, the eager chain and the token tree."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
import torch

from specviz.core.engine import standard_decode
from specviz.core.sampling import Warp
from specviz.core.settings import DecodeSettings
from specviz.drafters.draft_model import ModelDrafter
from specviz.models import draft_vocab as DV
from specviz.models import int8, lean
from specviz.models.tiny import build_tiny_pair
from tests.drafted import speculative_decode
from tests.test_engine import PROMPT, assert_matches, make_pair, next_dist

needs_int8 = pytest.mark.skipif(not int8.int8_available(), reason="this torch has no fbgemm int8 kernels")


@pytest.fixture(autouse=True)
def _int8_rows(monkeypatch):
    """The int8 draft on its own int8 rows, head included (a Q4_K draft's head: test_q4k_draft)."""
    monkeypatch.setenv("SPECVIZ_Q4K", "0")


def _vocab(ids, size: int) -> DV.DraftVocab:
    return DV.DraftVocab(tuple(sorted(ids)), size, "tiny-target", {"source": "test"})


def _int8_pair(seed: int = 1, vocab: int = 40):
    """A tiny pair whose draft runs int8 with the lean path (the loader's int8 draft); at seed 1 its
    greedy text cycles through six ids (not the prompt's) and about half the rounds reject."""
    pair = build_tiny_pair(vocab_size=vocab, seed=seed, hidden=64, target_layers=2, draft_layers=1, noise=0.2)
    draft = int8.int8_draft(copy.deepcopy(pair.draft))
    pair = copy.copy(pair)
    pair.draft, pair.draft_quant = draft, "int8"
    return pair


def test_vocab_checks_and_round_trips(tmp_path):
    with pytest.raises(ValueError, match="ascending"):
        DV.DraftVocab((3, 1), 10)
    with pytest.raises(ValueError, match="lie in"):
        DV.DraftVocab((1, 10), 10)
    vocab = _vocab([0, 4, 7], 10)
    path = tmp_path / f"{DV.slug('Tiny Target (Q4)')}.json"
    DV.save(path, vocab)
    assert json.loads(path.read_text())["size"] == 3
    assert DV.load(path) == vocab
    assert DV.find("Tiny Target (Q4)", 10, [tmp_path]) == vocab
    assert DV.find("Tiny Target (Q4)", 11, [tmp_path]) is None  # another vocabulary size: not this one
    assert DV.find("another", 10, [tmp_path]) is None


@needs_int8
def test_reduced_int8_head_gives_the_full_heads_logits_on_kept_rows_and_minus_inf_elsewhere():
    torch.manual_seed(0)
    full = int8.TokenInt8Linear(int8.int8_channel_weight(torch.randn(50, 32)), torch.randn(50), pack=True)
    kept = [1, 2, 5, 17, 30, 49]
    head = DV.ReducedHead(full, _vocab(kept, 50))
    x = torch.randn(3, 1, 32)
    ref, out = full(x), head(x)
    assert out.shape == ref.shape == (3, 1, 50)
    assert torch.equal(out[..., kept], ref[..., kept])  # bit for bit: an int8 product is per output column
    rest = [i for i in range(50) if i not in kept]
    assert torch.isinf(out[..., rest]).all() and (out[..., rest] < 0).all()
    # A run's prompt ids join the kept ones (and leave again with the next run's prompt).
    assert head.prepare([5, 8, 8, 40]) == 2
    out = head(x)
    assert torch.equal(out[..., [5, 8, 40]], ref[..., [5, 8, 40]]) and torch.isinf(out[..., 9]).all()
    assert head.prepare([1]) == 0 and torch.isinf(head(x)[..., 8]).all()


def test_use_swaps_the_head_and_back():
    pair = make_pair(vocab=6, kind="llama")
    full = pair.draft.get_output_embeddings()
    head = DV.use(pair.draft, _vocab([0, 2, 3], 6))
    assert pair.draft.get_output_embeddings() is head and DV.full_head(pair.draft) is full
    assert DV.use(pair.draft, _vocab([0, 2, 3], 6)) is head  # built once per vocabulary
    logits = pair.draft(torch.tensor([PROMPT])).logits[0, -1]
    assert torch.isinf(logits[[1, 4, 5]]).all() and torch.isfinite(logits[[0, 2, 3]]).all()
    assert DV.use(pair.draft, None) is None and pair.draft.get_output_embeddings() is full


def test_set_mode_needs_an_int8_draft_and_a_shipped_vocabulary(tmp_path, monkeypatch):
    pair = make_pair(vocab=6, kind="llama")
    pair.vocab_size = 6
    monkeypatch.setattr(DV, "ASSETS", tmp_path)
    assert DV.set_mode(pair, "reduced") == "full"  # a float draft: nothing to reduce
    pair.draft_quant = "int8"
    assert DV.set_mode(pair, "reduced") == "full"  # no vocabulary shipped for this target
    DV.save(tmp_path / f"{DV.slug(pair.target_name)}.json", _vocab([0, 2, 3], 6))
    assert DV.set_mode(pair, "reduced") == "reduced" and DV.label(pair) == "3 of 6 ids"
    assert DV.set_mode(pair, "full") == "full" and DV.label(pair) == "full"
    with pytest.raises(ValueError, match="one of"):
        DV.set_mode(pair, "half")


@pytest.mark.parametrize("gamma,top_p", [(2, 1.0), (3, 0.8)])
def test_reduced_vocabulary_stays_exact_where_the_target_samples_dropped_ids(gamma, top_p):
    """First two tokens ~ the target's exact joint distribution (χ²) with a draft whose q is zero on
    ids 1, 4 and 5, which the target samples often: they come from corrections and bonus tokens."""
    pair = make_pair(kind="llama")
    DV.use(pair.draft, _vocab([0, 2, 3], 6))
    warp = Warp(1.0, 0, top_p)
    exact = {}
    p1 = next_dist(pair.target, PROMPT, warp)
    for x1 in range(6):
        p2 = next_dist(pair.target, PROMPT + [x1], warp)
        for x2 in range(6):
            if p1[x1] * p2[x2] > 0:
                exact[(x1, x2)] = float(p1[x1] * p2[x2])
    dropped = sum(p for (a, b), p in exact.items() if a in (1, 4, 5) or b in (1, 4, 5))
    assert dropped > 0.2, "the target must often want ids the draft cannot propose"
    q1 = next_dist(pair.draft, PROMPT, warp)
    assert float(q1[[1, 4, 5]].sum()) == 0.0
    samples = []
    for seed in range(1500):
        s = DecodeSettings(gamma=gamma, temperature=1.0, top_p=top_p, max_new_tokens=2, seed=seed)
        samples.append(tuple(t.id for t in speculative_decode(pair, PROMPT, s).tokens))
    assert_matches(samples, exact)


@needs_int8
def test_traced_steps_equal_the_eager_forward_with_the_reduced_head():
    pair = _int8_pair()
    steps = pair.draft._specviz_steps
    assert steps.traced  # the loader's path traced the one- and two-token steps
    eager = lean.LeanSteps(pair.draft, 200)
    DV.use(pair.draft, _vocab(range(0, 40, 3), 40))
    ids = torch.randint(0, 40, (30,), generator=torch.Generator().manual_seed(5)).tolist()
    with torch.inference_mode():
        a, b = steps.forward(ids[:6], 1)[0], eager.forward(ids[:6], 1)[0]
        assert torch.equal(a, b)
        for at in range(6, 28, 2):
            for t in (1, 2) if at % 4 else (2,):
                got, want = steps.forward(ids[at:at + t], 1, hidden=True), eager.forward(ids[at:at + t], 1)
                assert torch.equal(got[0], want[0]) and got[1] is not None
            steps.set_length(at + 2), eager.set_length(at + 2)
    assert torch.isinf(a[0, 1]) and torch.isfinite(a[0, 3])


@needs_int8
@pytest.mark.parametrize("gamma", [2, 5])
def test_greedy_text_equals_standard_with_the_reduced_head_on_the_lean_int8_draft(gamma):
    pair = _int8_pair()
    prompt = [5, 6, 7, 8, 9]
    settings = DecodeSettings(gamma=gamma, temperature=0.0, max_new_tokens=40)
    std = [t.id for t in standard_decode(pair, prompt, settings).tokens]
    dropped = {std[2]} - set(prompt)  # an id the target produces again and again
    assert dropped and std.count(std[2]) > 3
    kept = sorted(set(range(40)) - dropped)
    head = DV.use(pair.draft, _vocab(kept, 40))
    spec = speculative_decode(pair, prompt, settings)
    assert [t.id for t in spec.tokens] == std
    assert all(d.id not in dropped for r in spec.rounds for d in r.draft)  # never drafted: a correction each
    assert spec.summary().rejections >= std.count(std[2]) - 1 and len(spec.rounds) < spec.n_tokens
    assert len(head.extra_ids) == 0  # every prompt id was kept already
    # The prompt's ids join for the run: a draft step may now propose them.
    ModelDrafter(pair.draft, pair.device, max_new_tokens=8).start([0, 1, 2])
    assert set(head.extra_ids.tolist()) == {0, 1, 2} - set(kept)


def test_greedy_text_equals_standard_with_the_reduced_head_in_a_token_tree():
    pair = make_pair(vocab=11, draft_seed=5, target_seed=6, sharp=10.0, kind="llama")
    DV.use(pair.draft, _vocab([0, 1, 2, 3, 5, 8, 9], 11))
    for prompt in ([1, 2, 3], [7, 7, 0, 1, 9, 10]):
        std = standard_decode(pair, prompt, DecodeSettings(temperature=0.0, max_new_tokens=20))
        for drafter in ("tree", "model"):
            s = DecodeSettings(gamma=3, temperature=0.0, max_new_tokens=20, drafter=drafter, branches=2,
                               tree_nodes=8)
            assert [t.id for t in speculative_decode(pair, prompt, s).tokens] == [t.id for t in std.tokens]


def test_the_shipped_vocabulary_is_the_learned_heads_and_keeps_end_of_text():
    from safetensors import safe_open

    from specviz.speculator import store

    vocab = DV.find("Qwen2.5-Coder-1.5B-Instruct (Q4_K_M)", 151936)
    assert vocab is not None and 8192 <= vocab.size <= 32768
    assert {151643, 151645} <= set(vocab.ids)
    weights = store.ASSETS / DV.slug(vocab.target) / store.WEIGHTS
    with safe_open(str(weights), "pt") as f:
        assert set(f.get_tensor("vocab_ids").tolist()) <= set(vocab.ids)
    cov = vocab.provenance["coverage"]
    assert 0.5 < cov["kept"] <= cov["kept_or_in_prompt"] <= 1.0
    assert vocab.provenance["answer_tokens"] > 0


def test_bench_runs_a_configuration_again_with_the_full_head(tmp_path, monkeypatch):
    from specviz.cli import bench

    pair = make_pair(vocab=11, draft_seed=5, target_seed=6, sharp=10.0, kind="llama")
    pair.vocab_size, pair.draft_quant = 11, "int8"
    monkeypatch.setattr(DV, "ASSETS", tmp_path)
    DV.save(tmp_path / f"{DV.slug(pair.target_name)}.json", _vocab([0, 1, 2, 3, 5, 8, 9], 11))
    assert DV.set_mode(pair, "reduced") == "reduced"
    seen = []
    monkeypatch.setattr(bench, "speculative_decode",
                        lambda *a, **k: seen.append(DV.mode(pair)) or speculative_decode(*a, **k))
    settings = {"constant": DecodeSettings(gamma=3, temperature=0.0, max_new_tokens=12)}
    runs = [bench.run_config(pair, c, [1, 2, 3], settings) for c in ("spec-constant", "spec-constant@full-vocab")]
    assert seen == ["reduced", "full"] and DV.mode(pair) == "reduced"  # the full head only for its run
    assert runs[0].ids == runs[1].ids and len(runs[0].ids) == 12
