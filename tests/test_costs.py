"""The page tells the truth about cost: a verify pass's cost in standard steps (the verify factor v),
Thm 3.8 with it beside the textbook value, the headline's reason when speculation lost, and sweeps
that time warm runs only.  Synthetic traces with chosen timings; no model, no timing assertions."""

from __future__ import annotations

import re
from dataclasses import replace
from types import SimpleNamespace

import pytest

from specviz import theory as th
from specviz.core.settings import DecodeSettings
from specviz.experiments import shootout, sweeps
from specviz.theory.costs import COMPUTE_BOUND_V, loss_cause, race_costs
from specviz.theory.figures import run_figures
from specviz.views import race_plots
from specviz.views.metrics import metrics_html
from specviz.views.race import race_html
from tests.synthetic import make_std_trace, make_trace

# The EPYC's case: the target's verify pass costs 2.6 one-token steps, the draft is cheap.
VERIFY_BOUND = dict(draft_token_s=0.01, verify_s=0.12)
STEP = 0.046


def headline(h: str) -> str:
    (div,) = re.findall(r'<div class="sv-speedup[^"]*"[^>]*>.*?</div>', h)
    return re.sub(r"<[^>]+>", " | ", div)


def test_the_verify_factor_and_c_are_measured_against_the_standard_step():
    spec, std = make_trace(**VERIFY_BOUND), make_std_trace(step=STEP)
    rc = race_costs(spec, std)
    assert rc.t_step == pytest.approx(STEP) and rc.t_verify == pytest.approx(0.12)
    assert rc.v == pytest.approx(0.12 / STEP)
    assert rc.c == pytest.approx(0.01 / STEP)  # per standard step, not per verify pass
    assert rc.c_verify == pytest.approx(spec.summary().c)
    a = spec.summary().alpha
    assert rc.textbook == pytest.approx(th.expected_speedup(a, 4, 0.01 / STEP))
    assert rc.with_verify == pytest.approx(th.expected_speedup(a, 4, 0.01 / STEP, 0.12 / STEP))
    assert rc.measured == pytest.approx(spec.summary().tokens_per_s / std.summary().tokens_per_s)


def test_the_prompt_pass_is_not_a_step():
    """The standard run's first step also reads the prompt: it is left out of the step time."""
    std = make_std_trace(step=STEP)
    std.rounds[0] = replace(std.rounds[0], prompt_fed=11, t_verify=3.0)
    assert race_costs(make_trace(), std).t_step == pytest.approx(STEP)


def test_without_a_standard_run_the_verify_cost_is_unknown_not_assumed():
    spec = make_trace(**VERIFY_BOUND)
    rc = race_costs(spec, None)
    assert rc.v is None and rc.c is None and rc.with_verify is None and rc.measured is None
    assert rc.textbook == pytest.approx(spec.summary().theoretical_speedup)  # c per verify pass: all there is
    assert loss_cause(rc) is None
    h = metrics_html(spec, figures=run_figures(spec, None))
    assert re.search(r"Verify factor v</th><td[^>]*>unknown<", h)
    assert re.search(r"Thm 3.8, measured verify</th><td[^>]*>unknown<", h)
    assert race_costs(make_std_trace(), None) is None and race_costs(None, None) is None


def test_a_lost_race_says_how_much_longer_and_why_the_verify_cost():
    spec, std = make_trace(**VERIFY_BOUND), make_std_trace(step=STEP)
    rc = race_costs(spec, std)
    assert rc.measured < 1 < rc.textbook and rc.with_verify < 1  # won on paper, lost on this machine
    h = race_html(spec, std)
    text = headline(h)
    assert "slower" not in text
    assert f"speculative took {1 / rc.measured:.2f}× as long per token ({rc.measured:.2f}× the speed)" in text
    assert ("Why: each verify pass cost 2.6 standard steps on this machine: the target is compute-bound here "
            "(Thm 3.8 assumes one).") in text
    assert (f"theory (Leviathan Thm 3.8): {rc.textbook:.2f}× if a verify pass cost one standard step · "
            f"{rc.with_verify:.2f}× with the measured verify cost (2.6 steps)") in text
    assert 'data-cause="verify"' in h and "sv-speedup--slow" in h


def test_the_status_line_of_a_lost_race_never_calls_it_a_speedup():
    """The status under a lost race said "speedup 0.58× over standard decoding"; it says how much longer
    speculative took, as the headline does."""
    from specviz.ui.live import done_message

    spec, std = make_trace(**VERIFY_BOUND), make_std_trace(step=STEP)
    sp = race_costs(spec, std).measured
    text = done_message(spec, std)
    assert sp < 1 and "speedup" not in text and "slower" not in text
    assert text.endswith(f"speculative took {1 / sp:.2f}× as long per token ({sp:.2f}× the speed of standard decoding)")
    won = make_std_trace(step=0.2)
    assert done_message(make_trace(), won).endswith(f"speedup {race_costs(make_trace(), won).measured:.2f}× over "
                                                    "standard decoding")


def test_a_won_race_is_faster_and_gives_no_reason():
    spec, std = make_trace(), make_std_trace(step=0.2)
    h = race_html(spec, std)
    sp = race_costs(spec, std).measured
    assert sp > 1
    text = headline(h)
    assert f"speculative is {sp:.2f}× faster" in text and "Why" not in text and "data-cause" not in h
    assert "with the measured verify cost (0.60 steps)" in text


def test_a_slow_draft_is_named():
    spec, std = make_trace(draft_token_s=0.2, verify_s=0.12), make_std_trace(step=0.11)
    cause, text = loss_cause(race_costs(spec, std))
    assert cause == "draft" and text.startswith("the draft is too slow here: drafting cost 7.3 standard steps per round")
    assert "compute-bound" not in text  # its verify pass costs 1.09 steps


def test_low_acceptance_is_named_and_a_dear_verify_pass_beside_it():
    plan = [dict(accept=0, extra="correction")] * 5 + [dict(accept=1, extra="correction")]
    cause, text = loss_cause(race_costs(make_trace(plan=plan, draft_token_s=0.01), make_std_trace(step=0.11)))
    assert cause == "acceptance" and "0.2 of 4.0 drafts per round accepted" in text and "compute-bound" not in text
    slow = make_std_trace(step=0.12 / (COMPUTE_BOUND_V + 1))
    cause, text = loss_cause(race_costs(make_trace(plan=plan, draft_token_s=0.01), slow))
    assert cause == "acceptance" and text.endswith("the target is compute-bound here")


def test_rounds_that_won_put_the_loss_outside_them():
    """A long prompt pass before the first round: the rounds beat standard decoding, the run did not."""
    spec, std = make_trace(t_prefill=6.0), make_std_trace(step=0.2)
    rc = race_costs(spec, std)
    assert rc.measured < 1 < rc.rounds_speedup
    cause, text = loss_cause(rc)
    assert cause == "overhead" and f"the rounds alone ran at {rc.rounds_speedup:.2f}×" in text


def test_metrics_show_the_verify_factor_and_both_theorems():
    spec, std = make_trace(**VERIFY_BOUND), make_std_trace(step=STEP)
    rc = race_costs(spec, std)
    h = metrics_html(spec, figures=run_figures(spec, std))
    assert re.search(r"Verify factor v</th><td[^>]*>2\.6 standard steps<", h)
    assert re.search(rf"Thm 3.8, textbook</th><td[^>]*>{rc.textbook:.2f}×<", h)
    assert re.search(rf"Thm 3.8, measured verify</th><td[^>]*>{rc.with_verify:.2f}×<", h)
    assert re.search(rf"c \(cost ratio\)</th><td[^>]*>{rc.c:.3f}<", h)


def test_speedup_bars_show_the_textbook_and_the_measured_verify():
    spec, std = make_trace(**VERIFY_BOUND), make_std_trace(step=STEP)
    rc = race_costs(spec, std)
    fig = race_plots.speedup_bars(spec, std)
    (bar,) = [t for t in fig.data if t.type == "bar"]
    assert list(bar.y[:3]) == pytest.approx([rc.measured, rc.textbook, rc.with_verify])
    assert bar.x[2] == "Thm 3.8<br>v = 2.6"  # short labels: the chart is a third of a row
    assert "verify = 2.6 steps" in fig.layout.title.subtitle.text.replace("<br>", " ")
    (only,) = [t for t in race_plots.speedup_bars(spec, None).data if t.type == "bar"]
    assert only.text[0] == "n/a" and only.text[2] == "n/a"


# ---- sweeps: warm runs only, theory with the verify factor ---------------------------------------


class Decodes:
    """Stands in for the engine in specviz.experiments.sweeps and specviz.experiments.shootout: logs each call and returns
    synthetic traces (speculative: the verify-bound one; standard: one step every STEP seconds)."""

    def __init__(self, monkeypatch):
        self.calls: list[tuple[str, int, str]] = []
        for mod in (sweeps, shootout):
            monkeypatch.setattr(mod, "standard_decode", self.standard)
            monkeypatch.setattr(mod, "speculative_decode", self.speculative)
            # No pair to build a drafter for: the fake decoders ignore it (the engine takes it from its caller).
            monkeypatch.setattr(mod, "make_drafter", lambda pair, settings: None)

    def standard(self, pair, ids, settings, **kw):
        self.calls.append(("standard", settings.max_new_tokens, ""))
        return make_std_trace(step=STEP)

    def speculative(self, pair, ids, settings, **kw):
        self.calls.append(("speculative", settings.max_new_tokens, settings.drafter))
        return make_trace(gamma=settings.gamma, **VERIFY_BOUND)


def request(**kw) -> SimpleNamespace:
    return SimpleNamespace(pair=None, prompt_ids=[1, 2, 3], prompt="p",
                           settings=DecodeSettings(gamma=4, max_new_tokens=48, **kw))


def test_the_gamma_sweep_times_a_warm_baseline(monkeypatch):
    """The recorded sweep timed its baseline first thing after loading (3.17 tok/s against the
    shoot-out's 4.58 the same day), so every γ measured above theory.  Both decoders now run
    briefly, untimed, before the baseline."""
    log = Decodes(monkeypatch)
    steps = list(sweeps.gamma_sweep(request(), gammas=(4,), repeats=2))
    assert log.calls[:2] == [("standard", sweeps.WARMUP_TOKENS, ""), ("speculative", sweeps.WARMUP_TOKENS, "model")]
    assert log.calls[2:] == [("standard", 48, ""), ("speculative", 48, "model")] * 2  # warm once, then the rounds
    assert steps[0][1] == sweeps.WARMING_UP


def test_the_gamma_sweep_draws_theory_with_the_verify_factor(monkeypatch):
    Decodes(monkeypatch)
    rows = [r for _, _, r in sweeps.gamma_sweep(request(), gammas=(4,)) if r is not None][-1]  # the points at the end
    rc = race_costs(make_trace(**VERIFY_BOUND), make_std_trace(step=STEP))
    std_tps = make_std_trace(step=STEP).summary().tokens_per_s  # the same every repeat: no spread
    assert rows[0] == {"gamma": 0, "tokens_per_s": std_tps, "tokens_per_s_lo": std_tps, "tokens_per_s_hi": std_tps,
                       "repeats": sweeps.REPEATS, "noisy": 0}
    row = rows[1]
    assert row["c"] == pytest.approx(rc.c) and row["v"] == pytest.approx(rc.v)
    assert row["speedup"] == pytest.approx(rc.measured)
    assert row["theoretical_speedup"] == pytest.approx(th.expected_speedup(row["alpha"], 4, rc.c, rc.v))


def test_the_epsilon_sweep_and_the_shootout_warm_up_too(monkeypatch):
    log = Decodes(monkeypatch)
    list(sweeps.epsilon_sweep(request(), epsilons=(0.0,)))
    assert log.calls[0] == ("standard", sweeps.WARMUP_TOKENS, "") and log.calls[2] == ("standard", 48, "")
    log.calls.clear()
    list(shootout.run(request()))
    line = shootout.lineup(request().settings)
    warm = [c for c in log.calls if c[1] == sweeps.WARMUP_TOKENS]
    assert warm == [("standard", sweeps.WARMUP_TOKENS, "")] + [
        ("speculative", sweeps.WARMUP_TOKENS, c.key) for c in line if c.key != shootout.STANDARD]
    assert log.calls[:len(warm)] == warm  # before anything timed


def test_a_drafter_that_cannot_warm_up_is_left_to_its_timed_run(monkeypatch):
    log = Decodes(monkeypatch)

    def refuse(pair, ids, settings, **kw):
        log.calls.append(("speculative", settings.max_new_tokens, settings.drafter))
        raise ValueError("no head for this target")
    monkeypatch.setattr(sweeps, "speculative_decode", refuse)
    sweeps.warm_up(request())
    assert log.calls == [("standard", sweeps.WARMUP_TOKENS, ""), ("speculative", sweeps.WARMUP_TOKENS, "model")]


def test_the_theory_tab_takes_the_last_runs_verify_factor():
    from specviz.ui.tabs import theory_views, use_last_run

    spec, std = make_trace(**VERIFY_BOUND), make_std_trace(step=STEP)
    rc = race_costs(spec, std)
    alpha, gamma, c, v = use_last_run({"spec": spec, "std": std})
    assert (c, v) == (round(rc.c, 3), round(rc.v, 2))
    frame = theory_views(alpha, gamma, c, 0.05, {"spec": spec, "std": std}, v)
    assert "a verify pass = 2.6 standard steps" in frame.note
    assert f"expected speedup {th.expected_speedup(alpha, gamma, c, v):.2f}×" in frame.note
    assert f"(textbook, a verify pass = 1 step: {th.expected_speedup(alpha, gamma, c):.2f}×)" in frame.note
    import gradio as gr

    assert use_last_run({"spec": spec})[3] == gr.skip() != v  # no standard run: v stays where it is


def test_a_recording_without_the_verify_factor_says_its_gamma_speedups_read_high(tmp_path):
    import json

    from specviz.experiments import recorded
    from specviz.ui import shootout_ui

    data = json.loads(recorded.DEFAULT_PATH.read_text(encoding="utf-8"))
    for r in data["gamma"]:
        r.pop("v", None)
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data), encoding="utf-8")
    assert "timed its standard baseline cold" in shootout_ui.recorded_frame(old).status
    for r in data["gamma"][1:]:
        r["v"] = 1.1
    new = tmp_path / "new.json"
    new.write_text(json.dumps(data), encoding="utf-8")
    frame = shootout_ui.recorded_frame(new)
    assert "cold" not in frame.status
    assert [t for t in frame.gamma_plot.data if t.name.replace("<br>", " ") == "Thm 3.8 with the verify cost measured at each γ"]


def _lost_race_with_the_prompt_in_the_first_round():
    """The issue's race: 18 tokens in 6 rounds whose drafting + verify times add up to 15.97 s (the first
    verify pass also read the prompt: 6.67 s), against standard decoding at 1.2 tokens/s."""
    spec = make_trace(plan=[dict(accept=2, extra="correction")] * 6, draft_token_s=0.1, verify_s=1.38)
    first = spec.rounds[0]
    extra = 6.67 - first.t_verify
    spec.rounds[0] = replace(first, t_verify=6.67, t_end=first.t_end + extra, prompt_fed=40)
    for i in range(1, len(spec.rounds)):
        r = spec.rounds[i]
        spec.rounds[i] = replace(r, t_start=r.t_start + extra, t_end=r.t_end + extra)
    spec.t_total += extra
    std = make_std_trace(n_tokens=24, step=0.7, t_prefill=0.0)  # its first pass also reads the prompt: 3.9 s
    extra = 3.9 - 0.7
    std.rounds[0] = replace(std.rounds[0], t_verify=3.9, t_end=std.rounds[0].t_end + extra, prompt_fed=40)
    for i in range(1, len(std.rounds)):
        r = std.rounds[i]
        std.rounds[i] = replace(r, t_start=r.t_start + extra, t_end=r.t_end + extra)
    std.t_total += extra  # 24 tokens in 20 s: 1.2 tokens/s
    return spec, std


def test_the_rounds_alone_are_timed_by_the_rounds_own_times():
    """A race that lost said "the rounds alone ran at 1.18× standard decoding": tokens per round over
    (drafting + v) steps, with v leaving out the verify pass that read the prompt.  The rounds' own times
    add up to 15.97 s for 18 tokens, against 1.2 tokens/s: 0.94×, so the loss is not put outside them."""
    spec, std = _lost_race_with_the_prompt_in_the_first_round()
    assert sum(r.t_draft + r.t_verify for r in spec.rounds) == pytest.approx(15.97)
    assert spec.n_tokens == 18 and std.summary().tokens_per_s == pytest.approx(1.2)
    rc = race_costs(spec, std)
    assert rc.measured < 1
    assert (rc.round_tokens, rc.round_seconds, rc.prompt_in_rounds) == (18, pytest.approx(15.97), True)
    assert (rc.std_round_tokens, rc.std_round_seconds) == (24, pytest.approx(20.0))
    assert rc.rounds_speedup == pytest.approx((18 / 15.97) / 1.2) == pytest.approx(0.94, abs=0.005)
    # what the old steps model said for the same race
    assert rc.tokens_per_round / (rc.drafting_steps + rc.v) == pytest.approx(1.18, abs=0.01)
    cause, text = loss_cause(rc)
    assert cause != "overhead" and "rounds alone" not in text

    # The same race without the slow first pass: the rounds alone win, and the sentence gives its numbers.
    fast = replace(rc, round_seconds=12.0)
    cause, text = loss_cause(fast)
    assert cause == "overhead"
    assert text.startswith("the rounds alone ran at 1.25× standard decoding's (18 tokens in 12.00 s of drafting "
                           "and verifying: 1.50 tokens/s, against 24 tokens in 20.00 s of target passes: "
                           "1.20 tokens/s)")
    assert "(tracing, other work on this machine)" in text  # the prompt pass was inside a round: not "outside"
    assert "the prompt pass" in loss_cause(replace(fast, prompt_in_rounds=False))[1]
