"""Write the draft's reduced vocabulary (specviz.models.draft_vocab) for a target, with its provenance.

    python -m specviz.cli.draft_vocab                      # the default pair's target, from its learned head
    python -m specviz.cli.draft_vocab --work DIR --size 16384   # from the learned head's training shards
    python -m specviz.cli.draft_vocab --eval outputs.json  # also record coverage of the target's outputs

The kept ids come from the target's own token frequencies on the data the learned head (the MLP
speculator, specviz.speculator) was trained on, never from a hub:

* ``--work DIR``: that training's work directory (``<cache>/speculator/work/<target>-<key>``, kept by
  ``python -m specviz.speculator.train``).  The ids of the target's own answers (``gen-train``) are
  counted, most frequent first, then the training windows' ids and the target's top-4 predictions
  there break ties and fill the rest; the first ``--size`` are kept, plus end-of-text.
* without it: the learned head's own vocabulary V_r, shipped in its weights (``vocab_ids``), which
  ``specviz.speculator.train.build_vocab`` chose by the same counts (answers and windows, with the
  target's top-4 predictions) at its training: its size is the head's (16,384 for the default pair).

``--eval FILE``: a JSON list of ``{"prompt_ids": [...], "output_ids": [...]}`` (the target's own
outputs on prompts that were not used for choosing, e.g. standard decoding of assets/prompts.jsonl):
the share of output tokens kept, without and with the prompt's ids, is recorded as the coverage.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from ..models import draft_vocab as DV
from ..speculator import store

PREDICTED = 4  # the target's top-k predictions counted at each position (as build_vocab counts them)


def from_work(work: Path, size: int, eos: list[int], vocab_size: int) -> tuple[list[int], dict[str, Any]]:
    """The ``size`` most frequent ids of the target's answers (then windows and predictions), plus ``eos``."""
    from ..speculator.data import load_shards

    gens = sorted((work / "gen-train").glob("*.pt"))
    windows = sorted((work / "train").glob("*.pt"))
    if not gens:
        raise SystemExit(f"{work}: no gen-train shards (the target's answers)")
    answers = load_shards(gens)
    ok = answers["valid"]
    answer_ids = answers["ids"][ok].long()
    counts = torch.bincount(answer_ids, minlength=vocab_size).double() * 1e6  # answers first
    n_window = 0
    if windows:
        win = load_shards(windows)
        more = torch.cat([win["ids"].reshape(-1), win["top_ids"][..., :PREDICTED].reshape(-1)]).long()
        counts += torch.bincount(more, minlength=vocab_size).double()
        n_window = int(win["ids"].numel())
    counts[torch.tensor(eos, dtype=torch.long)] = float("inf")
    order = torch.sort(counts, descending=True, stable=True).indices
    seen = int((counts > 0).sum())
    kept = sorted(order[: min(size, seen)].tolist())
    covered = float(torch.isin(answer_ids, torch.tensor(kept)).float().mean())
    return kept, {"source": f"the target's answers in {work} (gen-train), then its training windows and top-"
                            f"{PREDICTED} predictions", "answer_tokens": int(answer_ids.numel()),
                  "window_tokens": n_window, "coverage_of_answers": round(covered, 4)}


def from_learned_head(target_slug: str) -> tuple[list[int], dict[str, Any]]:
    """The learned head's V_r and what its card says about the data it came from."""
    folder = store.ASSETS / target_slug
    weights = folder / store.WEIGHTS
    if not weights.exists():
        raise SystemExit(f"no learned head at {folder}: train one (python -m specviz.speculator.train) or pass --work")
    from safetensors import safe_open

    with safe_open(str(weights), "pt") as f:
        ids = f.get_tensor("vocab_ids").long().tolist()
    card = json.loads((folder / "card.json").read_text()) if (folder / "card.json").exists() else {}
    data = card.get("data", {})
    answers = data.get("answers", {})
    return sorted(ids), {
        "source": f"the learned head's vocabulary V_r ({weights.relative_to(store.ASSETS.parents[1])}: vocab_ids)",
        "rule": data.get("vocab_rule", ""),
        "answer_requests": answers.get("requests"), "answer_tokens": answers.get("tokens"),
        "window_tokens": data.get("tokens_through_target"), "target_fingerprint": card.get("target_fingerprint"),
    }


def coverage(kept: list[int], runs: list[dict[str, Any]]) -> dict[str, Any]:
    keep = set(kept)
    total = sum(len(r["output_ids"]) for r in runs)
    hit = sum(t in keep for r in runs for t in r["output_ids"])
    hit_prompt = sum(t in keep or t in set(r["prompt_ids"]) for r in runs for t in r["output_ids"])
    return {"outputs": len(runs), "tokens": total, "kept": round(hit / max(total, 1), 4),
            "kept_or_in_prompt": round(hit_prompt / max(total, 1), 4)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specviz.cli.draft_vocab", description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M)",
                    help="the target's display name (the default pair's by default)")
    ap.add_argument("--vocab-size", type=int, default=151936, help="the draft head's rows (logits width)")
    ap.add_argument("--eos", default="151643,151645", help="end-of-text ids, always kept (comma-separated)")
    ap.add_argument("--work", type=Path, default=None, help="the learned head's training work directory")
    ap.add_argument("--size", type=int, default=16384, help="kept ids with --work (K)")
    ap.add_argument("--eval", type=Path, default=None, help="the target's outputs to measure coverage on (JSON)")
    ap.add_argument("--eval-note", default="", help="where the --eval outputs came from (recorded)")
    ap.add_argument("--out", type=Path, default=None, help="default: assets/draft_vocab/<target>.json")
    args = ap.parse_args(argv)
    eos = [int(x) for x in args.eos.split(",") if x.strip()]
    name = DV.slug(args.target)
    if args.work is not None:
        kept, prov = from_work(args.work, args.size, eos, args.vocab_size)
    else:
        kept, prov = from_learned_head(name)
        kept = sorted(set(kept) | set(eos))
    prov["size"] = len(kept)
    if args.eval is not None:
        prov["coverage"] = {**coverage(kept, json.loads(args.eval.read_text())), "note": args.eval_note}
    vocab = DV.DraftVocab(tuple(kept), args.vocab_size, args.target, prov)
    out = args.out or DV.ASSETS / f"{name}.json"
    DV.save(out, vocab)
    print(f"{out}: {vocab.size:,} of {args.vocab_size:,} ids; {json.dumps(prov)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
