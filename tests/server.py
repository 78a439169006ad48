"""Launch the real app in a subprocess for API, load and browser tests."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, url: str, proc: subprocess.Popen, log_path: Path):
        self.url, self.proc, self.log_path = url, proc, log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def launch_app(tmp_dir: Path, env: dict[str, str] | None = None, timeout: float = 180.0,
               script: Path = ROOT / "app.py") -> Iterator[Server]:
    """Start `python app.py` (or a test's wrapper ``script`` that launches it) on a free port;
    yield when it answers; stop it afterwards."""
    port = free_port()
    log_path = tmp_dir / f"app-{port}.log"
    full_env = {**os.environ, "PORT": str(port), "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_ANALYTICS_ENABLED": "False",
                "HF_HUB_OFFLINE": "1", "SPECVIZ_PRELOAD": "0", "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env=full_env, stdout=log,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_for_page(proc, url, timeout, log_path)
        yield Server(url, proc, log_path)
    finally:
        stop_process(proc)


def wait_for_page(proc: subprocess.Popen, url: str, timeout: float, log_path: Path | str, poll: float = 0.5) -> None:
    """Return once ``url`` answers 200; RuntimeError (with the log's tail) if the app exits or ``timeout`` passes."""
    deadline = time.perf_counter() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"app exited with {proc.returncode}:\n{Path(log_path).read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.perf_counter() > deadline:
            raise RuntimeError(f"app did not start in {timeout:.0f}s:\n{Path(log_path).read_text()[-3000:]}")
        time.sleep(poll)


def stop_process(proc: subprocess.Popen) -> None:
    """Terminate a server, killing it if it does not exit within 20 s."""
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
