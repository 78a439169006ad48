"""Loading a draft/target pair: :func:`load_pair` and the in-process cache of loaded pairs.

Three kinds of model reference are understood:

* ``"offline:<key>"`` -- a GGUF shipped inside pip packages (:mod:`.presets`, :mod:`.packs`): mapped and run as
  stored (:mod:`.gguf_native`) where specviz's kernel runs, else dequantized into memory; nothing is converted;
* a Hugging Face hub id (``"Qwen/Qwen2.5-Coder-7B-Instruct"``) or a local directory -- loaded with
  ``from_pretrained``.  ``trust_remote_code`` is never enabled;
* ``"tiny:*"`` -- the tiny random pair built in-process by :mod:`.tiny` (tests, demos).

How each is loaded, and the target's execution chosen, is :mod:`.loaders`.  Every error meant for users is a
:class:`ModelError` whose message says what to do.
"""

from __future__ import annotations

import dataclasses
import gc
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from . import executions
from .pair import ModelError, ModelPair, ProgressFn, report, resolve_device, resolve_dtype
from .presets import DEFAULT_PRESET, PRESETS
from .loaders import ExecutionRequest, as_requested, canonical_head_input, set_execution_chooser  # noqa: F401
from .loaders import _load_native, _load_once, _runs_as_stored
from .tiny import build_tiny_pair


# --------------------------------------------------------------------------------------------------
# load_pair and the shared in-process cache
# --------------------------------------------------------------------------------------------------

_LOCK = threading.RLock()
_PAIRS: "OrderedDict[tuple, ModelPair]" = OrderedDict()
_MAX_PAIRS = 2  # keep the last two pairs: switching back is instant, memory stays bounded
_PINNED: set[tuple] = set()  # pairs never made room for (a server's default pair: load_pair(pin=True))


def clear_cache() -> None:
    """Drop the in-process model cache (tests; frees the memory once nothing else holds the pairs)."""
    with _LOCK:
        dropped = bool(_PAIRS)
        _PAIRS.clear()
        _PINNED.clear()
    if dropped:  # a full collection walks the whole heap: ~0.4 s in a process holding torch, gradio and real pairs
        gc.collect()


def forget(pair: ModelPair) -> None:
    """Drop ``pair`` from the in-process cache (its memory goes once nothing else holds it): a caller that loaded
    a pair for one use (a test, a one-off measurement) and must not leave it beside the next load."""
    with _LOCK:
        for key in [k for k, v in _PAIRS.items() if v is pair or (v.draft is pair.draft and v.target is pair.target)]:
            del _PAIRS[key]
            _PINNED.discard(key)
    gc.collect()


def load_pair(
    preset: str | None = None,
    *,
    draft: str | None = None,
    target: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    draft_quant: str | None = "auto",
    target_exec: str | None = "auto",
    progress: ProgressFn | None = None,
    pin: bool = False,
    defer_packing: bool = False,
) -> ModelPair:
    """Load (once per process) and return a draft/target pair.

    ``preset``: a key of PRESETS (None: DEFAULT_PRESET unless both ``draft`` and ``target`` are given).
    ``draft``/``target``: hub ids, local directories or "offline:<key>"; override the preset's models.
    ``device``: None -> cuda if available else cpu.  ``dtype``: None -> bf16 (fp16 on GPUs without bf16).
    ``draft_quant``: "auto" -> int8 on CPU when measured faster, None on GPU; "int8" forces; None disables.
    ``target_exec``: how the target executes (:mod:`specviz.models.executions`): "auto" lets the probe
    choose by the speculative rate it predicts on this machine (measured once, then cached; an explicit
    ``dtype`` instead runs the target in that dtype); "bf16",
    "fp32", "int8" (CPU) or "bf16", "fp16", "bf16+graphs" (CUDA) force one.
    ``progress(fraction, message)`` is called during slow steps (first-use conversion, loading).
    ``pin``: the pair stays loaded whatever is loaded after it (a server's default pair).
    ``defer_packing``: the int8 models run as soon as they are loaded, on onednn's bit-identical product,
    and their fbgemm packing is left to :func:`specviz.models.warm.finish` (a server's warm start: ~20 s
    sooner; slower runs until it is done).  A timing of them (the probe) packs first.
    """
    t0 = time.perf_counter()
    found = _request(preset, draft, target, device, dtype, draft_quant, target_exec)
    label, base, draft_ref, target_ref, key = found.label, found.base, found.draft_ref, found.target_ref, found.key
    if key[0] == "tiny":
        with _LOCK:
            if key not in _PAIRS:
                _make_room()
                tiny = build_tiny_pair()
                for model in (tiny.draft, tiny.target):
                    canonical_head_input(model)
                _remember(key, tiny)
            if pin:
                _PINNED.add(key)
            report(progress, 1.0, "Tiny random pair ready")
            return _PAIRS[key]
    dev, dt, requested_quant, requested_exec = found.device, found.dtype, found.quant, found.execution
    with _LOCK:
        hit = key if key in _PAIRS else _loaded_as(key)
        if hit is not None:
            _PAIRS.move_to_end(hit)
            if pin:
                _PINNED.add(hit)
            pair = _PAIRS[hit]
            # Same models reached through a preset or as a custom pair: share them, keep the label.
            return pair if pair.preset == label else dataclasses.replace(pair, preset=label)
        _make_room()
        alpha = base.typical_alpha if base else 0.7
        pair = _load_uncached(label, draft_ref, target_ref, dev, dt, requested_quant, progress, t0,
                              target_exec=requested_exec, alpha=alpha, defer_packing=defer_packing)
        _remember(key, pair)
        if pin:
            _PINNED.add(key)
        return pair


def resolve(preset: str | None = None, *, draft: str | None = None, target: str | None = None,
            target_exec: str | None = "auto") -> tuple[str, str, str, torch.device]:
    """(label, draft reference, target reference, device) of what load_pair with these arguments loads."""
    found = _request(preset, draft, target, None, None, "auto", target_exec)
    return found.label, found.draft_ref, found.target_ref, found.device or torch.device("cpu")


@dataclasses.dataclass(frozen=True)
class _Request:
    """What a load_pair call asks for, resolved: the cache key it is loaded under and its parts."""

    label: str
    base: Any
    draft_ref: str
    target_ref: str
    key: tuple
    device: Any = None
    dtype: Any = None
    quant: str | None = None
    execution: str = "auto"


def _request(preset: str | None, draft: str | None, target: str | None, device: str | None, dtype: str | None,
             draft_quant: str | None, target_exec: str | None) -> _Request:
    """load_pair's arguments checked and resolved (ModelError), without loading anything."""
    if preset is None and (draft is None or target is None):
        if draft is not None or target is not None:
            raise ModelError("A custom pair needs both a draft and a target model (or pick a preset).")
        preset = DEFAULT_PRESET
    if preset is not None and preset not in PRESETS:
        raise ModelError(f"Unknown preset {preset!r}. Available: {', '.join(PRESETS)}.")
    base = PRESETS.get(preset) if preset is not None else None
    draft_ref = (draft or (base.draft if base else "")).strip()
    target_ref = (target or (base.target if base else "")).strip()
    if not draft_ref or not target_ref:
        raise ModelError("A custom pair needs both a draft and a target model.")
    label = preset if base and draft_ref == base.draft and target_ref == base.target else "custom"
    if draft_quant not in (None, "auto", "int8", "none"):
        raise ModelError(f"Unknown draft quantization {draft_quant!r}: use 'auto', 'int8' or none.")
    draft_quant = None if draft_quant == "none" else draft_quant

    if draft_ref.startswith("tiny:") or target_ref.startswith("tiny:"):
        if not (draft_ref.startswith("tiny:") and target_ref.startswith("tiny:")):
            raise ModelError("The tiny random models can only be paired with each other.")
        return _Request(label, base, draft_ref, target_ref, ("tiny", draft_ref, target_ref))

    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    if draft_quant == "int8" and dev.type != "cpu":
        raise ModelError("int8 draft quantization is for CPU only; on a GPU use draft_quant=None.")
    requested_quant = draft_quant if dev.type == "cpu" else None
    requested_exec = executions.check(target_exec, dev)
    if requested_exec == "auto" and dtype not in (None, "auto"):
        requested_exec = executions.dtype_name(dt)  # a dtype asked for is the execution asked for: no probe
    key = (draft_ref, target_ref, str(dev), str(dt), requested_quant, requested_exec)
    return _Request(label, base, draft_ref, target_ref, key, dev, dt, requested_quant, requested_exec)


def _loaded_as(key: tuple) -> tuple | None:
    """The key of a loaded pair that already runs the execution ``key`` asks for by name: the pair
    "auto" chose int8 for is the int8 pair (asking for it by name must not load a second copy)."""
    *models, execution = key
    for other, pair in _PAIRS.items():
        if len(other) == len(key) and list(other[:-1]) == models and other[-1] == "auto" \
                and getattr(pair, "target_exec", None) == execution:
            return other
    return None


def _make_room() -> None:
    """Forget the least recently used pairs before loading another, to bound peak memory; pinned
    pairs are never forgotten (with only pinned pairs left, the new one loads beside them)."""
    gone = _would_drop()
    for key in gone:
        del _PAIRS[key]
    if gone:
        gc.collect()  # only then: a full collection in a busy process (the app) costs ~0.1 s


def _would_drop() -> list[tuple]:
    """The keys _make_room would forget before loading one more pair: the least recently used unpinned ones."""
    n, out = len(_PAIRS), []
    for key in _PAIRS:
        if n < _MAX_PAIRS:
            break
        if key not in _PINNED:
            out.append(key)
            n -= 1
    return out


def _remember(key: tuple, pair: ModelPair) -> None:
    _PAIRS[key] = pair
    _PAIRS.move_to_end(key)


def _load_uncached(label: str, draft_ref: str, target_ref: str, dev: torch.device, dt: torch.dtype,
                   quant: str | None, progress: ProgressFn | None, t0: float, *, target_exec: str = "auto",
                   alpha: float = 0.7, defer_packing: bool = False) -> ModelPair:
    """The pair, loaded: two offline packs on a CPU whose kernel runs them from their GGUFs as stored
    (:func:`_load_native`); anything else with transformers' models (:func:`_load_once`)."""
    if _runs_as_stored(draft_ref, target_ref, dev, quant, target_exec):
        native = _load_native(label, draft_ref, target_ref, alpha, target_exec, progress, t0, later=defer_packing)
        if native is not None:
            return native
        gc.collect()
    return _load_once(label, draft_ref, target_ref, dev, dt, quant, progress, t0, target_exec=target_exec, alpha=alpha,
                      defer_packing=defer_packing)


# --------------------------------------------------------------------------------------------------
# What a load would cost, asked before loading (a server's admission of a visitor's request)
# --------------------------------------------------------------------------------------------------


def loaded(preset: str | None = None, *, draft: str | None = None, target: str | None = None,
           target_exec: str | None = "auto") -> ModelPair | None:
    """The pair load_pair would return without loading anything, or None (ModelError for a bad request)."""
    found = _request(preset, draft, target, None, None, "auto", target_exec)
    with _LOCK:
        key = found.key if found.key in _PAIRS else (_loaded_as(found.key) if found.key[0] != "tiny" else None)
        return _PAIRS.get(key) if key is not None else None


def staying() -> list[tuple[ModelPair, bool]]:
    """(pair, pinned) of the pairs that stay loaded when one more is loaded."""
    with _LOCK:
        gone = set(_would_drop())
        return [(pair, key in _PINNED) for key, pair in _PAIRS.items() if key not in gone]


def is_pinned(pair: ModelPair) -> bool:
    with _LOCK:
        return any(p is pair for k, p in _PAIRS.items() if k in _PINNED)


def pair_nbytes(pair: Any) -> int:
    """The bytes the pair's models hold (parameters and buffers, each storage counted once)."""
    seen: set[int] = set()
    total = 0
    for model in (getattr(pair, "draft", None), getattr(pair, "target", None)):
        if not isinstance(model, torch.nn.Module):
            continue
        for t in list(model.parameters()) + list(model.buffers()):
            try:
                storage = t.untyped_storage()
                ptr, n = storage.data_ptr(), storage.nbytes()
            except Exception:  # noqa: BLE001 -- a tensor subclass without one storage: count its elements
                ptr, n = id(t), t.numel() * t.element_size()
            if ptr not in seen:
                seen.add(ptr)
                total += n
    return total


_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def weight_files(ref: str) -> list[Path] | None:
    """The weight files of a hub id or local directory as they are on this machine's disk (the Hugging
    Face cache, read offline), or None when they are not all there.  offline:/tiny: references are
    always on disk (pip packages, built in-process): []."""
    import json

    if ref.startswith(("offline:", "tiny:")):
        return []
    local = Path(ref).expanduser()
    if local.is_dir():
        return [f for f in local.iterdir() if f.suffix in (".safetensors", ".bin") and f.is_file()]
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None

    def cached(name: str) -> Path | None:
        try:
            found = try_to_load_from_cache(ref, name)
        except Exception:  # noqa: BLE001 -- not a valid repo id: not on disk
            return None
        return Path(found) if isinstance(found, str) and Path(found).is_file() else None

    if cached("config.json") is None:
        return None
    for name in _WEIGHT_FILES:
        path = cached(name)
        if path is None:
            continue
        if not name.endswith(".index.json"):
            return [path]
        try:
            shards = sorted(set(json.loads(path.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        files = [cached(shard) for shard in shards]
        return None if any(f is None for f in files) else files  # type: ignore[return-value]
    return None


def on_disk(ref: str) -> bool:
    return weight_files(ref) is not None


# Bytes per parameter of a target executing as each execution ("auto": as loaded, bf16 -- the probe
# chooses among candidates it builds one at a time); the draft stays in its 16-bit dtype.
_BYTES_PER_PARAM = {"fp32": 4.0, "int8": 1.3, "auto": 2.0}


def estimate_bytes(preset: str | None = None, *, draft: str | None = None, target: str | None = None,
                   target_exec: str | None = "auto") -> int | None:
    """The memory a pair would take once loaded, estimated before loading it: from the preset's
    parameter counts, else from its weight files on disk (16-bit weights assumed: 2 bytes a
    parameter); None when neither is known (a hub model not downloaded)."""
    found = _request(preset, draft, target, None, None, "auto", target_exec)
    base = found.base
    if base is not None and getattr(base, "params_b", None) and found.label == getattr(base, "name", None):
        params = [b * 1e9 for b in base.params_b]
    else:
        params = []
        for ref in (found.draft_ref, found.target_ref):
            files = weight_files(ref)
            if not files:
                return None
            params.append(sum(f.stat().st_size for f in files if f.suffix != ".json") / 2)
    execution = found.execution if found.key[0] != "tiny" else "fp32"
    per = _BYTES_PER_PARAM.get(str(execution).split("+")[0], 2.0)
    return int(params[0] * 2.0 + params[1] * per)
