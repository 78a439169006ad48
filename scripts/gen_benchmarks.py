"""Write docs/benchmarks.md (and the README's table) from the benchmark JSON files.

    python scripts/gen_benchmarks.py            # rewrite docs/benchmarks.md and README.md's table
    python scripts/gen_benchmarks.py --check    # exit 1 if either differs from what it would write

Every figure comes from a file under docs/benchmarks/data/ (or assets/hardware/ for the probe
curves the app ships), so the tables cannot drift from the measurements.  What this script adds is
the choice of which file is *current* for each kind of machine, the machine's name and the date it
was measured (the JSON files of the bench do not record either): CURRENT below.  To publish a new
measurement, save the bench's JSON under docs/benchmarks/data/, point CURRENT at it, and rerun.
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "benchmarks" / "data"
OUT = ROOT / "docs" / "benchmarks.md"
README = ROOT / "README.md"
BEGIN, END = "<!-- benchmarks:begin (scripts/gen_benchmarks.py) -->", "<!-- benchmarks:end -->"


@dataclass(frozen=True)
class CpuClass:
    key: str  # the suffix of its data files' names
    title: str  # the class, as the tables name it
    cpu: str  # what /proc/cpuinfo said, in words
    date: str
    bench: str  # the current bench file in DATA
    note: str = ""


# The current measurement of each CPU class, newest class first.  All were 2-core cloud VMs, idle,
# the default pair, six prompts (assets/prompts.jsonl), greedy, 64 new tokens, each configuration's
# repeats interleaved with the others.
CURRENT: tuple[CpuClass, ...] = (
    CpuClass("epyc-zen5", "AMD EPYC, Zen 5",
             "AMD EPYC (Zen 5, cpu family 26), AVX2 and AVX-512 with VNNI and BF16, no AMX; 2 vCPUs", "2026-12-08",
             "bench-hf-llamacpp-hybrid-epyc-zen5.json",
             "llama.cpp built on this machine (GGML_NATIVE=ON). The same bench with the draft model alone and its full "
             "head (the app's draft), run right after: bench-hf-llamacpp-model-epyc-zen5.json. The probe's copy bandwidth moved "
             "between 32 and 63 GB/s across probes within hours on this VM, so its bound is no floor here."),
    CpuClass("xeon-amx", "Intel Xeon with AMX",
             "Intel Xeon (cpu family 6), AVX-512 with VNNI and BF16, AMX; 2 cores", "2026-11-28",
             "bench-hf-llamacpp-trace-xeon-amx.json",
             "llama.cpp built with AVX2 and AVX-512 VNNI/BF16 and AMX off: its native build faults on this CPU."),
    CpuClass("epyc-zen3", "AMD EPYC, Zen 3",
             "AMD EPYC 7003 series (Zen 3, cpu family 25), AVX2 only, 256-bit units; 2 vCPUs", "2026-11-27",
             "bench-hf-llamacpp-draft-hugepages-epyc-zen3.json",
             "Its memory bandwidth moved by a third within an hour (15-22 GB/s)."),
    CpuClass("epyc-avx2", "AMD EPYC, Zen 1",
             "AMD EPYC 7001 series (Zen 1, cpu family 23), AVX2 only, 128-bit SIMD units; 2 vCPUs", "2026-11-26",
             "bench-hf-llamacpp-headkept-epyc-avx2.json",
             "Measured before the GGUF matrices became the default execution (the target ran int8 rows); "
             "a verify pass is compute-bound on this CPU (128-bit units, no VNNI)."),
)

GPU_REPORTS = (("gpu-h200-report-2026-11-28.json", "report"), ("gpu-h100-report-2026-11-28.json", None))
GPU_7B = ("gpu-h100-random.json", "2026-11-25")
COLD_START = ("cold-start-epyc-zen5.json", "2-core AMD EPYC, Zen 5", "2026-12-07")
HOSTING = ROOT / "docs" / "hosting.md"
RACE_UNDER_LOAD = "race-under-load-epyc-zen3.json"
CROWD = ("crowd-epyc-avx2.json", "AMD EPYC, Zen 1", "2026-11-26")

SHORT = {"standard": "specviz standard", "llamacpp": "llama.cpp"}
DRAFTERS = {"model": "draft model", "hybrid": "draft model + prompt lookup", "prompt-lookup": "prompt lookup",
            "tree": "token tree", "speculator": "learned head"}
MACHINES = (("xeon-amx", "Intel Xeon with AMX"), ("epyc-zen3", "AMD EPYC, Zen 3"),
            ("epyc-avx2", "AMD EPYC, AVX2 (Zen 1 or earlier)"), ("gpu-h100", "NVIDIA H100"),
            ("gpu-h200", "NVIDIA H200"), ("epyc-zen5", "AMD EPYC, Zen 5"), ("fidelity", "AMD EPYC, AVX2"))
KINDS = (("bench-", "bench (`python -m specviz.cli.bench`)"), ("crowd-", "a room of attendees (`scripts/crowd.py`)"),
         ("warm-start", "start-up times (`scripts/warm_start.py`)"),
         ("cold-start", "first starts, empty model cache (`scripts/cold_start.py`)"),
         ("race-", "the race idle and under load (`--race-under-load`)"),
         ("gpu-", "GPU checks (`scripts/gpu_check.sh` and its parts)"),
         ("draft-", "draft precision against acceptance"), ("hostile-", "hostile inputs (`scripts/hostile.py`)"),
         ("soak-", "a public page's visitors (`scripts/soak.py`)"),
         ("classroom-", "a class: a teacher, attendees following and racing (`scripts/classroom.py`)"),
         ("long-prompt-", "a long prompt's time limit and a closed page (`scripts/long_prompt.py`)"),
         ("sweep-wait", "live runs during a sweep (`scripts/sweep_wait.py`)"))


def load(name: str) -> dict:
    return json.loads((DATA / name).read_text(encoding="utf-8"))


def f2(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}"


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}×" if a and b else ""


def median(stat) -> float | None:
    if isinstance(stat, dict):
        return stat.get("median")
    return stat if isinstance(stat, (int, float)) else None


def spread(stat) -> str:
    if isinstance(stat, dict) and stat.get("min") is not None:
        return f"{stat['median']:.2f} [{stat['min']:.2f}–{stat['max']:.2f}]"
    return f2(median(stat))


def describe(bench: dict, config: str) -> str:
    """A configuration's name in words, from the bench's own settings."""
    settings = bench.get("settings", {})
    name, _, suffix = config.partition("@")
    reduced = str(bench.get("draft_vocab") or "full") != "full"
    if name == "standard":
        return "specviz, standard decoding"
    if name == "standard_bf16":
        return "specviz, standard decoding, bf16 target"
    if name == "llamacpp":
        version = (bench.get("llamacpp") or {}).get("version", "")
        return f"llama.cpp {version}, plain decoding of the same GGUF".replace("  ", " ")
    if name.startswith("hf_"):
        words = (bench.get("hf") or {}).get("descriptions", {}).get(name, name)
        return words.replace("transformers", "transformers'", 1)
    kind, _, policy = name.partition("-")
    drafter = "draft model" if kind == "chain" else DRAFTERS.get(settings.get("drafter", "model"), "draft model")
    if policy == "constant":
        length = f"γ = {settings.get('gamma')}"
    elif policy in ("token", "block", "match"):
        length = f"{policy} rule, γ = {settings.get('gamma')}"
    else:
        length = f"{policy}, γ ≤ {bench.get('gamma_max') or settings.get('gamma')}"
    head = "full draft head" if suffix == "full-vocab" else ("reduced draft head" if reduced else "")
    return f"specviz speculative: {drafter}, {length}" + (f", {head}" if head else "")


def speculative(bench: dict) -> list[str]:
    return [k for k in bench["aggregate"] if k.split("-")[0] in ("spec", "chain")]


def best(bench: dict) -> str:
    agg = bench["aggregate"]
    return max(speculative(bench), key=lambda k: median(agg[k]["tok_s"]) or 0)


def execution(bench: dict) -> str:
    weights = "its GGUF's Q4_K/Q6_K matrices as stored" if bench.get("target_weights") == "gguf" else "int8 rows"
    draft = {"int8+q4k": "Q4_K made from its int8 rows", "int8": "int8 rows"}.get(str(bench.get("draft_quant")),
                                                                                   str(bench.get("draft_quant")))
    vocab = str(bench.get("draft_vocab") or "full")
    head = "full head" if vocab == "full" else f"reduced head ({vocab})"
    return f"target {bench.get('target_exec')} on {weights}; draft on {draft}, {head}"


def summary_rows() -> list[str]:
    rows = ["| CPU (2 cores) | measured | llama.cpp | specviz standard | specviz speculative, best exact | "
            "÷ llama.cpp | ÷ standard | same text |", "|---|---|---|---|---|---|---|---|"]
    for cls in CURRENT:
        b = load(cls.bench)
        agg = b["aggregate"]
        top = best(b)
        llama = median(agg.get("llamacpp", {}).get("tok_s"))
        std = median(agg["standard"]["tok_s"])
        spec = median(agg[top]["tok_s"])
        rows.append(f"| {cls.title} | {cls.date} | {f2(llama) if llama else 'not run'} | {f2(std)} | **{f2(spec)}** | "
                    f"{ratio(spec, llama) if llama else '—'} | {ratio(spec, std)} | "
                    f"{agg[top].get('greedy_equal_prompts', '')} |")
    return rows


def readme_block() -> str:
    lines = [BEGIN, "", *summary_rows(), "",
             "Tokens per second over six prompts (greedy, 64 new tokens); \"best exact\" is the fastest speculative "
             "configuration of that bench (named in [docs/benchmarks.md](docs/benchmarks.md)); \"same text\" counts "
             "the prompts on which its text equals standard decoding's.", "", END]
    return "\n".join(lines)


def cpu_section(cls: CpuClass) -> list[str]:
    b = load(cls.bench)
    agg = b["aggregate"]
    std = median(agg["standard"]["tok_s"])
    llama = median(agg.get("llamacpp", {}).get("tok_s"))
    probe = b.get("probe") or {}
    out = [f"## {cls.title}", "",
           f"{cls.cpu}; measured {cls.date}; torch {b.get('torch')}, transformers {b.get('transformers')}, "
           f"{b.get('threads')} threads, {b.get('repeats')} repeats (median [min–max]). {execution(b)}. "
           f"{cls.note}".rstrip(),
           ""]
    out += ["| configuration | tok/s | ÷ standard | ÷ llama.cpp | α | c | verify + | greedy = standard |",
            "|---|---|---|---|---|---|---|---|"]
    order = sorted(agg, key=lambda k: -(median(agg[k]["tok_s"]) or 0))
    for k in order:
        a = agg[k]
        tok = median(a["tok_s"])
        bold = "**" if k == best(b) else ""
        verify = median(a.get("verify_extra"))
        out.append(f"| {bold}{describe(b, k)}{bold} | {spread(a['tok_s'])} | {ratio(tok, std)} | {ratio(tok, llama)} | "
                   f"{f2(a.get('alpha'))} | {f2(median(a.get('c')))} | "
                   f"{'' if verify is None else f'+{verify * 100:.0f} %'} | {a.get('greedy_equal_prompts', '')} |")
    top = best(b)
    cols = ["standard", top] + (["llamacpp"] if "llamacpp" in agg else [])
    out += ["", "Per prompt, tok/s (median):", "",
            "| prompt | " + " | ".join(SHORT.get(c, "best speculative") for c in cols) + " |",
            "|---" * (len(cols) + 1) + "|"]
    for p in b.get("prompts", []):
        cells = [f2(median(p["configs"].get(c, {}).get("tok_s"))) for c in cols]
        out.append(f"| {p['name']} | " + " | ".join(cells) + " |")
    curve = (probe.get("curves") or {}).get(probe.get("choice")) or {}
    if curve:
        ks = sorted(curve, key=int)
        bound = ""
        mb, gbps = (probe.get("step_mb") or {}).get(probe.get("choice")), probe.get("copy_gbps")
        if mb and gbps:
            bound = (f" A step reads {mb:,.0f} MB of weights; at the {gbps:.1f} GB/s copy bandwidth the probe measured "
                     f"that is {mb / gbps:.1f} ms, so T(1) is {curve[ks[0]] / (mb / gbps):.2f}× that bound.")
        draft = probe.get("draft_ms")
        out += ["", f"The probe that run ({probe.get('choice')} target): T(k), the target's pass over k tokens, "
                    + ", ".join(f"T({k}) = {curve[k]:.1f}" for k in ks) + " ms"
                    + (f"; the draft's step {draft:.1f} ms (c = {draft / curve[ks[0]]:.2f})" if draft else "")
                    + "." + bound]
    return out + [""]


def gpu_section() -> list[str]:
    out = ["## GPUs", "",
           "The GPU checks (`bash scripts/gpu_check.sh`) time the models' passes with random weights in the real "
           "Qwen2.5-Coder shapes (bf16), so the draft and the target agree on nothing (α = 0): they measure passes "
           "and exactness, not a speedup. No speedup with real weights on a GPU has been recorded yet.", "",
           "| GPU | measured | copy GB/s | 1.5B step, eager | 1.5B step, CUDA graphs | T(16)/T(1), graphs | "
           "0.5B step, graphs | c, graphs | standard tok/s, graphs |", "|---|---|---|---|---|---|---|---|---|"]
    for name, inner in GPU_REPORTS:
        doc = load(name)
        r = doc[inner] if inner else doc
        big, small = r["sizes"]["1.5B"], r["sizes"]["0.5B"]
        g = {int(k): v for k, v in big["graph"].items()}
        std = next((e["standard_tok_s"] for e in r.get("engine", []) if e.get("mode") == "graph"), None)
        out.append(f"| {r['gpu']} | {doc.get('date', '')} | {r['copy_bandwidth_GBps']:,.0f} | "
                   f"{big['eager']['1']:.2f} ms | {g[1]:.2f} ms | {g[16] / g[1]:.2f} | {small['graph']['1']:.2f} ms | "
                   f"{r['c_0.5B_1.5B']['graph']:.2f} | {'' if std is None else f'{std:.1f}'} |")
    doc = load(GPU_7B[0])
    seven = doc["sizes"]["7B"]
    g7 = {int(k): v for k, v in seven["graph"].items()}
    out += ["", f"The 7B target (the GPU default pair's), on {doc['gpu']} ({GPU_7B[1]}): {g7[1]:.2f} ms a step with "
                f"CUDA graphs ({seven['eager']['1']:.1f} eager), T(16)/T(1) = {g7[16] / g7[1]:.2f}, against a "
                f"bandwidth bound of {seven['bound_ms']:.2f} ms; c = {doc['c_0.5B_7B']['graph']:.2f} for the 0.5B "
                f"draft with graphs.", ""]
    for name, _ in GPU_REPORTS:
        doc = load(name)
        if doc.get("tests"):
            out.append(f"- {doc.get('gpu') or doc['report']['gpu']}: {doc['tests']}.")
    return out + [""]


def start_section() -> list[str]:
    return ["## Start-up", ""] + startup_table() + [""]


def _startup() -> tuple[dict, str, str] | None:
    name, cpu, date = COLD_START
    try:
        c = load(name)
    except OSError:
        return None
    return c, cpu, date


def startup_table() -> list[str]:
    """The cold and warm starts of scripts/cold_start.py: launch -> page, -> the default race answered."""
    found = _startup()
    if found is None:
        return []
    c, cpu, date = found
    out = [f"Starts as a visitor meets them (`python scripts/cold_start.py --starts {len(c['starts']['cold'])}`; "
           f"{cpu}, {date}): each cold start with an empty `SPECVIZ_CACHE` and the OS file cache "
           f"{'dropped' if all(s.get('file_cache') == 'dropped' for s in c['starts']['cold'] if 'race_s' in s) else 'kept (it could not be dropped)'}"
           f", each followed by a warm start with the cache it left; the time from `python app.py` to the page, and to "
           f"the default race ({c['tokens']} new tokens, speculative and standard, a prompt no recording holds) answered. "
           "The server serves first and times its target afterwards, between runs; each start is left running until it "
           "has recorded that timing (so a warm start measures nothing):",
           "", "| start | page answers | default race answered | target runs as | peak memory | cache on disk |",
           "|---|---|---|---|---|---|"]
    for kind in ("cold", "warm"):
        for k, st in enumerate(c["starts"][kind], 1):
            if "race_s" not in st:
                out.append(f"| {kind} {k} | failed | | | | |")
                continue
            out.append(f"| {kind} {k} | {st['page_s']:.1f} s | **{st['race_s']:.1f} s** | {st['target_exec']} | "
                       f"{st['peak_rss_gb']:.1f} GB | {st['cache_mb']:.0f} MB |")
    return out


STARTUP_BEGIN, STARTUP_END = "<!-- startup:begin (scripts/gen_benchmarks.py) -->", "<!-- startup:end -->"


def startup_sentence() -> str:
    """The README's and docs/hosting.md's start-up sentence, from the cold-start data."""
    found = _startup()
    if found is None:
        return ""
    c, cpu, _date = found
    cold, warm = c["cold"], c["warm"]
    return (f"On a quiet {cpu} the default race is answered {cold['median_race_s']:.0f} s after `python app.py` "
            f"with an empty cache (median of {cold['served']}; the page {cold['median_page_s']:.0f} s) and "
            f"{warm['median_race_s']:.0f} s after a later start (page {warm['median_page_s']:.0f} s); the cache holds "
            f"{max(cold['max_cache_mb'], warm['max_cache_mb']):.0f} MB, the server peaks at "
            f"{max(cold['max_peak_rss_gb'], warm['max_peak_rss_gb']):.1f} GB of memory "
            f"([start-up figures](docs/benchmarks.md#start-up)).")


def with_block(current: str, begin: str, end: str, block: str) -> str:
    start, stop = current.find(begin), current.find(end)
    if start < 0 or stop < start:
        return current
    return current[:start] + begin + block + end + current[stop + len(end):]


def race_section() -> list[str]:
    r = load(RACE_UNDER_LOAD)
    names = {"idle": "idle", "hogs": "three CPU hogs beside it", "switching": "hogs on and off every 3 s",
             "second": "a second specviz racing beside it"}
    out = ["## The race under load", "",
           f"`python -m specviz.cli.bench --race-under-load --races 5`: the default example's race through the app's "
           f"own code, idle and under load ({r['machine']}, {r['date']}). \"Interleaved\" is how the app races; "
           "\"sequential\" is two runs one after the other, for contrast.", "",
           "| condition | race | threads | speedups | median | spread | flagged | spec / std tok/s |",
           "|---|---|---|---|---|---|---|---|"]
    for s in r["summary"]:
        out.append(f"| {names.get(s['condition'], s['condition'])} | {s['mode'].replace(' (before)', '')} | "
                   f"{', '.join(map(str, s['threads']))} | {', '.join(f'{x:.2f}' for x in s['speedups'])} | "
                   f"**{s['median']:.2f}×** | {s['spread'] * 100:.0f} % | {s['flagged']} of {s['n']} | "
                   f"{s['spec_tok_s']:.1f} / {s['std_tok_s']:.1f} |")
    return out + [""]


def crowd_section() -> list[str]:
    name, cpu, date = CROWD
    c = load(name)
    s = c["settings"]
    rooms = c["rooms"]
    out = ["## A room", "",
           f"`python scripts/crowd.py --launch --attendees {s['attendees']} --seconds {s['seconds']:.0f} --compare "
           f"--adversaries {s['adversaries']}` on the {cpu} ({date}): {s['attendees']} attendees, {s['unique']} of "
           "them writing prompts of their own, the rest clicking the examples; then the same beside "
           f"{s['adversaries']} adversaries (other executions, hub presets, refused values, big uploads and exports).",
           "", "| room | requests served | example: p50 / p95 to a result | own prompts: served, told to retry |",
           "|---|---|---|---|"]
    for room, r in rooms.items():
        ex, un = r["example"], r["unique"]
        out.append(f"| {room} | {r['served']} of {r['attendees']} | {ex['total_p50']:.1f} / {ex['total_p95']:.1f} s | "
                   f"{un['served']} of {un['n']}, {un['told_to_retry']} |")
    srv = c["server"]
    out += ["", f"Server memory: {srv['rss_rest_mb'] / 1024:.1f} GB at rest, {srv['rss_peak_mb'] / 1024:.1f} GB at "
                f"its peak; {srv['tracebacks']} tracebacks.", ""]
    return out


CLASS = (("classroom-60-epyc-zen5.json", "alone"), ("classroom-60-beside-soak-epyc-zen5.json",
                                                   "beside `scripts/soak.py` (a public page's visitors)"))
CLASS_CPU = ("2-core AMD EPYC, Zen 5", "2026-12-07")


def class_section() -> list[str]:
    """A class (`scripts/classroom.py`): a teacher stepping through a recording, 60 attendees following and racing."""
    cpu, date = CLASS_CPU
    rows = [(where, load(name)) for name, where in CLASS if (DATA / name).exists()]
    if not rows:
        return []
    n = rows[0][1]["attendees"]
    out = ["## A class", "",
           f"`python scripts/classroom.py --attendees {n}` on the {cpu} ({date}): a teacher steps through a recording "
           f"({rows[0][1]['steps']} rounds), {n} attendees follow (each page's own poll and change events, "
           f"{rows[0][1].get('second_tabs', 0)} of them with a second tab), then each runs a race on the tiny pair and posts it. Follow: from the teacher's page "
           "showing a round to an attendee's page showing it (the round's views answered).", "",
           "| server | follow p50 / p95 / max | (attendee, round) pairs timed | skipped, never seen | points counted "
           "| a point on the teacher's plot, p95 | tracebacks |", "|---|---|---|---|---|---|---|"]
    for where, c in rows:
        out.append(f"| {where} | {c['follow_p50_s']:.2f} / **{c['follow_p95_s']:.2f}** / {c['follow_max_s']:.2f} s | "
                   f"{c['follow_pairs_timed']} of {c['follow_pairs']} | {c['follow_skipped']}, "
                   f"{c['follow_never_seen']} | {c['points_on_teacher_page']} of {c['points_posted']} | "
                   f"{c['point_visible_p95_s']:.1f} s | {c['tracebacks']} |")
    return out + [""]


def index_section() -> list[str]:
    out = ["## The data files", "",
           "Every measurement above, and the earlier ones, in `docs/benchmarks/data/` (the app reads none of them; "
           "the probe curves the This machine tab draws stay in `assets/hardware/`).", "",
           "| file | what | machine |", "|---|---|---|"]
    for path in sorted(DATA.glob("*.json")):
        kind = next((words for prefix, words in KINDS if path.name.startswith(prefix)), "measurement")
        machine = next((words for key, words in MACHINES if key in path.name), "")
        what = kind
        if path.name.startswith("bench-"):
            b = load(path.name)
            top = best(b) if speculative(b) else None
            agg = b["aggregate"]
            parts = [f"standard {f2(median(agg['standard']['tok_s']))}"] if "standard" in agg else []
            if top:
                parts.append(f"best speculative {f2(median(agg[top]['tok_s']))}")
            if "llamacpp" in agg:
                parts.append(f"llama.cpp {f2(median(agg['llamacpp']['tok_s']))}")
            what = f"bench: {', '.join(parts)} tok/s"
        out.append(f"| [{path.name}](benchmarks/data/{path.name}) | {what} | {machine} |")
    return out + [""]


def document() -> str:
    lines = ["# Benchmarks", "",
             "<!-- Generated by scripts/gen_benchmarks.py from docs/benchmarks/data/*.json: do not edit by hand. -->",
             "", "Current figures for each kind of machine measured. Every number comes from a JSON file in "
             "[data/](benchmarks/data/); `python scripts/gen_benchmarks.py` rewrites this page and the README's "
             "table from them. How the figures are taken, and why they come out as they do: [executions.md]"
             "(executions.md) and [timing.md](timing.md).", "",
             "Reproduce a CPU row (llama-cpp-python is optional; without it drop `--compare-llamacpp`):", "",
             "```bash",
             "python -m specviz.cli.bench --drafter hybrid --policy adaptive --versus adaptive \\",
             "    --gamma 2 --gamma-max 6 --compare-hf --compare-llamacpp --no-bf16-baseline \\",
             "    --draft-vocab reduced --repeats 2 --json bench.json",
             "```", "",
             "Columns: α, the share of drafted tokens accepted; c, a draft step's time over a standard step's; "
             "verify +, what a verify pass costs beyond a standard step; greedy = standard, on how many prompts "
             "the text equals specviz's standard decoding (transformers and llama.cpp differ on a few near-ties: "
             "other kernels round differently).", "",
             "## Summary", "", *summary_rows(), ""]
    for cls in CURRENT:
        lines += cpu_section(cls)
    lines += gpu_section() + start_section() + race_section() + crowd_section() + class_section() + index_section()
    text = "\n".join(lines).rstrip() + "\n"
    return re.sub(r"[ \t]+\n", "\n", text)


def readme_text(current: str) -> str:
    """README.md with its table between the markers replaced (unchanged when the markers are absent)."""
    start, end = current.find(BEGIN), current.find(END)
    if start >= 0 and end > start:
        current = current[:start] + readme_block() + current[end + len(END):]
    return with_block(current, STARTUP_BEGIN, STARTUP_END, startup_sentence())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/benchmarks.md or README.md's table is stale")
    args = ap.parse_args(argv)
    wanted = {OUT: document()}
    if README.is_file():
        current = README.read_text(encoding="utf-8")
        wanted[README] = readme_text(current)
    if HOSTING.is_file():
        wanted[HOSTING] = with_block(HOSTING.read_text(encoding="utf-8"), STARTUP_BEGIN, STARTUP_END,
                                     startup_sentence().replace("docs/benchmarks.md", "benchmarks.md"))
    stale = [p for p, text in wanted.items() if not p.is_file() or p.read_text(encoding="utf-8") != text]
    if args.check:
        for p in stale:
            print(f"{p.relative_to(ROOT)} is not what scripts/gen_benchmarks.py writes: run it", file=sys.stderr)
        return 1 if stale else 0
    for p in stale:
        p.write_text(wanted[p], encoding="utf-8")
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
