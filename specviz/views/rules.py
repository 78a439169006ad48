""""Same draft, three rules": what token-wise, block and exact-match verification would keep of one
round's drafted tokens, computed exactly from the round's recorded numbers (no resampling).

Each drafted token carries q(x), p(x) and block verification's h (trace version 3); with them
`specviz.core.rules` gives, per rule, P(at least i tokens kept) for every position i, and their sum,
the expected number of drafted tokens kept.
"""

from __future__ import annotations

from ..core.rules import RULE_LABELS, RULES, WHY_ORDER, DraftOdds, draft_odds, expected_kept, kept_if_block, kept_if_match
from ..core.rules import kept_if_token
from ..trace import Round, Trace
from ._fmt import esc, fnum, visible_ws

NAMES = {value: label for label, value in RULE_LABELS.items()}
BAR = "#2563eb"


def round_odds(rnd: Round) -> list[DraftOdds] | None:
    """The round's drafted tokens' numbers, or None when the recording does not keep them (before v3)."""
    return draft_odds(rnd.draft)


def _cell(prob: float) -> str:
    width = max(0.0, min(1.0, prob)) * 100
    return (f'<td class="sv-rule-cell" title="P(kept ≥ this position) = {prob:.4f}">'
            f'<div style="background:linear-gradient(90deg,{BAR}33 {width:.1f}%,transparent {width:.1f}%);'
            f'padding:2px 4px;border-radius:4px;font-variant-numeric:tabular-nums">{fnum(prob, 2)}</div></td>')


def rules_html(rnd: Round, spec: Trace) -> str:
    """The comparison for one chain round ("" for a round that drafted nothing, and for tree rounds)."""
    if rnd.tree is not None or not rnd.draft:
        return ""
    odds = round_odds(rnd)
    if odds is None:
        return ('<div class="sv-rules sv-muted" style="margin-top:10px">Same draft, three rules: this recording '
                'predates the numbers it needs (each drafted token\'s p(x) and block verification\'s h; '
                'recordings of version 3 keep them).</div>')
    eps = spec.settings.epsilon
    used = spec.settings.rule
    kept = {"token": kept_if_token(odds, eps), "block": kept_if_block(odds), "match": kept_if_match(odds)}
    expect = expected_kept(odds, eps)
    head = "".join(f"<th>≥{i}: {visible_ws(d.text)}</th>" for i, d in enumerate(rnd.draft, 1))
    rows = []
    for rule in RULES:
        mark = f'<br><b class="sv-rule-ran">this run: kept {rnd.n_accepted}</b>' if rule == used else ""
        short, _, cite = NAMES[rule].partition(" (")  # the citation on hover: the table fits a 400 px phone
        cite_attr = f' title="{esc(NAMES[rule])}"' if cite else ""
        rows.append(f'<tr><th style="text-align:left"{cite_attr}>{esc(short)}{mark}</th>'
                    + "".join(_cell(p) for p in kept[rule])
                    + f'<td style="font-weight:600;text-align:right">{expect[rule]:.2f}</td></tr>')
    greedy = (" Under greedy decoding every p and q is one-hot, so the three rules coincide: each keeps the "
              "prefix where the draft equals the target's argmax." if spec.settings.temperature == 0 else "")
    eps_note = f" (token-wise with ε = {eps:g})" if eps else ""
    return (f'<div class="sv-rules" style="margin-top:10px;overflow-x:auto">'
            f'<div style="font-weight:600;margin-bottom:4px">Same draft, three rules{eps_note}: the chance each '
            f'rule keeps at least i of these drafted tokens, and the expected number kept</div>'
            f'<table class="sv-rules-table" style="border-collapse:collapse;font-size:13px"><thead><tr><th></th>{head}'
            f'<th style="text-align:right">E[kept]</th></tr></thead><tbody>{"".join(rows)}</tbody></table>'
            f'<div class="sv-muted" style="font-size:12.5px;margin-top:4px">{esc(WHY_ORDER)}{esc(greedy)}</div></div>')


def run_rule_expectations(spec: Trace | None) -> dict | None:
    """Each rule's expected tokens per round on a run's own drafts: 1 + the mean over its chain rounds of
    the expected kept drafts (a round that drafted nothing counts 1 token).  None for a run without the
    numbers (tree runs, recordings before version 3, standard runs)."""
    if spec is None or spec.kind != "speculative" or not spec.rounds:
        return None
    per_round = []
    for rnd in spec.rounds:
        if rnd.tree is not None:
            return None
        if rnd.draft:
            odds = round_odds(rnd)
            if odds is None:
                return None
            per_round.append(expected_kept(odds, spec.settings.epsilon))
        else:
            per_round.append(dict.fromkeys(RULES, 0.0))
    n = len(per_round)
    return {"draft_len": sum(len(r.draft) for r in spec.rounds) / n, "rule": spec.settings.rule,
            "tokens": {rule: 1 + sum(e[rule] for e in per_round) / n for rule in RULES}}


def rule_name(spec: Trace) -> str:
    """The rule a run verified with, as the page names it ("the tree's rule" for tree runs)."""
    if spec.rounds and spec.rounds[0].tree is not None or spec.settings.drafter == "tree":
        return "the tree's multi-candidate rule"
    return f"{NAMES.get(spec.settings.rule, spec.settings.rule)} rule"
