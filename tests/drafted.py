"""The engine's speculative runs for the tests, each handed the drafter its settings name, built as
the app builds it (specviz.drafters.make_drafter): the engine takes its drafter from its caller.
A test that passes its own ``drafter=`` keeps it."""

from __future__ import annotations

from typing import Any

from specviz.core import engine
from specviz.drafters import make_drafter


def speculative_stream(pair: Any, prompt_ids: list[int], settings: Any, **kw: Any):
    kw["drafter"] = kw.get("drafter") or make_drafter(pair, settings)
    return engine.speculative_stream(pair, prompt_ids, settings, **kw)


def speculative_decode(pair: Any, prompt_ids: list[int], settings: Any, **kw: Any):
    kw["drafter"] = kw.get("drafter") or make_drafter(pair, settings)
    return engine.speculative_decode(pair, prompt_ids, settings, **kw)
