"""The target answers requests, and every step it takes is a labelled training example.

A batched decode with the KV cache (left-padded prompts, one forward per new token
for the whole batch) records, at each generated position, exactly what the
speculator sees and must predict at run time: the target's last hidden state there
(post final norm, as the verify pass hands it to the drafter) and the target's
top-k next-token probabilities (temperature 1, normalised over the full vocabulary).
Decoding in a batch is what makes this affordable on a CPU: a batch of 48 costs a
little more than twice a single sequence's step.

Most rows decode greedily (the bench's setting, and the text the head meets most);
a share samples at temperature 0.8 so the head also sees less likely continuations.
A shard has the same fields as a window of source text (data.label) plus `valid`:
positions after the row's end-of-text, or never reached, are masked out.
"""

from __future__ import annotations

from pathlib import Path

import torch

SAMPLE_TEMPERATURE = 0.8


@torch.inference_mode()
def decode_labelled(target: torch.nn.Module, prompts: list[list[int]], length: int, top_k: int, pad_id: int,
                    eos_ids: list[int], sample_rows: list[bool], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Decode up to length - 1 new tokens for each prompt.  Row r's window: ids [x_last_prompt,
    y_1, ..., y_{L-1}], hidden[j] = the state that predicts ids[j + 1], top_ids / top_p the
    target's distribution there, valid[j] whether position j is a real token before end-of-text."""
    b, p_len = len(prompts), max(len(p) for p in prompts)
    dev = next(target.parameters()).device
    ids = torch.full((b, p_len), pad_id, dtype=torch.long, device=dev)
    mask = torch.zeros((b, p_len), dtype=torch.long, device=dev)
    for r, p in enumerate(prompts):
        ids[r, p_len - len(p):] = torch.tensor(p)
        mask[r, p_len - len(p):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    out = target.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
    cache, h = out.past_key_values, out.last_hidden_state[:, -1]
    head = target.get_output_embeddings()
    hid = torch.zeros((b, length, h.shape[-1]), dtype=torch.bfloat16)
    win = torch.full((b, length), pad_id, dtype=torch.int32)
    top_ids = torch.zeros((b, length, top_k), dtype=torch.int32)
    top_p = torch.zeros((b, length, top_k), dtype=torch.float16)
    valid = torch.zeros((b, length), dtype=torch.bool)
    win[:, 0] = ids[:, -1].to(torch.int32).cpu()
    alive = torch.ones(b, dtype=torch.bool, device=dev)
    sampled = torch.tensor(sample_rows, dtype=torch.bool, device=dev)
    eos = torch.tensor(sorted(eos_ids), dtype=torch.long, device=dev)
    last_pos = pos[:, -1:]
    for j in range(length):
        valid[:, j] = alive.cpu()
        hid[:, j] = h.to(torch.bfloat16).cpu()
        logits = head(h).float()
        val, idx = logits.topk(top_k, dim=-1)
        top_p[:, j] = torch.exp(val - torch.logsumexp(logits, -1, keepdim=True)).to(torch.float16).cpu()
        top_ids[:, j] = idx.to(torch.int32).cpu()
        if j == length - 1:
            break
        nxt = idx[:, 0]
        if sampled.any():
            draw = torch.multinomial(torch.softmax(logits / SAMPLE_TEMPERATURE, -1).cpu(), 1, generator=gen)[:, 0]
            nxt = torch.where(sampled, draw.to(dev), nxt)
        nxt = torch.where(alive, nxt, torch.full_like(nxt, pad_id))
        win[:, j + 1] = nxt.to(torch.int32).cpu()
        alive &= ~torch.isin(nxt, eos)  # the end-of-text token is fed no further: its position predicts nothing
        if not bool(alive.any()):
            break
        mask = torch.cat([mask, alive[:, None].long()], 1)
        last_pos = last_pos + 1
        out = target.model(input_ids=nxt[:, None], attention_mask=mask, position_ids=last_pos,
                           past_key_values=cache, use_cache=True)
        cache, h = out.past_key_values, out.last_hidden_state[:, -1]
    return {"ids": win, "hidden": hid, "top_ids": top_ids, "top_p": top_p, "valid": valid}


def generate_shards(target: torch.nn.Module, prompts: list[list[int]], out: Path, length: int, top_k: int,
                    pad_id: int, eos_ids: list[int], batch: int, sample_fraction: float, seed: int,
                    desc: str, deadline: float | None = None) -> tuple[list[Path], float]:
    """Decode the prompts in shards of `batch` under `out` (data.cached_shards: kept across runs,
    an interrupted run resumes at the first missing shard, no new shard after `deadline`).
    Returns the shards in order and the seconds they took to compute."""
    from .data import cached_shards

    def compute(i: int, part: list[list[int]]) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + i)  # per shard: resumable, deterministic
        rows = [torch.rand((), generator=gen).item() < sample_fraction for _ in part]
        return decode_labelled(target, part, length, top_k, pad_id, eos_ids, rows, gen)

    parts = [prompts[s: s + batch] for s in range(0, len(prompts), batch)]
    return cached_shards(parts, out, compute, len, desc, "answer", deadline)
