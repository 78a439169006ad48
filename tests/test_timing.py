"""Timings that hold on a shared machine: the interleaved race, the noise detector on fake clocks, the
count-based second opinion, and a flagged race neither cached nor credited."""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from types import SimpleNamespace

import pytest
import torch

from specviz.core.engine import standard_decode
from specviz.core.race import interleave
from specviz.core.settings import DecodeSettings
from specviz.hardware import load
from specviz.hardware.probe import Probe
from specviz.serving import service
from specviz.serving.replay import RecordingCache, RunKey, cut, replay
from specviz.theory import timing as TM
from specviz.trace import trace_from_json
from specviz.trace.timing import Timing
from specviz.views.race import race_html
from tests.synthetic import make_std_trace, make_trace
from tests.test_engine import PROMPT, make_pair
from tests.drafted import speculative_decode

PLAN = [dict(accept=3, extra="correction")] * 20  # 20 rounds of 4 drafts, 4 tokens each


def _probe(step_ms=100.0, verify_ms=110.0, draft_ms=40.0, threads=2):
    """The probe's prices as the race reads them off the pair (service.probe_prices): T(k) for the
    target's execution, the draft's step."""
    pair = SimpleNamespace(probe=Probe(
        {"threads": threads}, "m", {"int8": {1: step_ms, 2: step_ms + 2, 4: step_ms + 6, 8: verify_ms + 10}},
        draft_ms, 0.8, "int8"), target_exec="int8")
    return service.probe_prices(pair)


def _race(stall_every=0, stall_s=0.0, std_scale=1.0, spec_scale=1.0, draft_scale=1.0):
    """A race on fake clocks: draft steps 40 ms, verify over 5 tokens 108 ms, standard steps 100 ms
    (the probe's costs exactly), with a stall of ``stall_s`` added to every ``stall_every``-th pass."""
    spec = make_trace(plan=PLAN, draft_token_s=0.04 * draft_scale * spec_scale, verify_s=0.108 * spec_scale)
    std = make_std_trace(n_tokens=80, step=0.1 * std_scale)
    if stall_every:
        for trace in (spec, std):
            t = trace.t_prefill
            for i, r in enumerate(trace.rounds):
                if i % stall_every == 1:
                    r.t_verify += stall_s
                r.t_start = t
                r.t_end = t + r.t_draft + r.t_verify
                t = r.t_end
            trace.t_total = t
    return spec, std


# ---- the detector on fake clocks ----------------------------------------------------------------


def test_steady_clocks_are_reliable_and_the_counts_agree():
    spec, std = _race()
    t = TM.assess_race(spec, std, prices=_probe(), threads=2)
    assert t.reliable and t.why == ""
    assert t.spread == 0.0
    assert t.predicted == pytest.approx(service_speedup(spec, std), rel=0.02)
    assert t.slowdown == pytest.approx(1.0, rel=0.01)
    assert t.v_probe == pytest.approx((106 + 14 / 4) / 100, rel=1e-3)  # T(5): a quarter of the way from 4 to 8
    assert t.c_probe == pytest.approx(0.4)


def service_speedup(spec, std):
    return spec.summary().tokens_per_s / std.summary().tokens_per_s


@pytest.mark.parametrize("stall_every,stall_s", [(3, 0.2), (2, 0.5), (4, 1.0)])
def test_injected_stalls_are_flagged(stall_every, stall_s):
    spec, std = _race(stall_every, stall_s)
    t = TM.assess_race(spec, std, prices=_probe())
    assert not t.reliable
    assert t.spread > TM.SPREAD_MAX
    assert "varied" in t.why


def test_small_jitter_is_left_alone():
    spec, std = _race()
    for i, r in enumerate(itertools.chain(spec.rounds, std.rounds)):
        r.t_verify *= 1 + 0.03 * ((i * 7) % 5 - 2) / 2  # ±3 %
    t = TM.assess_race(spec, std, prices=_probe())
    assert t.reliable, t.why
    assert 0 < t.spread < 0.05


def test_a_uniformly_slow_draft_is_caught_by_the_counts():
    """Two threads on an oversubscribed CPU: every draft pass 3× slower, steadily (no scatter);
    the wall-clock speedup collapses, the counts at the probe's costs do not: flagged."""
    spec, std = _race(draft_scale=3.0)
    t = TM.assess_race(spec, std, prices=_probe(), threads=2)
    assert t.spread == 0.0
    assert not t.reliable and "disagree" in t.why
    assert t.predicted > service_speedup(spec, std) * 1.3


def test_identical_counts_give_the_same_count_based_figure_whatever_the_clocks_said():
    """Three identical greedy races (the same counts) on a machine whose load came and went: the prompt's pass,
    Python's time between passes and a few stalls differ; the count-based figure does not (it came out 1.17x,
    1.31x and 1.34x while the prompt's measured time was in it)."""
    figures = []
    for k, (stall_every, stall_s, prompt_s) in enumerate([(0, 0.0, 0.1), (3, 0.3, 0.9), (2, 0.6, 2.5)]):
        spec, std = _race(stall_every, stall_s)
        for trace in (spec, std):
            trace.t_prefill += prompt_s
            trace.t_total += prompt_s + 0.05 * k * len(trace.rounds)  # more of Python's own time, too
        figures.append(TM.assess_race(spec, std, prices=_probe()).predicted)
    assert figures[0] is not None and figures[0] == figures[1] == figures[2]


def test_a_probe_steeper_than_the_race_does_not_condemn_steady_clocks():
    """The probe timed verify passes dearer than this race ran them (start-up): the two figures part, but every
    pass ran at or under the probe's price, so the wall clock is quoted and the note says they are apart."""
    spec, std = _race()
    steep = _probe(verify_ms=600.0)  # a verify over 5 tokens priced ~2.3 steps; this race measured 1.08
    t = TM.assess_race(spec, std, prices=steep, threads=2)
    assert t.reliable and t.predicted < service_speedup(spec, std) * 0.75, (t.predicted, t.why)
    spec.timing, std.timing = t, t
    page = race_html(spec, std)
    assert "trust the wall clock" in page and "≈" not in page.split("sv-speedup-v")[1][:20]


def test_a_uniformly_busy_machine_predicts_what_an_idle_one_does():
    """Every pass 3× slower (the prompt pass too): the count-based figure is the idle race's."""
    idle_spec, idle_std = _race()
    busy_spec, busy_std = _race(spec_scale=3.0, std_scale=3.0)
    for t in (busy_spec, busy_std):
        t.t_total += 2 * t.t_prefill  # the prompt pass (before the first round) stretched 3× too
    idle = TM.assess_race(idle_spec, idle_std, prices=_probe())
    busy = TM.assess_race(busy_spec, busy_std, prices=_probe())
    assert busy.predicted == pytest.approx(idle.predicted, rel=0.01)
    assert busy.slowdown == pytest.approx(3.0, rel=0.01)


def test_an_impossible_verify_cost_is_never_reliable():
    """A verify pass over 5 tokens measured at 0.3 standard steps: the standard run was slowed
    (the sequential race's 5.13×)."""
    spec, std = _race(std_scale=3.6)
    t = TM.assess_race(spec, std)  # no probe: only the race's own numbers
    assert not t.reliable and "cannot be" in t.why
    assert t.predicted is None


def test_without_a_probe_the_spread_still_flags():
    spec, std = _race(3, 0.3)
    t = TM.assess_race(spec, std, prices=None)
    assert not t.reliable and t.predicted is None and t.slowdown is None
    assert "other work on the machine stretched some of them" in t.why


def test_on_a_gpu_the_spread_is_blamed_on_kernel_launches_too():
    """An eager GPU pass waits on Python launching its kernels: on an idle H100 the race's passes varied by
    ±35%, so the flag names that, not only other work on the machine."""
    spec, std = _race(3, 0.3)
    spec.device = std.device = "cuda:0 (NVIDIA H100 80GB HBM3)"
    t = TM.assess_race(spec, std, prices=None)
    assert not t.reliable and "launch their kernels" in t.why and "other work on the machine" not in t.why


def test_a_probe_at_other_threads_gives_no_slowdown():
    spec, std = _race(std_scale=2.0, spec_scale=2.0)
    t = TM.assess_race(spec, std, prices=_probe(threads=2), threads=1)
    assert t.slowdown is None  # one thread against a two-thread probe: not comparable
    t2 = TM.assess_race(spec, std, prices=_probe(threads=2), threads=2)
    assert t2.slowdown == pytest.approx(2.0, rel=0.01)


# ---- what the page says ------------------------------------------------------------------------


def test_a_flagged_race_says_so_and_states_no_impossible_number():
    spec, std = _race(std_scale=3.6)
    spec.timing = std.timing = TM.assess_race(spec, std, prices=_probe())
    assert not spec.timing.reliable
    html = race_html(spec, std)
    assert 'data-reliable="false"' in html
    assert "Timings ±" in html and "the machine was busy" in html
    assert f"≈{spec.timing.predicted:.2f}×" in html
    assert "count-based" in html and "the one to trust here" in html
    rc_v = (0.108) / (0.1 * 3.6)
    assert f"({rc_v:.2f} steps)" not in html  # the impossible measured v is not stated as the verify cost
    assert "probed verify cost" in html


def test_a_reliable_race_shows_its_second_opinion():
    spec, std = _race()
    spec.timing = std.timing = TM.assess_race(spec, std, prices=_probe(), threads=2, busy=0.1)
    html = race_html(spec, std)
    assert 'data-reliable="true"' in html
    assert "timed with the two runs interleaved on 2 threads" in html
    assert "count-based" in html and "Timings ±" not in html and "busy" not in html
    spec.timing = TM.assess_race(spec, std, prices=_probe(), threads=1, busy=1.8)  # a busy machine, held steady
    html = race_html(spec, std)
    assert 'data-reliable="true"' in html and "on 1 thread," in html
    assert "the machine was busy (other work used 1.8 cores as the race began)" in html
    spec.timing = TM.assess_race(spec, std, prices=_probe(threads=1), threads=2, busy=0.0, threads_end=1,
                                 busy_during=1.4)  # other work arrived mid-race
    assert spec.timing.slowdown is not None  # priced at the count it ended with
    html = race_html(spec, std)
    assert "on 2 threads, then 1 once other work arrived (it used 1.4 cores)" in html


def test_timing_round_trips_and_old_recordings_load():
    spec, _ = _race()
    spec.timing = Timing(how="interleaved", threads=2, threads_end=1, busy=1.9, busy_during=1.2, spread=0.35,
                         reliable=False, why="busy", predicted=1.6)
    back = trace_from_json(spec.to_json())
    assert back.timing == spec.timing
    spec.timing = None
    assert trace_from_json(spec.to_json()).timing is None
    doc = spec.to_dict()
    doc["timing"] = {"how": "sideways"}
    with pytest.raises(Exception, match="timing.how"):
        from specviz.trace import trace_from_dict
        trace_from_dict(doc)


# ---- interleaving ------------------------------------------------------------------------------


def test_interleave_advances_whichever_clock_is_behind():
    ticks = itertools.count()
    now = lambda: next(ticks) * 1.0  # noqa: E731 (each next() of a stream costs its own reads)
    costs = {"a": [3, 3, 3], "b": [1, 1, 1, 1, 1]}
    order = []

    def stream(name):
        for c in costs[name]:
            for _ in range(c - 1):
                now()  # spend c ticks in this next()
            yield name

    for name, _ in interleave({"a": stream("a"), "b": stream("b")}, now=now):
        order.append(name)
    assert sorted(order) == ["a"] * 3 + ["b"] * 5
    assert order[:3] == ["a", "b", "b"]  # a spent more, b catches up before a goes again


def _switching_race(phase: float, priced: bool, period: float = 3.0, slow: float = 2.3) -> float:
    """Two one-thread runs on a fake machine whose load switches on and off every ``period`` seconds
    (a pass then takes ``slow`` times as long): a speculative run's passes (five 61 ms draft steps, a
    530 ms verify) against 180 ms standard steps, as on the AVX2 EPYC.  Returns the speculative run's
    efficiency (work per second of its own time) over the standard run's: 1.0 when both met the
    load alike."""
    wall = [0.0]

    def spend(work: float) -> None:  # advance the wall clock by `work` seconds of an idle machine
        while work > 1e-12:
            edge = (int((wall[0] + phase) / period) + 1) * period - phase
            rate = 1 / slow if int((wall[0] + phase) / period) % 2 else 1.0
            if (edge - wall[0]) * rate >= work:
                wall[0] += work / rate
                return
            work -= (edge - wall[0]) * rate
            wall[0] = edge

    done, own = {"spec": 0.0, "std": 0.0}, {"spec": 0.0, "std": 0.0}

    def stream(name, works):
        for w in itertools.islice(itertools.cycle(works), 400):
            t = wall[0]
            spend(w)
            done[name] += w
            own[name] += wall[0] - t
            yield SimpleNamespace(work=w)

    cost = (lambda name, ev, seconds: ev.work) if priced else None
    for _ in interleave({"spec": stream("spec", [0.061] * 5 + [0.530]), "std": stream("std", [0.180])},
                        now=lambda: wall[0], cost=cost):
        if wall[0] > 60:
            break
    return (done["spec"] / own["spec"]) / (done["std"] / own["std"])


def test_a_schedule_by_price_cannot_follow_the_load():
    """Turns taken by measured time feed the load back into the schedule (a stretched pass delays its
    run's next turn), and under a load switching every 3 s the speculative run met more of it: the
    AVX2 EPYC's switching races came out 0.86-1.11× against 1.06× under a steady load.  Turns taken by
    the passes' prices are fixed in advance and meet the load alike."""
    phases = [0.25 * i for i in range(24)]
    by_time = [_switching_race(p, priced=False) for p in phases]
    by_price = [_switching_race(p, priced=True) for p in phases]
    assert statistics.mean(by_time) < 0.97  # biased: the speculative run met more of the load
    assert abs(statistics.mean(by_price) - 1) < 0.02 and max(abs(r - 1) for r in by_price) < 0.08


def test_a_races_turns_are_priced_by_the_probe():
    prices = _probe(step_ms=100.0, verify_ms=110.0, draft_ms=40.0)
    cost = TM.event_costs(prices, draft_model=True)
    spec, std = _race()
    rnd, step = spec.rounds[1], std.rounds[1]
    assert cost("speculative", SimpleNamespace(kind="draft", round=rnd), 9.9) == pytest.approx(0.04)
    assert cost("speculative", SimpleNamespace(kind="round", round=rnd), 9.9) == pytest.approx(prices.target(len(rnd.draft) + 1))
    assert cost("standard", SimpleNamespace(kind="round", round=step), 9.9) == pytest.approx(0.1)
    assert cost("speculative", SimpleNamespace(kind="done", round=None), 9.9) == 0.0
    assert TM.event_costs(prices, draft_model=False)("speculative", SimpleNamespace(kind="draft", round=rnd), 1.0) == 0.0
    assert TM.event_costs(None, draft_model=True) is None


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_interleaved_race_makes_the_tokens_of_separate_runs(temperature):
    pair = make_pair(vocab=8)
    s = DecodeSettings(gamma=3, temperature=temperature, max_new_tokens=24, seed=5)
    alone_spec, alone_std = speculative_decode(pair, PROMPT, s), standard_decode(pair, PROMPT, s)
    req = service.Request(pair, "", list(PROMPT), s)
    ups = list(service.race(req))
    phases = [u.phase for u in ups[:-1]]
    assert "standard" in phases[: len(phases) // 2], "the standard run started only after the speculative one"
    spec, std = ups[-1].spec, ups[-1].std
    assert [t.id for t in spec.tokens] == [t.id for t in alone_spec.tokens]
    assert [t.id for t in std.tokens] == [t.id for t in alone_std.tokens]
    if temperature == 0.0:
        assert [t.id for t in spec.tokens] == [t.id for t in std.tokens]
    assert spec.timing is not None and spec.timing.how == "interleaved" and std.timing == spec.timing
    assert ups[-1].spec_done and ups[-1].std_done
    # Neither engine held inference mode across its yields: the thread is as it was (training after a race works).
    assert not torch.is_inference_mode_enabled() and torch.is_grad_enabled()


def test_a_target_with_compiled_steps_races_in_turn(monkeypatch):
    pair = make_pair(vocab=8)
    monkeypatch.setattr(load, "race_can_interleave", lambda p: False)
    monkeypatch.setattr(service, "race_can_interleave", lambda p: False)
    s = DecodeSettings(gamma=3, temperature=0.0, max_new_tokens=12)
    ups = list(service.race(service.Request(pair, "", list(PROMPT), s)))
    phases = [u.phase for u in ups[:-1]]
    first_std = phases.index("standard")
    assert all(p == "speculative" for p in phases[:first_std]) and "speculative" not in phases[first_std:]
    assert ups[-1].spec.timing.how == "sequential"


def test_replay_shows_both_runs_by_their_own_clocks():
    spec, std = _race()
    entry = SimpleNamespace(spec=spec, std=std)
    snaps = list(replay(entry, sleep=lambda s: None))
    mid = snaps[len(snaps) // 3]
    assert mid.spec.rounds and mid.std.rounds  # both advanced at once
    assert snaps[-1].phase == "done" and snaps[-1].spec is spec
    assert cut(std, spec.t_total).n_tokens < std.n_tokens


# ---- threads for the moment ----------------------------------------------------------------------


def test_threads_follow_the_machine_load():
    assert load.choose_threads(2, 0.0) == 2
    assert load.choose_threads(2, 1.7) == 1
    assert load.choose_threads(2, None) == 2
    reads = iter([100.0, 100.3])  # 0.3 s of CPU over the window
    busy = load.busy_cores(window_s=0.2, read=lambda: next(reads), sleep=lambda s: None)
    assert busy is not None and busy > 1.0  # the window took far less than 0.3 s: several cores busy


def test_race_threads_sets_and_restores(monkeypatch):
    before = torch.get_num_threads()
    pair = SimpleNamespace(device=torch.device("cpu"))
    monkeypatch.delenv("SPECVIZ_THREADS", raising=False)
    history = load.History()
    with load.race_threads(pair, measure=lambda: 5.0, history=history) as choice:
        assert choice.count == 1 and choice.start == 1 and choice.busy == 5.0 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    monkeypatch.setenv("SPECVIZ_THREADS", "3")
    with load.race_threads(pair, measure=lambda: 5.0, history=history) as choice:
        assert choice.count == 3 and not choice.may_drop
    with load.race_threads(pair, fixed=0, history=history) as choice:
        assert choice.count == before and choice.busy is None
    with load.race_threads(SimpleNamespace(device=torch.device("meta"))) as choice:
        assert choice.count is None


def test_a_recent_busy_reading_keeps_one_thread(monkeypatch):
    """A load that comes and goes: a race that starts in a quiet moment shortly after a busy reading
    still runs on one thread, so races made under the same coming-and-going load agree."""
    monkeypatch.delenv("SPECVIZ_THREADS", raising=False)
    now = [1000.0]
    history = load.History(keep_s=30.0, clock=lambda: now[0])
    pair = SimpleNamespace(device=torch.device("cpu"))
    cores = max(2, torch.get_num_threads())
    torch.set_num_threads(cores)
    try:
        with load.race_threads(pair, measure=lambda: 1.5, history=history) as c:
            assert c.start == 1
        now[0] += 10
        with load.race_threads(pair, measure=lambda: 0.0, history=history) as c:
            assert c.start == 1  # quiet now, busy 10 s ago
        now[0] += 31
        with load.race_threads(pair, measure=lambda: 0.0, history=history) as c:
            assert c.start == cores and c.may_drop  # quiet for longer than STICKY_S
    finally:
        torch.set_num_threads(cores)


def test_other_work_arriving_mid_race_drops_both_runs_to_one_thread():
    """ThreadControl.check reads the CPU all cores spent minus this process's own: the race's own
    threads never count as other work; a neighbour's do."""
    t, total, own = [0.0], [0.0], [0.0]
    history = load.History(clock=lambda: t[0])
    before = torch.get_num_threads()
    c = load.ThreadControl(2, 0.0, may_drop=True, read=lambda: total[0], own=lambda: own[0], clock=lambda: t[0],
                           history=history)
    try:
        t[0], total[0], own[0] = 0.5, 1.0, 1.0
        assert not c.check()  # under CHECK_S since the last reading: not read
        t[0], total[0], own[0] = 2.0, 4.0, 4.0  # 2 s, both cores busy, all of it this process
        assert not c.check() and c.count == 2 and c.busy_during == 0.0
        t[0], total[0], own[0] = 4.0, 8.0, 5.2  # 2 s: 4 core-seconds, 1.2 of them ours -> 1.4 cores other
        assert c.check() and c.count == 1 and torch.get_num_threads() == 1 and c.busy_during == 1.4
        assert history.busy_lately() == 1.4  # the next race starts on one thread
        t[0], total[0], own[0] = 6.0, 12.0, 6.0
        assert not c.check() and c.count == 1  # never back up within a race
    finally:
        torch.set_num_threads(before)
    # a one-thread race cannot drop, but its readings keep the history fresh for the next race's choice
    t[0], total[0], own[0] = 100.0, 0.0, 0.0
    one = load.ThreadControl(1, 2.0, watch=True, read=lambda: total[0], own=lambda: own[0], clock=lambda: t[0],
                             history=history)
    t[0], total[0], own[0] = 102.0, 4.0, 1.0
    assert not one.check() and one.count == 1 and one.busy_during == 1.5
    t[0] += 25.0  # 27 s after the race began, 25 s after its last reading: still busy lately
    assert history.busy_lately() == 1.5


# ---- nothing false is kept ---------------------------------------------------------------------------


def _entry(cache, flagged_run: bool):
    spec, std = _race()
    spec.timing = std.timing = Timing(spread=0.4 if flagged_run else 0.02, reliable=not flagged_run,
                                      why="busy" if flagged_run else "")
    key = RunKey("tiny", spec.prompt + str(flagged_run), spec.settings, True, "auto")
    how, entry = cache.claim(key)
    assert how == "lead"
    cache.finish(entry, spec, std)
    return key, entry


def test_a_flagged_race_is_not_cached_but_its_followers_get_it():
    cache = RecordingCache()
    key, entry = _entry(cache, flagged_run=True)
    assert len(cache) == 0 and entry.done and not entry.failed
    assert cache.claim(key)[0] == "lead"  # the next identical request runs live
    key2, _ = _entry(cache, flagged_run=False)
    assert cache.claim(key2)[0] == "replay"


def test_flagged_reads_old_recordings_as_unjudged():
    spec, _ = _race()
    assert not TM.flagged(spec) and not TM.flagged(None)
    spec.timing = dataclasses.replace(Timing(), reliable=False)
    assert TM.flagged(spec)


def test_the_bench_can_ask_for_the_old_race():
    """cli.race_load's contrast: sequential, on the process's own threads (as specviz raced before)."""
    pair = make_pair(vocab=8)
    s = DecodeSettings(gamma=3, temperature=0.0, max_new_tokens=8)
    final = list(service.race(service.Request(pair, "", list(PROMPT), s), order="sequential", threads=0))[-1]
    assert final.spec.timing.how == "sequential" and final.spec.timing.threads == torch.get_num_threads()


def test_a_race_too_short_to_time_is_not_judged():
    """A tiny model's race (milliseconds a run): its scatter is Python's, not the machine's load."""
    spec = make_trace(plan=PLAN[:4], draft_token_s=0.001, verify_s=0.002, t_prefill=0.001)
    std = make_std_trace(n_tokens=16, step=0.002, t_prefill=0.001)
    std.rounds[3].t_verify += 0.05  # a stall that would be ±100 % of such a run
    t = TM.assess_race(spec, std, prices=_probe())
    assert not t.judged and t.reliable and t.spread == 0.0 and t.predicted is None
    spec.timing = std.timing = t
    assert "too short a race to judge its clocks" in race_html(spec, std)



# ---- one thread's prices -------------------------------------------------------------------------------


def test_a_one_thread_race_is_priced_by_the_one_thread_curve():
    probe = Probe({"threads": 2}, "m", {"int8": {1: 100.0, 4: 160.0}}, 40.0, 0.8, "int8",
                  one_thread={"curve": {1: 150.0, 4: 330.0}, "draft_ms": 70.0})
    pair = SimpleNamespace(probe=Probe.from_dict(probe.as_dict()), target_exec="int8")  # survives the cache
    every, one = service.probe_prices(pair, 2), service.probe_prices(pair, 1)
    assert (every.threads, every.target(1), every.draft) == (2, 0.1, 0.04)
    assert (one.threads, one.target(1), one.target(4), one.draft) == (1, 0.15, 0.33, 0.07)
    assert service.probe_prices(pair, None).threads == 2
    pair.target_exec = "bf16"  # another execution than the probe's: not priced
    assert service.probe_prices(pair, 1) is None
    old = Probe({"threads": 2}, "m", {"int8": {1: 100.0}}, 40.0, 0.8, "int8")  # a cache from before
    assert service.probe_prices(SimpleNamespace(probe=Probe.from_dict(old.as_dict()), target_exec="int8"), 1).threads == 2


def test_the_probe_times_the_chosen_execution_on_one_thread_once(tmp_path, monkeypatch):
    from specviz.hardware import probe as P
    from specviz.hardware import probe_once
    from specviz.hardware.machine import this_machine
    from specviz.models.tiny import build_tiny_pair

    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    tiny = build_tiny_pair()
    target, draft = tiny.target, tiny.draft
    machine = this_machine(torch.device("cpu")).as_dict() | {"threads": 2}
    probe = Probe(machine, "tiny", {"fp32": {1: 1.0, 2: 1.1}}, 0.5, 0.8, "fp32")
    before = torch.get_num_threads()
    out = probe_once.add_one_thread(probe, target, draft, tiny.vocab_size, torch.float32, busy=lambda: False)
    assert torch.get_num_threads() == before
    assert set(out.one_thread["curve"]) == set(P.PROBE_KS) and out.one_thread["draft_ms"] > 0
    again = probe_once.add_one_thread(out, target, None, tiny.vocab_size, torch.float32, busy=lambda: False)
    assert again.one_thread is out.one_thread  # measured once
    stored = P.read_probes()
    assert any(e.get("one_thread") for e in stored.values())  # remembered for the next start
    busy = Probe(machine, "tiny", {"fp32": {1: 1.0}}, 0.5, 0.8, "fp32")
    assert probe_once.add_one_thread(busy, target, draft, tiny.vocab_size, torch.float32,
                            busy=lambda: True).one_thread is None  # a busy machine's timings mean nothing


# ---- this machine's limit (issue 64) ----------------------------------------------------------------


def _probe_with_roofline(threads=2):
    """A probe that measured the roofline too: 1,000 MB a step at 40 GB/s (25 ms), 1.5 G multiply-adds a token
    at a 750 GMAC/s peak (2 ms a token: the knee at 12.5 tokens), the draft's 300 MB (7.5 ms)."""
    probe = Probe({"threads": threads, "isa": ["avx2"]}, "m",
                  {"int8": {1: 100.0, 2: 102.0, 4: 106.0, 8: 120.0}}, 40.0, 0.8, "int8",
                  step_mb={"int8": 1000.0}, draft_mb=300.0, copy_gbps=40.0,
                  peak={"threads": threads, "gmacs": {"avx2": {str(threads): 750.0, threads: 750.0}}},
                  token_macs=1_500_000_000)
    return SimpleNamespace(probe=probe, target_exec="int8")


def test_the_race_is_priced_at_this_machines_limit_too(monkeypatch):
    """The verify passes at the roofline (flat below its knee: v = 1 at 5 tokens) and the draft at its bandwidth
    bound (c = 7.5 / 25): the theory line quotes Thm 3.8 there, beside the textbook's and the measured verify."""
    from specviz.hardware import roofline
    from specviz.theory.figures import run_figures
    from specviz.trace import theoretical_speedup
    from specviz.views.race_words import theory_line

    monkeypatch.setattr(roofline, "probe_roofline",
                        lambda p, e=None: roofline.Roofline(25.0, 2.0, "avx2", 750.0, 1_500_000_000))
    monkeypatch.setattr(service, "probe_roofline", roofline.probe_roofline)
    pair = _probe_with_roofline()
    prices = service.probe_prices(pair, 2)
    assert prices.limit_target(1) == pytest.approx(0.025) and prices.limit_target(16) == pytest.approx(0.032)
    assert prices.limit_draft == pytest.approx(0.0075)
    spec, std = _race()
    spec.timing = TM.assess_race(spec, std, prices=prices, threads=2)
    assert spec.timing.v_limit == pytest.approx(1.0) and spec.timing.c_limit == pytest.approx(0.3)
    fig = run_figures(spec, std)
    speedup, v, c = fig.limit
    assert speedup == pytest.approx(theoretical_speedup(fig.alpha, fig.quoted.gamma, 0.3, 1.0))
    line = theory_line(fig)
    assert f"{speedup:.2f}× at this machine's limit" in line and "c = 0.30" in line and "1.00 steps" in line
    # a race on one thread is priced by the probe's one-thread curve, where its all-core roofline does not hold
    pair.probe.one_thread = {"curve": {1: 180.0, 2: 185.0, 4: 190.0, 8: 220.0}, "draft_ms": 70.0}
    one = service.probe_prices(pair, 1)
    assert one.threads == 1 and one.limit_target is None and one.limit_draft is None
    # a recording keeps the limit's figures; one made before them reads as unmeasured
    again = trace_from_json(spec.to_json())
    assert again.timing.v_limit == pytest.approx(1.0) and again.timing.c_limit == pytest.approx(0.3)
    spec.timing = dataclasses.replace(spec.timing, v_limit=None, c_limit=None)
    assert run_figures(spec, std).limit is None and "machine's limit" not in theory_line(run_figures(spec, std))
