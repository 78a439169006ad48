"""One allocation for a ready pair's weights, its pages faulted in by a thread while the files are still being read.

A first start's ready pair (:mod:`.first_start`) writes ~4.8 GB of fresh bf16 weights.  On the 2-core AMD EPYC
(Zen 3, a Firecracker VM) fresh memory costs more than the arithmetic that fills it: each page's first touch
is a fault the host serves, ~1-1.5 GB/s, one core's worth whichever thread touches it (6 GB: 7.7 s from two
threads, 9.3 s from one; the C dequantizer into memory already touched: 1.4 s).  So the pair's memory is
asked for at once, in one block, and a thread has the kernel fault its pages in (``MADV_POPULATE_WRITE``,
Linux 5.14+: the pages are made present and writable, their contents untouched, so the thread never races
the writers) from the far end, while the other core reads and checks the files, imports the model code,
builds the tokenizer and dequantizes into the near end.  Where the kernel lacks it, nothing is faulted ahead.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import threading
import time

import torch

log = logging.getLogger("specviz.models")

MADV_POPULATE_WRITE = 23  # <linux/mman.h>
PAGE = 4096
CHUNK = 64 << 20  # bytes faulted per call (ctypes lets go of the GIL during each); the thread may stop between calls
ALIGN = 64


def _madvise() -> object | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


class Arena:
    """``nbytes`` of memory handed out as tensors (:meth:`take`), in order from the start, while a thread faults
    the pages in from the end (:meth:`close` stops it and waits)."""

    def __init__(self, nbytes: int, label: str = ""):
        self._buf = torch.empty(nbytes, dtype=torch.uint8)
        self._lock = threading.Lock()
        self._next = 0
        self._stop = threading.Event()
        self.label = label
        self.faulted = 0  # bytes the thread made present
        self._thread = threading.Thread(target=self._fault, name="specviz-prefault", daemon=True)
        self._thread.start()

    @property
    def nbytes(self) -> int:
        return self._buf.numel()

    def _fault(self) -> None:
        madvise = _madvise()
        if madvise is None:
            return
        t = time.perf_counter()
        base = self._buf.data_ptr()
        lo = -(-base // PAGE) * PAGE
        top = (base + self.nbytes) // PAGE * PAGE
        while top > lo and not self._stop.is_set():
            with self._lock:  # what is handed out is being written (its writers fault it): no need to here
                floor = max(lo, -(-(base + self._next) // PAGE) * PAGE)
            start = max(floor, top - CHUNK)
            if start >= top:
                break
            if madvise(start, top - start, MADV_POPULATE_WRITE) != 0:
                log.info("Memory not faulted in ahead (madvise: errno %d); the writers fault it", ctypes.get_errno())
                return
            self.faulted += top - start
            top = start
        log.info("Faulted in %.1f GB for %s ahead of its weights in %.1f s", self.faulted / 1e9, self.label,
                 time.perf_counter() - t)

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A tensor of ``shape`` and ``dtype`` in the arena (uninitialised), or a fresh one when it is full."""
        n = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        with self._lock:
            start = -(-self._next // ALIGN) * ALIGN
            if start + n <= self.nbytes:
                self._next = start + n
                return self._buf[start:start + n].view(dtype).view(shape)
        return torch.empty(shape, dtype=dtype)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
