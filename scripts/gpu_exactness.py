"""Where greedy speculative decoding leaves standard decoding on a GPU, and why (random weights, real configs).

    python scripts/gpu_exactness.py TOKENIZER_DIR [--out FILE]

For a random 0.5B draft and 1.5B target (Qwen2.5 configurations) in bf16 and in fp32, eager and with
CUDA graphs over the static cache (``--modes eager,graph``; ``--dtypes`` adds float16): the
first token where the greedy speculative run and the standard run differ, and the target's top-2
logit margin there, read from the standard run's own one-token step and from a verify-style pass
over the same prefix -- a margin of a few bf16 ulps means the two kernels' rounding decided it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specviz.core.engine import speculative_decode, standard_decode  # noqa: E402
from specviz.core.settings import DecodeSettings  # noqa: E402
from specviz.drafters import make_drafter  # noqa: E402
from specviz.hardware.gpu_report import ENGINE_PROMPT, KS, random_model  # noqa: E402
from specviz.models.compiled import attach, detach  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("tokenizer")
    ap.add_argument("--out", default="gpu_exactness.json")
    ap.add_argument("--modes", default="eager", help="comma-separated: eager, graph")
    ap.add_argument("--dtypes", default="bfloat16,float32", help="comma-separated: bfloat16, float16, float32")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    prompt = tok("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n" * 3).input_ids[:ENGINE_PROMPT]
    dev = torch.device("cuda")
    rows = []
    for dtype, mode in [(d, m) for d in (getattr(torch, n) for n in args.dtypes.split(",")) for m in args.modes.split(",")]:
        draft, target = random_model("0.5B", dev, dtype), random_model("1.5B", dev, dtype)
        if mode != "eager":
            for m in (draft, target):
                attach(m, 512, compile=True, mode=mode, warm=KS)
        pair = SimpleNamespace(draft=draft, target=target, tokenizer=tok, device=dev, eos_token_ids=[],
                               draft_name="random 0.5B", target_name="random 1.5B", preset="gpu-exactness",
                               dtype=dtype, draft_quant=None, probe=None)
        s = DecodeSettings(gamma=5, temperature=0.0, max_new_tokens=64)
        a = [t.id for t in speculative_decode(pair, prompt, s, drafter=make_drafter(pair, s)).tokens]
        b = [t.id for t in standard_decode(pair, prompt, s).tokens]
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        for m in (draft, target):
            detach(m)
        row = {"dtype": str(dtype).replace("torch.", ""), "mode": mode, "equal": a == b, "first_difference": first, "tokens": len(b)}
        if first is not None:
            with torch.inference_mode():
                ids = torch.tensor([prompt + b[:first]], device=dev)
                logits = target(input_ids=ids).logits[0, -1].float()
                top = torch.topk(logits, 2)
                row["margin_top2"] = round(float(top.values[0] - top.values[1]), 6)
                row["top2_ids"] = [int(i) for i in top.indices]
                row["spec_token"], row["std_token"] = a[first], b[first]
        print(json.dumps(row), flush=True)
        rows.append(row)
        del draft, target, pair
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__,
                                          "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
