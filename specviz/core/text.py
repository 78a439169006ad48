"""The text of tokens: one token's (a chip) and a growing sequence's (the output), and the one notation the
page writes a token in (`token_label`: chips, narration, the rules' table, the acceptance picture, the challenges).

The engine shows tokens as the views and the tests do; specviz.models.tokens re-exports these beside
the prompt's encoding and the ids that end generation.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from typing import Any


# Characters no font draws as a glyph (a reader saw empty boxes): controls, format characters (bidi
# overrides, zero-width spaces: they also reorder or hide text), private-use and unassigned code points,
# lone surrogates, line/paragraph separators.  ZWJ (U+200D) stays: it joins emoji sequences.
_UNPRINTABLE = frozenset({"Cc", "Cf", "Co", "Cn", "Cs", "Zl", "Zp"})
_KEEP = frozenset({"\u200d"})


def unprintable(ch: str) -> bool:
    """True for a character a token view shows as an escape instead of a glyph (see :func:`char_escape`)."""
    return ch not in _KEEP and unicodedata.category(ch) in _UNPRINTABLE


def char_escape(ch: str) -> str:
    """A character as Python writes it in a string: \\x07, \\u200b, \\U000f0001 (plain text)."""
    n = ord(ch)
    if n <= 0xFF:
        return f"\\x{n:02x}"
    if n <= 0xFFFF:
        return f"\\u{n:04x}"
    return f"\\U{n:08x}"


# Chips, the narration, the three rules' header, the acceptance picture's position picker and its bars, the tree
# and the challenges all write a token with these: whitespace as a mark, an empty token ∅, a special token
# (Qwen's <|im_end|>, <|endoftext|>) as ⟨im_end⟩, an unprintable character as its escape.
WS_MARKS = {" ": "·", "\n": "↵", "\t": "⇥", "\r": "␍"}
EMPTY_TOKEN = "∅"
_SPECIAL = re.compile(r"<\|([^<>|\s]{1,40})\|>")


def special_token(text: str) -> str | None:
    """The name of a special token ('im_end' for <|im_end|>), None for an ordinary token."""
    m = _SPECIAL.fullmatch(text or "")
    return m.group(1) if m else None


def token_label(text: str, limit: int | None = None) -> str:
    """A token as the page writes it everywhere (plain text): ' foo.\\n' reads ·foo.↵ (WS_MARKS).
    ``limit``: at most this many characters, the last an ellipsis."""
    name = special_token(text)
    if name is not None:
        shown = f"⟨{name}⟩"
    elif text == "":
        shown = EMPTY_TOKEN
    else:
        shown = "".join(WS_MARKS.get(ch) or (char_escape(ch) if unprintable(ch) else ch) for ch in text)
    return shown if limit is None or len(shown) <= limit else shown[: limit - 1] + "…"


def tok_repr(text: str, limit: int = 40) -> str:
    """A token quoted in a sentence (plain text, NOT escaped for HTML): 'foo·bar↵' (:func:`token_label`)."""
    return f"'{token_label(text, limit)}'"


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
    """GPT-2's ``bytes_to_unicode``: byte-level BPE pieces spell each byte as a printable character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_BYTE_DECODER = {c: b for b, c in byte_alphabet().items()}  # a piece's characters -> its bytes


def token_text(tokenizer: Any, token_id: int) -> str:
    """Display text of one token, for a token chip. Never raises (``<id>`` for an id it cannot render).

    Plain ``tokenizer.decode([id])`` is not enough for a chip, which is why this is not just that:

    * A byte-level token holding part of a multi-byte UTF-8 character decodes to U+FFFD on its own,
      so the two or three pieces of "日" would all show as the same "�".  Here such a token shows its
      bytes instead (``\\xe6\\x97``), so adjacent pieces stay distinguishable and honest about what the
      model emitted.
    * SentencePiece pieces keep their leading space ("▁the" -> " the"), which decoding a lone token
      drops, so a chip shows where words start.

    For running text, where the pieces of a character should join, use :class:`Detokenizer`.
    """
    try:
        token_id = int(token_id)
        text = tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        convert = getattr(tokenizer, "convert_ids_to_tokens", None)  # a bare decoder has no pieces
        piece = convert(token_id) if convert else None
        if piece is None:
            return text if text else f"<{token_id}>"
        if "\ufffd" in text and piece and all(c in _BYTE_DECODER for c in piece):
            return bytes(_BYTE_DECODER[c] for c in piece).decode("utf-8", errors="backslashreplace")
        if piece.startswith("▁") and not text.startswith(" "):
            text = " " + text
        return text
    except Exception:
        return f"<{token_id}>"


class Detokenizer:
    """Incremental detokenisation of the emitted text, so the pieces of multi-byte characters split
    over several tokens join into the right string.

    ``push(id)`` returns the text the new token adds: "" while a character is still incomplete, then
    the whole character with the token that completes it.
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""

    def push(self, tok: int) -> str:
        self.ids.append(tok)
        full = self.tokenizer.decode(self.ids, skip_special_tokens=False)
        if full.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
            return ""
        if full.startswith(self.text):
            piece = full[len(self.text) :]
        else:  # the tokenizer re-spaced earlier text; fall back to the token alone
            piece = self.tokenizer.decode([tok], skip_special_tokens=False)
        self.text = full
        return piece
