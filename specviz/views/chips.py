"""Rounds as rows of token chips: the live animation panel and the legend.

Chip markup (classes are styled in ``assets/style.css``)::

    <span class="sv-chip sv-accepted" data-status="accepted" tabindex="0">
      <span class="sv-tok">·foo</span>
      <span class="sv-tip" role="tooltip">…q, p, b, u, verdict…</span>
    </span>

``data-status`` is one of accepted, rejected, discarded, correction, bonus,
target, pending (and ``slot`` for a not-yet-drafted position of a pending
round).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specviz.core.settings import stop_sentence, stop_short

from ._fmt import (
    RESIDUAL_OF,
    MEANINGS,
    epsilon_of,
    drafter_name,
    esc,
    fsec,
    fsig,
    fsig_pair,
    pending_meaning,
    plain_ratio,
    plural,
    policy_text,
    rule_text,
    run_text,
    thanks_to_epsilon,
    tok_repr,
    visible_ws,
)
from .execution import trace_exec_line
from .glossary import glossed
from .narrate import tree_stop_sentence
from .race_words import cut_line

if TYPE_CHECKING:  # plain data only; no runtime dependency beyond the dataclasses
    from specviz.trace import DraftToken, Extra, Position, Round, Trace


# ---- tooltips --------------------------------------------------------------------


def tip_html(title: str, rows: list[tuple[str, str]], verdict: str = "", note: str = "") -> str:
    """Tooltip body. ``title``/``verdict``/``note`` are plain text; ``rows`` are (label, value) plain text."""
    grid = "".join(f'<span class="sv-tip-k">{esc(k)}</span><span class="sv-tip-v">{esc(v)}</span>' for k, v in rows)
    parts = [f'<span class="sv-tip-h">{esc(title)}</span>']
    if grid:
        parts.append(f'<span class="sv-tip-grid">{grid}</span>')
    if verdict:
        parts.append(f'<span class="sv-tip-verdict">{esc(verdict)}</span>')
    if note:
        parts.append(f'<span class="sv-tip-note">{esc(note)}</span>')
    return f'<span class="sv-tip" role="tooltip">{"".join(parts)}</span>'


def verdict_text(pos: Position, rule: str = "token") -> str:
    """'u=0.41 < b=0.83 → accepted' / 'u=0.74 ≥ b=0.31 → rejected' (plain text).  Under block verification
    the recorded number is h, and the verdict names it: 'u=0.16 < h=0.88 → kept'; block verification can
    also keep a position whose own u ≥ h (a later one passed): 'u=0.74 ≥ h=0.31 → kept (…)'."""
    su, sb = fsig_pair(pos.u, pos.b)
    name = "h" if rule == "block" else "b"
    if pos.accepted and pos.u >= pos.b:
        return f"u={su} ≥ h={sb} → kept: a later position passed (block verification)"
    if pos.accepted:
        return f"u={su} < {name}={sb} → {'kept' if rule == 'block' else 'accepted'}"
    return f"u={su} ≥ {name}={sb} → rejected"


def _b_label(eps: float, rule: str = "token") -> str:
    if rule == "block":
        return "h (block verification)"
    if rule == "match":
        return "b = p(x) (exact match)"
    return f"b = min(1, (p+ε)/q), ε={eps:g}" if eps > 0 else "b = min(1, p/q)"


def chip_html(status: str, text: str, tip: str, extra_cls: str = "") -> str:
    cls = f"sv-chip sv-{status}" + (f" {extra_cls}" if extra_cls else "")
    return (
        f'<span class="{cls}" data-status="{status}" tabindex="0">'
        f'<span class="sv-tok">{visible_ws(text)}</span>{tip}</span>'
    )


def _stage(drafter: str, i: int) -> str:
    """Who proposed draft token i (1-based): the learned head's stage is the token's place in the
    round (stage 0 proposes the first token), as in the training card's per-stage table."""
    return f"stage {i - 1} of the learned head" if drafter == "speculator" else ""


def _draft_chip(rnd: Round, i: int, tok: DraftToken, eps: float, pending: bool, drafter: str = "",
                rule: str = "token") -> str:
    head = f"Draft token {i} · {tok_repr(tok.text)}"
    stage = _stage(drafter, i)
    who = [("proposed by", stage)] if stage else []
    if pending:
        by = ("Proposed by prompt lookup (copied from earlier text)"
              if drafter == "prompt-lookup" or _hybrid_copied(rnd, drafter)
              else f"Proposed by {stage}, from the target's last hidden state" if drafter == "speculator"
              else "Drafted by the small model")
        tip = tip_html(
            f"{head} · pending",
            [("id", str(tok.id)), *who, ("q(x) draft", fsig(tok.q))],
            note=f"{by}; the target has not checked it yet.",
        )
        return chip_html("pending", tok.text, tip)
    status = rnd.status(i)
    if status == "discarded":
        tip = tip_html(
            f"{head} · discarded",
            [("id", str(tok.id)), *who, ("q(x) draft", fsig(tok.q))],
            note="Drafted after the rejection, so it was never verified and is thrown away.",
        )
        return chip_html("discarded", tok.text, tip)
    pos = rnd.positions[i - 1]
    rows = [
        ("id", str(tok.id)),
        *who,
        ("q(x) draft", fsig(pos.q)),
        ("p(x) target", fsig(pos.p)),
        *([("min(1, p/q)", fsig(plain_ratio(pos.p, pos.q)))] if rule == "block" else []),  # not h
        (_b_label(eps, rule), fsig(pos.b)),
        ("u (uniform draw)", fsig(pos.u)),
    ]
    note = ""
    extra_cls = ""
    if thanks_to_epsilon(pos.p, pos.q, pos.u, pos.accepted, eps):
        note = f"Accepted thanks to ε: without it b would be min(1, p/q) = {fsig(plain_ratio(pos.p, pos.q))} ≤ u."
        extra_cls = "sv-eps"
    elif status == "rejected":
        note = "First rejection: the drafts after it are discarded and a correction is sampled."
    return chip_html(status, tok.text, tip_html(f"{head} · {status}", rows, verdict_text(pos, rule), note), extra_cls)


def _extra_chip(rnd: Round, extra: Extra, rule: str = "token") -> str:
    k = len(rnd.draft) + 1
    if extra.kind == "correction":
        j = rnd.rejected_at or len(rnd.positions) or 1
        title = f"Correction · {tok_repr(extra.text)}"
        note = f"The target rejected draft {j}, so this token was sampled from {RESIDUAL_OF.get(rule, RESIDUAL_OF['token'])} at position {j}."
    elif extra.kind == "bonus":
        title = f"Bonus · {tok_repr(extra.text)}"
        note = f"All {len(rnd.draft)} drafts accepted: the verify pass already gave p at position {k}, so this token is free."
    else:
        title = f"Target token · {tok_repr(extra.text)}"
        note = "Standard decoding: one target forward pass, one token sampled from p."
    tip = tip_html(title, [("id", str(extra.id)), ("p(x)", fsig(extra.p))], note=note)
    kind = extra.kind if extra.kind in ("correction", "bonus", "target") else "target"
    return chip_html(kind, extra.text, tip)


def _slot_chip() -> str:
    return '<span class="sv-chip sv-slot" data-status="slot" aria-hidden="true"><span class="sv-tok">\u00a0</span></span>'


# ---- one round -------------------------------------------------------------------


def _hybrid_copied(rnd: Round, drafter: str) -> bool:
    """Whether the hybrid drafter (draft model + prompt lookup) copied this round's drafts: no draft pass ran."""
    return drafter == "hybrid" and bool(rnd.draft) and rnd.draft_forwards == 0


def _draft_stop_html(rnd: Round, drafter: str = "") -> str:
    """How many tokens were drafted (or, in the hybrid's lookup rounds, copied) and why drafting stopped (full
    reason on hover)."""
    stop = rnd.draft_stop
    if not stop and not rnd.draft:  # standard decoding, or an old recording's plain round
        return ""
    k = len(rnd.draft)
    short = stop_short(stop)
    verb = "copied" if _hybrid_copied(rnd, drafter) else "drafted"
    label = short if stop == "none" else (f"{k} {verb} · {short}" if short else f"{k} {verb}")
    why = stop_sentence(stop)
    if rnd.tree is not None and rnd.tree.nodes:  # a tree round: its size, not the accepted path's length
        label = f"{len(rnd.tree.nodes)}-node tree" + (f" · {short}" if short else "")
        why = tree_stop_sentence(stop)
    title = f' title="{esc("drafting stopped: " + why)}"' if why else ""
    return f'<span class="sv-draft-stop" data-stop="{esc(stop)}" data-drafted="{k}"{title}>{esc(label)}</span>'


def round_html(
    rnd: Round, gamma: int, pending: bool = False, *, epsilon: float = 0.0, current: bool = False,
    policy: str = "constant", drafter: str = "", rule: str = "token",
) -> str:
    """One round as a row of chips (``rule``: the verification rule, for the tooltips' wording).

    Drafted tokens are coloured accepted / rejected / discarded (or pending while
    the target has not verified them), followed by the correction, bonus or
    (standard decoding) target token.  ``epsilon`` only changes the tooltip
    wording (b = min(1, (p+ε)/q)); ``current`` highlights the row (step mode).
    ``policy``: with the constant policy a pending round shows γ slots to fill;
    a dynamic policy decides when to stop, so γ is only the maximum and no
    empty slots are drawn.  ``drafter`` (the run's drafter name) adds who proposed each draft
    token to its tooltip where that differs by position (the learned head's stages).
    """
    gamma = max(int(gamma or 0), 0)
    fixed = policy == "constant"
    chips: list[str] = []
    for i, tok in enumerate(rnd.draft, start=1):
        chips.append(_draft_chip(rnd, i, tok, epsilon, pending, drafter, rule))
    if pending and fixed:
        for _ in range(max(gamma - len(rnd.draft), 0)):
            chips.append(_slot_chip())
    extra_html = ""
    if rnd.extra is not None and not pending:
        arrow = '<span class="sv-arrow" aria-hidden="true">→</span>' if rnd.draft else ""
        extra_html = f'<span class="sv-extra">{arrow}{_extra_chip(rnd, rnd.extra, rule)}</span>'

    n = len(rnd.emitted)
    if pending:
        if gamma and len(rnd.draft) < gamma:
            state = f"drafting {len(rnd.draft)}/{gamma}…" if fixed else f"drafted {len(rnd.draft)} (≤ {gamma})…"
        else:
            state = "verifying…"
        gain = f'<span class="sv-gain sv-gain-pending">{esc(state)}</span>'
    else:
        gain = f'<span class="sv-gain">+{esc(plural(n, "token"))}</span>' + _draft_stop_html(rnd, drafter)
        if rnd.extra is None and rnd.draft and not pending:
            gain += '<span class="sv-round-note">stopped: no extra token</span>'

    # compact timing under the round number: "draft + verify" (the panel header says so)
    if pending:
        time_text = f"{fsec(rnd.t_draft)} …" if rnd.t_draft else ""
        time_tip = "drafting time so far"
    elif rnd.draft:
        time_text = f"{fsec(rnd.t_draft)} + {fsec(rnd.t_verify)}"
        time_tip = f"draft {fsec(rnd.t_draft)} ({plural(rnd.draft_forwards, 'forward pass', 'forward passes')}) + verify {fsec(rnd.t_verify)}"
    else:
        time_text = fsec(rnd.t_verify)
        time_tip = "target forward pass"
    time_html = f'<span class="sv-round-time" title="{esc(time_tip)}">{esc(time_text)}</span>' if time_text else ""

    cls = "sv-round"
    if pending:
        cls += " sv-round--pending"
    if current:
        cls += " sv-round--current"
    if not rnd.draft:
        cls += " sv-round--standard"
    return (
        f'<div class="{cls}" data-round="{rnd.index + 1}">'
        f'<div class="sv-round-head"><span class="sv-round-num">Round {rnd.index + 1}</span>{time_html}</div>'
        f'<div class="sv-chips">{"".join(chips)}{extra_html}</div>'
        f'<div class="sv-round-tail">{gain}</div>'
        "</div>"
    )


# ---- the live panel --------------------------------------------------------------


def rounds_html(
    trace: Trace | None,
    upto: int | None = None,
    pending_round: Round | None = None,
    max_rounds_shown: int = 40,
    *,
    newest_first: bool = False,
) -> str:
    """The live animation panel: the latest rounds in reading order, oldest first, then the pending round.

    ``upto``: show only the first ``upto`` rounds (step mode / replay); the last
    of them is highlighted as the current round.  Long runs show the last
    ``max_rounds_shown`` rounds and a "… k earlier rounds" line.  The rows sit in a
    scroller (``.sv-rounds-body``) that the style sheet keeps scrolled to its end, so
    the newest round is in view as rounds arrive.  ``newest_first`` puts the newest on top.
    """
    if trace is None:
        return '<div class="sv-rounds sv-empty">No run yet: press <b>Run</b> to watch the rounds.</div>'
    rounds = trace.rounds if upto is None else trace.rounds[: max(int(upto), 0)]
    gamma = trace.gamma
    eps = epsilon_of(trace.settings)
    max_rounds_shown = max(int(max_rounds_shown), 1)
    shown = rounds[-max_rounds_shown:]
    hidden = len(rounds) - len(shown)

    policy = getattr(trace.settings, "policy", "constant")
    drafter = getattr(trace.settings, "drafter", "")
    rule = getattr(trace.settings, "rule", "token")
    rows = [
        round_html(r, gamma, epsilon=eps, policy=policy, drafter=drafter, rule=rule,
                   current=(upto is not None and k == len(shown) - 1 and pending_round is None))
        for k, r in enumerate(shown)
    ]
    if pending_round is not None:
        rows.append(round_html(pending_round, gamma, pending=True, epsilon=eps, current=True, policy=policy,
                               drafter=drafter, rule=rule))
    if newest_first:
        rows.reverse()
    if not rows:
        return f'<div class="sv-rounds sv-empty">{esc(cut_line(trace) or "Waiting for the first round…")}</div>'
    more = (
        f'<div class="sv-more">… {plural(hidden, "earlier round")} not shown</div>' if hidden > 0 else ""
    )
    kind = "Standard decoding" if trace.kind == "standard" else \
        f"Speculative · {run_text(trace, short=True)} · {rule_text(trace, short=True)}"
    if eps > 0 and trace.kind != "standard":
        kind += f" · ε = {eps:g}"
    kind += " · times: target pass" if trace.kind == "standard" else " · times: draft + verify"
    if (cut := cut_line(trace) if upto is None and pending_round is None else ""):  # the rounds end at a stop
        line = f'<div class="sv-rounds-stop" data-stop="{esc(trace.stop_reason)}">{esc(cut)}</div>'
        rows = [line, *rows] if newest_first else [*rows, line]
    total = len(rounds) + (1 if pending_round is not None else 0)
    head = (
        f'<div class="sv-rounds-head"><span>{esc(kind)}</span>'
        f'<span>{esc(plural(total, "round"))} · {esc(plural(sum(len(r.emitted) for r in rounds), "token"))}</span></div>'
    )
    body = (more + "".join(rows)) if not newest_first else ("".join(rows) + more)
    order = "newest-first" if newest_first else "oldest-first"
    return (f'<div class="sv-rounds" data-order="{order}">{head}'
            f'<div class="sv-rounds-body"><div class="sv-rounds-list">{body}</div></div></div>')


# ---- legend ------------------------------------------------------------------------


# How the race's text marks where each token came from, by colour and by a second cue (the underline):
# the spans are styled in assets/style.css (.sv-tk.sv-<origin>).
TEXT_KEY = (
    '<p class="sv-legend-textkey">In the race\'s text: '
    '<span class="sv-tk sv-accepted">tinted green</span> = an accepted draft · '
    '<span class="sv-tk sv-correction">wavy underline</span> = a correction · '
    '<span class="sv-tk sv-bonus">double underline</span> = a bonus · '
    '<span class="sv-tk sv-target">plain</span> = standard decoding\'s own tokens.</p>'
)


# What accepted / rejected / correction mean under the rule that ran (MEANINGS: the token-wise rule's).
RULE_MEANINGS: dict[str, dict[str, str]] = {
    "block": {
        "accepted": "kept by block verification: u < h here, or at a later position of the round",
        "rejected": "the first draft token block verification did not keep (u ≥ h here and at every later position)",
        "correction": f"sampled by the target from {RESIDUAL_OF['block']} in place of the rejected token",
    },
    "match": {
        "accepted": "kept by exact match: u < b = p(x), the target's own sample would have been this token",
        "rejected": "the first draft token exact match turned down (u ≥ b = p(x))",
        "correction": f"sampled by the target from {RESIDUAL_OF['match']}",
    },
}


def _meaning(status: str, rule: str = "token") -> str:
    return RULE_MEANINGS.get(rule, {}).get(status, MEANINGS[status])


def legend_html(trace: Trace | None = None, *, include_target: bool = True, include_pending: bool = True) -> str:
    """The colour legend: a sample chip and a one-line meaning per status.

    With a speculative ``trace`` it starts with what ran (drafter, draft-length policy and
    verification rule; the meanings follow the rule), and a run with ε > 0 adds the double-bordered "accepted thanks to ε" chip.
    """
    order = ["accepted", "rejected", "discarded", "correction", "bonus"]
    if include_pending:
        order.append("pending")
    if include_target:
        order.append("target")
    rule = getattr(trace.settings, "rule", "token") if trace is not None and trace.kind == "speculative" else "token"
    if trace is not None and getattr(trace.settings, "drafter", "") == "tree":
        rule = "token"  # the tree's rule accepts with u < b = min(1, r/q), like the token-wise one
    items, chips = [], []
    for status in order:
        meaning = pending_meaning(trace) if status == "pending" else _meaning(status, rule)  # who drafted
        items.append(
            f'<div class="sv-legend-item" data-status="{status}">'
            f'<span class="sv-chip sv-{status} sv-chip--mini"><span class="sv-tok">{esc(status)}</span></span>'
            f'<span class="sv-legend-text">{glossed(meaning)}</span></div>'
        )
        chips.append(f'<span class="sv-chip sv-{status} sv-chip--mini" title="{esc(meaning)}">'
                     f'<span class="sv-tok">{esc(status)}</span></span>')
    if trace is not None and trace.kind == "speculative" and epsilon_of(trace.settings) > 0:
        items.append(
            '<div class="sv-legend-item" data-status="epsilon">'
            '<span class="sv-chip sv-accepted sv-eps sv-chip--mini"><span class="sv-tok">ε-accepted</span></span>'
            f'<span class="sv-legend-text">{glossed("accepted only thanks to the ε slack: u ≥ p/q but u < b = min(1, (p+ε)/q)")}</span></div>'
        )
    run = ""
    if trace is not None and trace.kind == "speculative":
        execution = trace_exec_line(trace)
        run = (
            '<div class="sv-legend-run" data-drafter="{d}" data-policy="{p}">'
            '<span class="sv-legend-k">This run</span> drafter: <b>{dn}</b> · {pt} · {rt}{ex}</div>'
        ).format(d=esc(trace.settings.drafter), p=esc(trace.settings.policy), dn=esc(drafter_name(trace)),
                 pt=glossed(policy_text(trace.settings)), rt=esc(rule_text(trace)),
                 ex=f' · <span class="sv-legend-exec">{esc(execution)}</span>' if execution else "")
    # One row of chips; what each means opens on request (the full legend pushed Run below the first view).
    key = (f'<details class="sv-legend-key"><summary><span class="sv-legend-chips">{"".join(chips)}</span>'
           '<span class="sv-legend-open">what the colours mean</span></summary>'
           f'<div class="sv-legend-items">{"".join(items)}</div>{TEXT_KEY}</details>')
    return f'<div class="sv-legend">{run}{key}</div>'
