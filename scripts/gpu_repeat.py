"""Are a GPU's runs repeatable?  Greedy standard decoding (four runs) and speculative decoding (two) of a random
Qwen2.5-Coder-1.5B target (0.5B draft) with CUDA-graph steps, for each list of SDPA backends asked for.

    python scripts/gpu_repeat.py TOKENIZER_DIR [EFFICIENT_ATTENTION+MATH,CUDNN_ATTENTION,...]

Prints, per list (specviz.core.kv.CUDA_ATTENTION), the first token at which each run leaves the first (null:
equal), where the speculative text first leaves the standard one, and the target's step times (ms by feed
length).  Found cuDNN's attention unrepeatable on an H100 (docs/benchmarks/data/gpu-h100-attention-repeatability.json).
"""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers import AutoTokenizer  # noqa: E402

from specviz.core import kv  # noqa: E402
from specviz.core.engine import speculative_decode, standard_decode  # noqa: E402
from specviz.core.settings import DecodeSettings  # noqa: E402
from specviz.drafters import make_drafter  # noqa: E402
from specviz.hardware.gpu_report import ENGINE_PROMPT, KS, random_model, step_times  # noqa: E402
from specviz.models import compiled  # noqa: E402


def first_diff(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def main() -> None:
    dev = torch.device("cuda")
    tok = AutoTokenizer.from_pretrained(sys.argv[1])
    lists = sys.argv[2] if len(sys.argv) > 2 else "+".join(kv.CUDA_ATTENTION)
    prompt = tok("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n" * 3).input_ids[:ENGINE_PROMPT]
    target, draft = random_model("1.5B", dev), random_model("0.5B", dev)
    pair = SimpleNamespace(draft=draft, target=target, tokenizer=tok, device=dev, eos_token_ids=[], draft_name="0.5B",
                           target_name="1.5B", preset="gpu-repeat", dtype=torch.bfloat16, draft_quant=None)
    s = DecodeSettings(gamma=5, temperature=0.0, max_new_tokens=96)
    for backends in lists.split(","):
        kv.CUDA_ATTENTION = tuple(backends.split("+"))
        for m in (draft, target):
            compiled.detach(m)
            compiled.attach(m, 512, compile=True, mode="graph", warm=KS)
        std = [[t.id for t in standard_decode(pair, prompt, s).tokens] for _ in range(4)]
        spec = [[t.id for t in speculative_decode(pair, prompt, s, drafter=make_drafter(pair, s)).tokens]
                for _ in range(2)]
        print(json.dumps({"backends": kv.CUDA_ATTENTION, "std_first_diff": [first_diff(r, std[0]) for r in std],
                          "spec_first_diff": [first_diff(r, spec[0]) for r in spec],
                          "spec_vs_std": first_diff(spec[0], std[0]),
                          "target_ms": {k: round(v, 2) for k, v in step_times(target, reps=10).items()}}), flush=True)


if __name__ == "__main__":
    main()
