"""A first start (issue 55): a ready pair, read from the GGUFs into memory, serves while the prepared pair is made.

On fake offline packs (real tiny Qwen2 GGUFs, tests/test_models.py): the ready pair's weights are the converted
cache's, to the bit, and it computes what the converted pair computes in bf16; reading a pack into memory
checks it as reassembling it does.  The server's side (specviz.serving.first_start): the ready pair serves,
its races are flagged, it is let go once the models are converted (before the prepared pair loads: never both
in memory), and its target's dtype follows the memory available.
"""

from __future__ import annotations

import os
import threading

import pytest
import torch

from specviz.models import DEFAULT_PRESET, PRESETS, TINY_PRESET, ModelError, convert, load_pair, packs, warm
from specviz.models.first_start import ready_pair, run_dtype, wanted
from specviz.serving import first_start as server_start
from tests.test_models import cache, gguf_pack, make_pack, part_file  # noqa: F401  (fixtures)


def test_a_pack_read_into_memory_is_the_reassembled_file_and_is_checked(tmp_path, monkeypatch):
    data = os.urandom(50_000)
    pack = make_pack(tmp_path, monkeypatch, data, n_parts=4)
    assert bytes(packs.read(pack)) == data == packs.reassemble(pack, tmp_path / "x.gguf").read_bytes()
    p = part_file(pack, 3)
    raw = bytearray(p.read_bytes())
    raw[7] ^= 0x01
    p.write_bytes(bytes(raw))
    with pytest.raises(ModelError, match="corrupt.*sha256"):
        packs.read(pack)
    p.write_bytes(bytes(raw) + b"xx")
    with pytest.raises(ModelError, match="more than"):
        packs.read(pack)


def test_the_ready_pair_is_the_converted_pair_in_memory(tmp_path, monkeypatch, cache):
    draft, target = gguf_pack(tmp_path, monkeypatch, seed=1, tied=True), gguf_pack(tmp_path, monkeypatch, seed=2)
    assert wanted(draft.ref, target.ref, torch.device("cpu"))
    assert not wanted(draft.ref, target.ref, torch.device("meta")) and not wanted("tiny:a", target.ref, torch.device("cpu"))
    ready = ready_pair("custom", draft.ref, target.ref)
    assert not list(cache.rglob("*.gguf")) and not convert.pack_dir(target).exists()  # nothing written
    execution = {torch.bfloat16: "bf16", torch.float32: "fp32"}[run_dtype()]
    assert ready.target_exec == execution and ready.dtype == torch.bfloat16 and ready.draft_quant is None
    assert next(ready.target.parameters()).dtype == run_dtype() and next(ready.draft.parameters()).dtype == torch.bfloat16

    # the converted pair in the same execution: fp32 holds the bf16 cache's values (and so do the ready models)
    converted = load_pair(draft=draft.ref, target=target.ref, draft_quant=None, target_exec=execution)
    for model in (ready.draft, ready.target):
        assert all(torch.equal(p, p.to(torch.bfloat16).to(p.dtype)) for p in model.parameters())
    assert not wanted(draft.ref, target.ref, torch.device("cpu"))  # converted now: the load itself is quick
    for mine, theirs in ((ready.draft, converted.draft), (ready.target, converted.target)):
        a, b = mine.state_dict(), theirs.state_dict()
        assert a.keys() == b.keys()
        for name in a:
            assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
        assert mine.config.tie_word_embeddings == theirs.config.tie_word_embeddings
    assert ready.draft.config.tie_word_embeddings and not ready.target.config.tie_word_embeddings
    assert (ready.vocab_size, ready.context_length, sorted(ready.eos_token_ids)) == \
        (converted.vocab_size, converted.context_length, sorted(converted.eos_token_ids))
    text = "def f(x):\n    return <|im_end|> naïve"
    assert ready.tokenizer.encode(text) == converted.tokenizer.encode(text)
    ids = torch.tensor([converted.tokenizer.encode("def f")])
    with torch.no_grad():
        assert torch.equal(ready.target(ids).logits, converted.target(ids).logits)


@pytest.fixture
def fresh_server_state(monkeypatch):
    monkeypatch.setattr(server_start, "_READY", [])
    monkeypatch.setattr(server_start, "_THREADS", [])
    monkeypatch.setattr(server_start, "_SERVED", threading.Event())
    monkeypatch.delenv("SPECVIZ_READY", raising=False)


def _fake_ready(monkeypatch, pair):
    from specviz.models import first_start

    monkeypatch.setattr(first_start, "wanted", lambda *a: True)
    monkeypatch.setattr(first_start, "ready_pair", lambda *a, **k: pair)
    monkeypatch.setattr(first_start, "build_kernel", lambda: None)
    monkeypatch.setattr(server_start, "available_bytes", lambda: 64 * 10**9)  # not this machine's memory
    converted = []
    monkeypatch.setattr(first_start, "convert_packs", lambda *refs: converted.append(refs))
    return converted


def test_the_ready_pair_serves_flagged_until_the_models_are_converted(monkeypatch, fresh_server_state):
    ready = load_pair(TINY_PRESET)
    converted = _fake_ready(monkeypatch, ready)
    go, loading = threading.Event(), threading.Event()
    from specviz.models import first_start

    monkeypatch.setattr(first_start, "convert_packs", lambda *refs: (go.wait(30), converted.append(refs)))

    def load_full():
        loading.set()
        return type("P", (), {"target_exec": "int8"})()

    assert server_start.begin({"preset": DEFAULT_PRESET}, "auto", load_full) is ready
    assert server_start.serving() is ready and warm.preparing(ready)  # its races say the server was preparing
    assert "read straight from their GGUF files" in server_start.words(ready) and not server_start.words(object())
    assert server_start.begin({"preset": DEFAULT_PRESET}, "auto", load_full) is ready  # once
    assert not loading.is_set()
    server_start.ran(object())  # another pair's run: still waiting for the first
    assert not server_start._SERVED.is_set()
    # the ready pair's first race: its timings say why they are not quoted, and its end lets the conversion begin
    from specviz.core.settings import DecodeSettings
    from specviz.serving.service import race, tokenize

    spec = list(race(tokenize(ready, "hello", DecodeSettings.checked(max_new_tokens=6))))[-1].spec
    assert spec.timing.reliable is False and "read straight from their GGUF files" in spec.timing.why
    from specviz.views.race import noise_sentence

    said = noise_sentence(spec.timing, 0.5, 1.0, 2.0)  # the page: still starting, not "busy"; come back soon
    assert "the server was still starting" in said and "once the server is ready" in said and "busy" not in said
    assert server_start._SERVED.is_set()
    go.set()  # converted: the ready pair goes, then the prepared pair loads (never both in memory)
    assert server_start.wait(30) and loading.is_set()
    assert server_start.serving() is None and not warm.preparing(ready)
    assert converted == [(PRESETS[DEFAULT_PRESET].draft, PRESETS[DEFAULT_PRESET].target)]


def test_a_failed_prepared_load_is_logged_and_the_next_run_loads(monkeypatch, fresh_server_state, caplog):
    ready = load_pair(TINY_PRESET)
    _fake_ready(monkeypatch, ready)

    def load_full():
        raise ModelError("disk full")

    monkeypatch.setattr(server_start, "FIRST_RUN_WAIT_S", 0.1)  # no run comes: the background work begins anyway
    assert server_start.begin({"preset": DEFAULT_PRESET}, "auto", load_full) is ready
    assert server_start.wait(30)
    assert server_start.serving() is None and not warm.preparing(ready)
    assert "could not be made: disk full" in caplog.text


def test_the_ready_target_dtype_follows_the_memory(monkeypatch):
    from specviz.models import first_start, kernels

    params = (0.49, 1.54)
    monkeypatch.setattr(kernels, "_cpu_flags", lambda: {"avx2"})  # no native bf16: fp32 where it fits
    assert first_start.run_dtype(24 * 10**9, params) == torch.float32
    assert first_start.run_dtype(13 * 10**9, params) == torch.bfloat16  # (fp32 needs 15.2 GB, bf16 12.1)
    assert first_start.run_dtype(6 * 10**9, params) is None
    monkeypatch.setattr(kernels, "_cpu_flags", lambda: {"avx2", "avx512_bf16"})
    assert first_start.run_dtype(24 * 10**9, params) == torch.bfloat16


def test_no_ready_pair_where_it_cannot_stand_in(monkeypatch, fresh_server_state):
    from specviz.models import first_start

    monkeypatch.setattr(first_start, "ready_pair", lambda *a, **k: pytest.fail("made a ready pair"))
    monkeypatch.setattr(first_start, "wanted", lambda *a: False)  # converted already, or not offline packs
    assert server_start.begin({"preset": DEFAULT_PRESET}, "auto", lambda: pytest.fail("loaded")) is None
    monkeypatch.setattr(first_start, "wanted", lambda *a: True)
    monkeypatch.setattr(server_start, "available_bytes", lambda: 9 * 10**9)  # too little beside the conversion
    assert server_start.begin({"preset": DEFAULT_PRESET}, "auto", lambda: pytest.fail("loaded")) is None
    monkeypatch.setattr(server_start, "available_bytes", lambda: 64 * 10**9)
    monkeypatch.setenv("SPECVIZ_READY", "0")
    assert server_start.begin({"preset": DEFAULT_PRESET}, "auto", lambda: pytest.fail("loaded")) is None
    assert server_start.serving() is None and not server_start._THREADS
