"""The trace file schema, checked with pydantic: everything the views rely on.

A recording is data from anywhere (a hand-edited file, another version of specviz), and every
view draws straight from the dataclasses in `specviz.trace.model`.  So loading guarantees what drawing
assumes, and a file either loads whole or is refused with one message that says where
("speculative.rounds[3].positions[1].i: ..."):

- types are strict: no "7" for 7, no 7.0 for a token id, no true for a number; numbers finite;
- ranges: probabilities in [0, 1] (±1e-6 of rounding), seconds and counts not negative and
  bounded (so sums stay finite and integers fit plotly's 64 bits), token ids 0 ≤ id < 2**31,
  text of bounded length;
- structure: a round's positions are numbered 1…k in order and only the last can be rejected,
  there are no more positions than drafts nor more drafts than γ, and no more tokens emitted
  than accepted drafts plus the one extra token; rounds[k].index == k and n_before counts the
  tokens emitted before the round;
- text is encodable: lone surrogates (JSON escapes can carry them) become U+FFFD.

One pydantic model per dataclass with the same field names; `build()` returns the dataclass, so
the rest of specviz never sees pydantic.  A new optional field is one line here and one in the
dataclass (a nested one also gets its own model, like `ExtraIn`).
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, PlainValidator, ValidationError
from pydantic import model_validator
from pydantic_core import PydanticCustomError

from ..core.settings import DecodeSettings, SettingsError
from . import model as T
from .timing import RACE_HOWS, Timing
from .tree import parse_tree

MAX_TOKEN_ID = 2**31  # larger than any vocabulary; keeps ids in 32 bits
MAX_SECONDS = 1e6  # 11.6 days: far past any job's time budget, small enough that sums stay finite
MAX_COUNT = 10**6  # forward passes in one round
TEXT_LIMIT, PROMPT_LIMIT, NAME_LIMIT = 1000, 200_000, 500  # characters: a token, the prompt, a model name
PICTURE_MAX = 32  # tokens in one acceptance picture
PROB_SLACK = 1e-6  # float rounding around 0 and 1
_SURROGATE = re.compile("[\ud800-\udfff]")


def _rule(message: str, at: str = "") -> PydanticCustomError:
    """A broken rule; `at` continues the error's location below the model that found it."""
    return PydanticCustomError("specviz", "{message}", {"message": message, "at": at})


def _shown(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return "a huge integer"  # str() of a 10**309 is long, and refused past 4300 digits
    text = repr(value)
    return text if len(text) <= 42 else text[:40] + "…"


def _clean(text: str) -> str:
    return _SURROGATE.sub("\ufffd", text)


def _text(limit: int) -> Any:
    def check(value: str) -> str:
        if len(value) > limit:
            raise _rule(f"text too long ({len(value):,} characters; the limit is {limit:,})")
        return _clean(value)

    return Annotated[str, AfterValidator(check)]


def _count(limit: int) -> Any:
    def check(value: int) -> int:
        if value < 0:
            raise _rule(f"a count cannot be negative, not {_shown(value)}")
        if value > limit:
            raise _rule(f"{_shown(value)} is out of range (the limit is {limit:,})")
        return value

    return Annotated[int, AfterValidator(check)]


def _token_id(value: int) -> int:
    if not 0 <= value < MAX_TOKEN_ID:
        raise _rule(f"token id {_shown(value)} is out of range (0 ≤ id < 2**31)")
    return value


def _prob(value: float) -> float:
    if not -PROB_SLACK <= value <= 1 + PROB_SLACK:
        raise _rule(f"{value!r} is not a probability (0 to 1)")
    return value


def _secs(value: float) -> float:
    if value < 0:
        raise _rule(f"seconds cannot be negative, not {value!r}")
    if value > MAX_SECONDS:
        raise _rule(f"{value!r} seconds is out of range (the limit is {MAX_SECONDS:g})")
    return value


def _settings(value: Any) -> DecodeSettings:
    if not isinstance(value, dict):
        raise _rule("expected an object")
    for k, v in value.items():
        if not isinstance(k, str) or not (v is None or isinstance(v, (int, float, str, bool))):
            raise _rule("values must be numbers or strings")
        if isinstance(v, float) and not math.isfinite(v):
            raise _rule(f"{k}: not a finite number")
    try:
        return DecodeSettings.from_dict(value)
    except SettingsError as exc:
        raise _rule(str(exc)) from None


def _models(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise _rule("expected an object")
    if len(value) > 20 or not all(isinstance(v, str) and len(v) <= NAME_LIMIT and len(k) <= 100
                                  for k, v in value.items()):
        raise _rule("values must be short strings")
    return {_clean(k): _clean(v) for k, v in value.items()}


def _few_rounds(value: Any) -> Any:
    """Refuse an enormous list before validating a single round of it."""
    if isinstance(value, list) and len(value) > T.MAX_ROUNDS:
        raise _rule(f"too many rounds ({len(value):,}; the limit is {T.MAX_ROUNDS:,})")
    return value


TokenId = Annotated[int, AfterValidator(_token_id)]
Prob = Annotated[float, AfterValidator(_prob)]
Secs = Annotated[float, AfterValidator(_secs)]
OptSecs = Annotated[float, BeforeValidator(lambda v: 0.0 if v is None else v), AfterValidator(_secs)]  # null: 0
Count = _count(MAX_COUNT)
Text = _text(TEXT_LIMIT)
PromptText = _text(PROMPT_LIMIT)
PromptTokens = _count(MAX_TOKEN_ID)


def _build(value: Any) -> Any:
    if isinstance(value, _In):
        return value.build()
    if isinstance(value, list):
        return [_build(v) for v in value]
    return value


class _In(BaseModel):
    """A checked JSON object that builds the dataclass `target` from its fields."""

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)
    target: ClassVar[type]

    def build(self) -> Any:
        # The model's __dict__ holds exactly its fields (extra="ignore"): 2x faster than getattr per field name.
        return self.target(**{name: _build(value) for name, value in self.__dict__.items()})


class DraftTokenIn(_In):
    target = T.DraftToken
    id: TokenId
    text: Text
    q: Prob
    conf: Prob | None = None  # absent in version 1
    p: Prob | None = None  # absent before version 3
    h: Prob | None = None  # absent before version 3


class PictureIn(_In):
    target = T.Picture
    ids: list[TokenId]
    text: list[Text]
    p: list[Prob]
    q: list[Prob]
    res: list[Prob]
    rest_p: Prob = 0.0
    rest_q: Prob = 0.0
    p1: list[Prob] | None = None
    q1: list[Prob] | None = None

    @model_validator(mode="after")
    def _aligned(self) -> "PictureIn":
        n = len(self.ids)
        if n > PICTURE_MAX or any(len(v) != n for v in (self.text, self.p, self.q, self.res, self.p1 or self.ids,
                                                           self.q1 or self.ids)):
            raise _rule(f"a picture's lists must all hold the same number (≤ {PICTURE_MAX}) of tokens")
        return self


class PositionIn(_In):
    target = T.Position
    i: int  # its place in the round is checked by RoundIn
    q: Prob
    p: Prob
    b: Prob
    u: Prob
    accepted: bool
    reject_prob: Prob
    tv: Prob
    bias: Prob
    picture: PictureIn | None = None  # absent before version 3


class TokenIn(_In):
    target = T.Token
    id: TokenId
    text: Text
    origin: Literal[T.ORIGINS]


class ExtraIn(_In):
    target = T.Extra
    id: TokenId
    text: Text
    kind: Literal[T.EXTRA_KINDS]
    p: Prob


class RoundIn(_In):
    target = T.Round
    index: int  # checked against the round's place by TraceIn
    n_before: int  # checked against the rounds before by TraceIn
    draft: list[DraftTokenIn]
    positions: list[PositionIn]
    extra: ExtraIn | None = None
    emitted: list[TokenIn]
    t_start: Secs
    t_draft: Secs
    t_verify: Secs
    t_end: Secs
    draft_forwards: Count
    target_forwards: Count
    draft_stop: Literal[T.DRAFT_STOPS] = ""  # absent in version 1
    prompt_fed: Count = 0  # absent before the prefill was merged into the first pass
    tree: dict | None = None  # a tree-drafter round's token tree: checked by TraceIn, which knows γ

    @model_validator(mode="after")
    def _verified_in_order(self) -> "RoundIn":
        for j, pos in enumerate(self.positions):
            if pos.i != j + 1:
                raise _rule(f"expected {j + 1}, not {_shown(pos.i)}: positions are numbered 1…k in order",
                            at=f"positions[{j}].i")
            if j and not self.positions[j - 1].accepted:
                raise _rule("a verified position after the rejection (only the last one can be rejected)",
                            at=f"positions[{j}]")
        if len(self.positions) > len(self.draft):
            raise _rule(f"more verified positions than drafted tokens ({len(self.positions)} > {len(self.draft)})",
                        at="positions")
        accepted = sum(pos.accepted for pos in self.positions)
        most = accepted + (self.extra is not None)
        if len(self.emitted) > most:
            raise _rule(f"{len(self.emitted)} tokens emitted, but the round accepted {accepted} draft(s)"
                        f"{' and sampled 1 extra token' if self.extra is not None else ' and sampled none'}",
                        at="emitted")
        return self


def _ratio(value: float) -> float:
    """A positive factor or speedup as the race measured it (bounded so a view can print it)."""
    if not 0 <= value <= 1e6:
        raise _rule(f"{value!r} is out of range (0 to 1e6)")
    return value


def _threads(value: int) -> int:
    if not 1 <= value <= 4096:
        raise _rule(f"{value} threads is out of range (1 to 4096)")
    return value


Ratio = Annotated[float, AfterValidator(_ratio)]


class TimingIn(_In):
    """How a race was timed (specviz.trace.timing; absent before the interleaved race)."""

    target = Timing
    how: Literal[RACE_HOWS] = "interleaved"
    threads: Annotated[int, AfterValidator(_threads)] | None = None
    threads_end: Annotated[int, AfterValidator(_threads)] | None = None
    busy: Ratio | None = None
    busy_during: Ratio | None = None
    judged: bool = True
    spread: Ratio = 0.0
    spread_spec: Ratio = 0.0
    spread_std: Ratio = 0.0
    reliable: bool = True
    why: Text = ""
    predicted: Ratio | None = None
    slowdown: Ratio | None = None
    v_probe: Ratio | None = None
    c_probe: Ratio | None = None
    v_limit: Ratio | None = None
    c_limit: Ratio | None = None


class TraceIn(_In):
    target = T.Trace
    kind: Literal["speculative", "standard"]
    prompt: PromptText
    prompt_tokens: PromptTokens
    settings: Annotated[DecodeSettings, PlainValidator(_settings)]
    models: Annotated[dict[str, str], PlainValidator(_models)]
    device: Text
    rounds: Annotated[list[RoundIn], BeforeValidator(_few_rounds)]
    stop_reason: Literal[T.RUN_ENDS]
    t_prefill: Secs
    t_total: Secs
    draft_prefill: OptSecs = 0.0  # absent in early recordings
    target_prefill: OptSecs = 0.0
    t_tracing: OptSecs = 0.0
    timing: TimingIn | None = None  # absent before the interleaved race

    @model_validator(mode="after")
    def _rounds_in_order(self) -> "TraceIn":
        n = 0
        for k, rnd in enumerate(self.rounds):
            if rnd.index != k:
                raise _rule(f"expected {k}, not {_shown(rnd.index)}: rounds are numbered 0, 1, 2… in order",
                            at=f"rounds[{k}].index")
            if rnd.n_before != n:
                raise _rule(f"expected {n} (the tokens emitted by the rounds before it), not {_shown(rnd.n_before)}",
                            at=f"rounds[{k}].n_before")
            if len(rnd.draft) > self.settings.gamma:
                raise _rule(f"more drafted tokens than gamma ({len(rnd.draft)} > {self.settings.gamma})",
                            at=f"rounds[{k}].draft")
            if rnd.tree is not None:
                try:
                    rnd.tree = parse_tree(rnd.tree, self.settings.gamma)
                except ValueError as exc:  # "tree.nodes[2].parent: what is wrong"
                    where, _, what = str(exc).partition(": ")
                    raise _rule(what, at=f"rounds[{k}].{where}") from None
            n += len(rnd.emitted)
        return self


# ---- messages ------------------------------------------------------------------------------

_TYPE_MESSAGES = {
    "model_type": "expected an object",
    "model_attributes_type": "expected an object",
    "dict_type": "expected an object",
    "list_type": "expected a list",
    "string_type": "expected a string",
    "int_type": "expected an integer",
    "bool_type": "expected true or false",
    "float_type": "expected a finite number",
    "finite_number": "expected a finite number",
}


def _path(where: str, loc: tuple, at: str = "") -> str:
    out = where
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    if at:
        out += at if at.startswith("[") else f".{at}"
    return out


def describe(exc: ValidationError, where: str) -> str:
    """One line for the first problem, saying where it is; how many more there are."""
    errors = exc.errors(include_url=False)
    err = errors[0]
    kind, loc, ctx = err["type"], tuple(err["loc"]), err.get("ctx") or {}
    if kind == "missing":
        text = f"{_path(where, loc[:-1])}: missing field '{loc[-1]}'"
    elif kind == "literal_error":
        text = f"{_path(where, loc)}: unknown value {_shown(err['input'])} (expected {ctx.get('expected')})"
    elif kind == "specviz":
        text = f"{_path(where, loc, ctx.get('at', ''))}: {ctx['message']}"
    else:
        text = f"{_path(where, loc)}: {_TYPE_MESSAGES.get(kind, err['msg'])}"
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return text


def parse_trace(data: Any, where: str = "trace") -> T.Trace:
    """A checked Trace from a JSON object (schema and version already checked), or TraceError."""
    try:
        return TraceIn.model_validate(data).build()
    except ValidationError as exc:
        raise T.TraceError(describe(exc, where)) from None
