"""How close the target run from its GGUF's blocks is to gguf-py's float32 model: next-token distributions, all layers.

The target as the app runs it (specviz.models.gguf_native: Q4_K/Q6_K blocks as stored, activations quantized to int8
per block of 256, as llama.cpp does) against transformers' Qwen2 in float32 holding gguf-py's dequantized values
(the C dequantizer's, equal to them bit for bit), on chat prompts: the total-variation distance of the two
next-token distributions at every position, and whether their argmax agrees.  The first position is reported
apart: its activations are huge (an attention sink) and int8 per-block quantization flattens them; its logits
predict a token of the prompt, never a generated one.  Needs ~10 GB of memory (the float32 target is 6 GB).

    python scripts/gguf_fidelity.py --json docs/benchmarks/data/gguf-fidelity-<cpu>.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specviz.hardware.machine import cpu_flags, cpu_name  # noqa: E402
from specviz.models import DEFAULT_PRESET, PRESETS, encode_prompt, gguf_convert, gguf_dequant, gguf_native, lean  # noqa: E402
from specviz.models.convert import offline_pack  # noqa: E402

PROMPTS = ("Write a Python function that returns the n-th Fibonacci number.",
           "Explain what a hash map is to a beginner, in three sentences.",
           "Translate into French: The cache is empty, so the first start takes longer.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    import transformers

    pack = offline_pack(PRESETS[DEFAULT_PRESET].target)
    gguf = gguf_native.read(pack)
    tokenizer = gguf_native.tokenizer_of(gguf.metadata, pack.display)
    shim = type("Pair", (), {"tokenizer": tokenizer})()
    prompts = [encode_prompt(shim, p) for p in PROMPTS]
    native = gguf_native.build(gguf, pack.extra_eos)
    steps = lean.attach(native, trace=False, invariant=True)
    ours = [steps.for_run(len(ids) + 1).forward(ids, len(ids))[0].float() for ids in prompts]
    del native, steps
    config = gguf_convert.model_config(gguf.metadata, torch.float32, "output.weight" not in gguf.tensors)
    state = {}
    for name, info in gguf.tensors.items():
        raw = gguf.raw(name)
        state[gguf_convert.hf_name(name)] = (
            torch.from_numpy(np.array(raw).view(np.float32).reshape(info.shape)) if info.ggml_type == 0
            else gguf_dequant.dequantize(raw, info.ggml_type, info.shape, torch.float32))
    with torch.device("meta"):
        ref = transformers.Qwen2ForCausalLM(config)
    ref.load_state_dict(state, strict=False, assign=True)
    ref.model.rotary_emb = type(ref.model.rotary_emb)(config=config)
    del state
    rows = []
    for text, ids, logits in zip(PROMPTS, prompts, ours):
        with torch.no_grad():
            expected = ref.eval()(torch.tensor([ids])).logits[0].float()
        tv = 0.5 * (torch.softmax(logits, -1) - torch.softmax(expected, -1)).abs().sum(-1)
        agree = (logits.argmax(-1) == expected.argmax(-1)).float()
        rows.append({"prompt": text, "positions": len(ids), "tv_first": round(float(tv[0]), 4),
                     "tv_mean": round(float(tv[1:].mean()), 4), "tv_max": round(float(tv[1:].max()), 4),
                     "argmax_agree": round(float(agree[1:].mean()), 4), "last_argmax_agrees": bool(agree[-1])})
        print(f"{text[:50]!r}: TV mean {rows[-1]['tv_mean']:.3f}, max {rows[-1]['tv_max']:.3f} (positions 2..), "
              f"first {rows[-1]['tv_first']:.3f}; argmax agrees {rows[-1]['argmax_agree']:.0%}", flush=True)
    cpu = f"{cpu_name()} ({', '.join(sorted(cpu_flags() & {'avx2', 'avx512_vnni', 'amx_int8'}))}, {os.cpu_count()} cores)"
    doc = {"cpu": cpu, "target": pack.display, "layers": config.num_hidden_layers, "prompts": rows}
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
