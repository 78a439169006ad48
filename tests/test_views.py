"""Tests for specviz.views (HTML and plotly views) on synthetic traces."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from specviz.trace import DraftToken, Extra, Position, Round, Token, Trace
from specviz.settings import DecodeSettings
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
from specviz.views import plots

XSS = "<script>alert(1)</script>"
ATTR_XSS = '" onmouseover="alert(1)'

WORDS = ["def", " area", "(r", "):", "\n", "    return", " 3", ".", "14", " *", " r", " *", " r", "\n",
         "\n", "print", "(area", "(2", "))", "\n"]


def _word(k: int) -> str:
    return WORDS[k % len(WORDS)]


# Default round plan for γ = 4: (accepted, extra kind, draft length)
DEFAULT_PLAN = [
    dict(accept=4, extra="bonus"),                      # 5 tokens, all accepted
    dict(accept=2, extra="correction"),                 # 3 tokens: acc acc REJ disc → correction
    dict(accept=0, extra="correction"),                 # 1 token: REJ disc disc disc → correction
    dict(accept=3, extra="correction", xss=True),       # 4 tokens, an XSS token accepted
    dict(accept=4, extra="bonus"),                      # 5 tokens
    dict(accept=1, extra="correction", xss_extra=True),  # 2 tokens, XSS correction
    dict(accept=2, extra=None, verified=2),             # 2 tokens, run ends (EOS), no extra token
]


def make_trace(
    gamma: int = 4,
    plan: list[dict] | None = None,
    epsilon: float = 0.0,
    stop_reason: str = "eos",
    prompt: str = "Write a function:\n",
    t_prefill: float = 0.3,
) -> Trace:
    """A speculative trace built round by round from ``plan``.

    Each plan entry: accept (accepted drafts), extra ("correction" | "bonus" |
    None), optional draft (drafted count, default γ), verified (positions
    recorded, default accept+1 capped at draft), rescue (index of an accepted
    position that only passes thanks to ε), xss / xss_extra (put an XSS token in
    the accepted drafts / the extra token).
    """
    plan = DEFAULT_PLAN if plan is None else plan
    rounds: list[Round] = []
    t = t_prefill
    n = 0
    w = 0
    for idx, step in enumerate(plan):
        k = step.get("draft", gamma)
        a = step["accept"]
        extra_kind = step.get("extra")
        verified = step.get("verified", min(a + 1, k) if extra_kind != "bonus" else k)
        draft = []
        for i in range(k):
            text = _word(w)
            w += 1
            if step.get("xss") and i == 0:
                text = XSS
            draft.append(DraftToken(id=100 + w, text=text, q=0.6 if i < a else 0.7))
        positions = []
        for i in range(1, verified + 1):
            if i <= a:
                if step.get("rescue") == i:
                    q, p, u = 0.6, 0.3, 0.55  # p/q = 0.5 ≤ u < b = (0.3+ε)/0.6
                else:
                    q, p, u = 0.6, 0.5, 0.30
                acc = True
            else:
                q, p, u = 0.7, 0.2, 0.74
                acc = False
            b = min(1.0, (p + epsilon) / q)
            assert (u < b) == acc, (idx, i, u, b)
            positions.append(Position(i=i, q=q, p=p, b=b, u=u, accepted=acc, reject_prob=0.2, tv=0.15, bias=0.0))
        emitted = [Token(id=d.id, text=d.text, origin="accepted") for d in draft[:a]]
        extra = None
        if extra_kind:
            etext = XSS if step.get("xss_extra") else (" fix" if extra_kind == "correction" else " bonus!")
            extra = Extra(id=7, text=etext, kind=extra_kind, p=0.42)
            emitted.append(Token(id=7, text=etext, origin=extra_kind))
        t_draft, t_verify = 0.04 * k, 0.12
        rounds.append(
            Round(
                index=idx,
                n_before=n,
                draft=draft,
                positions=positions,
                extra=extra,
                emitted=emitted,
                t_start=t,
                t_draft=t_draft,
                t_verify=t_verify,
                t_end=t + t_draft + t_verify,
                draft_forwards=k,
                target_forwards=1,
            )
        )
        t += t_draft + t_verify
        n += len(emitted)
    return Trace(
        kind="speculative",
        prompt=prompt,
        prompt_tokens=12,
        settings=DecodeSettings(gamma=gamma, epsilon=epsilon, variant="opt", temperature=1.0, top_k=0, top_p=1.0,
                                max_new_tokens=64, seed=0),
        models=dict(preset="tiny", draft="draft-<b>small</b>", target="target-big", drafter="model"),
        device="cpu",
        rounds=rounds,
        stop_reason=stop_reason,
        t_prefill=t_prefill,
        t_total=t,
        draft_prefill=0.1,
        target_prefill=0.2,
    )


def make_std_trace(n_tokens: int = 22, step: float = 0.11, t_prefill: float = 0.25, texts: list[str] | None = None) -> Trace:
    rounds = []
    t = t_prefill
    for i in range(n_tokens):
        text = texts[i] if texts else _word(i)
        rounds.append(
            Round(
                index=i,
                n_before=i,
                extra=Extra(id=200 + i, text=text, kind="target", p=0.3),
                emitted=[Token(id=200 + i, text=text, origin="target")],
                t_start=t,
                t_verify=step,
                t_end=t + step,
                draft_forwards=0,
                target_forwards=1,
            )
        )
        t += step
    return Trace(
        kind="standard",
        prompt="Write a function:\n",
        prompt_tokens=12,
        settings=DecodeSettings(epsilon=0.0, temperature=1.0, max_new_tokens=64, seed=0),
        models=dict(preset="tiny", target="target-big"),
        device="cpu",
        rounds=rounds,
        stop_reason="max_new_tokens",
        t_prefill=t_prefill,
        t_total=t,
    )


def empty_trace(kind: str = "speculative") -> Trace:
    return Trace(kind=kind, prompt="", prompt_tokens=0, settings=DecodeSettings(gamma=4),
                 models={}, device="cpu")


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
        back = Trace.from_json(tr.to_json())
        assert back.n_tokens == tr.n_tokens
    s = spec.summary()
    assert s["alpha"] == pytest.approx(16 / 20)
    assert s["tokens_per_round_hist"] == [0, 1, 2, 1, 1, 2]


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
    assert "u=0.30 &lt; b=0.83 → accepted" in h
    assert "u=0.74 ≥ b=0.29 → rejected" in h
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


def test_rounds_html_truncates_long_runs_newest_first():
    plan = [dict(accept=i % 5, extra="bonus" if i % 5 == 4 else "correction") for i in range(50)]
    tr = make_trace(plan=plan)
    h = rounds_html(tr, max_rounds_shown=40)
    rows = [a["data-round"] for t, a in parse(h).tags if "data-round" in a]
    assert len(rows) == 40
    assert rows[0] == "50" and rows[-1] == "11"
    assert "10 earlier rounds" in h


def test_rounds_html_upto_and_pending():
    tr = make_trace()
    h = rounds_html(tr, upto=3)
    rows = [a["data-round"] for t, a in parse(h).tags if "data-round" in a]
    assert rows == ["3", "2", "1"]
    current = [a for t, a in parse(h).tags if "sv-round--current" in a.get("class", "")]
    assert len(current) == 1 and current[0]["data-round"] == "3"
    pend = Round(index=3, n_before=9, draft=tr.rounds[3].draft[:1])
    h2 = rounds_html(tr, upto=3, pending_round=pend)
    rows2 = [a["data-round"] for t, a in parse(h2).tags if "data-round" in a]
    assert rows2 == ["4", "3", "2", "1"]
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
    expected = spec.summary()["tokens_per_s"] / std.summary()["tokens_per_s"]
    assert float(m.group(1)) == pytest.approx(expected, rel=1e-3)
    assert f"{expected:.2f}×" in h
    assert _col_tokens(h) == [spec.n_tokens, std.n_tokens]
    # replay past the end is the same as finished
    h_end = race_html(spec, std, at_time=max(spec.t_total, std.t_total) + 1)
    assert "data-speedup" in h_end
    # stats: forward passes and ttft of the spec side
    assert str(len(spec.rounds)) in h


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
    assert f"token 3 {tr.rounds[1].draft[2].text!r}" in s
    assert "rejected (u=0.74 ≥ b=0.29" in s
    assert "correction ' fix'" in s and "residual" in s
    assert "1 later draft was discarded" in s
    assert s.endswith("+3 tokens.")
    assert "\n" not in s


def test_narrate_bonus_first_rejection_eos_standard_eps_pending():
    tr = make_trace()
    s = narrate(tr.rounds[0], tr)
    assert "accepted all 4" in s and "bonus token ' bonus!'" in s and s.endswith("+5 tokens.")
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
    assert "draft forward time ÷ target forward time" in h
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
    assert list(bar.y) == pytest.approx(s["per_position_acceptance"])
    line = [t for t in fig.data if t.type == "scatter"][0]
    assert list(line.y) == pytest.approx([s["alpha"], s["alpha"]])


def test_tokens_per_round_hist_numbers():
    tr = make_trace()
    fig = plots.tokens_per_round_hist(tr)
    bar = _bar(fig)
    assert list(bar.x) == list(range(tr.gamma + 2))
    assert sum(bar.y) == len(tr.rounds)
    assert list(bar.y) == tr.summary()["tokens_per_round_hist"]
    exp = [t for t in fig.data if t.type == "scatter"][0]
    assert sum(exp.y) == pytest.approx(len(tr.rounds))
    a, g = 0.8, tr.gamma
    assert exp.y[1] == pytest.approx(len(tr.rounds) * (1 - a))
    assert exp.y[g + 1] == pytest.approx(len(tr.rounds) * a**g)
    assert sum(plots.expected_tokens_distribution(0.37, 6)) == pytest.approx(1.0)


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
    fig = plots.tokens_vs_time(spec, std)
    lines = [t for t in fig.data if t.mode == "lines"]
    assert len(lines) == 2
    assert lines[0].line.shape == "hv"
    assert lines[0].y[-1] == spec.n_tokens and lines[1].y[-1] == std.n_tokens
    assert lines[0].x[-1] == pytest.approx(spec.rounds[-1].t_end)
    assert lines[0].x[0] == 0 and lines[0].y[0] == 0
    one = plots.tokens_vs_time(spec, None)
    assert len([t for t in one.data if t.mode == "lines"]) == 1


def test_speedup_bars_numbers():
    spec, std = make_trace(), make_std_trace()
    fig = plots.speedup_bars(spec, std)
    bar = _bar(fig)
    s = spec.summary()
    measured = s["tokens_per_s"] / std.summary()["tokens_per_s"]
    assert bar.y[0] == pytest.approx(measured)
    assert bar.y[1] == pytest.approx(s["theoretical_speedup"])
    assert f"c = {s['c']:.3f}" in fig.layout.title.subtitle.text
    only = plots.speedup_bars(spec, None)
    assert _bar(only).text[0] == "n/a"


ALL_PLOTS_1 = [plots.acceptance_by_position, plots.tokens_per_round_hist, plots.round_times]
ALL_PLOTS_2 = [plots.tokens_vs_time, plots.speedup_bars]


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
