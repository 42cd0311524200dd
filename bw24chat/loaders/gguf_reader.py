"""A GGUF reader that trusts nothing in the file (format: ggml docs/gguf.md, versions 2 and 3).

The file is memory-mapped; every count and length it declares is checked against the bytes
that are left before anything is read or allocated, so a hostile header ends in a
:class:`ModelFileError` at once instead of a huge allocation, a long loop or a reshape error.
Tensor data stays in the map: ``TensorInfo.data`` is a read-only view, laid out as
``gguf.GGUFReader`` lays it out (numpy axis order; F32/F16/I* in their dtype, everything else
as uint8 with the last axis in bytes), which the loaders and backends expect.

Layout (little-endian): "GGUF", u32 version, u64 tensor_count, u64 kv_count, kv pairs
(gguf_string key, u32 type, value), tensor infos (gguf_string name, u32 n_dims, u64 ne[n_dims],
u32 ggml type, u64 offset), padding to ``general.alignment`` (default 32), tensor data.
A gguf_string is a u64 byte length and UTF-8 bytes, no terminator.
"""
from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from .errors import ModelFileError

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_TENSOR_NAME = 64  # GGML_MAX_NAME; the spec caps tensor names at 64 bytes
MAX_NESTING = 8  # arrays of arrays: deeper than any real file, shallow enough for the stack

# GGUF metadata value types: (struct code, numpy dtype) for the fixed-size ones
_SCALARS = {
    0: ("<B", "<u1"), 1: ("<b", "<i1"), 2: ("<H", "<u2"), 3: ("<h", "<i2"), 4: ("<I", "<u4"), 5: ("<i", "<i4"),
    6: ("<f", "<f4"), 7: ("<?", "<u1"), 10: ("<Q", "<u8"), 11: ("<q", "<i8"), 12: ("<d", "<f8"),
}
STRING, ARRAY = 8, 9
_MIN_VALUE_BYTES = {STRING: 8, ARRAY: 12}  # the length/count prefixes of an empty one

# ggml types NumPy holds in their own dtype (gguf.GGUFReader does the same)
_NATIVE = {T.F32: np.float32, T.F16: np.float16, T.F64: np.float64, T.I8: np.int8, T.I16: np.int16,
           T.I32: np.int32, T.I64: np.int64}


@dataclass
class TensorInfo:
    name: str
    ggml_type: T
    ne: tuple[int, ...]  # ggml order: innermost (contiguous) dimension first
    offset: int  # absolute byte offset in the file
    nbytes: int
    data: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        """NumPy order (outermost first)."""
        return tuple(reversed(self.ne))


class _Cursor:
    def __init__(self, path: Path, buf, size: int):
        self.path, self.buf, self.size, self.off = path, buf, size, 0

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.off:
            raise ModelFileError(
                self.path,
                f"the file ends at byte {self.size}, but {n} bytes are declared at byte {self.off}: "
                "the file is truncated (an incomplete download?) or its header is corrupt",
                what,
            )

    def unpack(self, code: str, what: str):
        n = struct.calcsize(code)
        self.need(n, what)
        (v,) = struct.unpack_from(code, self.buf, self.off)
        self.off += n
        return v

    def string(self, what: str, max_len: int | None = None) -> str:
        n = self.unpack("<Q", what)
        if max_len is not None and n > max_len:
            raise ModelFileError(self.path, f"a name of {n} bytes (GGUF allows {max_len})", what)
        self.need(n, what)
        raw = bytes(self.buf[self.off : self.off + n])
        try:
            s = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ModelFileError(self.path, f"text that is not valid UTF-8 (byte {self.off + exc.start} of the file)", what) from None
        self.off += n
        return s

    def value(self, vtype: int, what: str, depth: int = 0) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype][0], what)
        if vtype == STRING:
            return self.string(what)
        if vtype != ARRAY:
            raise ModelFileError(self.path, f"unknown metadata value type {vtype}", what)
        if depth >= MAX_NESTING:
            raise ModelFileError(self.path, f"arrays nested more than {MAX_NESTING} deep", what)
        etype = self.unpack("<I", what)
        count = self.unpack("<Q", what)
        if etype in _SCALARS:
            dtype = np.dtype(_SCALARS[etype][1])
            self.need(count * dtype.itemsize, what)
            arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.off)
            self.off += count * dtype.itemsize
            return arr
        if etype not in _MIN_VALUE_BYTES:
            raise ModelFileError(self.path, f"an array of unknown value type {etype}", what)
        # bound the count by the bytes left before building a list of that length
        self.need(count * _MIN_VALUE_BYTES[etype], what)
        return [self.value(etype, f"{what}[{i}]", depth + 1) for i in range(count)]


class GGUFFile:
    """``fields``: metadata key -> value (numbers, str, bool, list of str, or a read-only NumPy
    view for numeric arrays); ``tensors``: in file order."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        with open(self.path, "rb") as fh:
            self.size = fh.seek(0, 2)
            if self.size == 0:
                raise ModelFileError(self.path, "the file is empty")
            self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        c = _Cursor(self.path, self._map, self.size)
        magic = bytes(self._map[:4])
        if magic != MAGIC:
            raise ModelFileError(self.path, f"not a GGUF file (it starts with {magic!r}, not {MAGIC!r})")
        c.off = 4
        self.version = c.unpack("<I", "version")
        if self.version & 0xFFFF == 0 and self.version:
            raise ModelFileError(self.path, "a big-endian GGUF file; bw24chat reads little-endian ones", "version")
        if self.version not in (2, 3):
            raise ModelFileError(self.path, f"GGUF version {self.version}; bw24chat reads versions 2 and 3", "version")
        n_tensors = c.unpack("<Q", "tensor_count")
        n_kv = c.unpack("<Q", "metadata_kv_count")
        c.need(n_kv * 13, f"metadata_kv_count ({n_kv})")  # each pair: key length, type, >= 1 byte

        self.fields: dict[str, Any] = {}
        for i in range(n_kv):
            key = c.string(f"metadata key #{i}")
            if key in self.fields:
                raise ModelFileError(self.path, "appears twice in the metadata", key)
            vtype = c.unpack("<I", key)
            self.fields[key] = c.value(vtype, key)

        self.alignment = self._alignment()
        c.need(n_tensors * 24, f"tensor_count ({n_tensors})")  # each info: name length, n_dims, type, offset
        infos = [self._tensor_info(c, i) for i in range(n_tensors)]
        self.data_offset = -(-c.off // self.alignment) * self.alignment
        self.tensors = self._place(infos)

    def _alignment(self) -> int:
        a = self.fields.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(a, int) or isinstance(a, bool) or a <= 0 or a & (a - 1):
            raise ModelFileError(self.path, f"{a!r} is not a power of two", "general.alignment")
        return a

    def _tensor_info(self, c: _Cursor, index: int) -> tuple[str, int, tuple[int, ...], int]:
        name = c.string(f"tensor #{index} name", MAX_TENSOR_NAME)
        n_dims = c.unpack("<I", name)
        if not 1 <= n_dims <= MAX_DIMS:
            raise ModelFileError(self.path, f"{n_dims} dimensions (ggml tensors have 1 to {MAX_DIMS})", f"tensor {name}")
        ne = tuple(c.unpack("<Q", f"tensor {name}") for _ in range(n_dims))
        gtype = c.unpack("<I", f"tensor {name}")
        offset = c.unpack("<Q", f"tensor {name}")
        return name, gtype, ne, offset

    def _place(self, infos) -> list[TensorInfo]:
        out, seen = [], set()
        for name, gtype, ne, rel in infos:
            where = f"tensor {name}"
            if name in seen:
                raise ModelFileError(self.path, "appears twice in the tensor list", where)
            seen.add(name)
            try:
                qtype = T(gtype)
                block, type_size = GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise ModelFileError(self.path, f"unknown ggml tensor type {gtype}", where) from None
            if ne[0] % block:
                raise ModelFileError(self.path, f"{qtype.name} rows of {ne[0]} values, not a multiple of its block of {block}", where)
            n_elems = math.prod(ne)
            if math.prod(max(d, 1) for d in ne) >= 1 << 63:  # ggml counts elements in an int64
                raise ModelFileError(self.path, f"dimensions {list(ne)} overflow a 64-bit element count", where)
            nbytes = n_elems // block * type_size
            if rel % self.alignment:
                raise ModelFileError(self.path, f"data offset {rel} is not a multiple of the alignment {self.alignment}", where)
            start = self.data_offset + rel
            if start + nbytes > self.size:
                raise ModelFileError(
                    self.path,
                    f"the file ends at byte {self.size}, but the tensor needs bytes {start}-{start + nbytes}: "
                    "the file is truncated (an incomplete download?)",
                    where,
                )
            out.append(TensorInfo(name, qtype, ne, start, nbytes))
        by_start = sorted(out, key=lambda t: t.offset)
        for a, b in zip(by_start, by_start[1:]):
            if b.offset < a.offset + a.nbytes:
                raise ModelFileError(self.path, f"its data (from byte {b.offset}) overlaps tensor {a.name} "
                                                f"(bytes {a.offset}-{a.offset + a.nbytes})", f"tensor {b.name}")
        for t in out:
            t.data = self._view(t)
        return out

    def _view(self, t: TensorInfo) -> np.ndarray:
        shape = t.shape
        if t.ggml_type in _NATIVE:
            dtype = np.dtype(_NATIVE[t.ggml_type])
            return np.frombuffer(self._map, dtype=dtype, count=t.nbytes // dtype.itemsize, offset=t.offset).reshape(shape)
        block, type_size = GGML_QUANT_SIZES[t.ggml_type]
        byte_shape = (*shape[:-1], shape[-1] // block * type_size)
        return np.frombuffer(self._map, dtype=np.uint8, count=t.nbytes, offset=t.offset).reshape(byte_shape)


__all__ = ["GGUFFile", "TensorInfo", "ModelFileError"]
