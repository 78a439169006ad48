"""Tests for specviz.views (HTML and plotly views) on synthetic traces."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from specviz.theory.figures import run_figures
from specviz.trace import Round, Token, theoretical_speedup, trace_from_json
from specviz.views import plots, race_plots
from specviz.views.html import (
    legend_html,
    metrics_html,
    narrate,
    narrate_html,
    race_html,
    round_html,
    rounds_html,
    standalone_page,
    text_html,
)

from tests.synthetic import ATTR_XSS, DEFAULT_PLAN, XSS, empty_trace, make_std_trace, make_trace


class TagCollector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def parse(html: str) -> TagCollector:
    p = TagCollector()
    p.feed(html)
    p.close()
    return p


def statuses(html: str) -> list[str]:
    return [a["data-status"] for _, a in parse(html).tags if "data-status" in a]


# ---- the synthetic data itself is a valid trace ------------------------------------


def test_synthetic_traces_roundtrip_json():
    spec, std = make_trace(), make_std_trace()
    for tr in (spec, std):
        back = trace_from_json(tr.to_json())
        assert back.n_tokens == tr.n_tokens
    s = spec.summary()
    assert s.alpha == pytest.approx(16 / 20)
    assert s.tokens_per_round_hist == [0, 1, 2, 1, 1, 2]


# ---- round chips ---------------------------------------------------------------------


@pytest.mark.parametrize("idx", range(len(DEFAULT_PLAN)))
def test_round_chip_statuses_match_round(idx):
    tr = make_trace()
    rnd = tr.rounds[idx]
    st = statuses(round_html(rnd, tr.gamma))
    k = len(rnd.draft)
    assert st.count("accepted") == rnd.n_accepted
    assert st.count("rejected") == (1 if rnd.rejected_at else 0)
    assert st.count("discarded") == k - len(rnd.positions)
    assert st.count("correction") == (1 if rnd.extra and rnd.extra.kind == "correction" else 0)
    assert st.count("bonus") == (1 if rnd.extra and rnd.extra.kind == "bonus" else 0)
    assert st.count("pending") == 0
    # chip order: drafts in order, then the extra token
    assert st[:k] == [rnd.status(i) for i in range(1, k + 1)]


def test_round_html_counter_gain_and_tooltips():
    tr = make_trace()
    h = round_html(tr.rounds[1], tr.gamma)
    assert "Round 2" in h
    assert "+3 tokens" in h
    # tooltip shows q, p, b, u and the verdict with the right inequality
    assert "u=0.300 &lt; b=0.833 → accepted" in h
    assert "u=0.740 ≥ b=0.286 → rejected" in h
    assert "q(x) draft" in h and "p(x) target" in h and "b = min(1, p/q)" in h
    assert "residual norm(max(0, p − q))" in h
    h1 = round_html(tr.rounds[0], tr.gamma)
    assert "+5 tokens" in h1 and "All 4 drafts accepted" in h1


def test_round_html_rejected_first_and_no_extra():
    tr = make_trace()
    st = statuses(round_html(tr.rounds[2], tr.gamma))
    assert st == ["rejected", "discarded", "discarded", "discarded", "correction"]
    last = round_html(tr.rounds[-1], tr.gamma)
    assert statuses(last) == ["accepted", "accepted", "discarded", "discarded"]
    assert "+2 tokens" in last and "no extra token" in last


def test_round_html_pending_and_partial():
    tr = make_trace()
    full = tr.rounds[1]
    partial = Round(index=7, n_before=20, draft=full.draft[:2])
    h = round_html(partial, 4, pending=True)
    st = statuses(h)
    assert st.count("pending") == 2
    assert st.count("slot") == 2
    assert not {"accepted", "rejected", "discarded", "correction", "bonus"} & set(st)
    assert "drafting 2/4" in h and "Round 8" in h
    # fully drafted, waiting for the target: pending style even though positions exist in the final round
    h2 = round_html(full, 4, pending=True)
    assert statuses(h2) == ["pending"] * 4
    assert "verifying" in h2
    # the same partial round rendered non-pending does not raise
    round_html(partial, 4)


def test_round_html_standard_round():
    std = make_std_trace()
    h = round_html(std.rounds[3], 0)
    assert statuses(h) == ["target"]
    assert "+1 token" in h and "+1 tokens" not in h


def test_epsilon_rescue_marked():
    plan = [dict(accept=2, extra="correction", rescue=2)]
    tr = make_trace(plan=plan, epsilon=0.1)
    h = round_html(tr.rounds[0], tr.gamma, epsilon=0.1)
    assert "thanks to ε" in h
    assert "b = min(1, (p+ε)/q)" in h
    assert h.count("sv-eps") == 1


# ---- rounds panel -------------------------------------------------------------------


def test_rounds_html_reads_oldest_first_and_truncates_long_runs():
    plan = [dict(accept=i % 5, extra="bonus" if i % 5 == 4 else "correction") for i in range(50)]
    tr = make_trace(plan=plan)
    h = rounds_html(tr, max_rounds_shown=40)
    rows = [a["data-round"] for t, a in parse(h).tags if "data-round" in a]
    assert len(rows) == 40
    assert rows[0] == "11" and rows[-1] == "50"  # in reading order; the panel scrolls to the newest
    assert h.index("10 earlier rounds") < h.index('data-round="11"')  # the note heads the list
    assert 'data-order="oldest-first"' in h and "sv-rounds-body" in h
    newest = rounds_html(tr, max_rounds_shown=40, newest_first=True)
    rows = [a["data-round"] for t, a in parse(newest).tags if "data-round" in a]
    assert rows[0] == "50" and rows[-1] == "11" and newest.index("10 earlier rounds") > newest.index('data-round="11"')


def test_rounds_html_upto_and_pending():
    tr = make_trace()
    h = rounds_html(tr, upto=3)
    rows = [a["data-round"] for t, a in parse(h).tags if "data-round" in a]
    assert rows == ["1", "2", "3"]
    current = [a for t, a in parse(h).tags if "sv-round--current" in a.get("class", "")]
    assert len(current) == 1 and current[0]["data-round"] == "3"
    pend = Round(index=3, n_before=9, draft=tr.rounds[3].draft[:1])
    h2 = rounds_html(tr, upto=3, pending_round=pend)
    rows2 = [a["data-round"] for t, a in parse(h2).tags if "data-round" in a]
    assert rows2 == ["1", "2", "3", "4"]
    assert statuses(h2).count("pending") == 1


def test_rounds_html_empty_and_none():
    assert "<b>Run</b>" in rounds_html(None)
    assert "Waiting" in rounds_html(empty_trace())
    assert "Waiting" in rounds_html(make_trace(), upto=0)


# ---- text ---------------------------------------------------------------------------


def test_text_html_origins_and_whitespace():
    tr = make_trace()
    h = text_html(tr)
    origins = [a["data-origin"] for t, a in parse(h).tags if "data-origin" in a]
    assert origins == [tok.origin for tok in tr.tokens]
    assert "\n" in tr.text and "\n" in h  # newlines kept (the container is white-space: pre-wrap)
    assert "sv-caret" not in h
    assert "sv-caret" in text_html(tr, streaming=True)
    plain = text_html(tr, highlight_origins=False)
    assert "data-origin" not in plain
    # text content equals the generated text exactly
    assert "".join(parse(plain).text) == tr.text


def test_text_html_token_list_and_empty():
    toks = [Token(1, "a", "target"), Token(2, " b\n", "bonus")]
    h = text_html(toks)
    assert [a["data-origin"] for t, a in parse(h).tags if "data-origin" in a] == ["target", "bonus"]
    assert "sv-text--empty" in text_html(None)
    assert "sv-text--empty" in text_html([])
    assert "sv-text--mono" in text_html(toks, mono=True)


def test_text_html_upto_time():
    tr = make_trace()
    t = tr.rounds[1].t_end
    h = text_html(tr, upto_time=t, highlight_origins=False)
    assert "".join(parse(h).text) == "".join(tok.text for r in tr.rounds[:2] for tok in r.emitted)


# ---- escaping -------------------------------------------------------------------------


def _assert_no_injection(h: str):
    assert "<script" not in h.lower()
    assert "onmouseover=" not in [k for _, a in parse(h).tags for k in a]
    assert all(t != "script" for t, _ in parse(h).tags)


def test_everything_user_derived_is_escaped():
    tr = make_trace(prompt=XSS + ATTR_XSS)
    # an attribute-breaking token too
    tr.rounds[0].draft[1].text = ATTR_XSS
    tr.rounds[0].emitted[1].text = ATTR_XSS
    std = make_std_trace(texts=[XSS, ATTR_XSS] * 11)
    outs = [
        round_html(tr.rounds[3], tr.gamma),
        round_html(tr.rounds[5], tr.gamma),
        round_html(tr.rounds[0], tr.gamma),
        round_html(tr.rounds[0], tr.gamma, pending=True),
        rounds_html(tr),
        text_html(tr, show_prompt=True),
        race_html(tr, std),
        race_html(tr, std, at_time=1.0),
        narrate_html(tr.rounds[3], tr),
        narrate_html(tr.rounds[5], tr),
        metrics_html(tr.summary()),
    ]
    for h in outs:
        _assert_no_injection(h)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in outs[0]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in outs[5]
    # the token renders as visible text
    assert XSS in "".join(parse(outs[5]).text)
    # the model name with markup is shown as text
    assert "draft-&lt;b&gt;small&lt;/b&gt;" in outs[6]
    # narration is plain text containing the token verbatim (the caller escapes, or uses narrate_html)
    assert XSS in narrate(tr.rounds[5], tr)


# ---- legend ------------------------------------------------------------------------


def test_legend_lists_every_status():
    h = legend_html()
    items = [a["data-status"] for t, a in parse(h).tags if t == "div" and "data-status" in a]
    assert items == ["accepted", "rejected", "discarded", "correction", "bonus", "pending", "target"]
    assert "residual" in h


# ---- race ---------------------------------------------------------------------------


def _col_tokens(h: str) -> list[int]:
    return [int(a["data-tokens"]) for t, a in parse(h).tags if "data-tokens" in a]


def test_race_at_time_shows_only_tokens_emitted_by_then():
    spec, std = make_trace(), make_std_trace()
    t = spec.rounds[1].t_end + 1e-9
    h = race_html(spec, std, at_time=t)
    n_spec = sum(len(r.emitted) for r in spec.rounds if r.t_end <= t)
    n_std = sum(len(r.emitted) for r in std.rounds if r.t_end <= t)
    assert n_spec == 8 and 0 < n_std < std.n_tokens
    assert _col_tokens(h) == [n_spec, n_std]
    spec_tokens = [a["data-origin"] for tag, a in parse(h).tags if "data-origin" in a]
    assert len(spec_tokens) == n_spec + n_std
    assert "data-speedup" not in h  # not finished yet
    assert "running" in h
    # before anything: zero tokens, no error
    h0 = race_html(spec, std, at_time=0.0)
    assert _col_tokens(h0) == [0, 0]


def test_race_finished_shows_speedup():
    spec, std = make_trace(), make_std_trace()
    h = race_html(spec, std)
    m = re.search(r'data-speedup="([0-9.]+)"', h)
    assert m
    expected = spec.summary().tokens_per_s / std.summary().tokens_per_s
    assert float(m.group(1)) == pytest.approx(expected, rel=1e-3)
    assert f"{expected:.2f}×" in h
    assert _col_tokens(h) == [spec.n_tokens, std.n_tokens]
    # replay past the end is the same as finished
    h_end = race_html(spec, std, at_time=max(spec.t_total, std.t_total) + 1)
    assert "data-speedup" in h_end
    # stats: forward passes and ttft of the spec side
    assert str(len(spec.rounds)) in h


def test_a_stopped_race_gives_no_speedup_and_says_why():
    """A race cut short by Stop (or a closed page) is no measurement: its sides stopped at different points."""
    spec, std = make_trace(), make_std_trace()
    std.stop_reason = "stopped"
    h = race_html(spec, std)
    assert "data-speedup" not in h and "sv-speedup-v" not in h
    assert "Stopped before the end" in h and "finished · stopped" not in h  # amber, never the green "finished"
    assert re.search(r'sv-badge--stopped"[^>]*>stopped · \d+ tokens<', h) and f"standard {std.n_tokens} tokens" in h
    assert "The two texts differ" not in h  # cut at different points: no sentence on sampling
    std.stop_reason = "time_limit"  # the server's time limit stops both sides within the same budget: measured
    assert "data-speedup" in race_html(spec, std)


def test_race_one_side_missing_or_running():
    spec, std = make_trace(), make_std_trace()
    h = race_html(spec, None)
    assert "not run" in h and "data-speedup" not in h
    h = race_html(None, std)
    assert "not run" in h
    h = race_html(None, None)
    assert h.count("not run") == 2
    h = race_html(spec, std, std_running=True)
    assert "data-speedup" not in h and "running" in h
    race_html(empty_trace(), empty_trace("standard"))


def test_race_error_side():
    spec = make_trace(stop_reason="error")
    h = race_html(spec, make_std_trace())
    assert "the run stopped with an error" in h


# ---- narration ----------------------------------------------------------------------------


def test_narrate_rejection_and_correction():
    tr = make_trace()
    s = narrate(tr.rounds[1], tr)
    assert s.startswith("Round 2:")
    assert "proposed 4 tokens" in s
    assert "accepted the first 2" in s
    assert "token 3 '·3'" in s  # the chips' notation: a space is ·
    assert "rejected (u=0.74 ≥ b=0.29" in s
    assert "correction '·fix'" in s and "residual" in s
    assert "1 later draft was discarded" in s
    assert s.endswith("+3 tokens.")
    assert "\n" not in s


def test_narrate_bonus_first_rejection_eos_standard_eps_pending():
    tr = make_trace()
    s = narrate(tr.rounds[0], tr)
    assert "accepted all 4" in s and "bonus token '·bonus!'" in s and s.endswith("+5 tokens.")
    s = narrate(tr.rounds[2], tr)
    assert "token 1" in s and "straight away" in s and "3 later drafts were discarded" in s
    s = narrate(tr.rounds[-1], tr)
    assert "end-of-text" in s and s.endswith("+2 tokens.")
    s = narrate(make_trace(stop_reason="max_new_tokens").rounds[-1], make_trace(stop_reason="max_new_tokens"))
    assert "token limit" in s
    std = make_std_trace()
    s = narrate(std.rounds[0], std)
    assert "target ran one forward pass" in s and "+1 token." in s
    eps_tr = make_trace(plan=[dict(accept=2, extra="correction", rescue=2)], epsilon=0.1)
    s = narrate(eps_tr.rounds[0], eps_tr)
    assert "thanks to ε=0.1" in s
    pend = Round(index=4, n_before=10, draft=tr.rounds[1].draft[:2])
    assert "proposed 2 of 4" in narrate(pend, tr)
    assert narrate(tr.rounds[0], None)  # no trace: still works


# ---- metrics --------------------------------------------------------------------------


def test_metrics_html():
    tr = make_trace()
    h = metrics_html(tr.summary())
    assert "α (acceptance rate)" in h and "0.800" in h
    assert "accepted drafts ÷ verified drafts" in h
    assert "1 + accepted ÷ rounds" in h
    assert "Thm 3.8" in h
    assert "draft forward time ÷ verify pass time" in h  # no standard run: c per verify pass, v unknown
    assert re.search(r"Verify factor v</th><td[^>]*>unknown<", h)
    with_std = metrics_html(tr, figures=run_figures(tr, make_std_trace()))
    assert "a draft token&#x27;s time ÷ the standard step&#x27;s time" in with_std
    assert re.search(r"Verify factor v</th><td[^>]*>1\.09 standard steps<", with_std)  # 0.12 s ÷ 0.11 s
    std = metrics_html(make_std_trace().summary())
    assert "α" not in std and "Throughput" in std
    assert "No metrics" in metrics_html(None)
    assert metrics_html(tr)  # a Trace works too
    metrics_html(empty_trace().summary())


# ---- plots ----------------------------------------------------------------------------------


def _bar(fig, name=None):
    bars = [t for t in fig.data if t.type == "bar" and (name is None or t.name == name)]
    assert bars, [t.name for t in fig.data]
    return bars[0]


def test_acceptance_by_position_numbers():
    tr = make_trace()
    fig = plots.acceptance_by_position(tr)
    s = tr.summary()
    bar = _bar(fig)
    assert list(bar.x) == [1, 2, 3, 4]
    assert list(bar.y) == pytest.approx(s.per_position_acceptance)
    line = [t for t in fig.data if t.type == "scatter"][0]
    assert list(line.y) == pytest.approx([s.alpha, s.alpha])


def test_tokens_per_round_hist_numbers():
    tr = make_trace()
    fig = plots.tokens_per_round_hist(tr)
    bar = _bar(fig)
    assert list(bar.x) == list(range(tr.gamma + 2))
    assert sum(bar.y) == len(tr.rounds)
    assert list(bar.y) == tr.summary().tokens_per_round_hist
    exp = [t for t in fig.data if t.type == "scatter"][0]
    assert sum(exp.y) == pytest.approx(len(tr.rounds))
    a, g = 0.8, tr.gamma
    assert exp.y[1] == pytest.approx(len(tr.rounds) * (1 - a))
    assert exp.y[g + 1] == pytest.approx(len(tr.rounds) * a**g)
    assert sum(plots.expected_tokens_distribution(0.37, 6)) == pytest.approx(1.0)


def test_tokens_per_round_hist_keeps_the_expected_line_on_the_chart(monkeypatch):
    """A tree run's α counts every sibling it rejected, so the expected line can rise above every bar."""
    import dataclasses
    tr = make_trace()
    low = dataclasses.replace(tr.summary(), alpha=0.05)  # nearly every round expected to emit one token
    monkeypatch.setattr(tr, "summary", lambda: low)
    fig = plots.tokens_per_round_hist(tr)
    exp = [t for t in fig.data if t.type == "scatter"][0]
    assert max(exp.y) > 1.2 * max(_bar(fig).y) + 0.5  # above where the old range stopped
    assert fig.layout.yaxis.range[1] > max(exp.y) and fig.layout.yaxis.range[1] > max(_bar(fig).y)
    assert len(fig.layout.title.text) <= 32  # the rule went to the subtitle: a third of a row is narrow


def test_round_times_stack():
    tr = make_trace()
    fig = plots.round_times(tr)
    assert fig.layout.barmode == "stack"
    d = _bar(fig, "draft (small model)")
    v = _bar(fig, "verify (target model)")
    assert list(d.y) == pytest.approx([r.t_draft for r in tr.rounds])
    assert list(v.y) == pytest.approx([r.t_verify for r in tr.rounds])
    std_fig = plots.round_times(make_std_trace())
    assert [t.name for t in std_fig.data] == ["target forward pass"]


def test_tokens_vs_time_curves():
    spec, std = make_trace(), make_std_trace()
    fig = race_plots.tokens_vs_time(spec, std)
    lines = [t for t in fig.data if t.mode == "lines"]
    assert len(lines) == 2
    assert lines[0].line.shape == "hv"
    assert lines[0].y[-1] == spec.n_tokens and lines[1].y[-1] == std.n_tokens
    assert lines[0].x[-1] == pytest.approx(spec.rounds[-1].t_end)
    assert lines[0].x[0] == 0 and lines[0].y[0] == 0
    one = race_plots.tokens_vs_time(spec, None)
    assert len([t for t in one.data if t.mode == "lines"]) == 1


def test_speedup_bars_numbers():
    spec, std = make_trace(), make_std_trace()
    fig = race_plots.speedup_bars(spec, std)
    bar = _bar(fig)
    s = spec.summary()
    measured = s.tokens_per_s / std.summary().tokens_per_s
    assert bar.y[0] == pytest.approx(measured)
    t_step = std.summary().t_target_forward
    c, v = s.t_draft_forward / t_step, s.t_target_forward / t_step  # per standard step
    assert bar.y[1] == pytest.approx(theoretical_speedup(s.alpha, spec.gamma, c))
    assert bar.y[2] == pytest.approx(theoretical_speedup(s.alpha, spec.gamma, c, v))
    assert f"c = {c:.3f} (draft token ÷ standard step)" in fig.layout.title.subtitle.text
    only = race_plots.speedup_bars(spec, None)  # no standard run: textbook from c per verify pass, v unknown
    assert _bar(only).text[0] == "n/a" and _bar(only).y[1] == pytest.approx(s.theoretical_speedup)
    assert f"c = {s.c:.3f} (draft token ÷ verify pass" in only.layout.title.subtitle.text


ALL_PLOTS_1 = [plots.acceptance_by_position, plots.tokens_per_round_hist, plots.round_times]
ALL_PLOTS_2 = [race_plots.tokens_vs_time, race_plots.speedup_bars]


@pytest.mark.parametrize("fn", ALL_PLOTS_1)
@pytest.mark.parametrize("arg", [None, "empty", "empty_std", "std"])
def test_single_trace_plots_cope_with_empty(fn, arg):
    tr = {None: None, "empty": empty_trace(), "empty_std": empty_trace("standard"), "std": make_std_trace()}[arg]
    fig = fn(tr)
    fig.to_json()
    if arg != "std" or fn is not plots.round_times:
        assert fig.layout.annotations and "o" in fig.layout.annotations[0].text


@pytest.mark.parametrize("fn", ALL_PLOTS_2)
def test_pair_plots_cope_with_empty(fn):
    for a, b in [(None, None), (empty_trace(), empty_trace("standard")), (None, make_std_trace()),
                 (make_std_trace(), None)]:
        fn(a, b).to_json()


def test_all_plots_serialise():
    spec, std = make_trace(), make_std_trace()
    for fn in ALL_PLOTS_1:
        fn(spec).to_json()
    for fn in ALL_PLOTS_2:
        fn(spec, std).to_json()


def test_standalone_page_has_css():
    page = standalone_page(legend_html(), title=XSS, dark=True)
    assert ".sv-chip" in page and 'class="sv-page dark"' in page
    assert "<script" not in page


# ---- drafters and draft-length policies ---------------------------------------------------

# One round per reason drafting can stop (γ = 4): (plan entry, reason).
STOP_PLAN = [
    dict(accept=4, extra="bonus", stop="limit"),
    dict(accept=1, extra="correction", draft=2, stop="confidence"),
    dict(accept=3, extra="bonus", draft=3, stop="cost"),
    dict(accept=0, extra="correction", draft=1, stop="eos"),
    dict(accept=2, extra="bonus", draft=2, stop="exhausted"),
    dict(accept=0, extra="target", draft=0, stop="none"),
    dict(accept=1, extra="bonus", draft=1, stop="budget"),
]


def _stop_span(h: str) -> dict | None:
    spans = [a for t, a in parse(h).tags if t == "span" and "data-stop" in a]
    assert len(spans) <= 1
    return spans[0] if spans else None


def test_each_round_shows_how_many_were_drafted_and_why_drafting_stopped():
    from specviz.core.settings import DRAFT_STOPS

    tr = make_trace(plan=STOP_PLAN, policy="adaptive", gamma=4)
    shown = []
    for rnd, step in zip(tr.rounds, STOP_PLAN):
        h = round_html(rnd, tr.gamma, policy="adaptive")
        span = _stop_span(h)
        assert span is not None, step
        assert span["data-stop"] == step["stop"] and int(span["data-drafted"]) == step.get("draft", 4)
        assert span["title"] == "drafting stopped: " + DRAFT_STOPS[step["stop"]].sentence  # the full reason on hover
        text = "".join(parse(h).text)
        shown.append(text)
    assert "4 drafted · γ reached" in shown[0]
    assert "2 drafted · low confidence" in shown[1]
    assert "3 drafted · not worth it" in shown[2]
    assert "1 drafted · end of text" in shown[3]
    assert "nothing drafted" in shown[5] and "0 drafted" not in shown[5]
    assert "1 drafted · token budget" in shown[6]
    # The live panel shows the same for every round.
    assert len([a for t, a in parse(rounds_html(tr)).tags if "data-stop" in a]) == len(STOP_PLAN)
    # Standard decoding drafts nothing and shows no reason; an old (v1) recording has drafts but no reason.
    assert _stop_span(round_html(make_std_trace().rounds[0], 0)) is None
    old = make_trace(plan=[dict(accept=2, extra="correction", stop="")]).rounds[0]
    span = _stop_span(round_html(old, 4))
    assert span["data-stop"] == "" and "title" not in span and "4 drafted" in round_html(old, 4)


def test_pending_round_under_a_dynamic_policy_draws_no_empty_slots():
    tr = make_trace(gamma=8)
    partial = Round(index=3, n_before=9, draft=tr.rounds[1].draft[:3])
    fixed = round_html(partial, 8, pending=True, policy="constant")
    assert statuses(fixed).count("pending") == 3 and statuses(fixed).count("slot") == 5
    assert "drafting 3/8" in fixed
    dynamic = round_html(partial, 8, pending=True, policy="confidence")
    assert statuses(dynamic) == ["pending"] * 3  # γ is only the maximum: no slots to fill
    assert "drafted 3 (≤ 8)" in dynamic
    assert _stop_span(dynamic) is None  # the reason is known only once drafting stopped
    # rounds_html passes the trace's policy on
    dyn_tr = make_trace(gamma=8, policy="heuristic")
    assert "slot" not in statuses(rounds_html(dyn_tr, pending_round=partial))
    assert statuses(rounds_html(make_trace(gamma=8), pending_round=partial)).count("slot") == 5


def test_panel_legend_and_narration_name_the_drafter_and_policy():
    lookup = make_trace(plan=STOP_PLAN, drafter="prompt-lookup", policy="confidence", tau=0.6)
    head = "".join(parse(rounds_html(lookup)).text)
    assert "prompt lookup · confidence policy, γ ≤ 4, τ = 0.6" in head
    legend = legend_html(lookup)
    run = [a for t, a in parse(legend).tags if "data-drafter" in a]
    assert run == [{"class": "sv-legend-run", "data-drafter": "prompt-lookup", "data-policy": "confidence"}]
    assert "drafter: prompt lookup · confidence policy, γ ≤ 4, τ = 0.6" in "".join(parse(legend).text)
    model = make_trace()
    legend = legend_html(model)
    assert "the draft model draft-&lt;b&gt;small&lt;/b&gt;" in legend and "<b>small" not in legend  # escaped
    assert "constant policy, γ = 4" in "".join(parse(legend).text)
    assert "data-drafter" not in legend_html(None) and "data-drafter" not in legend_html(make_std_trace())
    meta = narrate_html(lookup.rounds[1], lookup)
    assert "drafter: prompt lookup · confidence policy" in "".join(parse(meta).text)


def test_legend_shows_the_epsilon_chip_only_for_runs_with_epsilon():
    def has_eps(h):
        return any(a.get("data-status") == "epsilon" for _, a in parse(h).tags)

    assert not has_eps(legend_html()) and not has_eps(legend_html(make_trace()))
    assert has_eps(legend_html(make_trace(epsilon=0.1)))


def test_narration_says_why_drafting_stopped():
    tr = make_trace(plan=STOP_PLAN, policy="confidence", tau=0.6)
    assert "the draft model proposed 4 tokens" in narrate(tr.rounds[0], tr)
    assert "(drafting stopped: reached the draft length γ = 4)" in narrate(tr.rounds[0], tr)
    s = narrate(tr.rounds[1], tr)
    assert "proposed 2 tokens" in s and "drafting stopped: the draft's confidence fell below τ = 0.6" in s
    assert "one more draft token was not worth its cost" in narrate(tr.rounds[2], tr)
    assert "drafted an end-of-text token" in narrate(tr.rounds[3], tr)
    assert "checked it in one pass" in narrate(tr.rounds[3], tr)  # one draft: "it", not "them"
    lookup = make_trace(plan=STOP_PLAN, drafter="prompt-lookup")
    s = narrate(lookup.rounds[4], lookup)
    assert s.startswith("Round 5: prompt lookup proposed 2 tokens") and "nothing more to propose" in s
    s = narrate(lookup.rounds[5], lookup)
    assert s.startswith("Round 6: prompt lookup proposed nothing (nothing drafted (a plain target step)), so the "
                        "target ran one forward pass")
    # while drafting under a dynamic policy, γ is a maximum
    pend = Round(index=7, n_before=12, draft=tr.rounds[0].draft[:2])
    assert "proposed 2 so far (at most 4; the confidence policy decides when to stop)" in narrate(pend, tr)
    # an old recording without reasons says nothing about them
    old = make_trace(plan=[dict(accept=2, extra="correction", stop="")])
    assert "drafting stopped" not in narrate(old.rounds[0], old)


def test_metrics_report_mean_draft_length():
    tr = make_trace(plan=STOP_PLAN)
    h = metrics_html(tr)
    mean = sum(len(r.draft) for r in tr.rounds) / len(tr.rounds)
    assert "Mean draft length" in h and f"{mean:.2f}" in h and "drafted ÷ rounds" in h


def test_draft_lengths_plot_numbers():
    tr = make_trace(plan=STOP_PLAN, policy="adaptive")
    fig = plots.draft_lengths(tr)
    drafted, accepted = _bar(fig, "drafted"), _bar(fig, "accepted")
    assert list(drafted.x) == list(range(1, len(STOP_PLAN) + 1))
    assert list(drafted.y) == [s.get("draft", 4) for s in STOP_PLAN]
    assert list(accepted.y) == [s["accept"] for s in STOP_PLAN]
    assert all(a <= d for a, d in zip(accepted.y, drafted.y))
    assert drafted.customdata[1] == "the draft's confidence fell below τ"  # why, on hover
    assert "stopped: %{customdata}" in drafted.hovertemplate
    gamma_line = [t for t in fig.data if t.type == "scatter"][0]
    assert list(gamma_line.y) == [4, 4] and gamma_line.name == "γ = 4, the maximum (adaptive policy)"
    meta = fig.layout.meta
    assert meta["mean_drafted"] == pytest.approx(sum(drafted.y) / len(STOP_PLAN))
    assert meta["mean_accepted"] == pytest.approx(sum(accepted.y) / len(STOP_PLAN))
    assert meta["stops"] == {s["stop"]: 1 for s in STOP_PLAN}
    sub = fig.layout.title.subtitle.text
    assert f"mean drafted {meta['mean_drafted']:.2f}" in sub
    lines = sub.split("<br>")  # the 3 most frequent reasons + "…", two a line (a third of a narrow row)
    assert lines[1].startswith("stopped: ") and [ln.count(" · ") for ln in lines[1:]] == [1, 1]
    assert lines[-1].endswith(" · …") and all(len(ln) <= 40 for ln in lines)
    assert plots.draft_lengths(make_trace()).data[-1].name == "γ = 4"  # constant: γ is the length
    for empty in (None, make_std_trace(), empty_trace()):
        assert plots.draft_lengths(empty).layout.meta == {"empty": True}


def test_theory_speedup_curve_marks_the_mean_draft_length():
    from specviz.views import theory_plots as tp

    measured = dict(alpha=0.8, c=0.1, gamma=8, speedup=1.7, draft_len=3.4)
    fig = tp.speedup_curves(0.8, 0.1, 16, measured)
    point = [t for t in fig.data if t.name and t.name.startswith("measured")][0]
    assert list(point.x) == [3.4] and list(point.y) == [1.7]
    assert "mean draft length 3.40" in point.hovertemplate and "γ=8" in point.hovertemplate
    assert [s.x0 for s in fig.layout.shapes if s.type == "line" and s.x0 == s.x1] == [3.4]
    without = tp.speedup_curves(0.8, 0.1, 16, {**measured, "draft_len": None})
    assert list([t for t in without.data if t.name and t.name.startswith("measured")][0].x) == [8]


def test_theory_tab_uses_the_runs_mean_draft_length():
    from specviz.ui.tabs import theory_views

    spec = make_trace(plan=STOP_PLAN, policy="confidence")
    mean = sum(len(r.draft) for r in spec.rounds) / len(spec.rounds)
    frame = theory_views(0.8, 4, 0.15, 0.05, {"spec": spec, "std": make_std_trace()})
    assert f"mean draft length {mean:.2f}" in frame.note and "confidence policy" in frame.note
    point = [t for t in frame.speedup.data if t.name and t.name.startswith("measured")][0]
    assert list(point.x) == [pytest.approx(mean)]


def test_theory_tab_measures_c_of_a_drafter_without_forward_passes():
    from specviz.ui.tabs import run_c, use_last_run

    model = make_trace()
    assert run_c(model) == pytest.approx(model.summary().c)
    lookup = make_trace(drafter="prompt-lookup")  # no draft forward passes: summary c is None
    s = lookup.summary()
    assert s.c is None
    expected = sum(r.t_draft for r in lookup.rounds) / s.drafted / s.t_target_forward
    assert run_c(lookup) == pytest.approx(expected)
    assert use_last_run({"spec": lookup})[2] == round(min(expected, 1.0), 3)
    assert run_c(make_std_trace()) is None and run_c(None) is None


# ---- issue 22: who drafted, tree rounds -----------------------------------------------------


def _race_sub(h: str) -> str:
    (sub,) = re.findall(r'<div class="sv-race-col sv-race-spec".*?<div class="sv-race-sub">(.*?)</div>', h)
    return sub


def _legend_meaning(h: str, status: str) -> str:
    (text,) = re.findall(rf'data-status="{status}">.*?<span class="sv-legend-text">(.*?)</span>', h)
    return text


@pytest.mark.parametrize("drafter, name, header, pending", [
    ("speculator", "learned head (MLP speculator)", "learned head (MLP speculator) → target target-big",
     "proposed by the learned head (MLP speculator)"),
    ("prompt-lookup", "prompt lookup", "prompt lookup → target target-big", "copied from earlier text by prompt lookup"),
])
def test_the_race_header_and_the_legend_name_the_drafter_that_ran(drafter, name, header, pending):
    """A learned-head run's header said "draft <the draft model> → …" and its legend "drafted by the
    small model": both name the drafter that proposed the tokens."""
    spec = make_trace(drafter=drafter)
    spec.models["drafter"] = name
    sub = _race_sub(race_html(spec, make_std_trace()))
    assert sub.startswith(header) and "draft-" not in sub  # the unused draft model is not named
    meaning = _legend_meaning(legend_html(spec), "pending")
    assert meaning.startswith(pending) and "small model" not in meaning
    assert "small model" not in _legend_meaning(legend_html(None), "pending")  # no run yet: no drafter assumed
    # The draft model's run still names its model, escaped.
    model = make_trace()
    assert _race_sub(race_html(model, make_std_trace())).startswith("draft draft-&lt;b&gt;small&lt;/b&gt; → target")
    assert "small draft model" in _legend_meaning(legend_html(model), "pending")


def _tree_trace(stop: str, gamma: int = 5, budget: int = 16):
    """A best-first tree round of `budget` nodes, 3 levels deep (γ = 5): the path 'n0', 'n3' accepted,
    then both children tried after 'n3' rejected and a correction; the chain fields hold the path."""
    from dataclasses import replace as _replace

    from specviz.trace.tree import parse_tree

    parents = [-1, -1, -1, 0, 0, 1, 1, 2, 3, 3, 4, 5, 6, 7, 4, 5][:budget]
    depth = {-1: 0}
    nodes = []
    for i, p in enumerate(parents):
        depth[i] = depth[p] + 1
        nodes.append(dict(id=i, text=f"n{i}", parent=p, depth=depth[i], q=0.3))
    tri = dict(q=0.3, r=0.5, b=1.0, u=0.2, accepted=True)
    rej = dict(q=0.3, r=0.1, b=0.33, u=0.8, accepted=False)
    tree = parse_tree(dict(mode="best-first", nodes=nodes, path=[0, 3], fed=budget, visits=[
        dict(node=-1, reject_prob=0.1, tv=0.2, tries=[dict(node=0, **tri)]),
        dict(node=0, reject_prob=0.1, tv=0.2, tries=[dict(node=3, **tri)]),
        dict(node=3, reject_prob=0.5, tv=0.4, tries=[dict(node=8, **rej), dict(node=9, **rej)])]), gamma)
    tr = make_trace(gamma=gamma, plan=[dict(accept=2, extra="correction", draft=3, stop=stop)])
    tr.settings = _replace(tr.settings, drafter="tree", tree_mode="best-first", tree_nodes=budget, branches=3)
    tr.models["drafter"] = "draft-small · tree (best-first, top-3, ≤16 nodes)"
    tr.rounds[0].tree = tree
    return tr


def test_a_tree_round_is_narrated_as_a_tree_with_its_own_stop_reason():
    """A 16-node tree round was narrated "proposed 3 tokens … (drafting stopped: reached the draft length
    γ = 5)": it is narrated as the tree it was (nodes, the path accepted) and why the tree stopped."""
    tr = _tree_trace("nodes")
    s = narrate(tr.rounds[0], tr)
    assert s.startswith("Round 1: the draft model grew a token tree of 16 nodes, 3 levels deep")
    assert "(drafting stopped: the tree reached its node budget of 16 nodes)" in s
    assert "the target checked the whole tree in one pass" in s
    assert "accepted a path of 2 tokens through it ('n0', 'n3')" in s
    assert "all 2 children tried after 'n3' were rejected, so a correction '·fix' was sampled" in s
    assert s.endswith("+3 tokens.")
    assert "proposed 3 tokens" not in s and "draft length" not in s
    # Grown to depth γ, then cut to the node budget (best-first): both, not "the draft length".
    cut = _tree_trace("limit")
    s = narrate(cut.rounds[0], cut)
    assert "(drafting stopped: the tree grew to the depth γ = 5, then kept its best 16 nodes, the node budget)" in s
    # The rounds panel counts the tree's nodes, not the path.
    stop = _stop_span(rounds_html(tr))
    assert stop["data-stop"] == "nodes" and stop["title"] == "drafting stopped: the tree reached its node budget"
    assert "16-node tree · node budget" in rounds_html(tr)


def _block_trace(rule: str = "block") -> object:
    """One round verified by block verification: token 3 has p/q = 0.979 but h = 0.876 (h is not p/q),
    and is kept with u = 0.16 < h; token 5 is rejected."""
    from dataclasses import replace as _replace

    from specviz.trace import Position

    tr = make_trace(plan=[dict(accept=4, extra="correction", draft=5)], gamma=5)
    tr.settings = _replace(tr.settings, rule=rule)
    rows = [(0.50, 0.40, 1.00, 0.30), (0.60, 0.55, 1.00, 0.20), (0.4895, 0.50, 0.876, 0.16),
            (0.30, 0.28, 1.00, 0.05), (0.10, 0.70, 0.20, 0.74)]  # (p, q, h, u)
    tr.rounds[0].positions = [Position(i=i, q=q, p=p, b=h, u=u, accepted=i < 5, reject_prob=0.2, tv=0.15, bias=0.0)
                              for i, (p, q, h, u) in enumerate(rows, 1)]
    return tr


def test_block_verification_names_h_apart_from_p_over_q():
    """The narration printed h as "p/q ratios 1.00, 1.00, 0.88, 1.00", and the tooltip's verdict said
    "u = 0.16 < b = 0.88" under a row labelled h: the ratios are p/q, h is named as h, everywhere."""
    tr = _block_trace()
    s = narrate(tr.rounds[0], tr)
    assert "(min(1, p/q) 1.00, 1.00, 0.98, 1.00; block verification's h 1.00, 1.00, 0.88, 1.00)" in s
    assert "last position whose u < h" not in s  # every kept token passed on its own here
    assert "was rejected (u=0.74 ≥ h=0.20; p=0.10 vs q=0.70)" in s
    chip = round_html(tr.rounds[0], 5, rule="block")
    text = "".join(parse(chip).text)
    assert "h (block verification)" in text and "min(1, p/q)" in text and "0.979" in text
    assert "u=0.160 < h=0.876 → kept" in text and "b=0.876" not in text
    assert "u=0.740 ≥ h=0.200 → rejected" in text
    # The token-wise rule keeps its names.
    tok = make_trace()
    assert "(acceptance probabilities b = min(1, p/q): 0.83" in narrate(tok.rounds[1], tok)
    assert "u=0.300 < b=0.833 → accepted" in "".join(parse(round_html(tok.rounds[1], 4)).text)
    assert "h (block verification)" not in round_html(tok.rounds[1], 4)
    # Exact match names b = p.
    match = _block_trace("match")
    assert "(b = p: 1.00, 1.00, 0.88, 1.00)" in narrate(match.rounds[0], match)


def test_narration_names_min_1_p_over_q_and_the_block_rule_keeping_to_the_last_pass():
    """The narration called min(1, p/q) "p/q ratios" (a p/q of 1.53 shown as 1.00), and the block rule's
    "h 0.24" beside an accepted token did not say that block keeps everything up to the LAST u < h."""
    from dataclasses import replace as _replace

    from specviz.trace import Position

    tok = make_trace(plan=[dict(accept=2, extra="bonus", draft=2)], gamma=2)
    tok.rounds[0].positions = [Position(i=1, q=0.40, p=0.612, b=1.0, u=0.9, accepted=True, reject_prob=0.1, tv=0.1,
                                        bias=0.0),
                               Position(i=2, q=0.50, p=0.40, b=0.8, u=0.3, accepted=True, reject_prob=0.1, tv=0.1,
                                        bias=0.0)]
    s = narrate(tok.rounds[0], tok)
    assert "p/q ratio" not in s
    assert "(acceptance probabilities b = min(1, p/q): 1.00, 0.80)" in s  # p/q = 1.53 is capped, and named so
    eps = make_trace(plan=[dict(accept=2, extra="bonus", draft=2)], gamma=2)
    eps.settings = _replace(eps.settings, epsilon=0.1)
    eps.rounds[0].positions = [_replace(pos, b=0.9 if pos.i == 2 else 1.0) for pos in tok.rounds[0].positions]
    assert "(acceptance probabilities b = min(1, (p+ε)/q): 1.00, 0.90)" in narrate(eps.rounds[0], eps)

    tr = _block_trace()
    first, second = tr.rounds[0].positions[:2]
    tr.rounds[0].positions[1] = _replace(second, b=0.24, u=0.5)  # u ≥ h, kept because token 4 has u < h
    s = narrate(tr.rounds[0], tr)
    assert "block verification's h 1.00, 0.24, 0.88, 1.00" in s
    assert ("block verification keeps every token up to the last position whose u < h, here token 4, "
            "so token 2 was kept although token 2 had u=0.50 ≥ h=0.24") in s
    tr.rounds[0].positions[0] = _replace(first, b=0.1, u=0.7)
    assert "so tokens 1, 2 were kept although e.g. token 1 had u=0.70 ≥ h=0.10" in narrate(tr.rounds[0], tr)


@pytest.mark.parametrize("rule, name, short", [("token", "token-wise verification", "token rule"),
                                               ("block", "block verification", "block rule"),
                                               ("match", "exact-match verification", "match rule")])
def test_the_legend_and_the_rounds_header_name_the_rule_that_ran(rule, name, short):
    tr = _block_trace(rule)
    legend = "".join(parse(legend_html(tr)).text)
    assert f"constant policy, γ = 5 · {name}" in legend
    head = "".join(parse(rounds_html(tr)).text)
    assert f"constant policy, γ = 5 · {short} · times: draft + verify" in head  # short: the header keeps one line
    others = {"token-wise verification", "block verification", "exact-match verification", "token rule", "block rule",
              "match rule"} - {name, short}
    assert not any(o in legend or o in head for o in others)
    if rule == "block":
        assert "u < h here, or at a later position" in legend and "norm(max(0, w·p − q))" in legend
    else:
        assert "u < h" not in legend
    assert "verification" not in "".join(parse(rounds_html(make_std_trace())).text)


def test_tooltips_give_significant_digits_not_three_decimals():
    """p = 0.000612 showed as "0.001", q = 0.0184 as "0.018" and b = p/q = 0.0333 as "0.033": a reader
    dividing the shown p by the shown q got 0.056.  Tooltips give three significant digits."""
    from specviz.trace import Position
    from specviz.views._fmt import fsig

    assert [fsig(x) for x in (0.000612, 0.0184, 0.0333, 0.979, 1.0, 6.12e-5, 0.0)] == \
        ["0.000612", "0.0184", "0.0333", "0.979", "1.00", "6.12e-05", "0"]
    assert fsig(None) == "—" and fsig(float("nan")) == "—"
    tr = make_trace(plan=[dict(accept=0, extra="correction", draft=1)])
    p, q, u = 0.000612, 0.0184, 0.5
    tr.rounds[0].positions = [Position(i=1, q=q, p=p, b=p / q, u=u, accepted=False, reject_prob=0.9, tv=0.5, bias=0.0)]
    tr.rounds[0].extra.p = 0.00123
    text = "".join(parse(round_html(tr.rounds[0], 4)).text)
    assert "0.000612" in text and "0.0184" in text and "0.0333" in text and "0.00123" in text
    assert "u=0.500 ≥ b=0.0333 → rejected" in text
    assert "0.001" not in text.replace("0.00123", "") and "0.018" not in text.replace("0.0184", "")


def test_a_sampled_race_says_its_two_texts_differ_as_expected():
    """A sampled race's two texts differed with no word that this is expected when sampling."""
    from dataclasses import replace as _replace

    spec = make_trace(plan=[dict(accept=2, extra="bonus", draft=2)], gamma=2)
    std = make_std_trace(n_tokens=3)
    assert spec.settings.temperature == 1.0
    text = "".join(parse(race_html(spec, std)).text)
    assert "The two texts differ, as expected when sampling (temperature 1 > 0)" in text
    assert "not the same text" in text
    # Not while a side is still running, nor when the texts agree, nor under greedy decoding.
    assert "as expected when sampling" not in race_html(spec, std, std_running=True)
    same = make_std_trace(n_tokens=3, texts=[tok.text for rnd in spec.rounds for tok in rnd.emitted])
    assert "as expected when sampling" not in race_html(spec, same)
    greedy = _replace(spec, settings=_replace(spec.settings, temperature=0.0))
    assert "as expected when sampling" not in race_html(greedy, std)


def test_a_race_timed_while_the_server_started_says_so_once():
    """The race's headline: why its clocks are not quoted, in one sentence, never "busy" for a starting server."""
    from specviz.theory.timing import STARTING
    from specviz.trace.timing import Timing
    from specviz.views.race import noise_sentence

    ready = Timing(reliable=False, spread=0.12, why=f"{STARTING}: this race ran on the models read from their GGUF files")
    said = noise_sentence(ready, 1.23, 1.5, 1.2)
    assert said.startswith("Timings ±12%: the server was still starting: this race ran on the models read")
    assert STARTING not in said and "busy" not in said and "once the server is ready" in said
    warming = Timing(reliable=False, spread=0.2, why=f"{STARTING} and was still preparing the models' fast kernels")
    said = noise_sentence(warming, 1.1, 1.1, 1.0)
    assert said.startswith(f"Timings ±20%: {STARTING} and was still preparing") and "still starting" not in said
    busy = Timing(reliable=False, spread=0.3, why="other work used 1.5 cores")
    said = noise_sentence(busy, 0.9, 0.9, 1.0)
    assert "the machine was busy during this race (other work used 1.5 cores)" in said and "quieter" in said
