"""Write a machine's verify-cost curve from recorded traces (the rounds' own timings).

    python scripts/hardware_from_traces.py assets/traces/*.json --out xeon-amx-recorded.json \
        --machine "Intel(R) Xeon(R) Processor, AMX, 2 threads" --isa amx_bf16,avx512f,avx2

The shipped recordings were made on a 2-core Xeon with AMX; their speculative rounds time verify
passes over k tokens (k = drafted + 1) and their standard runs time one-token steps, so the medians
give that machine's curve T(k) without running anything there.  Only k with at least --min rounds
are kept; the first pass of each run (which also read the prompt) is left out.  Its output was the
Xeon's row in assets/hardware/ until the probe ran on such a Xeon (2026-11-25, xeon-amx.json: bf16
175 ms at 1 token, within 7% of these medians); a file written there is shown on the page.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--machine", required=True)
    ap.add_argument("--isa", default="")
    ap.add_argument("--min", type=int, default=3)
    args = ap.parse_args()
    verify, steps, draft = defaultdict(list), [], []
    models = {}
    for path in args.traces:
        doc = json.loads(path.read_text())
        spec, std = doc["speculative"], doc["standard"]
        if spec["settings"].get("drafter", "model") != "model":
            continue
        models = spec["models"]
        for r in spec["rounds"]:
            if not r.get("prompt_fed"):
                verify[len(r["draft"]) + 1].append(1000 * r["t_verify"])
                if r["draft_forwards"]:
                    draft.append(1000 * r["t_draft"] / r["draft_forwards"])
        steps += [1000 * r["t_verify"] for r in std["rounds"] if not r.get("prompt_fed")]
    curve = {1: statistics.median(steps)} | {k: statistics.median(v) for k, v in sorted(verify.items())
                                               if k > 1 and len(v) >= args.min}
    exec_name = {"bfloat16": "bf16", "float32": "fp32"}.get(models.get("dtype"), models.get("dtype"))
    doc = {"machine": {"kind": "cpu", "name": args.machine, "isa": [f for f in args.isa.split(",") if f],
                       "label": args.machine},
           "model": models.get("target"), "target": models.get("target"), "draft": models.get("draft"),
           "draft_exec": models.get("draft_quant"), "curves": {exec_name: {str(k): round(v, 1) for k, v in curve.items()}},
           "draft_ms": round(statistics.median(draft), 1), "alpha": 0.8, "choice": exec_name, "measured": True,
           "note": f"medians of {len(steps)} one-token steps and {sum(len(v) for v in verify.values())} verify "
                   f"passes of the shipped recordings ({', '.join(p.name for p in args.traces)})"}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
