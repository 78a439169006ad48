"""A measured verify-cost curve T(k) read between (and beyond) its points.  Plain Python, no torch, so
the probe, the machine panel and the challenges' checks share one reading."""

from __future__ import annotations

from typing import Mapping


def interpolate(curve: Mapping[int, float], k: float, *, beyond: str = "slope") -> float:
    """T(k) from measured points: linear between them; past the last one, the last slope continued
    (``beyond="slope"``) or the last value kept (``beyond="flat"``); the first value below the first."""
    ks = sorted(curve)
    if k <= ks[0]:
        return curve[ks[0]]
    for a, b in zip(ks, ks[1:]):
        if k <= b:
            return curve[a] + (curve[b] - curve[a]) * (k - a) / (b - a)
    if beyond == "flat":
        return curve[ks[-1]]
    a, b = ks[-2:] if len(ks) > 1 else (ks[0], ks[0])
    slope = (curve[b] - curve[a]) / (b - a) if b != a else 0.0
    return curve[b] + slope * (k - b)
