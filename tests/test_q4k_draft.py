"""The int8 draft's matrices as Q4_K made here (specviz.models.q4k_draft; on unless SPECVIZ_Q4K=0): the quantizer, the
kernel on rows short of a block, the draft taking and keeping its records, and the output staying exact (greedy
text = standard text; sampled: the target's distribution, χ²)."""

from __future__ import annotations

import copy

import pytest
import torch

from specviz.core.engine import standard_decode
from specviz.core.sampling import Warp
from specviz.core.settings import DecodeSettings
from specviz.models import int8, q4k
from specviz.models import draft_vocab as DV
from specviz.models.int8_target import FusedPart
from specviz.models.tiny import build_tiny_pair
from tests.drafted import speculative_decode
from tests.test_engine import assert_matches, next_dist
from test_q4k import _kernel_on, needs_kernel  # noqa: F401  (_kernel_on: SPECVIZ_Q4K=1 and the kernel, per test)

pytestmark = needs_kernel


def test_quantize_makes_records_near_the_weights_and_zero_past_k():
    w = torch.randn(24, 896) * torch.logspace(-2, 1, 24)[:, None]  # rows of very different magnitudes
    w[5] = 0.0
    w[7, :32] = 0.0  # a zero sub-block
    w[9] = w[9].abs()  # no negative weight: min 0
    rec = q4k.quantize(w)
    assert rec.shape == (24, 4, q4k.REC) and rec.dtype == torch.uint8
    back = q4k.dequantize(rec)
    assert torch.equal(back[:, 896:], torch.zeros(24, 128)) and torch.equal(back[5], torch.zeros(1024))
    assert torch.equal(back[7, :32], torch.zeros(32))
    err = (back[:, :896] - w).norm(dim=-1) / w.norm(dim=-1).clamp(min=1e-30)
    assert err[torch.arange(24) != 5].max() < 0.12  # 4 bits: ~0.06-0.09 on Gaussian rows
    # a whole number of blocks is not padded
    assert q4k.quantize(torch.randn(3, 512)).shape == (3, 2, q4k.REC)


def test_the_kernel_takes_rows_short_of_a_block_as_its_oracle_to_the_bit():
    w = q4k.quantize(torch.randn(29, 896))
    bias = torch.randn(29)
    x = torch.randn(7, 896) * torch.logspace(-3, 3, 7)[:, None]
    x[3] = 0.0
    padded = torch.nn.functional.pad(x, (0, 128))
    for rows in (x[:1], x[:2], x[:3], x[:4], x):
        got = q4k.linear(rows, w, bias)
        assert torch.equal(got, q4k.reference(rows, w, bias))
        assert torch.equal(got, q4k.linear(padded[:len(rows)], w, bias))  # = the padded rows
    assert torch.equal(q4k.linear(x, w)[2:5], q4k.linear(x[2:5], w))  # a token's bits in any pass
    with pytest.raises(RuntimeError, match="blocks of 256"):
        q4k.linear(torch.randn(2, 640), w)  # short of more than the last block
    with pytest.raises(ValueError, match="do not fill"):
        q4k.Q4KLinear(w, None, 700)


def _pair(vocab: int = 40, seed: int = 0):
    return build_tiny_pair(vocab_size=vocab, seed=seed, hidden=192, target_layers=2, draft_layers=1, noise=0.2)


def _q4k_draft(pair, _cache=None):
    draft = int8.int8_draft(copy.deepcopy(pair.draft))
    out = copy.copy(pair)
    out.draft, out.draft_quant = draft, "int8+q4k"
    return out


def test_an_int8_draft_takes_q4k_products(tmp_path, monkeypatch):
    pair = _pair()
    q = _q4k_draft(pair)
    att, mlp = q.draft.model.layers[0].self_attn, q.draft.model.layers[0].mlp
    assert isinstance(att.q_proj, FusedPart) and att.q_proj.shared is att.v_proj.shared
    assert isinstance(att.q_proj.shared.linear, q4k.Q4KLinear) and isinstance(mlp.gate_proj.shared.linear, q4k.Q4KLinear)
    assert isinstance(att.o_proj, q4k.Q4KLinear) and isinstance(mlp.down_proj, q4k.Q4KLinear)
    assert att.o_proj.in_features == 192 and mlp.down_proj.in_features == 384  # padded to 256 and 512 inside
    assert isinstance(q.draft.lm_head, q4k.Q4KLinear) and q.draft.lm_head.in_features == 192  # the head too
    steps = q.draft._specviz_steps  # the lean path, traced over the Q4_K products
    assert steps is not None and steps.traced
    ids = pair.tokenizer("the cat sat").input_ids
    with torch.inference_mode():
        want = q.draft(torch.tensor([ids])).logits
        monkeypatch.setenv("SPECVIZ_Q4K", "0")
        plain = int8.int8_draft(copy.deepcopy(pair.draft))
        assert not q4k.in_use(plain)  # not asked for: int8's own rows
        assert not torch.equal(plain(torch.tensor([ids])).logits, want)
        monkeypatch.setenv("SPECVIZ_Q4K", "1")
        again = _q4k_draft(pair)  # made again, the same records: the same bits
        assert torch.equal(again.draft(torch.tensor([ids])).logits, want)


@pytest.mark.parametrize("gamma", [2, 5])
def test_greedy_text_is_standard_text_with_a_q4k_draft(tmp_path, gamma):
    pair = _pair()
    q = _q4k_draft(pair, tmp_path / "d.safetensors")
    ids = pair.tokenizer("the cat sat on").input_ids
    s = DecodeSettings(gamma=gamma, temperature=0.0, max_new_tokens=30)
    spec = speculative_decode(q, ids, s)
    assert [t.id for t in spec.tokens] == [t.id for t in standard_decode(pair, ids, s).tokens]
    assert any(r.rejected_at is not None for r in spec.rounds)  # the draft does propose what the target rejects


def test_a_q4k_draft_keeps_the_targets_distribution(tmp_path):
    """First two tokens ~ the target's exact joint distribution (χ²), sampled at T=1, top-k 3."""
    pair = _pair(vocab=40, seed=3)
    q = _q4k_draft(pair, tmp_path / "d.safetensors")
    prompt = pair.tokenizer("abc").input_ids
    warp = Warp(1.0, 3, 1.0)
    p1 = next_dist(pair.target, prompt, warp)
    exact = {}
    for x1 in torch.nonzero(p1).flatten().tolist():
        p2 = next_dist(pair.target, prompt + [x1], warp)
        for x2 in torch.nonzero(p2).flatten().tolist():
            exact[(x1, x2)] = float(p1[x1] * p2[x2])
    samples = []
    for seed in range(1200):
        s = DecodeSettings(gamma=2, temperature=1.0, top_k=3, max_new_tokens=2, seed=seed)
        samples.append(tuple(t.id for t in speculative_decode(q, prompt, s).tokens))
    assert_matches(samples, exact)


def test_a_reduced_vocabulary_reads_the_q4k_heads_rows_bit_for_bit(tmp_path):
    pair = _pair()
    q = _q4k_draft(pair, tmp_path / "d.safetensors")
    full = q.draft.lm_head
    x = torch.randn(5, 192)
    kept = [0, 3, 7, 11, 39]
    head = DV.use(q.draft, DV.DraftVocab(tuple(kept), 40, "tiny-target", {"source": "test"}))
    assert head is not None and head.full is full
    head.prepare([5, 6])  # a run's prompt ids are kept too
    got, want = head(x), full(x)
    assert torch.equal(got[:, kept + [5, 6]], want[:, kept + [5, 6]])
    assert torch.isinf(got[:, [1, 2, 4]]).all()
    assert torch.equal(full.dequantized(torch.tensor(kept)), q4k.dequantize(full.weight[kept])[:, :192])
