"""Record the sweeps shipped in assets/sweeps.json (shown on the Sweeps tab when the page opens).

    python scripts/record_sweeps.py                  # default offline pair, 3 repeats, on this machine
    python scripts/record_sweeps.py --repeats 5      # more repeats: narrower medians, longer recording

A γ sweep and a drafter shoot-out of the default pair on the first example prompt, greedy, 48 new
tokens, and an ε sweep on the second (translation, sampled at T = 0.7: ε only shows where α < 1); metrics only (no traces), with the machine, the date and the settings.
Every configuration runs `--repeats` times, round-robin with standard decoding (each round: the
baseline, then every configuration once; specviz.experiments.repeats), and each point is the median
of its repeats with their min–max range and how many were flagged noisy.  Record on an idle
machine all the same: the numbers are timings (about `--repeats` times as long as one run each).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specviz.experiments import recorded, shootout, sweeps  # noqa: E402
from specviz.experiments.repeats import REPEATS  # noqa: E402
import specviz.hardware  # noqa: E402,F401  (installs the probe: load_pair's "auto" execution)
from specviz.models import DEFAULT_PRESET, load_pair  # noqa: E402
from specviz.models.presets import resolve_preset  # noqa: E402
from specviz.models.int8 import cpu_model  # noqa: E402
from specviz.serving.service import prepare  # noqa: E402

# Fewer points than the page's sweeps (γ 1…12, seven ε) so that recording takes minutes, not tens.
GAMMAS = (1, 2, 3, 4, 5, 6, 8, 10, 12)
EPSILONS = (0.0, 0.1, 0.2, 0.4, 1.0)
MAX_NEW_TOKENS = 48
EPS_TEMPERATURE, EPS_GAMMA = 0.7, 4


def machine_label(pair) -> str:
    """The machine as the probe names it (CPU, ISA, threads, torch), which tells two EPYCs apart."""
    label = ((getattr(pair.probe, "machine", None) or {}).get("label") if pair.probe is not None else None)
    return f"{label} ({pair.device})" if label else f"{cpu_model()} ({pair.device})"


def _steps(label: str, gen, bar: tqdm) -> list:
    """Drain a sweep generator, moving the bar per finished run; returns the points (or rows) last yielded."""
    out, last = [], 0.0
    for frac, msg, res in gen:
        bar.set_postfix_str(f"{label}: {msg}"[:60])
        if res is not None:  # the points (the shoot-out: its rows) so far, each with the repeats it has
            out = res
        bar.update(max(frac - last, 0.0))
        last = frac
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=recorded.DEFAULT_PATH)
    ap.add_argument("--preset", default=DEFAULT_PRESET,
                    help="the pair: a preset's name or short id (default: the default pair; `tiny` to try the script)")
    ap.add_argument("--repeats", type=int, default=REPEATS,
                    help=f"runs per configuration, round-robin with standard decoding (default {REPEATS})")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    example = json.loads((ROOT / "assets" / "examples.json").read_text(encoding="utf-8"))[0]
    pair = load_pair(resolve_preset(args.preset))
    req = prepare(pair, example["prompt"], gamma=5, temperature=0.0, max_new_tokens=MAX_NEW_TOKENS, seed=0)
    # ε only shows where α < 1: greedy on the code example accepts every draft at ε = 0 already.  So the ε sweep
    # samples (T = 0.7) on the translation example, as the page's second example does.
    eps_example = json.loads((ROOT / "assets" / "examples.json").read_text(encoding="utf-8"))[1]
    eps_req = prepare(pair, eps_example["prompt"], gamma=EPS_GAMMA, temperature=EPS_TEMPERATURE,
                      max_new_tokens=MAX_NEW_TOKENS, seed=1)
    with tqdm(total=3.0, desc="record", unit="sweep", bar_format="{l_bar}{bar}| {n:.2f}/{total:.0f} {postfix}") as bar:
        gamma = _steps("γ sweep", sweeps.gamma_sweep(req, GAMMAS, repeats=args.repeats), bar)
        eps = _steps("ε sweep", sweeps.epsilon_sweep(eps_req, EPSILONS, repeats=args.repeats), bar)
        rows = _steps("shoot-out", shootout.run(req, repeats=args.repeats), bar)
    rec = recorded.Recorded(
        schema="specviz.sweeps", version=recorded.VERSION, machine=machine_label(pair),
        date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        load_average=[round(x, 2) for x in os.getloadavg()], repeats=args.repeats, models={"draft": pair.draft_name, "target": pair.target_name},
        prompt=example["prompt"], settings=req.settings.as_dict(), gamma=gamma, epsilon=eps,
        epsilon_prompt=eps_example["prompt"], epsilon_settings=eps_req.settings.as_dict(),
        shootout=[r.as_dict() for r in rows])
    text = rec.to_json()
    recorded.parse(text)  # what the page will read must load
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} ({len(text):,} bytes)")
    for r in rows:
        if r.error:
            print(f"  {r.label}: did not run ({r.error})")
            continue
        extra = f", α {r.alpha:.2f}, c {r.c:.3f}" if r.alpha is not None and r.c is not None else ""
        spread = f" ({r.speedup_lo:.2f}–{r.speedup_hi:.2f})" if r.speedup_lo is not None else ""
        flagged = f", timings flagged in {r.noisy} of {r.repeats} repeats" if r.noisy else ""
        print(f"  {r.label}: {r.tokens_per_s:.2f} tok/s, {r.speedup or 0:.2f}×{spread}{extra}{flagged}")


if __name__ == "__main__":
    main()
