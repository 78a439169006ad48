"""GGUF -> safetensors conversion of the offline packs, and the cache directory that holds the result.

The first use of a pack reassembles its GGUF file (:mod:`.packs`), dequantizes it (:mod:`.gguf_convert`,
reading the file directly; transformers where that module does not handle a file) and stores a plain
safetensors checkpoint in **bfloat16** (half the disk and RAM of float32, and the
dtype we run on CPU anyway; bf16 rounding is far below the GGUF Q8_0 / Q4_K quantization error).  The
.gguf is deleted afterwards; later loads read the safetensors cache and take seconds.

Cache directory: ``$SPECVIZ_CACHE`` or ``platformdirs.user_cache_dir("specviz")``.  Layout::

    <cache>/models/<pack key>-<sha256[:12]>/   config.json, model.safetensors, tokenizer.json,
                                              tokenizer_config.json, chat_template.jinja,
                                              generation_config.json, specviz.json (marker),
                                              int8-<dtype>.safetensors (see :mod:`.int8`)
    <cache>/tmp/                               reassembled .gguf and half-written caches (transient)
    <cache>/quant.json                         measured "is int8 faster than bf16" decisions

A conversion is atomic (built under tmp/, renamed into place, marker written last) and serialised
across processes with a file lock.  Two hooks into transformers internals make it bearable; see
:func:`_gguf_hooks`.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Iterator

import torch

from .cache_paths import CACHE_FORMAT, cache_dir, gguf_copy, pack_dir  # noqa: F401 (re-exported)
from .packs import part_paths, reassemble
from .pair import ModelError, ProgressFn, report, short_error, span
from .presets import OFFLINE_PACKS, OfflinePack
from .tokens import eos_ids

log = logging.getLogger(__name__)

CACHE_DTYPE = torch.bfloat16


def cache_valid(path: Path, pack: OfflinePack) -> bool:
    """Whether ``path`` holds a complete conversion of ``pack`` in the current cache format."""
    try:
        marker = json.loads((path / "specviz.json").read_text())
    except (OSError, ValueError):
        return False
    return (
        marker.get("format") == CACHE_FORMAT
        and marker.get("gguf_sha256") == pack.sha256
        and (path / "config.json").is_file()
    )


def offline_pack(ref: str) -> OfflinePack | None:
    """The pack an ``"offline:<key>"`` reference names (None for other references or unknown keys)."""
    return OFFLINE_PACKS.get(ref[len("offline:") :]) if ref.startswith("offline:") else None


def needs_conversion(ref: str) -> bool:
    pack = offline_pack(ref)
    return pack is not None and not cache_valid(pack_dir(pack), pack)


def source_of(ref: str, progress: ProgressFn | None) -> tuple[str, str]:
    """(from_pretrained source, display name) for a model reference; converts offline packs."""
    if ref.startswith("offline:"):
        pack = offline_pack(ref)
        if pack is None:
            raise ModelError(f"Unknown offline model {ref!r}; known: {', '.join('offline:' + k for k in OFFLINE_PACKS)}.")
        return str(ensure_offline(pack, progress)), pack.display
    return ref, ref


@contextlib.contextmanager
def _convert_lock() -> Iterator[None]:
    """Serialise conversions across processes (tests and the app may start at once).

    Two concurrent conversions of the 1.5B model would double the peak memory for nothing; the
    second process waits, then finds the finished cache.  flock is released if the holder dies.
    """
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows: no cross-process lock, the atomic rename still keeps caches whole
        yield
        return
    with open(root / ".convert.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def _quiet_gguf_warning() -> Iterator[None]:
    """Silence transformers' GGUF quantizer warning about packed weights: we dequantize on purpose
    (the packed path needs the optional ``kernels`` package), so the advice would only confuse."""
    logger = logging.getLogger("transformers.quantizers.quantizer_gguf")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def _gguf_hooks(progress: ProgressFn | None, label: str) -> Iterator[None]:
    """Speed up and report on transformers' GGUF loading, for the duration of one load.

    * transformers parses the whole GGUF metadata (151k-token vocabulary included) with
      ``gguf.GGUFReader`` once for the config and again for the weights, ~10 s each on this kind of
      CPU.  A reader only reads, so we hand the same one back for the same path.
    * The dequantization loop is wrapped in ``tqdm`` imported into ``modeling_gguf_pytorch_utils``;
      swapping that name for a counting iterator is the only progress hook there is.
    Both are looked up at call time by transformers; if a future version moves them, the load still
    works, just slower or without per-tensor progress.
    """
    try:
        import gguf
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        yield
        return
    original_reader = getattr(gguf, "GGUFReader", None)
    original_tqdm = getattr(gguf_utils, "tqdm", None)
    readers: dict[tuple, Any] = {}

    def shared_reader(path, mode="r", *args, **kwargs):
        key = (os.fspath(path), mode, args, tuple(sorted(kwargs.items())))
        if key not in readers:
            if progress:
                progress(0.0, f"{label}: reading the GGUF metadata")
            readers[key] = original_reader(path, mode, *args, **kwargs)
        return readers[key]

    def counting(iterable, *args, **kwargs):
        items = list(iterable)
        for i, item in enumerate(items):
            if progress and i % 8 == 0:
                progress(0.15 + 0.85 * i / max(len(items), 1), f"{label}: dequantizing tensor {i}/{len(items)}")
            yield item

    if original_reader is not None:
        gguf.GGUFReader = shared_reader
    if original_tqdm is not None:
        gguf_utils.tqdm = counting
    try:
        yield
    finally:
        if original_reader is not None:
            gguf.GGUFReader = original_reader
        if original_tqdm is not None:
            gguf_utils.tqdm = original_tqdm
        readers.clear()


def _convert_pack(pack: OfflinePack, progress: ProgressFn | None = None, *, direct: bool = True) -> Path:
    """GGUF parts -> the pack's cache (bf16). Atomic: the cache dir appears complete or not at all.

    ``direct``: written straight from the GGUF (:mod:`.gguf_convert`: the same files, byte for byte, in a
    fraction of the time) where that module handles the file; transformers' conversion otherwise (and with
    ``direct=False``: the tests' reference)."""
    final = pack_dir(pack)
    with _convert_lock():
        if cache_valid(final, pack):  # another process finished it while we waited
            return final
        t0 = time.perf_counter()
        tmp_root = cache_dir() / "tmp"
        # We hold the lock, so anything left in tmp/ belongs to a conversion that was killed.
        shutil.rmtree(tmp_root, ignore_errors=True)
        work = tmp_root / f"{pack.key}-{os.getpid()}"
        out = work / "cache"
        out.mkdir(parents=True)
        gguf_name = f"{pack.key}.gguf"
        try:
            reassemble(pack, work / gguf_name, span(progress, 0.0, 0.1))
            t_join = time.perf_counter() - t0
            eos = _direct(pack, work / gguf_name, out, progress) if direct else None
            if eos is None:
                eos = _with_transformers(pack, work, gguf_name, out, progress)
            (work / gguf_name).unlink(missing_ok=True)  # no longer needed: free the disk early
            seconds = time.perf_counter() - t0
            marker = {
                "format": CACHE_FORMAT,
                "pack": pack.key,
                "gguf_sha256": pack.sha256,
                "dtype": str(CACHE_DTYPE).removeprefix("torch."),
                "eos_token_ids": eos,
                "convert_seconds": round(seconds, 1),
                "transformers": __import__("transformers").__version__,
                "converter": "gguf-direct" if direct and (out / ".direct").exists() else "transformers",
            }
            (out / ".direct").unlink(missing_ok=True)
            # Marker last: a directory with the marker is a complete cache.
            (out / "specviz.json").write_text(json.dumps(marker, indent=1))
            final.parent.mkdir(parents=True, exist_ok=True)
            if final.exists():  # an invalid/old cache: replace it
                shutil.rmtree(final)
            os.replace(out, final)
            log.info("Converted %s in %.1f s (reassembly %.1f s) -> %s", pack.display, seconds, t_join, final)
            report(progress, 1.0, f"{pack.display} converted in {seconds:.0f} s")
            return final
        except ModelError:
            raise
        except Exception as exc:  # disk full, out of memory, ...
            raise ModelError(f"Converting {pack.display} failed: {short_error(exc)}") from exc
        finally:
            shutil.rmtree(work, ignore_errors=True)
            gc.collect()


def _is_target(pack: OfflinePack) -> bool:
    from .presets import PRESETS

    return any(p.target == pack.ref for p in PRESETS.values())


def _direct(pack: OfflinePack, gguf_path: Path, out: Path, progress: ProgressFn | None) -> list[int] | None:
    """The cache written straight from the GGUF (:mod:`.gguf_convert`); its eos ids, or None where that module
    does not handle the file (nothing written then).  A target's Q4_K / Q6_K records are cut at the same time,
    where its int8 execution will take them (:func:`.q4k.prepare` finds them)."""
    from . import gguf_convert
    from .gguf_tokenizer import Unsupported
    from .q4k import expected, records_file

    records = None
    if _is_target(pack) and expected():  # (judged without building the kernel)
        records = records_file(out)
    report(progress, 0.1, f"Reading {pack.display} from its GGUF…")
    try:
        done = gguf_convert.write_cache(gguf_path, out, extra_eos=pack.extra_eos, dtype=CACHE_DTYPE, records=records,
                                        records_source=f"{pack.key}-{pack.sha256[:12]}",
                                        progress=span(progress, 0.1, 0.95), label=pack.display)
    except Unsupported as exc:
        log.info("%s: converting through transformers (%s is not read directly)", pack.display, exc)
        for child in out.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        return None
    (out / ".direct").touch()
    return done["eos_token_ids"]


def _with_transformers(pack: OfflinePack, work: Path, gguf_name: str, out: Path,
                       progress: ProgressFn | None) -> list[int]:
    """transformers' conversion (its GGUF tokenizer converter, its dequantization, save_pretrained): the way
    every cache was written before :mod:`.gguf_convert`; its eos ids."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    report(progress, 0.1, f"Converting the {pack.display} tokenizer…")
    try:
        with _gguf_hooks(span(progress, 0.1, 0.8), pack.display), _quiet_gguf_warning():
            tokenizer = AutoTokenizer.from_pretrained(str(work), gguf_file=gguf_name)
            report(progress, 0.2, f"Dequantizing {pack.display} (GGUF → bfloat16)…")
            gguf_model = AutoModelForCausalLM.from_pretrained(str(work), gguf_file=gguf_name, dtype=CACHE_DTYPE)
    except Exception as exc:
        raise ModelError(f"Could not read the GGUF file of {pack.display}: {short_error(exc)}") from exc
    (work / gguf_name).unlink(missing_ok=True)  # no longer needed: free the disk early

    report(progress, 0.8, f"Writing the {pack.display} cache (safetensors)…")
    model = _plain_copy(gguf_model)
    del gguf_model
    gc.collect()

    eos = eos_ids(tokenizer, model.generation_config, extra_tokens=pack.extra_eos)
    model.generation_config = GenerationConfig(
        bos_token_id=model.config.bos_token_id,
        eos_token_id=(eos if len(eos) > 1 else eos[0]) if eos else None,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos or [None])[0],
    )
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    del model, tokenizer
    gc.collect()
    return eos


def _plain_copy(gguf_model: torch.nn.Module) -> torch.nn.Module:
    """An ordinary (non-GGUF) model holding the same weights, so save_pretrained accepts it.

    transformers marks GGUF-loaded models as not serializable.  We build the same architecture on
    the meta device (no memory, no slow random init) and adopt the tensors with ``assign=True``.
    """
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(gguf_model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    state = gguf_model.state_dict()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=CACHE_DTYPE)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    if tied:  # GGUF files of tied models carry no output.weight: share the embedding again
        model.tie_weights()
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise ModelError(
            f"Unexpected GGUF contents (missing {missing[:3]}, unexpected {unexpected[:3]}); "
            "this transformers version may not convert it."
        )
    # Non-persistent buffers (rotary inv_freq) are not in the state dict and are still on meta;
    # they are recomputed when the cache is loaded, but must not stay meta in this object.
    for name, buf in list(model.named_buffers()):
        if buf.is_meta:
            owner = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
            src = dict(gguf_model.named_buffers()).get(name)
            owner._buffers[name.rpartition(".")[2]] = src.clone() if src is not None else torch.zeros(buf.shape, dtype=buf.dtype)
    return model.eval()


def ensure_offline(pack: OfflinePack, progress: ProgressFn | None) -> Path:
    """The converted cache directory of ``pack``, converting it first if needed (ModelError if the
    pack's pip packages are missing or the conversion fails)."""
    path = pack_dir(pack)
    if cache_valid(path, pack):
        return path
    part_paths(pack)  # fail fast, before taking the lock, if packages are missing
    report(progress, 0.0, f"First use of {pack.display}: converting the pip-packaged GGUF (about a minute)…")
    return _convert_pack(pack, progress)
