"""transformers' `generate`, timed with the very same model objects as specviz's runs.

Three ways (HF_CONFIGS): plain; assisted with specviz's constant γ (hf_same); and
assisted with transformers' own defaults (hf_default).  transformers 5 reads the
draft length from the *assistant's* generation_config (AssistedCandidateGenerator
.__init__: num_assistant_tokens, num_assistant_tokens_schedule,
assistant_confidence_threshold), never from generate() arguments, and fills what
is unset from its global defaults: up to 20 draft tokens, schedule "constant",
drafting stops once the draft's probability of its token is < 0.4 (a threshold it
re-tunes during the call when scikit-learn is installed).  So hf_same sets those
fields on the assistant for the call and restores them: the draft model object is
shared with specviz's own runs.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from transformers import GenerationConfig

from ..core.settings import DecodeSettings
from ..models.bare import transformers_model

HF_CONFIGS = {
    "hf_plain": "transformers generate, no assistant",
    "hf_same": "transformers assisted generate, specviz's constant γ (no confidence stop)",
    "hf_default": "transformers assisted generate, its own defaults",
}
ASSISTANT_KEYS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def hf_default_assistant(model) -> dict[str, Any]:
    """The draft-length settings transformers will use for this assistant: its generation_config's
    values, transformers' global defaults where unset (as AssistedCandidateGenerator fills them)."""
    defaults = GenerationConfig._get_default_generation_params()
    cfg = model.generation_config
    return {k: getattr(cfg, k) if getattr(cfg, k) is not None else defaults[k] for k in ASSISTANT_KEYS}


@contextmanager
def assistant_settings(model, **values: Any) -> Iterator[None]:
    """Set fields of the assistant's generation_config for one generate call, then restore them:
    the draft model object is shared with specviz's own runs."""
    cfg = model.generation_config
    saved = {k: getattr(cfg, k) for k in values}
    try:
        for k, v in values.items():
            setattr(cfg, k, v)
        yield
    finally:
        for k, v in saved.items():
            setattr(cfg, k, v)


def hf_same_values(settings: DecodeSettings) -> dict[str, Any]:
    # Threshold 0 turns the confidence stop off (transformers adds ConfidenceCriteria only when > 0).
    return {"num_assistant_tokens": settings.gamma, "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.0}


def hf_generate(pair, ids: list[int], settings: DecodeSettings, mode: str) -> tuple[list[int], float]:
    """transformers' generate, mode hf_plain, hf_same or hf_default: (the new token ids, seconds).

    The assisted runs use the pair's draft model whatever specviz's drafter setting is."""
    target, draft = transformers_model(pair.target), transformers_model(pair.draft)
    x = torch.tensor([ids], device=pair.device)
    kw: dict[str, Any] = dict(max_new_tokens=settings.max_new_tokens, min_new_tokens=0,
                              eos_token_id=list(pair.eos_token_ids), pad_token_id=pair.eos_token_ids[0],
                              attention_mask=torch.ones_like(x), repetition_penalty=1.0)
    if settings.temperature > 0:  # the same warp as specviz: temperature, then top-k, then top-p
        kw.update(do_sample=True, temperature=settings.temperature, top_p=settings.top_p,
                  top_k=settings.top_k or None)
    else:
        kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    if mode != "hf_plain":
        kw["assistant_model"] = draft
    values = hf_same_values(settings) if mode == "hf_same" else {}
    torch.manual_seed(settings.seed)
    with assistant_settings(draft, **values), torch.inference_mode():
        _sync(pair.device)
        t0 = time.perf_counter()
        out = target.generate(x, **kw)
        _sync(pair.device)
        seconds = time.perf_counter() - t0
    return out[0, len(ids):].tolist(), seconds  # only the new tokens count
