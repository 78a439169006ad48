"""A wall-time budget for sweeps, which run many decodes in one event.

A run's own budget (`service.job_seconds`) covers one race; a sweep is a dozen or more of them
under the model lock, so it gets a budget of its own (env SPECVIZ_SWEEP_SECONDS).  When it is
spent the sweep stops cleanly: the decode in progress stops at its next round boundary and is
dropped (a point cut short is not comparable with the others), the points already finished stay
on the plot, and the page says why it stopped.  Any sweep uses it the same way:

    budget = sweep_budget()
    for item in within(items, budget):       # the sweep's points (sizes, drafters, γ values, ...)
        trace = speculative_decode(..., should_stop=budget)
        if trace.stop_reason == "stopped":   # cut short by the budget: not a point
            break
        ...
    if budget.ran_out:
        note = time_limit_note(budget, n_points)

`budget.ran_out` is true only when the budget actually stopped something (a decode or the next
point), never merely because the last point finished after the deadline.

A sweep shares the models with the room: its budget, made with the live gate (`sweep_budget(gate=GATE)`),
gives the gate to the live runs waiting there before each point (`point_boundary`, which `within`
calls), so a live run waits behind at most one point of a sweep; the time given away is not the
sweep's (its deadline moves by as much).  A sweep that walks its points without `within` calls
`point_boundary(budget)` before each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence, TypeVar

from .envvars import env_number
from .service import JobBudget

# Default: a γ or ε sweep of 64 new tokens on the default pair takes 2-3 minutes on a 2-core CPU,
# one of 256 tokens about 8; past 10 minutes the model lock is better given back to the room.
SWEEP_SECONDS = 600.0
T = TypeVar("T")


def sweep_seconds() -> float:
    return env_number("SPECVIZ_SWEEP_SECONDS", SWEEP_SECONDS)


@dataclass
class SweepBudget(JobBudget):
    """A sweep's budget, and the gate it holds (None: no gate to share, e.g. a script's sweep)."""

    gate: Any = None
    yielded_s: float = 0.0  # seconds given to live runs between points

    def between_points(self) -> None:
        """Let the live runs waiting at the gate go first; their time is not the sweep's."""
        if self.gate is None:
            return
        waited = self.gate.yield_to_live()
        if waited > 0:
            self.deadline += waited
            self.yielded_s += waited


def sweep_budget(seconds: float | None = None, gate: Any = None) -> SweepBudget:
    """The budget of one sweep, starting now (`seconds` overrides the environment, for callers and tests);
    `gate`: the live gate the sweep holds (its points then give way to waiting live runs)."""
    return SweepBudget(sweep_seconds() if seconds is None else seconds, gate=gate)


def point_boundary(budget: Any) -> None:
    """Between two points of a sweep: the live runs waiting at the gate go first (a budget without a gate,
    or any other should_stop, does nothing)."""
    between = getattr(budget, "between_points", None)
    if callable(between):
        between()


def within(steps: Sequence[T], budget: Callable[[], bool]) -> Iterator[T]:
    """The sweep's steps (a list of what to measure) until the budget is spent.

    Checked before each step but the first starts, so a step that began always finishes (unless
    its decodes take `budget` as should_stop) and a sweep that finished is never called cut short.
    Before each step the live runs waiting at the gate go first (`point_boundary`)."""
    for k, step in enumerate(steps):
        if k and budget():
            return
        point_boundary(budget)
        yield step


def time_limit_note(budget: JobBudget, points: int) -> str:
    """What the page says when a sweep ran out of time."""
    return (f"**time limit reached** ({budget.seconds:g} s per sweep, `SPECVIZ_SWEEP_SECONDS`): the sweep stopped "
            f"early and shows the {points} point(s) it finished. Lower max new tokens on the Live tab for a full sweep.")
