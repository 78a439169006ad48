"""Warm start, measured (issue 34): launch the app and time how long until it serves a live run.

Starts ``app.py`` on a free port (caches already filled: the default pair converted, the probe run),
then asks ``/trace`` for one new token of a prompt no recording holds (so the replay cache cannot
answer it) as soon as the page answers, and reports:

- page: launch -> the page answers HTTP 200;
- served: launch -> that 1-token run's finished recording arrives (the goal: <= 12 s);
- warm: launch -> the log says the models' fast kernels are all in place ("weights prepared"), if it does.

    python scripts/warm_start.py --starts 3            # the median of three starts
    python scripts/warm_start.py --starts 3 --json out.json

Run it on an idle machine; the CPU is named in the output.  gradio_client is imported before the
launch, so its import is not counted; specviz's bytecode cache is filled first (compileall), as a
deployment's first start fills it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gradio_client import Client

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.server import free_port, wait_for_page  # noqa: E402
from specviz.hardware.machine import cpu_flags, cpu_name  # noqa: E402

WARM_LINE = re.compile(r"weights prepared")


def one_start(timeout: float = 300.0) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", prefix="warm-start-", delete=False)
    env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
           "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    rec_launch = time.time()
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py")], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    rec: dict = {"log": log.name, "launched_at": rec_launch}
    try:
        wait_for_page(proc, url, timeout, log.name, poll=0.1)
        rec["page_s"] = round(time.perf_counter() - t0, 2)
        client = Client(url, verbose=False)
        prompt = f"Warm start {time.time_ns()}: write a haiku about caches."  # never recorded: a live run
        result = client.predict(prompt, api_name="/trace", max_new_tokens=1, standard=False)
        rec["served_s"] = round(time.perf_counter() - t0, 2)
        rec["replay"] = bool(result.get("replay"))
        deadline = time.perf_counter() + 120
        while time.perf_counter() < deadline:
            text = Path(log.name).read_text(errors="replace")
            if WARM_LINE.search(text):
                rec["warm_s"] = round(time.perf_counter() - t0, 1)  # to within the 0.5 s poll
                break
            time.sleep(0.5)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--json", type=Path, help="write the starts and their medians here")
    args = ap.parse_args(argv)
    # A warm start has Python's bytecode cache too: a deployment writes it at its first start, unless
    # PYTHONDONTWRITEBYTECODE is set (as on the machines these figures came from), where every start would
    # compile each module changed since its last .pyc instead (~150 of specviz's after a day's edits).
    import compileall

    compileall.compile_dir(str(ROOT / "specviz"), quiet=1)
    starts = []
    for k in range(args.starts):
        rec = one_start()
        print(f"start {k + 1}: page {rec['page_s']} s, first live run served {rec['served_s']} s"
              + (f", fast kernels in place {rec['warm_s']} s" if "warm_s" in rec else "")
              + (" (a replay!)" if rec["replay"] else ""), flush=True)
        starts.append(rec)
    summary = {"cpu": f"{cpu_name()} ({', '.join(sorted(cpu_flags() & {'avx2', 'avx512_vnni', 'avx512_bf16', 'amx_bf16'}))})", "starts": starts,
               "median_page_s": statistics.median(s["page_s"] for s in starts),
               "median_served_s": statistics.median(s["served_s"] for s in starts)}
    print(f"median: page {summary['median_page_s']} s, served {summary['median_served_s']} s on {summary['cpu']}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
