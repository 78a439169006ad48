"""Shared test setup. Set before anything imports huggingface_hub/gradio, which read these at import."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the network
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


import sys  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _no_replays_across_tests():
    """The recording cache is per process: a run cached by one test must not turn another
    test's identical request into a replay."""
    replay = sys.modules.get("specviz.serving.replay")
    if replay is not None:
        replay.CACHE.clear()
    yield
