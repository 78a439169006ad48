"""The learned draft head (MLP speculator): shapes and frozen target parts, training on the tiny
pair, exactness as a drafter, and the shipped weights drafting on the real default pair."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specviz.core.engine import standard_decode
from specviz.core.sampling import Warp
from specviz.core.settings import DecodeSettings
from specviz.drafters import DRAFTERS, make_drafter
from specviz.drafters.speculator import SpeculatorDrafter
from specviz.models import ModelError, encode_prompt
from specviz.models.tiny import build_tiny_pair
from specviz.speculator import store
from specviz.speculator.model import MLPSpeculator, SpeculatorConfig
from specviz.speculator.train import TrainConfig, train
from tests.test_engine import PROMPT, assert_matches, make_pair, next_dist
from tests.drafted import speculative_decode

# A small, fixed corpus for training tests: a package that is always installed with the app.
CORPUS = Path(__import__("gradio").__file__).parent


def _random_speculator(target, hidden: int, vocab_ids: list[int], inner: int = 8, n: int = 3, seed: int = 0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        spec = MLPSpeculator(SpeculatorConfig(hidden, inner, n))
        with torch.no_grad():  # sharpen q so it clearly differs from p (the exactness test must have rejections)
            for out in spec.out:
                out.weight.mul_(20.0)
    return spec.eval().requires_grad_(False).attach(target, torch.tensor(vocab_ids))


def test_stages_have_the_paper_shapes_and_read_the_frozen_target():
    pair = build_tiny_pair()
    target = pair.target
    vocab_ids = torch.arange(0, 32, 2)  # a restricted vocabulary of 16 tokens
    spec = MLPSpeculator(SpeculatorConfig(hidden=64, inner=16, n_predict=3)).attach(target, vocab_ids)
    hidden, tokens = torch.randn(5, 64), torch.randint(0, 32, (5, 3))
    logits = spec(hidden, tokens)
    assert [tuple(z.shape) for z in logits] == [(5, 16)] * 3
    state, z0 = spec.stage(0, hidden, tokens[:, 0])
    assert state.shape == (5, 16) and torch.equal(z0, logits[0])
    assert spec.proj[0].weight.shape == (16, 64) and spec.proj[1].weight.shape == (16, 16)  # h -> d, then d -> d
    # Tied to the target: token inputs read its very embedding tensor, logits are its output head's rows V_r.
    assert spec.embed.data_ptr() == target.get_input_embeddings().weight.data_ptr()
    g = spec.out[0](state)
    assert torch.allclose(z0, target.get_output_embeddings()(g)[:, vocab_ids], atol=1e-5)
    # Only the stages are trained or saved, never the target's (large) embedding and head.
    names = set(spec.state_dict())
    assert names == {f"{m}.{i}.{w}" for m in ("proj", "emb_proj", "out") for i in range(3) for w in ("weight",)} | {
        f"norm.{i}.{w}" for i in range(3) for w in ("weight", "bias")} | {"vocab_ids"}
    assert sum(p.numel() for p in spec.parameters()) == 16 * 64 + 2 * 16 * 16 + 3 * (16 * 64 + 64 * 16 + 2 * 16)

    # Tied stages (the paper's option): one B, C and norm for all, A_0 (from h) plus one shared A.
    tied = MLPSpeculator(SpeculatorConfig(hidden=64, inner=16, n_predict=3, tie=True)).attach(target, vocab_ids)
    assert [len(tied.proj), len(tied.emb_proj), len(tied.out), len(tied.norm)] == [2, 1, 1, 1]
    assert sum(p.numel() for p in tied.parameters()) == 16 * 64 + 16 * 16 + 16 * 64 + 64 * 16 + 2 * 16
    assert [tuple(z.shape) for z in tied(hidden, tokens)] == [(5, 16)] * 3


def _tiny_config(**kw) -> TrainConfig:
    return TrainConfig(**{**dict(preset="tiny", inner=16, seq_len=48, train_seqs=24, heldout_seqs=6, top_k=6,
                                 batch=32, epochs=3.0, lr=3e-3, warmup=2, eval_every=20, checkpoint_every=7,
                                 gen_requests=8, gen_heldout=4, gen_batch=4, threads=1), **kw})


def test_training_lowers_the_loss_and_resumes_deterministically(tmp_path):
    pair = build_tiny_pair()
    card = train(_tiny_config(), pair=pair, out=tmp_path / "a", work=tmp_path / "work-a", site=CORPUS)
    curve = [loss for _, loss in card["training"]["loss_curve"]]
    assert card["training"]["steps"] == card["training"]["planned_steps"] > 20
    assert curve[-1] < 0.8 * curve[0], curve
    held = card["training"]["heldout_curve"]
    assert held[-1][1] < held[0][1], held  # held-out files, too
    assert (tmp_path / "a" / "card.md").read_text().startswith("# MLP speculator for tiny-target")
    # The target's own answers are part of the data: the requests asked, and held-out answers measured alone.
    answers = card["data"]["answers"]
    assert answers["requests"] == 8 and answers["heldout_requests"] == 4 and answers["tokens"] > 8 * 10
    assert len(card["heldout"]["answers"]["top1"]) == card["model"]["n_predict"]
    assert "The target's own answers: 8 requests" in (tmp_path / "a" / "card.md").read_text()

    # Stopped after 13 steps, then resumed from the checkpoint: the very same weights.
    train(_tiny_config(stop_at=13), pair=pair, out=tmp_path / "b", work=tmp_path / "work-b", site=CORPUS)
    resumed = train(_tiny_config(), pair=pair, out=tmp_path / "b", work=tmp_path / "work-b", site=CORPUS)
    assert resumed["training"]["resumed_from"] == 13 and resumed["training"]["steps"] == card["training"]["steps"]
    a, _ = store.load(tmp_path / "a" / store.WEIGHTS)
    b, meta = store.load(tmp_path / "b" / store.WEIGHTS)
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    # The saved file names its target, and is found for that target only.
    assert store.find(pair.target, [tmp_path]) in (tmp_path / "a" / store.WEIGHTS, tmp_path / "b" / store.WEIGHTS)
    assert store.find(build_tiny_pair(seed=1).target, [tmp_path]) is None
    assert meta["target_name"] == pair.target_name


@pytest.mark.parametrize("greedy", [True, False])
def test_stages_draft_from_the_first_round(greedy):
    pair = make_pair(vocab=6)
    spec = _random_speculator(pair.target, 16, [0, 1, 2, 3, 5])
    s = DecodeSettings(gamma=5, temperature=0.0 if greedy else 1.0, max_new_tokens=20, seed=3)
    trace = speculative_decode(pair, PROMPT, s, drafter=SpeculatorDrafter(spec, 6))
    # The prompt's prefill gives the hidden state, so the head drafts in round 1 already.
    assert trace.rounds[0].draft and trace.rounds[0].draft_forwards > 0
    drafted = [len(r.draft) for r in trace.rounds]
    assert max(drafted) == 3 and all(n <= 3 for n in drafted)  # at most n_predict, whatever γ
    assert all(d.id != 4 for r in trace.rounds for d in r.draft)  # outside V_r: q = 0, never drafted
    if greedy:
        std = standard_decode(pair, PROMPT, s)
        assert [t.id for t in trace.tokens] == [t.id for t in std.tokens]


def test_speculator_drafting_is_exact():
    """Tokens 1-4 ~ the target's exact joint distribution: round 1 is a target step, round 2
    drafts two tokens (stages 0 and 1) from the hidden state round 1 returned."""
    pair = make_pair(vocab=5, sharp=12.0)
    spec = _random_speculator(pair.target, 16, [0, 1, 2, 4])
    warp = Warp(1.0)
    exact: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(4):
        grown = {}
        for seq, pr in exact.items():
            p = next_dist(pair.target, PROMPT + list(seq), warp)
            grown.update({seq + (x,): pr * float(p[x]) for x in range(5) if p[x] > 0})
        exact = grown
    samples, rejected, drafted = [], 0, 0
    for seed in range(1500):
        s = DecodeSettings(gamma=3, temperature=1.0, max_new_tokens=4, seed=seed)
        trace = speculative_decode(pair, PROMPT, s, drafter=SpeculatorDrafter(spec, 5))
        samples.append(tuple(t.id for t in trace.tokens))
        drafted += sum(len(r.draft) for r in trace.rounds)
        rejected += sum(1 for r in trace.rounds for pos in r.positions if not pos.accepted)
    # The drafts were real guesses, some right and some wrong, or the test would prove little.
    assert drafted > 2000 and 0.1 * drafted < rejected < 0.9 * drafted, (drafted, rejected)
    assert_matches(samples, exact)


def test_registered_and_refuses_a_target_it_was_not_trained_for(tmp_path, monkeypatch):
    assert DRAFTERS["speculator"][0] == "learned head (MLP speculator)"
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))  # no user-trained speculators either
    with pytest.raises(ModelError, match="No trained speculator matches tiny-target"):
        make_drafter(build_tiny_pair(), DecodeSettings(drafter="speculator"))


@pytest.mark.real_model
def test_shipped_weights_draft_on_the_real_pair(real_pair_fp32, is_prime_standard):
    path = store.find(real_pair_fp32.target)
    assert path is not None and path.parent.parent == store.ASSETS
    assert path.stat().st_size < 16_000_000
    assert (path.parent / "card.json").is_file() and (path.parent / "card.md").is_file()
    # fp32 target (as in test_real_pair): batched verification and one-token steps agree exactly.
    pair = real_pair_fp32
    prompt, ids, std = is_prime_standard  # standard greedy decoding, 24 tokens
    s = DecodeSettings(gamma=4, temperature=0.0, max_new_tokens=24, drafter="speculator")
    spec = speculative_decode(pair, ids, s, prompt=prompt)
    assert spec.models["drafter"] == "learned head (MLP speculator)"
    assert [t.id for t in spec.tokens] == [t.id for t in std.tokens]
    summ = spec.summary()
    # The trained head guesses right often enough to save target passes on code.
    assert summ.accepted >= 4 and summ.rounds < spec.n_tokens


@pytest.mark.real_model
def test_shipped_weights_draft_for_the_int8_target(real_pair_int8):
    """The execution an AVX2 CPU chooses: the learned head still finds its target and stays exact."""
    pair = real_pair_int8
    assert store.find(pair.target) is not None
    prompt = "Write a Python function `is_prime(n)`."
    ids = encode_prompt(pair, prompt)
    s = DecodeSettings(gamma=4, temperature=0.0, max_new_tokens=16, drafter="speculator")
    spec = speculative_decode(pair, ids, s, prompt=prompt)
    assert [t.id for t in spec.tokens] == [t.id for t in standard_decode(pair, ids, s, prompt=prompt).tokens]
    assert spec.summary().accepted >= 2
