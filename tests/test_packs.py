"""An offline pack's files: read into memory or mapped in parts, each checked as reassembling it does; a file
mapped in parts reads as the whole file."""

from __future__ import annotations

import os

import numpy as np
import pytest

from specviz.models import ModelError, packs
from tests.test_models import make_pack, part_file  # noqa: F401  (fixtures)


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
