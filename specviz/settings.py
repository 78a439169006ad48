"""Decoding settings and their validation.

Every entry point (UI, API, bench) builds a `DecodeSettings` through
`DecodeSettings.checked(...)`, so bad input is refused with one clear message
on the server, whatever a client sends.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

GAMMA_MAX = 16
MAX_NEW_TOKENS_MAX = 1024
SEED_MAX = 2**63 - 1
VARIANTS = ("opt", "uno")


class SettingsError(ValueError):
    """An invalid setting; the message is shown to the user as is."""


def _show(value: Any) -> str:
    """A short, printable rendering of a client's value for an error message."""
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):  # str() of a very long int is slow, and refused past 4300 digits
        return str(value) if value.bit_length() <= 64 else "a huge integer"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str):  # repr: control characters and lone surrogates come out escaped
        return repr(value[:40] + ("…" if len(value) > 40 else ""))
    return f"a {type(value).__name__}"


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool):
        raise SettingsError(f"{name} must be a number, not {value!r}")
    try:
        x = float(value)
    except OverflowError:  # an integer too large for a float
        raise SettingsError(f"{name} is far out of range ({_show(value)})") from None
    except (TypeError, ValueError):
        raise SettingsError(f"{name} must be a number, not {_show(value)}") from None
    if not math.isfinite(x):
        raise SettingsError(f"{name} must be a finite number, not {_show(value)}")
    return x


def _integer(name: str, value: Any, lo: int, hi: int) -> int:
    x = _number(name, value)
    if x != int(x):
        raise SettingsError(f"{name} must be a whole number, not {_show(value)}")
    if not lo <= x <= hi:
        raise SettingsError(f"{name} must be between {lo} and {hi}, not {_show(x if abs(x) > 1e15 else int(x))}")
    return int(x)


@dataclass(frozen=True)
class DecodeSettings:
    gamma: int = 5  # draft length γ
    epsilon: float = 0.0  # over-acceptance ε (0 = exact)
    variant: str = "opt"  # "opt": sample corrections from the residual; "uno": from p
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    max_new_tokens: int = 64
    seed: int = 0

    @classmethod
    def checked(cls, **kw: Any) -> "DecodeSettings":
        """Validate and normalise raw values (from a form, an API call or the CLI)."""
        unknown = set(kw) - set(cls.__dataclass_fields__)
        if unknown:
            raise SettingsError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        d = {**asdict(cls()), **{k: v for k, v in kw.items() if v is not None}}
        gamma = _integer("γ (draft length)", d["gamma"], 1, GAMMA_MAX)
        eps = _number("ε (over-acceptance)", d["epsilon"])
        if not 0.0 <= eps <= 1.0:
            raise SettingsError(f"ε (over-acceptance) must be between 0 and 1, not {eps:g}")
        variant = d["variant"].strip().lower() if isinstance(d["variant"], str) else ""
        variant = {"decoding-opt": "opt", "decoding-uno": "uno"}.get(variant, variant)
        if variant not in VARIANTS:
            raise SettingsError(f"variant must be 'opt' or 'uno', not {_show(d['variant'])}")
        temp = _number("temperature", d["temperature"])
        if not 0.0 <= temp <= 5.0:
            raise SettingsError(f"temperature must be between 0 and 5, not {temp:g}")
        top_k = _integer("top-k", d["top_k"], 0, 1_000_000)
        top_p = _number("top-p", d["top_p"])
        if not 0.0 < top_p <= 1.0:
            raise SettingsError(f"top-p must be in (0, 1], not {top_p:g}")
        max_new = _integer("max new tokens", d["max_new_tokens"], 1, MAX_NEW_TOKENS_MAX)
        seed = _integer("seed", d["seed"], 0, SEED_MAX)
        return cls(gamma, eps, variant, temp, top_k, top_p, max_new, seed)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
