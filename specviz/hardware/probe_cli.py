"""``python -m specviz.hardware.probe_cli``: full curves for the roofline, and recordings to ship."""

from __future__ import annotations

import json
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    """python -m specviz.hardware.probe_cli [--preset default] [--out FILE]: time every execution of the
    pair's target over FULL_KS (and the draft's step), print the curves, store them in the probe cache
    and, with --out, as a recording the page can show beside this machine's (assets/hardware/).

    It measures whatever the load when it starts (an operator asked), but watches the machine while it runs
    (:class:`specviz.models.busy.Watch`): where other work took the cores it needed, the timings are kept only
    as a flagged record, nothing is written to --out, and the exit status is 1."""
    import argparse

    from ..models import load_pair, resolve_preset
    from ..models.busy import Watch
    from ..models.convert import offline_pack
    from ..models.executions import apply, candidates
    from ..models.presets import PRESETS
    from .probe import probe_target
    from .roofline import step_bytes
    from .timer import PREFIX, draft_step_ms

    ap = argparse.ArgumentParser(prog="python -m specviz.hardware.probe", description=main.__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="default")
    ap.add_argument("--out", default=None, help="also write the result here (JSON)")
    ap.add_argument("--note", default="", help="how the figures were obtained (written into --out)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    preset = resolve_preset(args.preset)
    pair = load_pair(preset, target_exec="bf16")
    target = pair.target
    ref = PRESETS[preset].target

    def build(execution: str):
        if execution == "int8" and offline_pack(ref):  # the app's int8: the pair run from its GGUFs as stored
            return load_pair(preset, target_exec="int8").target
        return apply(target, execution, copy_model=True)

    watch = Watch()  # the draft's step is part of what is measured
    draft_ms = draft_step_ms(pair.draft, pair.vocab_size)
    probe, _ = probe_target(target, PRESETS[preset].target, pair.dtype, pair.vocab_size,
                            build=build, draft_ms=draft_ms,
                            alpha=PRESETS[preset].typical_alpha, candidates=candidates(pair.device, pair.dtype),
                            full=True, busy=lambda: False, watch=watch, draft_bytes=step_bytes(pair.draft))
    doc = probe.as_dict() | {"draft": pair.draft_name, "target": pair.target_name,
                             "draft_exec": pair.draft_quant or "bf16", "note": args.note, "prefix": PREFIX}
    print(json.dumps(doc, indent=1))
    if not probe.measured:
        print(f"The machine was busy while it was probed ({json.dumps(probe.busy)}): these timings are not a "
              "measurement of the machine; nothing written" + (f" to {args.out}" if args.out else ""), file=sys.stderr)
        return 1
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
