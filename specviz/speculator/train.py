"""Train an MLP speculator for a model pair's target: ``python -m specviz.speculator.train``.

1. Pick windows of Python source from site-packages (data.py) and run the frozen
   target over them once, caching its hidden states and top-k next-token
   probabilities (the labels: self-distillation).  This is most of the cost.
2. Choose the restricted vocabulary V_r: the tokens of the training windows and of
   the target's top-4 predictions on them, the most frequent first, up to
   --max-vocab.  The full 151,936-way softmax would make every training step and
   every draft token ~10x dearer; code rarely needs the rest.
3. Train the stages teacher-forced (stage i reads the true token x_{t+1+i}) with a
   soft cross-entropy against the target's distribution at that position,
   renormalised over its top-k tokens that lie in V_r.
4. Measure per-stage top-1 agreement with the target on held-out files and write
   the weights and a training card (JSON + markdown) next to each other.

Deterministic for a seed (batches come from seeded permutations indexed by step),
resumable (the target pass in shards, training from checkpoints), with a wall-
clock budget that ends the target pass and then training early, saying so.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from . import data as D
from . import store
from ..models.int8 import cpu_model
from .card import write_card
from .model import MLPSpeculator, SpeculatorConfig, head_fingerprint


@dataclass(frozen=True)
class TrainConfig:
    preset: str = "default"
    inner: int = 384
    n_predict: int = 4
    tie: bool = False  # share the stages' weights (model.SpeculatorConfig.tie)
    max_vocab: int = 16384
    seq_len: int = 256
    train_seqs: int = 160  # windows of installed Python source
    heldout_seqs: int = 32
    gen_requests: int = 448  # the target's own answers to requests (generate.py), the larger share
    gen_heldout: int = 64
    gen_batch: int = 64
    gen_sample_fraction: float = 0.25
    chat_fraction: float = 0.5
    top_k: int = 16
    batch: int = 256
    epochs: float = 2.0
    lr: float = 2e-3
    weight_decay: float = 0.01
    warmup: int = 20
    seed: int = 0
    threads: int = 2
    data_minutes: float = 25.0  # the target pass starts no new shard after this
    max_minutes: float = 44.0  # the whole run, target pass included; training stops in time to save
    checkpoint_every: int = 50
    stop_at: int = 0  # end this process after this step (0: run to the end); a later run resumes there
    eval_every: int = 200

    def data_spec(self, fingerprint: str) -> D.DataSpec:
        return D.DataSpec(fingerprint, self.seq_len, self.train_seqs, self.heldout_seqs, self.chat_fraction,
                          self.top_k, self.seed, gen_requests=self.gen_requests, gen_heldout=self.gen_heldout,
                          gen_batch=self.gen_batch, gen_sample_fraction=self.gen_sample_fraction)


@dataclass
class Progress:
    """What a checkpoint carries besides the weights."""

    step: int = 0
    minutes: float = 0.0  # training minutes spent before this process
    loss_curve: list = field(default_factory=list)  # [step, mean training loss since the last point]
    heldout_curve: list = field(default_factory=list)  # [step, held-out loss, per-stage top-1]


# ---- vocabulary, batches, loss --------------------------------------------------------------


def build_vocab(train: dict[str, torch.Tensor], max_vocab: int, always: list[int], vocab_size: int,
                predicted: int = 4) -> torch.Tensor:
    """V_r: corpus tokens and the target's top-`predicted` guesses, most frequent first, ascending ids."""
    ok = train["valid"]
    ids = torch.cat([train["ids"][ok].reshape(-1), train["top_ids"][ok][:, :predicted].reshape(-1)]).long()
    counts = torch.bincount(ids, minlength=vocab_size).float()
    counts[torch.tensor(always, dtype=torch.long)] = float("inf")
    seen = int((counts > 0).sum())
    order = torch.sort(counts, descending=True, stable=True).indices  # ties: lower id first
    return torch.sort(order[: min(max_vocab, seen)]).values


def lookup_table(vocab_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Full id -> index in V_r, or -1."""
    lut = torch.full((vocab_size,), -1, dtype=torch.long)
    lut[vocab_ids] = torch.arange(len(vocab_ids))
    return lut


def examples(d: dict[str, torch.Tensor], n: int) -> torch.Tensor:
    """[E, 2] (window, t) of every example: h_t with the n labels at t+1..t+n all on real tokens."""
    return d["valid"][:, n:].nonzero()


def batch_at(d: dict[str, torch.Tensor], pairs: torch.Tensor, n: int, lut: torch.Tensor):
    """Examples (window, t): h_t, x_{t+1..t+n}, and the labels at t+1..t+n."""
    s, t = pairs[:, 0], pairs[:, 1]
    offs = t[:, None] + 1 + torch.arange(n)
    hidden = d["hidden"][s, t]
    tokens = d["ids"][s[:, None], offs].long()
    lab = lut[d["top_ids"][s[:, None], offs].long()]  # [B, n, k] in V_r, -1 outside
    p = d["top_p"][s[:, None], offs].float() * (lab >= 0)
    return hidden, tokens, lab.clamp(min=0), p


def soft_ce(logits: list[torch.Tensor], lab: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Per-stage cross-entropy against the target's top-k mass inside V_r (renormalised);
    positions where none of it lies in V_r carry no signal and are left out."""
    losses = []
    for i, z in enumerate(logits):
        mass = p[:, i].sum(-1)
        keep = mass > 0
        logq = torch.log_softmax(z.float(), -1).gather(-1, lab[:, i])
        ce = -(p[:, i] * logq).sum(-1) / mass.clamp(min=1e-9)
        losses.append(ce[keep].mean() if keep.any() else z.sum() * 0)
    return torch.stack(losses)


@torch.inference_mode()
def evaluate(spec: MLPSpeculator, d: dict[str, torch.Tensor], lut: torch.Tensor, batch: int = 512) -> dict:
    """Held-out teacher-forced numbers: loss, top-1 agreement with the target's argmax per
    stage, and the chance that stages 0..i all agree (a greedy round's accepted prefix)."""
    n = spec.config.n_predict
    ex = examples(d, n)
    total = len(ex)
    agree, chain, loss, count = torch.zeros(n), torch.zeros(n), torch.zeros(n), 0
    for s in range(0, total, batch):
        index = ex[s: s + batch]
        hidden, tokens, lab, p = batch_at(d, index, n, lut)
        logits = spec(hidden, tokens)
        loss += soft_ce(logits, lab, p) * len(index)
        guess = torch.stack([spec.vocab_ids[z.argmax(-1)] for z in logits], 1)  # [B, n] full ids
        offs = index[:, 1:2] + 1 + torch.arange(n)
        truth = d["top_ids"][index[:, :1], offs, 0].long()
        hit = (guess == truth).float()
        agree += hit.sum(0)
        chain += hit.cumprod(1).sum(0)
        count += len(index)
    return {"loss": round(float(loss.mean() / count), 4), "top1": [round(float(a / count), 4) for a in agree],
            "chain": [round(float(c / count), 4) for c in chain],
            "expected_accepted_greedy": round(float(chain.sum() / count), 3)}


def _lr(step: int, total: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


# ---- the run ----------------------------------------------------------------------------------


def default_out(pair: Any, preset: str) -> Path:
    from ..models import DEFAULT_PRESET, resolve_preset

    base = store.ASSETS if resolve_preset(preset) == DEFAULT_PRESET else store.user_dir()
    return base / store.slug(pair.target_name)


def train(cfg: TrainConfig, pair: Any = None, out: Path | None = None, work: Path | None = None,
          site: Path | None = None) -> dict:
    """Run (or resume) a training; returns the card (also written next to the weights)."""
    t_start = time.monotonic()
    deadline = t_start + cfg.max_minutes * 60
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    if pair is None:
        from .. import hardware  # noqa: F401  (installs the probe: load_pair's "auto" execution)
        from ..models import load_pair, resolve_preset

        pair = load_pair(resolve_preset(cfg.preset), draft_quant=None, target_exec="bf16")  # trains on the target as shipped
    target = pair.target
    fp = head_fingerprint(target)
    spec_data = cfg.data_spec(fp)
    out = out or default_out(pair, cfg.preset)
    work = work or store.user_dir() / "work" / f"{store.slug(pair.target_name)}-{spec_data.key()}"

    # 1. The target pass (cached).
    t0 = time.monotonic()
    train_seqs, held_seqs, files = D.select(pair.tokenizer, spec_data, site)
    if not train_seqs or not held_seqs:
        raise SystemExit(f"not enough Python source of {cfg.seq_len}+ tokens under {site or D.site_packages()}")
    data_deadline = t0 + cfg.data_minutes * 60
    held_shards, held_s = D.precompute(target, held_seqs, work / "heldout", cfg.top_k, desc="target pass, held-out")
    shards, train_s = D.precompute(target, train_seqs, work / "train", cfg.top_k, desc="target pass, training",
                                   deadline=data_deadline)
    # The target's own answers (the paper's second stage): the held-out ones first, so a
    # time budget shortens the training answers, never the measurement.
    from ..models import encode_prompt
    from . import generate as G

    gen_args = dict(length=cfg.seq_len, top_k=cfg.top_k, pad_id=_pad_id(pair), eos_ids=list(pair.eos_token_ids),
                    batch=cfg.gen_batch, sample_fraction=cfg.gen_sample_fraction, seed=cfg.seed)
    req_held, req_train = D.requests(spec_data, site)
    gheld, gheld_s = G.generate_shards(target, [encode_prompt(pair, r) for r in req_held], work / "gen-heldout",
                                       desc="target answers, held-out", **gen_args)
    gtrain, gtrain_s = G.generate_shards(target, [encode_prompt(pair, r) for r in req_train], work / "gen-train",
                                         desc="target answers, training", deadline=data_deadline, **gen_args)
    gen_held = D.load_shards(gheld)
    held = _cat(D.load_shards(held_shards), gen_held)
    site_tr, gen_tr = D.load_shards(shards), D.load_shards(gtrain)
    tr = _cat(site_tr, gen_tr)
    data_minutes = (held_s + train_s + gheld_s + gtrain_s) / 60
    n_answers = int(gen_tr["ids"].shape[0]) if gen_tr else 0
    answers = {"requests": n_answers, "heldout_requests": len(req_held),
               "tokens": int(gen_tr["valid"].sum()) if gen_tr else 0,
               "sampled_fraction": cfg.gen_sample_fraction, "first_requests": req_train[:5]}

    # 2. V_r and the model.
    vocab_ids = build_vocab(tr, cfg.max_vocab, list(pair.eos_token_ids), pair.vocab_size)
    lut = lookup_table(vocab_ids, pair.vocab_size)
    hidden_size = tr["hidden"].shape[-1]
    spec = MLPSpeculator(SpeculatorConfig(hidden_size, cfg.inner, cfg.n_predict, cfg.tie)).attach(target, vocab_ids)
    params = [p for p in spec.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    train_ex = examples(tr, cfg.n_predict)
    n_examples = len(train_ex)
    per_epoch = max(1, n_examples // cfg.batch)
    total = max(1, int(cfg.epochs * per_epoch))

    # 3. Train, resuming from a checkpoint of the same run.
    ckpt = work / f"ckpt-{_run_key(cfg, vocab_ids)}.pt"
    prog = Progress()
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        spec.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        prog = Progress(**state["progress"])
    resumed_from = prog.step
    t_train = time.monotonic()
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=tr["hidden"].dtype == torch.bfloat16
                              and target.get_output_embeddings().weight.dtype == torch.bfloat16)
    stopped_by_time, running, seen_since = False, 0.0, 0

    def save_ckpt() -> None:
        minutes = prog.minutes + (time.monotonic() - t_train) / 60
        tmp = ckpt.with_suffix(".tmp")
        torch.save({"model": spec.state_dict(), "opt": opt.state_dict(),
                    "progress": asdict(dataclasses.replace(prog, minutes=minutes))}, tmp)
        tmp.replace(ckpt)

    spec.train()
    with tqdm(total=total, initial=prog.step, desc="training", unit="step") as bar:
        while prog.step < total:
            if cfg.stop_at and prog.step >= cfg.stop_at:
                break
            if time.monotonic() > deadline - 90:  # keep time to evaluate and save
                stopped_by_time = True
                bar.write(f"time budget reached at step {prog.step} of {total}")
                break
            epoch, k = divmod(prog.step, per_epoch)
            perm = torch.randperm(n_examples, generator=torch.Generator().manual_seed(cfg.seed * 100_003 + epoch))
            index = train_ex[perm[k * cfg.batch : (k + 1) * cfg.batch]]
            for g in opt.param_groups:
                g["lr"] = cfg.lr * _lr(prog.step, total, cfg.warmup)
            hidden, tokens, lab, p = batch_at(tr, index, cfg.n_predict, lut)
            with autocast:
                logits = spec(hidden, tokens)
            loss = soft_ce(logits, lab, p)
            opt.zero_grad(set_to_none=True)
            loss.sum().backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            prog.step += 1
            running, seen_since = running + float(loss.detach().mean()), seen_since + 1
            bar.set_postfix(loss=f"{float(loss.detach().mean()):.3f}")
            bar.update(1)
            if prog.step % 10 == 0 or prog.step == total:
                prog.loss_curve.append([prog.step, round(running / seen_since, 4)])
                running, seen_since = 0.0, 0
            if prog.step % cfg.eval_every == 0 and prog.step < total:
                spec.eval()
                ev = evaluate(spec, held, lut)
                spec.train()
                prog.heldout_curve.append([prog.step, ev["loss"], ev["top1"]])
                bar.write(f"step {prog.step}: held-out loss {ev['loss']}, top-1 per stage {ev['top1']}")
            if prog.step % cfg.checkpoint_every == 0:
                save_ckpt()
    save_ckpt()
    spec.eval()
    final = evaluate(spec, held, lut)
    prog.heldout_curve.append([prog.step, final["loss"], final["top1"]])
    if gen_held:  # on the target's own held-out answers alone: what a run of the app meets
        final["answers"] = evaluate(spec, gen_held, lut)
    train_minutes = prog.minutes + (time.monotonic() - t_train) / 60

    # 4. Weights and card.
    card = {
        "target": pair.target_name,
        "target_fingerprint": fp,
        "preset": cfg.preset,
        "config": asdict(cfg),
        "model": {**spec.config.as_dict(), "params": sum(p.numel() for p in params), "vocab": len(vocab_ids),
                  "frozen_from_target": "input embedding (token inputs) and output head rows V_r (logits)"},
        "data": {
            "source": f"Python files shipped in site-packages ({site or D.site_packages()}), and the target's own "
                      f"answers to requests built from them (documented functions) and to SQL and algorithm exercises",
            "train_windows": int(site_tr["ids"].shape[0]) if site_tr else 0, "first_train_files": files[:5],
            "heldout_windows": int(held["ids"].shape[0]), "window_tokens": cfg.seq_len,
            "tokens_through_target": int(tr["valid"].sum() + held["valid"].sum()),
            "answers": answers,
            "chat_fraction": cfg.chat_fraction, "label_top_k": cfg.top_k,
            "heldout_rule": f"files (and SQL/algorithm requests) whose path (text) hash is 0 mod "
                            f"{spec_data.heldout_every}; assets/prompts.jsonl unused, and no request names its "
                            f"functions or schema",
            "vocab_rule": f"tokens of the training windows and the target's top-4 predictions, most frequent first, "
                          f"at most {cfg.max_vocab} (+ end-of-text tokens)",
        },
        "training": {"steps": prog.step, "planned_steps": total, "batch": cfg.batch,
                     "examples_seen": prog.step * cfg.batch, "resumed_from": resumed_from,
                     "stage_predictions_seen": prog.step * cfg.batch * cfg.n_predict,
                     "stopped_by_time_budget": stopped_by_time, "loss_curve": prog.loss_curve,
                     "heldout_curve": prog.heldout_curve},
        "heldout": final,
        "minutes": {"target_pass": round(data_minutes, 1), "training": round(train_minutes, 1),
                    "this_process": round((time.monotonic() - t_start) / 60, 1)},
        "machine": {"cpu": cpu_model(), "threads": cfg.threads, "torch": torch.__version__,
                    "python": platform.python_version(), "load_average_at_end": _load()},
    }
    store.save(out / store.WEIGHTS, spec, {"target_name": pair.target_name, "target_fingerprint": fp,
                                           "heldout_top1": final["top1"]})
    write_card(out, card)
    return card


def _cat(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Two sets of shards (load_shards) as one; either may be empty."""
    return {k: torch.cat([a[k], b[k]]) for k in a} if a and b else a or b


def _pad_id(pair: Any) -> int:
    tok = pair.tokenizer
    pad = getattr(tok, "pad_token_id", None)
    return int(pad if pad is not None else sorted(pair.eos_token_ids)[0])


def _run_key(cfg: TrainConfig, vocab_ids: torch.Tensor) -> str:
    import hashlib

    keep = {k: v for k, v in asdict(cfg).items() if k not in ("threads", "max_minutes", "data_minutes",
                                                               "checkpoint_every", "eval_every", "stop_at")}
    h = hashlib.sha256(json.dumps(keep, sort_keys=True).encode())
    h.update(vocab_ids.numpy().tobytes())
    return h.hexdigest()[:12]


def _load() -> list[float] | None:
    """The 1/5/15-minute load averages: timings on a shared machine need them to be read."""
    try:
        return [round(x, 1) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None




def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specviz.speculator.train", description=__doc__.split("\n\n")[0])
    defaults = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        value = getattr(defaults, f.name)
        if isinstance(value, bool):
            ap.add_argument("--" + f.name.replace("_", "-"), action=argparse.BooleanOptionalAction, default=value)
        else:
            ap.add_argument("--" + f.name.replace("_", "-"), type=type(value), default=value)
    ap.add_argument("--out", type=Path, default=None, help="folder for weights and card (default: assets/speculator/"
                    "<target> for the default pair, else the model cache)")
    ap.add_argument("--work", type=Path, default=None, help="folder for the cached target pass and checkpoints")
    args = vars(ap.parse_args(argv))
    out, work = args.pop("out"), args.pop("work")
    card = train(TrainConfig(**args), out=out, work=work)
    print(json.dumps({"heldout": card["heldout"], "minutes": card["minutes"], "steps": card["training"]["steps"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
