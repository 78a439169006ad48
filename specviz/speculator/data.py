"""Training data for the speculator, all available offline.

Text: Python source files that ship inside the installed packages (site-packages
of the running interpreter), one window per file for variety.  Files are split
into training and held-out sets by a hash of their path, so the held-out
agreement is measured on files the speculator never saw.  The app's evaluation
prompts (assets/prompts.jsonl) are never used.  Part of the windows are wrapped
in the target's chat template (a user request, then the code as the assistant's
answer in a fenced block), because that is the context the app decodes in.

Labels: self-distillation.  One forward pass of the frozen target over a window
gives both its last hidden states (the speculator's input) and its next-token
distributions (the labels, kept as the top k probabilities).  That pass is most
of the training cost, so it is done once and cached in shards; an interrupted
run resumes at the first missing shard.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from tqdm import tqdm

# Machine-generated code (plotly's thousands of near-identical validator classes) would
# dominate any uniform sample of files and teach the speculator one boilerplate.
SKIP_DIRS = {"__pycache__", "validators", "graph_objs", "_plotly_utils"}
MIN_BYTES, MAX_BYTES = 1_500, 200_000


@dataclass(frozen=True)
class DataSpec:
    """What a data cache holds; its hash names the cache directory."""

    target: str  # fingerprint of the target's head (model.head_fingerprint)
    seq_len: int = 256
    train_seqs: int = 480
    heldout_seqs: int = 32
    chat_fraction: float = 0.5
    top_k: int = 16
    seed: int = 0
    heldout_every: int = 16  # one file in this many (by path hash) is held out
    # The target's own answers to requests (prompts.py, generate.py): windows of seq_len.
    gen_requests: int = 448
    gen_heldout: int = 64
    gen_batch: int = 64
    gen_sample_fraction: float = 0.25

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def corpus_files(root: Path | None = None) -> list[Path]:
    """Hand-written Python sources under site-packages, in a fixed order."""
    root = root or site_packages()
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith((".dist-info", ".libs")))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if name.endswith(".py") and MIN_BYTES <= path.stat().st_size <= MAX_BYTES:
                out.append(path)
    return out


def is_heldout(path: Path, root: Path, every: int) -> bool:
    digest = hashlib.sha1(str(path.relative_to(root)).encode()).digest()
    return int.from_bytes(digest[:4], "big") % every == 0


def _chat_prefix(tokenizer: Any, rel: str) -> list[int]:
    """The chat context the app decodes in: a user request, then the assistant opens a code block."""
    messages = [{"role": "user", "content": f"Write the Python module `{rel}`."}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text + "```python\n", add_special_tokens=False)["input_ids"]


def windows(tokenizer: Any, spec: DataSpec, heldout: bool, root: Path | None = None) -> Iterator[tuple[str, list[int]]]:
    """(file, token ids) windows of exactly seq_len tokens, one per file, in a seeded order."""
    root = root or site_packages()
    files = [f for f in corpus_files(root) if is_heldout(f, root, spec.heldout_every) == heldout]
    rng = random.Random(f"{spec.seed}:{heldout}")
    rng.shuffle(files)
    chat_ok = getattr(tokenizer, "chat_template", None) is not None
    for path in files:
        rel = str(path.relative_to(root))
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        lines = text.splitlines(keepends=True)
        # Start at a random line in the first half, so windows are not all module headers.
        start = rng.randrange(max(1, len(lines) // 2))
        body = "".join(lines[start:])[: spec.seq_len * 16]  # enough characters for seq_len tokens
        chat = chat_ok and rng.random() < spec.chat_fraction
        prefix = _chat_prefix(tokenizer, rel) if chat else []
        ids = prefix + tokenizer(body, add_special_tokens=False)["input_ids"]
        if len(ids) >= spec.seq_len:
            yield rel, ids[: spec.seq_len]


def select(tokenizer: Any, spec: DataSpec,
           root: Path | None = None) -> tuple[list[list[int]], list[list[int]], list[str]]:
    """The training and held-out windows (token ids) and the training files they come from."""
    train, names = [], []
    for rel, ids in windows(tokenizer, spec, heldout=False, root=root):
        train.append(ids)
        names.append(rel)
        if len(train) == spec.train_seqs:
            break
    held = [ids for _, (_, ids) in zip(range(spec.heldout_seqs), windows(tokenizer, spec, heldout=True, root=root))]
    return train, held, names


@torch.inference_mode()
def label(target: torch.nn.Module, ids: torch.Tensor, top_k: int, chunk: int = 256) -> dict[str, torch.Tensor]:
    """One target pass over windows ids [B, L]: last hidden states [B, L, H] (the input
    the drafter gets at run time, post final norm) and the top-k next-token
    probabilities at temperature 1 (normalised over the full vocabulary)."""
    hidden = target.model(input_ids=ids).last_hidden_state
    head = target.get_output_embeddings()
    flat = hidden.reshape(-1, hidden.shape[-1])
    top_ids, top_p = [], []
    for s in range(0, flat.shape[0], chunk):  # full-vocabulary logits for a few positions at a time
        logits = head(flat[s : s + chunk]).float()
        val, idx = logits.topk(top_k, dim=-1)
        top_p.append(torch.exp(val - torch.logsumexp(logits, -1, keepdim=True)))
        top_ids.append(idx)
    b, n = ids.shape
    return {
        "ids": ids.to(torch.int32),
        "hidden": hidden.to(torch.bfloat16),
        "top_ids": torch.cat(top_ids).reshape(b, n, top_k).to(torch.int32),
        "top_p": torch.cat(top_p).reshape(b, n, top_k).to(torch.float16),
    }


def cached_shards(parts: list[list], out: Path, compute: Callable[[int, list], dict[str, torch.Tensor]],
                  size: Callable[[list], int], desc: str, unit: str,
                  deadline: float | None = None) -> tuple[list[Path], float]:
    """Compute shard i = compute(i, parts[i]) under `out`, keeping shards already there (so an
    interrupted run resumes at the first missing one); no new shard starts after `deadline`
    (time.monotonic()).  Returns the shards that exist, in order, and the seconds it took to
    compute them (recorded per shard, so a cached pass still reports its real cost).  The
    progress bar counts size(part) per shard."""
    out.mkdir(parents=True, exist_ok=True)
    cost_file = out / "seconds.json"
    cost = json.loads(cost_file.read_text()) if cost_file.exists() else {}
    shards = []
    with tqdm(total=sum(size(p) for p in parts), desc=desc, unit=unit, smoothing=0.1) as bar:
        for i, part in enumerate(parts):
            path = out / f"shard-{i:05d}.pt"
            if not path.exists():
                if deadline is not None and time.monotonic() > deadline:
                    bar.write(f"{desc}: time budget reached after {len(shards)} of {len(parts)} shards")
                    break
                t0 = time.perf_counter()
                data = compute(i, part)
                tmp = path.with_suffix(".tmp")
                torch.save(data, tmp)
                tmp.replace(path)  # atomic: a killed run never leaves half a shard
                cost[path.name] = round(time.perf_counter() - t0, 2)
                cost_file.write_text(json.dumps(cost))
            shards.append(path)
            bar.update(size(part))
    return shards, sum(cost.get(p.name, 0.0) for p in shards)


def precompute(target: torch.nn.Module, seqs: list[list[int]], out: Path, top_k: int, batch: int = 4,
               desc: str = "target pass", deadline: float | None = None) -> tuple[list[Path], float]:
    """Label the windows in shards of `batch` under `out` (cached_shards: resumable, with a deadline)."""
    parts = [seqs[s : s + batch] for s in range(0, len(seqs), batch)]
    return cached_shards(parts, out, lambda i, part: label(target, torch.tensor(part), top_k),
                         lambda part: len(part) * len(part[0]), desc, "tok", deadline)


def load_shards(paths: list[Path]) -> dict[str, torch.Tensor]:
    """Shards of source windows and of generated answers, as one set; `valid` marks the
    positions that hold real tokens (every position of a source window)."""
    parts = [torch.load(p) for p in paths]
    for p in parts:
        p.setdefault("valid", torch.ones(p["ids"].shape, dtype=torch.bool))
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]} if parts else {}


def requests(spec: DataSpec, root: Path | None = None) -> tuple[list[str], list[str]]:
    """The requests the target answers (prompts.py), held-out and training, as many as the spec asks."""
    from . import prompts

    root = root or site_packages()
    files = corpus_files(root)
    train = [f for f in files if not is_heldout(f, root, spec.heldout_every)]
    held = [f for f in files if is_heldout(f, root, spec.heldout_every)]
    return prompts.requests(train, held, root, spec.heldout_every, spec.seed, spec.gen_requests, spec.gen_heldout)
