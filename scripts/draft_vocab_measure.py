"""Measure the draft's reduced vocabulary (specviz.models.draft_vocab) on the default pair.

    python scripts/draft_vocab_measure.py [--json out.json] [--steps 24]

Prints (and writes) the int8 draft's one-token step through its lean, traced path with the full head,
the reduced head, and the reduced head plus a prompt's ids (median ms over one-token feeds after each
of the six prompts of assets/prompts.jsonl, the modes interleaved); the head alone at K = 8k / 16k /
32k / 64k kept rows and the full 151,936 (median of 200 calls); and the target's one-token step
(standard decoding's steps), so c = draft step / target step.  Acceptance and end-to-end tokens/s come
from the bench: ``python -m specviz.cli.bench --draft-vocab both --repeats 2``.  Run it on an idle
machine: every figure is a timing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import specviz.hardware  # noqa: F401,E402  (installs the probe: load_pair's "auto" execution)
from specviz.cli.bench import DEFAULT_PROMPTS, read_prompts  # noqa: E402
from specviz.core.engine import standard_decode  # noqa: E402
from specviz.core.settings import DecodeSettings  # noqa: E402
from specviz.models import draft_vocab as DV  # noqa: E402
from specviz.models import encode_prompt  # noqa: E402
from specviz.serving.service import default_preset, get_pair  # noqa: E402


def median_ms(times: list[float]) -> float:
    return round(1000 * statistics.median(times), 2)


@torch.inference_mode()
def draft_steps(pair, prompts: list[list[int]], steps: int) -> dict[str, float]:
    """One-token feeds of the lean draft after each prompt, greedy, per head mode (interleaved)."""
    lean = pair.draft._specviz_steps
    times: dict[str, list[float]] = {"full": [], "reduced": [], "reduced+prompt": []}
    for ids in prompts:
        for mode in times:
            DV.set_mode(pair, "full" if mode == "full" else "reduced")
            head = DV.reduced_head(pair.draft)
            if head is not None:
                head.prepare(ids if mode == "reduced+prompt" else [])
            lean.set_length(0)
            logits, _ = lean.forward(ids, 1)
            for _ in range(steps):
                tok = int(logits[-1].argmax())
                t0 = time.perf_counter()
                logits, _ = lean.forward([tok], 1)
                times[mode].append(time.perf_counter() - t0)
    lean.set_length(0)
    return {mode: median_ms(ts) for mode, ts in times.items()}


@torch.inference_mode()
def head_by_size(pair, sizes: list[int], calls: int = 200) -> dict[str, float]:
    full = DV.full_head(pair.draft)
    x = torch.randn(1, full.in_features)
    heads = {str(k): DV.ReducedHead(full, DV.DraftVocab(tuple(range(k)), full.out_features)) for k in sizes}
    heads[f"{full.out_features} (full)"] = full
    out = {}
    for name, head in heads.items():
        for _ in range(10):
            head(x)
        ts = []
        for _ in range(calls):
            t0 = time.perf_counter()
            head(x)
            ts.append(time.perf_counter() - t0)
        out[name] = median_ms(ts)
    return out


def target_step_ms(pair, prompts: list[list[int]]) -> float:
    steps = []
    for ids in prompts:
        trace = standard_decode(pair, ids, DecodeSettings(temperature=0.0, max_new_tokens=24))
        steps += [r.t_verify for r in trace.rounds if not r.prompt_fed]
    return median_ms(steps)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--steps", type=int, default=24, help="one-token feeds per prompt and mode")
    args = ap.parse_args()
    t0 = time.perf_counter()
    pair = get_pair(default_preset())
    print(f"loaded in {time.perf_counter() - t0:.0f} s; threads {torch.get_num_threads()}; target {pair.target_exec}",
          file=sys.stderr)
    prompts = [encode_prompt(pair, r["prompt"], chat=bool(r.get("chat", True))) for r in read_prompts(DEFAULT_PROMPTS)]
    vocab = DV.available(pair)
    if vocab is None:
        raise SystemExit("no reduced vocabulary applies to this pair")
    draft = draft_steps(pair, prompts, args.steps)
    heads = head_by_size(pair, [8192, 16384, 32768, 65536])
    target = target_step_ms(pair, prompts)
    DV.set_mode(pair, "full")
    result = {"draft_step_ms": draft, "head_ms_by_rows": heads, "target_step_ms": target,
              "c": {mode: round(ms / target, 3) for mode, ms in draft.items()},
              "kept": vocab.size, "coverage": vocab.provenance.get("coverage"),
              "threads": torch.get_num_threads(),
              "machine": pair.probe.machine if pair.probe else None, "torch": torch.__version__}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
