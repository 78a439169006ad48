"""The page's symbols and terms, each defined in one line: the glossary of the "How it works" tab, and the
hover definitions (``<abbr title=…>``) the views put on the symbols they print.

:data:`GLOSSARY` is the one source: the tab's section (:func:`glossary_markdown`) and every hover
(:func:`glossed`, :func:`term_title`) read it.
"""

from __future__ import annotations

import re

from ._fmt import esc

# term -> one line.  Symbols as the page prints them; p and q as in Leviathan et al. (p = target, q = draft).
GLOSSARY: dict[str, str] = {
    "p, q": "The target's (p) and the draft's (q) probability of a token at one position.",
    "γ": "Draft length: the most tokens the drafter proposes in one round (a token tree's depth).",
    "α": "Acceptance rate: accepted drafts ÷ verified drafts over a run.",
    "β": "Expected acceptance at one position: Σ min(p, q) = 1 − TV(p, q), the chance a token drawn from q is kept.",
    "b": "Acceptance probability of a drafted token x: b = min(1, p(x)/q(x)), or min(1, (p(x) + ε)/q(x)) with ε.",
    "u": "The uniform random draw (0 ≤ u < 1) that decides a draft: accepted when u < b (block verification: u < h).",
    "TV": "Total variation distance between two distributions: ½ Σ |p − q|, the probability mass where they differ.",
    "h": "Block verification's acceptance number for position i; the rule keeps every token up to the last "
         "position whose u < h.",
    "w": "Block verification's running weight, w_i = min(1, w_(i−1) · p/q): how well the draft so far agrees with p.",
    "ε": "Over-acceptance (Yin et al.): b = min(1, (p + ε)/q) accepts more drafts at the price of a measured bias; "
         "0 = exact.",
    "τ": "Confidence threshold of the confidence policy: drafting stops after a token the drafter gave a "
         "probability below τ.",
    "OPT / UNO": "After a rejection, Decoding-OPT samples the correction from the residual (exact at ε = 0); "
                 "Decoding-UNO samples it from p, for comparison.",
    "residual": "norm(max(0, p − q)): where the target gives a token more probability than the draft did; a "
                "correction is sampled from it, so the output stays exactly p.",
    "Thm 3.8": "Leviathan et al.'s speedup: (1 − α^(γ+1)) / ((1 − α)(γc + v)), with v = 1 in the paper "
               "(a verify pass costs one step).",
    "v": "Verify factor: one verify pass's time in standard one-token steps (1 when memory-bound; more when "
         "compute-bound).",
    "c": "Cost ratio: one draft token's time ÷ one standard one-token step of the target.",
    "T(k)": "The target's time for one forward pass over k new tokens; T(k)/T(1) is a k-token verify pass in steps.",
    "count-based": "A speedup computed from the race's own counts (rounds, passes, tokens) priced at this "
                   "machine's probed costs, instead of its wall clock.",
    "probed costs": "The one-token step, verify curve T(k) and draft step the execution probe timed on this "
                    "machine when the pair loaded.",
    "int8": "Weights stored as 8-bit integers with a scale per output channel: a quarter of float32's bytes.",
    "Q4_K": "llama.cpp's 4-bit block quantisation (about 4.5 bits a weight), as stored in a GGUF file.",
    "GGUF": "llama.cpp's model file format: the weights, often quantised (Q4_K, Q6_K), with the tokenizer.",
    "batch-invariant": "Each token's result does not depend on how many tokens share the pass, so a verify pass "
                       "gives the same logits as one-token steps.",
    "bf16": "bfloat16: 16-bit floats with float32's range and fewer digits; fast where the CPU has native bf16 "
            "units (AMX, AVX512-BF16).",
    "AMX": "Intel's Advanced Matrix Extensions: matrix units in recent Xeons for bf16 and int8 products.",
    "AVX-512": "512-bit vector instructions; F: the base set, VNNI: int8 dot products, BF16: native bf16 dot "
               "products.",
    "AVX2": "256-bit vector instructions found on most x86 CPUs; no native bf16, so bf16 products are emulated.",
    "memory-bound": "Time set by reading the weights: a pass over several tokens costs about one step (v ≈ 1).",
    "compute-bound": "Time set by arithmetic, which grows with every token fed: a verify pass costs several steps "
                     "(v > 1).",
    "MLP speculator": "A learned draft head (Wertheimer et al. 2024): small stages that read the target's hidden "
                      "state and propose the next few tokens, no second model.",
}

# Symbols the views wrap wherever they print them in running text: unambiguous characters and words.
_HOVER = {"γ": "γ", "α": "α", "β": "β", "ε": "ε", "τ": "τ", "TV": "TV", "Thm 3.8": "Thm 3.8",
          "residual": "residual", "count-based": "count-based"}
_HOVER_RE = re.compile(r"Thm 3\.8|count-based|\bresidual\b|\bTV\b|[γαβετ]")


def definition(term: str) -> str:
    """The one-line definition of ``term`` ("" when the glossary has none)."""
    return GLOSSARY.get(term) or next((d for k, d in GLOSSARY.items() if term in k.split(" / ")), "")


def abbr(term: str, shown: str | None = None) -> str:
    """``shown`` (default ``term``) as escaped HTML with its definition on hover."""
    return f'<abbr class="sv-term" title="{esc(term + ": " + definition(term))}">{esc(shown or term)}</abbr>'


def glossed(text: str) -> str:
    """Plain ``text`` as escaped HTML, each γ, α, β, ε, τ, TV, Thm 3.8, residual and count-based in it wrapped
    with its definition on hover."""
    out, at = [], 0
    for m in _HOVER_RE.finditer(text):
        out.append(esc(text[at:m.start()]))
        out.append(abbr(_HOVER[m.group(0)]))
        at = m.end()
    out.append(esc(text[at:]))
    return "".join(out)


def term_title(text: str, extra: tuple[str, ...] = ()) -> str:
    """The definitions of the symbols in ``text`` (and of the terms in ``extra``), one a line, for a title
    attribute (plain text: escape it); "" when it names none."""
    terms = list(dict.fromkeys([_HOVER[m.group(0)] for m in _HOVER_RE.finditer(text)] + list(extra)))
    return "\n".join(f"{t}: {definition(t)}" for t in terms if definition(t))


def title_attr(text: str, extra: tuple[str, ...] = ()) -> str:
    """' title="…"' defining the symbols in ``text`` (see :func:`term_title`), one a line (the line breaks as
    &#10;, so the tag stays on one line), or "" when it names none."""
    tip = term_title(text, extra)
    return f' title="{esc(tip).replace(chr(10), "&#10;")}"' if tip else ""


def glossary_markdown() -> str:
    """The "How it works" tab's glossary: every term and its line."""
    rows = "\n".join(f"- **{term}** — {line}" for term, line in GLOSSARY.items())
    return ("\n### Glossary\nThe symbols and terms the page uses (hover one on the Live tab for its line).\n\n"
            + rows + "\n")


__all__ = ["GLOSSARY", "abbr", "definition", "glossary_markdown", "glossed", "term_title", "title_attr"]
