"""The generated text, each token coloured by where it came from."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ._fmt import LABELS, esc, running_html

if TYPE_CHECKING:
    from specviz.trace import Token, Trace

_CODE_HINT = re.compile(r"(^|\n)(    |\t)\S|```|\n\s*(def|class|import|return|for|if|#include|function)\b|[{};]\s*\n")


def _pairs(trace_or_tokens: Any, upto_time: float | None = None) -> list[tuple[Any, int | None]]:
    """(token, 1-based round number or None) for a Trace or an iterable of Tokens."""
    if trace_or_tokens is None:
        return []
    rounds = getattr(trace_or_tokens, "rounds", None)
    if rounds is not None:
        out = []
        for rnd in rounds:
            if upto_time is not None and rnd.t_end > upto_time:
                break
            out.extend((tok, rnd.index + 1) for tok in rnd.emitted)
        return out
    return [(tok, None) for tok in trace_or_tokens]


def looks_like_code(text: str) -> bool:
    return bool(_CODE_HINT.search(text or ""))


def tokens_html(pairs: Iterable[tuple[Any, int | None]], highlight_origins: bool = True) -> str:
    """The token spans only (no container)."""
    parts = []
    for tok, rnd in pairs:
        origin = getattr(tok, "origin", "target")
        if origin not in LABELS:
            origin = "target"
        text = running_html(getattr(tok, "text", ""))  # a special token ⟨im_end⟩, a control character its escape
        if not highlight_origins:
            parts.append(f'<span class="sv-tk">{text}</span>')
            continue
        title = LABELS[origin] + (f" · round {rnd}" if rnd is not None else "")
        parts.append(f'<span class="sv-tk sv-{origin}" data-origin="{origin}" title="{esc(title)}">{text}</span>')
    return "".join(parts)


def text_html(
    trace_or_tokens: Trace | Iterable[Token] | None,
    highlight_origins: bool = True,
    *,
    streaming: bool = False,
    show_prompt: bool = False,
    mono: bool | None = None,
    upto_time: float | None = None,
    placeholder: str = "",
) -> str:
    """The generated text so far, tokens coloured by origin, whitespace preserved.

    ``trace_or_tokens``: a Trace, or any iterable of Token (origin: accepted,
    correction, bonus, target).  ``streaming`` adds a blinking caret.
    ``show_prompt`` (Trace only) prints the prompt first, muted.  ``mono``:
    monospace font (None: automatic, on when the text looks like code).
    ``upto_time``: only tokens of rounds that ended by then (Trace only).
    """
    pairs = _pairs(trace_or_tokens, upto_time)
    body = tokens_html(pairs, highlight_origins)
    prompt = ""
    prompt_text = getattr(trace_or_tokens, "prompt", "") if show_prompt else ""
    if prompt_text:
        prompt = f'<span class="sv-prompt" title="prompt">{esc(prompt_text)}</span>'
    if mono is None:
        mono = looks_like_code(prompt_text + "".join(getattr(t, "text", "") for t, _ in pairs))
    caret = '<span class="sv-caret" aria-hidden="true"></span>' if streaming else ""
    if not pairs and not prompt and not streaming:
        empty = esc(placeholder) if placeholder else ""
        return f'<div class="sv-text sv-text--empty">{empty}</div>'
    cls = "sv-text" + (" sv-text--mono" if mono else "") + ("" if highlight_origins else " sv-text--plain")
    return f'<div class="{cls}">{prompt}{body}{caret}</div>'
