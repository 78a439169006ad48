"""What a UI handler returns: a typed frame, turned into ``{component: value}`` by the wiring.

A handler builds a frame dataclass (plain values, testable without Gradio's
Blocks) and sets only the fields it changes; the others stay ``SKIP``.
``Slots`` knows which component shows which field: ``slots.outputs`` is the
event's outputs list and ``slots.write(frame)`` the dict Gradio receives, with
the skipped fields left out (Gradio leaves an output alone when a returned
dict omits it).  The same class reads a form: ``slots.read(values, RunForm)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Generic, Mapping, TypeVar


class _Skip:
    """The "leave this output alone" marker."""

    _instance: "_Skip | None" = None

    def __new__(cls) -> "_Skip":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "SKIP"

    def __bool__(self) -> bool:
        return False


SKIP: Any = _Skip()


def round_number(value: Any, n: int) -> int:
    """A 1-based round (or step) number the page sent, as an int in 1..max(n, 1).

    The page's sliders and buttons send numbers, but an event's payload is whatever a client posts:
    NaN, ±inf, "abc", None, -5, 10**12 or a list must not end in int(nan) and a logged traceback.
    A number is truncated (2.9 is round 2) and clamped; anything that is not a finite number is round 1."""
    hi = max(int(n), 1)
    if isinstance(value, bool) or value is None:
        return 1
    if isinstance(value, str):
        text = value.strip()
        if len(text) > 40:  # no int() of a 100,000-digit string
            return 1
        try:
            value = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                return 1
    if isinstance(value, int):
        return min(max(value, 1), hi)
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        return 1
    if not math.isfinite(x):
        return 1
    return min(max(int(x), 1), hi)


def index_number(value: Any) -> int | None:
    """A 0-based index the page sent (a position picked), or None when it is not a whole, finite,
    not negative number (the views then show their default)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        value = value.strip()
        if not (value.isascii() and value.isdigit() and len(value) <= 9):
            return None
        return int(value)
    if isinstance(value, int):
        return value if 0 <= value < 2**31 else None
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return int(x) if math.isfinite(x) and 0 <= x < 2**31 else None


class Frame:
    """Base of the output frames: the fields that are set, by name."""

    def updates(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not SKIP}


@dataclass
class LiveFrame(Frame):
    """The Live tab's outputs (Run, Stop, loading a recording)."""

    status: Any = SKIP  # HTML of the status line
    legend: Any = SKIP  # HTML: the colour legend and what ran (drafter, policy)
    rounds: Any = SKIP  # HTML: the rounds panel
    race: Any = SKIP  # HTML: the two race columns
    state: Any = SKIP  # {"spec": Trace, "std": Trace} of the last run or recording
    metrics: Any = SKIP
    plot_pos: Any = SKIP  # acceptance by position
    plot_hist: Any = SKIP  # tokens per round
    plot_draft: Any = SKIP  # draft length vs accepted length per round
    plot_time: Any = SKIP  # draft and verify time per round
    plot_curve: Any = SKIP  # tokens vs time
    plot_speed: Any = SKIP  # measured vs theoretical speedup
    step: Any = SKIP  # the step-mode slider
    narration: Any = SKIP
    step_round: Any = SKIP
    export: Any = SKIP  # the exported recording's path
    tree: Any = SKIP  # HTML: the tree drafter's trees (empty for chain runs)
    tree_mask: Any = SKIP  # the attention mask of the selected / last tree round
    plot_tree_size: Any = SKIP  # nodes per tree round
    plot_tree_verify: Any = SKIP  # verify time vs nodes scored
    tree_mask_box: Any = SKIP  # the "Tree attention mask" accordion: shown only for a run with tree rounds
    tree_plots: Any = SKIP  # the row of the two tree plots: likewise


@dataclass
class TheoryFrame(Frame):
    note: Any = SKIP
    speedup: Any = SKIP
    tokens: Any = SKIP
    cost: Any = SKIP
    thm1: Any = SKIP


@dataclass
class MachineFrame(Frame):
    """The "This machine" tab: the probe's words and its verify-cost curves."""

    note: Any = SKIP  # Markdown
    plot: Any = SKIP  # verify time vs tokens fed


@dataclass
class SweepFrame(Frame):
    status: Any = SKIP
    gamma_plot: Any = SKIP
    eps_plot: Any = SKIP
    pareto: Any = SKIP
    tree_plot: Any = SKIP  # verify time vs tree nodes
    shootout_table: Any = SKIP  # HTML: the drafter shoot-out's table
    shootout_plot: Any = SKIP  # its chart
    shootout_runs: Any = SKIP  # {label: ui.store.Shown} of a fresh shoot-out's runs (for the Live tab)
    shootout_pick: Any = SKIP  # the dropdown of those runs


F = TypeVar("F")


class Slots(Generic[F]):
    """The components that show (or fill) the fields of one frame or form class, by field name."""

    def __init__(self, cls: type[F], **components: Any):
        names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
        missing, extra = set(names) - set(components), set(components) - set(names)
        if missing or extra:  # a wiring mistake: say which names are wrong
            raise TypeError(f"{cls.__name__} slots: missing {sorted(missing)}, unknown {sorted(extra)}")
        self.cls = cls
        self.by_name = {n: components[n] for n in names}

    @property
    def outputs(self) -> list[Any]:
        return list(self.by_name.values())

    @property
    def inputs(self) -> set[Any]:
        """For an event whose function takes one dict {component: value} (Gradio's set inputs)."""
        return set(self.by_name.values())

    def __getitem__(self, name: str) -> Any:
        return self.by_name[name]

    def write(self, frame: Frame) -> dict[Any, Any]:
        if not isinstance(frame, self.cls):
            raise TypeError(f"expected a {self.cls.__name__}, got a {type(frame).__name__}")
        out = {self.by_name[k]: v for k, v in frame.updates().items()}
        # Gradio reads an empty dict as one missing value ("didn't return enough output values"): a frame that
        # changes nothing skips its first component instead (a forged upload with no file, issue 62).
        return out or {next(iter(self.by_name.values())): {"__type__": "update"}}  # (gr.skip(), without Gradio)

    def read(self, values: Mapping[Any, Any]) -> F:
        return self.cls(**{n: values.get(c) for n, c in self.by_name.items()})
