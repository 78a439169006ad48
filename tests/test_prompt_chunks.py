"""A long prompt's pass is fed in chunks with a stop check between them (core.kv.feed_prompt): a run's Stop, its
time budget or a closed page ends it within one chunk, and the run's tokens are those of the whole-prompt pass."""

from __future__ import annotations

import time

import pytest

from specviz.core.engine import speculative_decode, standard_decode
from specviz.core.kv import CachedLM, PromptStopped, feed_prompt
from specviz.core.settings import DecodeSettings
from specviz.drafters import make_drafter
from specviz.models.tiny import build_tiny_pair

PROMPT = [(7 * i + 3) % 30 + 1 for i in range(90)]


@pytest.fixture(scope="module")
def pair():
    return build_tiny_pair(vocab_size=32, seed=4)


def _settings(**kw):
    return DecodeSettings.checked(**{"gamma": 3, "max_new_tokens": 12, "temperature": 0.0, **kw})


def _spec(pair, settings, **kw):
    return speculative_decode(pair, PROMPT, settings, drafter=make_drafter(pair, settings), **kw)


class CountingLM(CachedLM):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.feeds: list[int] = []

    def feed(self, ids, keep=1, hidden=False):
        self.feeds.append(len(ids) - self.cached)
        return super().feed(ids, keep, hidden)


def test_feed_prompt_feeds_chunks_and_leaves_the_last_one(pair, monkeypatch):
    monkeypatch.setenv("SPECVIZ_PROMPT_CHUNK", "16")
    lm = CountingLM(pair.target, pair.device)
    feed_prompt(lm, PROMPT, lambda: False)
    assert lm.feeds == [16] * 5 and lm.cached == 80  # 89 to feed: five chunks, the last 9 (+1) left to the caller
    short = CountingLM(pair.target, pair.device)
    feed_prompt(short, PROMPT[:17], lambda: False)
    assert short.feeds == [] and short.cached == 0  # one chunk or less: fed whole by the first pass, as before


def test_chunks_are_sized_by_the_time_they_take(pair, monkeypatch):
    """On a slow (or loaded) machine the chunks shrink to about CHUNK_SECONDS each, so a stop lands that soon."""
    from specviz.core import kv

    monkeypatch.setenv("SPECVIZ_PROMPT_CHUNK", "64")
    monkeypatch.setattr(kv, "CHUNK_SECONDS", 0.05)
    lm = CountingLM(pair.target, pair.device)
    real = CachedLM.feed

    def slow(self, ids, keep=1, hidden=False):
        time.sleep(0.01 * (len(ids) - self.cached))  # 10 ms a token: 5 tokens make 0.05 s
        return real(self, ids, keep, hidden)

    monkeypatch.setattr(CountingLM, "feed", lambda self, ids, keep=1, hidden=False: (
        self.feeds.append(len(ids) - self.cached), slow(self, ids, keep, hidden))[1])
    feed_prompt(lm, PROMPT, lambda: False)
    assert lm.feeds[0] == kv.FIRST_CHUNK and all(8 <= n <= 8 for n in lm.feeds[1:]), lm.feeds  # 5 → at least 8


def test_a_stop_lands_within_one_chunk(pair, monkeypatch):
    monkeypatch.setenv("SPECVIZ_PROMPT_CHUNK", "16")
    lm = CountingLM(pair.target, pair.device)
    calls = []
    with pytest.raises(PromptStopped):
        feed_prompt(lm, PROMPT, lambda: calls.append(1) or len(calls) > 2)
    assert lm.feeds == [16, 16]  # stopped before the third chunk


def test_chunked_runs_give_the_whole_prompts_tokens_and_greedy_still_equals_standard(pair, monkeypatch):
    settings = _settings()
    whole_spec, whole_std = _spec(pair, settings), standard_decode(pair, PROMPT, settings)
    monkeypatch.setenv("SPECVIZ_PROMPT_CHUNK", "16")
    spec, std = _spec(pair, settings), standard_decode(pair, PROMPT, settings)
    tokens = lambda tr: [t.id for r in tr.rounds for t in r.emitted]  # noqa: E731
    assert tokens(spec) == tokens(std) == tokens(whole_std) == tokens(whole_spec)
    assert spec.rounds[0].prompt_fed == std.rounds[0].prompt_fed == 89 - 80  # the rest of the prompt, first pass
    assert spec.t_prefill > 0 and std.t_prefill > 0  # the chunks are the prompt's pass


@pytest.mark.parametrize("run", ["speculative", "standard"])
def test_a_stop_during_the_prompt_pass_ends_the_run_with_no_rounds_and_says_so(pair, monkeypatch, run):
    monkeypatch.setenv("SPECVIZ_PROMPT_CHUNK", "8")
    calls = []
    stop = lambda: calls.append(time.perf_counter()) or len(calls) > 3  # noqa: E731
    settings = _settings()
    tr = _spec(pair, settings, should_stop=stop) if run == "speculative" else standard_decode(
        pair, PROMPT, settings, should_stop=stop)
    assert tr.rounds == [] and tr.stop_reason == "stopped" and len(calls) == 4


def test_a_cancel_flag_is_per_session_bounded_and_forgotten_when_the_run_ends():
    from specviz.serving.cancel import Cancels

    cancels = Cancels(max_sessions=2)
    a, b = cancels.start("a"), cancels.start("b")
    assert cancels.cancel("a") and a.is_set() and not b.is_set()
    assert not cancels.cancel("nobody") and not cancels.cancel(None)
    cancels.finish("a", a)
    assert not cancels.cancel("a")
    newer = cancels.start("b")  # a second run of b replaces the flag; the first one's end leaves it alone
    cancels.finish("b", b)
    assert cancels.cancel("b") and newer.is_set()
    for k in range(5):
        cancels.start(f"s{k}")
    assert len(cancels) == 2


def test_a_closed_page_stops_its_live_run_inside_a_long_prompts_pass(pair, monkeypatch):
    """The page's run (ui.live.run) reads its session's cancel flag between prompt chunks: the app's unload
    event (a closed page) sets it while the prompt is being read, and the run ends there, the models free."""
    from specviz.serving import jobs, service
    from specviz.serving.cancel import CANCELS
    from specviz.serving.jobs import RunForm
    from specviz.ui import live

    monkeypatch.setenv("SPECVIZ_PROMPT_CHUNK", "8")
    monkeypatch.setattr(jobs, "get_pair", lambda *a, **k: pair)
    fed = []
    real_feed = CachedLM.feed

    def feed(self, ids, keep=1, hidden=False):
        fed.append(len(ids))
        if len(fed) == 3:
            CANCELS.cancel("closing-page")  # the page closes while its prompt is read
        return real_feed(self, ids, keep, hidden)

    monkeypatch.setattr(CachedLM, "feed", feed)
    monkeypatch.setattr(service, "cached_lm", lambda m, d, *a, **k: CachedLM(m, d), raising=False)
    prompt = "".join(chr(97 + (7 * i) % 26) for i in range(200))
    frames = list(live.run(RunForm(preset="tiny", prompt=prompt, max_new_tokens=8), "closing-page"))
    assert len(fed) <= 4  # one chunk more at most, then nothing: no round ran
    assert not jobs.GATE.lock.locked() and "closing-page" not in CANCELS._flags
    # The run draws nothing after its flag is set (a last frame could overwrite Stop's); Stop's drawing says it.
    said = live.stop(None, None, "closing-page").status
    assert "Stopped while reading the prompt" in said, said
    assert not any("Stopped" in str(f.status) for f in frames), [f.status for f in frames]


def test_a_run_that_stops_before_stops_drawing_leaves_it_where_it_got(pair, monkeypatch):
    """Stop sets the flag, and the run often ends (between two rounds) before Stop's drawing runs: the run draws
    nothing more, and Stop's drawing still says how far it got, with the race marked stopped."""
    from specviz.serving import jobs, service
    from specviz.serving.cancel import CANCELS
    from specviz.serving.jobs import RunForm
    from specviz.ui import live
    from specviz.ui.frames import SKIP

    monkeypatch.setattr(jobs, "get_pair", lambda *a, **k: pair)
    monkeypatch.setattr(service, "cached_lm", lambda m, d, *a, **k: CachedLM(m, d), raising=False)
    pressed, after = False, []
    for f in live.run(RunForm(preset="tiny", prompt="abcabcabc", max_new_tokens=48), "pressing-stop"):
        if pressed:
            after.append(f.status)
        elif "sv-round" in str(f.rounds):  # the first round drawn: press Stop (Stop's drawing comes after the run)
            pressed = CANCELS.cancel("pressing-stop")
    assert pressed and after == [], after  # not one frame after Stop
    assert not jobs.GATE.lock.locked() and "pressing-stop" not in CANCELS._flags
    frame = live.stop("", None, "pressing-stop")
    assert frame.status and "Stopped after" in frame.status and "Press Run" in frame.status, frame.status
    n = int(frame.status.split("Stopped after ")[1].split()[0])
    assert 0 < n < 48
    assert "stopped" in frame.race and "Stopped before the end" in frame.race  # no speedup from a cut race
    # the whole page shows the stopped run, not the one shown before it: numbers, rounds, an export
    assert "stopped by the user" in frame.metrics and frame.export and frame.state is not SKIP
    assert not isinstance(live.stop("", None, "pressing-stop").status, str)  # drawn once; a second Stop: no word
