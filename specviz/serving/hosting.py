"""Hosting glue: ZeroGPU on Hugging Face Spaces, a no-op everywhere else.

On a ZeroGPU Space a GPU is attached only while a function decorated with
`spaces.GPU` runs, for at most `duration` seconds.  specviz asks for a
duration computed from the request, so short runs queue quickly.  Without the
`spaces` package (a laptop, a CPU Space, CI) the decorator returns the
function unchanged.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
from typing import Any, Callable, Mapping

MIN_GPU_S, MAX_GPU_S = 30, 300


def on_spaces() -> bool:
    return bool(os.environ.get("SPACE_ID"))


def _spaces_gpu() -> Any:
    if not (on_spaces() and os.environ.get("SPACES_ZERO_GPU")):
        return None
    try:
        import spaces  # only present on Hugging Face Spaces
    except ImportError:
        return None
    return spaces.GPU


def gpu(duration: Callable[..., int]) -> Callable[[Callable], Callable]:
    """`spaces.GPU(duration=...)` on ZeroGPU Spaces, identity elsewhere.

    ZeroGPU calls `duration` with the decorated function's own arguments; they are
    bound to its parameter names here (defaults filled in), so `duration` reads them
    by name (`max_new_tokens=...`) whatever their position."""

    def wrap(fn: Callable) -> Callable:
        decorator = _spaces_gpu()
        if not decorator:
            return fn
        sig = inspect.signature(fn)

        def seconds(*args: Any, **kwargs: Any) -> int:
            try:
                bound = sig.bind_partial(*args, **kwargs)
                bound.apply_defaults()
                named = bound.arguments
            except TypeError:
                named = dict(kwargs)
            return duration(**named)

        return decorator(duration=seconds)(fn)

    return wrap


def _clip(seconds: float) -> int:
    return int(min(max(seconds, MIN_GPU_S), MAX_GPU_S))


def run_duration(max_new_tokens: Any = 64, **_: Any) -> int:
    """GPU seconds for one race: both decoders, ~0.05 s per new token each on a GPU, plus loading."""
    try:
        max_new = min(max(float(max_new_tokens), 0.0), 1e6)
    except (TypeError, ValueError, OverflowError):
        max_new = 64
    if max_new != max_new:  # NaN
        max_new = 64
    return _clip(20 + 0.1 * max_new)


# A page sweep's runs: up to 15 configurations a round (seven ε × OPT/UNO, or γ 1…12, and the standard baseline),
# each repeated specviz.experiments.repeats.PAGE_SWEEP_REPEATS (2) times round-robin (tests/test_hosting.py checks).
SWEEP_RUNS = 15 * 2


def sweep_duration(**kwargs: Any) -> int:
    """GPU seconds for a page sweep: SWEEP_RUNS runs."""
    return _clip(20 + SWEEP_RUNS * (run_duration(**kwargs) - 20))


def server_address(env: Mapping[str, str] | None = None) -> tuple[str, int]:
    """(host, port) to listen on: `PORT` (Deta Space, most PaaS), else `GRADIO_SERVER_PORT`, else 7860;
    `GRADIO_SERVER_NAME`, else all interfaces."""
    env = os.environ if env is None else env
    raw = env.get("PORT") or env.get("GRADIO_SERVER_PORT") or "7860"
    try:
        port = int(raw)
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        raise ValueError(f"PORT / GRADIO_SERVER_PORT must be a port number (1-65535), not {raw[:40]!r}")
    return env.get("GRADIO_SERVER_NAME") or "0.0.0.0", port


# Modules Gradio tries to import around every event, which this server does not install.
ABSENT_PER_EVENT = ("matplotlib",)


def mark_absent(names: tuple[str, ...] = ABSENT_PER_EVENT) -> list[str]:
    """Record, once, that each module of ``names`` is not installed (``sys.modules[name] = None``: the import system's
    own marker, with which ``import name`` raises ImportError at once and ``importlib.util.find_spec`` says None).
    Gradio enters a matplotlib backend context around every event, whose ``import matplotlib`` otherwise searches
    every ``sys.path`` entry again each time it fails: ~6 % of a class poll's CPU in a py-spy profile of 60 attendees
    (2-core Zen 5).  A module that is installed is left alone.  Returns the names marked."""
    marked = []
    for name in names:
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            sys.modules[name] = None  # type: ignore[assignment]
            marked.append(name)
    return marked
