"""GPU timings of the Qwen2.5-Coder family, eager against compiled steps, from random weights.

    python -m specviz.hardware.gpu_report --out gpu.json [--sizes 0.5B,1.5B,7B] [--compile]

Timing does not depend on weight values, so where no weights can be downloaded the models are built
from the real configurations with random weights, on the GPU, in bf16.  For each size: the one-token
step after the probe's prefix (hardware.probe.PREFIX tokens) and the verify pass over k = 2, 4, 8,
16 new tokens, eager (dynamic KV cache, transformers' forward) and with CUDA-graph steps over a static cache
(:mod:`specviz.models.compiled`, ``mode="graph"``; ``--compile`` adds torch.compile's
``reduce-overhead``), each the fastest of repeated runs with the GPU synchronised before every clock
read.  Then c (draft step / target step) for 0.5B → 1.5B and 0.5B → 7B, and each step's bandwidth
bound: the bytes of weights read per step over the measured device-to-device copy bandwidth.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from .probe import PREFIX as PROBE_PREFIX
from .roofline import bound_ms, copy_bandwidth, step_bytes

# The published configurations (config.json of Qwen/Qwen2.5-Coder-{0.5B,1.5B,7B}-Instruct).
CONFIGS = {
    "0.5B": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "7B": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}
COMMON = dict(max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6, hidden_act="silu")
KS = (1, 2, 4, 8, 16)
ENGINE_PROMPT = 60  # prompt tokens of the end-to-end engine runs


def random_model(size: str, device: torch.device, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    """A Qwen2 causal LM with the real configuration of ``size`` and random weights, on ``device``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**CONFIGS[size], **COMMON)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(dtype)
    return model.eval().requires_grad_(False)


def step_times(model: torch.nn.Module, reps: int = 15) -> dict[int, float]:
    """ms of a feed of k new tokens for each k in KS (hardware.probe.VerifyTimer: the GPU synchronised
    around each pass; the static cache's compiled steps when the model has them)."""
    from .probe import VerifyTimer

    timer = VerifyTimer(model, model.config.vocab_size)
    try:
        return timer.curve(KS, reps=reps)
    finally:
        timer.close()


def measure(size: str, device: torch.device, modes: list[str], bw: float) -> dict:
    from ..models.compiled import attach, detach

    model = random_model(size, device)
    row: dict = {"size": size, "weight_bytes": step_bytes(model), "params": sum(p.numel() for p in model.parameters())}
    row["bound_ms"] = bound_ms(row["weight_bytes"], bw)
    row["eager"] = step_times(model)
    for mode in modes:
        t = time.perf_counter()
        attach(model, 512, compile=True, mode=mode, warm=KS)
        row[f"build_s_{mode}"] = round(time.perf_counter() - t, 1)
        row[mode] = step_times(model)
        detach(model)
    fp16 = model.to(torch.float16)
    row["eager_fp16"] = step_times(fp16, reps=8)
    del model, fp16
    torch.cuda.empty_cache()
    return row


def engine_runs(tokenizer_dir: str, device: torch.device, targets: list[str], modes: list[str],
                new_tokens: int = 64, gamma: int = 5) -> list[dict]:
    """The engine end to end on random 0.5B → ``targets`` pairs with Qwen's tokenizer: speculative
    (greedy, constant γ) and standard decoding on each execution path; greedy text must agree.
    Random models rarely agree, so acceptance is low: what this measures is the cost of each pass."""
    from transformers import AutoTokenizer

    from ..core.engine import speculative_decode, standard_decode
    from ..models.compiled import attach, detach
    from ..core.settings import DecodeSettings
    from ..drafters import make_drafter

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    prompt = tok("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n" * 3).input_ids[:ENGINE_PROMPT]
    draft = random_model("0.5B", device)
    rows = []
    for size in targets:
        target = random_model(size, device)
        width = min(draft.config.vocab_size, target.config.vocab_size)
        for m in (draft, target):
            if m.config.vocab_size != width:
                m.resize_token_embeddings(width)
        from types import SimpleNamespace

        pair = SimpleNamespace(draft=draft, target=target, tokenizer=tok, device=device, eos_token_ids=[],
                               draft_name="random 0.5B", target_name=f"random {size}", preset="gpu-report",
                               dtype=torch.bfloat16, draft_quant=None)
        for mode in ["eager", *modes]:
            for m in (draft, target):
                detach(m)
                if mode != "eager":
                    attach(m, 512, compile=True, mode=mode, warm=KS)
            s = DecodeSettings(gamma=gamma, temperature=0.0, max_new_tokens=new_tokens)
            warm = DecodeSettings(gamma=gamma, temperature=0.0, max_new_tokens=8)
            speculative_decode(pair, prompt, warm, drafter=make_drafter(pair, warm))
            spec = speculative_decode(pair, prompt, s, drafter=make_drafter(pair, s))
            std = standard_decode(pair, prompt, s)
            again = standard_decode(pair, prompt, s)  # the same run again must give the same tokens
            a, b = spec.summary(), std.summary()
            row = {"target": size, "mode": mode, "greedy_equal": _ids(spec) == _ids(std),
                   "standard_repeatable": _ids(again) == _ids(std),
                   "standard_tok_s": round(b.decode_tokens_per_s, 1), "spec_tok_s": round(a.decode_tokens_per_s, 1),
                   "alpha": a.alpha, "draft_step_ms": round(1000 * (a.t_draft_forward or 0), 2),
                   "target_step_ms": round(1000 * (b.t_target_forward or 0), 2),
                   "verify_ms": round(1000 * (a.t_target_forward or 0), 2)}
            row.update(_race_row(pair, prompt, s, spec, std))
            print(json.dumps(row), flush=True)
            rows.append(row)
        for m in (draft, target):
            detach(m)
        del target, pair
        torch.cuda.empty_cache()
    return rows


def _ids(trace) -> list[int]:
    return [t.id for t in trace.tokens]


def _race_row(pair, prompt: list[int], settings, spec, std) -> dict:
    """The app's race on the same pair: its two runs interleaved (core.race.interleave), or one after
    the other where compiled steps own the one static cache (hardware.load.race_can_interleave, as the
    service decides); its tokens against the separate runs' and its speedup."""
    from ..core.engine import speculative_stream, standard_stream
    from ..drafters import make_drafter
    from ..core.race import in_turn, interleave
    from .load import race_can_interleave

    streams = {"spec": speculative_stream(pair, prompt, settings, drafter=make_drafter(pair, settings)),
               "std": standard_stream(pair, prompt, settings)}
    how = "interleaved" if race_can_interleave(pair) else "sequential"
    events = interleave(streams) if how == "interleaved" else in_turn(streams)
    last = {name: ev.trace for name, ev in events}
    a, b = last["spec"], last["std"]
    return {"race_how": how, "race_same_spec_tokens": _ids(a) == _ids(spec),
            "race_same_std_tokens": _ids(b) == _ids(std),
            "race_speedup": round(a.summary().tokens_per_s / b.summary().tokens_per_s, 3)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu.json")
    ap.add_argument("--sizes", default="0.5B,1.5B,7B")
    ap.add_argument("--compile", action="store_true", help="also torch.compile(mode='reduce-overhead')")
    ap.add_argument("--engine", metavar="TOKENIZER_DIR", help="also run the engine end to end on random pairs")
    args = ap.parse_args(argv)
    device = torch.device("cuda")
    modes = ["graph"] + (["reduce-overhead"] if args.compile else [])
    bw = copy_bandwidth(device, nbytes=2**30, reps=20)
    report = {"gpu": torch.cuda.get_device_name(device), "torch": torch.__version__,
              "copy_bandwidth_GBps": round(bw / 1e9, 1), "prefix": PROBE_PREFIX, "modes": ["eager"] + modes, "sizes": {}}
    print(json.dumps({k: report[k] for k in ("gpu", "torch", "copy_bandwidth_GBps")}), flush=True)
    for size in args.sizes.split(","):
        row = measure(size, device, modes, bw)
        report["sizes"][size] = row
        print(size, json.dumps({k: (({kk: round(vv, 2) for kk, vv in v.items()}) if isinstance(v, dict) else v)
                                for k, v in row.items()}), flush=True)
    sizes = report["sizes"]
    if "0.5B" in sizes:
        for big in ("1.5B", "7B"):
            if big in sizes:
                report[f"c_0.5B_{big}"] = {m: round(sizes["0.5B"][m][1] / sizes[big][m][1], 3)
                                           for m in ["eager", *modes]}
    print(json.dumps({k: v for k, v in report.items() if k.startswith("c_")}), flush=True)
    if args.engine:
        report["engine"] = engine_runs(args.engine, device, [s for s in ("1.5B", "7B") if s in sizes], modes)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
