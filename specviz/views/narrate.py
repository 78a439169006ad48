"""One-line plain-language narration of a round, for step mode.

:func:`narrate` returns PLAIN TEXT (token text included verbatim, quoted):
escape it before putting it in HTML, or use :func:`narrate_html`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specviz.core.settings import stop_sentence

from ._fmt import (
    RESIDUAL_OF,
    drafter_name,
    epsilon_of,
    esc,
    fnum,
    fpair,
    fsec,
    plain_ratio,
    plural,
    run_text,
    thanks_to_epsilon,
    tok_repr,
)

from .glossary import glossed

if TYPE_CHECKING:
    from specviz.trace import Round, Trace

_MAX_RATIOS = 8


def _is_last(trace: Trace | None, rnd: Round) -> bool:
    return trace is not None and bool(trace.rounds) and trace.rounds[-1].index == rnd.index


def _stop_phrase(trace: Trace | None, rnd: Round) -> str:
    reason = trace.stop_reason if _is_last(trace, rnd) else None
    if reason == "eos":
        return "the run ended at an end-of-text token, so no extra token was sampled"
    if reason == "max_new_tokens":
        return "the token limit was reached, so no extra token was sampled"
    if reason == "stopped":
        return "the run was stopped, so no extra token was sampled"
    if reason == "time_limit":
        return "the job's time limit was reached, so the run ended here"
    if reason == "error":
        return "the run stopped with an error"
    return "no extra token was sampled"


def _ratios(rnd: Round, upto: int, eps: float, rule: str = "token") -> str:
    """The kept positions' numbers, named for what they are: the acceptance probabilities
    b = min(1, p/q) (capped at 1: a p/q of 1.53 shows as 1.00), the block rule's h beside min(1, p/q)
    (h is not p/q) with the rule that kept them, "b = p" under exact match, "b =" with ε."""
    kept = rnd.positions[:upto]
    if not kept:
        return ""

    def shown(vals: list[float]) -> str:
        return ", ".join(fnum(v, 2) for v in vals[:_MAX_RATIOS]) + (", …" if len(vals) > _MAX_RATIOS else "")

    capped = shown([plain_ratio(pos.p, pos.q) for pos in kept])
    if rule == "block":
        return f" (min(1, p/q) {capped}; block verification's h {shown([pos.b for pos in kept])}{_block_why(kept)})"
    if rule == "match":
        return f" (b = p: {shown([pos.b for pos in kept])})"
    if eps > 0:
        return f" (acceptance probabilities b = min(1, (p+ε)/q): {shown([pos.b for pos in kept])})"
    return f" (acceptance probabilities b = min(1, p/q): {capped})"


def _block_why(kept: list) -> str:
    """Why block verification kept a token whose own u ≥ h: the rule keeps every token up to the LAST
    position whose u < h.  "" when every kept token passed on its own."""
    passed = [pos for pos in kept if pos.u < pos.b]
    early = [pos for pos in kept if pos.u >= pos.b]
    if not early or not passed:
        return ""
    last = passed[-1]
    before = [pos for pos in early if pos.i < last.i]
    if not before:
        return ""
    which = ", ".join(str(pos.i) for pos in before)
    pos = before[0]
    su, sh = fpair(pos.u, pos.b)
    return (f"; block verification keeps every token up to the last position whose u < h, here token {last.i}, "
            f"so token{'s' if len(before) > 1 else ''} {which} {'were' if len(before) > 1 else 'was'} kept "
            f"although {'e.g. ' if len(before) > 1 else ''}token {pos.i} had u={su} ≥ h={sh}")


def _why_drafting_stopped(rnd: Round, trace: Trace | None) -> str:
    """"the draft's confidence fell below τ = 0.4", or "" (old recordings have no reason)."""
    why = stop_sentence(rnd.draft_stop)
    settings = trace.settings if trace is not None else None
    if settings is not None and why.endswith("γ"):
        why += f" = {settings.gamma}"
    elif settings is not None and why.endswith("τ"):
        why += f" = {settings.tau:g}"
    return why


def tree_stop_sentence(stop: str, settings=None, nodes: int | None = None, depth: int | None = None) -> str:
    """Why a tree stopped growing, in a tree's terms: "the tree reached its node budget of 16 nodes",
    "the tree reached its depth γ = 5", "the tree grew to the depth γ = 5, then kept its best 16 nodes,
    the node budget"; "" when unknown.  ``nodes`` / ``depth``: the final tree's size and depth."""
    budget = getattr(settings, "tree_nodes", None)
    gamma = getattr(settings, "gamma", None)
    if stop == "nodes":
        return "the tree reached its node budget" + (f" of {budget} nodes" if budget else "")
    if stop == "limit":
        at = f"depth γ = {gamma}" if gamma else "depth γ"
        full = bool(budget and nodes is not None and nodes >= budget)
        if full and gamma and depth is not None and depth < gamma:  # grown to γ, then cut to the budget
            return f"the tree grew to the {at}, then kept its best {budget} nodes, the node budget"
        return f"the tree reached its {at}" + (f" and its node budget of {budget} nodes" if full else "")
    why = stop_sentence(stop)
    if settings is not None and why.endswith("τ"):
        why += f" = {settings.tau:g}"
    return why


def _narrate_tree(rnd: Round, trace: Trace | None) -> str:
    """A tree round: the tree drafted (nodes, depth, why it stopped), the path the target accepted
    through it, and the correction or bonus at its end."""
    tree = rnd.tree
    n = rnd.index + 1
    settings = trace.settings if trace is not None else None
    nodes = len(tree.nodes)
    depth = max((x.depth for x in tree.nodes), default=0)
    grew = (f"the draft model grew a token tree of {plural(nodes, 'node')}, {plural(depth, 'level')} deep, "
            f"in {fsec(rnd.t_draft)}")
    if not tree.visits and rnd.extra is None and not rnd.emitted:  # drafted, not verified yet
        return f"Round {n}: {grew} so far; the target has not checked it yet."
    why = tree_stop_sentence(rnd.draft_stop, settings, nodes, depth)
    if why:
        grew += f" (drafting stopped: {why})"
    passes = "one pass" if rnd.target_forwards == 1 else plural(rnd.target_forwards, "pass", "passes")
    parts = [f"Round {n}: {grew}; the target checked the whole tree in {passes} ({fsec(rnd.t_verify)})"]
    path = [tree.nodes[i].text for i in tree.path if 0 <= i < nodes]  # indices into nodes (checked on load)
    if path:
        shown = ", ".join(tok_repr(t) for t in path[:_MAX_RATIOS]) + (", …" if len(path) > _MAX_RATIOS else "")
        parts[-1] += f" and accepted a path of {plural(len(path), 'token')} through it ({shown})"
    else:
        parts[-1] += " and accepted none of its nodes"
    last = tree.visits[-1] if tree.visits else None
    tried = len(last.tries) if last is not None else 0
    extra = rnd.extra
    if extra is not None and extra.kind == "correction":
        which = "the only child tried" if tried == 1 else f"all {tried} children tried"
        parts.append(f"{which} after {'the prefix' if not path else tok_repr(path[-1])} "
                     f"{'was' if tried == 1 else 'were'} rejected, so a correction {tok_repr(extra.text)} "
                     "was sampled from the residual r")
    elif extra is not None and extra.kind == "bonus":
        parts.append(f"the path reached a leaf, so the same pass gave a free bonus token {tok_repr(extra.text)} from p")
    elif extra is None:
        parts.append(_stop_phrase(trace, rnd))
    expected = len(path) + (1 if extra is not None else 0)
    if len(rnd.emitted) < expected:
        parts.append(f"only {len(rnd.emitted)} reached the output (generation stopped inside this round)")
    return "; ".join(parts) + f". +{plural(len(rnd.emitted), 'token')}."


def narrate(rnd: Round, trace: Trace | None) -> str:
    """A one-line, plain-language account of what happened in ``rnd``.

    E.g. "Round 4: the draft proposed 5 tokens in 0.21 s; the target checked
    them in one pass (0.27 s) and accepted the first 3 (acceptance probabilities
    b = min(1, p/q): 1.00, 0.92, 0.85); token 4 ' foo' was rejected (u=0.74 ≥ b=0.31), so a correction
    ' bar' was sampled from the residual norm(max(0, p − q)); 1 later draft was
    discarded. +4 tokens."
    """
    text = _narrate(rnd, trace)
    if rnd.extra is not None and _is_last(trace, rnd) and trace.stop_reason == "time_limit":
        text += " The job's time limit was reached, so the run ended after this round."
    return text


def _narrate(rnd: Round, trace: Trace | None) -> str:
    if rnd.tree is not None and rnd.tree.nodes:
        return _narrate_tree(rnd, trace)
    n = rnd.index + 1
    emitted = len(rnd.emitted)
    gain = f"+{plural(emitted, 'token')}."
    eps = epsilon_of(trace.settings if trace is not None else None)
    gamma = trace.gamma if trace is not None else len(rnd.draft)
    k = len(rnd.draft)
    speculative = trace is not None and trace.kind == "speculative"
    who = drafter_name(trace, subject=True) if trace is not None else "the draft"
    stopped = _why_drafting_stopped(rnd, trace)

    # standard decoding (or a speculative round that drafted nothing)
    if k == 0:
        passes = "one forward pass" if rnd.target_forwards == 1 else plural(rnd.target_forwards, "forward pass", "forward passes")
        lead = f"Round {n}: "
        if speculative:  # say why nothing was drafted: it is a plain target step
            lead += f"{who} proposed nothing ({stopped or 'no draft'}), so "
        if rnd.extra is not None:
            return (
                f"{lead}the target ran {passes} ({fsec(rnd.t_verify)}) and sampled "
                f"{tok_repr(rnd.extra.text)} from p (p={fnum(rnd.extra.p, 2)}). {gain}"
            )
        return f"{lead}the target ran {passes} ({fsec(rnd.t_verify)}); {_stop_phrase(trace, rnd)}. {gain}"

    drafted = f"{who} proposed {plural(k, 'token')} in {fsec(rnd.t_draft)}"
    # pending: drafted but not verified yet
    if not rnd.positions and rnd.extra is None and not rnd.emitted:
        policy = getattr(trace.settings, "policy", "constant") if trace is not None else "constant"
        if gamma and k < gamma and policy != "constant":
            return (f"Round {n}: {who} has proposed {k} so far (at most {gamma}; the {policy} policy decides "
                    "when to stop); the target has not checked them yet.")
        if gamma and k < gamma:
            return f"Round {n}: {who} has proposed {k} of {gamma} tokens so far; the target has not checked them yet."
        return f"Round {n}: {drafted}; waiting for the target to check them in one pass."
    if stopped:
        drafted += f" (drafting stopped: {stopped})"

    passes = "in one pass" if rnd.target_forwards == 1 else f"in {plural(rnd.target_forwards, 'pass', 'passes')}"
    rule = getattr(trace.settings, "rule", "token") if trace is not None else "token"
    a = rnd.n_accepted
    j = rnd.rejected_at
    parts = [f"Round {n}: {drafted}; the target checked {'it' if k == 1 else 'them'} {passes} ({fsec(rnd.t_verify)})"]

    if j is None and a == k:
        parts[-1] += (" and accepted it" if k == 1 else f" and accepted all {k}") + _ratios(rnd, a, eps, rule)
    elif a > 0:
        what = "the first one" if a == 1 else f"the first {a}"
        parts[-1] += f" and accepted {what}" + _ratios(rnd, a, eps, rule)
    elif j is None:  # verified nothing, rejected nothing: the run stopped mid-round
        parts[-1] += " but verified none of them"

    # Positions are used as objects, never looked up by their number: a view never indexes by
    # recorded data (loading checks i = 1…k, but a bad i must not become an IndexError here).
    rescued = [pos for pos in rnd.positions if thanks_to_epsilon(pos.p, pos.q, pos.u, pos.accepted, eps)]
    if rescued:
        pos = rescued[0]
        su, sr = fpair(pos.u, plain_ratio(pos.p, pos.q))
        which = "token " + ", ".join(str(p.i) for p in rescued)
        parts.append(
            f"{which} {'was' if len(rescued) == 1 else 'were'} accepted only thanks to ε={eps:g}"
            f" ({'e.g. ' if len(rescued) > 1 else ''}token {pos.i}: u={su} ≥ p/q={sr}, but u < b={fnum(pos.b, 2)})"
        )

    if j is not None:
        pos = next(p for p in rnd.positions if not p.accepted)
        su, sb = fpair(pos.u, pos.b)
        text = tok_repr(rnd.draft[j - 1].text) if 1 <= j <= k else "(not recorded)"
        b_name = {"block": "h", "match": "b = p"}.get(rule, "b")
        rej = f"token {j} {text} was rejected{' straight away' if a == 0 else ''} (u={su} ≥ {b_name}={sb}"
        rej += f"; p={fnum(pos.p, 2)} vs q={fnum(pos.q, 2)})"
        if rnd.extra is not None and rnd.extra.kind == "correction":
            rej += f", so a correction {tok_repr(rnd.extra.text)} was sampled from {RESIDUAL_OF.get(rule, RESIDUAL_OF['token'])}"
        elif rnd.extra is None:
            rej += f"; {_stop_phrase(trace, rnd)}"
        parts.append(rej)
        discarded = k - len(rnd.positions)
        if discarded > 0:
            parts.append(
                f"{plural(discarded, 'later draft')} {'was' if discarded == 1 else 'were'} discarded unverified"
            )
    elif rnd.extra is not None and rnd.extra.kind == "bonus":
        parts.append(
            f"since every draft was accepted, the same pass gave a free bonus token {tok_repr(rnd.extra.text)} from p_{k + 1}"
        )
    elif rnd.extra is None:
        unverified = k - len(rnd.positions)
        tail = _stop_phrase(trace, rnd)
        if unverified > 0:
            tail += f" ({plural(unverified, 'draft')} left unverified)"
        parts.append(tail)
    elif rnd.extra is not None and rnd.extra.kind == "target":
        parts.append(f"the target sampled {tok_repr(rnd.extra.text)} from p")

    expected = a + (1 if rnd.extra is not None else 0)
    if emitted < expected:
        parts.append(f"only {emitted} reached the output (generation stopped inside this round)")
    return "; ".join(parts) + f". {gain}"


def narrate_html(rnd: Round, trace: Trace | None) -> str:
    """:func:`narrate`, escaped and wrapped for an HTML component."""
    meta = run_text(trace)
    meta_html = f'<div class="sv-narration-meta">drafter: {esc(meta)}</div>' if meta else ""
    return f'<div class="sv-narration">{glossed(narrate(rnd, trace))}{meta_html}</div>'
