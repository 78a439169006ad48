"""The GGUF kernels alone: each kind of product in the default target (its own Q4_K / Q6_K records), over k tokens.

    python scripts/kernel_bench.py                    # k = 1 2 4 8, 9 rounds
    python scripts/kernel_bench.py --ks 1 6 --rounds 15

Loads the default pair as the server does, groups the target's products by kind (format, rows, inputs) and times each
group over all its layers in turn, so the weights stream from memory as they do in a pass: ms a product, the
minimum over the rounds (other work only ever adds time), with the multiply-adds a second and the bytes a second it
reaches.  To set two builds against each other, run it from each checkout, alternating.  Name the CPU with every
figure (it is printed).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specviz.hardware.machine import cpu_flags, cpu_name


def groups(model: torch.nn.Module) -> dict[tuple[str, int, int], list[torch.nn.Module]]:
    """The target's GGUF products by (format, outputs, inputs), in layer order."""
    from specviz.models.q4k import Q4KLinear
    from specviz.models.q6k import Q6KLinear

    out: dict[tuple[str, int, int], list[torch.nn.Module]] = defaultdict(list)
    for m in model.modules():
        if isinstance(m, Q4KLinear):
            out[("Q4_K", m.out_features, m.in_features)].append(m)
        elif isinstance(m, Q6KLinear):
            out[("Q6_K", m.records.shape[0], m.records.shape[1] * 256)].append(m)
    return dict(out)


def nbytes(m: torch.nn.Module) -> int:
    return int(m.weight.nbytes if hasattr(m, "weight") and isinstance(m.weight, torch.Tensor) else m.records.nbytes)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    from specviz.models import load_pair

    print(f"CPU: {cpu_name()} ({', '.join(sorted(cpu_flags() & {'avx2', 'avx512_vnni', 'avx512_bf16', 'amx_int8'}))}), "
          f"{torch.get_num_threads()} threads")
    pair = load_pair(target_exec="int8")
    found = groups(pair.target)
    if not found:
        print("the target runs no GGUF products here (no kernel, or SPECVIZ_Q4K=0)")
        return 1
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for (fmt, n, k_in), mods in sorted(found.items(), key=lambda g: -g[0][1] * g[0][2]):
            cells = []
            for k in args.ks:
                x = torch.randn(k, k_in, generator=gen)
                for m in mods:  # warm: first calls allocate
                    m(x)
                best = float("inf")
                for _ in range(args.rounds):
                    t0 = time.perf_counter()
                    for m in mods:
                        m(x)
                    best = min(best, (time.perf_counter() - t0) / len(mods))
                ms = 1000 * best
                cells.append(f"k={k}: {ms:6.3f} ms {k * n * k_in / ms / 1e6:5.0f} GMAC/s "
                             f"{nbytes(mods[0]) / ms / 1e6:5.1f} GB/s")
            print(f"{fmt} {n:>6} x {k_in:<5} ({len(mods):2d} a pass) | " + " | ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
