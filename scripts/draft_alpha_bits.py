"""How few bytes can the 0.5B draft read and keep its acceptance (issue 35's c <= 0.15)?  The draft's layer
matrices fake-quantized to b bits in groups of g (float32 scale and minimum per group: the best case of any packing
with those bits), or some of its layers dropped, and its greedy agreement with the 1.5B target's greedy text
(α at T = 0: the draft's argmax at each of the target's tokens, teacher-forced), the six bench prompts
(assets/prompts.jsonl) under the chat template, 64 tokens, transformers in float32.  Beside each: the bits a weight
would cost packed with 6-bit scales and minima per group and two float32 per 256 (Q4_K's layout), the layers' MB
at that, and the least c those bytes allow against the Q4_K target's 1,018 MB a step (with a 16,384-row Q4_K head).

    python scripts/draft_alpha_bits.py --json docs/benchmarks/data/draft-alpha-bits-xeon-amx.json

Measured (stop 54, AMX Xeon): 4 bits in 32s and 3 bits in 16s keep α (0.879, 0.895 against the float 0.879);
3 bits in 32s or symmetric lose 3 points, 2 bits 13-43; dropping one layer of 24 keeps it, three lose 5 points,
four to seven 9-44.  The least c by bytes of any variant that keeps α is 0.19 (3 bits in 16s): a draft model of this
size cannot reach c <= 0.15 here without giving up acceptance.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specviz.models.convert import cache_dir  # noqa: E402

TARGET_MB = 1018.0  # the Q4_K target's bytes a step (docs/benchmarks.md, the probe's bound)
HEAD_MB = 16_384 * 4 * 152 / 1e6  # the reduced head's Q4_K records (specviz's 152-byte blocks of 256)
GROUPED = [(4, 32, False), (3, 16, False), (3, 16, True), (3, 32, False), (2, 16, False), (2, 32, False)]
DROPPED = [[12], [20], [6, 12, 18], [11, 12, 13, 14], [4, 8, 12, 16, 20], [14, 16, 18, 20], [2, 5, 8, 11, 14, 17, 20]]


def fake_quant(w: torch.Tensor, bits: int, group: int, symmetric: bool) -> torch.Tensor:
    """w [N, K] rounded to ``bits`` in groups of ``group`` along K (the last group zero-padded), float32
    scale (and minimum, min(w, 0) as Q4_K keeps it) per group."""
    n, k = w.shape
    x = torch.nn.functional.pad(w, (0, (-k) % group)).reshape(n, -1, group)
    if symmetric:
        half = 2 ** (bits - 1)
        step = (x.abs().amax(-1, keepdim=True) / half).clamp(min=1e-12)
        y = torch.round(x / step).clamp(-half, half - 1) * step
    else:
        low = x.amin(-1, keepdim=True).clamp(max=0)
        step = ((x.amax(-1, keepdim=True) - low) / (2 ** bits - 1)).clamp(min=1e-12)
        y = torch.round((x - low) / step).clamp(0, 2 ** bits - 1) * step + low
    return y.reshape(n, -1)[:, :k]


def machine() -> str:
    """The CPU's name and the features that pick specviz's kernels (every figure names its machine)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    name = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    flags = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16") if f" {f}" in text]
    return f"{name} ({', '.join(flags)})"


def packed_bits(bits: int, group: int) -> float:
    """Bits a weight costs with 6-bit scale and minimum per group and two float32 per 256."""
    return bits + 12 / group + 64 / 256


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the table here")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--draft", type=Path, help="the draft's checkpoint folder (default: the default pair's, cached)")
    ap.add_argument("--target", type=Path, help="the target's checkpoint folder (default: the default pair's, cached)")
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    models = cache_dir() / "models"  # the default pair's converted checkpoints (a first load of the app writes them)
    draft_dir = args.draft or next(iter(sorted(models.glob("qwen2.5-coder-0.5b-*"))), None)
    target_dir = args.target or next(iter(sorted(models.glob("qwen2.5-coder-1.5b-*"))), None)
    if draft_dir is None or target_dir is None:
        sys.exit(f"no converted default pair under {models}: start the app once (python app.py), or pass --draft/--target")
    tok = AutoTokenizer.from_pretrained(target_dir)
    prompts = [json.loads(line)["prompt"] for line in (ROOT / "assets" / "prompts.jsonl").open()]
    ids = []
    for p in prompts:
        enc = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)
        ids.append(list(enc["input_ids"] if isinstance(enc, dict) or hasattr(enc, "keys") else enc))
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        gen = [target.generate(torch.tensor([p]), max_new_tokens=args.tokens, do_sample=False)[0, len(p):].tolist()
               for p in ids]
    del target
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
    linears = {n: m for n, m in draft.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n}
    original = {n: m.weight.detach().clone() for n, m in linears.items()}
    params = sum(w.numel() for w in original.values())
    LAYERS = len(draft.model.layers)

    def alpha() -> float:
        agree = total = 0
        with torch.inference_mode():
            for p, g in zip(ids, gen):
                logits = draft(input_ids=torch.tensor([p + g])).logits[0]
                guess = logits[len(p) - 1: len(p) + len(g) - 1].argmax(-1)
                agree += int((guess == torch.tensor(g)).sum())
                total += len(g)
        return round(agree / total, 4)

    def row(name: str, bits_per_weight: float, layers: int, **extra) -> dict:
        layer_mb = params * layers / LAYERS * bits_per_weight / 8 / 1e6  # unpadded: groups that divide 896
        out = {"variant": name, "alpha_greedy": alpha(), "bits_per_weight": round(bits_per_weight, 3),
               "layers": layers, "layers_mb": round(layer_mb, 1),
               "least_c_by_bytes": round((layer_mb + HEAD_MB) / TARGET_MB, 3), **extra}
        print(json.dumps(out), flush=True)
        return out

    t0 = time.time()
    rows = [row("float32 (as trained)", 32.0, 24, note="bytes as float32: for α only")]
    rows[-1]["least_c_by_bytes"] = None
    rows.append(dict(rows[0], variant="Q4_K as specviz keeps it (4.75 b/w, 896-wide rows padded to 1024)",
                     bits_per_weight=4.75, layers_mb=201.0, least_c_by_bytes=round((201.0 + HEAD_MB) / TARGET_MB, 3),
                     note="α of the float draft; the bench measures specviz's own (0.86)"))
    for bits, group, sym in GROUPED:
        for n, m in linears.items():
            m.weight.data = fake_quant(original[n], bits, group, sym)
        rows.append(row(f"{bits} bits, groups of {group}{', symmetric' if sym else ''}", packed_bits(bits, group), 24))
    for n, m in linears.items():
        m.weight.data = original[n]
    layers = list(draft.model.layers)
    for drop in DROPPED:
        keep = [layer for i, layer in enumerate(layers) if i not in drop]
        draft.model.layers = torch.nn.ModuleList(keep)
        for j, layer in enumerate(keep):
            layer.self_attn.layer_idx = j
        draft.config.num_hidden_layers = len(keep)
        rows.append(row(f"float32, layers {drop} dropped", 4.75, len(keep), note="bytes as Q4_K"))
    out = {"what": __doc__.split("\n\n")[0].replace("\n", " "), "machine": machine(),
           "prompts": len(ids), "tokens": sum(len(g) for g in gen), "target_mb": TARGET_MB,
           "head_mb": round(HEAD_MB, 1), "seconds": round(time.time() - t0), "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
