"""Where the browser tests find Chromium, and what a missing one means.

The browser tests drive Debian's Chromium (``/usr/bin/chromium``, or ``$SPECVIZ_CHROMIUM``) through Playwright;
Playwright's own browser download is never used.  On a machine without it the README's test command still
passes: every browser test is skipped, and pytest's short summary (``-ra``, in pytest.ini) folds them into
one line with their count and the command that installs Chromium.  Where ``CI`` is set (``.ci/run`` sets it,
as most CI services do) a missing Chromium is an error: CI installs it, so the browser tests must run there.

Light on purpose (no Playwright, no app): tests/conftest.py reads it for every browser test before any fixture
starts, so a skipped browser test never starts the app server.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

CHROMIUM = os.environ.get("SPECVIZ_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"]
INSTALL = "apt-get install chromium"

Decision = Literal["run", "skip", "error"]


def in_ci(env: Mapping[str, str] = os.environ) -> bool:
    """CI is set to anything but empty or an explicit no ("0", "false", "no", "off")."""
    return env.get("CI", "").strip().lower() not in ("", "0", "false", "no", "off")


def decide(chromium_present: bool, ci: bool) -> Decision:
    """Run the browser tests where Chromium is; without it, skip them, except in CI, where it is an error."""
    if chromium_present:
        return "run"
    return "error" if ci else "skip"


def skip_reason(path: str = CHROMIUM) -> str:
    """One reason for every skipped browser test: pytest's -ra summary folds them into one line with a count."""
    return (f"browser tests skipped: no Chromium at {path}; install it with `{INSTALL}` "
            "(or point SPECVIZ_CHROMIUM at one; never `playwright install`)")


def error_message(path: str = CHROMIUM) -> str:
    return (f"no Chromium at {path}, and CI is set: CI must run the browser tests. Install Debian's "
            f"(`{INSTALL}`, as .ci/run does) or point SPECVIZ_CHROMIUM at one; never `playwright install`")


def decision(path: str = CHROMIUM, env: Mapping[str, str] = os.environ) -> Decision:
    return decide(Path(path).exists(), in_ci(env))
