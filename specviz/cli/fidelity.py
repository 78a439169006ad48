"""``python -m specviz.cli.fidelity``: what the int8 target costs in fidelity against the bf16 target
(:mod:`specviz.hardware.fidelity` measures; this reads the prompts, loads both executions and writes
the JSON the page shows)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..hardware.fidelity import compare, summary_line
from .bench import DEFAULT_PROMPTS, read_prompts


def main(argv: list[str] | None = None) -> int:
    from ..hardware.machine import this_machine
    from ..models import DEFAULT_PRESET, load_pair

    ap = argparse.ArgumentParser(prog="python -m specviz.cli.fidelity", description=__doc__.split("\n\n")[0])
    ap.add_argument("--exec", dest="execution", default="int8")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = read_prompts(args.prompts)
    reference = load_pair(DEFAULT_PRESET, target_exec="bf16")
    other = load_pair(DEFAULT_PRESET, target_exec=args.execution)
    doc = {"exec": args.execution, "reference": "bf16", "tokens": args.tokens,
           "machine": this_machine("cpu").describe(), "target": reference.target_name,
           **compare(reference, other, [(r["prompt"], bool(r.get("chat", True))) for r in rows], args.tokens)}
    print(summary_line(doc))
    print(json.dumps(doc, indent=1, ensure_ascii=False))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
