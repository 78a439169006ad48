"""Models for specviz: presets, offline packs, loading a draft/target pair, tokens and text.

The package is split by concern; import from here unless you need a module's internals:

* :mod:`.presets` -- the pairs on offer and the offline packs (data, no loading);
* :mod:`.pair` -- :class:`ModelPair`, :class:`ModelError`, :func:`short_error`, device/dtype resolution;
* :mod:`.packs` -- finding the installed GGUF part packages, reassembling and checking the file;
* :mod:`.convert` -- GGUF -> safetensors conversion and the cache directory;
* :mod:`.int8` -- the int8 draft and the "is int8 faster here" decision;
* :mod:`.loading` -- :func:`load_pair` and the in-process cache of pairs;
* :mod:`.tokens` -- prompt encoding and the one way to turn tokens into text;
* :mod:`.tiny` -- the tiny random pair for tests and demos.
"""

from .cache_paths import cache_dir
from .loading import clear_cache, load_pair
from .pair import ModelError, ModelPair, ProgressFn, short_error
from .presets import (
    DEFAULT_PRESET,
    OFFLINE_PACKS,
    PRESETS,
    TINY_PRESET,
    OfflinePack,
    Preset,
    preset_help,
    resolve_preset,
)
from .tokens import Detokenizer, encode_prompt, token_text

__all__ = [
    "DEFAULT_PRESET",
    "OFFLINE_PACKS",
    "PRESETS",
    "TINY_PRESET",
    "Detokenizer",
    "ModelError",
    "ModelPair",
    "OfflinePack",
    "Preset",
    "ProgressFn",
    "cache_dir",
    "clear_cache",
    "encode_prompt",
    "load_pair",
    "preset_help",
    "resolve_preset",
    "short_error",
    "token_text",
]
