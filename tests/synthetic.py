"""Synthetic traces for the view tests: built by hand, no model, every field chosen."""

from __future__ import annotations

from specviz.core.settings import DecodeSettings
from specviz.trace import DraftToken, Extra, Position, Round, Token, Trace

XSS = "<script>alert(1)</script>"
ATTR_XSS = '" onmouseover="alert(1)'

WORDS = ["def", " area", "(r", "):", "\n", "    return", " 3", ".", "14", " *", " r", " *", " r", "\n",
         "\n", "print", "(area", "(2", "))", "\n"]


def _word(k: int) -> str:
    return WORDS[k % len(WORDS)]


# Default round plan for γ = 4: (accepted, extra kind, draft length)
DEFAULT_PLAN = [
    dict(accept=4, extra="bonus"),                      # 5 tokens, all accepted
    dict(accept=2, extra="correction"),                 # 3 tokens: acc acc REJ disc → correction
    dict(accept=0, extra="correction"),                 # 1 token: REJ disc disc disc → correction
    dict(accept=3, extra="correction", xss=True),       # 4 tokens, an XSS token accepted
    dict(accept=4, extra="bonus"),                      # 5 tokens
    dict(accept=1, extra="correction", xss_extra=True),  # 2 tokens, XSS correction
    dict(accept=2, extra=None, verified=2),             # 2 tokens, run ends (EOS), no extra token
]


def make_trace(
    gamma: int = 4,
    plan: list[dict] | None = None,
    epsilon: float = 0.0,
    stop_reason: str = "eos",
    prompt: str = "Write a function:\n",
    t_prefill: float = 0.3,
    policy: str = "constant",
    drafter: str = "model",
    tau: float = 0.4,
    draft_token_s: float = 0.04,
    verify_s: float = 0.12,
) -> Trace:
    """A speculative trace built round by round from ``plan``.

    Each round drafts for ``draft_token_s`` seconds per drafted token and verifies for ``verify_s``.

    Each plan entry: accept (accepted drafts), extra ("correction" | "bonus" |
    None), optional draft (drafted count, default γ), verified (positions
    recorded, default accept+1 capped at draft), rescue (index of an accepted
    position that only passes thanks to ε), xss / xss_extra (put an XSS token in
    the accepted drafts / the extra token), stop (Round.draft_stop; default
    "limit" when γ tokens were drafted, else "confidence").
    """
    plan = DEFAULT_PLAN if plan is None else plan
    rounds: list[Round] = []
    t = t_prefill
    n = 0
    w = 0
    for idx, step in enumerate(plan):
        k = step.get("draft", gamma)
        a = step["accept"]
        extra_kind = step.get("extra")
        verified = step.get("verified", min(a + 1, k) if extra_kind != "bonus" else k)
        draft = []
        for i in range(k):
            text = _word(w)
            w += 1
            if step.get("xss") and i == 0:
                text = XSS
            draft.append(DraftToken(id=100 + w, text=text, q=0.6 if i < a else 0.7))
        positions = []
        for i in range(1, verified + 1):
            if i <= a:
                if step.get("rescue") == i:
                    q, p, u = 0.6, 0.3, 0.55  # p/q = 0.5 ≤ u < b = (0.3+ε)/0.6
                else:
                    q, p, u = 0.6, 0.5, 0.30
                acc = True
            else:
                q, p, u = 0.7, 0.2, 0.74
                acc = False
            b = min(1.0, (p + epsilon) / q)
            assert (u < b) == acc, (idx, i, u, b)
            positions.append(Position(i=i, q=q, p=p, b=b, u=u, accepted=acc, reject_prob=0.2, tv=0.15, bias=0.0))
        emitted = [Token(id=d.id, text=d.text, origin="accepted") for d in draft[:a]]
        extra = None
        if extra_kind:
            etext = XSS if step.get("xss_extra") else (" fix" if extra_kind == "correction" else " bonus!")
            extra = Extra(id=7, text=etext, kind=extra_kind, p=0.42)
            emitted.append(Token(id=7, text=etext, origin=extra_kind))
        t_draft, t_verify = draft_token_s * k, verify_s
        rounds.append(
            Round(
                index=idx,
                n_before=n,
                draft=draft,
                positions=positions,
                extra=extra,
                emitted=emitted,
                t_start=t,
                t_draft=t_draft,
                t_verify=t_verify,
                t_end=t + t_draft + t_verify,
                draft_forwards=k if drafter == "model" else 0,
                target_forwards=1,
                draft_stop=step.get("stop", "limit" if k == gamma else "confidence"),
            )
        )
        t += t_draft + t_verify
        n += len(emitted)
    return Trace(
        kind="speculative",
        prompt=prompt,
        prompt_tokens=12,
        settings=DecodeSettings(gamma=gamma, epsilon=epsilon, variant="opt", temperature=1.0, top_k=0, top_p=1.0,
                                max_new_tokens=64, seed=0, drafter=drafter, policy=policy, tau=tau),
        models=dict(preset="tiny", draft="draft-<b>small</b>", target="target-big",
                    drafter="draft-<b>small</b>" if drafter == "model" else "prompt lookup"),
        device="cpu",
        rounds=rounds,
        stop_reason=stop_reason,
        t_prefill=t_prefill,
        t_total=t,
        draft_prefill=0.1,
        target_prefill=0.2,
    )


def make_std_trace(n_tokens: int = 22, step: float = 0.11, t_prefill: float = 0.25, texts: list[str] | None = None) -> Trace:
    rounds = []
    t = t_prefill
    for i in range(n_tokens):
        text = texts[i] if texts else _word(i)
        rounds.append(
            Round(
                index=i,
                n_before=i,
                extra=Extra(id=200 + i, text=text, kind="target", p=0.3),
                emitted=[Token(id=200 + i, text=text, origin="target")],
                t_start=t,
                t_verify=step,
                t_end=t + step,
                draft_forwards=0,
                target_forwards=1,
            )
        )
        t += step
    return Trace(
        kind="standard",
        prompt="Write a function:\n",
        prompt_tokens=12,
        settings=DecodeSettings(epsilon=0.0, temperature=1.0, max_new_tokens=64, seed=0),
        models=dict(preset="tiny", target="target-big"),
        device="cpu",
        rounds=rounds,
        stop_reason="max_new_tokens",
        t_prefill=t_prefill,
        t_total=t,
    )


def empty_trace(kind: str = "speculative") -> Trace:
    return Trace(kind=kind, prompt="", prompt_tokens=0, settings=DecodeSettings(gamma=4),
                 models={}, device="cpu")


