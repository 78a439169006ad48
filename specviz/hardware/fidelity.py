"""What a cheaper execution costs in fidelity: the int8 target against the bf16 target it came from.

An int8 target is a slightly different model.  Speculative decoding with it is exact *for it* (its
verify pass is batch-invariant), but its text can differ from the bf16 target's.  This measures by
how much, on the shipped prompts: the bf16 target decodes each prompt greedily, then both
executions score that same text position by position (teacher forcing), and we report

* TV(p_exec, p_bf16) per position (mean, median, 90th percentile, max), and
* how often the two greedy tokens agree (argmax equal).

    python -m specviz.cli.fidelity [--exec int8] [--tokens 48] [--out assets/hardware/fidelity-int8.json]

The page shows the summary where it names the target's execution.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch

FIDELITY_DIR = Path(__file__).resolve().parents[2] / "assets" / "hardware"


def compare(reference, other, prompts: list[tuple[str, bool]], tokens: int = 48) -> dict:
    """TV and greedy agreement of ``other``'s target against ``reference``'s, along the reference's
    greedy continuation of each (prompt, chat) pair."""
    from ..core.engine import standard_decode
    from ..models import encode_prompt
    from ..core.settings import DecodeSettings

    tvs: list[float] = []
    agree = total = 0
    per_prompt = []
    for prompt, chat in prompts:
        ids = encode_prompt(reference, prompt, chat=chat)
        cont = [t.id for t in standard_decode(reference, ids, DecodeSettings(temperature=0.0,
                                                                              max_new_tokens=tokens)).tokens]
        seq = torch.tensor([ids + cont])
        with torch.inference_mode():
            p = reference.target(seq, logits_to_keep=len(cont)).logits[0].float().softmax(-1)
            q = other.target(seq, logits_to_keep=len(cont)).logits[0].float().softmax(-1)
        tv = (0.5 * (p - q).abs().sum(-1)).tolist()
        same = (p.argmax(-1) == q.argmax(-1)).tolist()
        tvs += tv
        agree += sum(same)
        total += len(same)
        per_prompt.append({"prompt": prompt[:60], "mean_tv": round(statistics.mean(tv), 4),
                           "greedy_agree": round(sum(same) / len(same), 3)})
    tvs.sort()
    return {"positions": total, "mean_tv": round(statistics.mean(tvs), 4), "median_tv": round(statistics.median(tvs), 4),
            "p90_tv": round(tvs[int(0.9 * (len(tvs) - 1))], 4), "max_tv": round(tvs[-1], 4),
            "greedy_agree": round(agree / total, 4), "prompts": per_prompt}


def summary_line(doc: dict) -> str:
    """One sentence for the page: what the execution costs against bf16."""
    return (f"{doc['exec']} against the bf16 target: mean TV {doc['mean_tv']:.3f} per position "
            f"(90% of positions ≤ {doc['p90_tv']:.3f}), greedy tokens agree on {100 * doc['greedy_agree']:.1f}% "
            f"of {doc['positions']} positions of the shipped prompts")


def load(execution: str) -> dict | None:
    """The shipped measurement for ``execution`` (assets/hardware/fidelity-<exec>.json), if any."""
    try:
        return json.loads((FIDELITY_DIR / f"fidelity-{execution}.json").read_text())
    except (OSError, ValueError):
        return None
