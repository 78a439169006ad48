"""The Drafter contract: streamed drafts, the hidden state for drafters that ask, prompt lookup, layering."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from specviz.core.engine import standard_decode
from specviz.core.sampling import Warp
from specviz.core.settings import DecodeSettings
from specviz.drafters import DRAFTERS, DraftContext, make_drafter
from specviz.drafters.draft_model import ModelDrafter
from specviz.drafters.prompt_lookup import PromptLookupDrafter
from specviz.models import ModelError
from specviz.models.tiny import build_tiny_pair
from tests.drafted import speculative_decode, speculative_stream

ROOT = Path(__file__).resolve().parent.parent


class CopyLM(torch.nn.Module):
    """A deterministic stand-in for a causal LM: it predicts the token that followed the most
    recent earlier occurrence of the current token (token 1 if there is none).  It keeps the
    sequence in a real DynamicCache (ids stored as keys), so cropping works as for a model."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab

    def forward(self, input_ids, past_key_values, use_cache=True, logits_to_keep=1, output_hidden_states=False):
        new = input_ids[0].float().view(1, 1, -1, 1)
        keys, _ = past_key_values.update(new, new, 0)
        seq = keys.view(-1).long().tolist()
        n = input_ids.shape[1]
        logits = torch.full((1, n, self.vocab), -30.0)
        for j in range(n):
            t = len(seq) - n + j
            nxt = next((seq[s + 1] for s in range(t - 1, -1, -1) if seq[s] == seq[t]), 1)
            logits[0, j, nxt] = 30.0
        return SimpleNamespace(logits=logits[:, -logits_to_keep:], hidden_states=None)


def copy_pair(vocab=12, eos=2):
    return SimpleNamespace(
        draft=CopyLM(vocab), target=CopyLM(vocab), tokenizer=build_tiny_pair(vocab_size=vocab + 5).tokenizer,
        device=torch.device("cpu"), eos_token_ids=[eos], draft_name="copy", target_name="copy", preset="copy",
        dtype=torch.float32, draft_quant=None, vocab_size=vocab,
    )


def test_prompt_lookup_never_drafts_past_an_end_of_turn_token():
    """The earlier text holds "5 6 7 <eos> 3 4": a lookup from the final 5 proposes 6 7 <eos> 3 4,
    and a target that copies accepts them all.  Standard decoding stops at <eos>; so must
    speculative decoding (before the fix it emitted 3, 4 and a bonus after the <eos>)."""
    pair = copy_pair()
    prompt = [5, 6, 7, 2, 3, 4, 9, 5]
    greedy = DecodeSettings(gamma=5, temperature=0.0, max_new_tokens=20, drafter="prompt-lookup")
    std = standard_decode(pair, prompt, greedy)
    spec = speculative_decode(pair, prompt, greedy)
    assert [t.id for t in std.tokens] == [6, 7, 2]
    assert [t.id for t in spec.tokens] == [6, 7, 2]
    assert spec.stop_reason == std.stop_reason == "eos"
    first = spec.rounds[0]
    assert [d.id for d in first.draft] == [6, 7, 2] and first.draft_stop == "eos"
    assert spec.models["drafter"] == "prompt lookup"


def test_greedy_prompt_lookup_equals_standard_on_a_chat_with_an_earlier_turn():
    """The same on the tiny Qwen2-style pair with its chat template: the prompt's earlier
    assistant turn ends with <eos> followed by the template of the next turn."""
    pair = build_tiny_pair(vocab_size=40, seed=3)
    tok = pair.tokenizer
    text = tok.apply_chat_template(
        [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "abc ab"},
         {"role": "user", "content": "ab"}], add_generation_prompt=True, tokenize=False)
    prompt = tok(text, add_special_tokens=False)["input_ids"]
    assert pair.eos_token_ids[0] in prompt[:-1], "the earlier text holds the end-of-turn token"
    for gamma in (2, 4, 7):
        s = DecodeSettings(gamma=gamma, temperature=0.0, max_new_tokens=30, drafter="prompt-lookup")
        spec, std = speculative_decode(pair, prompt, s), standard_decode(pair, prompt, s)
        assert [t.id for t in spec.tokens] == [t.id for t in std.tokens]
        for rnd in spec.rounds:  # no draft continues past an end-of-text token
            ids = [d.id for d in rnd.draft]
            assert all(i not in pair.eos_token_ids for i in ids[:-1])


class LoggingDrafter(ModelDrafter):
    """The draft model, logging when each token has been computed."""

    def __init__(self, pair, log):
        super().__init__(pair.draft, pair.device)
        self.log = log

    def draft(self, ctx):
        for step in super().draft(ctx):
            self.log.append(("computed", step.token))
            yield step


def test_each_draft_event_comes_before_the_next_draft_token_is_computed():
    pair = build_tiny_pair(vocab_size=32, seed=1)
    log: list = []
    s = DecodeSettings(gamma=4, temperature=1.0, max_new_tokens=20, seed=3)
    for ev in speculative_stream(pair, [5, 6, 7, 8], s, drafter=LoggingDrafter(pair, log)):
        if ev.kind == "draft":
            log.append(("event", ev.round.draft[-1].id))
        elif ev.kind == "round":
            log.append(("round", None))
    # Every computed token is shown (its event) before anything else happens.
    for i, entry in enumerate(log):
        if entry[0] == "computed":
            assert log[i + 1] == ("event", entry[1]), log[i : i + 3]
    assert sum(e[0] == "computed" for e in log) > 4


def test_a_policy_stop_wastes_no_draft_forward():
    """τ = 1: every token's confidence is below τ, so each round drafts exactly one token
    and the drafter is never asked for (never computes) a second one."""
    pair = build_tiny_pair(vocab_size=32, seed=1)
    s = DecodeSettings(gamma=6, temperature=1.0, max_new_tokens=16, seed=0, policy="confidence", tau=1.0)
    tr = speculative_decode(pair, [5, 6, 7], s)
    drafted = [r for r in tr.rounds if r.draft]
    assert drafted and all(len(r.draft) == 1 and r.draft_forwards == 1 for r in drafted)
    # Confidence stops them all (an EOS draft or the last token of the budget may come first).
    assert {r.draft_stop for r in drafted} <= {"confidence", "eos", "budget"}
    assert sum(r.draft_stop == "confidence" for r in drafted) >= len(drafted) - 2


class HiddenSpy(ModelDrafter):
    needs_hidden = True

    def __init__(self, pair):
        super().__init__(pair.draft, pair.device)
        self.seen: list[tuple[list[int], torch.Tensor | None]] = []

    def draft(self, ctx: DraftContext):
        self.seen.append((list(ctx.ids), None if ctx.hidden is None else ctx.hidden.clone()))
        yield from super().draft(ctx)


def test_drafters_that_ask_get_the_targets_hidden_state_at_the_accepted_position():
    pair = build_tiny_pair(vocab_size=32, seed=2)
    spy = HiddenSpy(pair)
    s = DecodeSettings(gamma=3, temperature=1.0, max_new_tokens=18, seed=5)
    speculative_decode(pair, [4, 9, 11, 6], s, drafter=spy)
    assert len(spy.seen) > 2
    for ids, hidden in spy.seen:  # the first round's comes from the prompt's prefill
        with torch.inference_mode():
            out = pair.target(torch.tensor([ids]), output_hidden_states=True)
        # The hidden state of the position that produced the last token (ids[-1]).
        torch.testing.assert_close(hidden, out.hidden_states[-1][0, -2], rtol=1e-4, atol=1e-5)


def test_drafters_that_do_not_ask_get_no_hidden_state():
    pair = build_tiny_pair(vocab_size=32, seed=2)
    seen = []

    class Plain(ModelDrafter):
        def draft(self, ctx):
            seen.append(ctx.hidden)
            yield from super().draft(ctx)

    speculative_decode(pair, [4, 9, 11], DecodeSettings(gamma=2, max_new_tokens=8), drafter=Plain(pair.draft, pair.device))
    assert seen and all(h is None for h in seen)


def test_prompt_lookup_proposes_one_hot_q_on_the_models_device():
    d = PromptLookupDrafter(vocab_size=10)
    dev = torch.device("cpu")
    ctx = DraftContext([1, 2, 3, 1, 2], 3, Warp(1.0), torch.Generator(), dev)
    steps = list(d.draft(ctx))
    assert [s.token for s in steps] == [3, 1, 2]
    for s in steps:
        assert s.q.device == dev and s.q.dtype == torch.float32 and float(s.q.sum()) == 1.0 and s.q[s.token] == 1.0
        assert s.forwards == 0


def test_every_registered_drafter_builds_for_the_tiny_pair():
    pair = build_tiny_pair(vocab_size=32)
    for name in DRAFTERS:
        s = DecodeSettings(drafter=name, max_new_tokens=6)
        if name == "speculator":  # trained for the default pair's target only: a clear refusal
            with pytest.raises(ModelError, match="No trained speculator"):
                make_drafter(pair, s)
            continue
        drafter = make_drafter(pair, s)
        tr = speculative_decode(pair, [5, 6, 5, 6, 5], s, drafter=drafter)
        assert tr.n_tokens == 6 and tr.models["drafter"] == drafter.name


def test_the_engine_imports_no_ui():
    """(That the drafters never import the engine: tests/test_imports.py checks every layer.)"""
    code = ("import sys, specviz.core.engine, specviz.cli.bench; "
            "print(sorted(m for m in sys.modules if m == 'app' or m.startswith(('specviz.ui', 'gradio'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_registry_and_the_settings_name_the_same_drafters():
    from specviz.core.settings import DRAFTER_NAMES, DRAFTER_ROUNDS
    from specviz.drafters import ChainDrafter, drafter_class

    assert tuple(DRAFTERS) == DRAFTER_NAMES
    for name in DRAFTERS:  # each class declares the round kind the settings expect, and keeps its contract
        cls = drafter_class(name)
        assert cls.round_kind == DRAFTER_ROUNDS[name]
        assert issubclass(cls, ChainDrafter) == (cls.round_kind == "chain")
        assert hasattr(cls, "grow") == (cls.round_kind == "tree")


def _hybrid(pair, vocab: int, min_ngram: int = 5):
    from specviz.drafters.hybrid import HybridDrafter

    return HybridDrafter(ModelDrafter(pair.draft, pair.device), vocab, min_ngram=min_ngram)


def test_the_hybrid_samples_the_target_exactly_whichever_drafter_a_position_gets():
    """The prompt ends with a 5-token run seen before: the first round copies (lookup); the second position's
    round copies only if the first token continued the repetition, else the draft model drafts.  The first two
    tokens still follow the target's joint distribution (χ²)."""
    from tests.test_engine import assert_matches, make_pair, next_dist

    pair = make_pair(vocab=6)
    prompt = [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4]
    warp = Warp(1.0)
    p1, exact = next_dist(pair.target, prompt, warp), {}
    for x1 in range(6):
        p2 = next_dist(pair.target, prompt + [x1], warp)
        for x2 in range(6):
            if p1[x1] * p2[x2] > 0:
                exact[(x1, x2)] = float(p1[x1] * p2[x2])
    samples, kinds = [], set()
    for seed in range(1500):
        s = DecodeSettings(gamma=1, temperature=1.0, max_new_tokens=3, seed=seed)  # a 2nd round drafts
        drafter = _hybrid(pair, 6)
        tr = speculative_decode(pair, prompt, s, drafter=drafter)
        samples.append(tuple(t.id for t in tr.tokens[:2]))
        kinds.update((r.draft_forwards == 0) for r in tr.rounds if r.draft)
    assert kinds == {True, False}, "both lookup and model rounds were sampled"
    assert_matches(samples, exact)


def test_the_hybrid_copies_where_the_text_repeats_and_its_models_drafts_are_the_models_own():
    """Greedy text equals standard text; lookup rounds (no forward) and model rounds both occur; and every model
    round drafts what a fresh draft model would from the same text: its cache caught up over the copied rounds."""
    pair = build_tiny_pair(vocab_size=40, sharpness=3.0, seed=2)
    prompt = pair.tokenizer("the cat sat on the mat and the cat sat on the").input_ids
    s = DecodeSettings(gamma=4, temperature=0.0, max_new_tokens=40)
    drafter = _hybrid(pair, pair.vocab_size, min_ngram=2)
    spec, std = speculative_decode(pair, prompt, s, drafter=drafter), standard_decode(pair, prompt, s)
    assert [t.id for t in spec.tokens] == [t.id for t in std.tokens]
    copied = [r for r in spec.rounds if r.draft and r.draft_forwards == 0]
    drafted = [r for r in spec.rounds if r.draft_forwards > 0]
    assert copied and drafted and drafter.looked == len(copied)
    assert spec.models["drafter"] == "draft model + prompt lookup"
    ids = list(prompt) + [t.id for t in spec.tokens]
    for rnd in drafted:
        before = ids[:len(prompt) + rnd.n_before]
        fresh = ModelDrafter(pair.draft, pair.device)
        fresh.start(before)
        ctx = DraftContext(before, len(rnd.draft), Warp(0.0), torch.Generator(), pair.device)
        assert [step.token for step in fresh.draft(ctx)] == [d.id for d in rnd.draft]
        fresh.free()


def test_lookup_with_a_minimum_match_proposes_nothing_for_a_shorter_one():
    lookup = PromptLookupDrafter(vocab_size=10, max_ngram=4)
    assert lookup.lookup([1, 2, 3, 9, 2, 3], 3) == [9, 2, 3]  # the 2-token tail "2 3" occurred
    assert lookup.lookup([1, 2, 3, 9, 2, 3], 3, min_n=3) == []
    assert lookup.lookup([1, 2, 3, 9, 1, 2, 3], 2, min_n=3) == [9, 1]


def test_the_rounds_say_which_the_hybrid_copied():
    from specviz.views.chips import round_html

    pair = build_tiny_pair(vocab_size=40, sharpness=3.0, seed=2)
    prompt = pair.tokenizer("the cat sat on the mat and the cat sat on the").input_ids
    s = DecodeSettings(gamma=4, temperature=0.0, max_new_tokens=40, drafter="hybrid")
    spec = speculative_decode(pair, prompt, s, drafter=_hybrid(pair, pair.vocab_size, min_ngram=2))
    seen = set()
    for rnd in spec.rounds:
        if rnd.draft:
            html = round_html(rnd, 4, drafter="hybrid")
            verb = "copied" if rnd.draft_forwards == 0 else "drafted"
            assert f"{len(rnd.draft)} {verb}" in html
            seen.add(verb)
    assert seen == {"copied", "drafted"}
