""""Download as a page" made in a child process (specviz.cli.page_worker, issue 33): the same page as the
in-process function, a failure in the child answered with the same one-line message (no traceback in the
log), nothing left behind, and no more children than the exports' slots."""

from __future__ import annotations

import logging
import re
import subprocess
import threading
from pathlib import Path

import pytest

from specviz.trace import load_recording
from specviz.ui.store import as_session
from specviz.views.export_page import export_page

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "assets" / "traces").glob("*.json"))
MINUTE = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC")  # the page says when it was made


def same_page(a: str, b: str) -> bool:
    return MINUTE.sub("<when>", a) == MINUTE.sub("<when>", b)


@pytest.fixture
def exports(tmp_path, monkeypatch):
    from specviz.ui import export_ui

    monkeypatch.setenv("SPECVIZ_EXPORT_DIR", str(tmp_path))
    monkeypatch.setattr(export_ui, "WORKERS", export_ui.PageWorkers())
    monkeypatch.setattr(export_ui, "EXPORTS", export_ui.ExportSlots(limit=2, max_bytes=8 * 2**20))
    return tmp_path


@pytest.mark.parametrize("name", [SHIPPED[0].stem, SHIPPED[2].stem])
def test_the_childs_page_is_the_in_process_page(exports, name):
    from specviz.ui import export_ui, live

    frame = live.load_example_recording(SHIPPED, f"{name}.json")
    file, status = export_ui.download_page(frame.state)
    assert file["visible"] is True and not isinstance(status, str)
    assert export_ui.WORKERS.most == 1 and export_ui.WORKERS.running == 0  # it was made by a child
    spec, std = load_recording((ROOT / "assets" / "traces" / f"{name}.json").read_bytes())
    here = export_page(spec, std, source="exported from the specviz app")
    assert same_page(Path(file["value"]).read_text(encoding="utf-8"), here)
    assert not list(exports.glob(".specviz-src-*"))  # the recording handed to the child is gone


def test_a_page_the_child_cannot_make_gets_one_clear_line_and_leaves_nothing(exports, caplog):
    from specviz.ui import export_ui

    spec, std = load_recording(SHIPPED[2].read_bytes())
    spec.rounds = spec.rounds[::-1]  # held in memory, but no file of it loads: the child refuses it
    with caplog.at_level(logging.INFO, logger="specviz.app"):
        file, status = export_ui.download_page({"spec": spec, "std": std})
    assert file["visible"] is False and file["value"] is None
    assert 'data-kind="error"' in status and "Could not make the page: " in status
    assert "rounds" in status and "Traceback" not in status
    records = [r for r in caplog.records if "page export failed" in r.getMessage()]
    assert len(records) == 1 and records[0].exc_info is None and "\n" not in records[0].getMessage()
    assert list(exports.iterdir()) == []  # neither the recording handed over nor a half page


def test_the_worker_refuses_in_one_line_and_writes_nothing(tmp_path):
    from specviz.cli import page_worker

    bad, out = tmp_path / "bad.json", tmp_path / "page.html"
    bad.write_text('{"schema": "specviz.recording", "version": 99}')
    done = subprocess.run([__import__("sys").executable, "-m", "specviz.cli.page_worker", str(bad), str(out), "x"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == page_worker.FAILED and not out.exists()
    assert done.stderr.strip().count("\n") == 0 and "unsupported recording version 99" in done.stderr
    assert "Traceback" not in done.stderr


def test_no_more_children_than_slots(exports, monkeypatch):
    from specviz.ui import export_ui

    spec, std = load_recording(SHIPPED[2].read_bytes())
    state = {"spec": spec, "std": std}
    real_run, started, release = subprocess.run, threading.Semaphore(0), threading.Event()

    def held_run(*a, **k):  # the child starts only when the test lets it: two are in the making at once
        started.release()
        assert release.wait(60)
        return real_run(*a, **k)

    monkeypatch.setattr(export_ui.subprocess, "run", held_run)
    out: dict[str, tuple] = {}

    def export(session: str) -> None:
        with as_session(session):
            out[session] = export_ui.download_page(state)

    threads = [threading.Thread(target=export, args=(s,)) for s in ("a", "b")]
    for t in threads:
        t.start()
    assert started.acquire(timeout=30) and started.acquire(timeout=30)
    assert export_ui.WORKERS.running == 2
    with as_session("c"):  # a third session is answered at once: no third child
        page, status = export_ui.download_page(state)
    assert page["value"] is None and "making 2 other page(s)" in status
    release.set()
    for t in threads:
        t.join(120)
    assert export_ui.WORKERS.most == 2 and export_ui.WORKERS.running == 0
    for s in ("a", "b"):
        assert out[s][0]["visible"] and Path(out[s][0]["value"]).is_file()
