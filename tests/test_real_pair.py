"""Greedy equivalence on the real default pair, in fp32 (not skipped: the pair ships with pip)."""

from __future__ import annotations

import pytest

from specviz.engine import speculative_decode, standard_decode
from specviz.models import DEFAULT_PRESET, encode_prompt, load_pair
from specviz.settings import DecodeSettings


@pytest.fixture(scope="module")
def pair_fp32():
    # fp32 target: batched verification and one-token decoding then agree to the last bit that
    # matters for argmax.  The draft's precision never affects exactness (int8 keeps it fast).
    return load_pair(DEFAULT_PRESET, dtype="float32", draft_quant="int8")


@pytest.mark.parametrize("prompt, gamma", [
    ("Write a Python function `is_prime(n)`.", 5),
    ("Explain in two sentences what a hash table is.", 3),
])
def test_greedy_speculative_equals_standard_on_the_real_pair(pair_fp32, prompt, gamma):
    ids = encode_prompt(pair_fp32, prompt)
    s = DecodeSettings(gamma=gamma, temperature=0.0, max_new_tokens=24)
    spec = speculative_decode(pair_fp32, ids, s, prompt=prompt)
    std = standard_decode(pair_fp32, ids, s, prompt=prompt)
    assert [t.id for t in spec.tokens] == [t.id for t in std.tokens]
    assert spec.text == std.text and spec.n_tokens == std.n_tokens > 0
    summ = spec.summary()
    # Real verification happened: several rounds, with drafts accepted (and the text stayed exact).
    assert summ["rounds"] < spec.n_tokens and summ["accepted"] > 0
