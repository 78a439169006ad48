"""The trace: plain data describing one decoding run, round by round.

A trace is what the engine produces and what every view consumes.  It holds
no tensors and no model references, so it can be saved as JSON, loaded on a
laptop without any model, and rendered exactly as it was recorded.

Notation (as in Leviathan et al. 2023): p = target distribution, q = draft
distribution.  Chen et al. and Yin et al. swap the two letters.

JSON schema (``SCHEMA_VERSION`` 3; versions 1 and 2 load with the new fields at defaults)::

    {
      "schema": "specviz.trace", "version": 3,
      "kind": "speculative" | "standard",
      "prompt": str,                 # the user's prompt (before chat template)
      "prompt_tokens": int,          # tokens fed to the models
      "settings": {gamma, epsilon, variant ("opt"|"uno"), temperature, top_k,
                   top_p, max_new_tokens, seed, drafter, policy, tau,
                   branches, tree_nodes, tree_mode, rule},  # branches..tree_mode: the tree drafter only;
                                     # rule: "token" | "block" | "match" (chains; absent before version 3)
                                     # specviz.core.settings.DecodeSettings; gamma is the maximum
                                     # draft length under a dynamic policy
      "models": {"preset": str, "draft": str, "target": str, "drafter": str},
      "device": str,                 # "cpu", "cuda:0 (NVIDIA H100)", ...
      "stop_reason": "eos" | "max_new_tokens" | "stopped" | "time_limit" | "error",
                                     # time_limit: the job's wall-time budget ran out
      "t_prefill": float,            # seconds spent filling the KV caches with the prompt
      "t_total": float,              # wall seconds from start to last token
      "draft_prefill": float, "target_prefill": float,
      "t_tracing": float,            # seconds of tracing-only work (statistics, token texts)
      "timing": Timing | null,       # how the race was timed, whether its clocks hold (specviz.trace.timing;
                                     # absent before the interleaved race)
      "rounds": [Round, ...],
      "summary": {...}               # derived (see Trace.summary); ignored on load
    }

    Round = {
      "index": int,                  # 0-based
      "n_before": int,               # tokens generated before this round
      "draft": [{"id", "text", "q", "conf", "p", "h"}],  # drafted tokens x_i with q_i(x_i), the drafter's
                                     # temperature-1 probability of x_i, p_i(x_i) and block verification's
                                     # h_i (every drafted token, verified or not: the "same draft, three
                                     # rules" comparison, specviz.core.rules); [] for standard decoding
      "draft_stop": str,             # why drafting stopped: limit, budget, confidence, cost, eos,
                                     # nodes (a tree's node budget), exhausted (the drafter had no
                                     # more), none (nothing drafted)
      "positions": [Position],       # verified positions: accepted ones, then the rejected one
      "extra": {"id", "text", "kind", "p"} | null,
                                     # kind: "correction" (sampled from the residual),
                                     #       "bonus" (all drafts accepted, sampled from p_{γ+1}),
                                     #       "target" (standard decoding: sampled from p)
      "emitted": [{"id", "text", "origin"}],  # origin: "accepted" | "correction" | "bonus" | "target"
      "t_start", "t_draft", "t_verify", "t_end": float,  # seconds; t_start/t_end since run start
      "draft_forwards": int,         # draft-model forward passes in this round
      "target_forwards": int,        # target forward passes in this round (1)
      "tree": RoundTree              # only in rounds of the tree drafter (absent otherwise)
    }

    RoundTree = {                    # a token tree verified in one target pass (specviz.drafters.tree.structure)
      "mode": "iid" | "best-first",  # i.i.d. draft sequences (q_j = q) or top-k children (q_j one-hot)
      "nodes": [{"id", "text", "parent", "depth", "q", "conf", "draws"}],
                                     # creation order, parents first; parent -1 = the last emitted
                                     # token; q: q(x) at the parent; draws: i.i.d. draws on this node
      "visits": [{"node", "reject_prob", "tv", "tries": [{"node", "q", "r", "b", "u", "accepted", "picture"}]}],
                                     # the rule at each node of the accepted path (node -1 = root),
                                     # children in the order tried: q = q_j(x), r = r(x) before the
                                     # try, b = min(1, r/q), u the uniform draw; reject_prob =
                                     # P(every child tried there is rejected), tv = TV(p, q) there
                                     # picture (version 3): {"ids", "text", "p", "r", "q", "res"} over
                                     # the top tokens by max(r, q): res = norm(max(0, r − q_j))
      "path": [int],                 # the accepted nodes, root to deepest
      "fed": int,                    # tokens the verify pass fed (the uncached suffix + all nodes)
      "t_forward": float             # seconds of the target's tree forward pass alone
    }

    A tree round also fills the chain fields, so every metric reads it unchanged:
    "draft" and "positions" hold the accepted path (one position per visited node,
    from the accepted try, or the last try where every child was rejected) and
    "emitted" the path's tokens and the correction or bonus.

    Position = {
      "i": int,                      # 1-based position in the round
      "q": float, "p": float,        # q_i(x_i), p_i(x_i) after temperature/top-k/top-p
      "b": float,                    # acceptance probability min(1, (p + ε) / q)
      "u": float,                    # the uniform draw; accepted iff u < b
      "accepted": bool,
      "reject_prob": float,          # r = 1 − Σ_x q(x) b(x), over the whole vocabulary
      "tv": float,                   # TV(p_i, q_i)
      "bias": float,                 # TV(A_i, p_i), A = q·b + r·P (P = residual or p for UNO)
      "picture": Picture | null      # version 3 (specviz.core.picture): what the acceptance picture draws
    }

    Picture = {"ids": [int], "text": [str], "p": [float], "q": [float], "res": [float],
               "rest_p": float, "rest_q": float, "p1": [float] | null, "q1": [float] | null}
                                     # the top tokens by max(p, q) (with the drafted token and the
                                     # correction), p and q there, the correction's distribution there
                                     # (token: norm(max(0, p − q)); block: norm(max(0, w·p − q)); match: p
                                     # without x), the mass elsewhere; greedy runs: temperature-1 beliefs

Drafted tokens after the first rejection are never verified: they have no
Position and are shown as discarded.

This module is the data model only.  Loading (`trace_from_dict`, `trace_from_json`, `load_recording` in
specviz.trace.recording) checks every rule the views rely on, with pydantic (specviz.trace.schema): strict types, finite and bounded numbers, token ids
below 2**31, positions numbered 1…k with only the last one rejected, rounds numbered in order with
consistent n_before, at most γ drafts; lone surrogates in text become U+FFFD.  A file loads whole
or not at all, with a message saying where ("speculative.rounds[3].positions[1].i: ...").
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from ..core.settings import DRAFT_STOPS as POLICY_DRAFT_STOPS
from ..core.settings import DecodeSettings
from .summary import Summary, summarize
from .timing import Timing
from .tree import RoundTree

SCHEMA_NAME = "specviz.trace"
SCHEMA_VERSION = 3  # 2: draft "conf", round "draft_stop", settings drafter/policy/tau; 3: rule, draft "p", "h"
READ_VERSIONS = (1, 2, 3)  # older recordings load with the new fields at their defaults
DRAFT_STOPS = ("", *POLICY_DRAFT_STOPS)  # "" in recordings made before the reason was kept
MAX_ROUNDS = 20_000

ORIGINS = ("accepted", "correction", "bonus", "target")
EXTRA_KINDS = ("correction", "bonus", "target")
RUN_ENDS = ("eos", "max_new_tokens", "stopped", "time_limit", "error")  # why a run ended (Trace.stop_reason); time_limit: the job's wall-time budget


class TraceError(ValueError):
    """A trace file or object that is not a valid specviz trace."""


@dataclass
class DraftToken:
    id: int
    text: str
    q: float
    conf: float | None = None  # the drafter's own probability of the token at temperature 1
    p: float | None = None  # p_i(x_i), the target's probability of it (version 3; None: not verified)
    h: float | None = None  # block verification's h_i for this draft (version 3)


@dataclass
class Picture:
    """What the acceptance picture draws at one verified position (version 3; specviz.core.picture):
    the top tokens by max(p, q), always with the drafted token and the correction drawn there."""

    ids: list[int]
    text: list[str]
    p: list[float]  # p(x) at these ids, after temperature / top-k / top-p (one-hot under greedy)
    q: list[float]  # q(x) likewise
    res: list[float]  # the distribution a correction at this position is drawn from, at these ids
    rest_p: float = 0.0  # p's mass outside ids
    rest_q: float = 0.0
    p1: list[float] | None = None  # greedy runs: the target's own temperature-1 beliefs at these ids
    q1: list[float] | None = None  # greedy runs: the draft's (None for a drafter without a distribution)


@dataclass
class Position:
    i: int
    q: float
    p: float
    b: float
    u: float
    accepted: bool
    reject_prob: float
    tv: float
    bias: float
    picture: Picture | None = None  # version 3: the acceptance picture's numbers


@dataclass
class Token:
    id: int
    text: str
    origin: str  # one of ORIGINS


@dataclass
class Extra:
    id: int
    text: str
    kind: str  # one of EXTRA_KINDS
    p: float


@dataclass
class Round:
    index: int
    n_before: int
    draft: list[DraftToken] = field(default_factory=list)
    positions: list[Position] = field(default_factory=list)
    extra: Extra | None = None
    emitted: list[Token] = field(default_factory=list)
    t_start: float = 0.0
    t_draft: float = 0.0
    t_verify: float = 0.0
    t_end: float = 0.0
    draft_forwards: int = 0
    target_forwards: int = 1
    draft_stop: str = ""  # why drafting stopped: one of specviz.core.settings.DRAFT_STOPS ("" in old recordings)
    # Prompt tokens this round's target pass also fed: the target's prefill, merged into the first pass
    # (as transformers' generate does) instead of a pass of its own; 0 for every other round.
    prompt_fed: int = 0
    tree: RoundTree | None = None  # the token tree of a tree-drafter round (None for a chain round)

    @property
    def tree_size(self) -> int:
        """Draft tokens the target verified in this round's tree (0 for a chain round)."""
        return len(self.tree.nodes) if self.tree is not None else 0

    @property
    def n_accepted(self) -> int:
        return sum(1 for pos in self.positions if pos.accepted)

    @property
    def rejected_at(self) -> int | None:
        """1-based index of the rejected draft position, or None."""
        for pos in self.positions:
            if not pos.accepted:
                return pos.i
        return None

    def status(self, i: int) -> str:
        """Status of drafted token i (1-based): accepted, rejected or discarded."""
        if i <= len(self.positions):
            return "accepted" if self.positions[i - 1].accepted else "rejected"
        return "discarded"


@dataclass
class Trace:
    kind: str  # "speculative" | "standard"
    prompt: str
    prompt_tokens: int
    settings: DecodeSettings
    models: dict[str, str]
    device: str
    rounds: list[Round] = field(default_factory=list)
    stop_reason: str = "max_new_tokens"
    t_prefill: float = 0.0
    t_total: float = 0.0
    draft_prefill: float = 0.0
    target_prefill: float = 0.0
    t_tracing: float = 0.0  # seconds spent on tracing-only work (statistics, token texts)
    timing: Timing | None = None  # how the race was timed and whether its clocks hold (trace.timing)

    # ---- derived quantities -------------------------------------------------

    @property
    def tokens(self) -> list[Token]:
        return [tok for rnd in self.rounds for tok in rnd.emitted]

    @property
    def text(self) -> str:
        return "".join(tok.text for tok in self.tokens)

    @property
    def n_tokens(self) -> int:
        return sum(len(rnd.emitted) for rnd in self.rounds)

    @property
    def gamma(self) -> int:
        return self.settings.gamma

    def token_times(self) -> list[tuple[float, int]]:
        """(seconds since start, tokens so far) after each round: the tokens-vs-time curve."""
        out, n = [], 0
        for rnd in self.rounds:
            n += len(rnd.emitted)
            out.append((rnd.t_end, n))
        return out

    def summary(self) -> Summary:
        """Run totals and the metrics the views label (:class:`specviz.trace.summary.Summary`)."""
        return summarize(self)

    # ---- JSON ---------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        d = _plain(self)
        d = {"schema": SCHEMA_NAME, "version": SCHEMA_VERSION, **d}
        for r in d["rounds"]:  # chain rounds stay exactly as they were: no "tree" key
            if r.get("tree") is None:
                r.pop("tree", None)
        d["summary"] = _finite(self.summary().as_dict())
        return d

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False, allow_nan=False)


# ---- JSON: non-finite numbers of the summary become null ------------------------------------


_FIELDS: dict[type, tuple[str, ...]] = {}


def _plain(obj: Any) -> Any:
    """``dataclasses.asdict`` for a trace, 4x faster (0.3 s instead of 1.3 s for a 7 MB recording here):
    the trace holds only dataclasses, lists, tuples, dicts and immutable scalars, so nothing needs
    asdict's deep copy; anything else is still deep-copied."""
    kind = type(obj)
    if obj is None or kind in (int, float, str, bool):
        return obj
    names = _FIELDS.get(kind)
    if names is None and is_dataclass(obj):
        names = _FIELDS[kind] = tuple(f.name for f in fields(obj))
    if names is not None:
        return {name: _plain(getattr(obj, name)) for name in names}
    if kind is list or kind is tuple:
        return kind(_plain(v) for v in obj)
    if kind is dict:
        return {k: _plain(v) for k, v in obj.items()}
    return copy.deepcopy(obj)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj

