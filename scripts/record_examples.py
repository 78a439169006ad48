"""Record the example runs shipped in assets/traces/ (shown before any model loads).

    python scripts/record_examples.py            # default offline pair, on this machine
    python scripts/record_examples.py 6-summarisation   # only the named ones

Each file is a specviz recording (speculative + standard trace) exactly as the
app exports it; the page loads the first one at start-up.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specviz.core.settings import DecodeSettings  # noqa: E402
import specviz.hardware  # noqa: E402,F401  (installs the probe: load_pair's "auto" execution)
from specviz.models import DEFAULT_PRESET, encode_prompt, load_pair  # noqa: E402
from specviz.serving.service import race  # noqa: E402
from specviz.serving.service import Request  # noqa: E402
from specviz.trace import recording_to_json  # noqa: E402

EXAMPLES = {
    "1-code-greedy": ("Write a Python function `fibonacci(n)` that returns the n-th Fibonacci number iteratively, "
                      "with a docstring.", DecodeSettings(gamma=5, max_new_tokens=64)),
    "2-chat-greedy": ("Explain in three sentences what a hash table is and why lookups are fast.",
                      DecodeSettings(gamma=5, max_new_tokens=48)),
    "3-translation-sampled": ('Translate into French: "The weather is nice today, so we are going to the park with '
                              'the children."', DecodeSettings(gamma=4, temperature=0.7, max_new_tokens=40, seed=1)),
    "4-slow-case": ("Invent twelve random made-up words, each with a surprising one-line definition.",
                    DecodeSettings(gamma=8, temperature=1.2, max_new_tokens=40, seed=2)),

}
# The page's other examples, with the form's defaults (a room's identical clicks replay these).
_PAGE = {e["label"]: e["prompt"] for e in json.loads((ROOT / "assets" / "examples.json").read_text(encoding="utf-8"))}
EXAMPLES["5-code-binary-search"] = (_PAGE["Code: binary search"], DecodeSettings(gamma=5, max_new_tokens=48))
EXAMPLES["6-summarisation"] = (_PAGE["Summarisation"], DecodeSettings(gamma=5, max_new_tokens=48))


def main() -> None:
    only = set(sys.argv[1:])  # names to record (default: all)
    pair = load_pair(DEFAULT_PRESET)
    out = ROOT / "assets" / "traces"
    out.mkdir(parents=True, exist_ok=True)
    # One race first, not kept: a process's first passes pay one-time costs (the draft's traced steps, the
    # allocator's first pages) that would flag the first recording's timings as noisy.
    warm_prompt, warm_settings = next(iter(EXAMPLES.values()))
    for _ in race(Request(pair, warm_prompt, encode_prompt(pair, warm_prompt), warm_settings)):
        pass
    for name, (prompt, settings) in EXAMPLES.items():
        if only and name not in only:
            continue
        req = Request(pair, prompt, encode_prompt(pair, prompt), settings)
        spec = std = None
        for up in race(req):
            spec, std = up.spec, up.std
        s = spec.summary()
        t = spec.timing
        print(f"{name}: {spec.n_tokens} tokens, alpha {s.alpha or 0:.2f}, "
              f"speedup {s.tokens_per_s / std.summary().tokens_per_s:.2f}x, target {pair.target_exec}, "
              f"timing {'reliable' if t is None or t.reliable else 'FLAGGED: ' + t.why}")
        (out / f"{name}.json").write_text(recording_to_json(spec, std, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
