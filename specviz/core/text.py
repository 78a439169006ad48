"""The text of tokens: one token's (a chip) and a growing sequence's (the output).

The engine shows tokens as the views and the tests do; specviz.models.tokens re-exports these beside
the prompt's encoding and the ids that end generation.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any


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
