"""The run form: what Run, the sweeps and the /trace API send, as one typed value.

The page builds a `RunForm` once per event from its components
(``Slots(RunForm, ...).read(values)``); the API builds one from its
parameters.  Validation is `specviz.serving.service`'s, whatever the client sent.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

from ..core.settings import DecodeSettings
from ..serving import hosting
from ..serving.service import Request, check_request, check_target_exec, get_pair, prepare

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


@dataclass(frozen=True)
class RunForm:
    """The raw values of the Live tab's form (or the API's parameters), not yet validated."""

    preset: Any = None  # a preset name or id; "" / None: the default pair
    draft_id: Any = ""  # custom pair only
    target_id: Any = ""
    prompt: Any = ""
    gamma: Any = 5
    epsilon: Any = 0.0
    variant: Any = "opt"
    temperature: Any = 0.0
    top_p: Any = 1.0
    max_new_tokens: Any = 32
    seed: Any = 0
    drafter: Any = "model"
    policy: Any = "constant"
    tau: Any = 0.4
    branches: Any = 2  # the tree drafter only (γ is then the tree's depth)
    tree_nodes: Any = 16
    tree_mode: Any = "best-first"
    target_exec: Any = None  # how the target executes: "auto", "bf16", "int8"…; "" / None: the server's default
    rule: Any = "token"  # the chains' verification rule: "token", "block" or "match"

    def raw_settings(self) -> dict[str, Any]:
        """The decoding settings as sent, for DecodeSettings.checked."""
        skip = ("preset", "draft_id", "target_id", "prompt", "target_exec")
        return {k: v for k, v in asdict(self).items() if k not in skip}

    def check(self) -> tuple[str, DecodeSettings]:
        """The checks that need no model (InputError): run before loading one, so bad input fails fast."""
        checked = check_request(self.prompt, **self.raw_settings())
        self.execution()
        return checked

    def execution(self) -> str:
        """The target execution asked for, checked (InputError): the server's default when not given."""
        return check_target_exec(self.target_exec)

    def request(self, progress: Callable[[float, str], None] | None = None) -> Request:
        """Check the form, load the pair (reporting progress) and tokenise the prompt: InputError / ModelError."""
        self.check()
        pair = get_pair(self.preset, self.draft_id, self.target_id, progress=progress, target_exec=self.target_exec)
        return prepare(pair, self.prompt, **self.raw_settings())


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
