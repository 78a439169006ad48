"""Plain C files compiled once by the machine's C compiler into the specviz cache, and loaded through ctypes.

What :mod:`.gguf_dequant` (the GGUF dequantizer) and :mod:`specviz.hardware.peak` (the int8 multiply-add peak
the probe measures) build: one small C file each, no torch headers, compiled in well under a second into
``<cache>/kernels/<stem>-<digest>.so`` (the digest: the source text and the flags, so another text is another
build) and loaded with :class:`ctypes.CDLL`, whose calls let go of the interpreter lock.  A file being built is
written beside its final name and renamed, so a process loading beside this one never maps half a file.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import sysconfig
import threading
from pathlib import Path
from typing import Callable, Sequence

NO_COMPILER = "no C compiler here"


def compiler() -> str | None:
    """The machine's C compiler: ``$CC``, Python's own build's, ``cc`` or ``gcc``; None where there is none."""
    for cc in (os.environ.get("CC"), sysconfig.get_config_var("CC"), "cc", "gcc"):
        if cc and (path := shutil.which(shlex.split(cc)[0])):
            return path
    return None


def shared_library(source: Path, cflags: Sequence[str], stem: str,
                   find_compiler: Callable[[], str | None] = compiler) -> tuple[ctypes.CDLL | None, str]:
    """``source`` compiled with ``cflags`` (once per cache) and loaded: (the library, "") or (None, why not:
    :data:`NO_COMPILER`, or the compiler's or the loader's complaint)."""
    from .cache_paths import cache_dir

    text = source.read_bytes()
    digest = hashlib.sha256(text + " ".join(cflags).encode()).hexdigest()[:12]
    lib = cache_dir() / "kernels" / f"{stem}-{digest}.so"
    try:
        if not lib.exists():
            cc = find_compiler()
            if cc is None:
                return None, NO_COMPILER
            lib.parent.mkdir(parents=True, exist_ok=True)
            tmp = lib.with_name(f".{lib.name}.{os.getpid()}.{threading.get_ident()}")
            subprocess.run([cc, *cflags, "-o", str(tmp), str(source)], check=True, capture_output=True, timeout=120)
            tmp.replace(lib)  # atomic: a process loading beside this one never maps half a file
        return ctypes.CDLL(str(lib)), ""
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", b"") or b""
        return None, f"{type(e).__name__}: {detail.decode(errors='replace')[-300:] if detail else e}"


__all__ = ["NO_COMPILER", "compiler", "shared_library"]
