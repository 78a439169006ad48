"""Would a draft of fewer bits reach c <= 0.15 (issue 35)?  The default pair's 0.5B draft GGUF requantized by
llama.cpp to Q3_K_M, Q3_K_S and Q2_K: each file's layer bytes (what a step reads, its head aside) by tensor type,
and its greedy agreement with the 1.5B target's greedy text (α at T = 0: the draft's argmax at each of the target's
tokens, teacher-forced), llama.cpp running both, the six bench prompts (assets/prompts.jsonl) under the chat
template, 64 tokens.

    python scripts/draft_bits_llamacpp.py --json docs/benchmarks/data/draft-bits-llamacpp-xeon-amx.json

Needs llama-cpp-python (built from source: docs/executions.md; never a requirement) and the pair's GGUF files in
specviz's cache (a first load writes them).  Measured (stop 53, AMX Xeon): the 896-wide rows cannot take k-quants
(rows must be multiples of 256), so llama.cpp gives them Q4_0 / Q5_0 and only down goes to Q3_K: 188-205 MB of
layers against the shipped file's 247 (specviz's own Q4_K draft: ~201 MB), α 0.88-0.90 for all four.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specviz.models.convert import cache_dir  # noqa: E402

KINDS = ("Q3_K_M", "Q3_K_S", "Q2_K")


def layer_bytes(path: str) -> tuple[float, dict[str, float]]:
    """MB of the blk.* tensors, and by tensor type."""
    from gguf import GGUFReader

    types: collections.Counter = collections.Counter()
    for t in GGUFReader(path).tensors:
        if t.name.startswith("blk."):
            types[t.tensor_type.name] += int(t.n_bytes)
    return round(sum(types.values()) / 1e6, 1), {k: round(v / 1e6, 1) for k, v in types.most_common()}


def main() -> int:
    import llama_cpp
    from transformers import AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--work", type=Path, default=cache_dir() / "draft-bits")
    args = ap.parse_args()
    gguf_dir = cache_dir() / "gguf"
    draft = glob.glob(str(gguf_dir / "qwen2.5-coder-0.5b-*.gguf"))[0]
    target = glob.glob(str(gguf_dir / "qwen2.5-coder-1.5b-*.gguf"))[0]
    tok = AutoTokenizer.from_pretrained(glob.glob(str(cache_dir() / "models" / "qwen2.5-coder-1.5b-*"))[0])
    prompts = [json.loads(line) for line in (ROOT / "assets" / "prompts.jsonl").read_text().splitlines() if line.strip()]
    ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p["prompt"]}], add_generation_prompt=True,
                                              tokenize=False), add_special_tokens=False) for p in prompts]
    args.work.mkdir(parents=True, exist_ok=True)
    files = {"Q4_K_M (shipped GGUF)": draft}
    for kind in KINDS:
        out = args.work / f"draft-{kind}.gguf"
        if not out.exists():
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind}")
            params.allow_requantize = True
            params.nthread = os.cpu_count() or 1
            if llama_cpp.llama_model_quantize(draft.encode(), str(out).encode(), params) != 0:
                raise SystemExit(f"llama.cpp could not quantize to {kind}")
        files[kind] = str(out)
    model = llama_cpp.Llama(target, n_ctx=512, n_threads=os.cpu_count() or 1, verbose=False)
    texts = []
    for p in ids:
        model.reset()
        text: list[int] = []
        for t in model.generate(p, temp=0.0, top_k=1):
            if t == model.token_eos() or len(text) >= args.tokens:
                break
            text.append(t)
        texts.append(text)
    del model
    drafts = {}
    for name, path in files.items():
        model = llama_cpp.Llama(path, n_ctx=512, n_threads=os.cpu_count() or 1, logits_all=True, verbose=False)
        per, hits, n = [], 0, 0
        for p, text in zip(ids, texts):
            model.reset()
            model.eval(p + text[:-1])
            guess = np.array(model.scores[len(p) - 1: len(p) - 1 + len(text)]).argmax(-1)
            match = guess == np.array(text)
            per.append(round(float(match.mean()), 3))
            hits, n = hits + int(match.sum()), n + len(text)
        del model
        mb, by_type = layer_bytes(path)
        drafts[name] = {"file_bytes": os.path.getsize(path), "layers_mb": mb, "layers_by_type_mb": by_type,
                        "alpha_greedy": round(hits / n, 3), "per_prompt": per}
        print(f"{name:22s} layers {mb:6.1f} MB {by_type}  α {hits / n:.3f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"llama_cpp": llama_cpp.__version__, "drafts": drafts}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
