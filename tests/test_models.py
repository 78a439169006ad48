"""Model loading: the tiny pair, offline packs (reassembly, checks, GGUF conversion), errors, and the
real offline default pair (slow the first time: it converts the pip-packaged GGUF files)."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from specviz import models
from specviz.models import (
    DEFAULT_PRESET,
    PRESETS,
    TINY_PRESET,
    ModelError,
    ModelPair,
    Detokenizer,
    OfflinePack,
    clear_cache,
    encode_prompt,
    load_pair,
    preset_help,
    resolve_preset,
    token_text,
)
from specviz.models import int8, loading, packs
from specviz.models.pair import resolve_device, resolve_dtype
from specviz.models.tiny import build_tiny_pair, build_tokenizer
from specviz.core.text import byte_alphabet

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_cache()
    yield
    clear_cache()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private SPECVIZ_CACHE, so fake packs never touch the real cache."""
    path = tmp_path / "cache"
    monkeypatch.setenv("SPECVIZ_CACHE", str(path))
    return path


# --------------------------------------------------------------------------------------------------
# Fake offline packs: tiny importable packages, each with get_part_path() -> data/partNN.bin
# --------------------------------------------------------------------------------------------------

# Fake packages' module names must never repeat in a process: an imported part module stays in sys.modules.
# This file may be imported twice (as test_models by pytest, as tests.test_models by test_first_start), each copy
# with its own counter: each starts at its own random offset.
_counter = itertools.count(int.from_bytes(os.urandom(4), "big") * 1000)


def make_pack(tmp_path, monkeypatch, data: bytes, n_parts: int = 3, *, extra_eos=()) -> OfflinePack:
    """Split ``data`` into ``n_parts`` installed fake packages and register the pack in OFFLINE_PACKS."""
    uid = next(_counter)
    key = f"fake{uid}"
    site = tmp_path / f"site{uid}"
    cuts = np.linspace(0, len(data), n_parts + 1).astype(int)
    packages = []
    for i in range(1, n_parts + 1):
        module = f"specviz_fakepack{uid}_part{i}"
        (site / module / "data").mkdir(parents=True)
        (site / module / "data" / f"part{i:02d}.bin").write_bytes(data[cuts[i - 1] : cuts[i]])
        (site / module / "__init__.py").write_text(
            "import os\n"
            "def get_part_path():\n"
            f"    return os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'part{i:02d}.bin')\n"
        )
        packages.append((f"fake{uid}-part{i}", module))
    monkeypatch.syspath_prepend(str(site))
    pack = OfflinePack(key=key, display=f"Fake model {uid}", packages=tuple(packages), version="1.0",
                       size=len(data), sha256=hashlib.sha256(data).hexdigest(), extra_eos=tuple(extra_eos))
    monkeypatch.setitem(models.OFFLINE_PACKS, key, pack)
    return pack


def part_file(pack: OfflinePack, i: int) -> Path:
    module = pack.packages[i - 1][1]
    return Path(__import__(module).get_part_path())


# A Q4_K_M file's layout: its matrices Q4_K, v and down (and the head) Q6_K
Q4_K_M = {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q4_K", "ffn_gate": "Q4_K",
          "ffn_up": "Q4_K", "ffn_down": "Q6_K", "output": "Q6_K"}


def write_tiny_gguf(path: Path, *, seed: int = 0, hidden: int = 32, tied: bool = False, layers: int = 1,
                    ffn: int = 64, types: dict[str, str] | None = None) -> None:
    """A real (tiny) Qwen2 GGUF with a byte-level BPE vocabulary, via gguf-py: its matrices Q8_0, or of the ggml
    types ``types`` names by kind (e.g. :data:`Q4_K_M`, whose blocks need ``hidden`` and ``ffn`` multiples of 256)."""
    import gguf

    from tests.gguf_blocks import q4k_encode, q6k_encode

    spelled = byte_alphabet()
    tokens = [spelled[b] for b in range(256)] + ["de", "def", "Ġf", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab, heads, kv = len(tokens), 2, 1
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name("tiny qwen2")
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * (vocab - 3) + [3, 3, 3])
    w.add_token_merges(["d e", "de f", "Ġ f"])
    w.add_bos_token_id(vocab - 3)
    w.add_eos_token_id(vocab - 1)
    w.add_pad_token_id(vocab - 3)
    w.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )

    def tensor(name, *shape):
        a = (rng.standard_normal(shape) * 0.2).astype(np.float32)
        if len(shape) == 2:
            kind = name.split(".")[-2] if name.startswith("blk.") else name.split(".")[0]
            q = getattr(gguf.GGMLQuantizationType, (types or {}).get(kind, "Q8_0"))
            made = {gguf.GGMLQuantizationType.Q4_K: q4k_encode, gguf.GGMLQuantizationType.Q6_K: q6k_encode}
            w.add_tensor(name, made[q](a) if q in made else gguf.quants.quantize(a, q), raw_dtype=q)
        else:
            w.add_tensor(name, a)

    hd = hidden // heads
    tensor("token_embd.weight", vocab, hidden)
    for i in range(layers):
        tensor(f"blk.{i}.attn_norm.weight", hidden)
        tensor(f"blk.{i}.ffn_norm.weight", hidden)
        tensor(f"blk.{i}.attn_q.weight", hidden, hidden)
        tensor(f"blk.{i}.attn_q.bias", hidden)
        tensor(f"blk.{i}.attn_k.weight", kv * hd, hidden)
        tensor(f"blk.{i}.attn_k.bias", kv * hd)
        tensor(f"blk.{i}.attn_v.weight", kv * hd, hidden)
        tensor(f"blk.{i}.attn_v.bias", kv * hd)
        tensor(f"blk.{i}.attn_output.weight", hidden, hidden)
        tensor(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        tensor(f"blk.{i}.ffn_up.weight", ffn, hidden)
        tensor(f"blk.{i}.ffn_down.weight", hidden, ffn)
    tensor("output_norm.weight", hidden)
    if not tied:  # llama.cpp omits output.weight for models with tied embeddings
        tensor("output.weight", vocab, hidden)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gguf_pack(tmp_path, monkeypatch, *, seed=0, tied=False, n_parts=3, **shape) -> OfflinePack:
    path = tmp_path / f"src{next(_counter)}.gguf"
    write_tiny_gguf(path, seed=seed, tied=tied, **shape)
    return make_pack(tmp_path, monkeypatch, path.read_bytes(), n_parts, extra_eos=("<|im_end|>", "<|endoftext|>"))


# --------------------------------------------------------------------------------------------------
# Presets and the API surface
# --------------------------------------------------------------------------------------------------


def test_presets_offline_default_first():
    names = list(PRESETS)
    assert names[0] == DEFAULT_PRESET
    default = PRESETS[DEFAULT_PRESET]
    assert default.offline and default.draft == "offline:qwen2.5-coder-0.5b"
    assert default.target == "offline:qwen2.5-coder-1.5b"
    assert TINY_PRESET == "tiny-random (tests)" and TINY_PRESET in PRESETS
    hub = {(p.draft, p.target) for p in PRESETS.values()}
    assert ("EleutherAI/pythia-70m", "EleutherAI/pythia-2.8b") in hub
    assert ("Qwen/Qwen2.5-Coder-0.5B-Instruct", "Qwen/Qwen2.5-Coder-7B-Instruct") in hub
    assert ("HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-1.7B-Instruct") in hub
    for name, p in PRESETS.items():
        assert p.name == name and p.description


def test_never_trusts_remote_code():
    paths = sorted((REPO / "specviz" / "models").glob("*.py"))
    assert len(paths) >= 9
    for path in paths:
        text = path.read_text()
        assert "trust_remote_code=True" not in text.replace(" ", "")


def test_resolve_preset_ids_names_and_default():
    assert resolve_preset("default") == resolve_preset(" Default ") == DEFAULT_PRESET
    ids = [p.id for p in PRESETS.values()]
    assert len(set(ids)) == len(ids)  # ids are unique
    for name, p in PRESETS.items():
        assert resolve_preset(p.id) == name
        assert resolve_preset(p.id.upper()) == name
        assert resolve_preset(name) == name
        assert resolve_preset(f"  {name} ") == name
    for unknown in ("nope", "", "tiny-random", "qwen"):
        with pytest.raises(ModelError) as err:
            resolve_preset(unknown)
        msg = str(err.value)
        assert "Unknown model preset" in msg and "default" in msg
        assert all(i in msg for i in ids)
    assert all(p.id in preset_help() and p.name in preset_help() for p in PRESETS.values())


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"preset": "nope"}, ["Unknown preset", DEFAULT_PRESET]),
        ({"draft": "x"}, ["both a draft and a target"]),
        ({"preset": TINY_PRESET, "draft": "offline:qwen2.5-coder-0.5b"}, ["tiny"]),
        ({"draft": "offline:nope", "target": "offline:nope"}, ["Unknown offline model"]),
        ({"preset": DEFAULT_PRESET, "dtype": "int4"}, ["Unknown dtype"]),
        ({"preset": DEFAULT_PRESET, "draft_quant": "int4"}, ["quantization"]),
    ],
)
def test_argument_errors(kwargs, words):
    with pytest.raises(ModelError) as err:
        load_pair(**kwargs)
    for w in words:
        assert w in str(err.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_requested_without_gpu():
    with pytest.raises(ModelError, match="no CUDA GPU"):
        load_pair(DEFAULT_PRESET, device="cuda")


def test_hub_model_offline_error(cache):
    assert os.environ.get("HF_HUB_OFFLINE") == "1"  # tests/conftest.py
    with pytest.raises(ModelError) as err:
        load_pair(draft="EleutherAI/no-such-model-70m", target="EleutherAI/no-such-model-2.8b")
    msg = str(err.value)
    assert "HF_HUB_OFFLINE" in msg and "no-such-model" in msg and "Traceback" not in msg


@pytest.mark.parametrize(
    "exc, offline, words",
    [
        (MemoryError(), False, "not enough memory"),
        (RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"), False, "not enough memory"),
        (ValueError("requires you to execute custom code; set trust_remote_code=True"), False, "never runs"),
        (OSError("x is not a local folder and is not a valid model identifier"), True, "HF_HUB_OFFLINE"),
        (OSError("Couldn't connect to 'https://huggingface.co'"), False, "unreachable"),
        (OSError("x is not a valid model identifier listed on 'https://huggingface.co/models'"), False, "neither"),
        (KeyError("qwen9"), False, "not a causal language model"),
    ],
)
def test_load_error_messages(monkeypatch, exc, offline, words):
    from specviz.models import loaders

    monkeypatch.setattr(loaders, "_hub_offline", lambda: offline)
    err = loaders._load_error("org/model", "org/model", exc)
    assert isinstance(err, ModelError) and words in str(err) and str(err).startswith("Could not load org/model")


def test_dtype_and_device_resolution():
    cpu = torch.device("cpu")
    assert resolve_dtype(None, cpu) == torch.bfloat16
    assert resolve_dtype("float32", cpu) == torch.float32
    assert resolve_dtype("bfloat16", cpu) == torch.bfloat16
    assert resolve_dtype("float16", cpu) == torch.float16
    assert resolve_device("cpu") == cpu
    assert resolve_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")


# --------------------------------------------------------------------------------------------------
# The tiny pair
# --------------------------------------------------------------------------------------------------


def test_tiny_pair_shape_and_speed():
    build_tiny_pair()  # warm up imports
    t = time.perf_counter()
    pair = build_tiny_pair(vocab_size=32, seed=0)
    assert time.perf_counter() - t < 1.0
    assert isinstance(pair, ModelPair) and pair.preset == TINY_PRESET
    assert pair.dtype == torch.float32 and pair.device.type == "cpu" and pair.draft_quant is None
    assert pair.vocab_size == 32 == len(pair.tokenizer)
    assert pair.eos_token_ids == [pair.tokenizer.eos_token_id]
    assert pair.device_label() == "cpu"
    assert sum(p.numel() for p in pair.draft.parameters()) < sum(p.numel() for p in pair.target.parameters())
    ids = torch.tensor([encode_prompt(pair, "hello world")])
    with torch.no_grad():
        assert pair.draft(ids).logits.shape[-1] == pair.target(ids).logits.shape[-1] == 32
    assert not pair.draft.training and not pair.target.training


def _mean_tv(pair) -> float:
    ids = torch.tensor([encode_prompt(pair, "the quick brown fox jumps over the lazy dog")])
    with torch.no_grad():
        p = pair.target(ids).logits.softmax(-1)
        q = pair.draft(ids).logits.softmax(-1)
    return 0.5 * (p - q).abs().sum(-1).mean().item()


def test_tiny_pair_draft_is_correlated_but_different():
    tv = _mean_tv(build_tiny_pair())
    assert 0.05 < tv < 0.6  # different models, but acceptance is far from zero
    assert _mean_tv(build_tiny_pair(correlated=False)) > tv
    assert _mean_tv(build_tiny_pair(noise=0.0)) < tv


def test_tiny_pair_deterministic_and_leaves_rng_alone():
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a, b = build_tiny_pair(seed=3), build_tiny_pair(seed=3)
    assert torch.equal(torch.get_rng_state(), state)
    for x, y in zip(a.target.parameters(), b.target.parameters()):
        assert torch.equal(x, y)
    c = build_tiny_pair(seed=4)
    assert not torch.equal(a.target.lm_head.weight, c.target.lm_head.weight)


def test_tiny_tokenizer_and_prompt():
    tok = build_tokenizer(32)
    ids = tok.encode("ab c", add_special_tokens=False)
    assert len(ids) == 4 and tok.decode(ids) == "ab c"
    pair = build_tiny_pair()
    chat = encode_prompt(pair, "hi", chat=True)
    plain = encode_prompt(pair, "hi", chat=False)
    assert plain == tok.encode("hi", add_special_tokens=False)
    assert chat[0] == tok.convert_tokens_to_ids("<user>") and chat[-1] == tok.convert_tokens_to_ids("<assistant>")
    assert pair.eos_token_ids[0] in chat  # the template closes the user turn with <eos>
    assert [token_text(tok, i) for i in plain] == ["h", "i"]
    with pytest.raises(ValueError):
        build_tokenizer(4)


def test_tiny_generate_stops_at_eos():
    pair = build_tiny_pair()
    ids = torch.tensor([encode_prompt(pair, "abc")])
    out = pair.target.generate(ids, max_new_tokens=200, do_sample=True, eos_token_id=pair.eos_token_ids,
                               pad_token_id=pair.tokenizer.pad_token_id)
    assert out.shape[1] > ids.shape[1]


def test_load_pair_tiny_is_cached_and_shared():
    a = load_pair(TINY_PRESET)
    assert a.preset == TINY_PRESET and a.vocab_size == 32
    assert load_pair(TINY_PRESET) is a
    results = []
    threads = [threading.Thread(target=lambda: results.append(load_pair(TINY_PRESET))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r is a for r in results)
    clear_cache()
    assert load_pair(TINY_PRESET) is not a


def test_token_text_never_raises():
    tok = build_tokenizer(32)
    assert token_text(tok, tok.eos_token_id) == "<eos>"
    assert token_text(tok, 10_000) == "<10000>"
    assert isinstance(token_text(tok, -1), str)
    assert token_text(None, 5) == "<5>"


def test_detokenizer_joins_the_emitted_text():
    tok = build_tokenizer(32)
    ids = tok.encode("ab c", add_special_tokens=False)
    detok = Detokenizer(tok)
    assert "".join(detok.push(i) for i in ids) == "ab c" == detok.text
    assert [token_text(tok, i) for i in ids] == ["a", "b", " ", "c"]


# --------------------------------------------------------------------------------------------------
# Offline packs: streaming reassembly and its checks
# --------------------------------------------------------------------------------------------------


def test_reassemble_streams_and_verifies(tmp_path, monkeypatch):
    data = os.urandom(10_000)
    pack = make_pack(tmp_path, monkeypatch, data, n_parts=4)
    monkeypatch.setattr(packs, "_CHUNK", 333)  # force many chunks per part
    reads = []
    real_open = open

    class CountingFile:
        def __init__(self, f):
            self.f = f

        def read(self, n=-1):
            reads.append(n)
            return self.f.read(n)

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

    def spy_open(path, mode="r", *a, **k):
        f = real_open(path, mode, *a, **k)
        return CountingFile(f) if "r" in mode and str(path).endswith(".bin") else f

    monkeypatch.setattr("builtins.open", spy_open)
    seen = []
    dest = packs.reassemble(pack, tmp_path / "out" / "model.gguf", lambda f, m: seen.append(f))
    monkeypatch.undo()
    assert dest.read_bytes() == data
    assert reads and max(reads) == 333 and len(reads) >= 10_000 // 333  # chunked, never the whole file
    assert seen == sorted(seen) and seen[-1] == pytest.approx(1.0)
    assert not list((tmp_path / "out").glob("*.partial"))


def test_reassemble_missing_package(tmp_path, monkeypatch, cache):
    pack = make_pack(tmp_path, monkeypatch, os.urandom(3000))
    missing_module = pack.packages[1][1]
    # part 2 is registered under a pip name whose module is not installed
    packages = pack.packages[:1] + (("fake-missing-part2", missing_module + "_gone"),) + pack.packages[2:]
    pack = dataclasses.replace(pack, packages=packages)
    monkeypatch.setitem(models.OFFLINE_PACKS, pack.key, pack)
    with pytest.raises(ModelError) as err:
        packs.reassemble(pack, tmp_path / "x.gguf")
    msg = str(err.value)
    assert "fake-missing-part2" in msg and "pip install 'fake-missing-part2==1.0'" in msg
    assert pack.packages[0][0] not in msg  # only the missing one is named
    assert "Traceback" not in msg
    assert not (tmp_path / "x.gguf").exists()
    # The same message through the public API.
    monkeypatch.setitem(PRESETS, "fake", models.Preset("fake", "fake", pack.ref, pack.ref, True, "test"))
    with pytest.raises(ModelError, match="fake-missing-part2"):
        load_pair("fake")


def test_reassemble_missing_part_file(tmp_path, monkeypatch):
    pack = make_pack(tmp_path, monkeypatch, os.urandom(3000))
    part_file(pack, 3).unlink()
    with pytest.raises(ModelError, match=pack.packages[2][0]):
        packs.reassemble(pack, tmp_path / "x.gguf")


def test_reassemble_corrupt_part(tmp_path, monkeypatch):
    pack = make_pack(tmp_path, monkeypatch, os.urandom(3000))
    p = part_file(pack, 2)
    raw = bytearray(p.read_bytes())
    raw[5] ^= 0xFF
    p.write_bytes(bytes(raw))
    with pytest.raises(ModelError) as err:
        packs.reassemble(pack, tmp_path / "x.gguf")
    assert "corrupt" in str(err.value) and "sha256" in str(err.value) and "--force-reinstall" in str(err.value)
    assert not (tmp_path / "x.gguf").exists() and not list(tmp_path.glob("*.partial"))


@pytest.mark.parametrize("delta", [-7, +7])
def test_reassemble_wrong_size(tmp_path, monkeypatch, delta):
    pack = make_pack(tmp_path, monkeypatch, os.urandom(3000))
    p = part_file(pack, 1)
    raw = p.read_bytes()
    p.write_bytes(raw[:delta] if delta < 0 else raw + b"x" * delta)
    with pytest.raises(ModelError, match="instead of 3,000"):
        packs.reassemble(pack, tmp_path / "x.gguf")
    assert not list(tmp_path.glob("x.gguf*"))


# --------------------------------------------------------------------------------------------------
# Offline packs: GGUF -> safetensors conversion, with real (tiny) GGUF files
# --------------------------------------------------------------------------------------------------


def test_an_offline_pair_loads_from_its_gguf_into_memory(tmp_path, monkeypatch, cache):
    from transformers import AutoModelForCausalLM

    draft, target = gguf_pack(tmp_path, monkeypatch, seed=1), gguf_pack(tmp_path, monkeypatch, seed=2, tied=True)
    events = []
    pair = load_pair(draft=draft.ref, target=target.ref, draft_quant=None, target_exec="bf16",
                     progress=lambda f, m: events.append((f, m)))

    # progress: monotone, within [0, 1], ends at 1; nothing written: the packs' files are the models
    fractions = [f for f, _ in events]
    assert all(0.0 <= f <= 1.0 for f in fractions) and fractions[-1] == 1.0
    assert all(b >= a - 1e-9 for a, b in zip(fractions, fractions[1:]))
    assert not (cache / "models").exists() and not list(cache.rglob("*.gguf")) and not list(cache.rglob("*.safetensors"))

    tok = pair.tokenizer
    assert pair.vocab_size == len(tok) == 262
    assert pair.context_length == 128 and pair.preset == "custom" and pair.dtype == torch.bfloat16
    assert set(pair.eos_token_ids) == {tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")}
    prompt = encode_prompt(pair, "def f")
    assert tok.decode(prompt).endswith("<|im_start|>assistant\n")
    assert encode_prompt(pair, "def f", chat=False) == tok.encode("def f", add_special_tokens=False)
    assert target.display == pair.target_name and pair.target.config.tie_word_embeddings
    assert torch.equal(pair.target.lm_head.weight, pair.target.model.embed_tokens.weight)

    # the weights compute what transformers' own GGUF loading computes (both bf16)
    ids = torch.tensor([prompt])
    gguf_dir = tmp_path / "direct"
    gguf_dir.mkdir()
    (gguf_dir / "m.gguf").write_bytes(b"".join(part_file(draft, i).read_bytes() for i in (1, 2, 3)))
    direct = AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file="m.gguf", dtype=torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(pair.draft(ids).logits, direct(ids).logits)

    # shared in-process cache
    assert load_pair(draft=draft.ref, target=target.ref, draft_quant=None, target_exec="bf16") is pair
    clear_cache()
    again = load_pair(draft=draft.ref, target=target.ref, draft_quant=None, target_exec="bf16")
    assert again is not pair and again.vocab_size == 262


def test_int8_draft(tmp_path, monkeypatch, cache):
    if not int8.int8_available():
        pytest.skip("this torch has no dynamic int8 kernels")
    draft, target = gguf_pack(tmp_path, monkeypatch, seed=1), gguf_pack(tmp_path, monkeypatch, seed=2)
    ref = load_pair(draft=draft.ref, target=target.ref, draft_quant=None, dtype="float32")
    pair = load_pair(draft=draft.ref, target=target.ref, draft_quant="int8", dtype="float32")
    assert pair.draft_quant == _int8_draft() and ref.draft_quant is None
    assert pair.target is not ref.target  # a different cache key
    assert not any(type(m) is torch.nn.Linear for m in pair.draft.modules())
    ids = torch.tensor([encode_prompt(pair, "def f")])
    with torch.no_grad():
        a, b = ref.draft(ids).logits, pair.draft(ids).logits
    assert a.shape == b.shape and torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0) > 0.95


def _int8_draft() -> str:
    """The label an int8 draft loads with here: "int8+q4k" where its matrices become Q4_K made here (the
    default wherever specviz's kernel runs: models.q4k_draft), else "int8"."""
    from specviz.models import q4k

    return "int8+q4k" if q4k.enabled() else "int8"


@pytest.mark.parametrize("timings, starved, expect, recorded", [
    ([100.0, 40.0], False, "int8", True),   # int8 clearly faster: use it, remember
    ([100.0, 95.0], False, None, True),     # not clearly faster: keep the draft as loaded, remember
    ([100.0, 95.0], True, "int8", False),   # busy machine: the timing means nothing; int8, re-measure later
])
def test_int8_auto_decision(tmp_path, monkeypatch, cache, timings, starved, expect, recorded):
    if not int8.int8_available():
        pytest.skip("this torch has no dynamic int8 kernels")
    draft, target = gguf_pack(tmp_path, monkeypatch, seed=1), gguf_pack(tmp_path, monkeypatch, seed=2)
    monkeypatch.setattr(int8, "decode_step_ms", lambda ms, vocab, **kw: list(timings)[: len(ms)])
    monkeypatch.setattr(int8, "starved", lambda cpu, wall: starved)
    monkeypatch.setattr(int8, "machine_busy", lambda: False)
    auto = load_pair(draft=draft.ref, target=target.ref, dtype="bfloat16")
    assert auto.draft_quant == (_int8_draft() if expect == "int8" else expect)
    known = int8.known_int8_decision(draft.ref, torch.bfloat16)
    assert known == ((expect == "int8") if recorded else None)
    if recorded:  # the next load follows the recorded decision without measuring
        clear_cache()
        monkeypatch.setattr(int8, "decode_step_ms", lambda *a: pytest.fail("measured twice"))
        assert load_pair(draft=draft.ref, target=target.ref, dtype="bfloat16").draft_quant == \
            (_int8_draft() if expect == "int8" else expect)


def test_int8_auto_on_busy_machine_skips_measuring(tmp_path, monkeypatch, cache):
    if not int8.int8_available():
        pytest.skip("this torch has no dynamic int8 kernels")
    draft, target = gguf_pack(tmp_path, monkeypatch, seed=1), gguf_pack(tmp_path, monkeypatch, seed=2)
    monkeypatch.setattr(int8, "machine_busy", lambda: True)
    monkeypatch.setattr(int8, "decode_step_ms", lambda *a, **k: pytest.fail("measured on a busy machine"))
    pair = load_pair(draft=draft.ref, target=target.ref, dtype="bfloat16")
    assert pair.draft_quant == _int8_draft() and int8.known_int8_decision(draft.ref, torch.bfloat16) is None


def test_a_busy_first_start_serves_the_fallback_unmeasured_as_fast_as_a_warm_one(tmp_path, monkeypatch, cache):
    """No probe recorded and a busy CPU: the target runs as the probe's fallback at once, loaded as a known
    execution is (deferred packing where a server asks for it), without packing or timing anything first, and
    nothing is recorded, so that a quiet start measures."""
    if not int8.int8_available():
        pytest.skip("this torch has no dynamic int8 kernels")
    from specviz.hardware import choose, probe
    from specviz.hardware.machine import this_machine
    from specviz.models.int8_target import plain_matches, unpacked

    draft, target = gguf_pack(tmp_path, monkeypatch, seed=1), gguf_pack(tmp_path, monkeypatch, seed=2)
    timer, pack = probe.VerifyTimer.__init__, choose.pack_now
    monkeypatch.setattr(int8, "machine_busy", lambda: True)
    monkeypatch.setattr(probe.VerifyTimer, "__init__", lambda *a, **k: pytest.fail("timed on a busy machine"))
    monkeypatch.setattr(choose, "pack_now", lambda *a, **k: pytest.fail("packed to be timed on a busy machine"))
    pair = load_pair(draft=draft.ref, target=target.ref, defer_packing=True)
    fallback = probe.fallback(this_machine("cpu"))
    assert pair.target_exec == fallback and pair.probe is not None and not pair.probe.measured
    assert pair.probe.choice == fallback and not pair.probe.curves
    assert probe.known(this_machine("cpu"), target.ref, torch.bfloat16) is None  # a quiet start measures
    from specviz.models import kernels

    if plain_matches() and not kernels.int8_rows(built=True):  # deferred as a warm start's (onednn = fbgemm here)
        assert unpacked(pair.target)
    # (where specviz's kernel is built already, its form takes no packing: the linears have it at once)
    # ... and the next, quiet, start measures and records
    clear_cache()
    monkeypatch.setattr(int8, "machine_busy", lambda: False)
    monkeypatch.setattr(probe.VerifyTimer, "__init__", timer)
    monkeypatch.setattr(choose, "pack_now", pack)
    quiet = load_pair(draft=draft.ref, target=target.ref)
    assert quiet.probe is not None and quiet.probe.measured and quiet.probe.curves
    assert probe.known(this_machine("cpu"), target.ref, torch.bfloat16) is not None


def _linear_state(model: torch.nn.Module) -> dict:
    """name -> (int8 values, scale, bias) of every dynamic int8 linear."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

    out = {}
    for name, m in model.named_modules():
        if isinstance(m, DynamicQuantizedLinear):
            w, b = m._weight_bias()
            out[name] = (w.int_repr(), w.q_scale(), b)
    return out


def test_decode_step_timing_runs():
    pair = build_tiny_pair()
    ms = int8.decode_step_ms([pair.draft, pair.target], pair.vocab_size, context=8, steps=2)
    assert len(ms) == 2 and all(m > 0 for m in ms)


def test_int8_linear_matches_quantize_dynamic():
    if not int8.int8_available():
        pytest.skip("this torch has no dynamic int8 kernels")
    import warnings

    from torch.ao.quantization import quantize_dynamic

    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 48)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear}, dtype=torch.qint8)[0]
        mine = int8.int8_linear(lin)
    x = torch.randn(5, 64)
    assert torch.equal(ref(x), mine(x))


# --------------------------------------------------------------------------------------------------
# Custom pairs from local directories: tokenizer check, logits-width matching
# --------------------------------------------------------------------------------------------------


def _save_tiny(path: Path, vocab_size: int, seed: int, head_rows: int | None = None) -> str:
    pair = build_tiny_pair(vocab_size=vocab_size, seed=seed)
    model = pair.target
    if head_rows is not None:  # pad the head like Qwen2.5-7B does (152,064 rows for 151,665 tokens)
        model.resize_token_embeddings(head_rows)
    model.save_pretrained(str(path))
    pair.tokenizer.save_pretrained(str(path))
    return str(path)


def test_custom_pair_tokenizer_mismatch(tmp_path):
    a = _save_tiny(tmp_path / "a", 32, 0)
    b = _save_tiny(tmp_path / "b", 40, 1)
    with pytest.raises(ModelError, match="do not share a tokenizer"):
        load_pair(draft=a, target=b, dtype="float32")


def test_custom_pair_trims_padded_head(tmp_path):
    a = _save_tiny(tmp_path / "a", 32, 0)
    b = _save_tiny(tmp_path / "b", 32, 1, head_rows=48)
    pair = load_pair(draft=a, target=b, dtype="float32", draft_quant=None)
    assert pair.vocab_size == 32 and pair.preset == "custom"
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        assert pair.draft(ids).logits.shape[-1] == pair.target(ids).logits.shape[-1] == 32


def test_custom_pair_bad_path(tmp_path):
    with pytest.raises(ModelError) as err:
        load_pair(draft=str(tmp_path), target=str(tmp_path))
    assert "local path" in str(err.value) and "Traceback" not in str(err.value)


# --------------------------------------------------------------------------------------------------
# The real offline default pair (converts on first use: ~2-3 minutes once; then seconds). Not skipped.
# --------------------------------------------------------------------------------------------------


@pytest.mark.real_model
def test_real_offline_default_pair():
    t = time.perf_counter()
    pair = load_pair(DEFAULT_PRESET)
    print(f"\nloaded {pair.draft_name} -> {pair.target_name} in {time.perf_counter() - t:.1f} s "
          f"(draft_quant={pair.draft_quant}, cache {models.cache_dir()})")
    tok = pair.tokenizer
    assert pair.preset == DEFAULT_PRESET and pair.device.type in ("cpu", "cuda")
    assert pair.vocab_size == 151_936 and len(tok) == 151_936
    assert set(pair.eos_token_ids) >= {tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")}
    assert pair.context_length == 32_768

    # both models speak the same vocabulary: the draft's tokenizer (from its GGUF) is the target's
    from specviz.models import gguf_native

    with gguf_native.read(models.OFFLINE_PACKS["qwen2.5-coder-0.5b"]) as draft_file:
        draft_tok = gguf_native.tokenizer_of(draft_file.metadata, "draft")
    assert draft_tok.get_vocab() == tok.get_vocab()

    prompt = "def fibonacci(n):"
    plain = encode_prompt(pair, prompt, chat=False)
    chat = encode_prompt(pair, prompt)
    assert tok.decode(plain) == prompt
    assert tok.decode(chat).endswith("<|im_start|>assistant\n") and len(chat) > len(plain)

    ids = torch.tensor([plain], device=pair.device)
    with torch.inference_mode():
        assert pair.draft(ids).logits.shape[-1] == pair.target(ids).logits.shape[-1] == 151_936
        out = pair.target.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=pair.eos_token_ids,
                                   pad_token_id=tok.pad_token_id)
        draft_out = pair.draft.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=pair.eos_token_ids,
                                        pad_token_id=tok.pad_token_id)
    text = tok.decode(out[0, ids.shape[1]:])
    print(f"target continues {prompt!r} with {text!r}; draft with {tok.decode(draft_out[0, ids.shape[1]:])!r}")
    assert any(k in text for k in ("if", "return", "fib", '"""', "#")), text
    pieces = [token_text(tok, int(i)) for i in out[0, ids.shape[1]:]]
    assert "".join(pieces) == text  # pieces of ASCII code concatenate to the decoded text

    # byte-level pieces of a multi-byte character render as bytes, never raise; the Detokenizer
    # joins them into the characters
    emoji = tok.encode("🦜 日本", add_special_tokens=False)
    for i in emoji:
        assert isinstance(token_text(tok, i), str) and token_text(tok, i)
    assert any(token_text(tok, i).startswith("\\x") for i in emoji)  # at least one split character
    detok = Detokenizer(tok)
    assert "".join(detok.push(i) for i in emoji) == "🦜 日本"
    assert token_text(tok, tok.convert_tokens_to_ids("Ġfib")) == " fib"


def test_the_output_head_gets_its_input_with_canonical_strides():
    """logits_to_keep=1 over several tokens hands the head hidden[:, -1:, :], whose batch stride is the
    whole tensor's; PyTorch's CPU bf16 linear leaves its fast kernel on such a view (seconds instead of
    milliseconds for a 151,936-row head), so every loaded model's head gets a canonical copy: same values."""
    import torch

    from specviz.models import resolve_preset
    from specviz.models.loading import canonical_head_input, load_pair

    pair = load_pair(resolve_preset("tiny"))
    model = pair.target
    head = model.get_output_embeddings()
    seen = []
    hook = head.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))  # runs after ours
    try:
        ids = torch.tensor([[3, 5, 7, 9, 11, 13]])
        with torch.inference_mode():
            kept = model(input_ids=ids, logits_to_keep=1).logits[0, -1]
            full = model(input_ids=ids).logits[0, -1]
    finally:
        hook.remove()
    x = seen[0]
    assert x.shape[-2] == 1 and x.stride() == torch.empty(x.shape).stride()  # canonical, not (6·H, H, 1)
    assert torch.allclose(kept, full, atol=1e-5)
    canonical_head_input(model)  # idempotent: one hook per head
    assert sum(1 for h in head._forward_pre_hooks.values()) == 1


def test_a_packs_tokenizer_from_its_gguf_is_transformers_gguf_tokenizer(tmp_path, monkeypatch, cache):
    """The tokenizer built from a pack's GGUF vocabulary and merges (models.gguf_tokenizer) is the one transformers'
    own GGUF loading converts: the same ids, texts, special tokens and chat template."""
    from transformers import AutoTokenizer, TokenizersBackend

    from tests.same_tokenizer import assert_same_tokenizer

    draft, target = gguf_pack(tmp_path, monkeypatch, seed=1), gguf_pack(tmp_path, monkeypatch, seed=2)
    pair = load_pair(draft=draft.ref, target=target.ref, draft_quant="int8", target_exec="int8")
    assert type(pair.tokenizer) is TokenizersBackend
    gguf_dir = tmp_path / "direct"
    gguf_dir.mkdir()
    (gguf_dir / "m.gguf").write_bytes(b"".join(part_file(target, i).read_bytes() for i in (1, 2, 3)))
    assert_same_tokenizer(AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file="m.gguf"), pair.tokenizer)


def test_an_int8_pairs_prompt_heads_are_kept_on_disk_and_the_next_load_reads_them(tmp_path, monkeypatch, cache):
    """A load gives both int8 models' lean steps a store beside their int8 weights (models.prefix_store): the
    chat template head, once computed, is read by the next load's steps instead of fed -- the same bits -- and
    the stored heads never make the int8 caches look stale (they live in a folder of their own)."""
    from specviz.models import compiled

    draft, target = gguf_pack(tmp_path, monkeypatch, seed=1), gguf_pack(tmp_path, monkeypatch, seed=2)
    kwargs = dict(draft=draft.ref, target=target.ref, draft_quant="int8", target_exec="int8")
    first = load_pair(**kwargs)
    head = tuple(encode_prompt(first, "def fib(n):")[:8])  # the tiny tokenizer's template has no fixed head
    kept = {}
    for role, model in (("draft", first.draft), ("target", first.target)):
        steps = compiled.steps_of(model)
        assert steps.prefix_store is not None and steps.prefix_store.identity
        assert steps.keep_prefix(head)
        assert steps.prefix_store.path(head).is_file() and steps.prefix_store.folder.name == "heads"
        kept[role] = steps._prefix_kv[head]
    clear_cache()
    second = load_pair(**kwargs)
    for role, model in (("draft", second.draft), ("target", second.target)):
        steps = compiled.steps_of(model)
        assert not steps._prefix_kv
        body = steps._body
        steps._body = lambda *a, **k: pytest.fail("the head was fed again")
        try:
            assert steps.keep_prefix(head)
        finally:
            steps._body = body
        read = steps._prefix_kv[head]
        assert all(torch.equal(a, b) for a, b in zip(kept[role][0] + kept[role][1], read[0] + read[1]))


def test_an_int8_pair_runs_from_its_ggufs_and_builds_transformers_model_only_when_called(tmp_path, monkeypatch, cache):
    """Two offline packs on a CPU where the kernel runs: the int8 pair is built on its GGUFs' blocks (models.gguf_native,
    nothing written to the cache) without transformers' modelling code; greedy speculative decoding gives standard
    decoding's text, chains and trees; whatever calls a model itself (a forward, generate, transformers' assisted
    generation) gets transformers' model around the same modules; the head's fingerprint is the loaded model's."""
    from specviz.core.engine import standard_decode
    from specviz.core.settings import DecodeSettings
    from specviz.models import bare, q4k
    from specviz.speculator.model import head_fingerprint
    from tests.drafted import speculative_decode

    if not q4k.expected():
        pytest.skip("specviz's kernel does not run on this CPU: the pair loads with transformers")
    draft, target = gguf_pack(tmp_path, monkeypatch, seed=1), gguf_pack(tmp_path, monkeypatch, seed=2)
    native = load_pair(draft=draft.ref, target=target.ref, draft_quant="int8", target_exec="int8")
    loaded = load_pair(draft=draft.ref, target=target.ref, draft_quant=None, target_exec="bf16")
    assert isinstance(native.target, bare.BareCausalLM) and isinstance(native.draft, bare.BareCausalLM)
    assert native.target_weights == "gguf" and q4k.in_use(native.target) and q4k.in_use(native.draft)
    assert not native.target.built and not native.draft.built
    assert head_fingerprint(native.target) == head_fingerprint(loaded.target)
    assert not (cache / "models").exists() and not list(cache.rglob("*.safetensors"))
    prompt = encode_prompt(native, "def fib(n):")
    settings = DecodeSettings(gamma=3, max_new_tokens=12, temperature=0.0)
    ids_of = lambda trace: [t.id for t in trace.tokens]  # noqa: E731
    spec, std = ids_of(speculative_decode(native, prompt, settings)), ids_of(standard_decode(native, prompt, settings))
    assert spec == std and len(std) >= 4
    assert not native.target.built and not native.draft.built  # every chain ran on the lean path
    tree = DecodeSettings(drafter="tree", gamma=3, max_new_tokens=8, temperature=0.0)
    assert ids_of(speculative_decode(native, prompt, tree)) == std[:8]
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        assert native.target(ids).logits.shape == loaded.target(ids).logits.shape
    assert native.target.full().model.layers[0].self_attn.o_proj is native.target.model.layers[0].self_attn.o_proj
    out = native.target.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)  # delegated
    assert out.shape == (1, len(prompt) + 3)
    from specviz.cli.bench_hf import hf_generate

    for mode in ("hf_plain", "hf_same"):
        new, _ = hf_generate(native, prompt, settings, mode)
        assert len(new) >= 4


