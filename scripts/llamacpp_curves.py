"""Record llama.cpp's curves on this machine for the This machine tab (issue 35): its target's pass over k
tokens after the probe's 16-token prefix (k = 1 is its decoding step), its draft's step, and its own greedy
speculative decoding (the 0.5B GGUF drafting for the 1.5B Q4_K_M GGUF, γ fixed), beside its plain decoding,
on the bench's prompts.  The same GGUF files specviz's default pair is converted from.

    python scripts/llamacpp_curves.py --out assets/hardware/llamacpp-epyc-avx2.json

Needs llama-cpp-python built from source (never a requirement):
    CMAKE_ARGS="-DGGML_NATIVE=ON" pip install --no-binary llama-cpp-python llama-cpp-python

The speculative loop is specviz's greedy rule written over llama.cpp's own kernels and KV cache: the draft
proposes γ tokens one step at a time, the target scores them in one pass (logits for every position), the
longest prefix equal to the target's argmax is kept plus the target's own next token, both caches roll
back to it.  Its text equals llama.cpp's plain greedy text wherever its passes give the same argmax as its
steps (counted and reported).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.cli import bench_llamacpp  # noqa: E402
from specviz.hardware.machine import this_machine  # noqa: E402
from specviz.hardware.probe import PREFIX  # noqa: E402
from specviz.models.presets import OFFLINE_PACKS  # noqa: E402
from specviz.models.tokens import encode_prompt  # noqa: E402

KS = (1, 2, 4, 6, 8, 16)


class Model:
    def __init__(self, path: Path, threads: int, n_ctx: int = 1024):
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(path), n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx,
                         n_batch=512, verbose=False)
        self.vocab = self.llm.n_vocab()

    def feed(self, ids: list[int], at: int, every: bool = True) -> np.ndarray:
        """Keep the first ``at`` cached tokens, feed ``ids`` after them: the logits of every one of them
        [len(ids), V] (a verify pass), or with ``every=False`` of the last only (a prompt pass: llama.cpp
        then skips the head for the others, as its own generation loop does)."""
        llm = self.llm
        llm._ctx.kv_cache_seq_rm(-1, at, -1)  # the rollback: the slots from ``at`` on are dropped
        for i in range(0, len(ids), llm.n_batch):
            chunk = ids[i:i + llm.n_batch]
            llm._batch.set_batch(batch=chunk, n_past=at + i, logits_all=every)
            llm._ctx.decode(llm._batch)
        rows = len(chunk) if every else 1
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(rows * self.vocab,)).reshape(rows, self.vocab).copy()

    def pass_ms(self, prefix: list[int], k: int, reps: int) -> float:
        times = []
        self.feed(prefix, 0, every=False)
        tokens = (prefix * (k // len(prefix) + 1))[:k]
        for _ in range(reps):
            t0 = time.perf_counter()
            self.feed(tokens, len(prefix))
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


def plain(target: Model, prompt: list[int], n: int, eos: set[int]) -> tuple[list[int], float]:
    """llama.cpp's plain greedy decoding, one token a pass (its own generation loop's work)."""
    out, t0 = [], time.perf_counter()
    logits = target.feed(prompt, 0, every=False)[-1]
    while len(out) < n:
        x = int(logits.argmax())
        out.append(x)
        if x in eos:
            break
        logits = target.feed([x], len(prompt) + len(out) - 1)[-1]
    return out, time.perf_counter() - t0


def speculative(target: Model, draft: Model, prompt: list[int], n: int, gamma: int, eos: set[int]) -> dict:
    ids, t0 = list(prompt), time.perf_counter()
    target.feed(prompt[:-1], 0, every=False)
    draft.feed(prompt[:-1], 0, every=False)
    held_t = held_d = len(prompt) - 1  # how many of ids each cache holds
    rounds = accepted = 0
    while len(ids) - len(prompt) < n:
        drafts, logits = [], draft.feed(ids[held_d:], held_d)[-1]
        for i in range(gamma):
            drafts.append(int(logits.argmax()))
            if i + 1 < gamma:
                logits = draft.feed([drafts[-1]], len(ids) + i)[-1]
        scores = target.feed(ids[held_t:] + drafts, held_t)[len(ids) - held_t - 1:]
        best = scores.argmax(-1)
        keep = 0
        while keep < gamma and int(best[keep]) == drafts[keep]:
            keep += 1
        rounds, accepted = rounds + 1, accepted + keep
        held_t, held_d = len(ids) + keep, len(ids) + min(keep, gamma - 1)  # the caches' parts still true
        for x in drafts[:keep] + [int(best[keep])]:
            ids.append(x)
            if x in eos or len(ids) - len(prompt) >= n:
                break
        if ids[-1] in eos:
            break
    seconds = time.perf_counter() - t0
    return {"ids": ids[len(prompt):], "seconds": seconds, "rounds": rounds, "accepted": accepted}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=Path, default=Path("assets/prompts.jsonl"))
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--gammas", default="3,5")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from specviz.models.convert import ensure_offline

    packs = OFFLINE_PACKS["qwen2.5-coder-0.5b"], OFFLINE_PACKS["qwen2.5-coder-1.5b"]
    draft_path, target_path = (bench_llamacpp.gguf_file(p.ref) for p in packs)
    tok = AutoTokenizer.from_pretrained(str(ensure_offline(packs[1], None)))
    eos = {tok.convert_tokens_to_ids(t) for t in packs[1].extra_eos} | {tok.eos_token_id}
    target, draft = Model(target_path, args.threads), Model(draft_path, args.threads)
    prefix = tok("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n").input_ids[:PREFIX]
    prefix = (prefix * (PREFIX // max(1, len(prefix)) + 1))[:PREFIX]
    target.pass_ms(prefix, 1, 2)  # warm-up
    curve = {k: round(target.pass_ms(prefix, k, args.reps), 1) for k in KS}
    draft_ms = round(draft.pass_ms(prefix, 1, args.reps), 1)
    print("target T(k):", curve, " draft step:", draft_ms, "ms", flush=True)
    prompts = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    gammas = [int(g) for g in args.gammas.split(",")]
    rows = []
    for p in prompts:
        text = p.get("prompt") or p.get("text")
        ids = encode_prompt(SimpleNamespace(tokenizer=tok), text, chat=bool(p.get("chat", True)))  # as the bench
        row = {"prompt": text[:60]}
        plain(target, ids, 4, eos)  # warm-up for this prompt's length
        ref, sec = plain(target, ids, args.max_new_tokens, eos)
        row["plain"] = {"tokens": len(ref), "tok_s": round(len(ref) / sec, 2)}
        for g in gammas:
            out = speculative(target, draft, ids, args.max_new_tokens, g, eos)
            row[f"spec_g{g}"] = {"tokens": len(out["ids"]), "tok_s": round(len(out["ids"]) / out["seconds"], 2),
                                 "accept": round(out["accepted"] / max(1, out["rounds"] * g), 3),
                                 "same_text": out["ids"] == ref}
        print(row, flush=True)
        rows.append(row)

    def med(key: str, field: str = "tok_s") -> float:
        return round(statistics.median(r[key][field] for r in rows), 2)

    import llama_cpp

    machine = this_machine().as_dict()
    machine.pop("torch", None)  # llama.cpp ran, not torch
    machine["label"] = machine["label"].split(" (torch")[0]
    spec = {f"gamma_{g}": {"tok_s": med(f"spec_g{g}"), "acceptance": med(f"spec_g{g}", "accept"),
                           "same_text": sum(r[f"spec_g{g}"]["same_text"] for r in rows)} for g in gammas}
    c = draft_ms / curve[1]
    best = max(spec.values(), key=lambda s: s["tok_s"])
    by_gamma = ", ".join(f"γ={g}: {spec['gamma_' + str(g)]['tok_s']}" for g in gammas)
    note = (f"llama.cpp (llama-cpp-python {llama_cpp.__version__} built from source, {args.threads} threads) on the GGUF files specviz's default pair comes from: "
            f"its Q4_K_M target's pass over k tokens after a {PREFIX}-token prefix; plain decoding "
            f"{med('plain')} tok/s, its own greedy speculation (0.5B GGUF draft, c = {c:.2f}) "
            f"{best['tok_s']} tok/s at best ({by_gamma}), "
            f"median of {len(rows)} prompts of assets/prompts.jsonl, {args.max_new_tokens} tokens. "
            f"Its verify pass climbs with k (compute-bound 4-bit dequantisation) and its draft step costs "
            f"{c:.2f} of a target step: a round costs more than the tokens it yields")
    doc = {"name": "llama.cpp", "reference": "llama.cpp", "machine": machine,
           "model": "offline:qwen2.5-coder-1.5b", "target": packs[1].display + " GGUF", "draft": packs[0].display + " GGUF",
           "curves": {"llama.cpp Q4_K_M": curve}, "choice": "llama.cpp Q4_K_M", "draft_ms": draft_ms,
           "alpha": None, "measured": True, "prefix": PREFIX, "note": note,
           "plain_tok_s": med("plain"), "speculative": spec, "prompts": rows,
           "recorded": time.strftime("%Y-%m-%d")}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: v for k, v in doc.items() if k != "prompts"}, indent=1))


if __name__ == "__main__":
    main()
