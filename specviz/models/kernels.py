"""specviz's own CPU kernel for the batch-invariant int8 linears (``csrc/int8_small.cpp``), built on first use.

fbgemm's int8 product needs its weights packed into its own layout first: ~13 ns a weight on a core, ~20 s
for the 1.5B target on the AVX2 EPYC, at every start (the layout cannot be stored).  ``int8_small`` reads
the int8 weights as they are (blocked 4 rows by 32 columns, 0.3 ns a weight) with exact integer sums, so a
token's output does not depend on the batch, and fbgemm's float epilogue, so it is fbgemm's to the bit.
Measured on the AVX2 EPYC (2026-11-26): as fast as fbgemm on the wide products and faster on the deep
ones (down_proj from memory, one token: 0.9 ms against 1.2), the 1.5B target's step 122-132 ms against
138, and the pair loads in 10.5 s instead of 24.5 s.  Like fbgemm's, its verify pass is compute-bound on
a CPU without VNNI (three instructions per 32 multiply-adds).  ``int8_linear`` does a TokenInt8Linear's
whole product in that call -- row scale, quantization, product, scale back, bias -- where Python took ten
ops (:meth:`Weights.linear`): the target's step 110 -> 95 ms, the draft's 46 -> 33 ms on that EPYC.

It is compiled with the machine's compiler by :func:`torch.utils.cpp_extension.load` the first time it is
asked for, against torch's stable C ABI alone (``csrc/specviz_torch.h``; the ATen headers took 31 s of a 2-core
AMD EPYC Zen 5's wall time, these 10 s; the build is cached under the specviz cache) and used where the CPU has AVX2
and, if it has AVX-512, VNNI too (the Q4_K / Q6_K products then run their VNNI form), and a check on random
weights gives fbgemm's bits (:func:`matches`).  On an AVX-512 CPU int8 rows stay on fbgemm, whose VNNI
kernels are the faster ones there (:func:`int8_rows`).  Anywhere else -- no compiler, an ARM CPU, AVX-512
without VNNI, ``SPECVIZ_KERNEL=0`` -- the linears run on fbgemm as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import warnings
from pathlib import Path

import torch

log = logging.getLogger("specviz.models")

# fbgemm's linear with a *fixed* activation quantization (fp32 in, fp32 out): each token, divided by its
# own max |x|, lies in [-1, 1] and is quantized as round(63 x) + 64, i.e. into 1..127.  Seven bits, as
# fbgemm's dynamic linear uses with reduce_range: AVX2 without VNNI multiplies u8 by s8 in pairs
# summed into int16 (vpmaddubsw), and 2 x 127 x 128 still fits where 2 x 255 x 128 would saturate.
_STATIC_LINEAR = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32
ACT_SCALE, ACT_ZERO = 1.0 / 63.0, 64

SOURCE = Path(__file__).with_name("csrc") / "int8_small.cpp"
# one library: the int8 kernel, GGUF's Q4_K and Q6_K ones (.q4k, .q6k) and the lean decoder's small ops (.lean: glue)
SOURCES = (SOURCE, SOURCE.with_name("q4k.cpp"), SOURCE.with_name("q6k.cpp"), SOURCE.with_name("glue.cpp"))
HEADERS = (SOURCE.with_name("q4k.h"), SOURCE.with_name("specviz_torch.h"))  # included by the sources: copied and hashed with them
_LOCK = threading.Lock()
_STATE: dict[str, object] = {}


def _cpu_flags() -> set[str]:
    try:
        return set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return set()


VNNI = frozenset({"avx512_vnni", "avx512vl", "avx512bw"})  # what the Q4_K / Q6_K kernels' VNNI form needs


def _why_not(flags: set[str]) -> str:
    """Why the kernel is not for this CPU ("" when it is).  On an AVX-512 CPU with VNNI the GGUF products run
    their VNNI form: on the 2-core AMX Xeon (2026-11-28), per product from memory against fbgemm's int8 rows of
    the same matrix, one token 2.0-2.7x faster (gate/up 0.70 ms against 1.35; down 0.27 against 0.74), four
    1.5-2.2x, eight 1.2-1.4x (a prompt's 29 tokens 1.6x slower: compute-bound).  Without VNNI (Skylake-SP)
    nothing was measured, so fbgemm's AVX-512 kernels stay there."""
    if "avx2" not in flags:
        return "the CPU has no AVX2"
    if "avx512f" in flags and not VNNI <= flags:
        return "the CPU has AVX-512 without VNNI, where fbgemm's own kernels are the faster ones"
    return ""


def int8_rows(*, built: bool = False) -> bool:
    """Whether int8 rows (:class:`..int8_target.TokenInt8Linear`) run on ``int8_small`` rather than fbgemm:
    where the kernel is in use (``built``: and built already, nothing built now: :func:`ready`) and the CPU
    has no AVX-512.  On the AMX Xeon fbgemm's AVX-512 VNNI rows measured 1.2-2x faster than ``int8_small``'s
    AVX2 (one token: gate/up 1.48 ms against 2.77, down 0.79 against 1.42): the same bits, so fbgemm there.
    ``set_enabled(True)`` (the kernel's tests) puts them on it anywhere it is correct."""
    with _LOCK:
        forced = _STATE.get("forced")
    if forced is None and "avx512f" in _cpu_flags():
        return False
    return ready() if built else matches()


def source_digest() -> str:
    """The kernels' source text, hashed: another text is another build (and other measured curves: the probe)."""
    import hashlib

    return hashlib.sha256(b"".join(src.read_bytes() for src in SOURCES + HEADERS)).hexdigest()[:12]


def _build_dir() -> Path:
    """One build per torch version and source text: checkouts with the same source share it (the source is
    copied in, so the build never depends on where a checkout lies or when git touched its file)."""
    from .cache_paths import cache_dir  # the specviz cache ($SPECVIZ_CACHE or platformdirs)

    return Path(cache_dir()) / "kernels" / f"torch-{torch.__version__}-{source_digest()}"


def ready() -> bool:
    """Whether the kernel is in use here without building it now: checked already, or built by an
    earlier process (loading the built library takes ~0.1 s; building it, ~10 s on 2 cores)."""
    with _LOCK:
        if "matches" in _STATE:
            return bool(_STATE["matches"])
    if not (_build_dir() / "specviz_int8_small.so").exists():
        return False
    return matches()


def _build():
    if "op" in _STATE:  # built and loaded once per process, whoever asked first
        return _STATE["op"]
    from torch.utils.cpp_extension import load

    where = _build_dir()
    where.mkdir(parents=True, exist_ok=True)
    for src in SOURCES + HEADERS:
        source = where / src.name
        if not source.exists() or source.read_bytes() != src.read_bytes():
            tmp = where / f".{src.name}.{os.getpid()}"
            tmp.write_bytes(src.read_bytes())
            tmp.replace(source)  # atomic: a process building beside this one never reads half a file
    with _build_lock(where):
        import time

        built = (where / "specviz_int8_small.so").exists()
        t0 = time.perf_counter()
        if not built:
            log.info("building specviz's kernel (a first start; the C++ compiler runs once) in %s", where)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            load(name="specviz_int8_small", sources=[str(where / src.name) for src in SOURCES],
                 build_directory=str(where),
                 is_python_module=False, extra_ldflags=["-fopenmp"], verbose=False,
                 extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp", "-ffp-contract=off", "-fvisibility=hidden"])
        if not built:
            log.info("specviz's kernel built in %.1f s", time.perf_counter() - t0)
    _STATE["op"] = torch.ops.specviz.int8_small
    return _STATE["op"]


BUILD_WAIT_S = 300.0  # another process's build (~10 s; a minute or more on a busy machine) is waited for this long


@contextlib.contextmanager
def _build_lock(where: Path, wait_s: float | None = None):
    """One build at a time across processes, with a lock the kernel releases when its holder dies.

    torch's ``load`` serialises builds with a ``lock`` file that only its holder deletes: a process killed
    mid-build (a restarted server, an interrupted test) leaves it, and every later ``load`` waits on it
    forever -- the app hung at start.  Here an ``flock`` on ``build.lock`` decides who builds; whoever
    holds it knows any ``lock`` file left is stale and removes it.  Waiting longer than ``wait_s`` for
    another build raises :class:`TimeoutError` (the caller runs fbgemm instead)."""
    import fcntl
    import time

    wait_s = BUILD_WAIT_S if wait_s is None else wait_s
    with open(where / "build.lock", "a+") as fh:
        start = time.monotonic()
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() - start > wait_s:
                    raise TimeoutError(f"another process held the kernel's build for over {wait_s:.0f} s") from None
                time.sleep(0.2)
        try:
            stale = where / "lock"
            if stale.exists():
                log.info("removing a kernel build lock left by a process that died mid-build: %s", stale)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def switched_off(name: str = "SPECVIZ_KERNEL") -> bool:
    """Whether the environment turns specviz's own kernels off: ``SPECVIZ_KERNEL=0`` (all of them), or the
    variable ``name`` (one of them) set to 0; spaces around the value do not count."""
    return any(os.environ.get(var, "1").strip() == "0" for var in {"SPECVIZ_KERNEL", name})


def module(*, policy: bool = True):
    """The compiled operator (``torch.ops.specviz.int8_small``), or None where it cannot be had here (the
    reason is logged once).  ``policy=False``: built wherever AVX2 is, even where fbgemm is preferred (an
    AVX-512 CPU) or ``SPECVIZ_KERNEL=0`` -- what its tests check on any x86 machine."""
    key = "module" if policy else "module_any"
    with _LOCK:
        if key not in _STATE:
            mod, flags = None, _cpu_flags()
            if policy and switched_off():
                why = "SPECVIZ_KERNEL=0"
            elif policy:
                why = _why_not(flags)
            else:  # correct wherever AVX2 is, preferred or not
                why = "" if "avx2" in flags else "the CPU has no AVX2"
            if not why:
                try:
                    mod = _build()
                except Exception as exc:  # noqa: BLE001 -- no compiler, headers, ...: fbgemm it is
                    why = f"it could not be built ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})"
            if mod is None and policy:
                log.info("int8 linears run on fbgemm: %s", why)
            _STATE[key] = mod
        return _STATE[key]


def glue_ready() -> bool:
    """Whether the lean decoder runs its small ops as specviz's own (csrc/glue.cpp): where the kernel is in use
    (:func:`ready`: built and checked, nothing built now) and not turned off (``SPECVIZ_GLUE=0``)."""
    return os.environ.get("SPECVIZ_GLUE", "1") != "0" and ready() and hasattr(torch.ops.specviz, "glue_attend")


def matches(*, policy: bool = True) -> bool:
    """Whether the kernel is here and gives fbgemm's bits (random weights, 1 to 40 tokens; once per process).
    ``policy=False``: whether it is correct here, wherever it can be built (:func:`module`)."""
    with _LOCK:
        if policy and "matches" in _STATE:
            return bool(_STATE["matches"])
    op = module(policy=policy)
    ok = False
    if op is not None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                gen = torch.Generator().manual_seed(0)
                values = torch.randint(-128, 128, (70, 200), dtype=torch.int8, generator=gen)
                scales = torch.rand(70, generator=gen, dtype=torch.float64) / 100 + 1e-4
                packed = torch.ops.quantized.linear_prepack(torch._make_per_channel_quantized_tensor(
                    values, scales, torch.zeros(70, dtype=torch.long), 0), None)
                weights = Weights.of(values, scales)
                ok = True
                bias = torch.randn(70, generator=gen)
                for m in (1, 2, 3, 6, 40):
                    rows = torch.rand(m, 200, generator=gen) * 2 - 1
                    ok &= torch.equal(_STATIC_LINEAR(rows, ACT_SCALE, ACT_ZERO, packed), weights.product(rows))
                    # the whole linear in one call against its ops one at a time (TokenInt8Linear's path)
                    rows = rows * torch.rand(m, 1, generator=gen) * 20
                    scale = rows.abs().amax(-1, keepdim=True).clamp_(min=1e-30)
                    plain = _STATIC_LINEAR(rows / scale, ACT_SCALE, ACT_ZERO, packed).mul_(scale)
                    ok &= torch.equal(plain, weights.linear(rows))
                    ok &= torch.equal(plain.add_(bias), weights.linear(rows, bias))
        except Exception as exc:  # noqa: BLE001
            log.info("int8 linears run on fbgemm: the kernel failed its check (%s)", exc)
            ok = False
        if not ok:
            log.info("int8 linears run on fbgemm: the kernel does not give fbgemm's bits here")
    if policy:
        with _LOCK:
            _STATE["matches"] = ok
    return ok


class Weights:
    """One int8 linear's weights in the kernel's form: the int8 values blocked 4 rows by 32 columns
    ([out/4, in/32, 4, 32], zero-padded: one sequential stream per block of rows; ~0.2 ns a weight to
    make, against fbgemm's ~13 ns), each row's sum and float32 scale, and the float64 scales the values
    were quantized with.  :meth:`values` gives the [out, in] int8 values back (the learned head reads them)."""

    __slots__ = ("blocked", "scales", "wsum", "wscale", "shape")

    def __init__(self, blocked: torch.Tensor, scales: torch.Tensor, wsum: torch.Tensor, wscale: torch.Tensor,
                 shape: tuple[int, int]):
        self.blocked, self.scales, self.wsum, self.wscale, self.shape = blocked, scales, wsum, wscale, shape

    @classmethod
    def of(cls, values: torch.Tensor, scales: torch.Tensor) -> "Weights":
        n, k = values.shape
        # the kernel's own op (loaded: Weights are made only where it runs): blocks and row sums in one pass,
        # ~0.3 s for the 1.5B target on the AVX2 EPYC where torch took ~3 s (its int8 row sum is not vectorised)
        blocked, wsum = torch.ops.specviz.weight_layout(values)
        # scales cloned: a cached load's tensors are views of the mapped file, which one kept view keeps
        # mapped (and counted in the process's RSS) for good.
        return cls(blocked, scales.clone(), wsum, scales.to(torch.float32), (n, k))

    @property
    def values(self) -> torch.Tensor:
        n, k = self.shape
        b = self.blocked
        return b.transpose(1, 2).reshape(b.shape[0] * 4, b.shape[1] * 32)[:n, :k]

    def product(self, unit_rows: torch.Tensor) -> torch.Tensor:
        """What fbgemm's static-input linear gives for rows in [-1, 1] (fp32 in and out), to the bit."""
        qx = torch.quantize_per_tensor(unit_rows, ACT_SCALE, ACT_ZERO, torch.quint8).int_repr()
        pad = self.blocked.shape[1] * 32 - qx.shape[1]
        if pad:
            qx = torch.nn.functional.pad(qx, (0, pad))
        return torch.ops.specviz.int8_small(qx, self.blocked, self.wsum, self.wscale, ACT_SCALE, ACT_ZERO)

    def linear(self, rows: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """TokenInt8Linear's whole product for float32 rows [M, K] -- each row scaled by its max |x|, quantized,
        multiplied, scaled back, the bias added -- in one call (``int8_linear``), the same bits as those
        steps taken one op at a time (tested; checked at load by :func:`matches`)."""
        return torch.ops.specviz.int8_linear(rows, self.blocked, self.wsum, self.wscale, ACT_SCALE, ACT_ZERO, bias)


def set_enabled(on: bool | None) -> None:
    """Use the kernel where it matches (None: decide again, by this machine's policy), always where it is
    correct here (True: its tests, on any x86 CPU), or not at all (False: fbgemm and onednn, as without it)."""
    ok = matches(policy=False) if on else False
    with _LOCK:
        if on is None:
            _STATE.pop("matches", None)
            _STATE.pop("forced", None)
        else:
            _STATE["matches"] = ok
            _STATE["forced"] = ok  # int8 rows too, whatever the CPU (int8_rows)
