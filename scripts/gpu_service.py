"""The app's own path on whatever device this machine has (a CUDA GPU where there is one): what a click does,
without Gradio.

    python scripts/gpu_service.py [--out FILE]

For the tiny preset (random models, no download) and each target execution this device offers, plus "auto"
(the probe measures the device and chooses): serving.service.get_pair loads it, prepare() checks the
request, and serving.service.race runs speculative and standard decoding as the page's race does (interleaved,
or one after the other where the GPU's graphs own the static cache).  Printed per execution: the device,
the execution the load chose, how the race ran, whether the greedy texts agree, the speedup and the race's
timing verdict (theory.timing.assess_race).  Then sampled runs at a fixed seed: the race's speculative
tokens are the same run after run (the seed decides them, whatever the timings did).

``--real TOKENIZER_DIR``: the same for a pair saved to disk and loaded as the app loads a custom pair
(models.loading.load_pair from two local directories, the probe choosing on "auto"): a random target with
Qwen2.5-Coder-1.5B's configuration (``--scale small``: 2 layers of width 64, for a CPU check) and, as its
draft, a copy of its first two layers with its embeddings and head (random models agree on nothing; a
truncated copy of the target agrees with it often enough for the rounds to accept).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import specviz.hardware  # noqa: E402,F401  (installs the probe)
from specviz.models.executions import offered  # noqa: E402
from specviz.models.presets import TINY_PRESET  # noqa: E402
from specviz.serving import service  # noqa: E402

PROMPT = "def fibonacci(n):"


def _race(pair, temperature: float, seed: int = 0) -> dict:
    req = service.prepare(pair, PROMPT, chat=False, gamma=4, temperature=temperature, max_new_tokens=48, seed=seed)
    last = None
    for update in service.race(req):
        last = update
    spec, std = last.spec, last.std
    ids = lambda tr: [t.id for t in tr.tokens]  # noqa: E731
    timing = asdict(spec.timing) if spec.timing is not None else None
    first = next((i for i, (x, y) in enumerate(zip(ids(spec), ids(std))) if x != y), None)
    return {"tokens": len(spec.tokens), "greedy_equal": ids(spec) == ids(std) if temperature == 0 else None,
            "first_difference": first, "margin_top2": _margin(pair, req, ids(std)[:first]) if first is not None
            and temperature == 0 else None, "spec_ids": ids(spec), "alpha": spec.summary().alpha,
            "speedup": round(spec.summary().tokens_per_s / max(std.summary().tokens_per_s, 1e-9), 3),
            "timing": timing}


def _margin(pair, req, prefix: list[int]) -> float | str:
    """The target's top-2 logit margin after the prompt and ``prefix`` (one full pass): a margin of an ulp or
    two of the run's dtype means the rounding of a verify pass against a step decided the parting token."""
    import torch

    try:
        with torch.inference_mode():
            ids = torch.tensor([list(req.prompt_ids) + prefix], device=pair.device)
            top = torch.topk(pair.target(input_ids=ids).logits[0, -1].float(), 2).values
        return round(float(top[0] - top[1]), 6)
    except Exception as exc:  # a diagnostic only: say why, keep the row
        return f"not read: {type(exc).__name__}: {exc}"[:200]


def save_random_pair(tokenizer_dir: str, out: Path, scale: str) -> tuple[str, str]:
    """A random target from the 1.5B configuration and a two-layer truncated copy of it, saved with the
    tokenizer (bf16 on disk): the two directories."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from specviz.hardware.gpu_report import COMMON, CONFIGS

    cfg = dict(CONFIGS["1.5B"], **COMMON)
    if scale == "small":
        cfg.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2)
    torch.manual_seed(0)
    target = Qwen2ForCausalLM(Qwen2Config(**cfg)).to(torch.bfloat16)
    draft = Qwen2ForCausalLM(Qwen2Config(**dict(cfg, num_hidden_layers=2))).to(torch.bfloat16)
    state = {k: v for k, v in target.state_dict().items() if not k.startswith("model.layers.")
             or int(k.split(".")[2]) < 2}
    draft.load_state_dict(state, strict=False)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    dirs = []
    for name, model in (("draft", draft), ("target", target)):
        path = out / name
        model.save_pretrained(path)
        tok.save_pretrained(path)
        dirs.append(str(path))
    return dirs[0], dirs[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_service.json")
    ap.add_argument("--real", metavar="TOKENIZER_DIR", help="also a saved random pair with real configurations")
    ap.add_argument("--scale", choices=("full", "small"), default="full")
    ap.add_argument("--execs", help="comma-separated executions to run (default: auto and every one offered)")
    args = ap.parse_args()
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    runs = [(TINY_PRESET, None, None, e) for e in ("auto", *offered(device))]
    if args.real:
        import tempfile

        from specviz.models.loading import load_pair

        draft_dir, target_dir = save_random_pair(args.real, Path(tempfile.mkdtemp()), args.scale)
        runs += [("custom", draft_dir, target_dir, e) for e in ("auto", *offered(device))]
    if args.execs:
        runs = [r for r in runs if r[3] in args.execs.split(",")]
    for preset, draft_dir, target_dir, execution in runs:
        t = time.perf_counter()
        if draft_dir is None:
            pair = service.get_pair(preset, target_exec=execution)
        else:
            pair = load_pair(draft=draft_dir, target=target_dir, target_exec=execution)
        row = {"pair": preset, "device": str(pair.device), "asked": execution, "target_exec": pair.target_exec,
               "dtype": str(getattr(pair, "dtype", "")), "load_s": round(time.perf_counter() - t, 2)}
        probe = getattr(pair, "probe", None)
        if probe is not None:
            row["probe_choice"], row["probe_curves"] = probe.choice, {k: {str(n): round(ms, 3) for n, ms in c.items()}
                                                                     for k, c in probe.curves.items()}
        greedy = _race(pair, 0.0)
        row.update(race_how=greedy["timing"]["how"] if greedy["timing"] else None, greedy_equal=greedy["greedy_equal"],
                   first_difference=greedy["first_difference"], margin_top2=greedy["margin_top2"],
                   greedy_speedup=greedy["speedup"], greedy_alpha=greedy["alpha"], timing=greedy["timing"])
        sampled = [_race(pair, 1.0, seed=7) for _ in range(2)]
        row["sampled_same_tokens"] = sampled[0]["spec_ids"] == sampled[1]["spec_ids"]
        row["sampled_alpha"] = sampled[0]["alpha"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    Path(args.out).write_text(json.dumps({"device": str(device), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
