"""One glossary defines every symbol and term the page uses: the "How it works" tab renders it, and the
views put a symbol's definition on hover where they print it (narration, legend, metrics, race)."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from markdown_it import MarkdownIt

from specviz.theory.figures import run_figures
from specviz.views.chips import legend_html
from specviz.views.glossary import GLOSSARY, abbr, definition, glossary_markdown, glossed, term_title
from specviz.views.how import how_it_works
from specviz.views.metrics import metrics_html
from specviz.views.narrate import narrate_html
from specviz.views.race import race_html
from tests.synthetic import make_std_trace, make_trace

# The terms the issue found without a definition, as the page writes them.
ISSUE_TERMS = ["γ", "α", "β", "TV", "h", "w", "ε", "OPT", "UNO", "residual", "Thm 3.8", "v", "c", "count-based",
               "probed costs", "int8", "Q4_K", "GGUF", "batch-invariant", "bf16", "AMX", "AVX2", "AVX-512",
               "compute-bound", "memory-bound", "τ", "MLP speculator"]


class _Html(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def parse(html: str) -> _Html:
    p = _Html()
    p.feed(html)
    return p


def hovers(html: str) -> dict[str, str]:
    """{shown symbol: title} of the <abbr> elements in ``html``."""
    q = _Abbr()
    q.feed(html)
    return q.found


class _Abbr(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: dict[str, str] = {}
        self._title: str | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "abbr":
            self._title = dict(attrs).get("title")

    def handle_endtag(self, tag):
        if tag == "abbr":
            self._title = None

    def handle_data(self, data):
        if self._title is not None:
            self.found[data] = self._title


@pytest.mark.parametrize("term", ISSUE_TERMS)
def test_every_term_the_issue_lists_has_a_one_line_definition(term):
    line = definition(term)
    assert line and "\n" not in line and len(line) > len(term) + 20, term
    assert line.rstrip().endswith("."), term


def test_the_glossary_renders_every_term_on_the_how_it_works_tab():
    html = MarkdownIt().render(glossary_markdown())
    p = parse(html)
    text = "".join(p.text)
    items = [t for t, _ in p.tags if t == "li"]
    assert len(items) == len(GLOSSARY)
    for term, line in GLOSSARY.items():
        assert f"{term} — {line}" in text, term
    assert "<h3>Glossary</h3>" in html
    page = MarkdownIt().render(how_it_works(None, heads=""))
    assert "<h3>Glossary</h3>" in page and page.index("Glossary") < page.index("References")


def test_symbols_carry_their_definition_on_hover_and_text_stays_escaped():
    html = glossed("γ = 4, α < 1, TV(p, q) per Thm 3.8 <b>x</b>")
    found = hovers(html)
    assert set(found) == {"γ", "α", "TV", "Thm 3.8"}
    assert found["γ"] == f"γ: {GLOSSARY['γ']}" and found["Thm 3.8"].startswith("Thm 3.8: Leviathan")
    assert "<b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html
    assert "".join(parse(html).text) == "γ = 4, α < 1, TV(p, q) per Thm 3.8 <b>x</b>"  # the words unchanged
    assert "TVs" not in hovers(glossed("TVs")) and hovers(glossed("OTV")) == {}  # whole words only
    assert 'title="v: Verify factor' in abbr("v") and term_title("no symbols") == ""


def test_the_narration_legend_metrics_and_race_define_their_symbols():
    spec, std = make_trace(), make_std_trace()
    legend = hovers(legend_html(spec))
    assert legend["γ"].startswith("γ: Draft length")
    narration = hovers(narrate_html(spec.rounds[1], spec))
    assert narration.get("residual", "").startswith("residual: norm(max(0, p − q))")
    metrics = metrics_html(spec, figures=run_figures(spec, std))
    found = hovers(metrics)
    assert found["α"].startswith("α: Acceptance rate")  # in the definitions
    titles = [a.get("title", "") for t, a in parse(metrics).tags if t == "th"]  # and on the metrics' names
    assert any(t.startswith("β: Expected acceptance") for t in titles)
    assert any(t.startswith("v: Verify factor") for t in titles)
    assert any(t.startswith("c: Cost ratio") for t in titles)
    race = parse(race_html(spec, std))
    theory = next(a["title"] for t, a in race.tags if a.get("class") == "sv-speedup-theory")
    assert theory.startswith("Thm 3.8: Leviathan") and "\nv: Verify factor" in theory
