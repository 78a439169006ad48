"""The speculator's training data: the target's own answers, labelled by the very decode that
wrote them, and a request bank that never names the app's evaluation prompts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from specviz.models.tiny import build_tiny_pair
from specviz.speculator import data as D
from specviz.speculator import prompts as P
from specviz.speculator.generate import decode_labelled

ROOT = Path(__file__).resolve().parents[1]


def _run(pair, prompts, length, eos, sampled):
    return decode_labelled(pair.target, prompts, length, 4, pad_id=0, eos_ids=eos, sample_rows=sampled,
                           gen=torch.Generator().manual_seed(0))


def test_batched_answers_carry_the_targets_own_states_and_distributions():
    pair = build_tiny_pair()
    target = pair.target
    prompts = [[3, 4, 5, 6, 7, 8], [9, 10], [11, 12, 13, 14]]  # different lengths: left padding must not leak
    d = _run(pair, prompts, 9, eos=[], sampled=[False, True, False])
    assert d["valid"].all() and d["ids"].shape == (3, 9) and d["hidden"].shape == (3, 9, 64)
    for r, prompt in enumerate(prompts):
        answer = d["ids"][r, 1:].tolist()
        assert d["ids"][r, 0] == prompt[-1]
        with torch.inference_mode():
            full = target.model(input_ids=torch.tensor([prompt + answer])).last_hidden_state[0]
            logits = target.get_output_embeddings()(full).float()
        for j in range(9):
            at = len(prompt) - 1 + j  # the position whose state predicts ids[j + 1]
            torch.testing.assert_close(d["hidden"][r, j].float(), full[at], atol=0.03, rtol=0.02)
            assert d["top_ids"][r, j, 0] == logits[at].argmax()
            p = torch.softmax(logits[at], -1)
            torch.testing.assert_close(d["top_p"][r, j].float(), p.topk(4).values, atol=2e-3, rtol=2e-3)
        if r != 1:  # greedy rows follow the target's argmax; the sampled row need not
            assert answer == d["top_ids"][r, :-1, 0].tolist()


def test_an_answer_ends_at_its_end_of_text_token():
    pair = build_tiny_pair()
    free = _run(pair, [[3, 4, 5]], 10, eos=[], sampled=[False])
    stop = int(free["ids"][0, 4])
    first = free["ids"][0, 1:].tolist().index(stop) + 1  # the position where that token first appears
    d = _run(pair, [[3, 4, 5]], 10, eos=[stop], sampled=[False])
    # Positions up to the one that predicts the end-of-text token carry labels; none after it.
    assert d["valid"][0].tolist() == [j < first for j in range(10)]
    assert d["ids"][0, : first + 1].tolist() == free["ids"][0, : first + 1].tolist()


def test_requests_never_name_the_evaluation_prompts():
    evals = [json.loads(line) for line in (ROOT / "assets" / "prompts.jsonl").read_text().splitlines() if line]
    # Every function the evaluation prompts name is on the leak list, so a new prompt must be added there too.
    for e in evals:
        for name in re.findall(r"`(\w+)\(", e["prompt"]):
            assert P.leaks(name), name
    assert P.leaks(evals[2]["prompt"])  # the SQL prompt's schema (customers, orders)
    root = D.site_packages()
    files = D.corpus_files(root)
    sides = [f for f in files if not D.is_heldout(f, root, 16)], [f for f in files if D.is_heldout(f, root, 16)]
    held, train = P.requests(*sides, root, 16, 0, n_train=600, n_heldout=10**9)
    assert len(train) == 600 and len(held) > 50
    assert not any(P.leaks(r) for r in train + held)
    assert not set(train) & set(held)
    assert not {e["prompt"] for e in evals} & set(train + held)
    kinds = [("SQL" in r, r.startswith("Write a Python function `")) for r in train[:90]]
    assert any(k[0] for k in kinds) and any(k[1] for k in kinds)  # any prefix keeps the mix
