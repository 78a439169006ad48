"""Deep links in a headless browser: a link to a round opens the rounds panel on that round (issue 56)."""

from __future__ import annotations

from tests.test_browser import UI_S, assert_no_traceback, open_app, page, wait_until  # noqa: F401


def test_a_link_to_round_3_opens_the_rounds_panel_on_round_3(page, server, shots):  # noqa: F811
    for query in ("?recording=2-chat-greedy&round=3&present=1", "?recording=2-chat-greedy&round=3"):
        open_app(page, server, query)
        wait_until(page, server, "() => !!document.querySelector('#sv-rounds .sv-round--stepped[data-round=\"3\"]')",
                   "round 3 marked in the rounds panel", UI_S)
        seen = page.evaluate("""() => { const body = document.querySelector('#sv-rounds .sv-rounds-body');
            const b = body.getBoundingClientRect(), r = body.querySelector('.sv-round[data-round="3"]')
                .getBoundingClientRect();
            return {top: r.top - b.top, bottom: b.bottom - r.top, rounds: body.querySelectorAll('.sv-round').length}; }""")
        assert seen["rounds"] > 6 and 0 <= seen["top"] <= 40 and seen["bottom"] > 20, seen  # round 3 at the top
        page.screenshot(path=str(shots / f"round-3{'-present' if 'present' in query else ''}.png"))
    # stepping on moves the panel with it
    page.click("#sv-next")
    wait_until(page, server, "() => !!document.querySelector('#sv-rounds .sv-round--stepped[data-round=\"4\"]')",
               "round 4 marked after Next", UI_S)
    assert_no_traceback(page)
