"""The in-memory weight every loader produces: raw bytes in a named format, memory-mapped
where the file allows, plus what is needed to decode them.

Formats are ggml type names ("F32", "BF16", "Q4_K", "NVFP4", ...) or "FP8_E4M3" (HF block-FP8,
DeepSeek-V3 style: E4M3 values, one F32 scale per 128x128 block in ``scale``).  NVFP4 weights
from any source (GGUF, ModelOpt safetensors, quantize-at-load) are held in ggml's NVFP4 block
layout with the per-tensor FP32 ``global_scale`` kept beside them: value = E2M1 x E4M3 x global.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from .. import quants


def _fp8_e4m3_table() -> np.ndarray:
    """All 256 E4M3 (OCP FP8, bias 7, no infinities, 0x7F/0xFF NaN) codes as float32."""
    codes = np.arange(256, dtype=np.uint32)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = (codes & 7).astype(np.float64)
    val = np.where(exp == 0, man * 2.0**-9, (1 + man / 8) * 2.0 ** (exp.astype(np.float64) - 7))
    val = sign * val
    val[(codes & 0x7F) == 0x7F] = np.nan
    return val.astype(np.float32)


FP8_E4M3 = _fp8_e4m3_table()


@dataclass
class QTensor:
    name: str  # canonical name
    fmt: str  # ggml type name or "FP8_E4M3"
    shape: tuple[int, ...]  # logical, numpy order: (out_features, in_features) for matrices
    raw: np.ndarray  # bytes (uint8, last axis = row bytes) or the dtype itself for F32/F16
    global_scale: float = 1.0  # NVFP4 per-tensor scale (ModelOpt weight_scale_2)
    scale: np.ndarray | None = None  # FP8_E4M3 block scales [ceil(out/128), ceil(in/128)]

    @property
    def nbytes(self) -> int:
        return int(self.raw.nbytes) + (0 if self.scale is None else int(self.scale.nbytes))

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape))

    def dequantize(self) -> np.ndarray:
        """float32 array of ``shape``."""
        if self.fmt == "FP8_E4M3":
            w = FP8_E4M3[self.raw.view(np.uint8)].reshape(self.shape)
            s = np.repeat(np.repeat(self.scale.astype(np.float32), 128, axis=0), 128, axis=1)
            return w * s[: self.shape[0], : self.shape[1]]
        out = quants.dequantize(self.raw, T[self.fmt], self.shape)
        if self.global_scale != 1.0:
            out = out * np.float32(self.global_scale)
        return out


    def take_rows(self, rows, name: str) -> "QTensor":
        """The rows ``rows`` (in that order) as a tensor named ``name``: the same bytes where each
        row is its own bytes (float and ggml block formats), float32 where block scales span
        rows (FP8)."""
        if self.scale is not None:
            w = self.dequantize()[rows]
            return QTensor(name, "F32", tuple(w.shape), w)
        return QTensor(name, self.fmt, (len(rows), *self.shape[1:]), self.raw[rows], self.global_scale)

    def take_cols(self, ranges, name: str) -> "QTensor":
        """The columns of ``ranges`` ((lo, hi), ... in that order) of a matrix as a tensor named
        ``name`` (a GPU's share of a row-parallel weight, parallel.py): the same bytes where every
        edge falls on the format's block boundaries, float32 where block scales span columns
        (FP8); an edge inside a block is refused (parallel.partition checks it first, naming
        the tensor)."""
        if self.scale is not None:
            w = np.concatenate([self.dequantize()[:, lo:hi] for lo, hi in ranges], axis=1)
            return QTensor(name, "F32", tuple(w.shape), w)
        bs, ts = quants.block_info(T[self.fmt])
        size, cols = self.raw.dtype.itemsize, []
        for lo, hi in ranges:
            a, b = lo // bs * ts, hi // bs * ts  # byte offsets within a row
            if lo % bs or hi % bs or a % size or b % size:
                raise ValueError(f"{self.name}: columns {lo}..{hi} split a {self.fmt} block of {bs} values")
            cols.append(self.raw[:, a // size:b // size])
        raw = cols[0] if len(cols) == 1 else np.concatenate(cols, axis=1)
        return QTensor(name, self.fmt, (self.shape[0], sum(hi - lo for lo, hi in ranges)), raw, self.global_scale)


@dataclass
class ExpertTensor:
    """One projection of a layer's routed experts, (E, out, in): expert e is ``parts[e]``, an
    ordinary (out, in) QTensor.  The parts are views into the file either way, never copies:
    slices of one 3-D tensor (GGUF ``ffn_*_exps``, transformers' fused ``gate_up_proj``) or the
    per-expert tensors of an HF checkpoint (``experts.{j}.gate_proj``), so a backend reads (or
    uploads, or spills) one expert at a time."""

    name: str
    parts: list[QTensor]

    def __post_init__(self):
        fmts = {(p.fmt, p.shape) for p in self.parts}
        if len(fmts) != 1:
            raise ValueError(f"{self.name}: experts differ in format or shape: {sorted(fmts)[:3]}")

    @classmethod
    def from_array(cls, name: str, fmt: str, shape: tuple[int, ...], raw: np.ndarray, **kw) -> "ExpertTensor":
        """Over a 3-D array (E, out, row) whose slices are the experts."""
        return cls(name, [QTensor(f"{name}.{e}", fmt, tuple(shape[1:]), raw[e], **kw) for e in range(shape[0])])

    @property
    def fmt(self) -> str:
        return self.parts[0].fmt

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.parts), *self.parts[0].shape)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape))

    def expert(self, e: int) -> QTensor:
        return self.parts[e]

    def dequantize(self) -> np.ndarray:
        return np.stack([p.dequantize() for p in self.parts])
