"""The run form: what Run, the sweeps and the /trace API send, as one typed value.

The page builds a `RunForm` (specviz.serving.jobs) once per event from its components
(``Slots(RunForm, ...).read(values)``); the API builds one from its parameters.  This module
holds what the page says about the form: the policies' and rules' help, what a recording puts back.
"""

from __future__ import annotations

from typing import Any

from ..core.settings import DecodeSettings
from ..serving import hosting
from ..serving.jobs import RunForm  # noqa: F401  (the form is the serving layer's; the page builds it)

# One line per draft-length policy (specviz.core.policy has the details), shown under the selector.
POLICY_HELP = {
    "constant": "always draft γ tokens (Leviathan et al.)",
    "heuristic": "transformers' schedule: 2 more after a round with every draft accepted, 1 fewer otherwise (≤ γ)",
    "confidence": "stop after a token the drafter gave a probability below τ (the token is still checked)",
    "adaptive": "stop when one more draft token is not worth its measured cost (time vs expected acceptance); "
                "for a tree: how deep and how wide it grows, and how many nodes the target checks",
}

# One line per verification rule (specviz.core.rules has the details), shown under the selector.
RULE_HELP = {
    "token": "keep x with probability min(1, p/q), position by position; correct from norm(max(0, p − q))",
    "block": "judge the whole draft jointly: never keeps fewer tokens on average, still exact",
    "match": "keep x only when the target's own sample is x (probability p(x)); at a mismatch emit that sample",
}


def form_duration(form: Any = None, **_: Any) -> int:
    """ZeroGPU seconds for a run of this form (the handlers' first argument)."""
    return hosting.run_duration(getattr(form, "max_new_tokens", None))


def form_sweep_duration(kind: Any = None, form: Any = None, **_: Any) -> int:
    return hosting.sweep_duration(max_new_tokens=getattr(form, "max_new_tokens", None))


# What a loaded recording puts back in the form, so that Run runs what is on screen: the prompt and
# every decoding setting the form has (a trace's settings are DecodeSettings; the form has no top-k).
FORM_FROM_TRACE = ("prompt", "gamma", "epsilon", "variant", "temperature", "top_p", "max_new_tokens", "seed",
                   "drafter", "policy", "tau", "branches", "tree_nodes", "tree_mode", "rule")


def form_values(trace: Any) -> dict[str, Any]:
    """{form field: value} of the run a trace recorded ({} for none)."""
    if trace is None:
        return {}
    s = trace.settings.as_dict()
    out = {name: s[name] for name in FORM_FROM_TRACE if name in s}
    if trace.prompt:
        out["prompt"] = trace.prompt
    return out


# The form's initial values where they differ from DecodeSettings' (the page starts as the first example sets it).
PAGE_DEFAULTS = {"temperature": 0.0, "gamma": 5, "max_new_tokens": 48, "seed": 0}


def page_default(name: str) -> Any:
    """The form's default for a setting: PAGE_DEFAULTS', else DecodeSettings'."""
    return PAGE_DEFAULTS[name] if name in PAGE_DEFAULTS else getattr(DecodeSettings, name)


def example_form(example: dict) -> dict[str, Any]:
    """{form field: value} as picking ``example`` sets the form: its prompt and the settings it names, and every
    other setting of FORM_FROM_TRACE back to the page's default (ε to 0, the draft model, the constant policy,
    the token-wise rule, top-p 1…), so an ε or a policy left from the last run never carries over silently and
    everyone who picks it sends the same request (served from the recording cache)."""
    out = {name: example.get(name, page_default(name)) for name in FORM_FROM_TRACE if name != "prompt"}
    return {"prompt": example["prompt"], **out}


def example_label(prompt: Any, examples: list[dict]) -> str | None:
    """The "Example prompts" dropdown's value for a form showing ``prompt``: the label of the example whose
    prompt it is, else None (blank: a custom prompt, an uploaded recording's, a run of another text)."""
    return next((e["label"] for e in examples if e.get("prompt") == prompt), None) if prompt else None
