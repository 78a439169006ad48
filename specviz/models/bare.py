"""A model whose runs never need transformers' modelling code: the module tree of one run from its GGUF.

Importing transformers' Qwen2 modelling pulls in torch._dynamo, torch.distributed.tensor, hub kernels and more:
~5 s of pure Python on a 2-core EPYC, which a starting server spends beside Gradio's import under one interpreter
lock.  Yet the pair run from its GGUFs (:mod:`.gguf_native`) runs every chain, race and target tree on the lean
path (:mod:`.lean`), which reads only the module tree: the linears, the embeddings, the norms' weights and RoPE's
frequencies.  :class:`BareCausalLM` is that tree under transformers' own module names, with its config.

Whatever calls the model itself (the draft's token trees on transformers' cache, transformers' generate in a
benchmark) gets transformers' model: :meth:`BareCausalLM.full` builds it once, on first use, around the very same
modules (nothing is copied or read again), and every call of the bare model goes to it.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import torch
from torch import nn

log = logging.getLogger("specviz.models")

ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}
# transformers' methods a bare model hands to its full model (building it the first time)
DELEGATED = frozenset({"generate", "resize_token_embeddings", "can_generate", "prepare_inputs_for_generation",
                       "num_parameters", "get_decoder", "tie_weights", "save_pretrained"})


class _Norm(nn.Module):
    """An RMSNorm's weight (the lean path computes the norm itself)."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)


class _Rotary(nn.Module):
    """RoPE's inverse frequencies, computed as transformers' default rope computes them (bit for bit: tested)."""

    def __init__(self, theta: float, dim: int):
        super().__init__()
        self.inv_freq = nn.Buffer(1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), persistent=False)
        self.attention_scaling = 1.0


def _module(**children: nn.Module) -> nn.Module:
    module = nn.Module()
    for name, child in children.items():
        module.add_module(name, child)
    return module


class BareCausalLM(nn.Module):
    """A causal LM's module tree (``model.layers[i].self_attn.q_proj`` ...) and config, without its forward:
    calling it builds transformers' model around the same modules (:meth:`full`) and calls that."""

    bare = True

    def __init__(self, config: Any, source: Path, body: nn.Module, lm_head: nn.Module, generation_config: Any):
        super().__init__()
        self.config, self.source, self.generation_config = config, source, generation_config
        self.model, self.lm_head = body, lm_head
        self._attn_implementation: str | None = None
        self._built: list[nn.Module] = []  # transformers' model, once built (a list: not a submodule of this one)
        self._guard = threading.Lock()

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def set_output_embeddings(self, head: nn.Module) -> None:
        self.lm_head = head
        for full in self._built:
            full.lm_head = head

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def set_attn_implementation(self, name: str) -> None:
        """Recorded, and given to transformers' model when it is built (:meth:`full`)."""
        self._attn_implementation = name
        for full in self._built:
            full.set_attn_implementation(name)

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    def full(self, why: str = "its forward") -> nn.Module:
        """transformers' model over these very modules (built once: ~5 s of imports the first time)."""
        with self._guard:
            if not self._built:
                self._built.append(_full_model(self, why))
        return self._built[0]

    @property
    def built(self) -> bool:
        """Whether transformers' model was built (something called the model itself)."""
        return bool(self._built)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.full()(*args, **kwargs)

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    def __getattr__(self, name: str) -> Any:
        """Submodules, parameters, buffers; then transformers' model's own methods that callers use on a
        loaded model (:data:`DELEGATED`), built for them.  Anything else is missing, as on any module: code
        that probes a module for an attribute (``getattr(m, "q_proj", None)``) never builds it."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name not in DELEGATED:
                raise
            return getattr(self.full(name), name)


def transformers_model(model: nn.Module, why: str = "transformers' generate") -> nn.Module:
    """``model`` as transformers' own model (a bare model's full one), for code that hands it to transformers:
    its assisted generation calls the assistant's private methods, which a bare model does not delegate."""
    return model.full(why) if isinstance(model, BareCausalLM) else model


def _full_model(bare: BareCausalLM, why: str) -> nn.Module:
    """transformers' model for ``bare``'s config, built on the meta device, holding ``bare``'s modules."""
    import transformers
    from transformers import AutoConfig

    from .invariant import register

    cls = getattr(transformers, ARCHITECTURES[bare.config.model_type])
    # transformers' own class for it (load: a generic one; a model built from its GGUF has it already)
    config = AutoConfig.from_pretrained(bare.source) if bare.source is not None else bare.config
    with torch.device("meta"):
        full = cls(config)
    for name, module in bare.named_modules():
        if name.endswith(("_proj", "embed_tokens")) or name == "lm_head":
            full.set_submodule(name, module)
        elif isinstance(module, _Norm):
            full.get_submodule(name).weight = module.weight
    full.model.rotary_emb = type(full.model.rotary_emb)(config=config)  # its frequencies, on the CPU
    if not torch.equal(full.model.rotary_emb.inv_freq, bare.model.rotary_emb.inv_freq):
        raise RuntimeError("transformers' RoPE frequencies differ from the bare model's")
    meta = [n for n, t in [*full.named_parameters(), *full.named_buffers()] if t.is_meta]
    if meta:
        raise RuntimeError(f"transformers' {cls.__name__} has parts the bare model lacks: {', '.join(meta[:4])}")
    full.generation_config = bare.generation_config or full.generation_config
    if bare._attn_implementation is not None:
        register()
        full.set_attn_implementation(bare._attn_implementation)
    if hasattr(bare, "_specviz_head_fingerprint"):  # a learned head trained on this target still finds it
        full._specviz_head_fingerprint = bare._specviz_head_fingerprint
    bare.config = full.config  # one config from now on: transformers' own
    log.info("Built transformers' %s around the bare %s model, for %s", cls.__name__, config.model_type, why)
    return full.requires_grad_(False).eval()
