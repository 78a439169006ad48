"""Where specviz keeps what it makes of the models: the cache directory and the paths inside it.

A module of its own, importing nothing of specviz but the presets, so that the kernels, the probe's record and the
GGUF records can name their files without importing the conversion (:mod:`.convert`, which uses them).
"""

from __future__ import annotations

import os
from pathlib import Path

from .presets import OfflinePack

CACHE_FORMAT = 1  # bump when the layout of a converted cache changes; old caches are rebuilt


def cache_dir() -> Path:
    """``$SPECVIZ_CACHE`` or the platform's user cache directory for specviz."""
    env = os.environ.get("SPECVIZ_CACHE")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("specviz"))


def pack_dir(pack: OfflinePack) -> Path:
    """Where the converted cache of ``pack`` lives (whether or not it exists yet)."""
    # The hash in the name means a different pack version never reuses a stale conversion.
    return cache_dir() / "models" / f"{pack.key}-{pack.sha256[:12]}"


def gguf_copy(pack: OfflinePack) -> Path:
    """Where a reassembled copy of ``pack``'s GGUF file is kept (the llama.cpp bench's; whether or not it exists)."""
    return cache_dir() / "gguf" / f"{pack.key}-{pack.sha256[:12]}.gguf"
