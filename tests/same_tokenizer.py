"""Whether two tokenizers are the same tokenizer for everything specviz asks of one (models.tokens)."""

from __future__ import annotations

import random

from specviz.models.tokens import _chat_ids

TEXTS = ["def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)", "Hello, world! ümlaut 日本語 🤖 ✓",
         "<|im_start|>user\nhi<|im_end|><|endoftext|>", "  leading spaces\t\ttabs\r\n\n", "a" * 50,
         "x = [1,2,3]  # comment", "", " ", "1234567890 3.14159", "Ǆ ﬁ Å ＡＢ"]
ATTRS = ("eos_token_id", "bos_token_id", "pad_token_id", "unk_token_id", "all_special_ids", "all_special_tokens",
         "model_max_length", "chat_template", "padding_side", "truncation_side", "clean_up_tokenization_spaces")


def assert_same_tokenizer(ref, other, *, samples: int = 300) -> None:
    assert len(ref) == len(other) and ref.get_vocab() == other.get_vocab()
    assert ref.added_tokens_decoder.keys() == other.added_tokens_decoder.keys()
    for attr in ATTRS:
        assert getattr(ref, attr) == getattr(other, attr), attr
    for text in TEXTS:
        for split in (False, True):
            a = ref.encode(text, add_special_tokens=True, split_special_tokens=split)
            assert a == other.encode(text, add_special_tokens=True, split_special_tokens=split), (text, split)
            assert ref.decode(a) == other.decode(a)
        if ref.chat_template:
            assert _chat_ids(ref, text) == _chat_ids(other, text), text
            msgs = [{"role": "user", "content": text}]
            assert ref.apply_chat_template(msgs, tokenize=False) == other.apply_chat_template(msgs, tokenize=False)
    rng = random.Random(0)
    for _ in range(samples):
        ids = [rng.randrange(len(ref)) for _ in range(rng.randrange(1, 16))]
        assert ref.convert_ids_to_tokens(ids) == other.convert_ids_to_tokens(ids)
        for skip in (False, True):
            assert ref.decode(ids, skip_special_tokens=skip) == other.decode(ids, skip_special_tokens=skip), ids
