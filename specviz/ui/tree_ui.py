"""The token-tree parts of the page: the tree drafter's controls, the live tree, step mode.

Kept apart from live.py / app.py so a tree run's drawing is one module: the
handlers there call these and put the results in the same typed frames.
"""

from __future__ import annotations

import html
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterator

import gradio as gr

from ..core.rules import RULES
from ..core.settings import round_kind
from .form import RULE_HELP
from .frames import round_number
from ..trace import Round, Trace
from ..views import html as V
from ..views import tree_plots as TRP
from ..views.tree import tree_html, tree_mask_figure, tree_narration, tree_steps
# The tree panel itself is a view (the standalone export draws it too); re-exported for the page.
from ..views.tree_live import NO_TREE, WALK_STYLE, is_tree_run, last_tree_round, live_tree, walk_steps  # noqa: F401

# A tree round's verification walk is played step by step after its verify pass: each child tried,
# then the correction or bonus.  The engine does not wait for it: the walk plays between the engine's
# next updates (the tree being drafted meanwhile is not drawn), and what is left of it once decoding
# ends plays after the models are released.  A step every WALK_STEP_S, at most WALK_ROUND_MAX_S per
# round (faster steps for a long walk), and no more walks once a run has queued WALK_RUN_MAX_S of
# them (its later rounds show their verdict at once), so the page never lags far behind the run.
WALK_STEP_S = 0.3
WALK_ROUND_MAX_S = 1.5
WALK_RUN_MAX_S = 30.0

CHAIN_ONLY = "chain drafters only: the tree drafter's rule is exact (ε = 0) and corrects from the residual (OPT)"


def drafter_controls(drafter: Any, epsilon: Any = 0.0, rule: Any = "token") -> dict[str, Any]:
    """What the drafter and the verification rule change, as {name: component update}: the tree's own
    controls show for "tree"; ε and the variant, which neither the tree's rule nor block verification or
    exact match take, are locked at their exact values (validation would refuse anything else); the
    rule is the token rule for trees; γ becomes the tree's depth (`gamma_labels`)."""
    tree = round_kind(str(drafter)) == "tree"
    rule = "token" if tree or rule not in RULES else rule
    locked = CHAIN_ONLY if tree else f"the token-wise rule only (the {rule} rule is exact on its own)"
    return {
        "tree_row": gr.update(visible=tree),
        "epsilon": (gr.update(interactive=False, value=0, info=f"ε: {locked}") if tree or rule != "token"
                    else gr.update(interactive=True, value=epsilon, info="0 = exact; accept with min(1, (p+ε)/q)")),
        "variant": (gr.update(interactive=False, value="opt", info=f"UNO: {locked}") if tree or rule != "token"
                    else gr.update(interactive=True, info=None)),
        "rule": gr.update(interactive=not tree, value=rule,
                          info="trees: their own multi-candidate rule" if tree else RULE_HELP[rule]),
    }


def gamma_labels(drafter: Any, slider: dict[str, Any]) -> dict[str, Any]:
    """The γ slider's label and hint (from tabs.gamma_slider) when the tree drafter is picked."""
    if round_kind(str(drafter)) == "tree":
        if slider.get("label") == "Draft length γ":  # the constant policy: every tree this deep
            return {**slider, "label": "Tree depth γ", "info": "levels of the token tree (its longest path)"}
        return {**slider, "label": "Maximum tree depth γ",
                "info": "the policy stops growing the tree earlier, and may expand fewer nodes, when more "
                        "would not pay"}
    return slider


def step_tree(spec: Trace, rnd: Round) -> tuple[str, str]:
    """Step mode for a tree round: (narration of every step, the finished tree and the text so far)."""
    lines = "".join(f"<li>{html.escape(tree_narration(rnd, k))}</li>" for k in range(1, tree_steps(rnd) + 1))
    narration = V.narrate_html(rnd, spec) + f'<ol class="sv-tree-narration">{lines}</ol>'
    upto = [t for r in spec.rounds[: rnd.index + 1] for t in r.emitted]
    return narration, tree_html(rnd) + V.text_html(upto)


def mask_for(spec: Trace | None, idx: Any = None) -> Any:
    """The attention-mask heat map of round `idx` (1-based) if it is a tree round, else the last tree round's."""
    if not spec:
        return tree_mask_figure(None)
    rnd = None
    if idx and spec.rounds:
        i = round_number(idx, len(spec.rounds)) - 1
        rnd = spec.rounds[i] if i >= 0 and spec.rounds[i].tree is not None else None
    return tree_mask_figure(rnd or last_tree_round(spec))


def tree_figures(spec: Trace | None) -> tuple[Any, Any]:
    """(tree size per round, verify time vs nodes scored): blank figures for a chain run."""
    return TRP.tree_sizes(spec), TRP.tree_verify_scatter(spec)


# ---- the Theory tab's batch curve: measured points of the last i.i.d. tree runs ---------------

BATCH_HISTORY = 8  # tree runs remembered per browser session


def batch_point(spec: Trace | None) -> dict[str, Any] | None:
    """First-position rejection of an i.i.d. tree run: the share of its rounds where every one of
    the M drafts tried after the prefix was rejected (Yin et al.'s batch SD at one position).
    Best-first trees try top-k children, not i.i.d. draws, so they are not batch SD: None."""
    if not spec or spec.settings.drafter != "tree" or spec.settings.tree_mode != "iid":
        return None
    firsts = [r.tree.visits[0] for r in spec.rounds if r.tree is not None and r.tree.visits
              and r.tree.visits[0].node < 0 and r.tree.visits[0].tries]
    if not firsts:
        return None
    rejected = sum(not any(t.accepted for t in v.tries) for v in firsts)
    return {"M": spec.settings.branches, "rejected": rejected, "rounds": len(firsts)}


def remember_batch(history: Any, state: Any) -> list[dict[str, Any]]:
    """The session's last BATCH_HISTORY batch points, with the new run's added (if it is one)."""
    history = list(history or [])
    point = batch_point((state or {}).get("spec"))
    if point is not None:
        history = (history + [point])[-BATCH_HISTORY:]
    return history


# ---- the walks of a live tree run ---------------------------------------------------------------


@dataclass
class WalkStep:
    round: Round  # the finished tree round walked
    step: int  # its animation step (views.tree)
    i: int  # 1-based, of n
    n: int
    pace: float  # seconds this step stays up


@dataclass
class Walks:
    """The verification walks of a live tree run, queued as their rounds finish and shown at their
    pace.  `due` says whether a step should show now; the caller draws it between the engine's
    updates (never sleeping: the engine goes on), and `rest` plays what is left once decoding ended."""

    queue: deque[WalkStep] = field(default_factory=deque)
    queued_s: float = 0.0  # seconds of walks queued this run (WALK_RUN_MAX_S)
    next_at: float = 0.0  # perf_counter time the next step may show
    shown: WalkStep | None = None  # the step on screen

    def add(self, rnd: Round) -> None:
        steps = walk_steps(rnd)
        if not steps or self.queued_s >= WALK_RUN_MAX_S:
            return
        pace = min(WALK_STEP_S, WALK_ROUND_MAX_S / len(steps))
        self.queued_s += pace * len(steps)
        self.queue.extend(WalkStep(rnd, step, i, len(steps), pace) for i, step in enumerate(steps, 1))

    @property
    def active(self) -> bool:
        """A walk owns the tree panel: steps wait, or the last one shown is still up."""
        return bool(self.queue) or (self.shown is not None and time.perf_counter() < self.next_at)

    def due(self) -> WalkStep | None:
        """The next step, if its time has come (taken off the queue)."""
        if self.queue and time.perf_counter() >= self.next_at:
            self.shown = self.queue.popleft()
            self.next_at = time.perf_counter() + self.shown.pace
            return self.shown
        return None

    def rest(self) -> Iterator[WalkStep]:
        """The steps still queued, each at its time (sleeping between them)."""
        while self.queue:
            wait = self.next_at - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            step = self.due()
            if step is not None:
                yield step

    @staticmethod
    def status(step: WalkStep) -> str:
        return f"round {step.round.index + 1}: the target's verdict, step {step.i} of {step.n}"

    @staticmethod
    def tree(spec: Trace, step: WalkStep) -> str:
        return live_tree(spec, walk=step.step, walk_round=step.round.index)
