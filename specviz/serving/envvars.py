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
