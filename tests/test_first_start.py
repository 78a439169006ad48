"""A first start (issue 55): a ready pair, read from the GGUFs into memory, serves while the prepared pair is made.

On fake offline packs (real tiny Qwen2 GGUFs, tests/test_models.py): the ready pair's weights are the converted
cache's, to the bit, and it computes what the converted pair computes (in bf16 to the bit; in float32 to
float32's rounding: specviz.models.upcast); reading or mapping a pack checks it as reassembling it does, and a
file mapped in parts reads as the whole file.  The server's side (specviz.serving.first_start): the ready pair serves,
its races are flagged, it is let go once the models are converted (before the prepared pair loads: never both
in memory), and its target's dtype follows the memory available.
"""

from __future__ import annotations

import copy
import os
import threading

import numpy as np
import pytest
import torch

from specviz.models import DEFAULT_PRESET, PRESETS, TINY_PRESET, ModelError, convert, load_pair, packs, warm
from specviz.models import first_start
from specviz.models.first_start import ready_pair, wanted
from specviz.serving import first_start as server_start
from tests.test_models import cache, gguf_pack, make_pack, part_file  # noqa: F401  (fixtures)


def _flip_a_bit(pack, part: int, at: int):
    """Damage part ``part`` of ``pack`` at byte ``at``: (its path, its bytes now)."""
    p = part_file(pack, part)
    raw = bytearray(p.read_bytes())
    raw[at] ^= 0x01
    p.write_bytes(bytes(raw))
    return p, bytes(raw)


def test_a_pack_read_into_memory_is_the_reassembled_file_and_is_checked(tmp_path, monkeypatch):
    data = os.urandom(50_000)
    pack = make_pack(tmp_path, monkeypatch, data, n_parts=4)
    assert bytes(packs.read(pack)) == data == packs.reassemble(pack, tmp_path / "x.gguf").read_bytes()
    p, raw = _flip_a_bit(pack, 3, 7)
    with pytest.raises(ModelError, match="corrupt.*sha256"):
        packs.read(pack)
    p.write_bytes(raw + b"xx")
    with pytest.raises(ModelError, match="more than"):
        packs.read(pack)


def _with_values(monkeypatch, pack):
    """``pack`` knowing its numbers (as the shipped packs do): the ready pair's memory is then one arena."""
    import dataclasses

    from specviz.models import OFFLINE_PACKS
    from specviz.models.gguf_file import GGUFFile

    with GGUFFile("x.gguf", packs.read(pack)) as gguf:
        values = sum(int(torch.Size(info.shape).numel()) for info in gguf.tensors.values())
    pack = dataclasses.replace(pack, values=values)
    monkeypatch.setitem(OFFLINE_PACKS, pack.key, pack)
    return pack


@pytest.mark.parametrize("run", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_ready_pair_is_the_converted_pair_in_memory(tmp_path, monkeypatch, cache, run):
    draft, target = gguf_pack(tmp_path, monkeypatch, seed=1, tied=True), gguf_pack(tmp_path, monkeypatch, seed=2)
    draft, target = _with_values(monkeypatch, draft), _with_values(monkeypatch, target)
    assert wanted(draft.ref, target.ref, torch.device("cpu"))
    assert not wanted(draft.ref, target.ref, torch.device("meta")) and not wanted("tiny:a", target.ref, torch.device("cpu"))
    first_start.reserve(draft.ref, target.ref, run)  # (as a server's start does: the memory asked for early)
    assert first_start.reserved() == run == first_start.reserved(draft.ref, target.ref)
    assert first_start.reserved(target.ref, draft.ref) is None  # another pair's reservation is not this one's
    ready = ready_pair("custom", draft.ref, target.ref, run=run)
    assert first_start.reserved() is None  # taken
    assert not list(cache.rglob("*.gguf")) and not convert.pack_dir(target).exists()  # nothing written
    execution = {torch.bfloat16: "bf16", torch.float32: "fp32"}[run]
    assert ready.target_exec == execution and ready.dtype == run and ready.draft_quant is None
    for model in (ready.draft, ready.target):  # the weights stay bf16; in fp32 the norms and biases are widened
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        assert linears and all(m.weight.dtype == torch.bfloat16 for m in linears)
        assert all(p.dtype == torch.bfloat16 for n, p in model.named_parameters() if "norm" in n) == (run == torch.bfloat16)

    # the converted pair in the same execution: fp32 holds the bf16 cache's values (and so do the ready models)
    converted = load_pair(draft=draft.ref, target=target.ref, draft_quant=None, target_exec=execution)
    assert not wanted(draft.ref, target.ref, torch.device("cpu"))  # converted now: the load itself is quick
    for mine, theirs in ((ready.draft, converted.draft), (ready.target, converted.target)):
        a, b = mine.state_dict(), theirs.state_dict()
        assert a.keys() == b.keys()
        for name in a:
            assert torch.equal(a[name].float(), b[name].float()), name
        assert mine.config.tie_word_embeddings == theirs.config.tie_word_embeddings
    assert ready.draft.config.tie_word_embeddings and not ready.target.config.tie_word_embeddings
    assert (ready.vocab_size, ready.context_length, sorted(ready.eos_token_ids)) == \
        (converted.vocab_size, converted.context_length, sorted(converted.eos_token_ids))
    text = "def f(x):\n    return <|im_end|> naïve"
    assert ready.tokenizer.encode(text) == converted.tokenizer.encode(text)
    ids = torch.tensor([converted.tokenizer.encode("def f(x): return x * 2")])
    with torch.no_grad():
        # (the converted pair's draft runs bf16 in every target execution: in float32 it is that model widened)
        draft = converted.draft if run == torch.bfloat16 else copy.deepcopy(converted.draft).float()
        for mine, theirs in ((ready.draft, draft), (ready.target, converted.target)):
            got, want = mine(ids).logits, theirs(ids).logits
            assert got.dtype == want.dtype == run
            if run == torch.bfloat16:
                assert torch.equal(got, want)
            else:  # float32 sums in another order (block by block): float32's rounding apart, the same argmax
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
                assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_a_pack_mapped_in_parts_reads_as_the_whole_file(tmp_path, monkeypatch):
    """Mapped part files (no copy) give every tensor's bytes as the reassembled file does, tensors across two
    parts included, and are checked as reading is; a header past the first part is refused (the caller reads)."""
    import struct

    from specviz.models.gguf_file import GGUFFile
    from tests.test_models import write_tiny_gguf

    path = tmp_path / "t.gguf"
    write_tiny_gguf(path, seed=3)
    data = path.read_bytes()
    whole = GGUFFile(path)
    infos = sorted(whole.tensors.values(), key=lambda info: info.offset)
    first = infos[0].offset  # the header's end
    middles = [info.offset + info.nbytes // 2 for info in infos[1:4]]
    cuts = [first + 1, middles[0], middles[0] + 1, *middles[1:]]  # inside tensors, one a byte long
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
    split = GGUFFile(path, parts=pieces)
    assert split.metadata.keys() == whole.metadata.keys()
    straddling = 0
    for name, info in whole.tensors.items():
        assert split.tensors[name] == info
        assert np.array_equal(split.raw(name), whole.raw(name)), name
        straddling += any(info.offset < c < info.offset + info.nbytes for c in cuts)
    assert straddling == 4
    with pytest.raises((struct.error, IndexError, ValueError, UnicodeDecodeError)):
        GGUFFile(path, parts=[data[:first // 2], data[first // 2:]])
    pack = make_pack(tmp_path, monkeypatch, data, n_parts=3)
    maps = packs.mapped(pack)
    assert b"".join(bytes(m) for m in maps) == data
    for m in maps:
        m.close()
    _flip_a_bit(pack, 2, 3)
    with pytest.raises(ModelError, match="corrupt.*sha256"):
        packs.mapped(pack)


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
    assert "the server was still starting: this race ran on the models read straight" in said
    assert "had just started" not in said  # said once, not twice
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


def test_the_ready_pair_computes_in_fp32_without_native_bf16_where_the_memory_holds_it(monkeypatch):
    from specviz.models import kernels

    values = first_start.values_b(PRESETS[DEFAULT_PRESET].draft, PRESETS[DEFAULT_PRESET].target)
    assert values == (0.630167424, 1.777088)  # what the shipped files hold
    monkeypatch.setattr(kernels, "_cpu_flags", lambda: {"avx2"})  # no native bf16: fp32 (on bf16 weights)
    assert first_start.run_dtype(24 * 10**9, values) == torch.float32
    assert first_start.run_dtype(14 * 10**9, values) == torch.float32  # (needs 13.4 GB: a 16 GB Space has it)
    assert first_start.run_dtype(12 * 10**9, values) is None
    monkeypatch.setattr(kernels, "_cpu_flags", lambda: {"avx2", "avx512_bf16"})
    assert first_start.run_dtype(24 * 10**9, values) == torch.bfloat16


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


def test_a_server_start_reserves_the_ready_pairs_memory_only_where_one_comes(monkeypatch):
    """app.py's first step: the default pair's memory asked for at once where a ready pair will be made (offline
    packs installed, not converted yet, a CPU, room for it), and let go where the preload does not take it."""
    from specviz.models import first_start as models_start

    monkeypatch.setattr(models_start, "_RESERVED", [])
    monkeypatch.setattr(models_start, "Arena", lambda nbytes, label: type("A", (), {"nbytes": nbytes, "close": lambda s: None})())
    monkeypatch.setattr(server_start, "available_bytes", lambda: 64 * 10**9)
    monkeypatch.setattr(models_start, "wanted", lambda *a: True)
    monkeypatch.delenv("SPECVIZ_READY", raising=False)
    monkeypatch.setattr(packs, "part_paths", lambda pack: [])  # (installed)
    server_start.reserve_default()
    run = models_start.reserved()
    assert run in (torch.float32, torch.bfloat16)
    assert models_start._RESERVED[0][1].nbytes >= 2 * (630_167_424 + 1_777_088_000)
    server_start.release()
    assert models_start.reserved() is None
    monkeypatch.setattr(server_start, "available_bytes", lambda: 8 * 10**9)  # no room: nothing asked for
    server_start.reserve_default()
    assert models_start.reserved() is None
    monkeypatch.setattr(server_start, "available_bytes", lambda: 64 * 10**9)
    monkeypatch.setattr(models_start, "wanted", lambda *a: False)  # converted already: nothing
    server_start.reserve_default()
    assert models_start.reserved() is None
    monkeypatch.setattr(models_start, "wanted", lambda *a: True)
    monkeypatch.setattr(packs, "part_paths", lambda pack: (_ for _ in ()).throw(ModelError("not installed")))
    server_start.reserve_default()
    assert models_start.reserved() is None
    monkeypatch.setattr(packs, "part_paths", lambda pack: [])
    monkeypatch.setenv("SPECVIZ_READY", "0")
    server_start.reserve_default()
    assert models_start.reserved() is None
