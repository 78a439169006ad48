"""The theory behind speculative decoding, as plain functions: no UI and no models.

These compute (and check by simulation) the formulas the workshop teaches, so that every plot of
a real run can be put next to what the theory predicts.

formulas.py  the closed forms: Leviathan et al.'s tokens per round, Thm 3.8 (speedup), Thm 3.11
             (arithmetic), the choice of γ; Yin et al.'s Thm 1 and the Thms 4–5 rejection/bias front
simulate.py  the simulations that check them, and the synthetic distributions they run on
batch.py     Yin et al.'s Thm 3: batch drafts at one position, exact and by simulation
costs.py     what a race's rounds cost in standard steps (c, the verify factor v), from its traces
figures.py   a run's derived figures (v, c, α, speedup by clock and by counts, best γ), as every panel quotes them

Notation (Leviathan et al. 2023, used throughout specviz): p = target distribution, q = draft
distribution, γ = draft length, α = mean acceptance probability, c = cost of a draft forward / cost
of a standard one-token target step, v = cost of a verify pass / that step (the verify factor: 1 in
the paper, several steps on a compute-bound CPU), ε = over-acceptance threshold.  Chen et al. (2023)
and Yin et al. (NeurIPS 2024) swap p and q; the formulas here are rewritten in our letters.

Sources:
- Leviathan, Kalman, Matias, "Fast Inference from Transformers via Speculative Decoding" (ICML
  2023): tokens per round, Thm 3.8 (wall time), Thm 3.11 (arithmetic operations), choice of γ.
- Yin, Chen, Huang, Wang, "A Theoretical Perspective for Speculative Decoding Algorithm" (NeurIPS
  2024): Thm 1 (expected rejections = Σ TV), Thm 3 (batch drafts), Thms 4–5 (rejection/bias Pareto
  front under over-acceptance).

The names in the __all__ of formulas, simulate and batch are re-exported here
(``specviz.theory.expected_speedup``).  They resolve on first use, so importing
`specviz.theory.costs`, which the views do, imports no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = ("formulas", "simulate", "batch")  # whose __all__ this package re-exports


def __getattr__(name: str) -> Any:
    for module in _MODULES:
        mod = importlib.import_module(f"{__name__}.{module}")
        if name in mod.__all__:
            return getattr(mod, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *(n for m in _MODULES for n in importlib.import_module(f"{__name__}.{m}").__all__)})
