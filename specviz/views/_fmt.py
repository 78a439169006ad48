"""Shared helpers for the views: escaping, number formatting, the colour palette.

Nothing here imports torch or a model; everything works on plain trace data.
Every string that came from a user or a model (token text, prompt, model
names, error messages) goes through :func:`esc` before it is put in HTML.
"""

from __future__ import annotations

import html as _html
import math
import unicodedata
from typing import Any

from ..core.text import (EMPTY_TOKEN, WS_MARKS, char_escape, special_token, tok_repr,  # noqa: F401 (re-exported)
                         token_label, unprintable)

# ---- palette -------------------------------------------------------------------
# One colour per token status/origin, shared by the chips (assets/style.css keeps
# the same hues as CSS variables) and by the plotly figures.  Chosen so that the statuses stay
# apart for protanopes, deuteranopes and tritanopes too: `python -m specviz.views.cvd` checks it.

COLORS: dict[str, str] = {
    "accepted": "#059669",    # green (emerald): draft token the target accepted
    "rejected": "#b91c1c",    # dark red: the first draft token the target rejected
    "discarded": "#9ca3af",   # grey: drafted after the rejection, never verified
    "correction": "#ea580c",  # orange: sampled from the residual norm(max(0, p − q))
    "bonus": "#2563eb",       # blue: all γ accepted, sampled from p_{γ+1}
    "target": "#7c3aed",      # violet: standard decoding, sampled from p
    "pending": "#eab308",     # yellow: drafted, waiting for the target
    # decoders / model roles in the plots
    "speculative": "#0d9488",  # teal
    "standard": "#7c3aed",     # violet (= the target model alone)
    "draft_time": "#f59e0b",   # amber (= the draft model)
    "verify_time": "#7c3aed",  # violet (= the target model)
    "theory": "#64748b",       # slate
}

# Human names for the statuses, as the legend and tooltips spell them.
LABELS: dict[str, str] = {
    "accepted": "accepted draft",
    "rejected": "rejected draft",
    "discarded": "discarded draft",
    "correction": "correction",
    "bonus": "bonus",
    "target": "target (standard decoding)",
    "pending": "pending (awaiting the target)",
}

MEANINGS: dict[str, str] = {
    "accepted": "the draft proposed it and the target agreed (u < b)",
    "rejected": "the first draft token the target turned down (u ≥ b)",
    "discarded": "drafted after the rejection: never verified, thrown away",
    "correction": "sampled by the target from the residual norm(max(0, p − q)) in place of the rejected token",
    "bonus": "all drafts accepted, so the target's extra position gives a free token from p",
    "target": "standard decoding: one target forward pass, one token sampled from p",
    "pending": "proposed by the drafter, waiting for the target's verdict",
}

# Who proposed a pending token, per drafter (settings.drafter): the legend's "pending" line names it.
PENDING_BY: dict[str, str] = {
    "model": "drafted by the small draft model",
    "tree": "a node of the small draft model's token tree",
    "speculator": "proposed by the learned head (MLP speculator) from the target's hidden state",
    "prompt-lookup": "copied from earlier text by prompt lookup (no model)",
    "hybrid": "drafted by the small draft model, or copied by prompt lookup where the text repeats",
}
# The drafter in a few words (plot legends): "draft (learned head)".
DRAFTER_SHORT: dict[str, str] = {"model": "small model", "tree": "token tree", "speculator": "learned head",
                                 "prompt-lookup": "prompt lookup", "hybrid": "model + lookup"}


def esc(text: Any) -> str:
    """HTML-escape anything (quotes included, so it is safe inside attributes)."""
    return _html.escape("" if text is None else str(text), quote=True)


def escape_unprintable(text: str, keep: str = "") -> str:
    """``text`` with every :func:`unprintable` character (those in ``keep`` aside) written as its escape
    (plain text, NOT escaped for HTML)."""
    return "".join(char_escape(ch) if ch not in keep and unprintable(ch) else ch for ch in text)


def unprintable_html(text: str, keep: str = "\n\t") -> str:
    """Escaped HTML of ``text`` for a running text: each unprintable character (``keep`` aside) as a
    faint escape with its name on hover, e.g. <span class="sv-ws" title="U+0007 control character, …">\\x07</span>."""
    out = []
    for ch in text:
        if ch not in keep and unprintable(ch):
            out.append(f'<span class="sv-ws" title="{esc(_char_title(ch))}">{esc(char_escape(ch))}</span>')
        else:
            out.append(esc(ch))
    return "".join(out)


def _char_title(ch: str) -> str:
    kind = {"Cc": "control character", "Cf": "invisible format character", "Co": "private-use character",
            "Cn": "unassigned character", "Cs": "lone surrogate", "Zl": "line separator",
            "Zp": "paragraph separator"}.get(unicodedata.category(ch), "character")
    return f"U+{ord(ch):04X} {kind}, shown as its escape"


# ---- one notation for a token (specviz.core.text.token_label), as HTML -----------------------------


def visible_ws(text: str) -> str:
    """Token text for a chip (escaped HTML): :func:`token_label`'s notation, the marks faint
    (<span class="sv-ws">), an unprintable character's name and a special token's text on hover."""
    name = special_token(text)
    if name is not None:
        return f'<span class="sv-ws" title="{esc(f"special token {text}")}">⟨{esc(name)}⟩</span>'
    if text == "":
        return f'<span class="sv-ws">{EMPTY_TOKEN}</span>'
    out = []
    for ch in text:
        if ch in WS_MARKS:
            out.append(f'<span class="sv-ws">{WS_MARKS[ch]}</span>')
        else:
            out.append(unprintable_html(ch, keep=""))
    return "".join(out)


def running_html(text: str) -> str:
    """A token inside a running text (the race, the output): its own whitespace, a special token as a faint
    ⟨im_end⟩ (its text on hover), unprintable characters as escapes.  Escaped HTML."""
    name = special_token(text)
    if name is not None:
        return f'<span class="sv-ws" title="{esc(f"special token {text}")}">⟨{esc(name)}⟩</span>'
    return unprintable_html(text)


def fnum(x: float | None, digits: int = 2) -> str:
    """A probability-like number: fixed decimals, scientific when tiny, '—' when missing."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    if x != 0 and abs(x) < 10 ** (-digits) / 2:
        return f"{x:.1e}"
    return f"{x:.{digits}f}"


def fsig(x: float | None, sig: int = 3) -> str:
    """A probability-like number to ``sig`` significant digits, for a reader to compute with (tooltips):
    0.979, 0.0180, 0.000612, then scientific below 1e-4 (6.12e-05); 1.00; 0; '—' when missing.
    Fixed decimals (:func:`fnum`) turned p = 0.000612 into "0.001" and q = 0.0184 into "0.018"."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    if x == 0:
        return "0"
    if abs(x) < 1e-4:
        return f"{x:.{sig - 1}e}"
    return f"{x:#.{sig}g}"


def _distinct(fmt, a: float, b: float, first: int, last: int) -> tuple[str, str]:
    """a and b through fmt(x, d) for d = first, first + 1, … until unequal values look unequal (at most last)."""
    for d in range(first, last):
        sa, sb = fmt(a, d), fmt(b, d)
        if sa != sb or a == b:
            return sa, sb
    return fmt(a, last), fmt(b, last)


def fsig_pair(a: float, b: float, sig: int = 3) -> tuple[str, str]:
    """:func:`fsig` for two numbers compared in a verdict, with more digits until unequal ones look unequal."""
    return _distinct(fsig, a, b, sig, 10)


def fpair(a: float, b: float, digits: int = 2) -> tuple[str, str]:
    """Format two numbers with just enough decimals that unequal values look unequal."""
    return _distinct(fnum, a, b, digits, 6)


def fsec(x: float | None) -> str:
    """Seconds, readable: 0.043 s, 1.27 s, 12.3 s."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    if x < 0.01:
        return f"{x * 1000:.1f} ms"
    if x < 10:
        return f"{x:.2f} s"
    return f"{x:.1f} s"


def plural(n: int, word: str, words: str | None = None) -> str:
    return f"{n} {word if n == 1 else (words or word + 's')}"


def ranges_text(values: Any) -> str:
    """Whole numbers as the data has them, runs of three or more joined: [1, 2, …, 6, 8, 10, 12] ->
    "1–6, 8, 10, 12"; [1, …, 12] -> "1–12"; [] -> "none"."""
    xs = sorted({int(v) for v in values})
    runs: list[list[int]] = []
    for x in xs:
        if runs and x == runs[-1][-1] + 1:
            runs[-1].append(x)
        else:
            runs.append([x])
    parts = []
    for run in runs:
        parts += [f"{run[0]}–{run[-1]}"] if len(run) >= 3 else [str(x) for x in run]
    return ", ".join(parts) or "none"


def epsilon_of(settings: Any) -> float:
    """ε of a trace's DecodeSettings (validated on load), 0 when there are none."""
    return settings.epsilon if settings is not None else 0.0


def plain_ratio(p: float, q: float) -> float:
    """min(1, p / q): the acceptance probability without ε."""
    if q <= 0:
        return 1.0
    return min(1.0, p / q)


def thanks_to_epsilon(p: float, q: float, u: float, accepted: bool, eps: float) -> bool:
    """True when a draft was accepted only because of the ε slack (u ≥ p/q but u < b)."""
    return bool(accepted and eps > 0 and u >= plain_ratio(p, q))


def mean_draft_length(trace: Any) -> float | None:
    """Draft tokens per round of a speculative trace (γ is the most a round may draft)."""
    if trace is None or getattr(trace, "kind", None) != "speculative" or not trace.rounds:
        return None
    return sum(len(r.draft) for r in trace.rounds) / len(trace.rounds)


def drafter_name(trace: Any, *, subject: bool = False, short: bool = False) -> str:
    """Who drafted: "the draft model <name>" / "prompt lookup" (plain text, not escaped).

    ``subject``: the form for a sentence ("the draft model proposed …");
    ``short``: for a heading ("draft model")."""
    settings = getattr(trace, "settings", None)
    key = getattr(settings, "drafter", "model")
    models = getattr(trace, "models", None) or {}
    if key in ("model", "hybrid"):
        name = models.get("draft") or ""
        lookup = key == "hybrid"
        if short:
            return "draft model + lookup" if lookup else "draft model"
        who = "the draft model" if subject or not name else f"the draft model {name}"
        return who + (" with prompt lookup" if lookup else "")
    return models.get("drafter") or key


def pending_meaning(trace: Any = None) -> str:
    """The legend's meaning of a pending chip, naming the run's drafter (plain text)."""
    key = getattr(getattr(trace, "settings", None), "drafter", None)
    by = PENDING_BY.get(key) if getattr(trace, "kind", None) == "speculative" else None
    return f"{by}, waiting for the target's verdict" if by else MEANINGS["pending"]


def draft_source(trace: Any) -> str:
    """What drafted, for the race header: "draft <model>", "token tree of draft <model> (best-first, ≤ 16
    nodes)", "learned head (MLP speculator)", "prompt lookup" (plain text, not escaped)."""
    settings = getattr(trace, "settings", None)
    key = getattr(settings, "drafter", "model")
    models = getattr(trace, "models", None) or {}
    draft = models.get("draft") or "?"
    if key == "model":
        return f"draft {draft}"
    if key == "hybrid":
        return f"draft {draft} + prompt lookup"
    if key == "tree":
        return f"token tree of draft {draft} ({settings.tree_mode}, ≤ {settings.tree_nodes} nodes)"
    return models.get("drafter") or DRAFTER_SHORT.get(key, key)


def policy_text(settings: Any) -> str:
    """"constant policy, γ = 5" / "confidence policy, γ ≤ 32, τ = 0.4" (plain text)."""
    if settings is None:
        return ""
    policy = getattr(settings, "policy", "constant")
    text = f"{policy} policy, γ = {settings.gamma}" if policy == "constant" else f"{policy} policy, γ ≤ {settings.gamma}"
    if policy == "confidence":
        text += f", τ = {settings.tau:g}"
    return text


def run_text(trace: Any, *, short: bool = False) -> str:
    """What drafted and how long, for a speculative trace: "prompt lookup · constant policy, γ = 5"."""
    if trace is None or getattr(trace, "kind", None) != "speculative":
        return ""
    return f"{drafter_name(trace, short=short)} · {policy_text(trace.settings)}"


# The verification rule that ran, as the rounds' header and the legend name it.
RULE_TEXT = {"token": "token-wise verification", "block": "block verification", "match": "exact-match verification"}


# ... and in a few words, for the rounds' header (one line at 1280 px, beside the drafter, policy and times).
RULE_SHORT = {"token": "token rule", "block": "block rule", "match": "match rule"}


def rule_text(trace: Any, *, short: bool = False) -> str:
    """"token-wise verification" / "block verification" / "exact-match verification", "tree verification
    (multi-candidate)" for the tree drafter; "" for standard decoding (plain text).  ``short``: "token rule",
    "block rule", "match rule", "tree rule"."""
    if trace is None or getattr(trace, "kind", None) != "speculative":
        return ""
    settings = getattr(trace, "settings", None)
    if getattr(settings, "drafter", "") == "tree":
        return "tree rule" if short else "tree verification (multi-candidate)"
    rule = getattr(settings, "rule", "token")
    if short:
        return RULE_SHORT.get(rule, f"{rule} rule")
    return RULE_TEXT.get(rule, f"{rule} verification")


# Where each verification rule draws a correction from (specviz.core.rules), as the page says it.
RESIDUAL_OF = {"token": "the residual norm(max(0, p − q))",
               "block": "block verification's residual norm(max(0, w·p − q))",
               "match": "p without the drafted token (the target's own sample)"}
