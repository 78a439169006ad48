"""Start app.py with a slow prompt pass and slow drafting, for the abandoned-run tests (test-only code).

Every forward pass of at least SPECVIZ_TEST_FEED_TOKENS (default 8) new tokens -- a chunk of a long prompt's
pass (core.kv.feed_prompt; SPECVIZ_PROMPT_CHUNK sets their size), never a decoding round of a small γ -- first
sleeps SPECVIZ_TEST_FEED_DELAY seconds (default 0.3), so a long prompt's pass on the tiny pair takes as long as a
real model's; then tests/slow_drafter_app.py slows the drafts (SPECVIZ_TEST_DRAFT_DELAY) and runs app.py.
Nothing in the app knows about this.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specviz.core import kv  # noqa: E402

DELAY_S = float(os.environ.get("SPECVIZ_TEST_FEED_DELAY", "0.3"))
MIN_TOKENS = int(os.environ.get("SPECVIZ_TEST_FEED_TOKENS", "8"))
_real_feed = kv.CachedLM.feed


def _slow_feed(self, ids, keep=1, hidden=False):
    if len(ids) - self.cached >= MIN_TOKENS:
        time.sleep(DELAY_S)
    return _real_feed(self, ids, keep, hidden)


kv.CachedLM.feed = _slow_feed
runpy.run_path(str(ROOT / "tests" / "slow_drafter_app.py"), run_name="__main__")
