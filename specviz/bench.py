"""Benchmark CLI: specviz's speculative loop vs standard decoding (and transformers).

    python -m specviz.bench --prompts assets/prompts.jsonl --gamma 5 --compare-hf --json out.json

Per prompt and in aggregate: standard tok/s, speculative tok/s, transformers'
assisted and plain `generate` tok/s, speedup, α, mean accepted length, c, the
theoretical speedup from the run's own α and c (compared with the decode-phase
speedup, prefill excluded, since Thm 3.8 models the decoding loop), tracing
overhead, and whether the greedy speculative text equals the standard greedy text.  Speed goals are
checked here, never by timed assertions in tests.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from .drafters import DRAFTERS
from .engine import speculative_decode, standard_decode
from .models import ModelError, encode_prompt, load_pair, preset_help, resolve_preset
from .settings import POLICIES, DecodeSettings, SettingsError

DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent / "assets" / "prompts.jsonl"


def read_prompts(path: Path) -> list[dict[str, Any]]:
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"{path}:{n}: not valid JSON ({exc})") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
            raise SystemExit(f'{path}:{n}: each line must be an object with a non-empty "prompt" string')
        row.setdefault("name", row["prompt"][:30])
        row.setdefault("chat", True)
        rows.append(row)
    if not rows:
        raise SystemExit(f"{path}: no prompts")
    return rows


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def hf_generate(pair, ids: list[int], settings: DecodeSettings, assisted: bool) -> tuple[int, float]:
    """transformers' generate, plain or assisted with the very same draft model object."""
    x = torch.tensor([ids], device=pair.device)
    kw: dict[str, Any] = dict(max_new_tokens=settings.max_new_tokens, eos_token_id=pair.eos_token_ids,
                              pad_token_id=pair.eos_token_ids[0], attention_mask=torch.ones_like(x))
    if settings.temperature > 0:
        kw.update(do_sample=True, temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k or None)
    else:
        kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    if assisted:
        kw.update(assistant_model=pair.draft, num_assistant_tokens=settings.gamma,
                  num_assistant_tokens_schedule="constant")
    torch.manual_seed(settings.seed)
    _sync(pair.device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = pair.target.generate(x, **kw)
    _sync(pair.device)
    return out.shape[1] - len(ids), time.perf_counter() - t0


def bench_prompt(pair, row, settings: DecodeSettings, compare_hf: bool) -> dict[str, Any]:
    ids = encode_prompt(pair, row["prompt"], chat=bool(row.get("chat", True)))
    std = standard_decode(pair, ids, settings, prompt=row["prompt"])
    spec = speculative_decode(pair, ids, settings, prompt=row["prompt"])
    s = spec.summary()
    res = {
        "name": row["name"],
        "category": row.get("category", ""),
        "prompt_tokens": len(ids),
        "tokens_standard": std.n_tokens,
        "tokens_speculative": spec.n_tokens,
        "standard_tok_s": std.summary()["tokens_per_s"],
        "speculative_tok_s": s["tokens_per_s"],
        "alpha": s["alpha"],
        "mean_accepted_length": s["mean_accepted_length"],
        "c": s["c"],
        "theoretical_speedup": s["theoretical_speedup"],
        "tracing_overhead": s["tracing_overhead"],
        "greedy_equal": ([t.id for t in spec.tokens] == [t.id for t in std.tokens]) if settings.temperature == 0 else None,
    }
    res["speedup"] = res["speculative_tok_s"] / res["standard_tok_s"]
    # Thm 3.8 models the decoding loop, not the prompt prefill (which the draft adds
    # to): compare it with the speedup of the decode phase alone.
    res["decode_speedup"] = s["decode_tokens_per_s"] / std.summary()["decode_tokens_per_s"]
    res["prefill_s"] = {"standard": std.t_prefill, "speculative": spec.t_prefill}
    if compare_hf:
        n, t = hf_generate(pair, ids, settings, assisted=False)
        res["hf_plain_tok_s"] = n / t
        n, t = hf_generate(pair, ids, settings, assisted=True)
        res["hf_assisted_tok_s"] = n / t
        res["hf_speedup"] = res["hf_assisted_tok_s"] / res["hf_plain_tok_s"]
    return res


def aggregate(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Throughput over all prompts (total tokens / total time), means of the ratios."""
    agg: dict[str, Any] = {"name": "ALL", "category": ""}
    for key in ("standard_tok_s", "speculative_tok_s", "hf_plain_tok_s", "hf_assisted_tok_s"):
        vals = [r[key] for r in results if r.get(key)]
        if vals:  # harmonic mean = total tokens / total time for equal token counts
            agg[key] = statistics.harmonic_mean(vals)
    for key in ("alpha", "mean_accepted_length", "c", "theoretical_speedup", "decode_speedup", "tracing_overhead"):
        vals = [r[key] for r in results if r.get(key) is not None]
        agg[key] = statistics.fmean(vals) if vals else None
    agg["speedup"] = agg["speculative_tok_s"] / agg["standard_tok_s"]
    if "hf_assisted_tok_s" in agg:
        agg["hf_speedup"] = agg["hf_assisted_tok_s"] / agg["hf_plain_tok_s"]
    eq = [r["greedy_equal"] for r in results if r["greedy_equal"] is not None]
    agg["greedy_equal"] = all(eq) if eq else None
    return agg


COLUMNS = [
    ("name", "prompt", "{:<22.22}"),
    ("standard_tok_s", "std tok/s", "{:>9.2f}"),
    ("speculative_tok_s", "spec tok/s", "{:>10.2f}"),
    ("speedup", "speedup", "{:>7.2f}x"),
    ("hf_plain_tok_s", "HF tok/s", "{:>8.2f}"),
    ("hf_assisted_tok_s", "HF asst", "{:>7.2f}"),
    ("hf_speedup", "HF spdup", "{:>7.2f}x"),
    ("alpha", "alpha", "{:>5.2f}"),
    ("mean_accepted_length", "MAL", "{:>5.2f}"),
    ("c", "c", "{:>5.3f}"),
    ("decode_speedup", "decode", "{:>6.2f}x"),
    ("theoretical_speedup", "theory", "{:>6.2f}x"),
    ("tracing_overhead", "trace%", "{:>6.1%}"),
    ("greedy_equal", "greedy=", "{!s:>7}"),
]


def format_table(results: list[dict[str, Any]], agg: dict[str, Any]) -> str:
    cols = [c for c in COLUMNS if any(c[0] in r for r in results)]

    def cell(r, key, fmt):
        width = len(fmt.format(0 if "f" in fmt or "%" in fmt else "")) if key != "name" else 22
        v = r.get(key)
        if v is None:
            return "-".rjust(width)
        return fmt.format(v)

    head = " ".join(h.rjust(len(cell(results[0], k, f))) if k != "name" else h.ljust(22) for k, h, f in cols)
    lines = [head, "-" * len(head)]
    for r in results + [agg]:
        if r is agg:
            lines.append("-" * len(head))
        lines.append(" ".join(cell(r, k, f) for k, _, f in cols))
    return "\n".join(lines)


def progress(i: int, n: int, label: str) -> None:
    width = 30
    done = int(width * i / n)
    sys.stderr.write(f"\r[{'#' * done}{'.' * (width - done)}] {i}/{n} {label[:40]:<40}")
    sys.stderr.flush()
    if i == n:
        sys.stderr.write("\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specviz.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="default", help="model pair, by id or display name: " + preset_help())
    ap.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS, help="JSONL file, one {\"prompt\": ...} per line")
    ap.add_argument("--gamma", type=int, default=5, help="draft length γ")
    ap.add_argument("--epsilon", type=float, default=0.0, help="over-acceptance ε (0 = exact)")
    ap.add_argument("--variant", default="opt", choices=["opt", "uno"])
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default=None, help="bfloat16 | float32 | float16 (default: bf16)")
    ap.add_argument("--draft-quant", default="auto", help="auto | int8 | none (CPU draft quantisation)")
    ap.add_argument("--category", default=None, help="only prompts of this category (code, chat, ...)")
    ap.add_argument("--drafter", default="model", choices=list(DRAFTERS),
                    help="who drafts: " + "; ".join(f"{k} = {label}" for k, (label, _) in DRAFTERS.items()))
    ap.add_argument("--policy", default="constant", choices=list(POLICIES),
                    help="draft-length policy (γ is the maximum for all but constant)")
    ap.add_argument("--tau", type=float, default=0.4, help="confidence threshold τ of the confidence policy")
    ap.add_argument("--branches", type=int, default=None, help="tree drafter: M branches (i.i.d. drafts or top-k)")
    ap.add_argument("--tree-nodes", type=int, default=None, help="tree drafter: node budget per tree")
    ap.add_argument("--compare-hf", action="store_true", help="also time transformers' generate, plain and assisted")
    ap.add_argument("--json", type=Path, default=None, help="write all results to this JSON file")
    args = ap.parse_args(argv)

    try:
        settings = DecodeSettings.checked(gamma=args.gamma, epsilon=args.epsilon, variant=args.variant,
                                          temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                          max_new_tokens=args.max_new_tokens, seed=args.seed,
                                          drafter=args.drafter, policy=args.policy, tau=args.tau,
                                          branches=args.branches, tree_nodes=args.tree_nodes)
    except SettingsError as exc:
        ap.error(str(exc))
    rows = read_prompts(args.prompts)
    if args.category:
        rows = [r for r in rows if r.get("category") == args.category]
        if not rows:
            ap.error(f"no prompts of category {args.category!r}")
    try:
        quant = None if args.draft_quant == "none" else args.draft_quant
        pair = load_pair(resolve_preset(args.preset), dtype=args.dtype, draft_quant=quant,
                         progress=lambda f, m: progress(int(f * 100), 100, m))
    except ModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{pair.draft_name} -> {pair.target_name} on {pair.device_label()}, {str(pair.dtype).replace('torch.', '')}, "
          f"draft quant: {pair.draft_quant or 'none'}; γ={settings.gamma} ε={settings.epsilon} T={settings.temperature} "
          f"max_new_tokens={settings.max_new_tokens}", file=sys.stderr)

    # Warm up both loops (first calls allocate and are slower).
    warm = encode_prompt(pair, "Hello", chat=True)
    wset = dataclasses.replace(settings, max_new_tokens=4)
    standard_decode(pair, warm, wset)
    speculative_decode(pair, warm, wset)
    if args.compare_hf:
        hf_generate(pair, warm, wset, assisted=False)
        hf_generate(pair, warm, wset, assisted=True)

    results = []
    for i, row in enumerate(rows):
        progress(i, len(rows), row["name"])
        results.append(bench_prompt(pair, row, settings, args.compare_hf))
    progress(len(rows), len(rows), "done")
    agg = aggregate(results)
    print(format_table(results, agg))
    if args.json:
        args.json.write_text(json.dumps({
            "settings": settings.as_dict(), "preset": args.preset, "draft": pair.draft_name, "target": pair.target_name,
            "device": pair.device_label(), "dtype": str(pair.dtype), "draft_quant": pair.draft_quant,
            "results": results, "aggregate": agg}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
