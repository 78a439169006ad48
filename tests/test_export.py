"""'Download as a page': the standalone HTML export of a run (specviz.views.export_page, specviz.cli.export).

The page must carry the HTML the app's own views draw (every round, every moment of a tree's walk,
the race), plotly.js exactly once and nothing fetched from anywhere; the command says plainly what
is wrong with a file it cannot export.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specviz.cli import export as cli
from specviz.theory.figures import run_figures
from specviz.trace import Trace, load_recording, recording_to_json
from specviz.views import html as V
from specviz.views import plots as P
from specviz.views import race_plots as RP
from specviz.views.export_frames import FramePool, delta, race_frames, replay_speed, round_frames, undelta
from specviz.views.export_page import export_page, plotly_js
from specviz.views.tree_live import is_tree_run, live_tree, walk_steps
from tests.synthetic import XSS, make_trace

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "assets" / "traces").glob("*.json"))
V1 = ROOT / "tests" / "fixtures" / "v1-recording.json"
DATA = re.compile(r'<script type="application/json" id="sv-x-data">(.*?)</script>', re.S)


def page_data(page: str) -> dict:
    found = DATA.findall(page)
    assert len(found) == 1, "the page must hold exactly one data block"
    return json.loads(found[0])


def frames_html(data: dict, frames: list) -> list[str]:
    """Each frame's HTML, decoded as the page's script does: edits of the frame before, then the pool."""
    out, prev = [], []
    for ops in frames:
        prev = undelta(prev, ops)
        out.append("".join(data["pool"][k] for k in prev))
    return out


def upto(trace: Trace, n: int) -> Trace:
    part = copy.copy(trace)
    part.rounds = trace.rounds[:n]
    return part


def tiny_recording(tmp_path: Path, **settings) -> Path:
    """A version-3 recording made in-process by the tiny random pair (no download)."""
    from specviz.core import engine
    from tests import drafted
    from specviz.core.settings import DecodeSettings
    from specviz.models import encode_prompt
    from specviz.models.tiny import build_tiny_pair

    pair = build_tiny_pair()
    prompt = "Say something."
    ids = encode_prompt(pair, prompt)
    s = DecodeSettings.checked(**{"gamma": 3, "max_new_tokens": 12, "temperature": 1.0, "seed": 4, **settings})
    spec = drafted.speculative_decode(pair, ids, s, prompt=prompt)
    std = engine.standard_decode(pair, ids, s, prompt=prompt)
    path = tmp_path / f"tiny-{s.drafter}.json"
    path.write_text(recording_to_json(spec, std), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tree_recording(tmp_path_factory) -> Path:
    return tiny_recording(tmp_path_factory.mktemp("traces"), drafter="tree", branches=3, tree_nodes=9,
                          tree_mode="iid")


def check_page(page: str, spec: Trace | None, std: Trace | None) -> dict:
    """What every exported page must satisfy; returns its data block."""
    data = page_data(page)
    # plotly.js inlined once; nothing loaded from anywhere.
    assert page.count(plotly_js()) == 1 and page.count("plotly.js v") == 1
    assert not re.search(r"<script[^>]*\bsrc\s*=", page, re.I), "a script loads from a file or URL"
    assert not re.search(r"<link\b", page, re.I), "a stylesheet or font is linked"
    assert not re.search(r"@import|url\(\s*['\"]?(https?:)?//", page, re.I), "CSS fetches something"
    assert not re.search(r"<(img|iframe|source|video|audio)\b[^>]*\bsrc\s*=\s*['\"]?(https?:)?//", page, re.I)
    assert page.count("<script") == 4  # dark mode, plotly.js, the data, the player: no injected one
    # The rounds: after each round, the panel is exactly what the page draws after that round; the
    # last frame is the finished run, as the page shows it after Run.
    shown = frames_html(data, [f["r"] for f in data["rounds"]])
    trees = frames_html(data, [f["t"] for f in data["rounds"]])
    assert shown[-1] == V.rounds_html(spec)
    assert data["nRounds"] == (len(spec.rounds) if spec else 0)
    if spec is not None:
        for i, rnd in enumerate(spec.rounds):
            finished = V.rounds_html(upto(spec, i + 1))
            assert finished in shown, f"round {i + 1}'s finished panel is missing"
            row = V.round_html(rnd, spec.gamma, epsilon=spec.settings.epsilon, policy=spec.settings.policy,
                               drafter=spec.settings.drafter, rule=spec.settings.rule)
            at = shown.index(finished)  # the row stays as round_html draws it (the panel shows the last 40)
            assert all(row in s for s in shown[at:] if s.count('class="sv-round ') <= 40 or i >= len(spec.rounds) - 40)
            if rnd.tree is None and rnd.draft:  # each drafted token appears, pending, one by one
                pending = [s for s, f in zip(shown, data["rounds"]) if f["n"] == i + 1 and "sv-round--pending" in s]
                assert [s.count('data-status="pending"') for s in pending] == list(range(1, len(rnd.draft) + 1))
            if rnd.tree is not None:  # the walk, step by step, as the Live tab plays it
                for step in walk_steps(rnd):
                    assert live_tree(upto(spec, i + 1), walk=step) in trees
        assert trees[-1] == live_tree(spec)
    # The race: drawn finished on the page, replayed from its timestamps by the player.
    assert V.race_html(spec, std) in page
    end = max(t.t_total for t in (spec, std) if t is not None)
    race = data["race"]
    assert race["times"][0] == 0 and race["times"][-1] == pytest.approx(end, abs=1e-3)
    replayed = frames_html(data, race["frames"])
    assert replayed[-1] == V.race_html(spec, std, at_time=end)
    assert replayed[0] == V.race_html(spec, std, at_time=0.0)
    times = race_frames(spec, std).times  # the exact times (the page keeps 4 decimals, for its clock)
    assert all(h == V.race_html(spec, std, at_time=t) for h, t in zip(replayed[::25], times[::25]))
    # The metrics and the charts.
    summary = spec.summary() if spec else std.summary()
    assert V.metrics_html(summary, gamma=spec.gamma if spec else 0, figures=run_figures(spec, std)) in page
    figs = {p["id"]: p["fig"] for p in data["plots"]}
    assert len(figs) == (9 if is_tree_run(spec) else 6)
    assert figs["sv-x-plot-acceptance"] == json.loads(P.acceptance_by_position(spec).to_json())
    assert figs["sv-x-plot-tokens-vs-time"] == json.loads(RP.tokens_vs_time(spec, std).to_json())
    assert figs["sv-x-plot-speedup"] == json.loads(RP.speedup_bars(spec, std).to_json())
    for p in data["plots"]:
        assert f'id="{p["id"]}"' in page
    return data


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_shipped_recording_exports_with_the_apps_markup(path):
    spec, std = load_recording(path.read_bytes())
    page = export_page(spec, std, source=path.name)
    check_page(page, spec, std)
    assert len(page.encode("utf-8")) < 8 * 2**20


def test_a_version_1_recording_exports():
    spec, std = load_recording(V1.read_bytes())
    check_page(export_page(spec, std, source=V1.name), spec, std)


def test_a_version_3_tree_recording_exports_its_growing_trees_and_walks(tree_recording):
    doc = json.loads(tree_recording.read_text(encoding="utf-8"))
    assert doc["version"] == 3
    spec, std = load_recording(tree_recording.read_bytes())
    data = check_page(export_page(spec, std, source=tree_recording.name), spec, std)
    trees = frames_html(data, [f["t"] for f in data["rounds"]])
    first = next(r for r in spec.rounds if r.tree is not None)
    depth = max(n.depth for n in first.tree.nodes)
    growing = [t for t, f in zip(trees, data["rounds"]) if f["n"] == first.index + 1 and "verify pass" not in t]
    sizes = [t.count("data-node=") for t in growing[:depth]]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1] <= len(first.tree.nodes)
    assert all('data-status="pending"' in t for t in growing[:depth])
    assert any('class="sv-tree-walk"' in t for t in trees)
    names = [p["id"] for p in data["plots"]]
    assert {"sv-x-plot-tree-sizes", "sv-x-plot-tree-mask"} <= set(names)


def test_a_chain_version_3_recording_exports(tmp_path):
    path = tiny_recording(tmp_path, drafter="model")
    spec, std = load_recording(path.read_bytes())
    check_page(export_page(spec, std), spec, std)


def test_a_recording_with_only_one_run_exports():
    spec, _ = load_recording(SHIPPED[0].read_bytes())
    check_page(export_page(spec, None), spec, None)
    _, std = load_recording(SHIPPED[0].read_bytes())
    data = check_page(export_page(None, std), None, std)
    assert len(data["rounds"]) == 1


def test_model_text_cannot_break_out_of_the_page():
    spec = make_trace(prompt=f"{XSS}</script><!-- \u2028")
    page = export_page(spec, None)
    data = check_page(page, spec, None)
    assert "<script>alert(1)</script>" not in page
    assert any(XSS.replace("<", "&lt;").replace(">", "&gt;") in frame for frame in data["pool"])


def test_the_pool_gives_each_view_back_exactly():
    spec, std = load_recording(SHIPPED[1].read_bytes())
    pool = FramePool()
    frames = round_frames(spec)
    indices = [pool.add(f.rounds) for f in frames]
    assert [pool.html(k) for k in indices] == [f.rounds for f in frames]
    assert len(pool.fragments) < sum(len(k) for k in indices)  # rows shared between frames are stored once
    race = race_frames(spec, std)
    assert [pool.html(pool.add(h)) for h in race.frames] == race.frames
    # Frames are stored as edits of the one before: decoding gives every frame back, and costs less.
    prev: list[int] = []
    plain = edits = 0
    for cur in [pool.add(h) for h in race.frames] + indices + [[], [3, 3, 1], [1, 3, 3], [3, 3, 3, 1]]:
        ops = delta(prev, cur)
        assert undelta(prev, ops) == cur
        plain, edits, prev = plain + len(json.dumps(cur)), edits + len(json.dumps(ops)), cur
    # How much less depends on the run (its rounds' share of each frame): 0.21 and 0.25 of the plain frames on
    # the chat recording as made at stops 46 and 47, 0.09-0.48 over the six; a delta sharing nothing costs ~1.
    assert edits < plain / 3
    # Played at the recorded speed, the rounds take about as long as the run did.
    assert sum(f.seconds for f in frames) == pytest.approx(spec.t_total, rel=0.35)


def test_the_race_replays_at_the_apps_speed():
    from specviz.serving.replay import replay_speed as apps

    for total in (0.0, 5.0, 60.0, 61.0, 600.0):
        assert replay_speed(total) == apps(total)


def test_nothing_to_export_is_an_error():
    with pytest.raises(ValueError, match="nothing to export"):
        export_page(None, None)


# ---- the command -----------------------------------------------------------------------------------


def test_the_command_exports_a_shipped_recording_by_name(tmp_path, capsys):
    out = tmp_path / "chat.html"
    assert cli.main([SHIPPED[1].stem, "-o", str(out)]) == 0
    assert out.read_text(encoding="utf-8").startswith("<!doctype html>")
    assert "wrote" in capsys.readouterr().out
    assert not list(tmp_path.glob(".specviz-*"))  # no temporary file left behind


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("{not json", "not valid JSON"),
    ('{"schema": "something else"}', "not a specviz recording"),
    ('{"schema": "specviz.recording", "version": 99}', "unsupported recording version"),
])
def test_the_command_says_what_is_wrong_with_a_file(tmp_path, capsys, content, message):
    src = tmp_path / "run.json"
    if content is not None:
        src.write_text(content, encoding="utf-8")
    assert cli.main([str(src), "-o", str(tmp_path / "out.html")]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1
    assert not (tmp_path / "out.html").exists()


def test_the_command_refuses_a_folder_as_output(tmp_path, capsys):
    assert cli.main([SHIPPED[0].stem, "-o", str(tmp_path)]) == 1
    assert "is a folder" in capsys.readouterr().err


def test_python_m_specviz_export_exits_non_zero_with_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "specviz.export", str(tmp_path / "missing.json"), "-o",
                          str(tmp_path / "x.html")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "no such file" in out.stderr and "Traceback" not in out.stderr
    assert "1-code-greedy" in out.stderr  # it names the shipped recordings


# ---- the app's button ------------------------------------------------------------------------------


def test_the_button_exports_what_the_live_tab_shows(tmp_path, monkeypatch):
    from specviz.ui import export_ui, live

    monkeypatch.setenv("SPECVIZ_EXPORT_DIR", str(tmp_path))
    frame = live.load_example_recording(SHIPPED, SHIPPED[2].name)
    file, status = export_ui.download_page(frame.state)
    assert file["visible"] is True and not isinstance(status, str)
    path = Path(file["value"])
    assert path.parent == tmp_path and path.suffix == ".html"
    spec, std = load_recording(SHIPPED[2].read_bytes())
    check_page(path.read_text(encoding="utf-8"), spec, std)


def test_the_button_with_nothing_shown_says_so():
    from specviz.ui import export_ui

    for state in (None, {}, {"spec": None, "std": None}):
        file, status = export_ui.download_page(state)
        assert file["visible"] is False and file["value"] is None
        assert 'data-kind="warn"' in status and "Nothing to download yet" in status


def test_a_long_run_shows_each_round_drafted_then_verified(monkeypatch):
    from specviz.views import export_frames

    spec = make_trace()
    every = export_frames.round_frames(spec)
    assert len(every) == sum(len(r.draft) + 1 for r in spec.rounds)
    monkeypatch.setattr(export_frames, "MAX_FRAMES", len(every) - 1)
    frames = export_frames.round_frames(spec)
    assert len(frames) == 2 * len(spec.rounds)
    for i, rnd in enumerate(spec.rounds):  # the round fully drafted (pending), then its verdict
        drafting, done = frames[2 * i], frames[2 * i + 1]
        assert drafting.rounds.count('data-status="pending"') == len(rnd.draft)
        assert done.rounds == V.rounds_html(upto(spec, i + 1))
        assert drafting.seconds == pytest.approx(max(rnd.t_draft + rnd.t_verify, export_frames.MIN_FRAME_S))
