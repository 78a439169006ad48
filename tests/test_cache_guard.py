"""The test suite never writes the user's specviz cache (issue 65; tests/cache_guard.py, tests/conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests import cache_guard as G


def test_this_run_writes_a_cache_of_its_own_not_the_users():
    """Set by the run's controller before this process started (an xdist worker inherits it), and what
    specviz.models.cache_paths finds: the app servers and scripts the tests start inherit the same."""
    from specviz.models.cache_paths import cache_dir

    user = Path(os.environ[G.USER_ENV])
    mine = cache_dir()
    assert mine == Path(os.environ["SPECVIZ_CACHE"])
    assert user != mine and user not in mine.parents and mine not in user.parents
    from tests.server import launch_app  # noqa: F401  (it passes os.environ on: the slot with it)


def test_the_user_cache_the_run_guards_is_the_one_the_app_uses(monkeypatch, tmp_path):
    from specviz.models.cache_paths import cache_dir

    for env in ({}, {"SPECVIZ_CACHE": str(tmp_path / "mine")}):
        monkeypatch.delenv("SPECVIZ_CACHE", raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        assert G.user_cache({k: v for k, v in os.environ.items() if k != G.USER_ENV}) == cache_dir()


def _tree(root: Path) -> None:
    (root / "models" / "p-1").mkdir(parents=True)
    (root / "models" / "p-1" / "specviz.json").write_text('{"format": 1}')
    (root / "models" / "p-1" / "model.safetensors").write_bytes(b"w" * 2048)
    (root / "models" / "p-1" / "q4k").mkdir()
    (root / "models" / "p-1" / "q4k" / "q4k-v1.safetensors").write_bytes(b"q")
    (root / "models" / "half").mkdir()  # a conversion never finished: no marker
    (root / "models" / "half" / "model.safetensors").write_bytes(b"x")
    (root / "gguf").mkdir()
    (root / "gguf" / "p-1.gguf").write_bytes(b"g")
    (root / "probe.json").write_text("{}")


def test_the_checksum_sees_every_change(tmp_path):
    user = tmp_path / "user"
    _tree(user)
    before = G.digest(user, small=1024)
    assert G.changes(before, G.digest(user, small=1024)) == []
    (user / "probe.json").write_text('{"v4": {"measured": true}}')  # a record rewritten
    big = user / "models" / "p-1" / "model.safetensors"
    st = big.stat()
    big.write_bytes(b"v" * 2048)  # same size: caught by its mtime
    os.utime(big, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    (user / "kernels").mkdir()
    (user / "gguf" / "p-1.gguf").unlink()
    assert G.changes(before, G.digest(user, small=1024)) == [
        "added kernels", "removed gguf/p-1.gguf", "changed models/p-1/model.safetensors", "changed probe.json"]
    assert G.digest(tmp_path / "none") == {}
    assert G.changes({}, G.digest(tmp_path)) and "added ." in G.changes({}, G.digest(tmp_path))  # created at all


def test_a_slot_reads_the_users_models_and_writes_its_own(tmp_path):
    user, root = tmp_path / "user", tmp_path / "tests"
    _tree(user)
    before = G.digest(user)
    slot, lock = G.acquire_slot(root)
    try:
        (slot / "probe.json").write_text("old run's")
        (slot / "kernels").mkdir()
        (slot / "kernels" / "lib.so").write_bytes(b"built")
        G.clean_slot(slot)
        assert not (slot / "probe.json").exists() and (slot / "kernels" / "lib.so").exists()  # records go, builds stay
        assert G.shadow(user, slot) == 4
        pack = slot / "models" / "p-1"
        assert (pack / "model.safetensors").is_symlink() and (pack / "model.safetensors").read_bytes() == b"w" * 2048
        assert (pack / "q4k" / "q4k-v1.safetensors").is_symlink() and not (slot / "models" / "half").exists()
        assert (slot / "gguf" / "p-1.gguf").is_symlink()
        # writers replace files atomically: the link goes, the user's file stays
        tmp = pack / ".int8.tmp"
        tmp.write_bytes(b"new")
        os.replace(tmp, pack / "q4k" / "q4k-v1.safetensors")
        (pack / "heads").mkdir()
        (pack / "heads" / "head-kv-1.safetensors").write_bytes(b"h")
        assert G.shadow(user, slot) == 0  # the slot's own files are kept; nothing to link again
        assert (pack / "q4k" / "q4k-v1.safetensors").read_bytes() == b"new"
        (user / "gguf" / "p-1.gguf").unlink()
        G.shadow(user, slot)
        assert not (slot / "gguf" / "p-1.gguf").is_symlink()  # a dead link goes
        (user / "gguf").mkdir(exist_ok=True)
        (user / "gguf" / "p-1.gguf").write_bytes(b"g")
        G.shadow(user, slot)
        assert G.changes(before, G.digest(user)) == []
        assert (user / "models" / "p-1" / "q4k" / "q4k-v1.safetensors").read_bytes() == b"q"
        # a second run at the same time gets another slot
        other, other_lock = G.acquire_slot(root)
        assert other != slot and other.parent == root
        if other_lock:
            other_lock.close()
    finally:
        if lock:
            lock.close()


def test_a_run_guards_the_users_cache_and_a_nested_run_keeps_its_slot(tmp_path, monkeypatch):
    user, root = tmp_path / "user", tmp_path / "tests"
    _tree(user)
    env = {"SPECVIZ_CACHE": str(user), G.ROOT_ENV: str(root)}
    guard = G.setup(env)
    try:
        assert env["SPECVIZ_CACHE"] == str(guard.slot) and env[G.USER_ENV] == str(user) and not guard.nested
        assert guard.slot.parent == root and (guard.slot / "models" / "p-1" / "specviz.json").is_symlink()
        nested = G.setup(dict(env))
        assert nested.nested and nested.slot == guard.slot and nested.user == user
        assert guard.check() == []
        (user / "probe.json").write_text('{"written": "by a test"}')
        assert guard.check() == ["changed probe.json"]
        assert nested.check() == []  # the run that started it checks, over its whole session
        monkeypatch.delenv(G.GUARD_ENV, raising=False)
        assert guard.fails
        monkeypatch.setenv(G.GUARD_ENV, "0")
        assert not guard.fails  # reported, not failed
    finally:
        if guard.lock:
            guard.lock.close()


@pytest.mark.parametrize("inside", ["tests-in-user", "user-in-tests"])
def test_the_slots_never_lie_in_the_users_cache(tmp_path, monkeypatch, inside):
    monkeypatch.setattr(G.tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    user = tmp_path / "c" / "specviz"
    root = user / "tests" if inside == "tests-in-user" else tmp_path / "c"
    env = {"SPECVIZ_CACHE": str(user), G.ROOT_ENV: str(root)}
    guard = G.setup(env)
    try:
        assert user not in guard.slot.parents and guard.slot not in user.parents
        assert tmp_path / "tmp" in guard.slot.parents
    finally:
        if guard.lock:
            guard.lock.close()
