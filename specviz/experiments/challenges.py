"""Guided challenges for a workshop room: short tasks done with the live models, each checked from the
runs the learner made (never by asking them), with a hint and what they should see and why.

Pure Python: the checks (`specviz.experiments.challenge_checks`, over the runs of
`specviz.experiments.challenge_runs`) read the recorded traces; the Challenges tab
(`specviz.ui.challenges_ui`) keeps each browser session's runs and progress.

    verdicts = check_all([Run(spec=spec, std=std), ...], Given(answer="middle"))
    verdicts["lose"].passed, verdicts["lose"].message
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from .challenge_checks import (BIAS_VISIBLE, MACHINE_BANDS, check_bias, check_block, check_correction, check_exact,
                               check_lookup, check_lose, check_machine, check_tree)
from .challenge_runs import Given, Run, Verdict


@dataclass(frozen=True, kw_only=True)
class Challenge:
    key: str
    title: str
    task: str  # what to do, in one or two sentences
    hint: str  # where to start
    why: str  # what the learner should see, and why (the theory)
    checker: Callable[[Sequence[Run], Given], Verdict]
    answers: tuple[tuple[str, str], ...] = ()  # (label, key) choices, for a challenge that asks for an answer

    def check(self, runs: Sequence[Run], given: Given | None = None) -> Verdict:
        """The verdict on the learner's runs (oldest first); never raises on what a trace holds."""
        return self.checker(list(runs), given or Given())


MACHINE_ANSWERS = (
    ("About one step (under 1.25): the target is memory-bound here, as Thm 3.8 assumes; speculation pays whenever "
     "enough drafts are accepted", "flat"),
    ("Between 1.25 and 2 steps: the extra tokens cost something; speculation pays with a high acceptance rate and a "
     "cheap draft, by less than the textbook predicts", "middle"),
    ("2 steps or more: the target is compute-bound here; a verify pass eats most of what accepted drafts save",
     "steep"),
)
assert {key for _, key in MACHINE_ANSWERS} == set(MACHINE_BANDS)

CHALLENGES: tuple[Challenge, ...] = (
    Challenge(
        key="exact", title="Exact, even when the draft is wrong",
        task="Make a greedy run (temperature 0, ε = 0, Decoding-OPT) in which the draft is rejected at least once, "
             "and whose speculative text is exactly the standard text.",
        hint="The first example's draft is almost never wrong; the chat example's is. Watch the red chips: each "
             "rejection ends its round with an orange correction.",
        why="At temperature 0, p and q are one-hot: a draft token is accepted exactly when it is the target's argmax, "
            "and the correction, drawn from norm(max(0, p − q)), is the target's argmax itself. So every emitted "
            "token is the one the target's own greedy step would have produced; the draft only decides how many of "
            "them one verify pass confirms (Leviathan et al., Chen et al.). When sampling, the same holds in "
            "distribution: P(emit x) = min(p, q)(x) + (1 − β)·norm(max(0, p − q))(x) = p(x).",
        checker=check_exact),
    Challenge(
        key="lose", title="Make speculation lose",
        task="Find settings under which speculative decoding is slower than standard decoding: a finished race whose "
             "measured speedup is below 1.",
        hint="Raise γ with the constant policy (12–16), sample (temperature 1) on a prompt the draft guesses badly — "
             "or open the “slow case” example's settings and press Run.",
        why="Leviathan et al.'s Thm 3.8: a round yields (1 − α^(γ+1)) / (1 − α) tokens on average and costs γc + v "
            "standard steps (c: a draft token, v: a verify pass). The tokens saturate at 1 / (1 − α) as γ grows "
            "while drafting keeps costing γc, so a long draft with a low α loses; a verify pass costing more than one "
            "step (v > 1, a compute-bound target) makes it lose sooner. The race's headline names which one it was.",
        checker=check_lose),
    Challenge(
        key="machine", title="Read this machine",
        task="Race a chain with γ ≥ 3 (a standard run included), then say what one verify pass over its γ + 1 "
             "tokens costs on this machine, in standard one-token steps (v).",
        hint="The This machine tab draws the target's verify time T(k) over k tokens fed; v ≈ T(γ + 1) / T(1). "
             "The Live tab's metrics give your run's own v.",
        why="Thm 3.8 assumes a verify pass costs one step, which holds when reading the weights dominates "
            "(memory-bound: GPUs at batch 1). On a CPU it depends on the execution and the machine, so the probe "
            "measures it: even with AMX, races on a Xeon measured 1.9–2.5 steps. On a CPU without native bf16 the "
            "arithmetic grows with every token fed (compute-bound: a bf16 pass over 6 tokens measured ~4.5 steps on an AVX2 EPYC), which is "
            "why the probe picks an execution by its predicted speculative rate, not its fastest single step.",
        checker=check_machine, answers=MACHINE_ANSWERS),
    Challenge(
        key="correction", title="A correction the draft did not expect",
        task="Find a rejected draft token whose correction is not the draft's second most likely token there.",
        hint="Sample (temperature 0.7–1), step through the rounds, and open the acceptance picture at a red "
             "position: compare the ↻ correction with the q bars.",
        why="The correction is drawn from the residual norm(max(0, p − q)): the target's probability the draft "
            "under-proposed, not the draft's next-best guess. A token the draft ranked second has a large q, so "
            "p − q there is often small or negative; the residual's mass sits where the target is surer than the "
            "draft, often on a token the draft ranked low. That residual is what makes the output exactly p.",
        checker=check_correction),
    Challenge(
        key="block", title="Same draft, a better rule",
        task="In a sampled run (temperature > 0, ε = 0), show that block verification keeps more of the run's own "
             "drafts, on average, than the token-wise rule would.",
        hint="Any chain rule works (block shows it best); step mode's “same draft, three rules” table gives each "
             "round's expectations. γ of 5–8 at temperature 1 gives it room.",
        why="Block verification (Sun et al., ICLR 2025) judges the draft jointly: a running weight w_i = min(1, "
            "w_{i−1}·p/q) lets a later likely token make up for an earlier doubtful one, so it keeps at least as many "
            "tokens as the token-wise rule on average over drafts, and stays exact. On one particular draft it can "
            "keep fewer; exact match (keep only the target's own sample, Σ p·q) keeps the fewest. All three coincide "
            "at temperature 0.",
        checker=check_block),
    Challenge(
        key="bias", title="Raise ε until the bias shows",
        task=f"Use over-acceptance: find an ε for which the emitted tokens' distribution moves, on average, at least "
             f"{BIAS_VISIBLE:g} (total variation) away from the target's.",
        hint="Sample (temperature 0.7–1) and raise ε from 0 in steps (0.1, 0.3, 0.6). Run ε = 0 on the same prompt "
             "too, to compare α. The Sweeps tab's ε sweep draws the whole trade-off.",
        why="With b = min(1, (p + ε)/q) (Yin et al.), drafts are accepted more often, so rejections fall, but the "
            "emitted distribution A = q·b + r·norm(max(0, p − q)) is no longer p. For Decoding-OPT the bias is "
            "TV(A, p) = Σ max(0, q·b − p), and rejection probability + bias = TV(p, q) at every position (Thms 4–5): "
            "each rejection saved costs the same amount of bias. The trace computes the bias exactly at each position "
            "from the recorded p and q; one text is far too short to show it by counting tokens.",
        checker=check_bias),
    Challenge(
        key="tree", title="A tree that beats the chain",
        task="On one prompt, make a token-tree run that keeps more tokens per round (mean accepted length) than the "
             "draft model's chain, with the tree no deeper than the chain's γ.",
        hint="Run the chain first, then switch the drafter to token tree with the same prompt, temperature and γ; "
             "try M = 3–4 and a node budget of 16–32.",
        why="At each depth the tree offers several candidates; the target tries them in turn, each against what the "
            "earlier rejections left of p (the residual), so a position is lost only when every child is rejected. "
            "With M drafts that chance falls as M grows but levels off (Yin et al.'s batch speculative decoding, "
            "SpecInfer). Whether that pays in time depends on the verify pass over all the nodes: cheap on a "
            "memory-bound target, not on a compute-bound one.",
        checker=check_tree),
    Challenge(
        key="lookup", title="Prompt lookup pays",
        task="With the prompt lookup drafter, win a race: measured speedup above 1.",
        hint="Lookup drafts what followed the last few tokens earlier in the text, so ask for output that repeats "
             "the prompt: “Add type hints to this function: …”, repeat a list, quote a sentence.",
        why="Prompt lookup costs no model pass (c ≈ 0), so Thm 3.8 becomes E[tokens per round] / v: it pays as soon "
            "as a round yields more tokens than a verify pass costs in steps. Its drafts exist only where the output "
            "copies earlier text, and there they are nearly always right; elsewhere a round drafts nothing and is a "
            "plain target step.",
        checker=check_lookup),
)

BY_KEY = {c.key: c for c in CHALLENGES}


def check_all(runs: Sequence[Run], given: Given | None = None,
              keys: Sequence[str] | None = None) -> dict[str, Verdict]:
    """Each challenge's verdict on the runs (oldest first); `keys` limits which are checked."""
    return {c.key: c.check(runs, given) for c in CHALLENGES if keys is None or c.key in keys}


__all__ = ["BY_KEY", "CHALLENGES", "MACHINE_ANSWERS", "Challenge", "Given", "Run", "Verdict", "check_all"]
