"""The workshop challenges: each check passes on a run that does what it asks and fails on one that does not.

Runs are real: the tiny random pair through the engine, or the shipped recordings (real races of the
default pair).  The challenges that read timings run the tiny pair on a simulated machine: the engine's
clock reads a counter that only the models' forward passes move (a target pass costs a fixed time, plus
a time per extra token fed on a compute-bound machine), so the verdicts never depend on how busy the
test machine is.
"""

from __future__ import annotations

import time
from pathlib import Path

import copy

import pytest

from specviz.core import engine
from specviz.core.engine import standard_decode
from specviz.core.settings import DecodeSettings
from specviz.experiments.challenge_checks import MACHINE_BANDS, corrections
from specviz.experiments.challenges import BY_KEY, CHALLENGES, Given, Run, check_all
from specviz.models.tiny import build_tiny_pair
from specviz.trace import load_recording
from specviz.trace.timing import Timing
from specviz.ui import challenges_ui as CU
from specviz.ui.store import STORE
from specviz.views.challenges import board_html
from tests.drafted import speculative_decode

# The trace-v2 recordings shipped before 2026-11-26 (bf16 target, AMX Xeon): these tests lean on their rounds.
TRACES = Path(__file__).resolve().parent / "fixtures" / "traces-v2"
PROMPT = "hello there"


class SimulatedMachine:
    """Stands in for the engine's `time` module: the clock moves when a model runs a forward pass (target:
    `target_ms` plus `per_token_ms` for each token fed beyond the first; draft: `draft_ms`) and by a
    nanosecond a reading, never with the wall clock."""

    def __init__(self, pair, *, target_ms: float, per_token_ms: float = 0.0, draft_ms: float = 5.0):
        self.now = 0.0
        self.target_ms, self.per_token_ms, self.draft_ms = target_ms, per_token_ms, draft_ms
        self.pair = pair

    def perf_counter(self) -> float:
        self.now += 1e-9
        return self.now

    def __getattr__(self, name):
        return getattr(time, name)

    def _target(self, module, args, kwargs):
        fed = kwargs["input_ids"].shape[1] if "input_ids" in kwargs else args[0].shape[1]
        self.now += (self.target_ms + self.per_token_ms * (fed - 1)) / 1000

    def _draft(self, module, args, kwargs):
        self.now += self.draft_ms / 1000

    def __enter__(self):
        self.hooks = [self.pair.target.register_forward_pre_hook(self._target, with_kwargs=True),
                      self.pair.draft.register_forward_pre_hook(self._draft, with_kwargs=True)]
        self.patch = pytest.MonkeyPatch()
        self.patch.setattr(engine, "time", self)
        return self

    def __exit__(self, *exc):
        for h in self.hooks:
            h.remove()
        self.patch.undo()


@pytest.fixture(scope="module")
def pair():
    return build_tiny_pair()


_RACES: dict = {}  # identical requests are run once per module (the runs are deterministic)


def race(pair, prompt: str = PROMPT, *, machine: dict | None = None, **settings) -> Run:
    """A speculative run and its standard run on the tiny pair (on a simulated machine when given)."""
    key = (id(pair), prompt, tuple(sorted((machine or {}).items())), tuple(sorted(settings.items())))
    if key not in _RACES:
        _RACES[key] = _race(pair, prompt, machine, settings)
    return _RACES[key]


def _race(pair, prompt: str, machine: dict | None, settings: dict) -> Run:
    s = DecodeSettings.checked(**{"max_new_tokens": 24, **settings})
    ids = pair.tokenizer.encode(prompt)
    if machine is None:
        return Run(spec=speculative_decode(pair, ids, s, prompt=prompt), std=standard_decode(pair, ids, s, prompt=prompt))
    with SimulatedMachine(pair, **machine):
        return Run(spec=speculative_decode(pair, ids, s, prompt=prompt), std=standard_decode(pair, ids, s, prompt=prompt))


def recording(name: str) -> Run:
    spec, std = load_recording((TRACES / name).read_bytes())
    return Run(spec=spec, std=std)


MEMORY_BOUND = dict(target_ms=100.0, per_token_ms=0.0, draft_ms=5.0)  # a verify pass costs one step
COMPUTE_BOUND = dict(target_ms=100.0, per_token_ms=100.0, draft_ms=5.0)  # every token fed costs a step


def test_every_challenge_has_its_texts_and_a_check():
    assert 5 <= len(CHALLENGES) <= 8 and len(BY_KEY) == len(CHALLENGES)
    for c in CHALLENGES:
        assert c.title and c.task and c.hint and len(c.why) > 150
        v = c.check([])  # no runs: a clear "not yet", never an exception
        assert not v.passed and v.message


# ---- 1. exact --------------------------------------------------------------------------------


def test_exact_passes_on_a_greedy_run_with_rejections_and_equal_texts(pair):
    run = race(pair, temperature=0)
    assert run.spec.summary().rejections > 0 and run.spec.text == run.std.text
    v = BY_KEY["exact"].check([run])
    assert v.passed and "equals the standard text" in v.message


def test_exact_fails_when_the_texts_part_or_the_rule_is_not_exact(pair):
    chat = recording("2-chat-greedy.json")  # the bf16 target's greedy texts part (a near tie flips)
    assert chat.spec.text != chat.std.text
    v = BY_KEY["exact"].check([chat])
    assert not v.passed and "part at token" in v.message and "bf16" in v.message
    v = BY_KEY["exact"].check([race(pair, temperature=0, epsilon=0.3)])
    assert not v.passed and "ε > 0" in v.message
    v = BY_KEY["exact"].check([race(pair, temperature=1.0)])
    assert not v.passed and "greedy" in v.message
    # one passing run among failing ones is enough
    assert BY_KEY["exact"].check([chat, race(pair, temperature=0)]).passed


# ---- 2. lose ---------------------------------------------------------------------------------


def test_lose_passes_when_the_race_was_lost_and_says_why(pair):
    run = race(pair, temperature=1.0, gamma=8, machine=COMPUTE_BOUND)
    v = BY_KEY["lose"].check([run])
    assert v.passed and "the standard speed" in v.message and "compute-bound" in v.message
    slow = recording("4-slow-case.json")  # a real race that speculation lost on the AMX Xeon
    v = BY_KEY["lose"].check([slow])
    assert v.passed and "low acceptance" in v.message


def test_lose_fails_while_speculation_wins(pair):
    run = race(pair, temperature=0, gamma=3, machine=MEMORY_BOUND)
    v = BY_KEY["lose"].check([run, recording("1-code-greedy.json")])
    assert not v.passed and "won every race" in v.message
    spec_only = Run(spec=run.spec, std=None)
    assert "None of your runs" in BY_KEY["lose"].check([spec_only]).message


# ---- 3. this machine ------------------------------------------------------------------------


def test_machine_accepts_the_answer_the_measured_verify_cost_supports(pair):
    flat = race(pair, temperature=0, gamma=5, machine=MEMORY_BOUND)
    steep = race(pair, temperature=0, gamma=5, machine=COMPUTE_BOUND)
    check = BY_KEY["machine"].check
    assert check([flat], Given(answer="flat")).passed
    assert not check([flat], Given(answer="steep")).passed
    v = check([steep], Given(answer="steep"))
    assert v.passed and "compute-bound" in v.message
    assert not check([steep], Given(answer="flat")).passed
    assert "Pick an answer" in check([flat]).message
    # the shipped recordings: a verify pass cost ~1.07 steps on the AMX Xeon
    xeon = recording("1-code-greedy.json")
    assert check([xeon], Given(answer="flat")).passed
    assert not check([xeon], Given(answer="middle")).passed and not check([xeon], Given(answer="steep")).passed


def test_machine_checks_the_probe_curve_not_a_noisy_race(pair):
    """A busy machine can slow the run's verify passes; where the machine was probed, the probe's curve (the
    This machine tab, timed on a quiet machine) decides, and the page says the race measured otherwise."""
    steep = race(pair, temperature=0, gamma=5, machine=COMPUTE_BOUND)
    key = (steep.spec.models.get("preset", ""), steep.spec.models.get("target_exec", ""))
    quiet = Given(answer="flat", probe_curves={key: {1: 80.0, 8: 84.0}})  # the probe measured a flat curve
    v = BY_KEY["machine"].check([steep], quiet)
    assert v.passed and "Your race measured v =" in v.message and "memory-bound" in v.message
    assert not BY_KEY["machine"].check([steep], Given(answer="steep", probe_curves=quiet.probe_curves)).passed
    assert not BY_KEY["machine"].check([steep], Given(answer="middle", probe_curves=quiet.probe_curves)).passed


def _flagged(run: Run, predicted: float | None) -> Run:
    """The same race, its timings flagged as disturbed (specviz.theory.timing), with a count-based figure."""
    spec, std = copy.copy(run.spec), copy.copy(run.std)
    spec.timing = std.timing = Timing(spread=0.4, reliable=False, why="passes varied by ±40%", predicted=predicted)
    return Run(spec=spec, std=std)


def test_a_flagged_race_is_judged_by_its_counts_or_not_credited(pair):
    lost = race(pair, temperature=1.0, gamma=8, machine=COMPUTE_BOUND)
    assert BY_KEY["lose"].check([lost]).passed
    v = BY_KEY["lose"].check([_flagged(lost, predicted=1.4)])  # the clocks said it lost; the counts say it won
    assert not v.passed and "won every race" in v.message
    v = BY_KEY["lose"].check([_flagged(lost, predicted=None)])
    assert not v.passed and "timed while the machine was busy" in v.message and "±40%" in v.message
    v = BY_KEY["lose"].check([_flagged(lost, predicted=0.8)])
    assert v.passed and "count-based" in v.message
    won = race(pair, "abcabcabcabcabcabc", drafter="prompt-lookup", temperature=0, machine=MEMORY_BOUND)
    assert BY_KEY["lookup"].check([won]).passed
    assert not BY_KEY["lookup"].check([_flagged(won, predicted=0.9)]).passed  # a busy machine's win is not credited
    assert "timed while the machine was busy" in BY_KEY["lookup"].check([_flagged(won, predicted=None)]).message
    flat = race(pair, temperature=0, gamma=5, machine=MEMORY_BOUND)
    v = BY_KEY["machine"].check([_flagged(flat, predicted=1.2)], Given(answer="flat"))  # no probe: v is noisy
    assert not v.passed and "timed while the machine was busy" in v.message


def test_machine_names_the_probe_curve_when_there_is_one(pair):
    run = race(pair, temperature=0, gamma=5, machine=MEMORY_BOUND)
    key = (run.spec.models.get("preset", ""), run.spec.models.get("target_exec", ""))
    fed = run.spec.summary().mean_draft_length + 1
    v = BY_KEY["machine"].check([run], Given(answer="flat", probe_curves={key: {1: 80.0, 2: 80.0, 16: 120.0}}))
    expect = (80.0 + 40.0 * (fed - 2) / 14) / 80.0  # the curve read between its measured points
    assert v.passed and f"/T(1) = {expect:.2f}" in v.message
    assert set(MACHINE_BANDS) == {key for _, key in BY_KEY["machine"].answers}


# ---- 4. the correction ------------------------------------------------------------------------


def test_correction_passes_on_a_correction_that_is_not_the_drafts_runner_up(pair):
    run = race(pair, temperature=1.0, gamma=6, seed=1)
    v = BY_KEY["correction"].check([run])
    assert v.passed and "the correction was" in v.message
    # what the message claims holds in the recorded picture: the correction is not q's second token
    hit = next(c for c in corrections([run]) if c.rank is not None and c.rank != 2)
    order = sorted(range(len(hit.beliefs)), key=lambda j: -hit.beliefs[j])
    assert order[1] != hit.at and hit.pic.ids[hit.at] == hit.rnd.extra.id
    assert sum(q > hit.beliefs[hit.at] for q in hit.beliefs) == hit.rank - 1


def test_correction_fails_without_a_rejection_or_without_pictures():
    same = build_tiny_pair(draft_layers=2, noise=0.0)  # the draft is the target: nothing is ever rejected
    v = BY_KEY["correction"].check([race(same, temperature=1.0)])
    assert not v.passed and "rejected and corrected" in v.message
    v = BY_KEY["correction"].check([recording("2-chat-greedy.json")])  # version 2: no pictures
    assert not v.passed and "no acceptance pictures" in v.message


# ---- 5. block -----------------------------------------------------------------------------------


def test_block_passes_when_block_keeps_more_of_the_same_drafts(pair):
    v = BY_KEY["block"].check([race(pair, temperature=1.0, gamma=6, rule="block")])
    assert v.passed and "block verification keeps" in v.message and "exact match" in v.message


def test_block_fails_on_greedy_runs_and_old_recordings(pair):
    assert not BY_KEY["block"].check([race(pair, temperature=0, gamma=6)]).passed
    v = BY_KEY["block"].check([recording("3-translation-sampled.json")])  # sampled, but version 2
    assert not v.passed and "older than version 3" in v.message


# ---- 6. bias ------------------------------------------------------------------------------------


def test_bias_passes_once_epsilon_moves_the_distribution(pair):
    exact = race(pair, temperature=1.0, max_new_tokens=48, seed=2)
    over = race(pair, temperature=1.0, epsilon=0.3, max_new_tokens=48, seed=2)
    assert exact.spec.summary().mean_bias < 1e-6  # ε = 0: no bias (up to float rounding)
    v = BY_KEY["bias"].check([exact, over])
    assert v.passed and "ε = 0.3" in v.message and "at ε = 0 on the same prompt" in v.message
    assert "Rejection probability + bias" in v.message


def test_bias_fails_at_epsilon_zero_or_too_small(pair):
    assert "None of your runs" in BY_KEY["bias"].check([race(pair, temperature=1.0, max_new_tokens=48)]).message
    small = race(pair, temperature=1.0, epsilon=0.001, max_new_tokens=48, seed=1)
    assert small.spec.summary().mean_bias < 0.05
    v = BY_KEY["bias"].check([small])
    assert not v.passed and "raise ε" in v.message


# ---- 7. tree ------------------------------------------------------------------------------------


TREE = dict(temperature=1.0, drafter="tree", gamma=3, branches=3, tree_nodes=12, tree_mode="iid")


def test_tree_passes_when_it_keeps_more_per_round_than_the_chain_on_the_same_prompt(pair):
    tree, chain = race(pair, **TREE), race(pair, temperature=1.0, gamma=3)
    assert tree.spec.summary().mean_accepted_length > chain.spec.summary().mean_accepted_length
    v = BY_KEY["tree"].check([chain, tree])
    assert v.passed and "tokens per round against the chain's" in v.message


def test_tree_fails_without_a_fair_chain_to_compare(pair):
    tree = race(pair, **TREE)
    assert "same prompt" in BY_KEY["tree"].check([tree, race(pair, "other words", temperature=1.0)]).message
    v = BY_KEY["tree"].check([tree, race(pair, temperature=1.0, gamma=2)])  # a shallower chain is no fair match
    assert not v.passed and "same depth" in v.message
    assert not BY_KEY["tree"].check([race(pair, temperature=1.0, gamma=3)]).passed


# ---- 8. prompt lookup -----------------------------------------------------------------------------


def test_lookup_passes_when_copying_wins_the_race(pair):
    run = race(pair, "abcabcabcabcabcabc", drafter="prompt-lookup", temperature=0, machine=MEMORY_BOUND)
    v = BY_KEY["lookup"].check([run])
    assert v.passed and "tokens per target pass" in v.message


def test_lookup_fails_when_it_loses_or_was_not_used(pair):
    run = race(pair, "abcabcabcabcabcabc", drafter="prompt-lookup", temperature=0, machine=COMPUTE_BOUND)
    v = BY_KEY["lookup"].check([run])
    assert not v.passed and "found anything to copy" in v.message
    assert "None of your runs used prompt lookup" in BY_KEY["lookup"].check([race(pair, temperature=0)]).message


# ---- the tab's session logic (no browser) ---------------------------------------------------------


def test_the_session_counts_its_own_runs_not_recordings(pair):
    run = race(pair, temperature=0, gamma=3, machine=MEMORY_BOUND)
    mine = STORE.put(run.spec, run.std)
    rec = recording("1-code-greedy.json")
    shown_rec = STORE.put(rec.spec, rec.std)

    # A Run that succeeded shows a new handle: remembered; an event that left the shown recording: not.
    history = CU.remember(mine, CU.mark(shown_rec), [])
    assert [h.id for h in history] == [mine.id]
    assert CU.remember(shown_rec, CU.mark(shown_rec), history) == history
    assert CU.remember(mine, None, history) == history  # no duplicates

    # A recording on the Live tab passes nothing, however good it is.
    res = CU.check_session(shown_rec, [], {}, None, curves=lambda runs: {})
    assert res.done == {} and "No runs of yours" in res.note and "not counted" in res.note

    res = CU.check_session(mine, history, {}, None, curves=lambda runs: {})
    assert "exact" in res.done and "lose" not in res.done  # greedy and exact; speculation won this race
    assert "Newly done: ✓ Exact" in res.note and f"{len(res.done)} of {len(CHALLENGES)} done" in res.note
    assert 'data-key="exact"' in res.board and "✓ done" in res.board
    top, bottom = CU.boards(res.done, res.latest)  # drawn in two parts around the machine challenge's answer
    assert top.count("sv-challenge\"") + bottom.count("sv-challenge\"") == len(CHALLENGES)
    assert 'data-key="machine"' in top and 'data-key="machine"' not in bottom and "of 8 done" not in bottom
    # Progress is sticky within the session: a later check with other runs keeps it.
    again = CU.check_session(mine, [], res.done, None, curves=lambda runs: {})
    assert again.done == res.done and board_html(again.done).count("✓ done") == len(res.done)


def test_a_check_pressed_at_once_after_a_race_counts_it(pair):
    """The race's last frame shows the visitor's own run; a check pressed before the follow-up event that
    remembers it (`remember`, queued behind the page's other updates) has run still counts it, every time."""
    from specviz.ui import live

    run = race(pair, temperature=0, gamma=3, machine=MEMORY_BOUND)
    frame = live.final_frame(run.spec, run.std, "done", run=True)  # what live.run yields when a race ends
    assert frame.state.run and frame.state.held
    for _ in range(3):
        res = CU.check_session(frame.state, [], {}, None, curves=lambda runs: {})
        assert res.note.startswith("Checked 1 run of yours") and "exact" in res.done, res.note
    assert CU.check_session(frame.state, [frame.state], {}, None, curves=lambda runs: {}).note.startswith(
        "Checked 1 run of yours")  # once remembered, not counted twice
    upload = live.final_frame(run.spec, run.std, "loaded")  # the same traces uploaded: not a run of one's own
    assert "No runs of yours" in CU.check_session(upload.state, [], {}, None, curves=lambda runs: {}).note


def test_a_run_the_store_dropped_is_said_not_checked(pair):
    run = race(pair, temperature=0)
    gone = STORE.put(run.spec, run.std)
    STORE.drop(gone)
    res = CU.check_session(None, [gone], {}, None, curves=lambda runs: {})
    assert "no longer held" in res.note and res.done == {}


def test_a_failing_check_shows_a_message_never_a_traceback(monkeypatch, pair):
    def broken(*a, **k):
        raise RuntimeError("boom")

    run = race(pair, temperature=0)
    mine = STORE.put(run.spec, run.std)
    monkeypatch.setattr(CU, "check_all", broken)
    top, bottom, note, done = CU.on_check(mine, [mine], {}, None)
    assert note.startswith("Could not check your runs") and "Traceback" not in note


def test_check_all_limits_itself_to_the_keys_asked(pair):
    out = check_all([race(pair, temperature=0)], keys=["exact", "lose"])
    assert set(out) == {"exact", "lose"}
