"""Without Chromium the browser tests skip (one summary line: how many, and `apt-get install chromium`),
except where CI is set, where a missing Chromium is an error (tests/chromium.py, tests/conftest.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import chromium

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("present, ci, expected", [
    (True, False, "run"), (True, True, "run"),  # Chromium there: the browser tests run, in CI or not
    (False, False, "skip"),  # a fresh machine: the README's command still passes
    (False, True, "error"),  # CI installs Chromium, so a missing one is a broken CI, never a quiet skip
])
def test_a_missing_chromium_skips_except_in_ci(present, ci, expected):
    assert chromium.decide(present, ci) == expected


@pytest.mark.parametrize("value, ci", [
    (None, False), ("", False), ("0", False), ("false", False), ("False", False), ("no", False),
    ("1", True), ("true", True), ("yes", True), ("github", True),
])
def test_ci_is_any_value_but_empty_or_no(value, ci):
    env = {} if value is None else {"CI": value}
    assert chromium.in_ci(env) is ci


def test_the_decision_reads_the_path_and_ci(tmp_path):
    there = tmp_path / "chromium"
    there.write_text("")
    missing = str(tmp_path / "nowhere")
    assert chromium.decision(str(there), {}) == "run"
    assert chromium.decision(missing, {}) == "skip"
    assert chromium.decision(missing, {"CI": "1"}) == "error"
    assert "apt-get install chromium" in chromium.skip_reason(missing) and missing in chromium.skip_reason(missing)


def test_ci_script_sets_ci():
    """.ci/run installs Chromium and sets CI, so its browser tests run (or fail), never skip."""
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^export .*\bCI=1\b", script, re.M), "`.ci/run` must export CI=1"
    assert "apt-get install -y -qq chromium" in script


def _pytest_without_chromium(ci: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS")}
    env["SPECVIZ_CHROMIUM"] = str(ROOT / "no-such-chromium")
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "tests/test_export_browser.py", "-n", "0", "-q",
                           "-p", "no:cacheprovider", "--durations=0"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_the_suite_without_chromium_passes_with_one_line_and_fails_in_ci():
    """The real run, on the smallest browser module: skipped with one folded summary line (its count and the
    install command) and exit 0; with CI=1, errors and a failing exit status."""
    local = _pytest_without_chromium(None)
    out = local.stdout + local.stderr
    assert local.returncode == 0, out
    lines = [line for line in out.splitlines() if "no Chromium" in line]
    assert len(lines) == 1, out
    assert re.match(r"SKIPPED \[2\] .*browser tests skipped: no Chromium at .*`apt-get install chromium`", lines[0]), out
    assert re.search(r"\b2 skipped\b", out), out

    ci = _pytest_without_chromium("1")
    out = ci.stdout + ci.stderr
    assert ci.returncode == 1, out
    assert re.search(r"\b2 errors\b", out) and "CI is set" in out, out
