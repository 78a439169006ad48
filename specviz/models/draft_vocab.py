"""A reduced vocabulary for the draft model's head (EAGLE-3's draft-to-target map, kept exact).

The int8 draft's output head (Qwen2.5 0.5B: 151,936 x 896 int8, ~136 MB) is about a quarter of the
bytes a draft step reads on a CPU.  Most of its rows are tokens the target almost never produces in
the texts specviz decodes.  Here the draft computes logits for a fixed set of *kept* ids only and
gives every other id the logit -inf, so its q is zero there.  The acceptance rule needs nothing more:
it only needs the q the draft sampled from, and a token outside the kept set can still be emitted by
the target's correction (the residual max(0, p - q) is p there) or bonus token, so speculative
decoding still samples the target's distribution exactly (tested with χ²).  What the kept set costs
is acceptance: a token the target wants but the draft cannot propose is a rejection.

The kept ids are chosen from the *target's* own token frequencies, never from a hub: they are the
learned head's vocabulary V_r (:mod:`specviz.speculator.train`, ``build_vocab``), i.e. the most
frequent tokens of its training data -- the target's own answers to the training requests and the
source windows the target read, and the target's top-4 predictions at every position -- plus the
end-of-text tokens.  ``python -m specviz.models.draft_vocab`` writes them with their provenance to
``assets/draft_vocab/<target>.json``.  A run may add the ids of its own prompt (:meth:`ReducedHead.
prepare`): code answers copy the prompt's identifiers.

The reduced head replaces the draft's output embedding module, so the lean decode path
(:mod:`.lean`, which applies the head outside its traced graphs) and transformers' forward (token
trees) both use it; :func:`set_mode` switches a loaded pair between ``"reduced"`` and ``"full"``.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .int8_target import TokenInt8Linear
from .q4k_draft import INT8_DRAFTS

log = logging.getLogger("specviz.models")

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "draft_vocab"
FORMAT = "specviz.draft_vocab/1"
MODES = ("reduced", "full")
# Off by default: on the AVX2 EPYC (2 threads, busy machine, 2026-11-26) the 16,384-id head cut the draft's
# step 39.7 -> 33.1 ms (c 0.29 -> 0.24) but α fell 0.90 -> 0.85 on assets/prompts.jsonl (greedy, 64 tokens,
# γ = 5) and the bench's tokens/s 5.41 -> 5.12 (translation 3.15 -> 1.91: 7 of its 19 tokens are not kept).
# Turn it on per run with set_mode(pair, "reduced") or the bench's --draft-vocab.
DEFAULT_MODE = "full"


def slug(name: str) -> str:
    """The asset's file stem for a target's display name (as the learned head's store names it)."""
    return re.sub(r"[^a-z0-9.]+", "-", name.lower()).strip("-") or "target"


@dataclass(frozen=True)
class DraftVocab:
    """The kept ids (ascending) of a full vocabulary of ``vocab_size`` ids, and where they came from."""

    ids: tuple[int, ...]
    vocab_size: int
    target: str = ""
    provenance: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.ids or list(self.ids) != sorted(set(self.ids)):
            raise ValueError("kept ids must be non-empty, ascending and distinct")
        if self.ids[0] < 0 or self.ids[-1] >= self.vocab_size:
            raise ValueError(f"kept ids must lie in [0, {self.vocab_size})")

    @property
    def size(self) -> int:
        return len(self.ids)

    def tensor(self) -> torch.Tensor:
        return torch.tensor(self.ids, dtype=torch.long)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "target": self.target, "vocab_size": self.vocab_size, "size": self.size,
                "provenance": self.provenance, "ids": list(self.ids)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "DraftVocab":
        if data.get("format") != FORMAT:
            raise ValueError(f"not a specviz draft vocabulary (format {data.get('format')!r})")
        return cls(tuple(int(i) for i in data["ids"]), int(data["vocab_size"]), str(data.get("target", "")),
                   dict(data.get("provenance", {})))


def save(path: Path, vocab: DraftVocab) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    body = vocab.to_json()
    ids = body.pop("ids")
    # One readable header, then the ids on a single line (16k ids: ~110 kB).
    text = json.dumps(body, indent=1)[:-2] + ',\n "ids": ' + json.dumps(ids, separators=(",", ":")) + "\n}\n"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def load(path: Path) -> DraftVocab:
    return DraftVocab.from_json(json.loads(path.read_text(encoding="utf-8")))


def find(target_name: str, vocab_size: int, dirs: list[Path] | None = None) -> DraftVocab | None:
    """The shipped kept ids for a target (by display name) over this vocabulary size, if any."""
    for d in dirs if dirs is not None else [ASSETS]:
        path = d / f"{slug(target_name)}.json"
        if path.exists():
            try:
                vocab = load(path)
            except (ValueError, KeyError, json.JSONDecodeError) as exc:
                log.warning("Ignoring the draft vocabulary %s: %s", path, exc)
                continue
            if vocab.vocab_size == vocab_size:
                return vocab
    return None


# --------------------------------------------------------------------------------------------------
# The head
# --------------------------------------------------------------------------------------------------


def int8_values(head: TokenInt8Linear) -> tuple[torch.Tensor, torch.Tensor]:
    """An int8 head's int8 values [out, in] and per-channel scales [out] (unpacked from fbgemm's layout
    once packed: ~1.5 s for the 0.5B draft's 151,936 x 896 head on the AVX2 EPYC)."""
    if callable(getattr(head, "qweight", None)):  # its int8 values, packed or not
        qweight = head.qweight()
    else:  # a TokenInt8Linear without qweight(): the weight until packed, then fbgemm's packed one
        qweight = getattr(head, "_qweight", None)
        qweight = qweight if qweight is not None else torch.ops.quantized.linear_unpack(head._packed)[0]
    return qweight.int_repr(), qweight.q_per_channel_scales()


def _int8_linear(values: torch.Tensor, scales: torch.Tensor, rows: torch.Tensor,
                 bias: torch.Tensor | None) -> TokenInt8Linear:
    weight = torch._make_per_channel_quantized_tensor(values[rows].contiguous(), scales[rows].contiguous(),
                                                      torch.zeros(len(rows), dtype=torch.long), 0)
    return TokenInt8Linear(weight, bias, pack=True)


def rows_of(head: torch.nn.Module, rows: torch.Tensor,
            int8: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.nn.Module:
    """A linear computing only ``rows`` of ``head``'s outputs, bit for bit as ``head`` computes them
    (an int8 product is per output column; a float one reads the same weight rows).  ``int8``: the
    int8 head's :func:`int8_values`, when the caller holds them already."""
    bias = getattr(head, "bias", None)
    bias = None if bias is None else bias.detach()[rows].float().clone()
    if isinstance(head, TokenInt8Linear):
        values, scales = int8 if int8 is not None else int8_values(head)
        return _int8_linear(values, scales, rows, bias)
    if callable(getattr(head, "rows", None)):  # a Q4_K head (models.q4k_draft): its records' rows
        return head.rows(rows, bias)
    if isinstance(head, torch.nn.Linear):
        part = torch.nn.Linear(head.in_features, len(rows), bias=bias is not None, dtype=head.weight.dtype)
        with torch.no_grad():
            part.weight.copy_(head.weight.detach()[rows])
            if bias is not None:
                part.bias.copy_(bias)
        return part.requires_grad_(False)
    raise TypeError(f"a reduced head needs an int8, Q4_K or float linear head, not {type(head).__name__}")


class ReducedHead(torch.nn.Module):
    """The draft's head over the kept ids (and a run's extra ids): logits there as the full head gives
    them, -inf everywhere else, over the full vocabulary's width."""

    def __init__(self, full: torch.nn.Module, vocab: DraftVocab):
        super().__init__()
        self.vocab = vocab
        self.out_features = vocab.vocab_size
        self.in_features = int(getattr(full, "in_features"))
        self.full = full  # held (a submodule, so model.modules() still finds it); never run here
        self.ids = vocab.tensor()
        # An int8 head's values, unpacked once (~1.5 s for the 0.5B draft's head on the AVX2 EPYC) and
        # held (~136 MB): the kept rows come from them now, a run's prompt rows in milliseconds later.
        self._int8 = int8_values(full) if isinstance(full, TokenInt8Linear) else None
        self.kept = rows_of(full, self.ids, self._int8)
        self._is_kept = torch.zeros(vocab.vocab_size, dtype=torch.bool)
        self._is_kept[self.ids] = True
        self.extra_ids = torch.empty(0, dtype=torch.long)
        self.extra: torch.nn.Module | None = None

    def prepare(self, prompt: list[int]) -> int:
        """Also keep this run's prompt ids (until the next call); returns how many ids that adds."""
        ids = torch.tensor(sorted(set(prompt)), dtype=torch.long)
        ids = ids[(ids >= 0) & (ids < self.out_features)]
        extra = ids[~self._is_kept[ids]]
        if not torch.equal(extra, self.extra_ids):
            self.extra = rows_of(self.full, extra, self._int8) if len(extra) else None
            self.extra_ids = extra
        return len(extra)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        part = self.kept(x).float()
        out = torch.full((*part.shape[:-1], self.out_features), float("-inf"), dtype=part.dtype)
        out.index_copy_(-1, self.ids, part)
        if self.extra is not None:
            out.index_copy_(-1, self.extra_ids, self.extra(x).float())
        return out

    def extra_repr(self) -> str:
        return f"kept={self.vocab.size} of {self.out_features}, extra={len(self.extra_ids)}"


# --------------------------------------------------------------------------------------------------
# A model's head, and a pair's mode
# --------------------------------------------------------------------------------------------------


def full_head(model: torch.nn.Module) -> torch.nn.Module:
    head = model.get_output_embeddings()
    return head.full if isinstance(head, ReducedHead) else head


def reduced_head(model: torch.nn.Module) -> ReducedHead | None:
    """The reduced head ``model`` drafts with, if any (a model without a head accessor -- a wrapper -- has none)."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return head if isinstance(head, ReducedHead) else None


def use(model: torch.nn.Module, vocab: DraftVocab | None) -> ReducedHead | None:
    """Give ``model`` a head reduced to ``vocab`` (built once per vocabulary and kept on the model), or
    its full head back (None).  Returns the reduced head in use, if any."""
    full = full_head(model)
    if vocab is None:
        model.set_output_embeddings(full)
        return None
    built: dict[tuple[int, ...], ReducedHead] = model.__dict__.setdefault("_specviz_reduced_heads", {})
    head = built.get(vocab.ids)
    if head is None:
        head = built[vocab.ids] = ReducedHead(full, vocab)
    model.set_output_embeddings(head)
    return head


def prepare(model: torch.nn.Module, prompt: list[int]) -> None:
    """Before a run: a reduced head also keeps the prompt's ids (a full head: nothing to do)."""
    head = reduced_head(model)
    if head is not None:
        head.prepare(prompt)


def mode(pair: Any) -> str:
    """"reduced" or "full": the draft's head as it is now."""
    return "reduced" if reduced_head(pair.draft) is not None else "full"


def available(pair: Any) -> DraftVocab | None:
    """The kept ids this pair's draft may use: an int8 draft on the CPU with a shipped vocabulary."""
    if getattr(pair, "draft_quant", None) not in INT8_DRAFTS or getattr(pair.device, "type", "cpu") != "cpu":
        return None
    return find(pair.target_name, int(pair.vocab_size))


def set_mode(pair: Any, wanted: str) -> str:
    """Switch the pair's draft head to ``wanted`` ("reduced" or "full"); "reduced" falls back to
    "full" where no vocabulary applies.  Returns the mode now in use."""
    if wanted not in MODES:
        raise ValueError(f"draft vocabulary must be one of {', '.join(MODES)}, not {wanted!r}")
    vocab = available(pair) if wanted == "reduced" else None
    use(pair.draft, vocab)
    return mode(pair)


def label(pair: Any) -> str:
    """The draft head's vocabulary in words, for a trace or a table: "16,384 of 151,936 ids" or "full"."""
    head = reduced_head(pair.draft)
    return "full" if head is None else f"{head.vocab.size:,} of {head.out_features:,} ids"
