"""A byte-level BPE tokenizer (Qwen2's) built straight from a GGUF's vocabulary and merges, with ``tokenizers``.

transformers' GGUF path builds a ``GPT2Tokenizer`` from the file's metadata, adds its control and user-defined
tokens one by one and sets Qwen2's split regex (``integrations/gguf/gguf_tokenizer_mapping.py``): 29 s for the
0.5B draft's and 17 s for the 1.5B target's on the 2-core AMX Xeon, minutes on a busy 2-core EPYC.  The
tokenizer it makes is data: a BPE over the byte alphabet, Qwen2's pre-tokenizer (its regex, then ByteLevel),
the ByteLevel decoder, the added tokens.  Here that data is handed to the ``tokenizers`` library in one go
(~1 s) and saved as transformers saves it: ``tokenizer.json``, ``tokenizer_config.json`` and
``chat_template.jinja`` come out byte for byte as before (tested against transformers' conversion, with the
ids of a corpus of code, unicode and chat-template specials), so loading them (:func:`.tokens.converted_tokenizer`)
gives the same tokenizer.

Only what the offline packs need is built: ``tokenizer.ggml.model == "gpt2"`` with a known pre-tokenizer;
anything else is :class:`Unsupported` and the caller converts through transformers as before.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core.text import byte_alphabet

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types
# transformers' Qwen2 split (models/qwen2/tokenization_qwen2.PRETOKENIZE_REGEX), for the pre-tokenizers that use it
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")
SPLITS = {"qwen2": QWEN2_SPLIT, "deepseek-r1-qwen": QWEN2_SPLIT}
# what transformers' save_pretrained writes into tokenizer_config.json for such a tokenizer (5.x)
MAX_LENGTH = int(1e30)


class Unsupported(ValueError):
    """The GGUF's tokenizer is not one this module builds (the caller converts it through transformers)."""


def check(metadata: dict[str, Any]) -> None:
    if metadata.get("tokenizer.ggml.model") != "gpt2":
        raise Unsupported(f"tokenizer model {metadata.get('tokenizer.ggml.model')!r} (only byte-level BPE, 'gpt2')")
    if metadata.get("tokenizer.ggml.pre") not in SPLITS:
        raise Unsupported(f"pre-tokenizer {metadata.get('tokenizer.ggml.pre')!r}")
    if "tokenizer.ggml.merges" not in metadata:
        raise Unsupported("no merges in the file")


def build(metadata: dict[str, Any]):
    """The ``tokenizers.Tokenizer`` the GGUF's metadata describes (:class:`Unsupported` where not built here)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    check(metadata)
    spelling = byte_alphabet()
    alphabet = set(spelling.values())
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    # as transformers' byte_level_tokenizer: a token outside the byte alphabet is spelled byte by byte
    vocab = {t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ")) for m in metadata["tokenizer.ggml.merges"]]
    bpe = models.BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None, continuing_subword_prefix="",
                     end_of_word_suffix="", fuse_unk=False, byte_fallback=False, ignore_merges=False)
    tok = Tokenizer(bpe)
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLITS[metadata["tokenizer.ggml.pre"]]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.post_processor = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1", special_tokens=[])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    types = metadata.get("tokenizer.ggml.token_type")
    types = [] if types is None else [int(x) for x in types]
    # control tokens (as transformers adds them: special, skipping a mislabelled one outside the byte alphabet),
    # then user-defined ones (not special) that the vocabulary holds
    control = [AddedToken(t, normalized=False, special=True) for t, k in zip(tokens, types)
               if k == CONTROL and set(t) <= alphabet]
    if control:
        tok.add_special_tokens(control)
    user = [AddedToken(t, normalized=False, special=False) for t, k in zip(tokens, types) if k == USER_DEFINED and t in vocab]
    if user:
        tok.add_tokens(user)
    return tok


def _special(metadata: dict[str, Any], key: str) -> str | None:
    token_id = metadata.get(f"tokenizer.ggml.{key}")
    return metadata["tokenizer.ggml.tokens"][int(token_id)] if token_id is not None else None


def config(metadata: dict[str, Any]) -> dict[str, Any]:
    """``tokenizer_config.json`` as transformers' conversion saved it (Qwen2Tokenizer, the tokenizers backend)."""
    return {
        "add_prefix_space": None,
        "backend": "tokenizers",
        "bos_token": _special(metadata, "bos_token_id"),
        "eos_token": _special(metadata, "eos_token_id"),
        "is_local": True,
        "local_files_only": True,
        "model_max_length": MAX_LENGTH,
        "pad_token": _special(metadata, "padding_token_id"),
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": _special(metadata, "unknown_token_id"),
    }


def save(metadata: dict[str, Any], out: Path) -> Any:
    """Write ``tokenizer.json``, ``tokenizer_config.json`` and ``chat_template.jinja`` into ``out``; returns the
    ``tokenizers.Tokenizer`` (:class:`Unsupported` where this module does not build the file's tokenizer)."""
    tok = build(metadata)
    out = Path(out)
    tok.save(str(out / "tokenizer.json"))
    text = json.dumps(config(metadata), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    (out / "tokenizer_config.json").write_text(text, encoding="utf-8")
    template = metadata.get("tokenizer.chat_template")
    if template:
        (out / "chat_template.jinja").write_text(template, encoding="utf-8")
    return tok


def eos_token_id(metadata: dict[str, Any]) -> int | None:
    value = metadata.get("tokenizer.ggml.eos_token_id")
    return int(value) if value is not None else None
