"""Hosting glue: ZeroGPU on Hugging Face Spaces, a no-op everywhere else.

On a ZeroGPU Space a GPU is attached only while a function decorated with
`spaces.GPU` runs, for at most `duration` seconds.  specviz asks for a
duration computed from the request, so short runs queue quickly.  Without the
`spaces` package (a laptop, a CPU Space, CI) the decorator returns the
function unchanged.
"""

from __future__ import annotations

import os
from typing import Any, Callable

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
    """`spaces.GPU(duration=...)` on ZeroGPU Spaces, identity elsewhere."""

    def wrap(fn: Callable) -> Callable:
        decorator = _spaces_gpu()
        return decorator(duration=duration)(fn) if decorator else fn

    return wrap


def _clip(seconds: float) -> int:
    return int(min(max(seconds, MIN_GPU_S), MAX_GPU_S))


def _arg(args: tuple, kwargs: dict, name: str, index: int, default: Any) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else default


def run_duration(*args: Any, **kwargs: Any) -> int:
    """GPU seconds for one race: both decoders, ~0.05 s per new token each on a GPU, plus loading."""
    try:
        max_new = int(float(kwargs.get("max_new_tokens", _arg(args, kwargs, "max_new_tokens", 9, 64))))
    except (TypeError, ValueError):
        max_new = 64
    return _clip(20 + 0.1 * max_new)


def sweep_duration(*args: Any, **kwargs: Any) -> int:
    """A sweep is ~14 runs."""
    return _clip(20 + 14 * (run_duration(*args[1:], **kwargs) - 20))
