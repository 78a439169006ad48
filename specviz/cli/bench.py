"""Benchmark CLI: specviz's speculative loop vs standard decoding (and transformers).

    python -m specviz.cli.bench --prompts assets/prompts.jsonl --gamma 5 --compare-hf --json out.json
    python -m specviz.cli.bench --policy all --repeats 5          # one row per draft-length policy
    python -m specviz.cli.bench --rule all --temperature 1        # one row per verification rule

Every configuration runs --repeats times per prompt, in an order that rotates
between repeats (so drift on a busy machine favours none); tables show the median
with the [min-max] spread, and aggregates are total tokens / total time.  Beside
the speedups: α, the mean draft length actually run (γ̄), c = draft forward time /
standard one-token step time, the verify pass's extra cost over that step, and
Thm 3.8's speedup from α, γ̄ and c, to compare with the decode-phase speedup
(after the first round, whose pass also reads the prompt: the formula models the decoding loop).  Speed goals are
checked here, never by timed assertions in tests.

--compare-hf times transformers' `generate` three ways with the very same model
objects: plain (hf_plain); assisted with specviz's constant γ (hf_same); assisted
with transformers' own defaults (hf_default); see specviz.cli.bench_hf.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import transformers
from transformers.utils import is_sklearn_available
from tqdm import tqdm

from ..core.engine import speculative_decode, standard_decode
from ..core.rules import RULES, draft_odds, expected_kept
from ..core.settings import POLICIES, TREE_MODES, DecodeSettings, SettingsError
from ..drafters import DRAFTERS, make_drafter
from .. import hardware  # noqa: F401  (installs the probe: load_pair's "auto" execution)
from ..models import PRESETS, ModelError, encode_prompt, load_pair, preset_help, resolve_preset
from ..models import draft_vocab
from ..models.executions import CHOICES as EXEC_CHOICES
from ..models.executions import words as exec_words
from ..models.tokens import template_head
from .bench_hf import HF_CONFIGS, hf_default_assistant, hf_generate, hf_same_values
from . import bench_llamacpp
from .bench_report import (BF16_BASELINE, LEGEND, LLAMACPP, Run, baseline_lines, merge, policy_table, prompt_table, rate_table,
                           run_json, summarise)

DEFAULT_PROMPTS = Path(__file__).resolve().parents[2] / "assets" / "prompts.jsonl"
FULL_VOCAB = "@full-vocab"  # a configuration's suffix (--draft-vocab both): its draft runs the full head
BF16_NOTE = ("bf16/fp16 divergences are rounding: the verify pass computes several positions in one matmul, whose "
             "low-precision sums differ in the last bits from one-token steps and flip near-ties; fp32 should match")


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


# ---- one timed run ----------------------------------------------------------------


def run_trace(trace) -> Run:
    # decode_*: after the first round, which reads the prompt (the steady decoding rate).
    first = trace.rounds[0] if trace.rounds else None
    run = Run(tokens=trace.n_tokens, seconds=trace.t_total,
              decode_tokens=trace.n_tokens - (len(first.emitted) if first else 0),
              decode_seconds=trace.t_total - (first.t_end if first else 0.0),
              tracing_seconds=trace.t_tracing, ids=[t.id for t in trace.tokens])
    if trace.kind == "standard":
        # A one-token step's cost: the first step also fed the prompt, so it is left out.
        steps = [r.t_verify for r in trace.rounds if not r.prompt_fed]
        run.steps, run.step_seconds = len(steps), sum(steps)
        return run
    for r in trace.rounds:
        run.rounds += 1
        run.drafted += len(r.draft)
        run.verified += len(r.positions)
        run.accepted += r.n_accepted
        run.draft_forwards += r.draft_forwards
        run.draft_seconds += r.t_draft
        if not r.prompt_fed:
            run.verify_seconds += r.t_verify
            run.verify_rounds += 1
        run.stops[r.draft_stop] = run.stops.get(r.draft_stop, 0) + 1
        odds = draft_odds(r.draft)
        if odds is not None:
            for rule, e in expected_kept(odds, trace.settings.epsilon).items():
                run.expected[rule] = run.expected.get(rule, 0.0) + e
            run.expected_rounds += 1
    return run


def run_config(pair, config: str, ids: list[int], settings: dict[str, DecodeSettings], prompt: str = "",
               baseline=None, llama=None) -> Run:
    """``baseline``: the pair whose target runs in bf16, for "standard_bf16" (when the chosen target
    execution is another); ``llama``: the llama.cpp runner (bench_llamacpp.LlamaCpp), for "llamacpp"."""
    # Standard decoding and transformers take the constant γ ("base"); a policy's own runs its γ (maximum).
    base = settings.get("base") or next(iter(settings.values()))
    if config == "standard":
        return run_trace(standard_decode(pair, ids, base, prompt=prompt))
    if config == BF16_BASELINE:
        return run_trace(standard_decode(baseline, ids, base, prompt=prompt))
    if config == LLAMACPP:
        new, seconds, after_first = llama.greedy(ids, base.max_new_tokens, set(pair.eos_token_ids),
                                                 keep=template_head(pair.tokenizer))
        return Run(tokens=len(new), seconds=seconds, decode_tokens=max(0, len(new) - 1), decode_seconds=after_first,
                   ids=new)
    if config in HF_CONFIGS:
        new, seconds = hf_generate(pair, ids, base, config)
        return Run(tokens=len(new), seconds=seconds, decode_tokens=len(new), decode_seconds=seconds, ids=new)
    if config.endswith(FULL_VOCAB):  # the same configuration with the draft's full head (then back)
        was = draft_vocab.mode(pair)
        draft_vocab.set_mode(pair, "full")
        try:
            return run_config(pair, config.removesuffix(FULL_VOCAB), ids, settings, prompt, baseline, llama)
        finally:
            draft_vocab.set_mode(pair, was)
    # "spec-<policy>": the chosen drafter; "chain-<policy>" (--versus) keys its settings by the whole name
    s = settings[config.removeprefix("spec-")]
    return run_trace(speculative_decode(pair, ids, s, prompt=prompt, drafter=make_drafter(pair, s)))


# ---- statistics -------------------------------------------------------------------


def configurations(policies: list[str], compare_hf: bool, versus: list[str] | None = None,
                   bf16_baseline: bool = False, llamacpp: bool = False) -> list[str]:
    """Config names: "spec-<policy>" for the chosen drafter, "chain-<policy>" for the draft model's
    chain beside it (--versus), then transformers' runs; "standard_bf16" (standard decoding with the
    target in bf16) when the target runs another way."""
    return (["standard"] + ([BF16_BASELINE] if bf16_baseline else []) + [f"spec-{p}" for p in policies]
            + [f"chain-{p}" for p in versus or []] + (list(HF_CONFIGS) if compare_hf else [])
            + ([LLAMACPP] if llamacpp else []))


def rotated(configs: list[str], repeat: int) -> list[str]:
    k = repeat % len(configs)
    return configs[k:] + configs[:k]


def bench_prompt(pair, row, configs: list[str], settings: dict[str, DecodeSettings], repeats: int,
                 done: Callable[[str], None], baseline=None, llama=None) -> tuple[dict[str, Any], dict[str, list[Run]]]:
    ids = encode_prompt(pair, row["prompt"], chat=bool(row.get("chat", True)))
    runs: dict[str, list[Run]] = {c: [] for c in configs}
    orders = []
    for rep in range(repeats):
        order = rotated(configs, rep)
        orders.append(order)
        for cfg in order:
            runs[cfg].append(run_config(pair, cfg, ids, settings, prompt=row["prompt"], baseline=baseline, llama=llama))
            done(f"{row['name'][:24]} · {cfg}")
    res = {"name": row["name"], "category": row.get("category", ""), "prompt_tokens": len(ids), "orders": orders}
    return res, runs


def _gamma_for(policy: str, args: argparse.Namespace) -> int:
    dynamic = policy not in ("constant", "base")
    return args.gamma_max if dynamic and args.gamma_max is not None else args.gamma


def race_under_load(argv: list[str]) -> int:
    """--race-under-load: the default example's race idle and under load (specviz.cli.race_load)."""
    from .race_load import CONDITIONS, run

    ap = argparse.ArgumentParser(prog="python -m specviz.cli.bench --race-under-load")
    ap.add_argument("--race-under-load", action="store_true")
    ap.add_argument("--races", type=int, default=5, help="races per condition and race kind")
    ap.add_argument("--hogs", type=int, default=3, help="CPU-hog processes beside the app")
    ap.add_argument("--switch-s", type=float, default=3.0, help="the switching condition's on/off period")
    ap.add_argument("--conditions", default=",".join(CONDITIONS), help="of " + ", ".join(CONDITIONS))
    ap.add_argument("--json", type=Path, default=None, help="write everything to this JSON file")
    ap.add_argument("--modes", default="interleaved,sequential",
                    help="which races: interleaved (the app's) and/or sequential (as specviz made them before)")
    args = ap.parse_args(argv)
    run(args.races, args.hogs, args.switch_s, args.conditions.split(","), args.json, modes=args.modes.split(","))
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m specviz.cli.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="default", help="model pair, by id or display name: " + preset_help())
    ap.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS, help="JSONL file, one {\"prompt\": ...} per line")
    ap.add_argument("--gamma", type=int, default=5, help="draft length γ (the maximum for dynamic policies)")
    ap.add_argument("--gamma-max", type=int, default=None,
                    help="maximum draft length of the dynamic policies (heuristic, confidence, adaptive); default "
                         "--gamma. transformers' hf_default drafts up to 20")
    ap.add_argument("--epsilon", type=float, default=0.0, help="over-acceptance ε (0 = exact)")
    ap.add_argument("--variant", default="opt", choices=["opt", "uno"])
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default=None, help="bfloat16 | float32 | float16 (default: bf16)")
    ap.add_argument("--draft-quant", default="auto", help="auto | int8 | none (CPU draft quantisation)")
    ap.add_argument("--target-exec", default="auto", choices=list(EXEC_CHOICES),
                    help="how the target executes: auto (the probe chooses by the speculative rate it predicts "
                         "on this machine), or one of bf16, fp32, int8 (CPU), bf16+graphs, fp16… (CUDA); standard "
                         "decoding always uses the same execution")
    ap.add_argument("--no-bf16-baseline", action="store_true",
                    help=f"skip {BF16_BASELINE} (standard decoding with the target in bf16, run when the chosen "
                         "execution is another)")
    ap.add_argument("--category", default=None, help="only prompts of this category (code, chat, ...)")
    ap.add_argument("--drafter", default="model", choices=list(DRAFTERS),
                    help="who drafts: " + "; ".join(f"{k} = {label}" for k, (label, _) in DRAFTERS.items()))
    ap.add_argument("--policy", default="constant", choices=list(POLICIES) + ["all"],
                    help="draft-length policy; 'all' runs every policy and prints one row per policy")
    ap.add_argument("--rule", default="token", choices=list(RULES) + ["all"],
                    help="verification rule of chains: token (Leviathan et al.), block (Sun et al. 2025), match; "
                         "'all' runs each (configurations spec-token, spec-block, spec-match)")
    ap.add_argument("--tau", type=float, default=0.4, help="confidence threshold τ of the confidence policy")
    ap.add_argument("--branches", type=int, default=None, help="tree drafter: M branches (i.i.d. drafts or top-k)")
    ap.add_argument("--tree-nodes", type=int, default=None, help="tree drafter: node budget per tree")
    ap.add_argument("--tree-mode", default=None, choices=list(TREE_MODES),
                    help="tree drafter: i.i.d. batch drafts, a best-first top-k tree (default), or M distinct "
                         "children per node sampled without replacement (unique)")
    ap.add_argument("--versus", default=None, metavar="POLICIES",
                    help="also run the draft model's chain with these policies (comma-separated, or 'all') in "
                         "the same interleaved runs: a tree or another drafter against the chain, on one clock")
    ap.add_argument("--draft-vocab", default="loaded", choices=["loaded", "reduced", "full", "both"],
                    help="the int8 draft's head (specviz.models.draft_vocab): as loaded, reduced to the kept ids, "
                         f"full, or both (every spec- configuration again with the full head: <name>{FULL_VOCAB})")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each configuration per prompt (median reported)")
    ap.add_argument("--compare-hf", action="store_true",
                    help="also time transformers' generate: plain, assisted with the same γ, assisted with its "
                    "defaults (assisted runs use the draft model whatever --drafter says)")
    ap.add_argument("--compare-llamacpp", action="store_true",
                    help="also time llama.cpp's plain greedy decoding of the target's own GGUF file, same prompt "
                         "ids, interleaved (needs llama-cpp-python, never a requirement: "
                         f"{bench_llamacpp.INSTALL})")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (default: torch's choice; on a shared machine contended threads "
                    "slow small models many times over)")
    ap.add_argument("--json", type=Path, default=None, help="write everything to this JSON file")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    if args.threads is not None and args.threads < 1:
        ap.error("--threads must be at least 1")
    if args.compare_llamacpp and args.temperature != 0:
        ap.error("--compare-llamacpp compares greedy decoding: use --temperature 0")
    if args.compare_llamacpp and not bench_llamacpp.available():
        ap.error(f"--compare-llamacpp needs llama-cpp-python, built from source: {bench_llamacpp.INSTALL}")
    policies = list(POLICIES) if args.policy == "all" else [args.policy]
    versus = [] if not args.versus else list(POLICIES) if args.versus == "all" else args.versus.split(",")
    unknown = [p for p in versus if p not in POLICIES]
    if unknown:
        ap.error(f"--versus: unknown policy {unknown[0]!r} (choose from {', '.join(POLICIES)} or all)")
    if versus and args.drafter == "model":
        ap.error("--versus runs the draft model's chain beside another drafter: pick --drafter tree, "
                 "prompt-lookup or speculator (or use --policy all for the chain's policies)")
    rules = list(RULES) if args.rule == "all" else [args.rule]

    def checked(p: str, rule: str = "token", **drafting) -> DecodeSettings:  # policy p's settings (γ: its maximum when dynamic)
        return DecodeSettings.checked(
            gamma=_gamma_for(p, args), epsilon=args.epsilon, variant=args.variant, temperature=args.temperature,
            top_p=args.top_p, top_k=args.top_k, max_new_tokens=args.max_new_tokens, seed=args.seed,
            policy="constant" if p == "base" else p, tau=args.tau, rule=rule, **drafting)

    def key(p: str, rule: str) -> str:  # one rule: the policy's name; several: the rule's (and the policy's)
        return p if len(rules) == 1 else rule if len(policies) == 1 else f"{p}-{rule}"

    try:
        drafting = dict(drafter=args.drafter, branches=args.branches, tree_nodes=args.tree_nodes,
                        tree_mode=args.tree_mode)
        args.settings = {key(p, r): checked(p, r, **drafting) for p in policies for r in rules}
        args.settings["base"] = checked("base", **drafting)
        args.settings |= {f"chain-{p}": checked(p, drafter="model") for p in versus}
    except SettingsError as exc:
        ap.error(str(exc))
    args.policies, args.versus, args.rules = policies, versus, rules
    args.runs = [k for k in args.settings if k != "base" and not k.startswith("chain-")]
    return args


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if "--race-under-load" in argv:
        return race_under_load(argv)
    args = parse_args(argv)
    settings: dict[str, DecodeSettings] = args.settings
    base = settings["base"]
    rows = read_prompts(args.prompts)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.category:
        rows = [r for r in rows if r.get("category") == args.category]
        if not rows:
            print(f"error: no prompts of category {args.category!r}", file=sys.stderr)
            return 2
    try:
        with tqdm(total=100, desc="loading", file=sys.stderr, leave=False) as bar:
            def loading(frac: float, msg: str) -> None:
                bar.n = int(100 * frac)
                bar.set_postfix_str(msg[:50])

            quant = None if args.draft_quant == "none" else args.draft_quant
            pair = load_pair(resolve_preset(args.preset), dtype=args.dtype, draft_quant=quant,
                             target_exec=args.target_exec, progress=loading)
            # Standard decoding with the target in bf16 as well, when it runs another way here.
            baseline = None
            if pair.target_exec not in ("", "bf16") and not args.no_bf16_baseline:
                baseline = load_pair(resolve_preset(args.preset), dtype=args.dtype, draft_quant=quant,
                                     target_exec="bf16", progress=loading)
    except ModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    dtype = str(pair.dtype).replace("torch.", "")
    greedy = base.temperature == 0
    print(f"{pair.draft_name} -> {pair.target_name} on {pair.device_label()}, {dtype}, draft quant: "
          f"{pair.draft_quant or 'none'}; target: {exec_words(pair)}"
          + (f" on {pair.probe.machine['label']}" if pair.probe else "") + f"; γ={base.gamma} ε={base.epsilon} "
          f"T={base.temperature} "
          f"max_new_tokens={base.max_new_tokens}, {args.repeats} repeat(s)", file=sys.stderr)

    llama = None
    if args.compare_llamacpp:
        try:
            llama = bench_llamacpp.LlamaCpp(bench_llamacpp.gguf_file(PRESETS[resolve_preset(args.preset)].target),
                                            threads=torch.get_num_threads())
        except ModelError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"llama.cpp {llama.version()} on {llama.path.name}, {llama.threads} threads", file=sys.stderr)
    configs = configurations(args.runs, args.compare_hf, args.versus, bf16_baseline=baseline is not None,
                             llamacpp=llama is not None)
    if args.draft_vocab != "loaded":
        draft_vocab.set_mode(pair, "reduced" if args.draft_vocab == "both" else args.draft_vocab)
    if args.draft_vocab == "both" and draft_vocab.mode(pair) == "reduced":
        configs += [f"{c}{FULL_VOCAB}" for c in configs if c.startswith(("spec-", "chain-"))]
    print(f"draft head: {draft_vocab.label(pair)}", file=sys.stderr)
    # Warm up every configuration once (first calls allocate and are slower).
    warm_ids = encode_prompt(pair, "Hello", chat=True)
    warm = {k: dataclasses.replace(s, max_new_tokens=4) for k, s in settings.items()}
    for cfg in configs:
        run_config(pair, cfg, warm_ids, warm, baseline=baseline, llama=llama)

    prompts, all_runs = [], []
    with tqdm(total=len(rows) * args.repeats * len(configs), desc="bench", unit="run", file=sys.stderr) as bar:
        def done(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)
            bar.update(1)

        for row in rows:
            res, runs = bench_prompt(pair, row, configs, settings, args.repeats, done, baseline=baseline, llama=llama)
            res["configs"] = summarise(runs, greedy)
            res["runs"] = {cfg: [run_json(r) for r in rs] for cfg, rs in runs.items()}
            prompts.append(res)
            all_runs.append(runs)
    # Aggregate: per repeat, every configuration's runs summed over the prompts.
    merged = {cfg: [merge([runs[cfg][rep] for runs in all_runs]) for rep in range(args.repeats)] for cfg in configs}
    agg = summarise(merged, False)
    if greedy:  # the text matches when it matches on every prompt
        for cfg in [c for c in configs[1:] if c != BF16_BASELINE]:
            equal = [p["configs"][cfg]["greedy_equal"] for p in prompts]
            agg[cfg].update(greedy_equal=all(equal), greedy_equal_prompts=f"{sum(equal)}/{len(equal)}")

    if len(args.runs) == 1 and not args.versus and FULL_VOCAB not in "".join(configs):
        print(prompt_table(prompts, agg, f"spec-{args.runs[0]}", [h for h in [*HF_CONFIGS, LLAMACPP] if h in configs]))
    else:
        print(policy_table(agg, [c for c in configs if c.startswith(("spec-", "chain-"))]))
        print(rate_table(prompts, agg, configs))
    for line in baseline_lines(agg) + LEGEND:
        print(line)
    if greedy and dtype in ("bfloat16", "float16") and not all(
            agg[c].get("greedy_equal", True) for c in configs):
        print(f"note: {BF16_NOTE}")
    if args.json:
        doc = {
            "schema": "specviz.bench", "version": 2,
            "settings": base.as_dict(), "gamma_max": args.gamma_max, "policies": args.policies, "rules": args.rules,
            "versus": args.versus,
            "repeats": args.repeats, "configs": configs,
            "preset": args.preset, "draft": pair.draft_name, "target": pair.target_name,
            "device": pair.device_label(), "dtype": dtype, "draft_quant": pair.draft_quant,
            "draft_vocab": draft_vocab.label(pair),
            "target_exec": pair.target_exec, "target_weights": getattr(pair, "target_weights", ""),
            "machine": pair.probe.machine if pair.probe else None,
            "probe": pair.probe.as_dict() if pair.probe else None,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "threads": torch.get_num_threads(),
            "hf": {"same": hf_same_values(base), "default": hf_default_assistant(pair.draft),
                   "default_threshold_retuned": is_sklearn_available(),  # see specviz.cli.bench_hf
                   "descriptions": HF_CONFIGS} if args.compare_hf else None,
            "llamacpp": {"version": llama.version(), "gguf": llama.path.name, "threads": llama.threads,
                         "description": bench_llamacpp.DESCRIPTION} if llama is not None else None,
            "greedy_note": BF16_NOTE if greedy and dtype in ("bfloat16", "float16") else None,
            "prompts": prompts, "aggregate": agg,
        }
        args.json.write_text(json.dumps(doc, indent=2, ensure_ascii=False, default=dataclasses.asdict))
    return 0


if __name__ == "__main__":
    sys.exit(main())
