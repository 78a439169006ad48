"""Tokens and text: the prompt's token ids, the display text of tokens, the ids that end generation.

There is one helper for each job, so the engine, the views and the tests all show tokens the same
way:

* :func:`token_text` -- the text of ONE token, for a token chip (exact bytes of partial characters);
* :class:`Detokenizer` -- the text of a growing sequence, for the generated output (pieces of a
  multi-byte character join into the right character);
* :func:`encode_prompt` -- the ids both models are fed;
* :func:`eos_ids` -- every id that ends generation.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ..core.text import Detokenizer, token_text  # noqa: F401  (the core's: the engine shows tokens too)

if TYPE_CHECKING:
    from .pair import ModelPair


# The fast tokenizer's "split special tokens" switch is state on the shared tokenizer, set per call:
# one encode at a time keeps another thread from flipping it mid-call.
_ENCODE_LOCK = threading.Lock()


def encode_prompt(pair: "ModelPair", prompt: str, chat: bool = True) -> list[int]:
    """Token ids fed to both models. ``chat``: wrap in the tokenizer's chat template (if it has one).

    The user's text stays text: special tokens typed into it (``<|im_end|><|im_start|>system``)
    are encoded as their characters, so a prompt cannot close its own turn and open a system or
    assistant turn.  Only the template's own control tokens are encoded as tokens (transformers'
    ``sanitize_control_tokens``); a prompt without control tokens encodes exactly as before."""
    tok = pair.tokenizer
    if chat and getattr(tok, "chat_template", None):
        return _chat_ids(tok, prompt)
    with _ENCODE_LOCK:
        return list(tok.encode(prompt, add_special_tokens=True, split_special_tokens=True))


def _chat_ids(tok: Any, prompt: str) -> list[int]:
    """``prompt`` as one user turn of ``tok``'s chat template, ready for the assistant's answer."""
    with _ENCODE_LOCK:
        # tokenize=True, without special tokens: the template already holds any BOS it wants.
        return list(tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            sanitize_control_tokens=True, return_dict=False))


def template_head(tokenizer: Any) -> tuple[int, ...]:
    """The ids every chat-encoded prompt of ``tokenizer`` begins with (Qwen's: its system turn and
    ``<|im_start|>user``, 24 tokens), or () without a chat template: where both models' lean steps split their
    prompt passes (:attr:`.lean.LeanSteps.shared_prefix`, set at load).  Cached on the tokenizer."""
    head = getattr(tokenizer, "_specviz_template_head", None)
    if head is None:
        head = ()
        if getattr(tokenizer, "chat_template", None):
            try:
                a, b = _chat_ids(tokenizer, "a"), _chat_ids(tokenizer, "Zq 7")  # as encode_prompt encodes
                n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                head = tuple(a[:n]) if n >= 8 else ()
            except Exception:  # noqa: BLE001 -- a template that cannot render a plain turn: no split
                head = ()
        try:
            tokenizer._specviz_template_head = head
        except AttributeError:
            pass
    return head


def eos_ids(tokenizer: Any, generation_config: Any = None, extra_tokens: tuple[str, ...] = ()) -> list[int]:
    """Every id that ends generation: tokenizer eos, generation_config eos (int or list), named extras."""
    ids: list[int] = []

    def add(value: Any) -> None:
        if value is None:
            return
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, int) and v >= 0 and v not in ids:
                ids.append(v)

    add(getattr(tokenizer, "eos_token_id", None))
    add(getattr(generation_config, "eos_token_id", None))
    if extra_tokens:  # get_vocab() builds a 150k-entry dict: only when needed
        vocab = tokenizer.get_vocab()
        for tok in extra_tokens:
            add(vocab.get(tok))
    return ids


# tokenizer classes whose tokenizer.json is the whole tokenizer (checked against AutoTokenizer's: the tests)
DIRECT_CLASSES = frozenset({"Qwen2Tokenizer"})
_DIRECT_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token", "model_max_length", "add_prefix_space",
                "clean_up_tokenization_spaces")


def converted_tokenizer(source: Any) -> Any | None:
    """The tokenizer of a model specviz converted itself (``tokenizer.json``, ``tokenizer_config.json`` and
    ``chat_template.jinja`` as transformers saved them), read straight from ``tokenizer.json`` by the
    tokenizers library; None where that is not known to give AutoTokenizer's tokenizer (another class, or a
    file missing), and the caller loads it the usual way.

    Why: for Qwen2Tokenizer, ``AutoTokenizer`` parses the 7 MB ``tokenizer.json`` with Python's json (four
    times) and rebuilds the BPE from its vocabulary and merges: 1.2-1.4 s of a warm start's preload on the AVX2
    EPYC, under the interpreter lock the page's build needs; this, 0.5 s.  Every id, text, special token and
    chat template comes out the same (tests/test_models.py and tests/test_real_pair.py compare them)."""
    import json
    from pathlib import Path

    source = Path(source)
    try:
        config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    file = source / "tokenizer.json"
    if config.get("tokenizer_class") not in DIRECT_CLASSES or config.get("backend", "tokenizers") != "tokenizers" \
            or not file.is_file():
        return None
    template = source / "chat_template.jinja"
    kwargs = {k: config[k] for k in _DIRECT_KEYS if k in config}
    kwargs["chat_template"] = template.read_text(encoding="utf-8") if template.is_file() else config.get("chat_template")
    from transformers import TokenizersBackend

    return TokenizersBackend(tokenizer_file=str(file), **kwargs)
