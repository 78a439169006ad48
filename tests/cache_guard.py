"""The test suite never writes the user's specviz cache (issue 65).

The README's ``python -m pytest`` once left a probe taken beside the suite in ``~/.cache/specviz/probe.json``,
marked measured, that every later start of the app drew "This machine" and its choices from.  So a run (its
controller: :func:`setup`, from ``tests/conftest.py``) gives every process it starts -- the test processes (xdist's
workers), the app servers they launch (``tests/server.py`` passes the environment on) and the scripts they run --
a cache of its own, ``SPECVIZ_CACHE`` = a *slot*:

- ``$SPECVIZ_TEST_CACHE/slot-N`` (by default the platform's user cache folder for ``specviz-tests``, beside the
  user's ``specviz``, never in it), locked for the run, so that two runs at once (two people in one checkout)
  never share one;
- emptied of everything but built artifacts at the start of each run: the records (``probe.json``, ``quant.json``,
  trained speculators, half-written conversions) are the run's own;
- what it keeps between runs is what costs minutes to remake and is the same whoever makes it: the kernels' builds
  (``kernels/``: torch's build is tied to its folder's path, so a per-run temporary folder would compile the
  kernel again at every run, ~35 s on 2 cores), and conversions of offline models the user's cache lacks;
- the user's converted models are *read* from the user's cache: each complete conversion
  (``models/<pack>/``, with its int8 caches and GGUF records) is mirrored into the slot as symbolic links to its
  files, and a GGUF copy (``gguf/``) likewise.  Every writer there replaces a file atomically (a temporary file,
  then a rename), which replaces the link in the slot, never the user's file it pointed to; new files (a head
  store, an int8 cache the user's lacks) are the slot's.

The user's cache is ``$SPECVIZ_CACHE`` as the run found it, or the platform's user cache folder for ``specviz``
(``~/.cache/specviz`` on Linux).  The controller checksums it before and after the run (:func:`digest`: the content
of every file up to 1 MiB, size and mtime of larger ones, every folder and link) and fails the run where it changed
(:func:`changes`), naming what did.  ``SPECVIZ_TEST_CACHE_GUARD=0`` keeps the check from failing the run, for a
machine where something else (the app itself) writes the user's cache while the tests run.  A pytest run started
by a test (tests/test_chromium.py) finds ``SPECVIZ_TEST_USER_CACHE`` set: it keeps the slot it was given, and
leaves the check to the run that started it.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

USER_ENV = "SPECVIZ_TEST_USER_CACHE"  # set by a run: the user's cache it protects (a nested run guards it too)
ROOT_ENV = "SPECVIZ_TEST_CACHE"  # where the runs' slots live
GUARD_ENV = "SPECVIZ_TEST_CACHE_GUARD"  # "0": report a changed user's cache without failing the run
KEPT = ("kernels", "models", "gguf")  # a slot's built artifacts, kept between runs
LOCK = ".slot.lock"
SLOTS = 8
SMALL = 1 << 20  # files up to this size are checksummed by content; larger ones by size and mtime


def user_cache(environ: dict[str, str] | os._Environ = os.environ) -> Path:
    """The user's specviz cache as specviz.models.cache_paths.cache_dir finds it (not imported here: the
    controller of an xdist run never imports torch)."""
    if environ.get(USER_ENV):
        return Path(environ[USER_ENV])
    if environ.get("SPECVIZ_CACHE"):
        return Path(environ["SPECVIZ_CACHE"]).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("specviz"))


def slots_root(environ: dict[str, str] | os._Environ = os.environ) -> Path:
    if environ.get(ROOT_ENV):
        return Path(environ[ROOT_ENV]).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("specviz-tests"))


# ---- the checksum -------------------------------------------------------------------------------------------------


def digest(root: Path, small: int = SMALL) -> dict[str, tuple]:
    """Relative path -> what it is: ("dir",), ("link", target), ("file", size, sha256) up to ``small`` bytes,
    ("file", size, mtime_ns) above.  Links are not followed.  {} where ``root`` does not exist; {".": ("dir",)}
    for an empty folder."""
    out: dict[str, tuple] = {}
    if not root.is_dir():
        return out
    out["."] = ("dir",)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        for name in dirnames + filenames:
            path = here / name
            rel = str(path.relative_to(root))
            try:
                st = path.lstat()
                if path.is_symlink():
                    out[rel] = ("link", os.readlink(path))
                elif path.is_dir():
                    out[rel] = ("dir",)
                elif st.st_size <= small:
                    out[rel] = ("file", st.st_size, hashlib.sha256(path.read_bytes()).hexdigest())
                else:
                    out[rel] = ("file", st.st_size, st.st_mtime_ns)
            except OSError as exc:  # vanished while walked: a change too
                out[rel] = ("unreadable", type(exc).__name__)
    return out


def changes(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    """What differs between two digests, one line a path."""
    lines = [f"added {p}" for p in sorted(after.keys() - before.keys())]
    lines += [f"removed {p}" for p in sorted(before.keys() - after.keys())]
    lines += [f"changed {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]]
    return lines


# ---- the slot ------------------------------------------------------------------------------------------------------


def acquire_slot(root: Path, slots: int = SLOTS) -> tuple[Path, IO[str] | None]:
    """A slot under ``root`` no other run holds, and its lock (held until the file is closed, or the process
    ends); a fresh temporary folder (removed at exit) where every slot is taken or ``root`` cannot be written."""
    import fcntl

    for i in range(slots):
        slot = root / f"slot-{i}"
        try:
            slot.mkdir(parents=True, exist_ok=True)
            fh = open(slot / LOCK, "a")
        except OSError:
            break
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            continue
        return slot, fh
    slot = Path(tempfile.mkdtemp(prefix="specviz-tests-"))
    atexit.register(shutil.rmtree, slot, ignore_errors=True)
    return slot, None


def clean_slot(slot: Path, kept: tuple[str, ...] = KEPT) -> None:
    """Remove a slot's records (everything but ``kept`` and its lock)."""
    for child in slot.iterdir():
        if child.name in kept or child.name == LOCK:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                child.unlink()


def _link(src: Path, dst: Path) -> int:
    """``dst`` a link to ``src`` unless the slot has a file of its own there; 1 where a link was made."""
    if dst.is_symlink():
        if os.readlink(dst) == str(src):
            return 0
        dst.unlink()
    elif dst.exists():
        return 0  # the slot's own (written by a test): kept
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.symlink_to(src)
    return 1


def _mirror(src: Path, dst: Path) -> int:
    made = 0
    for dirpath, _, filenames in os.walk(src, followlinks=False):
        rel = Path(dirpath).relative_to(src)
        for name in filenames:
            made += _link(Path(dirpath) / name, dst / rel / name)
    return made


def _prune_dead_links(root: Path) -> None:
    if not root.is_dir():
        return
    for dirpath, _, filenames in os.walk(root, followlinks=False):
        for name in filenames:
            path = Path(dirpath) / name
            if path.is_symlink() and not path.exists():
                path.unlink()


def shadow(user: Path, slot: Path) -> int:
    """Mirror the user's complete model conversions (``models/<pack>/`` with a ``specviz.json``) and GGUF copies
    into ``slot`` as links to their files; links whose file is gone are removed.  Returns the links made."""
    made = 0
    for kind in ("models", "gguf"):
        _prune_dead_links(slot / kind)
    models = user / "models"
    if models.is_dir():
        for pack in sorted(models.iterdir()):
            if pack.is_dir() and not pack.is_symlink() and (pack / "specviz.json").is_file():
                made += _mirror(pack, slot / "models" / pack.name)
    gguf = user / "gguf"
    if gguf.is_dir():
        for f in sorted(gguf.glob("*.gguf")):
            if f.is_file():
                made += _link(f, slot / "gguf" / f.name)
    return made


def _inside(a: Path, b: Path) -> bool:
    a, b = a.resolve(), b.resolve()
    return a == b or b in a.parents


# ---- a run ---------------------------------------------------------------------------------------------------------


@dataclass
class Guard:
    user: Path
    slot: Path
    nested: bool
    before: dict[str, tuple] = field(default_factory=dict)
    lock: IO[str] | None = None
    report: list[str] = field(default_factory=list)

    def check(self) -> list[str]:
        """What the run changed in the user's cache (checked once, at its end; a nested run leaves it to the run
        that started it, which checks over its whole session)."""
        self.report = [] if self.nested else changes(self.before, digest(self.user))
        return self.report

    @property
    def fails(self) -> bool:
        return bool(self.report) and os.environ.get(GUARD_ENV, "1").strip() != "0"


def setup(environ: dict[str, str] | os._Environ = os.environ) -> Guard:
    """Give this run (and every process it starts) a slot as its specviz cache; checksum the user's cache."""
    user = user_cache(environ)
    if environ.get(USER_ENV) and environ.get("SPECVIZ_CACHE"):  # started by a run: its slot, its user's cache
        guard = Guard(user, Path(environ["SPECVIZ_CACHE"]), nested=True)
    else:
        root = slots_root(environ)
        if _inside(root, user) or _inside(user, root):
            root = Path(tempfile.gettempdir()) / f"specviz-tests-{getattr(os, 'getuid', lambda: 0)()}"
        slot, lock = acquire_slot(root)
        clean_slot(slot)
        shadow(user, slot)
        guard = Guard(user, slot, nested=False, lock=lock)
        environ[USER_ENV] = str(user)
        environ["SPECVIZ_CACHE"] = str(slot)
    if not guard.nested:
        guard.before = digest(user)
    return guard
