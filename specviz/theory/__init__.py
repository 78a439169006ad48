"""The theory behind speculative decoding, as plain functions: no UI and no models.

formulas.py  the closed forms (Leviathan et al.'s tokens per round, Thm 3.8 speedup, Thm 3.11 cost,
             the choice of γ; Yin et al.'s Thm 1 and the Thms 4–5 rejection/bias front)
costs.py     what a race's rounds cost in standard steps (c, the verify factor v), from its traces

The formulas' names are re-exported here (``specviz.theory.expected_speedup``).  They resolve on
first use, so importing `specviz.theory.costs`, which the views do, imports no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = ("formulas",)  # whose __all__ this package re-exports


def __getattr__(name: str) -> Any:
    for module in _MODULES:
        mod = importlib.import_module(f"{__name__}.{module}")
        if name in mod.__all__:
            return getattr(mod, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *(n for m in _MODULES for n in importlib.import_module(f"{__name__}.{m}").__all__)})
