"""Saving trained speculators and finding the one that belongs to a target.

A speculator is one safetensors file (the stages in bf16, V_r as int32, the
config and the target's head fingerprint in its metadata) in a folder named
after the target, next to its training card.  The shipped ones live in
assets/speculator/; `train` writes others under the model cache.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .model import MLPSpeculator, SpeculatorConfig, head_fingerprint

FORMAT = "specviz.speculator/1"
WEIGHTS = "weights.safetensors"
ASSETS = Path(__file__).resolve().parents[2] / "assets" / "speculator"


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", name.lower()).strip("-") or "target"


def user_dir() -> Path:
    from ..models import cache_dir

    return cache_dir() / "speculator"


def save(path: Path, spec: MLPSpeculator, meta: dict[str, Any]) -> None:
    """Write the stages (bf16: half the bytes, and the drafter computes in fp32 anyway)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in spec.state_dict().items() if k != "vocab_ids"}
    tensors["vocab_ids"] = spec.vocab_ids.to(torch.int32).contiguous()
    header = {"format": FORMAT, "config": json.dumps(spec.config.as_dict()),
              **{k: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()}}
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata=header)
    tmp.chmod(0o644)  # safetensors creates it private; weights are meant to be shared
    tmp.replace(path)


def read_meta(path: Path) -> dict[str, str]:
    with safe_open(str(path), "pt") as f:
        return dict(f.metadata() or {})


def load(path: Path) -> tuple[MLPSpeculator, dict[str, str]]:
    """The speculator in fp32 (not yet attached to a target) and its metadata."""
    meta = read_meta(path)
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not a specviz speculator (format {meta.get('format')!r})")
    spec = MLPSpeculator(SpeculatorConfig(**json.loads(meta["config"])))
    with safe_open(str(path), "pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}
    spec.vocab_ids = state.pop("vocab_ids").to(torch.long)
    spec.load_state_dict({**{k: v.float() for k, v in state.items()}, "vocab_ids": spec.vocab_ids})
    return spec.eval().requires_grad_(False), meta


def find(target: torch.nn.Module, dirs: list[Path] | None = None) -> Path | None:
    """The weights trained on exactly this target (same head fingerprint), if any."""
    fp = head_fingerprint(target)
    for d in dirs if dirs is not None else [ASSETS, user_dir()]:
        for path in sorted(d.glob(f"*/{WEIGHTS}")):
            try:
                if read_meta(path).get("target_fingerprint") == fp:
                    return path
            except Exception:  # an unreadable file is not ours; keep looking
                continue
    return None
