"""The drafters: everything that proposes tokens for the target to verify.

The contract is in `base.py`.  Adding a drafter is one new module here plus one
line in DRAFTERS (name -> (label shown on the page, "module:Class")) and its name in
specviz.core.settings.DRAFTER_NAMES (what settings accept: the settings never import the
drafters, which import torch; a test checks that the two agree).
"""

from __future__ import annotations

import importlib
from typing import Any

from .base import ChainDrafter, DraftContext, Drafter, DraftStep, one_hot

DRAFTERS: dict[str, tuple[str, str]] = {
    "model": ("draft model", "draft_model:ModelDrafter"),
    "prompt-lookup": ("prompt lookup (n-grams)", "prompt_lookup:PromptLookupDrafter"),
    "tree": ("draft model, token tree", "tree.drafter:TreeDrafter"),
    "speculator": ("learned head (MLP speculator)", "speculator:SpeculatorDrafter"),
    "hybrid": ("draft model + prompt lookup", "hybrid:HybridDrafter"),
}


def drafter_class(name: str) -> type[Drafter]:
    module, cls = DRAFTERS[name][1].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


def make_drafter(pair: Any, settings: Any) -> Drafter:
    """The drafter named by settings.drafter, built for a loaded pair."""
    return drafter_class(settings.drafter).for_pair(pair, settings)


__all__ = ["DRAFTERS", "ChainDrafter", "DraftContext", "DraftStep", "Drafter", "drafter_class", "make_drafter", "one_hot"]
