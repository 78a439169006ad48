"""The training card: what a speculator was trained on and how well it agrees with its target."""

from __future__ import annotations

import json
from pathlib import Path


def write_card(folder: Path, card: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "card.json").write_text(json.dumps(card, indent=1) + "\n")
    (folder / "card.md").write_text(markdown(card))


def markdown(card: dict) -> str:
    m, d, t, h = card["model"], card["data"], card["training"], card["heldout"]
    stages = range(len(h["top1"]))
    rows = "\n".join(f"| {i} | token t+{i + 2} | {h['top1'][i]:.3f} | {h['chain'][i]:.3f} |" for i in stages)
    curve = t["loss_curve"]
    # A handful of points is enough to show the curve's shape in a table; card.json has all of them.
    pick = sorted({0, len(curve) - 1, *range(0, len(curve), max(1, len(curve) // 8))}) if curve else []
    loss_rows = "\n".join(f"| {curve[i][0]} | {curve[i][1]:.3f} |" for i in pick)
    stop = " (stopped by the time budget)" if t["stopped_by_time_budget"] else ""
    load = card["machine"].get("load_average_at_end")
    load = f"; load average (1, 5, 15 min) at the end: {load}, on 2 cores shared with other work" if load else ""
    a = d.get("answers")
    answers = (f"- The target's own answers: {a['requests']} requests, {a['tokens']:,} answer tokens "
               f"({a['sampled_fraction']:.0%} sampled at temperature 0.8, the rest greedy); "
               f"{a['heldout_requests']} held-out requests.\n") if a and a.get("requests") else ""
    own = h.get("answers")
    own = ("\n\nOn the target's held-out answers alone (what a run of the app meets): top-1 per stage "
           + ", ".join(f"{x:.3f}" for x in own["top1"]) + "; all agree " + ", ".join(f"{x:.3f}" for x in own["chain"])
           + f"; expected accepted tokens per greedy round {own['expected_accepted_greedy']}.") if own else ""
    return f"""# MLP speculator for {card['target']}

A learned draft head (Wertheimer et al. 2024): {m['n_predict']} stages, inner width {m['inner']},
{m['params']:,} trained parameters; frozen from the target: {m['frozen_from_target']}.
Restricted vocabulary: {m['vocab']:,} tokens ({d['vocab_rule']}).

## Data

- {d['source']}
- {d['train_windows']} training windows and {d['heldout_windows']} held-out windows of {d['window_tokens']} tokens;
  {d['tokens_through_target']:,} tokens through the target; {d['chat_fraction']:.0%} wrapped in the chat template.
{answers}- Held out: {d['heldout_rule']}.
- Labels: the target's own next-token distribution (top {d['label_top_k']}, temperature 1), from the same
  forward pass that gives the hidden states (self-distillation).

## Training

{t['steps']} of {t['planned_steps']} steps{stop}, batch {t['batch']}: {t['examples_seen']:,} positions seen
({t['stage_predictions_seen']:,} stage predictions).

| step | training loss (soft cross-entropy, mean over stages) |
|---|---|
{loss_rows}

## Held-out agreement with the target (teacher-forced)

| stage | proposes | top-1 agreement | stages 0..i all agree |
|---|---|---|---|
{rows}

Expected accepted tokens per greedy round (sum of the last column): {h['expected_accepted_greedy']}.
Held-out loss: {h['loss']}.{own}

## Cost

{card['minutes']['target_pass']} min target pass + {card['minutes']['training']} min
training on {card['machine']['cpu']}, torch {card['machine']['torch']}, {card['machine']['threads']} thread(s){load}.
"""
