"""The engine's cheaper argmax (specviz.core.sampling.argmax) gives the index torch's argmax gives, and a greedy
picture's residual is p as the rule computes it (specviz.core.picture)."""

from __future__ import annotations

import torch

from specviz.core.picture import pictures
from specviz.core.sampling import Warp, argmax, residual, sample

V = 151_936  # the Qwen2.5 vocabulary: the reductions' real width


def _rows() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    rows = [torch.randn(V, generator=g) * 4, torch.randint(-3, 4, (V,), generator=g).float()]  # ties everywhere
    reduced = torch.full((V,), float("-inf"))  # a reduced draft head: 16,384 finite logits, -inf elsewhere
    kept = torch.randperm(V, generator=g)[:16_384]
    reduced[kept] = torch.randn(16_384, generator=g) * 6
    far = torch.randn(V, generator=g) * 60  # finite values far below the maximum (exp underflows to 0)
    nan = rows[0].clone()
    nan[[7, 900]] = float("nan")
    return rows + [reduced, far, nan, torch.full((V,), 2.0), torch.full((V,), float("-inf"))]


def test_argmax_is_the_first_maximal_index_as_torch_argmax_gives_it():
    rows = _rows()
    for x in rows:
        assert int(argmax(x)) == int(x.argmax()), x[:4]
    batch = torch.stack(rows[:4])
    assert torch.equal(argmax(batch), batch.argmax(-1))
    assert torch.equal(argmax(batch.bfloat16()), batch.bfloat16().argmax(-1))


def test_the_greedy_warp_and_sample_keep_the_argmax():
    for x in _rows()[:5]:
        q = Warp(temperature=0.0)(x)
        assert q.sum() == 1 and sample(q, torch.Generator(), greedy=True) == int(x.argmax())


def test_a_greedy_pictures_residual_is_p_as_the_rule_computes_it():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 500, generator=g) * 3
    warp = Warp(temperature=0.0)
    p_all = warp(logits)
    target = argmax(logits).tolist()
    tokens = [target[0], 17 if target[1] != 17 else 18, target[2]]  # a match, a miss, a match
    q = torch.zeros(3, 500).scatter_(-1, torch.tensor(tokens)[:, None], 1.0)
    pics = pictures(tokens=tokens, n_judged=3, p_all=p_all, q=q, rule="token", variant="opt", emitted=None,
                    piece=str, p1=torch.softmax(logits, -1), q1=[torch.softmax(logits[i] * 0.5, -1) for i in range(3)])
    for i, pic in enumerate(pics):
        want = residual(p_all[i], q[i])
        assert pic.res == [float(f"{v:.4g}") for v in want[torch.tensor(pic.ids)].tolist()]
        assert target[i] in pic.ids and tokens[i] in pic.ids
