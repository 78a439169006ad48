"""The "same draft, three rules" view of one round (specviz.views.rules), from a real tiny run."""

from __future__ import annotations

import dataclasses
import re

import pytest

from specviz.core.rules import expected_kept
from specviz.core.settings import DecodeSettings
from specviz.trace import trace_from_json
from specviz.views.rules import round_odds, rules_html
from tests.test_engine import PROMPT, make_pair
from tests.drafted import speculative_decode


@pytest.fixture(scope="module")
def run():
    return speculative_decode(make_pair(), PROMPT, DecodeSettings(gamma=4, temperature=1.0, max_new_tokens=24,
                                                                  seed=3, rule="block"))


def test_each_round_shows_every_rules_expectation_and_marks_the_rule_that_ran(run):
    rnd = next(r for r in run.rounds if len(r.draft) == 4)
    page = rules_html(rnd, run)
    e = expected_kept(round_odds(rnd))
    for rule, label in (("token", "token-wise"), ("block", "block"), ("match", "exact match")):
        row = re.search(rf"<tr><th[^>]*>{label}.*?</tr>", page).group(0)
        assert row.count('class="sv-rule-cell"') == 4 and f">{e[rule]:.2f}</td></tr>" in row
    assert f"this run: kept {rnd.n_accepted}" in re.search(r"<tr><th[^>]*>block.*?</tr>", page).group(0)
    assert "block ≥ token on average" in page


def test_the_numbers_survive_a_recording_and_old_recordings_say_what_is_missing(run):
    back = trace_from_json(run.to_json())
    rnd = next(r for r in back.rounds if r.draft)
    assert rules_html(rnd, back) == rules_html(next(r for r in run.rounds if r.draft), run)
    old = dataclasses.replace(rnd, draft=[dataclasses.replace(d, p=None, h=None) for d in rnd.draft])
    assert "predates the numbers it needs" in rules_html(old, back)


def test_greedy_runs_say_the_rules_coincide():
    run = speculative_decode(make_pair(), PROMPT, DecodeSettings(gamma=3, max_new_tokens=8))
    page = rules_html(next(r for r in run.rounds if r.draft), run)
    assert "the three rules coincide" in page
    e = expected_kept(round_odds(run.rounds[0]))
    assert e["token"] == e["block"] == e["match"] == run.rounds[0].n_accepted


def test_run_expectations_per_rule_and_their_markers_in_the_theory_plot(run):
    from specviz.views import theory_plots as TP
    from specviz.views.rules import run_rule_expectations

    e = run_rule_expectations(run)
    assert e["rule"] == "block" and set(e["tokens"]) == {"token", "block", "match"}
    assert e["tokens"]["token"] >= e["tokens"]["match"] >= 1.0
    fig = TP.tokens_per_round_curves(0.7, 16, e)
    marks = [t for t in fig.data if t.name.startswith("last run's drafts")]
    names = [t.name.replace("<br>", " ") for t in marks]  # long legend entries wrap for phones
    assert len(marks) == 3 and any("(the rule it ran)" in n and "block" in n for n in names)
    # greedy: each rule's expectation is what the run did (the rules coincide): emitted tokens per round
    greedy = speculative_decode(make_pair(), PROMPT, DecodeSettings(gamma=3, max_new_tokens=16))
    g = run_rule_expectations(greedy)
    measured = sum(len(r.emitted) for r in greedy.rounds) / len(greedy.rounds)
    assert all(abs(v - measured) < 1e-9 for v in g["tokens"].values()) or greedy.stop_reason == "eos"
