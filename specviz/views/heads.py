"""The "How it works" section on draft heads: the paper's figures beside what this CPU measured,
read from the shipped training card and the recorded shoot-out (never typed into the prose)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CARDS = Path(__file__).resolve().parent.parent.parent / "assets" / "speculator"


def read_card(folder: Path = CARDS) -> dict[str, Any] | None:
    """The training card of the shipped speculator (the default pair's), or None."""
    for path in sorted(folder.glob("*/card.json")):
        try:
            card = json.loads(path.read_text(encoding="utf-8"))
            card["heldout"]["top1"], card["model"]["n_predict"]  # the fields this section reads
            return card
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def _pct(xs: list[float]) -> str:
    return " / ".join(f"{x:.0%}" for x in xs)


def draft_heads_markdown(card: dict[str, Any] | None, rec: Any = None) -> str:
    """Markdown: what a draft head is (Wertheimer et al. 2024), then this machine's numbers."""
    out = ["""
### Draft heads: a learned drafter (MLP speculator)
Instead of a second model, a **draft head** reads the target's own last hidden state and proposes the next few
tokens. IBM's MLP speculator (Wertheimer et al. 2024) is a chain of small **stages**: stage *i* mixes a state (at
stage 0, the target's hidden state) with the embedding of the token proposed before it, normalises it, applies a
GELU and scores the vocabulary, proposing token *t + 2 + i*. A stage is a few matrix products, not a
transformer pass, and the hidden state it starts from comes free with the verify pass. Trained on the target's own
outputs, the paper reports **2–3×** wall-clock speedups over highly optimised production models (Llama-2 7B/13B,
Code Llama 13B, Granite 20B in production), a gain that shrinks as batch size and prompt length grow. The acceptance rule
is unchanged, so the output is exact. Hover a token of a learned-head round to see which stage proposed it.
"""]
    if card:
        h, m, t = card["heldout"], card["model"], card.get("training", {})
        # The target's own held-out answers, where the card has them: the text a run of the app meets.
        own = h.get("answers") if isinstance(h.get("answers"), dict) and h["answers"].get("top1") else None
        where = "the target's own held-out answers" if own else "held-out text"
        h = own or h
        chain = h.get("chain") or []
        out.append(
            f"**Here**, the shipped head for {card.get('target', 'the default target')} has {m['n_predict']} stages and "
            f"{m.get('params', 0):,} trained parameters, trained on {card.get('machine', {}).get('cpu', 'a CPU')} in "
            f"{card.get('minutes', {}).get('training', '?')} min ({t.get('steps', '?')} steps). On {where} "
            f"its stages agree with the target's top token {_pct(h['top1'])} of the time (stage 0, 1, …)"
            + (f"; all stages up to each one agree {_pct(chain)}" if chain else "")
            + f", about {h.get('expected_accepted_greedy', '?')} accepted tokens per greedy round. "
              "The training card (`assets/speculator/*/card.md`) has the rest.")
    rows = {r.key: r for r in getattr(rec, "shootout", [])} if rec is not None else {}
    head, model = rows.get("speculator"), rows.get("model")
    if head is not None and not head.error and head.speedup is not None:
        load = f", load average {rec.load_average[0]:g}" if rec.load_average else ""
        line = (f"In the recorded shoot-out ({rec.when()}{load}) the learned head ran at "
                f"**{head.speedup:.2f}×** standard decoding with α = {head.alpha or 0:.2f} and c = {head.c or 0:.3f}")
        why = ""
        if model is not None and not model.error and model.speedup is not None:
            line += (f"; the draft model reached {model.speedup:.2f}× with α = {model.alpha or 0:.2f} and "
                     f"c = {model.c or 0:.3f}")
            cheaper = (head.c or 0) < (model.c or 0)
            worse = (head.alpha or 0) < (model.alpha or 0)
            if cheaper and worse:
                why = " The head costs less per draft token than the draft model but guesses worse"
            elif cheaper:
                why = " The head costs less per draft token than the draft model and guesses as well or better"
            elif worse:
                why = " Here the head costs more per draft token than the draft model and guesses worse"
            why += (", and it drafts at most " + str(card["model"]["n_predict"] if card else 4)
                    + " tokens per round." if why else "")
        out.append(line + "." + why)
    elif card:
        out.append("Run the drafter shoot-out (Sweeps tab) to measure it on this machine.")
    return "\n\n".join(out) + "\n"


def section() -> str:
    """The section as the page shows it: the shipped card and the shipped recording, where they load."""
    from ..experiments import recorded

    try:
        rec = recorded.load()
    except recorded.RecordedError:
        rec = None
    return draft_heads_markdown(read_card(), rec)
