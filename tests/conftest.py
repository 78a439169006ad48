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


# --------------------------------------------------------------------------------------------------
# Test tiers.  `python -m pytest -m "not slow"` is a contributor's inner loop (tiny random models,
# no servers, no browser: under two minutes on a 2-core machine); `python -m pytest` -- the README's
# command, and CI's -- runs everything.  Markers are given per file, here, so a new test inherits
# its file's tier: real_model (loads the default pair), server (starts the app), browser (drives
# chromium).  Every marked file is also "slow", as are files whose tiny-model tests take long.
# --------------------------------------------------------------------------------------------------

TIERS: dict[str, tuple[str, ...]] = {
    "test_real_pair.py": ("real_model",),
    "test_models.py": ("real_model",),
    "test_speculator.py": ("real_model",),
    "test_tree.py": ("real_model",),
    "test_api.py": ("server", "real_model"),
    "test_fuzz.py": ("server",),
    "test_load.py": ("server",),
    "test_crowd.py": ("server",),
    "test_hosting.py": ("server",),
    "test_hardening.py": ("server",),
    "test_browser.py": ("browser", "server"),
    "test_shootout_browser.py": ("browser", "server"),
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        for name in TIERS.get(item.path.name, ()):
            item.add_marker(getattr(pytest.mark, name))
        if item.path.name in TIERS:
            item.add_marker(pytest.mark.slow)
