"""What this machine is, for timing caches and for the page: CPU model and ISA, or the GPU.

The speed story of speculative decoding depends on it.  On a CPU with AMX (or AVX512-BF16), bf16 has
native kernels, and a verify pass over six tokens costs far less than six steps -- but not always one:
races on an AMX Xeon measured 1.9-2.5 steps, so the page reports the probe's measured curve, never a
bound assumed from the ISA.  On a CPU with AVX2 only (most laptops and cloud CPUs), bf16 has no native
kernels and a six-token verify pass costs ~5 one-token steps: compute-bound, and speculation loses
unless the target runs another way (:mod:`specviz.models.executions`).
"""

from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

# The flags that decide how bf16 and int8 matmuls run, best first.
ISA_FLAGS = ("amx_bf16", "amx_int8", "avx512_bf16", "avx512_vnni", "avx512f", "avx_vnni", "avx2", "fma")


@dataclass(frozen=True)
class Machine:
    """One machine's identity as far as timings are concerned."""

    kind: str  # "cpu" or "cuda"
    name: str  # CPU model name or GPU name
    isa: tuple[str, ...]  # the CPU's ISA_FLAGS present (CPU only)
    threads: int  # torch's intra-op threads (CPU) / multiprocessors (GPU)
    torch: str
    emulated: str = ""  # e.g. "ONEDNN_MAX_CPU_ISA=AVX2" when the kernels were restricted

    @property
    def key(self) -> str:
        """A cache key: any change of CPU/GPU, ISA, threads, torch or emulation re-measures."""
        return "|".join([self.kind, self.name, "+".join(self.isa), str(self.threads), self.torch, self.emulated])

    @property
    def isa_label(self) -> str:
        """The one ISA feature that matters most for bf16, in words."""
        if self.kind == "cuda":
            return "GPU"
        for flag, words in (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16"), ("avx512f", "AVX-512"),
                            ("avx2", "AVX2")):
            if flag in self.isa:
                suffix = " only" if flag in ("avx2", "avx512f") else ""
                return words + (" (no native bf16)" if suffix else "") + (f", emulated: {self.emulated}"
                                                                        if self.emulated else "")
        return "no AVX2"

    def describe(self) -> str:
        if self.kind == "cuda":
            return f"{self.name} (torch {self.torch})"
        threads = f"{self.threads} thread{'s' if self.threads != 1 else ''}"
        return f"{self.name}, {self.isa_label}, {threads} (torch {self.torch})"

    def as_dict(self) -> dict:
        return {**asdict(self), "isa": list(self.isa), "label": self.describe()}


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.lru_cache(maxsize=1)
def cpu_name() -> str:
    """The CPU's model name (read where the int8 draft's decision needs it too, below this layer)."""
    from ..models.int8 import cpu_model

    return cpu_model()


def emulation() -> str:
    """The kernel restrictions in force (the AVX2 emulation on an AMX machine), as text."""
    parts = [f"{k}={os.environ[k]}" for k in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY") if os.environ.get(k)]
    return " ".join(parts)


def this_machine(device: torch.device | str = "cpu") -> Machine:
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return Machine("cuda", props.name, (), props.multi_processor_count, torch.__version__)
    flags = cpu_flags()
    emulated = emulation()
    isa = tuple(f for f in ISA_FLAGS if f in flags)
    if "AVX2" in emulated.upper():  # the kernels cannot use what the emulation hides
        isa = tuple(f for f in isa if f in ("avx2", "fma"))
    return Machine("cpu", cpu_name(), isa, torch.get_num_threads(), torch.__version__, emulated)
