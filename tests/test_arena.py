"""The ready pair's memory (specviz.models.arena): one block handed out as tensors while a thread faults its
pages in; the thread never changes what is written (it only makes pages present), and a full arena hands
out fresh tensors."""

from __future__ import annotations

import torch

from specviz.models import arena as A


def test_tensors_are_handed_out_in_order_aligned_and_then_fresh():
    arena = A.Arena(64 * 1024, "a test")
    a = arena.take((10, 3), torch.bfloat16)
    b = arena.take((100,), torch.float32)
    assert a.shape == (10, 3) and a.dtype == torch.bfloat16 and b.dtype == torch.float32
    base = arena._buf.data_ptr()
    assert a.data_ptr() == base and b.data_ptr() == base + A.ALIGN  # 60 bytes, then the next 64-byte boundary
    big = arena.take((64 * 1024,), torch.float32)  # does not fit: a tensor of its own
    assert big.numel() == 64 * 1024 and not (base <= big.data_ptr() < base + arena.nbytes)
    arena.close()


def test_the_faulting_thread_never_changes_what_is_written():
    arena = A.Arena(256 << 20, "a test")  # 256 MB: the thread works through it while it is written
    written = []
    for i in range(64):
        t = arena.take((1 << 20,), torch.float32)
        t.fill_(float(i))
        written.append(t)
    arena.close()
    assert all(bool((t == i).all()) for i, t in enumerate(written))
    if A._madvise() is not None:
        assert arena.faulted >= 0 and not arena._thread.is_alive()


def test_the_thread_faults_the_pages_in(monkeypatch):
    if A._madvise() is None:
        import pytest

        pytest.skip("no madvise here (not Linux)")
    arena = A.Arena(32 << 20, "a test")
    arena._thread.join(30)
    assert arena.faulted >= (32 << 20) - 2 * A.PAGE  # all of it, less the unaligned ends
    arena.close()
