"""Decoding settings and their validation.

Every entry point (UI, API, bench) builds a `DecodeSettings` through
`DecodeSettings.checked(...)`, so bad input is refused with one clear message
on the server, whatever a client sends.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from .rules import RULE_LABELS, RULES

GAMMA_MAX = 16  # draft length with the constant policy
GAMMA_MAX_DYNAMIC = 32  # maximum draft length when a dynamic policy decides when to stop
MAX_NEW_TOKENS_MAX = 1024
SEED_MAX = 2**63 - 1
# The smallest temperature and top-p that sampling computes with: logits / 1e-40 overflow float32 (NaN
# after softmax), and a top-p under float32's smallest number rounds to 0 and drops every token.  Far
# below what anyone samples with (the page's sliders step by 0.05), far above where float32 fails.
TEMPERATURE_MIN = 1e-3
TOP_P_MIN = 1e-3
# The one map of variant labels: the UI shows the keys, everything else stores the values.
VARIANTS = {"Decoding-OPT (residual)": "opt", "Decoding-UNO (sample from p)": "uno"}
# Who drafts: the names of specviz.drafters.DRAFTERS (the registry, which imports torch, maps each to
# its label and class; a test checks that the two agree):
# Each drafter's round kind: a chain (k tokens, the token-wise rule) or a token tree (the engine's
# tree round).  The one place a run is known to be a tree run: see `round_kind`.
DRAFTER_ROUNDS = {"model": "chain", "prompt-lookup": "chain", "tree": "tree", "speculator": "chain", "hybrid": "chain"}
DRAFTER_NAMES = tuple(DRAFTER_ROUNDS)
# The drafters whose draft passes are the draft model's (a race's turns and its count-based speedup price them
# with the probe's draft step).
DRAFT_MODEL_DRAFTERS = ("model", "tree", "hybrid")
ROUND_KINDS = ("chain", "tree")


@dataclass(frozen=True)
class DraftStop:
    """Why a round stopped drafting (``Round.draft_stop``), in the page's two registers."""

    short: str  # the round's chip row
    sentence: str  # the narration and tooltips: "drafting stopped: <sentence>"


# The one list of draft-stop reasons: the engine and the policies set them, traces store the keys
# (old recordings: ""), the views say them.
DRAFT_STOPS: dict[str, DraftStop] = {
    "limit": DraftStop("γ reached", "reached the draft length γ"),
    "budget": DraftStop("token budget", "reached the token budget"),
    "confidence": DraftStop("low confidence", "the draft's confidence fell below τ"),
    "cost": DraftStop("not worth it", "one more draft token was not worth its cost"),
    "eos": DraftStop("end of text", "drafted an end-of-text token"),
    "nodes": DraftStop("node budget", "the tree reached its node budget"),
    "exhausted": DraftStop("nothing more", "the drafter had nothing more to propose"),
    "none": DraftStop("nothing drafted", "nothing drafted (a plain target step)"),
}


def stop_sentence(key: str, default: str = "") -> str:
    """The sentence for a draft-stop key ("" or unknown, as in old recordings: ``default``)."""
    stop = DRAFT_STOPS.get(key)
    return stop.sentence if stop else default


def stop_short(key: str, default: str = "") -> str:
    stop = DRAFT_STOPS.get(key)
    return stop.short if stop else default


def round_kind(drafter: str) -> str:
    """ "chain" or "tree": how the engine runs a round of this drafter (unknown names: "chain")."""
    return DRAFTER_ROUNDS.get(drafter, "chain")
# How many tokens a drafter proposes per round (see specviz.core.policy):
POLICIES = ("constant", "heuristic", "confidence", "adaptive")
# How the tree drafter grows its tree (specviz.drafters.tree.drafter): M i.i.d. draft sequences merged into a
# prefix tree (Yin et al.'s batch drafts, SpecInfer), EAGLE-2's best-first tree of top-k children, or
# M distinct children per expanded node sampled from q without replacement.
TREE_MODES = ("iid", "best-first", "unique")
BRANCHES_MAX = 8
TREE_NODES_MAX = 64


class SettingsError(ValueError):
    """An invalid setting; the message is shown to the user as is."""


def _show(value: Any) -> str:
    """A short, printable rendering of a client's value for an error message."""
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):  # str() of a very long int is slow, and refused past 4300 digits
        return str(value) if value.bit_length() <= 64 else "a huge integer"
    if isinstance(value, float):
        return repr(value)  # as given: 1.0000001 stays 1.0000001
    if isinstance(value, str):  # repr: control characters and lone surrogates come out escaped
        return repr(value[:40] + ("…" if len(value) > 40 else ""))
    return f"a {type(value).__name__}"


def parse_number(name: str, value: Any) -> float:
    if isinstance(value, bool):
        raise SettingsError(f"{name} must be a number, not {value!r}")
    try:
        x = float(value)
    except OverflowError:  # an integer too large for a float
        raise SettingsError(f"{name} is far out of range ({_show(value)})") from None
    except (TypeError, ValueError):
        raise SettingsError(f"{name} must be a number, not {_show(value)}") from None
    if not math.isfinite(x):
        raise SettingsError(f"{name} must be a finite number, not {_show(value)}")
    return x


def parse_integer(name: str, value: Any, lo: int, hi: int) -> int:
    """A whole number in [lo, hi].  Python ints are checked as ints (never through a
    float, which would round 2**53 + 1 and refuse 2**63 − 1); a float such as 3.0
    from a JSON client is accepted when it is whole."""
    if isinstance(value, bool):
        raise SettingsError(f"{name} must be a number, not {value!r}")
    if isinstance(value, str):  # "12" from a form or the CLI: parse as an int, exactly
        try:
            value = int(value.strip())
        except ValueError:
            pass  # "3.0", "abc": parse_number gives the message
    if isinstance(value, int):
        x = value
    else:
        f = parse_number(name, value)
        if f != int(f):
            raise SettingsError(f"{name} must be a whole number, not {_show(value)}")
        x = int(f)
    if x.bit_length() > 1024:  # beyond any float: the message cannot show it
        raise SettingsError(f"{name} is far out of range ({_show(value)})")
    if not lo <= x <= hi:
        raise SettingsError(f"{name} must be between {lo} and {hi}, not {_show(value)}")
    return x


def _valid(cls: Any, kw: dict[str, Any]) -> bool:
    try:
        cls.checked(**kw)
        return True
    except SettingsError:
        return False


def _policy_of(d: dict[str, Any]) -> dict[str, Any]:
    """γ's range depends on the policy: check γ together with it."""
    return {"policy": d["policy"]} if "policy" in d else {}


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    v = value.strip().lower() if isinstance(value, str) else None
    if v not in allowed:
        raise SettingsError(f"{name} must be one of {', '.join(allowed)}, not {_show(value)}")
    return v


@dataclass(frozen=True)
class DecodeSettings:
    gamma: int = 5  # draft length γ
    epsilon: float = 0.0  # over-acceptance ε (0 = exact)
    variant: str = "opt"  # "opt": sample corrections from the residual; "uno": from p
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    max_new_tokens: int = 64
    seed: int = 0
    drafter: str = "model"  # a name in DRAFTER_NAMES
    policy: str = "constant"  # a name in POLICIES; γ is the maximum draft length for the dynamic ones
    tau: float = 0.4  # the confidence policy stops drafting when q(x) of the token just drafted < τ
    # The tree drafter only (chain drafters ignore these); γ is the tree's depth:
    branches: int = 2  # M: i.i.d. draft sequences ("iid"), or children per expanded node and nodes expanded per depth ("best-first", "unique")
    tree_nodes: int = 16  # node budget: the most draft tokens in one tree
    tree_mode: str = "best-first"  # one of TREE_MODES
    rule: str = "token"  # the chain's verification rule, one of specviz.core.rules.RULES

    @classmethod
    def checked(cls, **kw: Any) -> "DecodeSettings":
        """Validate and normalise raw values (from a form, an API call or the CLI)."""
        unknown = set(kw) - set(cls.__dataclass_fields__)
        if unknown:
            raise SettingsError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        d = {**asdict(cls()), **{k: v for k, v in kw.items() if v is not None}}
        policy = _choice("draft-length policy", d["policy"], POLICIES)
        gamma = parse_integer("γ (draft length)", d["gamma"], 1, GAMMA_MAX if policy == "constant" else GAMMA_MAX_DYNAMIC)
        eps = parse_number("ε (over-acceptance)", d["epsilon"])
        if not 0.0 <= eps <= 1.0:
            raise SettingsError(f"ε (over-acceptance) must be between 0 and 1, not {_show(d['epsilon'])}")
        variant = d["variant"].strip() if isinstance(d["variant"], str) else ""
        variant = VARIANTS.get(variant, variant.lower())
        variant = {"decoding-opt": "opt", "decoding-uno": "uno"}.get(variant, variant)
        if variant not in VARIANTS.values():
            raise SettingsError(f"variant must be 'opt' or 'uno', not {_show(d['variant'])}")
        temp = parse_number("temperature", d["temperature"])
        if not 0.0 <= temp <= 5.0:
            raise SettingsError(f"temperature must be between 0 and 5, not {_show(d['temperature'])}")
        if 0.0 < temp < TEMPERATURE_MIN:
            raise SettingsError(f"temperature must be 0 (greedy) or at least {TEMPERATURE_MIN:g}, "
                                f"not {_show(d['temperature'])}")
        top_k = parse_integer("top-k", d["top_k"], 0, 1_000_000)
        top_p = parse_number("top-p", d["top_p"])
        if not 0.0 < top_p <= 1.0:
            raise SettingsError(f"top-p must be in (0, 1], not {_show(d['top_p'])}")
        if top_p < TOP_P_MIN:
            raise SettingsError(f"top-p must be at least {TOP_P_MIN:g} (1 = off), not {_show(d['top_p'])}")
        max_new = parse_integer("max new tokens", d["max_new_tokens"], 1, MAX_NEW_TOKENS_MAX)
        seed = parse_integer("seed", d["seed"], 0, SEED_MAX)
        drafter = _choice("drafter", d["drafter"], DRAFTER_NAMES)
        tau = parse_number("τ (confidence threshold)", d["tau"])
        if not 0.0 <= tau <= 1.0:
            raise SettingsError(f"τ (confidence threshold) must be between 0 and 1, not {_show(d['tau'])}")
        branches = parse_integer("branches (M)", d["branches"], 1, BRANCHES_MAX)
        tree_nodes = parse_integer("tree nodes (node budget)", d["tree_nodes"], 1, TREE_NODES_MAX)
        tree_mode = _choice("tree mode", d["tree_mode"], TREE_MODES)
        rule = d["rule"].strip() if isinstance(d["rule"], str) else d["rule"]
        rule = _choice("verification rule", RULE_LABELS.get(rule, rule) if isinstance(rule, str) else rule, RULES)
        if rule != "token":
            # Block verification and exact match are exact rules of their own: ε's over-acceptance and
            # UNO's corrections from p are variants of the token-wise rule.
            if eps != 0.0:
                raise SettingsError(f"ε (over-acceptance) applies to the token-wise rule only: set ε to 0 for "
                                    f"the {rule} rule")
            if variant != "opt":
                raise SettingsError(f"Decoding-UNO applies to the token-wise rule only, not to the {rule} rule")
            if drafter == "tree":
                raise SettingsError("the tree drafter verifies with its own multi-candidate rule: the verification "
                                    "rule applies to chain drafting only (choose 'token')")
        if drafter == "tree":
            # The tree's multi-candidate rule is exact only: ε's over-acceptance and UNO's
            # corrections from p are defined for a chain of drafts.
            if eps != 0.0:
                raise SettingsError("ε (over-acceptance) applies to chain drafting only: the tree drafter "
                                    "verifies exactly, so set ε to 0")
            if variant != "opt":
                raise SettingsError("the tree drafter samples corrections from the residual (Decoding-OPT); "
                                    "Decoding-UNO applies to chain drafting only")
        return cls(gamma, eps, variant, temp, top_k, top_p, max_new, seed, drafter, policy, tau, branches,
                   tree_nodes, tree_mode, rule)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DecodeSettings":
        """Settings as stored in a trace; keys older recordings lack take their defaults,
        keys this version does not know (such as dtype) are ignored."""
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        try:
            return cls.checked(**known)
        except SettingsError as exc:  # name the stored key, as a recording's reader knows it
            bad = next((k for k in known if not _valid(cls, {k: known[k], **_policy_of(known)})), None)
            raise SettingsError(f"{bad}: {exc}" if bad else str(exc)) from None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
