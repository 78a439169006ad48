"""Where a step's time goes: the default pair's target over k tokens and its draft's one-token step, op by op.

    python scripts/step_profile.py                 # target k = 1 and 8, draft k = 1
    python scripts/step_profile.py --ks 1 4 8 --reps 20

Loads the default pair as the server does (on its GGUFs' blocks), then times, on the lean steps a run uses
(traced), the passes after a 16-token prefix as the probe does (hardware.timer), and profiles them with
torch.profiler: every product (specviz's kernels), the glue ops, the head, and what is left (Python, the trace's
own dispatch).  Each product's time is set against its weights' bytes: the bandwidth each reaches, against the
copy bandwidth the probe measures (hardware.roofline).  Name the CPU with every figure (it is printed).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specviz.hardware.machine import cpu_flags, cpu_name  # noqa: E402
from specviz.hardware.timer import PREFIX  # noqa: E402


def _timed(lm, ids: list[int], k: int, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        lm.feed(ids[:PREFIX + k], keep=k)
        out.append(1000 * (time.perf_counter() - t))
        lm.crop(PREFIX)
    return out


def _product_bytes(model: torch.nn.Module) -> dict[tuple, int]:
    """Each product's record bytes by its (rows, blocks) shape: what one pass streams."""
    from specviz.models.q4k import Q4KLinear
    from specviz.models.q6k import Q6KLinear

    out: dict[tuple, int] = defaultdict(int)
    for m in model.modules():
        if isinstance(m, Q4KLinear):
            out[("q4k", tuple(m.weight.shape[:2]))] += m.weight.nbytes
        elif isinstance(m, Q6KLinear):
            out[("q6k", tuple(m.records.shape[:2]))] += m.records.nbytes
    return out


def profile(name: str, model: torch.nn.Module, vocab: int, k: int, reps: int, gbps: float | None) -> None:
    from torch.profiler import ProfilerActivity, profile as torch_profile

    from specviz.core.kv import cached_lm

    ids = torch.randint(0, vocab, (PREFIX + k,), generator=torch.Generator().manual_seed(0)).tolist()
    lm = cached_lm(model, torch.device("cpu"), PREFIX + k)
    with torch.inference_mode():
        lm.feed(ids[:PREFIX])
        _timed(lm, ids, k, 3)  # warm
        wall = _timed(lm, ids, k, reps)
        with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            _timed(lm, ids, k, reps)
    lm.free()
    step = statistics.median(wall)
    print(f"\n{name}, k = {k}: {step:.2f} ms a pass (median of {reps}; min {min(wall):.2f})")
    rows = defaultdict(lambda: [0.0, 0])
    for ev in prof.key_averages(group_by_input_shape=True):
        if ev.key.startswith("specviz::") or ev.key.startswith("aten::"):
            shape = ev.input_shapes[1] if ev.key.startswith("specviz::q") and len(ev.input_shapes) > 1 else None
            key = (ev.key, tuple(shape) if shape else ())
            rows[key][0] += ev.self_cpu_time_total / 1000 / reps
            rows[key][1] += ev.count // reps
    total = sum(v[0] for v in rows.values())
    print(f"  ops: {total:.2f} ms (the rest, {step - total:.2f} ms: the trace's dispatch and Python)")
    for (op, shape), (ms, n) in sorted(rows.items(), key=lambda r: -r[1][0])[:14]:
        extra = ""
        if shape and op.startswith("specviz::q") and len(shape) == 3:
            nbytes = shape[0] * shape[1] * shape[2] * n
            extra = f"  {nbytes / 1e6:7.1f} MB, {nbytes / 1e6 / ms:5.1f} GB/s" + \
                (f" ({nbytes / 1e6 / ms / gbps:.0%} of copy)" if gbps else "")
        print(f"  {ms:7.2f} ms  {n:4d} x  {op}{list(shape) if shape else ''}{extra}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--draft-only", action="store_true")
    args = ap.parse_args()
    from specviz.hardware.roofline import copy_bandwidth
    from specviz.models import load_pair

    print(f"CPU: {cpu_name()} ({', '.join(sorted(cpu_flags() & {'avx2', 'avx512_vnni', 'avx512_bf16', 'amx_int8'}))}), "
          f"{torch.get_num_threads()} threads")
    pair = load_pair(target_exec="int8")
    gbps = copy_bandwidth("cpu") / 1e9  # bytes read and written a second
    print(f"copy bandwidth {gbps:.1f} GB/s; target runs as {pair.target_exec}")
    vocab = pair.vocab_size
    profile("draft", pair.draft, vocab, 1, args.reps, gbps)
    if not args.draft_only:
        for k in args.ks:
            profile("target", pair.target, vocab, k, args.reps, gbps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
