"""Start app.py with a slow draft model, for the browser test of live drafting (test-only code).

The draft model's drafter sleeps SPECVIZ_TEST_DRAFT_DELAY seconds (default 0.4) before
yielding each token (the tree drafter before each depth level), so a round's drafts arrive one by one slowly enough for a browser to
see a round with some of its drafts shown and the rest still to come.  Nothing in the
app knows about this: the patch is applied here, before app.py runs.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specviz.drafters import draft_model  # noqa: E402
from specviz.drafters.tree import drafter as tree  # noqa: E402

DELAY_S = float(os.environ.get("SPECVIZ_TEST_DRAFT_DELAY", "0.4"))
_real_draft = draft_model.ModelDrafter.draft


def _slow_draft(self, ctx):
    steps = _real_draft(self, ctx)
    try:
        for step in steps:
            time.sleep(DELAY_S)
            yield step
    finally:
        steps.close()  # the engine closes this generator when it stops drafting: close the real one too


def _slow_grow(self, ctx, eos, policy=None):
    levels = _real_grow(self, ctx, eos, policy)
    try:
        for grown in levels:
            time.sleep(DELAY_S)
            yield grown
    finally:
        levels.close()


draft_model.ModelDrafter.draft = _slow_draft
# The tree drafter too: one delay per drafted depth, so a tree is seen growing level by level.
_real_grow = tree.TreeDrafter.grow
tree.TreeDrafter.grow = _slow_grow
runpy.run_path(str(ROOT / "app.py"), run_name="__main__")
