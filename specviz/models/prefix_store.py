"""The chat template head's keys and values kept on disk, so a start does not compute them (issue 34).

Every chat prompt of the default pair begins with the same 24 tokens (:func:`.tokens.template_head`); the lean
steps keep their keys and values and copy them into each run's cache (:meth:`.lean.LeanSteps.keep_prefix`).
Computing them is a prompt pass: ~1.1 s for the int8 target on the 2-core AVX2 EPYC, and at a server's start it
runs while the page is still being built, so the first visitor's run waited for it (measured 2026-11-26: the
heads were kept 3.1 s after the pair was ready, a second after the page was up).  Read from here: milliseconds.

A stored head is used only where it holds the very bits this process would compute: its file name and header
carry a digest of everything those bits depend on -- the model's GGUF (its pack's sha256), the prefix's token ids, torch's version and thread count, this CPU's flags, whether specviz's kernel
runs the linears, and the source of the code that computes them (the lean steps, the int8 linears, the kernel,
the bare model's RoPE).  Anything else -- another machine, another model file, an upgraded torch, an edited
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


PREFIXES_KEPT = 4  # shared prompt heads whose keys and values a model's steps keep (one per chat template in use)


class KeptHeads:
    """The lean steps' (:class:`.lean.LeanSteps`) kept prompt heads: in memory (``_prefix_kv``), and on disk through
    their ``prefix_store``; computed by their ``_body`` into their caches."""

    def _fill_prefix(self, prefix: tuple[int, ...]) -> None:
        """The cache's first ``len(prefix)`` slots hold ``prefix``: copied from the first run that fed it, which
        fed it as a call of its own (every run feeds it so, whether it is kept or not: the same bits)."""
        n = len(prefix)
        kept = self._prefix_kv.get(prefix)
        self._reserve(n)
        store = self.prefix_store
        if kept is None and store is not None:  # kept on disk by an earlier start (the same bits: .prefix_store)
            kept = store.load(prefix, len(self.layers))
            if kept is not None:
                self._remember_prefix(prefix, kept)
                log.info("Read the %s's %d-token prompt head from %s", self.role, n, store.path(prefix).name)
        if kept is None:
            tokens, pos = torch.tensor(prefix, dtype=torch.long), torch.arange(n)
            self._body(tokens, pos, 1, self._cos, self._sin, *self.keys, *self.values)  # the head is not needed
            kept = ([k[:, :, :n].clone() for k in self.keys], [v[:, :, :n].clone() for v in self.values])
            self._remember_prefix(prefix, kept)
            if store is not None:
                store.save(prefix, kept)
        else:
            for k, v, pk, pv in zip(self.keys, self.values, *kept):
                k[:, :, :n] = pk
                v[:, :, :n] = pv
        self.length = n

    def _remember_prefix(self, prefix: tuple[int, ...], kept: tuple[list[torch.Tensor], list[torch.Tensor]]) -> None:
        while len(self._prefix_kv) >= PREFIXES_KEPT:
            self._prefix_kv.pop(next(iter(self._prefix_kv)))
        self._prefix_kv[prefix] = kept

    @torch.inference_mode()
    def keep_prefix(self, prefix: tuple[int, ...] | None = None) -> bool:
        """Compute and keep ``prefix``'s keys and values now (default :attr:`shared_prefix`), so that no run
        computes them: a server does it while its page is still being built.  An invariant target's runs
        share the store (this fills it through a run's copy); the draft's must not be in use.  Whether
        something was computed."""
        prefix = tuple(prefix if prefix is not None else self.shared_prefix)
        if not prefix or prefix in self._prefix_kv or len(prefix) > self.max_len or (self.in_use and not self.invariant):
            return False
        steps = self.for_run(len(prefix)) if self.invariant else self
        steps._fill_prefix(prefix)
        if not self.invariant:
            self.set_length(0)
        return True
