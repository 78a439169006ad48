"""Server-side jobs behind the UI and the API, with no Gradio in them.

Everything a client sends is validated here (whatever the UI allows), model
jobs run one at a time per process, and a run yields plain progress updates
that the UI turns into components.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import logging
import os
import re
import sys
import threading
import time
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from ..core.engine import Event, speculative_stream, standard_stream
from ..core.race import in_turn, interleave
from ..hardware.choose import measure_after_serving
from ..hardware.load import race_can_interleave, race_threads
from ..hardware.curves import interpolate
from ..hardware.roofline import probe_roofline
from ..theory.timing import Prices, assess_race, event_costs
from ..core.settings import DRAFT_MODEL_DRAFTERS, DecodeSettings, SettingsError
from ..drafters import make_drafter
from ..models import (DEFAULT_PRESET, PRESETS, TINY_PRESET, ModelError, ModelPair, encode_prompt, load_pair,
                      resolve_preset, short_error)
from ..models import warm
from .memory import available_bytes
from .envvars import downloads_allowed, env_choice, env_int, env_number, memory_budget_bytes

MAX_PROMPT_CHARS = 8_000
# Prompt tokens (env SPECVIZ_MAX_PROMPT_TOKENS): prefill time and KV-cache memory grow with them, and
# 8,000 characters can be far more tokens than usual (CJK, emoji, digits).
MAX_PROMPT_TOKENS = 2_048
# Wall-time budget of one job, both decoders together (env SPECVIZ_JOB_SECONDS): decoding stops at the
# next round boundary once it is spent, and the trace's stop_reason says "time_limit".
JOB_SECONDS = 180.0
_now = time.monotonic  # the budget's clock (tests replace it)
log = logging.getLogger("specviz.service")
CUSTOM_PRESET = "Custom pair (hub ids or local paths)"
_MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")

# One model job at a time per process (Gradio's concurrency_id does the same
# for UI events; this also covers the bench, scripts and the API).
MODEL_LOCK = threading.Lock()


class InputError(ValueError):
    """Bad input; the message is shown to the user as is."""


def custom_models_enabled() -> bool:
    """Custom model ids download arbitrary weights: off unless the operator opts in."""
    return os.environ.get("SPECVIZ_ALLOW_CUSTOM", "").lower() in ("1", "true", "yes")


GPU_DEFAULT_PRESET = "Qwen2.5-Coder 0.5B → 7B (hub, GPU)"


def default_preset() -> str:
    """On a GPU host the default is a hub pair big enough to show a real GPU speedup
    (the offline 0.5B → 1.5B pair is too small for a GPU to gain from speculation)."""
    import torch

    if torch.cuda.is_available() and GPU_DEFAULT_PRESET in PRESETS:
        return GPU_DEFAULT_PRESET
    return DEFAULT_PRESET


def ui_presets() -> list[str]:
    names = [n for n in PRESETS if n != TINY_PRESET or os.environ.get("SPECVIZ_SHOW_TINY")]
    return names + ([CUSTOM_PRESET] if custom_models_enabled() else [])


def max_prompt_tokens() -> int:
    return env_int("SPECVIZ_MAX_PROMPT_TOKENS", MAX_PROMPT_TOKENS)


def job_seconds() -> float:
    return env_number("SPECVIZ_JOB_SECONDS", JOB_SECONDS)


def clean_prompt(text: Any) -> str:
    """The prompt as the models will see it, or InputError."""
    if not isinstance(text, str):
        raise InputError("The prompt must be text.")
    if len(text) > 4 * MAX_PROMPT_CHARS:  # far too long: refuse before spending time cleaning it
        raise InputError(f"The prompt is too long ({len(text):,} characters; the limit is {MAX_PROMPT_CHARS:,}).")
    # Lone surrogates (invalid Unicode from a client) cannot be encoded: replace them.
    text = text.encode("utf-8", "replace").decode("utf-8")
    text = unicodedata.normalize("NFC", _CONTROL.sub("", text.replace("\r\n", "\n")))
    if not text.strip():
        raise InputError("The prompt is empty: type a prompt or pick an example.")
    if len(text) > MAX_PROMPT_CHARS:
        raise InputError(f"The prompt is too long ({len(text):,} characters; the limit is {MAX_PROMPT_CHARS:,}).")
    return text


def check_model_id(name: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise InputError("Give both a draft and a target model (hub id like 'org/name' or a local folder).")
    name = name.strip()
    if os.path.isdir(name):
        return name
    if not _MODEL_ID.match(name) or ".." in name:
        raise InputError(f"'{name[:100]}' is neither a hub id of the form 'org/name' nor an existing local folder.")
    return name


def offered_executions() -> tuple[str, ...]:
    """The target executions this server's device offers (models.executions), "auto" first."""
    from ..models.executions import offered
    from ..models.pair import resolve_device

    return ("auto",) + offered(resolve_device(None))


def zero_gpu() -> bool:
    """A Hugging Face ZeroGPU Space (the GPU exists only inside spaces.GPU calls)."""
    from .hosting import on_spaces

    return on_spaces() and bool(os.environ.get("SPACES_ZERO_GPU"))


def default_target_exec() -> str:
    """How the target executes unless a request says otherwise (env SPECVIZ_TARGET_EXEC): "auto" lets
    the execution probe choose on this machine; "bf16", "fp32", "int8" (CPU) or "bf16", "fp16",
    "bf16+graphs", "fp16+graphs" (CUDA) force one.  A value this machine does not offer means auto,
    with a warning (once per value, not once per request)."""
    return _default_target_exec(os.environ.get("SPECVIZ_TARGET_EXEC", ""), zero_gpu())


@functools.lru_cache(maxsize=8)
def _default_target_exec(raw: str, on_zero_gpu: bool = False) -> str:
    from ..models.executions import CHOICES

    name = env_choice("SPECVIZ_TARGET_EXEC", CHOICES, "auto")
    if name == "auto" and not raw.strip() and on_zero_gpu:
        # ZeroGPU attaches the GPU only inside spaces.GPU calls: no probe or CUDA graphs at load time.
        return "bf16"
    offered = offered_executions()
    if name not in offered:
        log.warning("ignoring SPECVIZ_TARGET_EXEC=%r (this machine offers %s); using auto", name, ", ".join(offered))
        return "auto"
    return name


def check_target_exec(value: Any) -> str:
    """A request's target execution, checked: "" / None means the server's default; InputError names
    what this machine offers."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return default_target_exec()
    if not isinstance(value, str):
        raise InputError(f"The target execution must be text (auto, bf16, …), not a {type(value).__name__}.")
    name, offered = value.strip().lower(), offered_executions()
    if name not in offered:
        raise InputError(f"Unknown target execution '{value.strip()[:40]}': this machine offers "
                         f"{', '.join(offered)} (auto measures which runs speculation fastest here).")
    return name


# The execution and probe of the pair each preset last loaded with (not the pair: the loader's cache
# decides how long models stay in memory), for the "This machine" panel.
_EXECUTIONS: dict[str, tuple[str, Any, str]] = {}  # preset -> (target_exec, probe or None, target name)
_WEIGHTS: dict[str, str] = {}  # preset -> the loaded pair's target_weights ("gguf", or "")


def loaded_execution(preset: Any) -> tuple[str, Any, str] | None:
    """(target_exec, probe, target name) of the pair `preset` last loaded in this process, or None."""
    if preset is None or (isinstance(preset, str) and preset.strip().lower() in ("", "default")):
        preset = default_preset()
    if isinstance(preset, str) and preset != CUSTOM_PRESET:
        try:
            preset = resolve_preset(preset)
        except ModelError:
            return None
    return _EXECUTIONS.get(preset)


def machine_class(label: str = "", device: str = "cpu") -> str:
    """The class of machine a run's timings belong to: "gpu", "bf16-native" (AMX, AVX512-BF16) or
    "no-native-bf16" (AVX2-only and the like) -- from a machine label (hardware.machine.Machine.describe)."""
    if str(device).startswith("cuda"):
        return "gpu"
    return "no-native-bf16" if "no native bf16" in label or "no AVX2" in label else "bf16-native"


def replay_execution(preset: str, requested: str) -> str:
    """What a request of `preset` asking for `requested` would execute as on this machine, with the
    machine's class ("int8@no-native-bf16"): part of the replay key, so a recording made with another
    execution or on another class of machine is never replayed as if it had run here."""
    from ..hardware import probe
    from ..hardware.machine import this_machine
    from ..models.pair import resolve_device, resolve_dtype

    device = resolve_device(None)
    machine = this_machine(device)
    execution = requested
    loaded = _EXECUTIONS.get(preset)
    target = PRESETS[preset].target if preset in PRESETS else ""
    if execution == "auto":
        if loaded:
            execution = loaded[0]
        elif target.startswith("tiny:"):
            execution = "fp32"  # the tiny pair is built in float32 and never probed
        else:
            known = probe.known(machine, target, resolve_dtype(None, device))
            execution = known.choice if known else probe.fallback(machine)
    if execution == "int8" and _gguf_weights(preset, target, loaded is not None and loaded[0] == "int8"):
        execution += "+gguf"  # other numbers and timings than int8's own rows: never the same recording
    return f"{execution}@{machine_class(machine.describe(), str(device))}"


def _gguf_weights(preset: str, target: str, loaded: bool) -> bool:
    """Whether an int8 target of `preset` multiplies its GGUF's matrices as stored (models.q4k): as the
    loaded pair did, or, before it loads, as it will (asked for, and the target an offline GGUF pack)."""
    from ..models import q4k

    if loaded and preset in _WEIGHTS:
        return _WEIGHTS[preset] == "gguf"
    return target.startswith("offline:") and q4k.expected()  # (never builds the kernel to answer)


def recording_execution(spec: Any) -> str:
    """A recording's execution and machine class, as replay_execution names them.  Recordings from
    before executions were named give their dtype, and were made on the AMX Xeon the shipped
    examples come from (bf16-native)."""
    models = getattr(spec, "models", None) or {}
    execution = models.get("target_exec") or {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}.get(
        models.get("dtype", ""), models.get("dtype", ""))
    execution += "+gguf" if models.get("target_weights") == "gguf" else ""
    return f"{execution}@{machine_class(models.get('machine', ''), getattr(spec, 'device', 'cpu') or 'cpu')}"


def _remember_execution(preset: str, pair: ModelPair) -> ModelPair:
    from ..models.executions import dtype_name

    execution = getattr(pair, "target_exec", "") or dtype_name(pair.dtype)  # the tiny pair: its dtype
    _EXECUTIONS[preset] = (execution, getattr(pair, "probe", None), pair.target_name)
    _WEIGHTS[preset] = getattr(pair, "target_weights", "") or ""
    return pair


def _asked(preset: Any, draft: Any, target: Any, target_exec: Any) -> tuple[str, dict[str, Any], str]:
    """(preset name, load_pair's model arguments, execution) of a request, checked (InputError)."""
    if preset is None or (isinstance(preset, str) and preset.strip().lower() in ("", "default")):
        preset = default_preset()
    if not isinstance(preset, str):
        raise InputError(f"The model preset must be text (a preset name), not a {type(preset).__name__}.")
    execution = check_target_exec(target_exec)
    if preset == CUSTOM_PRESET:
        if not custom_models_enabled():
            raise InputError("Custom model pairs are disabled on this server (set SPECVIZ_ALLOW_CUSTOM=1 to enable them).")
        return CUSTOM_PRESET, {"draft": check_model_id(draft), "target": check_model_id(target)}, execution
    try:
        preset = resolve_preset(preset)
    except ModelError as exc:
        raise InputError(str(exc)) from None
    return preset, {"preset": preset}, execution


def _is_default(preset: str, execution: str) -> bool:
    return preset == default_preset() and execution == default_target_exec()


def load_needed(preset: Any, draft: Any = None, target: Any = None, target_exec: Any = None) -> bool:
    """Whether the request would load a pair other than the server's default (then the loading takes the
    live gate like a run: jobs.request_at_gate).  A request that cannot be resolved: False (get_pair says why)."""
    from ..models import loading

    try:
        name, models, execution = _asked(preset, draft, target, target_exec)
        return not _is_default(name, execution) and loading.loaded(**models, target_exec=execution) is None
    except (InputError, ModelError):
        return False


def _gb(n: float) -> str:
    return f"{n / 2**30:.1f} GB"


def admit(name: str, models: dict[str, Any], execution: str) -> None:
    """Refuse (InputError, a plain message) a visitor's request that would load a pair this server should
    not: a hub model that is not on disk unless the host allows downloads, or a pair that does not fit in
    the memory budget beside the pairs that stay loaded (the default pair always among them, loaded or not)."""
    from ..models import loading

    what = f"{name} as {execution}" if name != CUSTOM_PRESET else f"{models['draft']} → {models['target']}"
    base = PRESETS.get(name)
    refs = (base.draft, base.target) if base and "preset" in models else (models.get("draft"), models.get("target"))
    missing = [r for r in refs if r and not loading.on_disk(r)]
    if missing and not downloads_allowed():
        raise InputError(f"{what} is not on this server's disk ({', '.join(missing)}), and this server does not "
                         "download models for visitors (the host can preload them, or allow it with "
                         "SPECVIZ_ALLOW_DOWNLOADS=1). The default pair is ready for everyone.")
    need = loading.estimate_bytes(**models, target_exec=execution)
    budget = memory_budget_bytes()
    if need is None:
        raise InputError(f"{what} cannot be priced before it is downloaded, so this server does not load it for "
                         f"a visitor (its memory budget is {_gb(budget)}, SPECVIZ_MEMORY_GB).")
    staying = loading.staying()
    held = sum(loading.pair_nbytes(p) for p, _ in staying)
    default = default_preset()
    if not any(pinned for _, pinned in staying):  # the default pair is not loaded yet: its room is kept for it
        held += loading.estimate_bytes(default, target_exec=default_target_exec()) or 0
    if held + need > budget:
        raise InputError(f"Loading {what} (about {_gb(need)}) beside the default pair and what else is loaded "
                         f"({_gb(held)}) would exceed this server's memory budget of {_gb(budget)} "
                         "(SPECVIZ_MEMORY_GB). The default pair stays loaded for everyone: use it, or ask the host.")
    free = available_bytes()  # the budget is the app's own accounting: other processes use memory too
    if free is not None and need + MEMORY_RESERVE > free:
        raise InputError(f"Loading {what} needs about {_gb(need)}, and this machine has {_gb(free)} of memory "
                         f"available now (keeping {_gb(MEMORY_RESERVE)} free for the server): it is not loaded. "
                         "The default pair is ready for everyone; try again when the machine is less busy.")


MEMORY_RESERVE = 1 << 30  # memory a load must leave available (the server, its runs, the page's work)


def get_pair(preset: Any, draft: Any = None, target: Any = None,
             progress: Callable[[float, str], None] | None = None, target_exec: Any = None,
             gated: bool = False, serve_early: bool = False) -> ModelPair:
    """Resolve and load a preset (or an allowed custom pair); InputError/ModelError on failure.
    ``target_exec``: how the target executes (:func:`check_target_exec`; None: the server's default).

    The server's default pair (default preset, default execution) is loaded pinned: nothing a visitor
    asks for evicts it.  Any other pair not loaded yet is a visitor's request (issue 33): `admit` may
    refuse it, and it loads holding the live gate like a run (``gated``: the caller holds it already;
    otherwise this waits for it, or raises replay.Busy).

    ``serve_early`` (the server's preload of the default pair): its int8 models serve as soon as they
    are loaded and are packed into their fast layout in the background (:mod:`specviz.models.warm`; a
    race run meanwhile is flagged)."""
    from ..models import loading

    name, models, execution = _asked(preset, draft, target, target_exec)
    if _is_default(name, execution):
        pair = load_pair(**models, target_exec=execution, progress=progress, pin=True, defer_packing=serve_early)
        if serve_early:  # what that load left, packed on every core between runs (a run's call scans nothing)
            warm.finish(pair, lock=MODEL_LOCK, workers=os.cpu_count() or 1)
            # an execution taken unmeasured to serve at once (nothing to choose) is timed once served, between runs
            measure_after_serving(pair, MODEL_LOCK, warm.served)
        return _remember_execution(name, pair)
    if loading.loaded(**models, target_exec=execution) is None:
        admit(name, models, execution)
        if not gated:
            from .replay import GATE

            for _ in GATE.enter():
                pass
            try:
                return _remember_execution(name, load_pair(**models, target_exec=execution, progress=progress))
            finally:
                GATE.leave()
    return _remember_execution(name, load_pair(**models, target_exec=execution, progress=progress))


@dataclass
class Request:
    pair: ModelPair
    prompt: str
    prompt_ids: list[int]
    settings: DecodeSettings


def check_request(prompt: Any, **settings: Any) -> tuple[str, DecodeSettings]:
    """The checks that need no model: run them before loading one, so bad input fails fast."""
    text = clean_prompt(prompt)
    try:
        return text, DecodeSettings.checked(**settings)
    except SettingsError as exc:
        raise InputError(str(exc)) from None


def prepare(pair: ModelPair, prompt: Any, chat: bool = True, **settings: Any) -> Request:
    """Validate the prompt and settings, then check them against the loaded pair (`tokenize`)."""
    text, s = check_request(prompt, **settings)
    return tokenize(pair, text, s, chat=chat)


def tokenize(pair: ModelPair, text: str, settings: DecodeSettings, chat: bool = True) -> Request:
    """The checks a validated request still needs, against the loaded pair: the prompt's length in tokens.

    Needs the tokenizer only, never the model lock: callers run it before taking MODEL_LOCK, so a
    prompt over the token limit is refused at once, even while another job is decoding."""
    ids = encode_prompt(pair, text, chat=chat)
    limit = max_prompt_tokens()
    if len(ids) > limit:
        raise InputError(f"The prompt is {len(ids):,} tokens; the limit is {limit:,}. Shorten the prompt.")
    if len(ids) + settings.max_new_tokens > pair.context_length:
        raise InputError(
            f"The prompt is {len(ids):,} tokens; with {settings.max_new_tokens} new tokens that exceeds the models' "
            f"context of {pair.context_length:,} tokens. Shorten the prompt or lower max new tokens."
        )
    return Request(pair, text, ids, settings)


@dataclass
class Update:
    """One step of a race: which side is running and the event it produced."""

    phase: str  # "speculative" | "standard" | "done": the run this event came from
    event: Event | None
    spec: Any = None  # Trace so far
    std: Any = None
    spec_done: bool = False  # the speculative run has ended (the runs are interleaved: both may be going)
    std_done: bool = False


@dataclass
class JobBudget:
    """The `should_stop` of one job: the user's Stop, or its wall-time budget running out.

    The engine checks it before each round and records any stop as "stopped"; `explain` turns
    that into "time_limit" when the budget was the reason."""

    seconds: float
    user_stop: Callable[[], bool] = lambda: False
    ran_out: bool = False
    deadline: float = field(init=False)

    def __post_init__(self) -> None:
        self.deadline = _now() + self.seconds

    def __call__(self) -> bool:
        if self.user_stop():
            return True
        if _now() >= self.deadline:
            self.ran_out = True
            return True
        return False

    def explain(self, trace: Any) -> Any:
        if self.ran_out and trace.stop_reason == "stopped":
            trace.stop_reason = "time_limit"
        return trace


def release_memory() -> None:
    """Give the memory a finished job freed back to the system.

    The engine frees its KV caches, but glibc keeps freed heap pages for reuse, so a server's
    resident memory would stay at the peak of its longest prompt; malloc_trim(0) returns them."""
    gc.collect()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc (musl): nothing to trim
            pass


def race(req: Request, should_stop: Callable[[], bool] = lambda: False, standard: bool = True, *,
         order: str | None = None, threads: int | None = None) -> Iterator[Update]:
    """Speculative and standard decoding on the same prompt, seed and settings, interleaved.

    The two runs advance in alternation, whichever's own clock is behind going next
    (:func:`specviz.core.race.interleave`), so both see the same background load; never
    concurrently, so neither slows the other.  A target with compiled steps over one static cache
    (the GPU's graphs) cannot hold two runs at once: there the runs go one after the other, and the
    trace says so.  Both share the job's time budget (`job_seconds()`).  The number of threads is
    chosen for the moment (:func:`specviz.hardware.load.race_threads`) and the same for both runs.

    ``order="sequential"`` and ``threads`` (0: the process's count, unchanged) reproduce the race as
    it was measured before, for the bench's contrast (cli.race_load)."""
    budget = JobBudget(job_seconds(), should_stop)
    interleaved = order != "sequential" and race_can_interleave(req.pair)
    how = ("interleaved" if interleaved else "sequential") if standard else "alone"
    spec = std = None
    done = {"speculative": False, "standard": not standard}
    # the fast kernels not all in place yet (slower passes, some switching)
    preparing = warm.preparing(req.pair)
    with race_threads(req.pair, fixed=threads) as control:
        try:
            streams = {"speculative": speculative_stream(req.pair, req.prompt_ids, req.settings, prompt=req.prompt,
                                                         drafter=make_drafter(req.pair, req.settings),
                                                         should_stop=budget)}
            if standard:
                streams["standard"] = _standard(req, budget, sequential=how == "sequential")
            # closing(): a cancelled job ends both engines' loops here (freeing their caches) before the trim.
            with contextlib.ExitStack() as stack:
                for stream in streams.values():
                    stack.enter_context(contextlib.closing(stream))
                # Turns by the passes' prices, not their measured times: a schedule that cannot follow the load.
                costs = event_costs(probe_prices(req.pair, control.start),
                                    draft_model=req.settings.drafter in DRAFT_MODEL_DRAFTERS)
                events = interleave(streams, cost=costs) if how == "interleaved" else in_turn(streams)
                for phase, ev in events:
                    control.check()  # other work arrived: both runs go on with one thread
                    trace = budget.explain(ev.trace) if ev.kind == "done" else ev.trace
                    done[phase] = ev.kind == "done"
                    if phase == "speculative":
                        spec = trace
                    else:
                        std = trace
                    yield Update(phase, ev, spec, std, spec_done=done["speculative"], std_done=done["standard"])
        finally:
            release_memory()
        if spec is not None:
            end = control.count if control.count != control.start else None
            spec.timing = assess_race(spec, std, how=how, threads=control.start, busy=control.busy,
                                      threads_end=end, busy_during=control.busy_during,
                                      prices=probe_prices(req.pair, control.count),
                                      preparing=preparing or warm.preparing(req.pair))
            if std is not None:
                std.timing = spec.timing
    yield Update("done", None, spec, std, spec_done=True, std_done=True)


def probe_prices(pair: Any, threads: int | None = None) -> Prices | None:
    """The probe's costs for the pair's target execution on this machine, for a race on ``threads``
    threads: the one-thread curve for one thread where the probe timed it (None when not measured)."""
    probe = getattr(pair, "probe", None)
    costs = probe.costs(str(getattr(pair, "target_exec", "") or ""), threads) if probe is not None else None
    if costs is None:
        return None
    curve, draft_ms, count = costs
    seconds = {k: ms / 1000 for k, ms in curve.items()}
    limit_target = limit_draft = None
    roof = probe_roofline(probe) if count == (probe.machine or {}).get("threads") else None  # (timed on every core)
    if roof is not None and roof.at(1):
        limit_target = lambda k: roof.at(k) / 1000  # noqa: E731
        draft_bound = probe.bound_ms(probe.draft_mb)
        limit_draft = draft_bound / 1000 if draft_bound else None
    return Prices(target=lambda k: interpolate(seconds, k), draft=draft_ms / 1000 if draft_ms else None,
                  threads=count, limit_target=limit_target, limit_draft=limit_draft)


def _standard(req: Request, budget: "JobBudget", *, sequential: bool) -> Iterator[Event]:
    """The baseline run.  In a sequential race it starts after the speculative run, and not at all
    if that run was stopped or spent the job's budget."""
    if sequential and budget():
        return
    yield from standard_stream(req.pair, req.prompt_ids, req.settings, prompt=req.prompt, should_stop=budget)


def describe_error(exc: BaseException) -> str:
    """A one-paragraph message for any failure inside a run (never a traceback)."""
    if isinstance(exc, (InputError, ModelError, SettingsError)):
        return str(exc)
    name = type(exc).__name__
    if "out of memory" in str(exc).lower() or isinstance(exc, MemoryError):
        return "The run ran out of memory. Try fewer new tokens or a smaller model pair; the server is fine."
    return f"The run failed ({name}: {short_error(exc, 300)}). The server is fine; try again or change the settings."
