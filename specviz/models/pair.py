"""The loaded pair and what every loading step shares.

:class:`ModelPair` is what the engine and the UI receive; :class:`ModelError` is the one error type
meant for users (its message says what to do) and :func:`short_error` turns any exception into such a
message.  Device and dtype resolution live here too, with the progress-callback plumbing, because
the converter, the int8 code and the loader all need them and none of them should import another
just for these.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch

log = logging.getLogger("specviz.models")

ProgressFn = Callable[[float, str], None]


class ModelError(Exception):
    """A model problem with a message fit to show to users verbatim (no traceback needed)."""


def short_error(exc: BaseException, limit: int = 400) -> str:
    """The message of ``exc`` on one line, at most ``limit`` characters, for a user-facing error
    (never a traceback); the exception's type name if it has no message."""
    text = str(exc).strip() or type(exc).__name__
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class ModelPair:
    preset: str
    draft_name: str
    target_name: str
    draft: torch.nn.Module  # eval mode, on device; an int8 draft stays on CPU in float32 activations
    target: torch.nn.Module
    tokenizer: Any  # shared HF tokenizer
    device: torch.device
    dtype: torch.dtype  # the target's dtype (the draft's too unless draft_quant is set)
    draft_quant: str | None  # None or "int8"
    eos_token_ids: list[int]
    context_length: int  # min of both models' max_position_embeddings
    vocab_size: int  # logits width; both models agree (a wider, padded head is trimmed on load)
    load_seconds: float
    target_exec: str = ""  # how the target executes (models.executions): bf16, fp32, int8, bf16+graphs…
    # "gguf": an int8 target multiplies its GGUF's Q4_K/Q6_K matrices as stored (models.q4k; SPECVIZ_Q4K=0: not);
    # "": its own int8 rows.  Other numbers and timings: part of a recording's execution (serving.replay)
    target_weights: str = ""
    probe: Any = None  # the hardware.probe.Probe that chose it (curves for the page), if one ran or was cached

    def device_label(self) -> str:
        if self.device.type == "cuda":
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
        return str(self.device)


# --------------------------------------------------------------------------------------------------
# Progress reporting
# --------------------------------------------------------------------------------------------------


def span(progress: ProgressFn | None, lo: float, hi: float) -> ProgressFn | None:
    """Map a sub-task's 0..1 progress onto [lo, hi] of the caller's progress."""
    if progress is None:
        return None
    return lambda f, msg: progress(lo + (hi - lo) * min(max(f, 0.0), 1.0), msg)


def report(progress: ProgressFn | None, fraction: float, message: str) -> None:
    log.info("%s", message)
    if progress is not None:
        progress(fraction, message)


# --------------------------------------------------------------------------------------------------
# Devices and dtypes
# --------------------------------------------------------------------------------------------------

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}


def resolve_device(device: str | None) -> torch.device:
    """None/"auto" -> cuda if available else cpu; ModelError for unknown or unavailable devices."""
    if device is None or device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ModelError(f"Unknown device {device!r}: use 'cpu' or 'cuda'.") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelError("CUDA was requested but no CUDA GPU is available to this PyTorch; use device 'cpu'.")
        dev = torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())
    return dev


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """None/"auto" -> bf16 (fp16 on GPUs without bf16); names like "fp32" or "bfloat16" accepted."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16
    key = str(dtype).removeprefix("torch.").lower()
    if key not in _DTYPES:
        raise ModelError(f"Unknown dtype {dtype!r}: use float32, bfloat16 or float16.")
    return _DTYPES[key]
