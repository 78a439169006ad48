"""Greedy equivalence on the real default pair, in fp32 (not skipped: the pair ships with pip)."""

from __future__ import annotations

import pytest

from specviz.core.engine import standard_decode
from specviz.core.settings import DecodeSettings
import specviz.hardware  # noqa: F401  (installs the probe: a recorded probe is attached to the pair)
from specviz.models import DEFAULT_PRESET, encode_prompt, load_pair
from tests.drafted import speculative_decode


# The fp32 and int8 pairs: conftest's session fixtures real_pair_fp32 and real_pair_int8.


def test_bf16_target_verify_is_within_its_own_rounding_on_the_real_pair():
    from specviz.models import loading

    pair = load_pair(DEFAULT_PRESET, draft_quant="int8", target_exec="bf16")
    try:
        verify, steps = _verify_vs_steps(pair)
    finally:
        loading.forget(pair)  # (3.6 GB held in memory: not beside the fp32 and int8 pairs the next tests load)
        del pair
    tv = 0.5 * (verify.softmax(-1) - steps.softmax(-1)).abs().sum(-1)
    assert tv.max() <= 0.02, tv


# One prompt per target execution, not every prompt on each: the executions are the code paths that
# differ (fp32's batched verify must agree with its one-token steps at every argmax; int8 is
# batch-invariant, which test_int8_target_is_batch_invariant checks bit for bit).  fp32 gets γ = 5,
# the wider verify batch (more room for rounding to differ from the steps).  Greedy equality on more
# prompts is what the bench reports (`python -m specviz.cli.bench`: the six evaluation prompts).
@pytest.mark.parametrize("pair_fixture, execution, prompt, gamma", [
    ("real_pair_fp32", "fp32", "Write a Python function `is_prime(n)`.", 5),
    ("real_pair_int8", "int8", "Explain in two sentences what a hash table is.", 3),
])
def test_greedy_speculative_equals_standard_on_the_real_pair(request, pair_fixture, execution, prompt, gamma):
    """In fp32, and with the int8 target an AVX2-only CPU chooses (batch-invariant: exactly)."""
    pair = request.getfixturevalue(pair_fixture)
    ids = encode_prompt(pair, prompt)
    s = DecodeSettings(gamma=gamma, temperature=0.0, max_new_tokens=24)
    spec = speculative_decode(pair, ids, s, prompt=prompt)
    if execution == "fp32":  # conftest's is_prime_standard: the same standard decoding, done once for 3 modules
        shared_prompt, shared_ids, std = request.getfixturevalue("is_prime_standard")
        assert (shared_prompt, shared_ids) == (prompt, ids)
    else:
        std = standard_decode(pair, ids, s, prompt=prompt)
    assert spec.models["target_exec"] == execution
    assert [t.id for t in spec.tokens] == [t.id for t in std.tokens]
    assert spec.text == std.text and spec.n_tokens == std.n_tokens > 0
    summ = spec.summary()
    # Real verification happened: several rounds, with drafts accepted (and the text stayed exact).
    assert summ.rounds < spec.n_tokens and summ.accepted > 0


# ---- the target's executions on the real pair (specviz.models.executions) --------------------

PROMPT_IDS_TEXT = "Write a Python function that returns the n-th Fibonacci number."


def _verify_vs_steps(pair, k: int = 6):
    """Distributions at k positions after the chat prompt, scored one token at a time (the tokens: the
    target's own greedy continuation, chosen as it goes), then in one verify pass over the same k tokens once
    the cache is rolled back to the prompt (CachedLM.crop, as after a rejection): one prefill serves both."""
    import torch

    from specviz.core.kv import CachedLM

    ids = encode_prompt(pair, PROMPT_IDS_TEXT)
    with torch.inference_mode():
        lm = CachedLM(pair.target, pair.device)
        logits, seq, steps = lm.feed(ids).logits[-1], list(ids), []
        for _ in range(k):
            seq.append(int(logits.argmax()))
            logits = lm.feed(seq).logits[-1]
            steps.append(logits.float())
        lm.crop(len(ids))
        verify = lm.feed(seq, keep=k).logits.float()
    return verify, torch.stack(steps)


def test_int8_target_is_batch_invariant_on_the_real_pair(real_pair_int8):
    import torch

    assert real_pair_int8.target_exec == "int8"
    verify, steps = _verify_vs_steps(real_pair_int8)
    assert torch.equal(verify, steps)  # integer path: exactly, not just within rounding


def test_the_real_pairs_tokenizer_from_its_gguf_is_transformers_gguf_tokenizer(real_pair_int8, tmp_path):
    """The default pair's tokenizer, built from its GGUF's vocabulary and merges (models.gguf_tokenizer), is the one
    transformers' own GGUF loading converts (the draft's file: both packs hold one vocabulary, as the load checks) for
    every id, text, special token and chat template specviz uses; and it is the one the pair holds."""
    from transformers import AutoTokenizer, TokenizersBackend

    from specviz.models import PRESETS, packs
    from specviz.models.convert import offline_pack
    from tests.same_tokenizer import assert_same_tokenizer

    pack = offline_pack(PRESETS[DEFAULT_PRESET].draft)
    packs.reassemble(pack, tmp_path / "draft.gguf")
    reference = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="draft.gguf")
    assert type(real_pair_int8.tokenizer) is TokenizersBackend
    assert_same_tokenizer(reference, real_pair_int8.tokenizer, samples=2000)