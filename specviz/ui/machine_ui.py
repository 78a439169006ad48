"""The "This machine" tab's handler and the Live tab's "Target execution" setting.

The panel shows the execution probe of the pair the page's preset names: the one that pair loaded
with in this process (service.loaded_execution), else the one cached on disk for this machine
(hardware.probe.known) -- never loading a model to find out.  Without a probe it says why, and the
curves recorded on other machines still show.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..models.executions import WORDS
from ..models import PRESETS, TINY_PRESET, ModelError, resolve_preset
from ..serving.service import CUSTOM_PRESET, default_preset, default_target_exec, loaded_execution, offered_executions
from ..views import machine as M
from ..views.how import how_it_works
from ..views.machine_words import last_run_words, machine_text
from ..views.execution import exec_words
from .frames import MachineFrame
from .tabs import last_run_figures

log = logging.getLogger("specviz.app")

TINY_WHY = ("The tiny random pair (tests and demos) runs in float32 and is never probed: its timings say nothing "
            "about a real model's. Pick a real pair to see this machine's curves.")
EXEC_INFO = ("auto measures, once per machine, which execution runs speculation fastest here (see the This machine "
             "tab); changing it reloads the target")


def exec_choices() -> list[tuple[str, str]]:
    """(label, value) for the page's "Target execution" dropdown: auto, then what this device offers."""
    out = [("auto (measured on this machine)", "auto")]
    for name in offered_executions()[1:]:
        out.append((WORDS.get(name, name), name))
    return out


def exec_setting() -> dict[str, Any]:
    """The dropdown's arguments: the server's default (SPECVIZ_TARGET_EXEC) selected."""
    return dict(choices=exec_choices(), value=default_target_exec(), label="Target execution", info=EXEC_INFO)


def _probe_for(preset: Any) -> tuple[Any, str, str, str]:
    """(probe or None, execution the pair runs as or "", target name, why there is no probe)."""
    if preset is None or (isinstance(preset, str) and preset.strip().lower() in ("", "default")):
        preset = default_preset()
    if preset == CUSTOM_PRESET:
        name = CUSTOM_PRESET
    else:
        try:
            name = resolve_preset(str(preset))
        except ModelError:
            return None, "", "", "Pick a model pair on the Live tab to see how its target runs here."
    if name == TINY_PRESET:
        return None, "", "tiny random", TINY_WHY
    loaded = loaded_execution(name)
    if loaded is not None:
        execution, probe, target = loaded
        if probe is not None:
            return probe, execution, target, ""
        return None, execution, target, (
            f"The target ({target}) runs as **{exec_words(execution)}**, as set (SPECVIZ_TARGET_EXEC or the Live tab's "
            "*Target execution*), and no probe has measured this machine for it: nothing was timed. Set it to auto "
            "to measure which execution runs speculation fastest here.")
    cached = _cached_probe(name)
    if cached is not None:
        return cached, "", PRESETS[name].target.removeprefix("offline:"), ""
    return None, "", "", (
        f"The execution probe has not run on this server for *{name}* yet: it runs once, the first time the pair "
        "loads with *Target execution* auto (press Run on the Live tab), and is cached for this machine.")


def probe_of(preset: Any) -> Any:
    """This machine's probe of the preset's target (the loaded pair's, else the cached one; never loads a
    model), or None."""
    return _probe_for(preset)[0]


def _cached_probe(name: str) -> Any:
    """The probe cached on disk for this machine and the preset's target, if any (cheap: no model)."""
    if name not in PRESETS:
        return None
    try:
        from ..hardware.machine import this_machine
        from ..hardware.probe import known
        from ..models.pair import resolve_device, resolve_dtype

        dev = resolve_device(None)
        return known(this_machine(dev), PRESETS[name].target, resolve_dtype(None, dev))
    except Exception as exc:  # a cache we cannot read is no reason to break the tab
        log.warning("could not read the probe cache: %s", exc)
        return None


def how_text(preset: Any = None) -> str:
    """The "How it works" tab's markdown, its verify-cost sentence from this machine's probe of the preset's
    target (the page's default pair without one; never loads a model)."""
    probe = probe_of(preset)
    if probe is not None and not probe.curves and probe.measured:
        probe = None  # an empty probe says nothing
    return how_it_works(probe)


def compare_choices(recorded: list[M.RecordedMachine] | None = None) -> list[tuple[str, str]]:
    """(label, file stem) for "Compare with": each recorded machine's short name."""
    return [(r.choice_label, r.key) for r in (M.load_recorded() if recorded is None else recorded)]


def machine_views(preset: Any = None, compare: Any = None, folder: Path | None = None,
                  state: Any = None) -> MachineFrame:
    """The tab for the page's preset and the recorded machines ticked in ``compare`` (file stems); ``state``: the
    page's shown run, whose best γ (the figures every panel quotes) is set apart from the probe's."""
    recorded = M.load_recorded(folder)
    picked = set(compare or []) if isinstance(compare, (list, tuple, set)) else set()
    shown = [r for r in recorded if r.key in picked]
    probe, execution, target, why = _probe_for(preset)
    if probe is not None and not probe.curves and probe.measured:
        probe = None  # an empty probe says nothing
    fig = last_run_figures(state)
    spec = (state or {}).get("spec") if fig is not None else None
    last = last_run_words(fig, spec.gamma if spec is not None else None)
    note = machine_text(probe, execution=execution, target=target, why_none=why, recorded=recorded, last=last)
    # Without curves of its own, the panel shows every recorded machine rather than an empty plot.
    plot = M.verify_cost_figure(probe, shown if (probe is not None and probe.curves) else (shown or recorded),
                                target=target)
    return MachineFrame(note=note, plot=plot)


__all__ = ["compare_choices", "exec_choices", "exec_setting", "how_text", "machine_views", "probe_of"]
