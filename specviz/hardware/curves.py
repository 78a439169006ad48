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


def monotone(curve: Mapping[int, float]) -> dict[int, float]:
    """``curve`` with each point raised to the highest before it (by tokens fed): a pass over more tokens does all
    the work of one over fewer, so a point under an earlier one is the machine's noise, and counts as that one
    (a probe on the Zen 3 EPYC, where a 2-token pass costs a step within noise, wrote T(2) = 70.6 ms under
    T(1) = 77.3: "a 2-token verify pass costs 0.91 one-token steps" on the This machine tab)."""
    out: dict[int, float] = {}
    top = float("-inf")
    for k in sorted(curve):
        top = max(top, curve[k])
        out[k] = top
    return out
