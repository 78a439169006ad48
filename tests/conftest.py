"""Shared test setup. Set before anything imports huggingface_hub/gradio, which read these at import."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the network
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


import contextlib  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
from _pytest.nodeid import coerce_node_id  # noqa: E402

# --------------------------------------------------------------------------------------------------
# The user's specviz cache is never written by a run (issue 65: a probe taken beside the suite, on a busy
# machine, was left there marked measured).  The run's controller (xdist's, or the one process with -n 0) gives
# itself and every process it starts -- xdist's workers, the app servers tests launch, the scripts they run, all
# of which inherit the environment -- a cache of its own (SPECVIZ_CACHE = a locked slot under
# $SPECVIZ_TEST_CACHE, by default ~/.cache/specviz-tests: records emptied each run, kernel builds kept, the user's
# converted models read through links), checksums the user's cache before and fails the run if it changed
# (tests/cache_guard.py; SPECVIZ_TEST_CACHE_GUARD=0 reports without failing).
# --------------------------------------------------------------------------------------------------
_GUARD: list = []


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # a worker: the controller's environment (its slot) is inherited
    from tests import cache_guard

    _GUARD.append(cache_guard.setup())


def pytest_sessionfinish(session, exitstatus):
    """In the controller, after every worker is done: the user's cache as it was before the run, or a failed run."""
    if not _GUARD:
        return
    guard = _GUARD[0]
    if guard.check() and guard.fails and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if _GUARD and _GUARD[0].report:
        guard = _GUARD[0]
        terminalreporter.section(f"the run changed the user's specviz cache ({guard.user})", red=guard.fails)
        for line in guard.report[:40]:
            terminalreporter.line(line)
        if len(guard.report) > 40:
            terminalreporter.line(f"... and {len(guard.report) - 40} more")
        terminalreporter.line(f"(the run's own cache: {guard.slot}; tests/cache_guard.py.  Another program writing the "
                              "user's cache meanwhile -- the app, a script -- changes it too: SPECVIZ_TEST_CACHE_GUARD=0 "
                              "reports without failing)")


@pytest.fixture(autouse=True)
def _no_replays_across_tests():
    """The recording cache is per process: a run cached by one test must not turn another
    test's identical request into a replay."""
    replay = sys.modules.get("specviz.serving.replay")
    if replay is not None:
        replay.CACHE.clear()
    yield


@pytest.fixture(autouse=True)
def _one_torch_thread_for_tiny_models(request):
    """Tiny random models are bound by per-operation overhead, not arithmetic: a second intra-op thread
    only adds synchronisation, and on a shared 2-core machine (an app server or Chromium beside the
    tests) its spin-waits made them up to 10x slower.  Tests of the real pair keep every thread."""
    torch = sys.modules.get("torch")
    if torch is None or request.node.get_closest_marker("real_model") is not None:
        yield
        return
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


# The real default pair, loaded once for the session's real-pair tests (test_real_pair, test_speculator,
# test_tree).  load_pair's own cache keeps only the last two pairs, and any tiny pair loaded between two
# modules pushed the fp32 pair out: it was loaded three times.
@pytest.fixture(scope="session")
def real_pair_fp32():
    """fp32 target: batched verification and one-token steps agree to the last bit that matters for
    argmax.  The draft's precision never affects exactness (int8 keeps it fast)."""
    import specviz.hardware  # noqa: F401  (installs the probe: a recorded probe is attached to the pair)
    from specviz.models import DEFAULT_PRESET, load_pair

    return load_pair(DEFAULT_PRESET, dtype="float32", draft_quant="int8")


IS_PRIME = "Write a Python function `is_prime(n)`."


@pytest.fixture(scope="session")
def is_prime_standard(real_pair_fp32):
    """(prompt, prompt ids, standard greedy decoding of 24 tokens) on the fp32 pair: the reference that
    test_real_pair, test_speculator and test_tree each compare a speculative run with (decoded once: ~15 s)."""
    from specviz.core.engine import standard_decode
    from specviz.core.settings import DecodeSettings
    from specviz.models import encode_prompt

    ids = encode_prompt(real_pair_fp32, IS_PRIME)
    return IS_PRIME, ids, standard_decode(real_pair_fp32, ids, DecodeSettings(temperature=0.0, max_new_tokens=24),
                                          prompt=IS_PRIME)


@pytest.fixture(scope="session")
def real_pair_int8():
    """The batch-invariant int8 target an AVX2-only CPU chooses."""
    import specviz.hardware  # noqa: F401  (installs the probe: a recorded probe is attached to the pair)
    from specviz.models import DEFAULT_PRESET, load_pair

    return load_pair(DEFAULT_PRESET, draft_quant="int8", target_exec="int8")


# --------------------------------------------------------------------------------------------------
# Test tiers.  `python -m pytest -m "not slow"` is a contributor's inner loop (tiny random models,
# no servers, no browser: under two minutes on a 2-core machine); `python -m pytest` -- the README's
# command, and CI's -- runs everything.  Markers are given per file, here, so a new test inherits
# its file's tier: real_model (loads the default pair), server (starts the app), browser (drives
# chromium).  Every file named here is also "slow", and so are the long tiny-model tests in SLOW_TESTS.
# Files that mix tiny-model tests with a few on the real pair (models, speculator, tree) mark those
# few themselves (@pytest.mark.real_model): the rest run on one torch thread (the fixture above).
# --------------------------------------------------------------------------------------------------

TIERS: dict[str, tuple[str, ...]] = {
    "test_real_pair.py": ("real_model",),
    "test_models.py": (),  # its real-pair test is marked in the file
    "test_speculator.py": (),  # likewise
    "test_tree.py": (),  # likewise
    "test_api.py": ("server", "real_model"),
    "test_fuzz.py": ("server",),
    "test_load.py": ("server",),
    "test_crowd.py": ("server",),
    "test_hosting.py": ("server",),
    "test_hardening.py": ("server",),
    "test_attacks.py": ("server",),  # issue 62's attacks, each on a server of its own settings
    "test_browser.py": ("browser", "server"),
    "test_shootout_browser.py": ("browser", "server"),
    "test_present_browser.py": ("browser", "server"),
    "test_challenges_browser.py": ("browser", "server"),
    "test_export_browser.py": ("browser",),
    "test_layout_browser.py": ("browser", "server"),
    "test_links_browser.py": ("browser", "server"),
    "test_classroom_browser.py": ("browser", "server"),
}


# Tiny-model tests that still take 3-50 s on a 2-core machine (the χ² exactness runs draw thousands of
# samples): slow, by name.  The inner loop keeps one exactness test, the chain rule's own (test_rule).
SLOW_TESTS = (
    "test_trees_shaped_by_a_measured_policy_stay_exact", "test_speculative_sampling_is_exact",
    "test_over_acceptance_matches_recorded_distribution", "test_uno_variant_samples_from_p_after_rejection",
    "test_speculative_sampling_with_an_int8_target_is_exact", "test_first_two_tokens_follow_the_target",
    "test_first_three_tokens_follow_the_target_joint", "test_a_different_drafter_plugs_in_and_stays_exact",
    "test_requests_never_name_the_evaluation_prompts", "test_epsilon_biases_the_output_by_the_predicted_amount",
    "test_a_wrong_residual_is_caught", "test_every_module_imports_first_in_a_fresh_interpreter",
    "test_the_walk_is_not_counted_by_the_decoding_clock", "test_the_engine_imports_no_ui",
    "test_each_rule_emits_the_targets_joint_on_the_toy", "test_the_engine_emits_the_targets_joint_under_each_rule",
    "test_a_block_residual_without_its_weight_is_caught",
)


# Two processes (pytest-xdist, `-n 2 --dist loadgroup` in pytest.ini), and what keeps them within 24 GiB.
# The tests that hold big models -- those on the shared app server and Chromium (the server's default pair
# takes ~5.5 GiB) and those on the real pair in process (fp32 and int8 pairs: ~14 GiB of RSS) -- are one
# xdist group, so they run on one worker, in the order below: the app's first, then the server stops, then
# the real pairs load, as in a single process.  Everything else (tiny models, the app started with other
# settings on the tiny pair, pure functions) runs on the other worker meanwhile, a file at a time, and on
# both once the group is done.  Two workers each with their own server and real pairs ran the machine out
# of memory (2026-11-24); one such group beside tiny models stays under ~18 GiB.
HEAVY_FIXTURES = ("server", "browser")  # directly or through another fixture (a page needs both)


def heavy(item) -> bool:
    """On the real pair, or on the shared server or Chromium (APP_MODULES; test_fuzz's `server` is its own)."""
    shared = item.path.name in APP_MODULES and any(f in item.fixturenames for f in HEAVY_FIXTURES)
    return shared or item.get_closest_marker("real_model") is not None


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the xdist_group markers added here
def pytest_collection_modifyitems(config, items):
    for item in items:
        for name in TIERS.get(item.path.name, ()):
            item.add_marker(getattr(pytest.mark, name))
        if item.path.name in TIERS or item.originalname in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
        # A file's tests stay on one worker (module fixtures such as test_fuzz's server start once, and
        # a test may read what an earlier one in its file recorded).
        group = "big-models" if heavy(item) else item.path.name
        item.add_marker(pytest.mark.xdist_group(group))
        if getattr(config.option, "loadgroup", False):
            # What xdist's loadgroup does with the marker, done here: pytest-xdist 3.8 appends the group to
            # `item._nodeid`, which pytest 9 no longer reads (a node's id is `_id`), so every test would be
            # scheduled on its own -- two workers each loading real pairs.
            item._id = coerce_node_id(f"{item.nodeid}@{group}")
    items.sort(key=lambda item: item.path.name not in APP_MODULES)  # the app's modules first (stable: in order)


# --------------------------------------------------------------------------------------------------
# One app server and one Chromium for the modules that take the app as it ships.  Starting `python
# app.py` costs ~15-30 s on a 2-core machine (torch, transformers and Gradio imported; the tiny pair
# built; the default pair loaded on first use).  Modules that need other settings (test_fuzz: no custom
# pairs; test_hardening: a 64-token prompt limit; test_load's queue and session-limit tests, one for
# both) start their own.
# These modules run first, and the server and Chromium stop after the last of them: the app's default
# pair (~5 GB) must not sit beside the real pairs that later modules load in this process (~12 GB).
# Its environment: the tiny pair is offered in the dropdown, Gradio's copies of uploads in `server.uploads`.
# --------------------------------------------------------------------------------------------------

APP_MODULES = ("test_api.py", "test_browser.py", "test_challenges_browser.py", "test_crowd.py",
               "test_export_browser.py", "test_load.py", "test_present_browser.py", "test_shootout_browser.py",
               "test_layout_browser.py", "test_links_browser.py", "test_classroom_browser.py")
_SHARED = contextlib.ExitStack()  # the running server and browser, closed after the last APP_MODULES test


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    from tests.server import launch_app

    tmp = tmp_path_factory.mktemp("app")
    uploads = tmp / "gradio"
    srv = _SHARED.enter_context(launch_app(tmp, env={"SPECVIZ_SHOW_TINY": "1", "GRADIO_TEMP_DIR": str(uploads)}))
    srv.uploads = uploads
    return srv


@pytest.fixture(scope="session")
def shots(tmp_path_factory):
    """The folder of the browser tests' screenshots ($SPECVIZ_SCREENSHOTS, or a temporary one)."""
    from pathlib import Path

    d = Path(os.environ["SPECVIZ_SCREENSHOTS"]) if os.environ.get("SPECVIZ_SCREENSHOTS") else \
        tmp_path_factory.mktemp("screenshots")
    d.mkdir(parents=True, exist_ok=True)
    yield d
    print(f"\nbrowser screenshots: {d}")


@pytest.hookimpl(tryfirst=True)  # before any fixture of the test starts (a skipped browser test starts no server)
def pytest_runtest_setup(item):
    """Without Chromium a browser test is skipped (one folded line in the -ra summary: the count and the
    command that installs it), except where CI is set: there it is an error (tests/chromium.py)."""
    if "browser" not in item.fixturenames:
        return
    from tests import chromium

    verdict = chromium.decision()
    if verdict == "skip":
        pytest.skip(chromium.skip_reason())
    if verdict == "error":
        pytest.fail(chromium.error_message(), pytrace=False)


@pytest.fixture(scope="session")
def browser():
    """Debian's Chromium through Playwright (never `playwright install`)."""
    from playwright import sync_api

    from tests.chromium import CHROMIUM, CHROMIUM_ARGS

    pw = _SHARED.enter_context(sync_api.sync_playwright())
    b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    _SHARED.callback(b.close)
    return b


@pytest.hookimpl(trylast=True)  # after the test's own fixtures (its page, its context) are torn down
def pytest_runtest_teardown(item, nextitem):
    """After the last test of APP_MODULES: stop the shared server and Chromium."""
    if nextitem is None or nextitem.path.name not in APP_MODULES:
        _SHARED.close()


@pytest.fixture(autouse=True)
def _server_log_stays_clean(request):
    """A test on an app server (the shared one, or a module's own `server`) fails when the server logged a
    traceback while it ran: the test that caused it is named, not the next one that reads the log."""
    if "server" not in request.fixturenames:
        yield
        return
    srv = request.getfixturevalue("server")
    start = len(srv.log())
    yield
    new = srv.log()[start:]
    if "Traceback" in new:
        at = new.index("Traceback")
        pytest.fail(f"the app server logged a traceback during this test:\n{new[max(0, at - 300):at + 3000]}",
                    pytrace=False)
