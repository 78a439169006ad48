"""Recorded sweeps: a γ sweep, an ε sweep and a drafter shoot-out of the default pair, made by
`scripts/record_sweeps.py` and shipped in `assets/sweeps.json`, so the Sweeps tab shows measured
curves as soon as the page opens (a CPU sweep takes minutes).

Every configuration was run `repeats` times, round-robin with the standard baseline
(specviz.experiments.repeats): the rows hold medians with their range; files recorded before that
(one run each, no range) load as they are.

The file is data from disk like any upload, so it is checked with pydantic on load: a broken or
hand-edited file is refused with one message that says where, and the page says so instead of
failing.  No Gradio here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

SCHEMA = "specviz.sweeps"
VERSION = 1
MAX_BYTES = 2 * 2**20  # metrics only: a real recording is a few kB
DEFAULT_PATH = Path(__file__).resolve().parents[2] / "assets" / "sweeps.json"


class RecordedError(ValueError):
    """The recorded sweeps could not be read; the message says why."""


def _finite(x: float) -> float:
    if not math.isfinite(x):
        raise ValueError("must be a finite number")
    return x


Num = Annotated[float, AfterValidator(_finite)]
Pos = Annotated[float, Field(ge=0), AfterValidator(_finite)]
Prob = Annotated[float, Field(ge=0, le=1)]
Text = Annotated[str, Field(max_length=2000)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Repeated(_Strict):
    """A point measured over repeats (the fields are absent in files recorded before sweeps repeated):
    tokens_per_s and speedup are then medians, *_lo and *_hi their range (min, max); repeats: how many
    ran; noisy: how many were flagged."""

    tokens_per_s_lo: Pos | None = None
    tokens_per_s_hi: Pos | None = None
    speedup_lo: Pos | None = None
    speedup_hi: Pos | None = None
    repeats: int | None = Field(default=None, ge=1, le=100)
    noisy: int | None = Field(default=None, ge=0, le=100)


class GammaRow(_Repeated):
    gamma: int = Field(ge=0, le=64)  # 0: the standard run (the baseline)
    tokens_per_s: Pos
    speedup: Pos | None = None
    alpha: Prob | None = None
    c: Pos | None = None  # a draft token ÷ the baseline's standard step (older files: ÷ the verify pass)
    v: Pos | None = None  # the verify pass ÷ the baseline's standard step (absent in older files)
    theoretical_speedup: Pos | None = None  # Thm 3.8 with v (older files: the textbook value, c ÷ verify)


class EpsilonRow(_Repeated):
    epsilon: Prob
    variant: Literal["opt", "uno"]
    alpha: Prob | None = None
    speedup: Pos
    tokens_per_s: Pos
    mean_bias: Prob | None = None
    reject_prob: Prob | None = None
    mean_tv: Prob | None = None
    first_divergence: int | None = Field(default=None, ge=0)
    edit_distance: int = Field(ge=0)


class ShootoutRow(_Repeated):
    key: Text
    label: Text
    policy: Text = ""
    alpha: Prob | None = None
    mean_accepted_length: Pos | None = None
    c: Pos | None = None
    tokens_per_s: Pos | None = None
    speedup: Pos | None = None
    mean_draft_length: Pos | None = None
    tokens: int | None = Field(default=None, ge=0)
    target_forwards: int | None = Field(default=None, ge=0)
    same_text: bool | None = None
    error: Text = ""


class Recorded(_Strict):
    schema_: Literal["specviz.sweeps"] = Field(alias="schema")
    version: Literal[1]
    machine: Text  # the CPU's model name (or the GPU), as specviz.models.int8.cpu_model() reads it
    date: Text  # ISO date and time (UTC)
    load_average: list[Num] | None = None  # (1, 5, 15 min) when recorded: a shared machine's numbers are noisy
    repeats: int | None = Field(default=None, ge=1, le=100)  # runs per configuration, round-robin (older files: 1)
    models: dict[str, Text]  # draft, target
    prompt: Annotated[str, Field(max_length=20_000)]
    settings: dict[str, Any]  # DecodeSettings.as_dict() of the base settings
    gamma: list[GammaRow] = Field(max_length=100)
    # The ε sweep's own prompt and settings when they differ from the base ones (a sampled prompt, where α < 1 and
    # ε has something to accept; greedy at α = 1 shows nothing); absent: the base prompt and settings.
    epsilon_prompt: Annotated[str, Field(max_length=20_000)] | None = None
    epsilon_settings: dict[str, Any] | None = None
    epsilon: list[EpsilonRow] = Field(max_length=100)
    shootout: list[ShootoutRow] = Field(max_length=20)

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    def when(self) -> str:
        """'recorded on <machine>, <date>': how the page marks these results."""
        return f"recorded on {self.machine}, {self.date[:10]}"

    def to_json(self) -> str:
        """Compact: no unset fields, 4 significant digits (timings on a CPU vary more than that)."""
        data = _rounded(self.model_dump(by_alias=True, exclude_none=True))
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False) + "\n"


def _rounded(obj: Any) -> Any:
    if isinstance(obj, float):
        return float(f"{obj:.4g}")
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rounded(v) for v in obj]
    return obj


def parse(data: str | bytes) -> Recorded:
    """The recorded sweeps from JSON text, or RecordedError saying what is wrong and where."""
    if len(data) > MAX_BYTES:
        raise RecordedError(f"the file is too large ({len(data):,} bytes; recorded sweeps are a few kB)")
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RecordedError(f"not JSON ({exc})") from None
    if not isinstance(raw, dict) or raw.get("schema") != SCHEMA:
        raise RecordedError(f"not a recording of sweeps (expected \"schema\": \"{SCHEMA}\")")
    try:
        return Recorded.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "the file"
        more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
        raise RecordedError(f"{where}: {err['msg']}{more}") from None


def load(path: str | Path = DEFAULT_PATH) -> Recorded:
    """Read and check a recorded-sweeps file (RecordedError when missing or invalid)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RecordedError(f"cannot read {path.name} ({exc.strerror or exc})") from None
    return parse(data)
