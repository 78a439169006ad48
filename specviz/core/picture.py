"""The acceptance picture's numbers at each verified position of a chain round (trace.Picture).

At position i: the top tokens by max(p, q) (always with the drafted token x and the token emitted
there), p and q at them, and the distribution a correction at i is drawn from under the rule that ran
(token: norm(max(0, p − q)), or p for Decoding-UNO; block: norm(max(0, w·p − q)) with the weight w of the
kept prefix before i; match: p without x), each normalised over the whole vocabulary before the top
tokens are picked.  Under greedy decoding p, q and the residual are one-hot; the picture then also keeps
both models' temperature-1 beliefs, so a greedy run still shows what the models thought.

Only for the explainer: the engine times it as tracing.
"""

from __future__ import annotations

import torch

from ..trace.model import Picture
from ..trace.tree import TryPicture
from .sampling import argmax, residual
from .verify import block_residual, without_token, block_weights

TOP = 12  # tokens per picture (plus the drafted token and the emitted one when outside them)


def pictures(*, tokens: list[int], n_judged: int, p_all: torch.Tensor, q: torch.Tensor | None, rule: str, variant: str,
             emitted: int | None, piece, p1: torch.Tensor | None = None,
             q1: list[torch.Tensor | None] | None = None, weights: list[float] | None = None,
             top: int = TOP) -> list[Picture]:
    """One Picture per judged position (the first ``n_judged`` of the k drafted tokens).

    Shapes: p_all [k + 1, V] and q [k, V] the rule's distributions (one-hot under greedy decoding; q None: one-hot
    at the drafted tokens, read only where a picture needs it -- a greedy run's rounds need no [k, V] of zeros);
    ``emitted`` the token emitted after the kept ones (a correction when it lies at a judged position);
    p1 [k + 1, V] and q1 (k rows or None) the temperature-1 beliefs, for greedy runs only; ``weights``
    block verification's w_1..w_k when the rule already computed them."""
    k = len(tokens)
    if not n_judged:
        return []
    if q is None and (p1 is None or rule == "block" or variant == "uno"):
        q = _one_hot(tokens, p_all)  # the paths below that read all of q
    xs = torch.tensor(tokens, device=p_all.device)
    at = torch.arange(k, device=p_all.device)
    if rule == "block" and weights is None:
        weights = block_weights(p_all[: k + 1], q, p_all[at, xs], q[at, xs])[0]
    best = argmax(p_all[:n_judged]).tolist()  # each row's first maximal index, in one call
    score = torch.empty_like(p_all[0])  # each position's ranking, in one buffer
    out = []
    for i in range(n_judged):
        p, qi, x = p_all[i], None if q is None else q[i], tokens[i]
        if rule == "match":
            res = without_token(p, x)
        elif rule == "block":
            res = block_residual(1.0 if i == 0 else weights[i - 1], p, qi)
        elif variant == "uno" or p1 is not None:  # greedy (p1 given): p, q one-hot, so norm(max(0, p - q)) is p
            res = p
        else:
            res = residual(p, qi)
        rank_p = p if p1 is None else p1[i]
        rank_q = qi if q1 is None or q1[i] is None else q1[i]
        if rank_q is None:  # q one-hot at x: max(rank_p, q) is rank_p with 1 at x
            score.copy_(rank_p)
            score[x] = torch.maximum(score[x], torch.ones((), dtype=score.dtype))
        else:
            torch.maximum(rank_p, rank_q, out=score)
        ids, idx = _top_ids(score, top, x, emitted if i == n_judged - 1 else None, int(best[i]))
        pv = p[idx].tolist()
        qv = qi[idx].tolist() if qi is not None else [1.0 if t == x else 0.0 for t in ids]
        out.append(Picture(
            ids=ids, text=[piece(t) for t in ids], p=_short(pv), q=_short(qv), res=_short(res[idx].tolist()),
            rest_p=_round(max(0.0, 1.0 - sum(pv))), rest_q=_round(max(0.0, 1.0 - sum(qv))),
            p1=_short(p1[i][idx].tolist()) if p1 is not None else None,
            q1=_short(q1[i][idx].tolist()) if q1 is not None and q1[i] is not None else None))
    return out


def _one_hot(tokens: list[int], like: torch.Tensor) -> torch.Tensor:
    """[k, V]: row i one-hot at tokens[i] (a greedy draft's q)."""
    q = torch.zeros((len(tokens), like.shape[-1]), dtype=like.dtype, device=like.device)
    q[torch.arange(len(tokens), device=like.device), torch.tensor(tokens, device=like.device)] = 1.0
    return q


def _top_ids(score: torch.Tensor, top: int, *always: int | None) -> tuple[list[int], torch.Tensor]:
    """The ``top`` tokens by score, then each of ``always`` not among them (None: none): ids and their index."""
    ids = torch.topk(score, min(top, score.shape[-1])).indices.tolist()
    ids += [t for t in dict.fromkeys(always) if t is not None and t not in ids]
    return ids, torch.tensor(ids, device=score.device)


def _round(v: float) -> float:
    """Four significant digits: what a bar and its hover show, and a recording a third the size."""
    return float(f"{v:.4g}")


def _short(vs: list[float]) -> list[float]:
    return [_round(v) for v in vs]


def try_picture(*, p: torch.Tensor, r: torch.Tensor, q: torch.Tensor, x: int, piece, top: int = TOP) -> TryPicture:
    """The picture of one child tried in a token tree: r (p at the first child, then what earlier
    rejections left), the child's q_j, and norm(max(0, r − q_j)), which the next child (or the
    correction) is judged against; p itself beside them."""
    nxt = residual(r, q)
    ids, idx = _top_ids(torch.maximum(r, q), top, x, int(argmax(p)))
    return TryPicture(ids=ids, text=[piece(t) for t in ids], p=_short(p[idx].tolist()), r=_short(r[idx].tolist()),
                      q=_short(q[idx].tolist()), res=_short(nxt[idx].tolist()))
