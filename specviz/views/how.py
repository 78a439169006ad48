"""The "How it works" tab: the algorithm, what a verify pass costs on THIS machine (from the execution
probe's measured curve T(k)/T(1), never assumed from the CPU's instruction set), the draft heads, the
glossary and the references.  Markdown, built from plain data (a Probe or None)."""

from __future__ import annotations

from ..hardware.probe import Probe
from .glossary import glossary_markdown
from .machine import DEFAULT_GAMMA, verify_factor
from .machine_words import isa_words

# A k-token verify pass, in one-token steps: below the first bound "about one step" (memory-bound, as
# Thm 3.8 assumes), below the second partly compute-bound, above it compute-bound (the Challenges' bands).
BANDS = ((1.25, "memory-bound here: a verify pass costs about one step, as Thm 3.8 assumes"),
         (2.0, "partly compute-bound here: a verify pass costs more than the one step Thm 3.8 assumes, so "
               "speculation gains less than the textbook says"),
         (float("inf"), "compute-bound here: a verify pass costs several steps, and a long or poorly "
                        "accepted draft makes speculation lose"))

INTRO = """
### How speculative decoding works
A big **target** model normally produces one token per forward pass. Speculative decoding adds a small, fast **draft** model:

1. **Draft** — the draft model proposes γ tokens x<sub>1</sub>…x<sub>γ</sub>, one after another, each sampled from its distribution q.
2. **Verify** — the target scores the prompt plus all γ drafts in **one** forward pass, giving its distributions p<sub>1</sub>…p<sub>γ+1</sub>. Whether that pass costs about as much as producing one token depends on the machine and on how the target runs there, so the page measures it rather than assuming it. It does when the target is *memory-bound* (reading its weights dominates, as on a GPU at batch 1), and Leviathan et al.'s Thm 3.8 assumes so; when the arithmetic grows with every token fed (*compute-bound*), a pass over six tokens costs several one-token steps and speculation can lose. {machine} Each run's headline and metrics give its own verify pass's cost in standard steps (v), and Thm 3.8 with it beside the textbook value.
3. **Accept or reject** — draft i is accepted with probability b = min(1, (p(x) + ε) / q(x)): always when the target likes the token at least as much as the draft did. A uniform draw u decides; the first rejection ends the round.
4. **Correct or bonus** — at a rejection, a **correction** token is sampled from the residual norm(max(0, p − q)); if all γ were accepted, a **bonus** token is sampled from p<sub>γ+1</sub>. Every round emits at least one token.

The draft need not be a model: **prompt lookup** proposes what followed the last few tokens earlier in the text (free, and strong when the output copies from the prompt). And γ need not be fixed: a **draft-length policy** may stop drafting early — after a token the drafter is unsure of (confidence < τ), when one more token is not worth its cost (adaptive), or on transformers' schedule (heuristic). γ is then the maximum.

With ε = 0 the text has *exactly* the target's distribution (greedy: exactly the target's greedy text). ε > 0 (Yin et al.) accepts more drafts at the price of a measured bias; Decoding-UNO samples from p after a rejection instead of the residual, for comparison.

Notation: p = target, q = draft, as in Leviathan et al.; Chen et al. and Yin et al. swap the two letters.
"""

REFERENCES = """
**References.** Leviathan, Kalman, Matias, *Fast Inference from Transformers via Speculative Decoding* (ICML 2023) ·
Chen et al., *Accelerating Large Language Model Decoding with Speculative Sampling* (2023) ·
Yin et al., *A Theoretical Perspective for Speculative Decoding Algorithm* (NeurIPS 2024) ·
Sun et al., *Block Verification Accelerates Speculative Decoding* (ICLR 2025) ·
Wertheimer et al., *Accelerating Production LLMs with Combined Token/Embedding Speculators* (IBM, 2024).
"""

NOT_PROBED = ("**On this machine** the target's verify pass has not been timed yet: the execution probe runs the "
              "first time a real model pair loads with *Target execution* auto (press Run on the Live tab), and the "
              "This machine tab then draws its curve T(k)/T(1).")


def bound_words(factor: float) -> str:
    """What a verify factor means, in words (see :data:`BANDS`)."""
    return next(words for top, words in BANDS if factor < top)


def verify_sentence(probe: Probe | None) -> str:
    """This machine's verify cost in one or two sentences, from the probe's curve of the chosen execution at
    the page's default γ + 1 tokens: "On this machine (…) the probe timed the target (…, run as int8): a 6-token
    verify pass costs 2.10 one-token steps, T(6)/T(1), compute-bound here: …".  Without a measured curve, it
    says so (never a guess from the instruction set)."""
    if probe is None:
        return NOT_PROBED
    label = str(probe.machine.get("label") or probe.machine.get("name") or "this machine")
    units = isa_words(probe.machine)
    has = f"; its CPU has {units}" if units else ""
    if getattr(probe, "after_serving", False):
        return (f"**On this machine** ({label}{has}) the target is timed once the page is served, between runs; "
                "this sentence then gives its measured verify cost.")
    if not probe.measured:
        return (f"**On this machine** ({label}{has}) the probe could not time the target: the machine was busy "
                "when it loaded. Nothing is assumed from its instruction set; a quieter start measures it.")
    curve = probe.curves.get(probe.choice) or {}
    k = DEFAULT_GAMMA + 1  # the page's default draft length: the pass the intro and a default run talk of
    factor = verify_factor(curve, k)
    if factor is None:
        return (f"**On this machine** ({label}{has}) only the target's one-token step was timed, so its verify "
                "cost is not known here; each run's metrics measure it (v).")
    target = probe.model.removeprefix("offline:")
    text = (f"**On this machine** ({label}{has}) the probe timed the target ({target}, run as {probe.choice}): "
            f"a {k}-token verify pass costs **{factor:.2f}** one-token steps, T({k})/T(1), "
            f"{bound_words(factor)}.")
    if factor >= BANDS[0][0] and {"amx_bf16", "avx512_bf16"} & set(probe.machine.get("isa") or ()):
        text += (" Native bf16 units make each product fast, not free: the arithmetic still grows with the "
                 "tokens fed.")
    return text + " The This machine tab draws the curve."


def how_it_works(probe: Probe | None = None, heads: str | None = None) -> str:
    """The tab's markdown.  ``probe``: this machine's probe of the page's target (None: not probed yet);
    ``heads``: the draft heads' section (default: :func:`specviz.views.heads.section`)."""
    if heads is None:
        from .heads import section

        heads = section()
    return INTRO.format(machine=verify_sentence(probe)) + heads + glossary_markdown() + REFERENCES


__all__ = ["BANDS", "bound_words", "how_it_works", "verify_sentence"]
