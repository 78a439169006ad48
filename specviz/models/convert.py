"""Offline packs by reference (``"offline:<key>"``), and where specviz's cache lies.

An offline pack's model is its GGUF file, run as stored (:mod:`.gguf_native`) or dequantized into memory
(:func:`.gguf_native.dequantized`): nothing is converted or written.  The cache directory (``$SPECVIZ_CACHE`` or
``platformdirs.user_cache_dir("specviz")``) holds only what is small and made on this machine:

    <cache>/kernels/      the kernels' builds (specviz's torch library, the C files loaded through ctypes)
    <cache>/heads/        the chat template's kept keys and values per model (:mod:`.prefix_store`)
    <cache>/gguf/         a reassembled copy of a pack's GGUF, where the llama.cpp bench asked for one
    <cache>/probe.json    this machine's probe (specviz.hardware.probe); quant.json: "is an int8 draft faster"
"""

from __future__ import annotations

from .cache_paths import cache_dir, gguf_copy  # noqa: F401 (re-exported)
from .presets import OFFLINE_PACKS, OfflinePack


def offline_pack(ref: str) -> OfflinePack | None:
    """The pack an ``"offline:<key>"`` reference names (None for other references or unknown keys)."""
    return OFFLINE_PACKS.get(ref[len("offline:") :]) if ref.startswith("offline:") else None


__all__ = ["cache_dir", "gguf_copy", "offline_pack"]
