"""How each kind of pair is loaded (:func:`specviz.models.loading.load_pair` calls these): the offline pair on its
GGUFs' blocks as stored (:mod:`.gguf_native`), anything else with transformers (a hub id, a local directory, or an
offline pack dequantized into memory), and the target's execution chosen (by the probe :mod:`specviz.hardware`
installs: :func:`set_execution_chooser`).

Every error meant for users is a :class:`.pair.ModelError` whose message says what to do.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import torch

from . import compiled, executions, int8, kernels, q4k, q4k_draft
from .convert import offline_pack
from .pair import ModelError, ModelPair, ProgressFn, log, report, short_error, span
from .prefix_store import PrefixStore
from .presets import OFFLINE_PACKS
from .tokens import eos_ids, template_head


def _load_error(what: str, source: str, exc: BaseException) -> ModelError:
    """A ModelError saying why ``source`` could not be loaded and what to do, plus the short cause."""
    text = short_error(exc, 300)
    low = text.lower()
    if isinstance(exc, MemoryError) or "out of memory" in low or "allocate" in low:
        hint = "not enough memory; pick a smaller pair or a machine with more (GPU) memory"
    elif "trust_remote_code" in low:
        hint = "it needs custom code from the hub (trust_remote_code), which specviz never runs; pick another model"
    elif Path(source).expanduser().exists():
        hint = f"'{source}' is a local path but does not hold a loadable causal LM"
    elif _hub_offline():
        hint = (f"HF_HUB_OFFLINE is set and '{source}' is not in the local Hugging Face cache. Download it "
                f"first on a machine with network access (huggingface-cli download {source}) or unset HF_HUB_OFFLINE")
    elif any(s in low for s in ("connection", "resolve", "timed out", "timeout", "network", "couldn't connect")):
        hint = f"the Hugging Face hub is unreachable, so '{source}' cannot be downloaded; check the network"
    elif isinstance(exc, OSError) or any(s in low for s in ("not a valid model identifier", "404", "not found")):
        hint = f"'{source}' is neither a model on the Hugging Face hub nor a local directory"
    else:
        hint = "it is not a causal language model transformers can load"
    return ModelError(f"Could not load {what}: {hint} ({text}).")


def _hub_offline() -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    try:
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    except Exception:
        return False


def _load_tokenizer(source: str, name: str) -> Any:
    """``source``'s tokenizer (a hub id or a directory: AutoTokenizer's)."""
    try:
        from transformers import AutoTokenizer  # (imports transformers.models)

        return AutoTokenizer.from_pretrained(source)
    except Exception as exc:
        raise _load_error(f"the tokenizer of {name}", source, exc) from exc


def _load_model(source: str, name: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": dtype}
    if device.type != "cpu":
        kwargs["device_map"] = {"": device}  # load straight onto the GPU, no CPU staging copy
    try:
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    except Exception as exc:
        raise _load_error(name, source, exc) from exc
    return _finish(model, device)


def _finish(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    model.requires_grad_(False)  # inference only: no autograd bookkeeping
    if device.type == "cpu" or not any(p.is_cuda for p in model.parameters()):
        model.to(device)
    return model.eval()


def _contiguous_strides(shape: torch.Size) -> tuple[int, ...]:
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


def _canonical(args: tuple) -> tuple | None:
    # Runs before every head call: compare strides arithmetically, copy only a strided view.
    x = args[0] if args else None
    if not isinstance(x, torch.Tensor) or x.dim() < 2 or x.stride() == _contiguous_strides(x.shape):
        return None
    return (x.clone(memory_format=torch.contiguous_format),) + tuple(args[1:])


def canonical_head_input(model: torch.nn.Module) -> None:
    """Give the output head its input with canonical strides.

    A forward with ``logits_to_keep=1`` over several tokens (a prefill, a draft step after a
    correction) hands the head ``hidden[:, -1:, :]``, whose size-1 batch dimension keeps the whole
    tensor's stride.  PyTorch's CPU bf16 linear then leaves its fast (oneDNN/AMX) kernel: Qwen2.5's
    151,936-row head took 1.4-2.4 s instead of ~25 ms on this machine, so a 52-token prefill cost
    2.2 s where a 6-token verify pass costs 0.2 s.  Copying the few kept rows costs microseconds.
    The hook sits on the model object, so every caller benefits (transformers' generate in the
    bench included)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, torch.nn.Module) and not getattr(head, "_specviz_canonical", False):
        head.register_forward_pre_hook(lambda _module, args: _canonical(args))
        head._specviz_canonical = True


def _logits_width(model: torch.nn.Module) -> int:
    head = model.get_output_embeddings()
    weight = getattr(head, "weight", None)
    if weight is not None and hasattr(weight, "shape"):
        return int(weight.shape[0])
    if hasattr(head, "out_features"):  # a quantized linear keeps the shape here
        return int(head.out_features)
    return int(model.config.vocab_size)


def _check_tokenizers(draft_tok: Any, target_tok: Any, draft_name: str, target_name: str) -> None:
    dv, tv = draft_tok.get_vocab(), target_tok.get_vocab()
    if dv != tv:
        diff = len(set(dv.items()) ^ set(tv.items()))
        raise ModelError(
            f"{draft_name} and {target_name} do not share a tokenizer ({len(dv):,} vs {len(tv):,} tokens, "
            f"{diff:,} entries differ). Speculative decoding needs the same vocabulary: pick a draft from "
            "the same model family as the target."
        )


def _match_widths(draft: torch.nn.Module, target: torch.nn.Module, n_tokens: int, names: tuple[str, str]) -> int:
    """Make both logits widths equal. Families pad their head differently (Qwen2.5 0.5B: 151,936 rows;
    7B: 152,064); the rows past the tokenizer are never produced by it, so the wider head is trimmed."""
    wd, wt = _logits_width(draft), _logits_width(target)
    if wd == wt:
        return wd
    width = min(wd, wt)
    if width < n_tokens:
        raise ModelError(f"{names[0]} has {wd:,} output logits and {names[1]} {wt:,}, fewer than the "
                         f"tokenizer's {n_tokens:,} tokens; these models cannot be paired.")
    wider = draft if wd > wt else target
    log.info("Trimming the %s output head from %d to %d rows (padding rows only)",
             "draft" if wider is draft else "target", max(wd, wt), width)
    wider.resize_token_embeddings(width)
    return width


def _same_tokenizer_files(a: str, b: str) -> bool:
    """Both sources are local directories with byte-identical tokenizer files (then loading one is enough)."""
    names = ("tokenizer.json", "tokenizer_config.json")
    pa, pb = Path(a), Path(b)
    if not (pa.is_dir() and pb.is_dir() and all((pa / n).is_file() and (pb / n).is_file() for n in names)):
        return False
    digest = lambda p: hashlib.sha256(p.read_bytes()).digest()  # noqa: E731
    return all(digest(pa / n) == digest(pb / n) for n in names)


def _runs_as_stored(draft_ref: str, target_ref: str, dev: torch.device, quant: str | None, target_exec: str) -> bool:
    """Whether the pair runs from its GGUF files as stored (:mod:`.gguf_native`): two offline packs on a CPU whose
    kernel is to run the GGUF's blocks (:func:`.q4k.expected`: built or buildable; a first start builds it while the
    files are read), the draft quantized and the target's execution int8."""
    return (dev.type == "cpu" and offline_pack(draft_ref) is not None and offline_pack(target_ref) is not None
            and quant in ("auto", "int8") and target_exec in ("auto", "int8") and q4k.expected())


def _load_native(label: str, draft_ref: str, target_ref: str, alpha: float, target_exec: str,
                 progress: ProgressFn | None, t0: float, later: bool = False) -> ModelPair | None:
    """The offline pair on its GGUFs' blocks (:mod:`.gguf_native`): the target batch-invariant on the lean steps (its
    one execution, named "int8" as the probe and the page know it), the draft on them too, both traced; the probe
    (the chooser, "int8" its one candidate) times it where this machine has no record.  None where the kernel, built
    meanwhile, turned out not to run here (the models then load on torch's kernels)."""
    from ..speculator.model import head_fingerprint
    from . import gguf_native, invariant, lean

    packs = {"draft": offline_pack(draft_ref), "target": offline_pack(target_ref)}
    # the kernel is built (a first start: ~10 s of the compiler on 2 cores) while the files are read and the models made
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="specviz-kernel") as pool:
        kernel = pool.submit(q4k.enabled)
        draft, target, tokenizer = gguf_native.models(packs["draft"], packs["target"], span(progress, 0.0, 0.9))
        if not kernel.result():  # no build, or its check failed: the products would not run here
            return None
    for model in (draft, target):
        canonical_head_input(model)
    target._specviz_head_fingerprint = head_fingerprint(target)
    invariant.make_invariant(target)
    report(progress, 0.9, "Tracing the decoders' steps…")
    for role, model in (("draft", draft), ("target", target)):
        steps = lean.attach(model, trace=True, invariant=role == "target")
        steps.shared_prefix = template_head(tokenizer)
        steps.prefix_store = PrefixStore.for_pack(packs[role], role=role, kernel="gguf+glue" if steps.glue else "gguf")
    names = {role: pack.display for role, pack in packs.items()}
    vocab = int(target.config.vocab_size)
    req = ExecutionRequest(target, target_ref, names["target"], torch.device("cpu"), torch.bfloat16, target_exec,
                           draft, vocab, alpha, ("int8",), build=lambda _e: target, apply=lambda _e: target,
                           progress=span(progress, 0.92, 1.0), later=later)
    target, chosen, probe = (_CHOOSER[0] if _CHOOSER else as_requested)(req)
    ctx = min(int(m.config.max_position_embeddings) for m in (draft, target))
    pair = ModelPair(preset=label, draft_name=names["draft"], target_name=names["target"], draft=draft, target=target,
                     tokenizer=tokenizer, device=torch.device("cpu"), dtype=torch.bfloat16, draft_quant=q4k_draft.LABEL,
                     eos_token_ids=eos_ids(tokenizer, target.generation_config), context_length=ctx, vocab_size=vocab,
                     load_seconds=time.perf_counter() - t0, target_exec=chosen, target_weights="gguf", probe=probe)
    report(progress, 1.0, f"Loaded {names['draft']} → {names['target']} from their GGUFs in {pair.load_seconds:.1f} s; "
           f"the target runs as {executions.words(pair)}")
    return pair


def _name(ref: str) -> str:
    pack = offline_pack(ref)
    if ref.startswith("offline:") and pack is None:
        raise ModelError(f"Unknown offline model {ref!r}; known: {', '.join('offline:' + k for k in OFFLINE_PACKS)}.")
    return pack.display if pack is not None else ref


def _load_once(label: str, draft_ref: str, target_ref: str, dev: torch.device, dt: torch.dtype,
               quant: str | None, progress: ProgressFn | None, t0: float, *, target_exec: str = "auto",
               alpha: float = 0.7, defer_packing: bool = False) -> ModelPair:
    """transformers' models: a hub id or a directory loaded with ``from_pretrained``; an offline pack dequantized
    from its GGUF into memory (:func:`.gguf_native.dequantized`: nothing written).  The draft quantized to int8
    where asked (or measured faster, once), the target's execution as asked or as the probe chooses."""
    from . import gguf_native

    draft_name, target_name = _name(draft_ref), _name(target_ref)
    packs = {ref: offline_pack(ref) for ref in (draft_ref, target_ref) if offline_pack(ref) is not None}
    files = {}
    try:
        for ref, pack in packs.items():
            files[ref] = gguf_native.read(pack)

        def model_of(ref: str, name: str) -> torch.nn.Module:
            if ref in files:
                return _finish(gguf_native.dequantized(files[ref], packs[ref].extra_eos, dt, name), dev)
            return _load_model(ref, name, dev, dt)

        def tokenizer_of(ref: str, name: str) -> Any:
            if ref in files:
                return gguf_native.tokenizer_of(files[ref].metadata, name)
            return _load_tokenizer(ref, name)

        plan = int8.int8_plan(quant, draft_ref, dt)  # None | "int8" | "measure"
        planned = _known_execution(target_exec, dev, target_ref, dt)  # decided once: the chooser is told
        report(progress, 0.0, f"Loading {draft_name}…")
        draft_model = model_of(draft_ref, draft_name)
        report(progress, 0.15, f"Loading the tokenizer of {target_name}…")
        tokenizer = tokenizer_of(target_ref, target_name)
        same = (draft_ref in files and target_ref in files and files[draft_ref].metadata["tokenizer.ggml.tokens"]
                == files[target_ref].metadata["tokenizer.ggml.tokens"]) or _same_tokenizer_files(draft_ref, target_ref)
        if not same:
            _check_tokenizers(tokenizer_of(draft_ref, draft_name), tokenizer, draft_name, target_name)
        report(progress, 0.3, f"Loading {target_name} ({str(dt).removeprefix('torch.')}, {dev})…")
        target_model = model_of(target_ref, target_name)
    finally:
        for gguf in files.values():
            gguf.close()
    applied = None
    if plan == "int8":
        report(progress, 0.8, f"Quantizing {draft_name} to int8…")
        draft_model, applied = int8.int8_draft(draft_model, defer_packing=defer_packing), "int8"
    elif plan == "measure":
        report(progress, 0.85, f"Measuring whether an int8 {draft_name} is faster on this machine (once)…")
        faster, draft_model = int8.measure_int8(draft_ref, draft_model, dt, len(tokenizer))
        applied = "int8" if faster else None
        gc.collect()
    if applied == "int8" and q4k.in_use(draft_model):
        applied = q4k_draft.LABEL  # its matrices and head as Q4_K made here
    vocab_size = _match_widths(draft_model, target_model, len(tokenizer), (draft_name, target_name))
    for model in (draft_model, target_model):
        canonical_head_input(model)
    target_model, chosen, probe = _target_execution(
        target_model, target_ref, target_name, dev, dt, target_exec, draft_model, vocab_size, alpha,
        span(progress, 0.88, 0.98), defer_packing, planned)
    head = template_head(tokenizer)  # both models' lean steps keep its keys and values (a prompt pass feeds the rest)
    for role, model, ref in (("draft", draft_model, draft_ref), ("target", target_model, target_ref)):
        steps = compiled.steps_of(model)
        if hasattr(steps, "keep_prefix"):
            steps.shared_prefix = head
            if ref in packs and steps.prefix_store is None:  # (kept on disk for the next start: the pack names it)
                kernel = "q4k" if q4k.in_use(model) else kernels.ready()
                steps.prefix_store = PrefixStore.for_pack(packs[ref], role=role, kernel=f"{kernel}+glue"
                                                          if getattr(steps, "glue", False) else str(kernel))
    eos = eos_ids(tokenizer, getattr(target_model, "generation_config", None))
    if not eos:
        log.warning("No eos token known for %s; generation will only stop at the token limit", target_name)
    ctx = [getattr(m.config, "max_position_embeddings", None) for m in (draft_model, target_model)]
    ctx = [c for c in ctx if isinstance(c, int) and c > 0]
    pair = ModelPair(
        preset=label, draft_name=draft_name, target_name=target_name,
        draft=draft_model, target=target_model, tokenizer=tokenizer,
        device=dev, dtype=dt, draft_quant=applied, eos_token_ids=eos,
        context_length=min(ctx) if ctx else 2048, vocab_size=vocab_size,
        load_seconds=time.perf_counter() - t0, target_exec=chosen, probe=probe,
        target_weights="gguf" if q4k.in_use(target_model) else "",
    )
    report(progress, 1.0, f"Loaded {draft_name} → {target_name} on {pair.device_label()} in {pair.load_seconds:.1f} s"
           + (f" ({applied} draft)" if applied else "") + f"; the target runs as {executions.words(pair)}")
    return pair


@dataclasses.dataclass(frozen=True)
class ExecutionRequest:
    """What choosing the target's execution at load is given (an ExecutionChooser's argument)."""

    target: torch.nn.Module  # as loaded (bf16, or fp16 on GPUs without bf16)
    ref: str  # the target's model reference (probes are recorded under it)
    name: str  # its name, for progress messages
    device: torch.device
    dtype: torch.dtype
    requested: str  # "auto" or an execution (models.executions)
    draft: torch.nn.Module
    vocab: int
    alpha: float  # the pair's typical acceptance
    candidates: tuple[str, ...]  # the executions on offer here, the loaded one first
    build: Callable[[str], torch.nn.Module]  # a copy of the target executing as the name says (to time it)
    apply: Callable[[str], torch.nn.Module]  # the target itself executing as the name says
    progress: ProgressFn | None
    # the execution the load planned for before loading (the known one: a recorded probe's choice, or what a busy
    # machine runs unmeasured), which the target may already be loaded as; None: unknown, "auto" measures
    planned: str | None = None
    # the caller serves first and has the chooser's measurement made afterwards, between runs (a server's start):
    # with one candidate there is nothing to choose before the first run
    later: bool = False


# -> (the target executing as chosen, the execution's name, the probe that chose it or None)
ExecutionChooser = Callable[[ExecutionRequest], tuple[torch.nn.Module, str, Any]]
# (device, target reference, dtype) -> the execution "auto" would run without measuring (recorded, or a busy
# machine's), or None
KnownExecution = Callable[[torch.device, str, torch.dtype], "str | None"]

# How "auto" is chosen: by the probe, which times this machine (specviz.hardware.choose installs it when
# specviz.hardware is imported; the models layer never imports the hardware layer).
_CHOOSER: list[ExecutionChooser] = []
_KNOWN: list[KnownExecution] = []


def set_execution_chooser(choose: ExecutionChooser | None, known: KnownExecution | None = None) -> None:
    """Install how load_pair chooses the target's execution (None: the models' own, below), and how it
    learns, before loading, what "auto" would choose without measuring (a probe recorded for this machine)."""
    _CHOOSER[:] = [choose] if choose is not None else []
    _KNOWN[:] = [known] if known is not None else []


def _known_execution(requested: str, device: torch.device, ref: str, dtype: torch.dtype) -> str | None:
    """The target's execution, if known before loading: the one asked for, or what "auto" runs without measuring
    (a recorded probe's choice, or on a busy CPU with none the probe's fallback: hardware.choose.known_choice)."""
    if requested != "auto":
        return requested
    choice = _KNOWN[0](device, ref, dtype) if _KNOWN else None
    return choice if choice in executions.candidates(device, dtype) else None


def as_requested(req: ExecutionRequest) -> tuple[torch.nn.Module, str, Any]:
    """The chooser without a probe: the execution asked for, and "auto" runs the target as loaded."""
    requested = req.candidates[0] if req.requested == "auto" else req.requested
    if req.requested == "auto":
        log.warning("No execution chooser installed (import specviz.hardware): %s runs as loaded", req.name)
    if requested != req.candidates[0]:
        report(req.progress, 0.0, f"Preparing {req.name} as {executions.WORDS[requested]}…")
    return req.apply(requested), requested, None


def _target_execution(target: torch.nn.Module, ref: str, name: str, dev: torch.device, dt: torch.dtype,
                      requested: str, draft: torch.nn.Module, vocab: int, alpha: float,
                      progress: ProgressFn | None, defer_packing: bool = False,
                      planned: str | None = None) -> tuple[torch.nn.Module, str, Any]:
    """The target executing as requested, or as the installed chooser (the probe) decides ("auto"):
    (model, execution, probe)."""
    req = ExecutionRequest(
        target, ref, name, dev, dt, requested, draft, vocab, alpha, executions.candidates(dev, dt),
        build=lambda e: executions.apply(target, e, copy_model=True),
        apply=lambda e: executions.apply(target, e, defer_packing=defer_packing),
        progress=progress, planned=planned)
    choose = _CHOOSER[0] if _CHOOSER else as_requested
    model, requested, probe = choose(req)
    if requested.endswith("+graphs"):  # the draft's one-token step gains the most from graphs
        executions.apply(draft, requested)
    elif isinstance(compiled.steps_of(model), compiled.CompiledSteps):
        compiled.detach(model)  # the probe may have timed graphs on this very model (lean steps stay)
    return model, requested, probe
