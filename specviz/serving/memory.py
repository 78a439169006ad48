"""The memory actually available for a load now (the admission of a visitor's load, a first start's ready pair)."""

from __future__ import annotations


def available_bytes() -> int | None:
    """The memory actually available for a load now: the GPU's free memory on a CUDA host, else the system's
    (psutil's ``available``); None when it cannot be read."""
    try:
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.mem_get_info()[0])
    except Exception:  # noqa: BLE001 -- no usable GPU: the host's memory
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 -- psutil missing or unreadable: the budget alone decides
        return None
