"""Settings an operator sets in the environment: numbers (SPECVIZ_SESSIONS, SPECVIZ_JOB_SECONDS, ...)
and choices (SPECVIZ_TARGET_EXEC).

One rule for all of them: unset or empty means the default; a value that is not a positive, finite
number of the right kind ("abc", "-3", "0", "nan", "inf", "2.5" for a count), or not one of the
choices, also means the default, with a warning that names the variable and the value, so a typo in
a host's settings never stops the app from starting.  No imports beyond the standard library: app.py and the modules read these at
import time.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Iterable, TypeVar

log = logging.getLogger("specviz.env")
N = TypeVar("N", int, float)


def env_number(name: str, default: N, kind: type = float) -> N:
    """A positive `kind` (int or float) from the environment variable `name`, or `default`."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = kind(raw.strip())
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value <= 0:
        what = "a positive whole number" if kind is int else "a positive number"
        log.warning("ignoring %s=%r (not %s); using the default, %s", name, raw, what, default)
        return default
    return value


def env_int(name: str, default: int) -> int:
    return env_number(name, default, int)


def env_choice(name: str, choices: Iterable[str], default: str) -> str:
    """One of ``choices`` (compared without case or surrounding spaces) from the environment variable
    `name`, or `default`."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    choices = tuple(choices)
    value = raw.strip().lower()
    if value not in choices:
        log.warning("ignoring %s=%r (not one of %s); using the default, %s", name, raw, ", ".join(choices), default)
        return default
    return value


def env_flag(name: str) -> bool:
    """An on/off setting: "1", "true", "yes" or "on" (any case) mean on; anything else, or unset, off."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def downloads_allowed() -> bool:
    """SPECVIZ_ALLOW_DOWNLOADS=1: a visitor's request may download a hub preset that is not on disk
    (off by default: a 3.7-16 GB download on any visitor's request is the host's choice)."""
    return env_flag("SPECVIZ_ALLOW_DOWNLOADS")


def memory_budget_bytes() -> int:
    """The memory the loaded model pairs may take together (env SPECVIZ_MEMORY_GB); by default 75 % of
    this machine's physical memory (of the GPU's on a CUDA host, where the models live)."""
    gb = env_number("SPECVIZ_MEMORY_GB", 0.0)
    if gb > 0:
        return int(gb * 2**30)
    try:
        import torch

        if torch.cuda.is_available():
            return int(0.75 * torch.cuda.get_device_properties(0).total_memory)
    except Exception:  # noqa: BLE001 -- no torch or no usable GPU: the host's memory
        pass
    try:
        return int(0.75 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16 * 2**30
