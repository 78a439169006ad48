"""The Drafter contract, for the drafters: it lives in specviz.core.drafting, beside the engine that
calls it (the core imports no drafter); a drafter imports it from here or from there."""

from ..core.drafting import ChainDrafter, DraftContext, Drafter, DraftStep, one_hot

__all__ = ["ChainDrafter", "DraftContext", "DraftStep", "Drafter", "one_hot"]
