"""The chat template head's keys and values kept on disk, so a start does not compute them (issue 34).

Every chat prompt of the default pair begins with the same 24 tokens (:func:`.tokens.template_head`); the lean
steps keep their keys and values and copy them into each run's cache (:meth:`.lean.LeanSteps.keep_prefix`).
Computing them is a prompt pass: ~1.1 s for the int8 target on the 2-core AVX2 EPYC, and at a server's start it
runs while the page is still being built, so the first visitor's run waited for it (measured 2026-11-26: the
heads were kept 3.1 s after the pair was ready, a second after the page was up).  Read from here: milliseconds.

A stored head is used only where it holds the very bits this process would compute: its file name and header
carry a digest of everything those bits depend on -- the model's int8 weights file (name, size, modification
time), the prefix's token ids, torch's version and thread count, this CPU's flags, whether specviz's kernel
runs the linears, and the source of the code that computes them (the lean steps, the int8 linears, the kernel,
the bare model's RoPE).  Anything else -- another machine, a re-converted model, an upgraded torch, an edited
kernel -- names another file, which is computed and written then.  An unreadable file is ignored (and
replaced); a file that cannot be written is only logged.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("specviz.models")

VERSION = "1"
# the code whose arithmetic gives the keys and values (any edit to one of them names other files)
SOURCES = ("lean.py", "int8_target.py", "kernels.py", "csrc/int8_small.cpp", "bare.py", "invariant.py", "q4k.py",
           "csrc/q4k.cpp", "csrc/q6k.cpp", "csrc/q4k.h", "q6k.py", "csrc/glue.cpp", "gguf_native.py", "csrc/gguf_dequant.c")
Kept = tuple[list[torch.Tensor], list[torch.Tensor]]


@functools.cache  # the sources do not change under a running process; each load asks twice
def _sources_digest() -> str:
    here = Path(__file__).parent
    h = hashlib.sha256()
    for name in SOURCES:
        try:
            h.update(name.encode() + b"\0" + (here / name).read_bytes())
        except OSError:
            h.update(name.encode() + b"\0missing")
    return h.hexdigest()


@dataclass(frozen=True)
class PrefixStore:
    """Where one model's kept heads are stored (``folder``), and the digest of what their bits depend on."""

    folder: Path
    identity: str

    @classmethod
    def for_weights(cls, weights: Path, *, role: str, kernel: bool | str) -> "PrefixStore | None":
        """The store beside ``weights`` (the model's int8 cache file, which its linears were read from), or None
        when that file cannot be read."""
        from .kernels import _cpu_flags

        try:
            st = weights.stat()
        except OSError:
            return None
        parts = [VERSION, role, weights.name, str(st.st_size), str(st.st_mtime_ns), torch.__version__,
                 str(torch.get_num_threads()), " ".join(sorted(_cpu_flags())), f"kernel={kernel}", _sources_digest()]
        # a folder of their own: the model's folder's *.safetensors are its checkpoint (int8._source_signature)
        return cls(weights.parent / "heads", hashlib.sha256("\n".join(parts).encode()).hexdigest())

    @classmethod
    def for_pack(cls, pack: Any, *, role: str, kernel: str) -> "PrefixStore":
        """The store of a model run from its offline pack's GGUF (:mod:`.gguf_native`): the file's hash names it."""
        from .cache_paths import cache_dir
        from .kernels import _cpu_flags

        parts = [VERSION, role, pack.key, pack.sha256, torch.__version__, str(torch.get_num_threads()),
                 " ".join(sorted(_cpu_flags())), f"kernel={kernel}", _sources_digest()]
        return cls(Path(cache_dir()) / "heads", hashlib.sha256("\n".join(parts).encode()).hexdigest())

    def path(self, prefix: tuple[int, ...]) -> Path:
        digest = hashlib.sha256(f"{self.identity}|{','.join(map(str, prefix))}".encode()).hexdigest()[:20]
        return self.folder / f"head-kv-{digest}.safetensors"

    def load(self, prefix: tuple[int, ...], layers: int) -> Kept | None:
        """The stored keys and values of ``prefix`` (``layers`` of each), or None when there are none to trust."""
        from safetensors import safe_open

        path = self.path(prefix)
        if not path.exists():
            return None
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                if meta.get("identity") != self.identity or meta.get("prefix") != ",".join(map(str, prefix)):
                    return None
                keys = [f.get_tensor(f"k.{i}").clone() for i in range(layers)]
                values = [f.get_tensor(f"v.{i}").clone() for i in range(layers)]
        except Exception as exc:  # noqa: BLE001 -- truncated, foreign, missing layers: computed again
            log.warning("Ignoring the unreadable kept prompt head %s: %s", path, exc)
            return None
        if any(t.shape[-2] != len(prefix) for t in keys + values):
            return None
        return keys, values

    def save(self, prefix: tuple[int, ...], kept: Kept) -> None:
        """Store ``prefix``'s keys and values (atomically: a reader never sees half a file)."""
        from safetensors.torch import save_file

        path = self.path(prefix)
        keys, values = kept
        tensors = {**{f"k.{i}": k.contiguous() for i, k in enumerate(keys)},
                   **{f"v.{i}": v.contiguous() for i, v in enumerate(values)}}
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            save_file(tensors, str(tmp), metadata={"identity": self.identity, "prefix": ",".join(map(str, prefix))})
            tmp.replace(path)
        except OSError as exc:
            log.info("Could not store the kept prompt head at %s: %s", path, exc)
            tmp.unlink(missing_ok=True)
