"""A GGUF file read directly: its metadata and its tensors' bytes, mapped, in well under a second.

``gguf.GGUFReader`` builds a numpy view for every item of every metadata array -- 151,936 tokens and 151,387
merges in Qwen2.5's -- which took ~10 s on a 2-core CPU, and transformers read the file that way twice per
model.  This reader parses the header with :mod:`struct` over the mapped bytes (string arrays in one pass) and
hands each tensor out as a numpy view of its stored bytes (no copy): what :mod:`.gguf_convert` needs to write
a pack's cache, and what the Q4_K / Q6_K records are cut from (:mod:`.q4k`).

Format (GGUF v2/v3, little-endian): magic, version, tensor count, metadata count; the metadata as (key, type,
value); each tensor's name, dims (innermost first), ggml type and offset; the data, aligned to
``general.alignment`` (32 by default).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# metadata value types
_U8, _I8, _U16, _I16, _U32, _I32, _F32, _BOOL, _STR, _ARR, _U64, _I64, _F64 = range(13)
_SCALAR = {_U8: "<B", _I8: "<b", _U16: "<H", _I16: "<h", _U32: "<I", _I32: "<i", _F32: "<f", _BOOL: "<?",
           _U64: "<Q", _I64: "<q", _F64: "<d"}
_NUMPY = {_U8: np.uint8, _I8: np.int8, _U16: np.uint16, _I16: np.int16, _U32: np.uint32, _I32: np.int32,
          _F32: np.float32, _BOOL: np.bool_, _U64: np.uint64, _I64: np.int64, _F64: np.float64}

# ggml tensor types: (values per block, bytes per block)
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K = 0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15
BF16 = 30
BLOCKS = {F32: (1, 4), F16: (1, 2), BF16: (1, 2), Q4_0: (32, 18), Q4_1: (32, 20), Q5_0: (32, 22), Q5_1: (32, 24),
          Q8_0: (32, 34), Q8_1: (32, 36), Q2_K: (256, 84), Q3_K: (256, 110), Q4_K: (256, 144), Q5_K: (256, 176),
          Q6_K: (256, 210), Q8_K: (256, 292)}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # torch's order: outermost first ([rows, row length] for a matrix)
    ggml_type: int
    offset: int  # from the start of the file
    nbytes: int


class GGUFFile:
    """The metadata (``.metadata``: key -> value; arrays of strings as lists of str, numeric ones as numpy) and
    the tensors (``.tensors``: name -> :class:`TensorInfo`; :meth:`raw`: their bytes) of a GGUF file, mapped."""

    def __init__(self, path: str | Path, data: bytes | bytearray | None = None, parts: list[Any] | None = None):
        """The file at ``path``, mapped; or, given ``data``, the file's bytes held in memory; or, given ``parts``,
        the file split in consecutive buffers (e.g. mapped part files: nothing copied but the few tensors that
        straddle two parts; the header must lie in the first).  ``path`` names it."""
        self.path = Path(path)
        self._parts: list[tuple[int, Any]] = []  # (offset of the part in the file, the part)
        if parts:
            start = 0
            for part in parts:
                self._parts.append((start, part))
                start += len(part)
            data = parts[0]
        if data is None:
            with open(self.path, "rb") as fh:
                self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        else:
            self._map = data
        self._buf = memoryview(self._map)
        self.metadata: dict[str, Any] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self._parse()

    # -- parsing ---------------------------------------------------------------------------------------------

    def _parse(self) -> None:
        buf = self._buf
        if bytes(buf[:4]) != b"GGUF":
            raise ValueError(f"{self.path} is not a GGUF file")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version < 2:
            raise ValueError(f"GGUF version {version} of {self.path} is not supported (2 or 3)")
        pos = 24
        for _ in range(n_kv):
            key, pos = self._string(pos)
            (vtype,), pos = struct.unpack_from("<I", buf, pos), pos + 4
            self.metadata[key], pos = self._value(vtype, pos)
        infos = []
        for _ in range(n_tensors):
            name, pos = self._string(pos)
            (ndim,) = struct.unpack_from("<I", buf, pos)
            dims = struct.unpack_from(f"<{ndim}Q", buf, pos + 4)
            ggml_type, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * ndim)
            pos += 4 + 8 * ndim + 12
            infos.append((name, dims, ggml_type, offset))
        align = int(self.metadata.get("general.alignment", 32))
        data = pos + (-pos % align)
        for name, dims, ggml_type, offset in infos:
            if ggml_type not in BLOCKS:
                raise ValueError(f"{self.path}: tensor {name} has ggml type {ggml_type}, which is not supported")
            per, size = BLOCKS[ggml_type]
            count = int(np.prod(dims, dtype=np.int64))
            self.tensors[name] = TensorInfo(name, tuple(int(d) for d in reversed(dims)), ggml_type, data + offset,
                                            count // per * size)

    def _string(self, pos: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", self._buf, pos)
        return str(self._buf[pos + 8:pos + 8 + n], "utf-8"), pos + 8 + n

    def _value(self, vtype: int, pos: int) -> tuple[Any, int]:
        buf = self._buf
        if vtype in _SCALAR:
            fmt = _SCALAR[vtype]
            return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
        if vtype == _STR:
            return self._string(pos)
        if vtype != _ARR:
            raise ValueError(f"{self.path}: unknown metadata type {vtype}")
        itype, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if itype in _NUMPY:
            arr = np.frombuffer(buf, dtype=_NUMPY[itype], count=count, offset=pos).copy()
            return arr, pos + arr.nbytes
        if itype == _STR:
            out, raw = [], self._map
            unpack = struct.Struct("<Q").unpack_from
            for _ in range(count):
                (n,) = unpack(raw, pos)
                out.append(raw[pos + 8:pos + 8 + n].decode("utf-8"))
                pos += 8 + n
            return out, pos
        items = []
        for _ in range(count):
            item, pos = self._value(itype, pos)
            items.append(item)
        return items, pos

    # -- tensors ---------------------------------------------------------------------------------------------

    def raw(self, name: str, rows: int | None = None, first: int = 0) -> np.ndarray:
        """The stored bytes of tensor ``name`` as uint8 [rows, bytes a row] (a view of the mapped file); ``rows``:
        only that many, from row ``first`` (a tensor across two parts is copied: a few rows at a time, little)."""
        info = self.tensors[name]
        total = int(np.prod(info.shape[:-1], dtype=np.int64)) if len(info.shape) > 1 else 1
        rows = total - first if rows is None else max(0, min(rows, total - first))
        row_bytes = info.nbytes // total
        start, nbytes = info.offset + first * row_bytes, row_bytes * rows
        if not self._parts:
            return np.frombuffer(self._buf, dtype=np.uint8, count=nbytes, offset=start).reshape(rows, -1)
        pieces, pos, end = [], start, start + nbytes
        for start, part in self._parts:
            if start <= pos < start + len(part):
                take = min(end, start + len(part)) - pos
                pieces.append(np.frombuffer(part, dtype=np.uint8, count=take, offset=pos - start))
                pos += take
                if pos == end:
                    break
        if pos != end:
            raise ValueError(f"{self.path}: tensor {name} runs past the end of the file")
        if not pieces:
            return np.zeros((0, row_bytes), dtype=np.uint8)
        joined = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)  # (a tensor across two parts: copied)
        return joined.reshape(rows, -1)

    def release(self, name: str) -> None:
        """Tensor ``name``'s pages out of this process's resident memory (read; they stay in the OS's cache)."""
        from .packs import release

        info = self.tensors[name]
        for start, part in self._parts or [(0, self._map)]:
            lo, hi = max(info.offset, start), min(info.offset + info.nbytes, start + len(part))
            if lo < hi:
                release(part, lo - start, hi - lo)

    def close(self) -> None:
        """Unmap the file, unless a view of it is still held (then the mapping goes with the last view)."""
        try:
            self._buf.release()
            for part in [self._map] + [p for _, p in self._parts]:
                if isinstance(part, mmap.mmap) and not part.closed:
                    part.close()
        except BufferError:
            pass

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
