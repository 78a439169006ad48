"""The frames of a standalone page: every moment of the Live tab's animation, drawn in Python.

A recorded run is played back as the Live tab draws it while decoding: each drafted token
appears (pending), the round takes its verdict, a tree grows depth by depth and its
verification walk plays step by step.  Every frame here is the HTML the page's own view
functions return at that moment (`rounds_html`, `live_tree`, `race_html`); the exported
page's script only swaps them in.  Nothing here loads a model or imports Gradio.

To keep the page small, frames are stored as indices into one pool of distinct fragments
(`FramePool`): a frame's HTML is cut just before each round row, tree, race column and text
token, and ``"".join`` of its fragments gives the view's HTML back exactly.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from dataclasses import dataclass, field

from ..trace import DraftToken, Round, Trace
from ..trace.tree import RoundTree
from . import html as V
from .tree_live import is_tree_run, live_tree, walk_steps

# Pacing, as the Live tab paces a live run (specviz.ui.live): at most ~16 updates a second, a
# tree's walk a step every 0.3 s and at most 1.5 s a round; the race replay draws every 0.1 s
# of wall time and takes at most 60 s (specviz.serving.replay.MAX_REPLAY_S).
MIN_FRAME_S = 0.06
WALK_STEP_S = 0.3
WALK_ROUND_MAX_S = 1.5
RACE_STEP_S = 0.1
MAX_REPLAY_S = 60.0
# A long run (more frames than this) shows each round once fully drafted instead of token by token (or
# depth by depth): drawing a frame redraws the panel's last 40 rounds, so a 1,000-token run would take
# minutes to export otherwise.  The shipped recordings have 70-200 frames.
MAX_FRAMES = 600

# Fragments start at these markers: each round row, token chip, tree and walk line, race column and its
# parts, text token.
_CUT = re.compile(r'<(?:div class="sv-(?:round[ "]|tree[ "]|tree-walk"|round-tail"|race-(?:col|stats"|sub"|bar")'
                  r'|stat")|span class="sv-(?:chip[ "]|tk[ "]|caret"|extra"))')


def cut(markup: str) -> list[str]:
    """`markup` cut before every marker: ``"".join(cut(m)) == m``."""
    starts = [m.start() for m in _CUT.finditer(markup)]
    bounds = [0, *(k for k in starts if k > 0), len(markup)]
    return [markup[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


class FramePool:
    """Distinct HTML fragments, each stored once; a frame is the list of its fragments' indices."""

    def __init__(self) -> None:
        self.fragments: list[str] = []
        self._index: dict[str, int] = {}

    def add(self, markup: str) -> list[int]:
        out = []
        for piece in cut(markup):
            k = self._index.get(piece)
            if k is None:
                k = self._index[piece] = len(self.fragments)
                self.fragments.append(piece)
            out.append(k)
        return out

    def html(self, indices: list[int]) -> str:
        return "".join(self.fragments[k] for k in indices)


def delta(prev: list[int], cur: list[int]) -> list[int | list[int]]:
    """`cur` as edits of `prev`: [a, b] copies prev[a:b], a bare index is new (see `undelta`).
    Consecutive frames share most fragments, so a frame costs about what changed."""
    where: dict[int, int] = {}
    for k, v in enumerate(prev):
        where.setdefault(v, k)
    ops: list[int | list[int]] = []
    j = 0
    while j < len(cur):
        a = where.get(cur[j])
        if a is None:
            ops.append(cur[j])
            j += 1
            continue
        n = 1
        while j + n < len(cur) and a + n < len(prev) and prev[a + n] == cur[j + n]:
            n += 1
        ops.extend([[a, a + n]] if n > 1 else cur[j:j + 1])  # one index is shorter as itself
        j += n
    return ops


def undelta(prev: list[int], ops: list[int | list[int]]) -> list[int]:
    """The inverse of `delta` (the page's script does the same)."""
    out: list[int] = []
    for op in ops:
        if isinstance(op, list):
            out.extend(prev[op[0]:op[1]])
        else:
            out.append(op)
    return out


def deltas(frames: list[list[int]]) -> list[list[int | list[int]]]:
    """Each frame as edits of the one before it (the first: of nothing)."""
    return [delta(frames[k - 1] if k else [], f) for k, f in enumerate(frames)]


@dataclass(frozen=True)
class RoundFrame:
    """One moment of the rounds panel (and the tree panel, for a tree run)."""

    rounds: str  # V.rounds_html at that moment
    tree: str  # the tree panel (live_tree): "" for a chain run
    label: str  # the status line, plain text
    round: int  # the round it shows (1-based; 0 before the first)
    seconds: float  # how long it stays up when played at the recorded speed


@dataclass(frozen=True)
class RaceFrames:
    """The race replayed from its recorded timestamps: race_html at `times` (seconds of the run),
    one frame every RACE_STEP_S of playback."""

    frames: list[str] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    speed: float = 1.0  # recorded seconds per second of playback (1: real time)


def replay_speed(total_s: float, max_s: float = MAX_REPLAY_S) -> float:
    """1 (real time) unless the run took longer than max_s: then as fast as fits (as serving.replay does)."""
    return max(1.0, total_s / max_s) if total_s > 0 else 1.0


def _depth(rnd: Round) -> int:
    return max((n.depth for n in rnd.tree.nodes), default=0) if rnd.tree is not None else 0


def _upto(trace: Trace, n: int) -> Trace:
    """The trace as it stood after its first n rounds (a shallow copy: the rounds are shared)."""
    part = copy.copy(trace)
    part.rounds = trace.rounds[:n]
    return part


def _drafting(rnd: Round, k: int) -> Round:
    """A chain round as the engine reports it after its k-th drafted token: not verified yet.
    Its drafting time so far is not recorded per token, so none is shown."""
    part = copy.copy(rnd)
    part.draft, part.positions, part.extra, part.emitted = rnd.draft[:k], [], None, []
    part.t_draft = part.t_verify = 0.0
    return part


def _growing(rnd: Round, depth: int) -> Round:
    """A tree round after its `depth`-th drafted level: the nodes that deep (renumbered, parents
    first, as the drafter's subtree is), no verdict; the chain fields show the tree's main line."""
    tree = rnd.tree
    keep = [k for k, n in enumerate(tree.nodes) if n.depth <= depth]
    new = {old: k for k, old in enumerate(keep)}
    nodes = [dataclasses.replace(tree.nodes[old], parent=new.get(tree.nodes[old].parent, -1)) for old in keep]
    line, at = [], -1
    while True:
        kid = next((k for k, n in enumerate(nodes) if n.parent == at), None)
        if kid is None:
            break
        line.append(kid)
        at = kid
    part = _drafting(rnd, 0)
    part.draft = [DraftToken(nodes[k].id, nodes[k].text, nodes[k].q, nodes[k].conf) for k in line]
    part.tree = RoundTree(tree.mode, nodes)
    return part


def round_frames(spec: Trace | None) -> list[RoundFrame]:
    """Every frame of the Live tab's rounds (and tree) panel for a recorded speculative run, in order;
    the last is the finished run as the page shows it after Run."""
    if spec is None:
        return [RoundFrame(V.rounds_html(None), "", "No speculative run in this recording.", 0, MIN_FRAME_S)]
    tree_run = is_tree_run(spec)
    n_rounds = len(spec.rounds)
    frames: list[RoundFrame] = []
    every = sum(1 + _depth(r) + len(walk_steps(r)) if r.tree is not None else 1 + len(r.draft)
                for r in spec.rounds) <= MAX_FRAMES  # every drafted token (or depth) its own frame

    def add(rounds: str, tree: str, label: str, round_no: int, seconds: float) -> None:
        frames.append(RoundFrame(rounds, tree, label, round_no, max(seconds, MIN_FRAME_S)))

    for i, rnd in enumerate(spec.rounds):
        before, after = _upto(spec, i), _upto(spec, i + 1)
        msg = f"Speculative decoding · round {i + 1} of {n_rounds}"
        gap = (spec.rounds[i + 1].t_start - rnd.t_end) if i + 1 < n_rounds else MIN_FRAME_S
        if rnd.tree is not None and rnd.tree.nodes:
            depth = _depth(rnd)
            for d in range(1 if every else depth, depth + 1):
                pending = _growing(rnd, d)
                add(V.rounds_html(before, pending_round=pending), live_tree(before, pending),
                    f"{msg} · drafting the tree: depth {d} of {depth}", i + 1,
                    rnd.t_draft / depth if d < depth else rnd.t_verify + (0 if every else rnd.t_draft))
            steps = walk_steps(rnd)
            pace = min(WALK_STEP_S, WALK_ROUND_MAX_S / len(steps)) if steps else 0.0
            for j, step in enumerate(steps):
                add(V.rounds_html(after), live_tree(after, walk=step),
                    f"{msg} · the target's verdict, step {j + 1} of {len(steps)}", i + 1, pace)
        elif rnd.draft:
            k_all = len(rnd.draft)
            for k in range(1 if every else k_all, k_all + 1):
                add(V.rounds_html(before, pending_round=_drafting(rnd, k)), live_tree(before) if tree_run else "",
                    f"{msg} · drafted {k}" + (" · verifying…" if k == k_all else ""), i + 1,
                    rnd.t_draft / k_all if k < k_all else rnd.t_verify + (0 if every else rnd.t_draft))
        add(V.rounds_html(after), live_tree(after) if tree_run else "",
            f"{msg} · {after.n_tokens} tokens", i + 1, gap)
    final = V.rounds_html(spec), live_tree(spec) if tree_run else ""
    if not frames or (frames[-1].rounds, frames[-1].tree) != final:
        add(*final, "", n_rounds, MIN_FRAME_S)
    last = frames[-1]
    frames[-1] = RoundFrame(last.rounds, last.tree, finished_label(spec), n_rounds, last.seconds)
    return frames


def finished_label(spec: Trace) -> str:
    s = spec.summary()
    alpha = f", α = {s.alpha:.2f}" if s.alpha is not None else ""
    return f"Done: {spec.n_tokens} tokens in {len(spec.rounds)} rounds{alpha}"


def race_frames(spec: Trace | None, std: Trace | None) -> RaceFrames:
    """The race replayed in real time from the recorded timestamps, as "↻ Replay the race" does:
    race_html at every RACE_STEP_S of playback, faster for a run longer than MAX_REPLAY_S."""
    runs = [t for t in (spec, std) if t is not None]
    if not runs:
        return RaceFrames()
    end = max(t.t_total for t in runs)
    speed = replay_speed(end)
    frames, times = [], []
    j = 0
    while True:
        t = min(j * RACE_STEP_S * speed, end)
        frames.append(V.race_html(spec, std, at_time=t))
        times.append(t)
        if t >= end:
            break
        j += 1
    return RaceFrames(frames, times, speed)


__all__ = ["FramePool", "RaceFrames", "RoundFrame", "cut", "delta", "deltas", "finished_label", "race_frames",
           "replay_speed", "undelta",
           "round_frames"]
