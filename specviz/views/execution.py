"""The pair line's words for how the target executed and on which machine.

"target: int8 (per-channel weights, per-token activations; batch-invariant) on AMD EPYC 7B13,
AVX2 (no native bf16), 2 threads" -- from a loaded pair (:func:`pair_exec_line`) or from a trace's
``models`` (:func:`trace_exec_line`: ``target_exec`` and ``machine``, which recordings made before
the executions were named lack).  Plain text: the callers escape it.  Importing this module
imports no torch (the views do not); spelling out an execution imports specviz.hardware.
"""

from __future__ import annotations

import re
from typing import Any

_TORCH = re.compile(r"\s*\(torch [^)]*\)\s*$")


def exec_words(execution: str, weights: str = "") -> str:
    """An execution in words ("int8 (per-channel weights, …)"); an unknown name as it is.  ``weights``
    "gguf": an int8 target on its GGUF's matrices as stored (ModelPair.target_weights)."""
    from ..models.executions import Q4K_WORDS, WORDS  # here: the views import no torch until a name is needed

    if execution == "int8" and weights == "gguf":
        return Q4K_WORDS
    return WORDS.get(execution, execution)


def short_machine(label: str) -> str:
    """A machine label without its trailing "(torch 2.x)" (the panel keeps it; the pair line need not)."""
    return _TORCH.sub("", label or "").strip()


def precision_cost(execution: str) -> str:
    """What ``execution`` costs against the bf16 target, from the shipped measurement
    (assets/hardware/fidelity-<exec>.json, made by specviz.hardware.fidelity); "" when there is none."""
    if not execution or execution.startswith(("bf16", "fp32")):
        return ""
    from ..hardware.fidelity import load

    doc = load(execution)
    if not doc:
        return ""
    return (f"vs the bf16 target: mean TV {doc['mean_tv']:.3f} a position, greedy tokens agree "
            f"{100 * doc['greedy_agree']:.0f}% on the shipped prompts")


def exec_line(execution: str, machine: str, *, recorded: bool = False, how: str = "", weights: str = "") -> str:
    """"target: <execution> on <machine>" ("…, recorded on <machine>" for a recording), then ``how``
    it was chosen when given, and what a lower precision costs against bf16 (when measured: int8's own
    rows were; its GGUF's matrices, ``weights`` "gguf", were not)."""
    words = exec_words(execution, weights) if execution else "execution unknown"
    where = short_machine(machine)
    line = f"target: {words}" + (f", recorded on {where}" if recorded and where else f" on {where}" if where else "")
    notes = "; ".join(n for n in (how, "" if weights else precision_cost(execution)) if n)
    return f"{line} ({notes})" if notes else line


def chosen_how(execution: str, probe: Any) -> str:
    """How a pair's execution was chosen, from its probe (hardware.probe.Probe or None)."""
    if probe is None:
        return "as set, nothing measured" if execution else ""
    if getattr(probe, "after_serving", False):
        return "the one execution of its GGUF's blocks here, measured once the page is served"
    if not getattr(probe, "measured", True):
        return "chosen from the CPU's features: the machine was busy, nothing measured"
    if getattr(probe, "choice", None) == execution:
        return "chosen by measuring this machine"
    return f"as set; the probe here would choose {getattr(probe, 'choice', '?')}"


def pair_exec_line(pair: Any) -> str:
    """The line for a loaded pair (specviz.models.ModelPair): its execution, machine and how the
    execution was chosen.  The tiny random pair (no execution, no probe) names its dtype."""
    execution = getattr(pair, "target_exec", "") or ""
    probe = getattr(pair, "probe", None)
    if probe is not None and probe.machine.get("label"):
        machine = str(probe.machine["label"])
    else:
        from ..hardware.machine import this_machine

        machine = this_machine(pair.device).describe()
    if not execution:
        dtype = str(getattr(pair, "dtype", "")).removeprefix("torch.")
        return f"target: {dtype or 'as loaded'} on {short_machine(machine)}"
    return exec_line(execution, machine, how=chosen_how(execution, probe), weights=getattr(pair, "target_weights", "") or "")


OLDER = "this recording is older: it does not say how the target ran or on which machine"


def trace_exec_line(trace: Any, *, recorded: bool = False, brief: bool = False) -> str:
    """The line for a trace (live or loaded): from its ``models``' "target_exec" and "machine".  A
    recording from before those keys says what it has (the dtype and device) and that the rest was
    not recorded; "" without a trace.  ``brief``: the execution's name and the machine only
    ("target: int8 on AMD EPYC 7B13, …"), for the places beside the one that spells it out (the page
    said the int8 sentence, mean TV and all, three times)."""
    if trace is None:
        return ""
    models = getattr(trace, "models", None) or {}
    execution, machine = models.get("target_exec") or "", models.get("machine") or ""
    dtype, device = models.get("dtype") or "", getattr(trace, "device", "") or ""
    weights = models.get("target_weights") or ""
    if execution or machine:  # the tiny pair names no execution: its dtype is what ran
        if brief:
            where = short_machine(machine)
            line = f"target: {execution or dtype or 'execution unknown'}" + (" (its GGUF's matrices as stored)" if weights == "gguf" else f" ({weights} weights)" if weights else "")
            return line + ((f", recorded on {where}" if recorded else f" on {where}") if where else "")
        return exec_line(execution or dtype, machine, recorded=recorded, weights=weights)
    where = (f", recorded on {device}" if recorded else f" on {device}") if device else ""
    line = f"target: {dtype or 'dtype unknown'}{where}"
    return line if brief else f"{line} ({OLDER})"


__all__ = ["chosen_how", "exec_line", "exec_words", "pair_exec_line", "precision_cost", "short_machine",
           "trace_exec_line"]
