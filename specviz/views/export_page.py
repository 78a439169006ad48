""""Download as a page": one self-contained HTML file that plays a recorded run offline.

The page holds the Live tab's animation as frames the view functions drew in Python
(specviz.views.export_frames), a small player script (``export_player.js``) that swaps them
in, the run's metrics and plots, specviz's CSS, and plotly.js inlined once.  It loads nothing
from anywhere: it opens from file:// with no server, no Python and no network.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from ..theory.figures import run_figures as race_figures
from ..trace import Trace
from . import html as V
from . import plots as P
from . import race_plots as RP
from . import tree_plots as TRP
from ._fmt import esc
from .export_frames import RACE_STEP_S, FramePool, RaceFrames, RoundFrame, deltas, race_frames, round_frames
from .page import load_css
from .tree import tree_mask_figure
from .tree_live import is_tree_run, last_tree_round, live_tree

PLAYER_JS = Path(__file__).with_name("export_player.js")
SPEEDS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0)

# The player's own layout (the views' look comes from assets/style.css, inlined beside it).
PAGE_CSS = """
.sv-export { max-width: 1280px; margin: 0 auto; display: flex; flex-direction: column; gap: 14px; }
.sv-export h2 { margin: 10px 0 4px; font-size: 19px; }
.sv-x-prompt { border: 1px solid var(--sv-border); border-radius: 10px; padding: 8px 12px;
  background: var(--sv-panel-2); }
.sv-x-k { font-size: 12px; text-transform: uppercase; letter-spacing: 0.04em; color: var(--sv-muted); }
.sv-x-prompt-text { margin: 4px 0 0; white-space: pre-wrap; font-family: var(--sv-font-mono); font-size: 13.5px; }
.sv-x-src { margin-top: 6px; font-size: 12px; color: var(--sv-muted); }
.sv-x-bar { display: flex; flex-wrap: wrap; align-items: center; gap: 6px; padding: 8px 10px;
  border: 1px solid var(--sv-border); border-radius: 10px; background: var(--sv-panel-2);
  position: sticky; top: 0; z-index: 5; }
.sv-x-bar button, .sv-x-bar select { font: inherit; font-size: 14px; padding: 4px 10px; border-radius: 8px;
  border: 1px solid var(--sv-border); background: var(--sv-panel); color: var(--sv-fg); cursor: pointer; }
.sv-x-bar button.sv-x-primary { background: var(--sv-spec); border-color: var(--sv-spec); color: var(--sv-panel);
  font-weight: 700; min-width: 7.5em; }
.sv-x-bar label { font-size: 13px; color: var(--sv-muted); display: flex; align-items: center; gap: 4px; }
.sv-x-bar input[type=range] { flex: 1 1 180px; min-width: 120px; }
.sv-x-pos { font-size: 13px; font-family: var(--sv-font-mono); color: var(--sv-muted); white-space: nowrap; }
.sv-x-live { display: flex; flex-direction: column; gap: 10px; }
.sv-x-plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 10px; }
.sv-x-plot { min-height: 360px; border: 1px solid var(--sv-border); border-radius: 10px; }
.sv-x-foot { font-size: 12px; color: var(--sv-muted); border-top: 1px solid var(--sv-border); padding-top: 8px; }
"""


def _json_for_script(value: Any) -> str:
    """JSON safe inside <script type="application/json">: no "<" at all (so no "</script>" and no "<!--")."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def plotly_js() -> str:
    """plotly.js as the plotly package ships it (the offline bundle)."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def run_figures(spec: Trace | None, std: Trace | None) -> list[tuple[str, go.Figure]]:
    """The Live tab's charts for a run, as the page draws them after Run (the tree charts and the
    attention mask for tree runs only: a chain run's would be blank)."""
    figs = [
        ("acceptance", P.acceptance_by_position(spec)), ("tokens-per-round", P.tokens_per_round_hist(spec)),
        ("draft-lengths", P.draft_lengths(spec)), ("round-times", P.round_times(spec)),
        ("tokens-vs-time", RP.tokens_vs_time(spec, std)), ("speedup", RP.speedup_bars(spec, std)),
    ]
    if is_tree_run(spec):
        figs += [("tree-sizes", TRP.tree_sizes(spec)), ("tree-verify", TRP.tree_verify_scatter(spec)),
                 ("tree-mask", tree_mask_figure(last_tree_round(spec)))]
    return figs


def _bar(prefix: str, play_label: str, *, steps: bool) -> str:
    """A player's controls (the script wires them by id)."""
    options = "".join(f'<option value="{s:g}"{" selected" if s == 1.0 else ""}>{s:g}×</option>' for s in SPEEDS)
    nav = ""
    if steps:
        nav_buttons = [("first", "|◀", "first frame"), ("prev-round", "◀◀ round", "previous round"),
                       ("back", "◀ step", "step back (←)")]
        after = [("fwd", "step ▶", "step forward (→)"), ("next-round", "round ▶▶", "next round"),
                 ("last", "▶|", "the finished run")]
        nav = "".join(f'<button type="button" id="sv-x-{k}" title="{esc(t)}" aria-label="{esc(t)}">{esc(s)}</button>'
                      for k, s, t in nav_buttons)
        tail = "".join(f'<button type="button" id="sv-x-{k}" title="{esc(t)}" aria-label="{esc(t)}">{esc(s)}</button>'
                       for k, s, t in after)
    else:
        tail = ""
    return (f'<div class="sv-x-bar" role="toolbar" aria-label="{esc(play_label)}">{nav}'
            f'<button type="button" class="sv-x-primary" id="{prefix}play" aria-pressed="false">'
            f'{esc(play_label)}</button>'
            f'{tail}<label>speed <select id="{prefix}speed" aria-label="playback speed">{options}</select></label>'
            f'<input type="range" id="{prefix}scrub" min="0" max="0" value="0" aria-label="position">'
            f'<span class="sv-x-pos" id="{prefix}pos"></span></div>')


def _meta(spec: Trace | None, std: Trace | None, source: str) -> str:
    run = spec or std
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    where = f" · recorded on {run.device}" if run and run.device else ""
    return (f'<section class="sv-x-prompt"><div class="sv-x-k">Prompt</div>'
            f'<pre class="sv-x-prompt-text">{esc(run.prompt if run else "")}</pre>'
            f'<div class="sv-x-src">{esc(source)}{esc(where)} · exported {esc(when)}</div></section>')


def page_data(spec: Trace | None, std: Trace | None) -> tuple[dict[str, Any], list[RoundFrame], RaceFrames]:
    """What the page's script plays: the fragment pool, the rounds' frames, the race's frames, the plots.
    A frame is a list of fragment indices, stored as edits of the frame before it (export_frames.delta)."""
    pool = FramePool()
    frames = round_frames(spec)
    race = race_frames(spec, std)
    shown = deltas([pool.add(f.rounds) for f in frames])
    trees = deltas([pool.add(f.tree) for f in frames])
    data = {
        "rounds": [{"r": r, "t": t, "l": f.label, "n": f.round, "s": round(f.seconds, 4)}
                   for f, r, t in zip(frames, shown, trees)],
        "race": {"frames": deltas([pool.add(h) for h in race.frames]), "times": [round(t, 4) for t in race.times],
                 "step": RACE_STEP_S, "speed": race.speed},
        "nRounds": len(spec.rounds) if spec else 0,
        "plots": [{"id": f"sv-x-plot-{name}", "fig": json.loads(fig.to_json())}
                  for name, fig in run_figures(spec, std)],
    }
    data["pool"] = pool.fragments
    return data, frames, race


def export_page(spec: Trace | None, std: Trace | None, *, source: str = "a specviz run",
                css: str | None = None) -> str:
    """The whole standalone page for a race (either trace may be None, not both)."""
    if spec is None and std is None:
        raise ValueError("nothing to export: the recording holds no run")
    data, frames, _ = page_data(spec, std)
    summary = spec.summary() if spec else std.summary()
    metrics = V.metrics_html(summary, gamma=spec.gamma if spec else 0, figures=race_figures(spec, std))
    last = frames[-1]
    tree_run = is_tree_run(spec)
    plots = "".join(f'<div class="sv-x-plot" id="{esc(p["id"])}"></div>' for p in data["plots"])
    intro = ("A recorded run of speculative decoding, exported from specviz as one page: a small <b>draft</b> "
             "model guesses tokens, the big <b>target</b> model checks them all in one pass. Press <b>▶ Play</b> "
             "to watch it round by round (space: play or pause; ← →: step), or replay the race.")
    body = (
        '<main class="sv-export">'
        f'<div class="sv-header"><h1>specviz</h1><p>{intro}</p></div>'
        f"{_meta(spec, std, source)}"
        f'<div id="sv-legend">{V.legend_html(spec)}</div>'
        '<section class="sv-x-live" aria-label="Rounds"><h2>Rounds</h2>'
        f'{_bar("sv-x-", "▶ Play", steps=True)}'
        f'<div id="sv-status"><div class="sv-status sv-status-info" id="sv-x-status" aria-live="polite">'
        f'{esc(last.label)}</div></div>'
        f'<div id="sv-rounds">{last.rounds}</div>'
        f'<div id="sv-tree">{live_tree(spec) if tree_run else ""}</div></section>'
        '<section class="sv-x-live" aria-label="The race"><h2>The race</h2>'
        f'{_bar("sv-x-race-", "↻ Replay the race in real time", steps=False)}'
        f'<div id="sv-race">{V.race_html(spec, std)}</div></section>'
        '<section aria-label="Numbers and charts"><h2>Numbers and charts</h2>'
        f'<div id="sv-metrics">{metrics}</div>'
        f'<div class="sv-x-plots">{plots}</div></section>'
        '<footer class="sv-x-foot">Exported by specviz (“Download as a page”). Everything is in this one file: '
        'it works offline, without a server.</footer></main>'
        '<script>if (window.matchMedia && matchMedia("(prefers-color-scheme: dark)").matches) '
        'document.body.classList.add("dark");</script>'
        f"<script>{plotly_js()}</script>"
        f'<script type="application/json" id="sv-x-data">{_json_for_script(data)}</script>'
        f"<script>{PLAYER_JS.read_text(encoding='utf-8')}</script>"
    )
    prompt = " ".join((spec or std).prompt.split())
    title = f"specviz · {prompt[:60]}{'…' if len(prompt) > 60 else ''}" if prompt else f"specviz · {source}"
    page = V.standalone_page(body, title, css=(load_css() if css is None else css) + PAGE_CSS)
    # A lone surrogate cannot be written as UTF-8 (loading already replaces them; a live run might not).
    return re.sub("[\ud800-\udfff]", "\ufffd", page)


__all__ = ["PAGE_CSS", "export_page", "page_data", "plotly_js", "run_figures"]
