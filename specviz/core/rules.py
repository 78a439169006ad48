"""The three verification rules for a drafted chain, and what each is expected to keep of one draft.

Pure Python (no torch): the views compute the "same draft, three rules" comparison from a trace with
it, without a model.  The rules themselves run in `specviz.core.verify`.

Notation: the draft x_1..x_k was drawn from q_1..q_k; p_1..p_{k+1} are the target's distributions at
the same positions (after temperature, top-k and top-p).

- ``token``: Leviathan et al.'s rule, one position at a time: keep x_i with probability
  min(1, p_i(x_i) / q_i(x_i)) (with Yin et al.'s ε: min(1, (p + ε) / q)), stop at the first
  rejection and draw a correction from norm(max(0, p_i − q_i)).
- ``block``: Sun et al.'s block verification (ICLR 2025, Algorithm 2).  A running weight
  w_0 = 1, w_i = min(1, w_{i-1} · p_i(x_i) / q_i(x_i)) carries how much of the block's probability
  survives; position i < k is a possible end of the kept prefix with probability
  h_i = (w_i − S_i) / (1 − S_i), S_i = Σ_x min(w_i · p_{i+1}(x), q_{i+1}(x)), and h_k = w_k.  With one
  uniform η_i per position, the kept prefix ends at τ = the *last* i with η_i < h_i (0 if none), and the
  next token comes from norm(max(0, w_τ · p_{τ+1} − q_{τ+1})) (p_{k+1} itself when τ = k).  Exact, and
  never worse than ``token`` in expected kept tokens averaged over drafts.
- ``match``: keep x_i only when the target's own sample at position i is x_i (probability p_i(x_i));
  at the first mismatch emit the target's sample, i.e. a draw from p_i without x_i.  Exact as well.

Under greedy decoding the three coincide: every distribution is one-hot, so each keeps exactly the
prefix on which the draft equals the target's argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

RULES = ("token", "block", "match")
# The one map of rule labels: the UI shows the keys, everything else stores the values.
RULE_LABELS = {"token-wise (Leviathan et al.)": "token", "block (Sun et al., 2025)": "block",
               "exact match": "match"}

WHY_ORDER = ("token ≥ match at every position, since min(1, p/q) ≥ p; block ≥ token on average over "
             "drafts (Sun et al., 2025): it can keep an early token p found unlikely when later tokens "
             "make up for it, though on one particular draft it may keep less.")


@dataclass(frozen=True)
class DraftOdds:
    """One drafted token's numbers, all the comparison needs: q(x), p(x), and block's h."""

    q: float  # q_i(x_i)
    p: float  # p_i(x_i)
    h: float  # block verification's h_i for this draft (h_k = w_k)


def draft_odds(draft) -> list[DraftOdds] | None:
    """A recorded round's drafted tokens (anything with q, p and h: trace.DraftToken) as DraftOdds, or None
    when nothing was drafted or the recording does not keep p and h (before trace version 3)."""
    if not draft or any(d.p is None or d.h is None for d in draft):
        return None
    return [DraftOdds(q=d.q, p=d.p, h=d.h) for d in draft]


def kept_if_token(odds: list[DraftOdds], epsilon: float = 0.0) -> list[float]:
    """P(the token rule keeps at least i tokens of this draft), i = 1..k: Π_{j ≤ i} min(1, (p_j + ε)/q_j)."""
    out, run = [], 1.0
    for o in odds:
        run *= 1.0 if o.q <= 0 else min(1.0, (o.p + epsilon) / o.q)
        out.append(run)
    return out


def kept_if_match(odds: list[DraftOdds]) -> list[float]:
    """P(the match rule keeps at least i tokens): Π_{j ≤ i} p_j(x_j)."""
    out, run = [], 1.0
    for o in odds:
        run *= o.p
        out.append(run)
    return out


def kept_if_block(odds: list[DraftOdds]) -> list[float]:
    """P(block verification keeps at least i tokens of this draft): τ ≥ i iff some j ≥ i has η_j < h_j,
    so 1 − Π_{j ≥ i} (1 − h_j)."""
    out, miss = [], 1.0
    for o in reversed(odds):
        miss *= 1.0 - min(max(o.h, 0.0), 1.0)
        out.append(1.0 - miss)
    return out[::-1]


def expected_kept(odds: list[DraftOdds], epsilon: float = 0.0) -> dict[str, float]:
    """Expected number of this draft's tokens each rule keeps, exactly (no resampling): Σ_i P(kept ≥ i).

    Conditional on the drafted tokens; since all three rules see drafts from the same q, the mean of
    these over a run's rounds estimates each rule's expected kept tokens without bias."""
    return {"token": sum(kept_if_token(odds, epsilon)), "block": sum(kept_if_block(odds)),
            "match": sum(kept_if_match(odds))}
