"""The int8 multiply-add peak of this CPU: the compute side of the roofline the probe judges T(k) against.

A verify pass over k tokens reads the target's weights once and does k multiply-adds with each: its time is at least
the larger of the bandwidth bound (the weights at the copy bandwidth, :func:`.roofline.copy_bandwidth`) and k times
one token's multiply-adds at the CPU's peak rate.  That rate is measured here, for the instructions specviz's int8
products run (``csrc/int8_peak.c``: a tight loop of each, on registers, with independent accumulators):

* ``avx2``: vpmaddubsw + vpmaddwd + vpaddd, 32 multiply-adds a group (int8_small's and q4k's AVX2 form);
* ``avx512_vnni_256`` / ``avx512_vnni_512``: vpdpbusd on ymm (the GGUF kernels' one-token steps) and zmm (their
  passes of two tokens or more, two tokens a register, and fbgemm's rows on an AVX-512 CPU), 32 and 64 an
  instruction (the roofline takes the one an execution's passes run: :func:`kernel_isa`);
* ``amx``: tdpbusd on tiles, only where the CPU has AMX-INT8 (recorded; none of specviz's int8 products uses it).

Each is timed on one thread and on the probe's threads (POSIX threads started together), the best of a few short
runs, ~0.1 s in all on the 2-core EPYC (Zen 5), where they measured 121 / 233 (AVX2), 241 / 482 (vpdpbusd ymm) and
485 / 952 (zmm) GMAC/s on 1 / 2 threads: 32, 64 and 128 multiply-adds a cycle a core at ~3.8 GHz.  An instruction
set the CPU lacks is never run: ``/proc/cpuinfo``'s flags are asked first, and the C code asks CPUID and the OS's
saved registers (XCR0; for AMX, Linux's permission) again before any of it runs.  The file is compiled once into the
specviz cache (:mod:`specviz.models.cbuild`); without a C compiler the record says "peak not measured" and the
roofline is the bandwidth bound alone.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("specviz.models")

SOURCE = Path(__file__).with_name("csrc") / "int8_peak.c"
CFLAGS = ("-O2", "-shared", "-fPIC", "-pthread")
MACS_PER_RUN = 2**29  # a thread's multiply-adds a run: ~1.2 ms at 430 GMAC/s (zmm VNNI, Zen 5), ~5 ms at 110 (AVX2)
REPS = 5  # runs a figure, the fastest kept (the first warms the clock; another process may take a core)
BUDGET_S = 0.06  # ...but no more runs past this (two at least): six figures stay under ~0.5 s on a busy machine


@dataclass(frozen=True)
class Isa:
    """One instruction set's loop: its code in the C file, the /proc/cpuinfo flags it needs, its words."""

    code: int
    flags: tuple[str, ...]
    words: str
    macs_per_round: int  # multiply-adds a round of the C loop (its accumulators' instructions)


ISAS: dict[str, Isa] = {
    "avx2": Isa(0, ("avx2",), "AVX2 vpmaddubsw + vpmaddwd", 8 * 32),
    "avx512_vnni_256": Isa(1, ("avx512f", "avx512vl", "avx512_vnni"), "AVX-512 VNNI vpdpbusd, 256-bit", 16 * 32),
    "avx512_vnni_512": Isa(2, ("avx512f", "avx512_vnni"), "AVX-512 VNNI vpdpbusd, 512-bit", 16 * 64),
    "amx": Isa(3, ("amx_tile", "amx_int8"), "AMX tdpbusd tiles", 4 * 16 * 16 * 64),
}
# the instructions specviz's int8 products run (the roofline takes the one an execution runs here: kernel_isa)
KERNEL_ISAS = ("avx2", "avx512_vnni_256", "avx512_vnni_512")
_CODES = {-1: "not compiled here (the compiler lacks its intrinsics, or the CPU is not x86-64)",
          -2: "the CPU lacks it", -3: "the operating system has not enabled its registers",
          -4: "a thread could not start"}
_LIB: dict[str, tuple[ctypes.CDLL | None, str]] = {}
_LOCK = threading.Lock()


class Refused(ValueError):
    """An instruction set this machine cannot time: absent, or no loop built for it."""


def _compiler() -> str | None:
    from ..models import cbuild

    return cbuild.compiler()


def library() -> tuple[ctypes.CDLL | None, str]:
    """(the compiled loops, "") or (None, why not): built on first use, once per cache."""
    from ..models import cbuild

    with _LOCK:
        if "lib" not in _LIB:
            lib, why = cbuild.shared_library(SOURCE, CFLAGS, "int8-peak", _compiler)  # _compiler: a test replaces it
            if lib is not None:
                lib.specviz_int8_peak.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int]
                lib.specviz_int8_peak.restype = ctypes.c_double
                lib.specviz_int8_peak_supported.argtypes = [ctypes.c_int]
                lib.specviz_int8_peak_supported.restype = ctypes.c_int
            else:
                log.info("The int8 peak loop could not be built (%s): the roofline is the bandwidth bound alone", why)
            _LIB["lib"] = (lib, why)
        return _LIB["lib"]


def refusal(isa: str, flags: frozenset[str] | None = None) -> str:
    """Why ``isa`` cannot be timed here ("" where it can): unknown, absent from the CPU's ``flags`` (this CPU's
    by default), no loop built, or refused by the C code's own check of the CPU and the OS."""
    from .machine import cpu_flags

    spec = ISAS.get(isa)
    if spec is None:
        return f"unknown instruction set {isa!r} (known: {', '.join(ISAS)})"
    flags = cpu_flags() if flags is None else flags
    missing = [f for f in spec.flags if f not in flags]
    if flags and missing:  # no flags at all (not Linux): the C code's own check decides
        return f"the CPU has no {', '.join(missing)}"
    lib, why = library()
    if lib is None:
        return f"not measured: {why}"
    code = lib.specviz_int8_peak_supported(spec.code)
    return "" if code == 0 else _CODES.get(code, f"code {code}")


def measure(isa: str, threads: int = 1, reps: int = REPS, macs: int = MACS_PER_RUN) -> float:
    """Multiply-adds per second of ``isa``'s loop on ``threads`` threads together (the fastest of ``reps`` runs of
    ``macs`` a thread); :class:`Refused` where it cannot run here (:func:`refusal`)."""
    why = refusal(isa)
    if why:
        raise Refused(f"{isa}: {why}")
    spec, lib = ISAS[isa], library()[0]
    assert lib is not None  # refusal() said it is built
    iters = max(1, macs // spec.macs_per_round)
    best, t0 = 0.0, time.perf_counter()
    for rep in range(reps):
        rate = lib.specviz_int8_peak(spec.code, iters, threads)  # ctypes lets go of the GIL meanwhile
        if rate < 0:
            raise Refused(f"{isa}: {_CODES.get(int(rate), f'code {rate}')}")
        best = max(best, rate)
        if rep and time.perf_counter() - t0 > BUDGET_S:  # a slow CPU, or a busy one: enough
            break
    return best


def measure_peaks(threads: int, isas: tuple[str, ...] = tuple(ISAS)) -> dict:
    """The probe's record of the peaks: {"threads", "gmacs": {isa: {"1": GMAC/s, str(threads): GMAC/s}},
    "absent": {isa: why}, "seconds"}, and "why" where nothing was measured (no compiler: "peak not measured")."""
    t0 = time.perf_counter()
    gmacs: dict[str, dict[str, float]] = {}
    absent: dict[str, str] = {}
    for isa in isas:
        try:
            gmacs[isa] = {str(n): round(measure(isa, n) / 1e9, 1) for n in sorted({1, max(1, threads)})}
        except Refused as e:
            absent[isa] = str(e).split(": ", 1)[1]
    record: dict = {"threads": threads, "gmacs": gmacs, "absent": absent,
                    "seconds": round(time.perf_counter() - t0, 3)}
    if not gmacs:
        lib, why = library()
        record["why"] = f"peak not measured: {why}" if lib is None else "peak not measured: no loop for this CPU"
    return record


def kernel_isa(isa_flags: tuple[str, ...] | list[str], gguf: bool = False) -> str | None:
    """The instruction an int8 execution's passes over several tokens (where the compute bound applies) run on a CPU
    with ``isa_flags`` (a probe's ``machine["isa"]``: an emulated AVX2 hides AVX-512): vpdpbusd on zmm where there
    is VNNI, for the GGUF's Q4_K / Q6_K kernels (``gguf``: two tokens a register) and int8 rows (fbgemm's) alike;
    the vpmaddubsw path on AVX2.  None for int8 rows on AVX-512 without VNNI (fbgemm's 512-bit vpmaddubsw: not
    timed here), where the GGUF's kernels run their AVX2 form."""
    flags = set(isa_flags)
    if "avx512_vnni" in flags:
        return "avx512_vnni_512"
    return None if "avx512f" in flags and not gguf else "avx2"


def kernel_peak(record: dict | None, threads: int | None = None, isa_flags: tuple[str, ...] | list[str] | None = None,
                gguf: bool = False) -> tuple[str, float] | None:
    """(isa, GMAC/s) on ``threads`` (the record's own count by default): the peak of the instruction an int8
    execution's products run on this machine (:func:`kernel_isa`; without ``isa_flags``, the fastest of
    :data:`KERNEL_ISAS`); None where the record has no figure for it."""
    if not isinstance(record, dict) or not isinstance(record.get("gmacs"), dict):
        return None
    n = str(threads or record.get("threads") or 1)
    usable = KERNEL_ISAS if isa_flags is None else (kernel_isa(isa_flags, gguf),)
    figures = [(isa, float(c[n])) for isa, c in record["gmacs"].items()
               if isa in usable and isinstance(c, dict) and isinstance(c.get(n), (int, float)) and c[n] > 0]
    return max(figures, key=lambda f: f[1]) if figures else None


def words(isa: str) -> str:
    spec = ISAS.get(isa)
    return spec.words if spec else isa


def main(argv: list[str] | None = None) -> int:
    """python -m specviz.hardware.peak [--threads N]: this CPU's int8 multiply-add peaks, per instruction set, on
    one thread and on N (torch's threads, the probe's, by default), and the other work the machine ran meanwhile."""
    import argparse
    import json

    from ..models.busy import Watch

    ap = argparse.ArgumentParser(prog="python -m specviz.hardware.peak", description=(
        "This CPU's int8 multiply-add peaks (GMAC/s) per instruction set, on one thread and on N, as the probe "
        "records them, with the other processes' CPU seen meanwhile (load: cores' worth)."))
    ap.add_argument("--threads", type=int, default=None, help="threads beside one (default: torch's, the probe's)")
    args = ap.parse_args(argv)
    if args.threads is None:
        import torch

        args.threads = torch.get_num_threads()
    watch = Watch()
    record = measure_peaks(args.threads)
    record["load"] = watch.reading()  # other processes' CPU over the measurement (cores' worth)
    print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["ISAS", "KERNEL_ISAS", "Refused", "kernel_isa", "kernel_peak", "measure", "measure_peaks", "refusal",
           "words"]
