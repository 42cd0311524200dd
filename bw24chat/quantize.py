"""Quantize-at-load (``--quantize nvfp4|q8_0``): re-encode a checkpoint's matrices.

NVFP4 follows NVIDIA's reference recipe (TensorRT Model Optimizer, NVFP4QTensor):
  global scale  g = amax(|W|) / (6 * 448)            (FP32, kept per tensor: ModelOpt's weight_scale_2)
  block scale   s_b = E4M3( amax(|W_b|) / 6 / g )   (one per 16 values, round to nearest E4M3)
  codes         q = E2M1( W / (s_b * g) )           (nearest of 0, .5, 1, 1.5, 2, 3, 4, 6; ties to even code)
The result is held in ggml's NVFP4 block layout with g beside it, exactly the resident form of
GGUF NVFP4 and ModelOpt checkpoints, so all three inputs share one device layout.

Q8_0 uses gguf.quants.quantize (bit-exact with ggml's reference quantize_row_q8_0).
"""
from __future__ import annotations

import numpy as np
from gguf import quants as gq
from gguf.constants import GGMLQuantizationType as T

from .loaders.hf_loader import _nvfp4_modelopt_to_ggml
from .quants import f32_to_bf16_bits
from .loaders.tensor import FP8_E4M3, QTensor

E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
_E2M1_BOUNDS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)  # midpoints
_E4M3_POS = FP8_E4M3[:0x7F].astype(np.float32)  # codes 0x00..0x7E, increasing


def e4m3_round(x: np.ndarray) -> np.ndarray:
    """Positive float32 -> nearest E4M3 code (ties to the even code), saturating at 448."""
    x = np.clip(x, 0, 448).astype(np.float32)
    hi = np.searchsorted(_E4M3_POS, x, side="left").clip(1, 0x7E)
    lo = hi - 1
    d_lo, d_hi = x - _E4M3_POS[lo], _E4M3_POS[hi] - x
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    return np.where(pick_hi, hi, lo).astype(np.uint8)


def e2m1_round(x: np.ndarray) -> np.ndarray:
    """float32 -> 4-bit E2M1 codes (sign in bit 3), nearest value, ties to the even code."""
    a = np.abs(x)
    idx = np.searchsorted(_E2M1_BOUNDS, a, side="left")  # a <= bound -> lower index
    tie = np.isin(a, _E2M1_BOUNDS)
    idx = np.where(tie & (idx % 2 == 1), idx + 1, idx)  # a tie sits at bound idx: even code wins
    idx = np.minimum(idx, 7).astype(np.uint8)
    return idx | np.where((x < 0) & (idx > 0), np.uint8(8), np.uint8(0))


def nvfp4_encode(w: np.ndarray, name: str = "") -> tuple[np.ndarray, np.ndarray, np.float32]:
    """float32 [out, in] -> ModelOpt NVFP4 tensors: packed codes U8 [out, in/2] (element 2i in the
    low nibble), E4M3 block scales U8 [out, in/16], per-tensor FP32 scale (weight_scale_2)."""
    w = np.asarray(w, np.float32)
    rows, cols = w.shape
    if cols % 64:
        raise ValueError(f"{name}: NVFP4 rows need a multiple of 64 values (got {cols})")
    amax = float(np.abs(w).max())
    g = np.float32(amax / (6.0 * 448.0)) if amax > 0 else np.float32(1.0)
    blocks = w.reshape(rows, cols // 16, 16)
    bmax = np.abs(blocks).max(axis=-1)
    sc = e4m3_round(bmax / np.float32(6.0) / g)
    sval = FP8_E4M3[sc] * g
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = np.where(sval[..., None] > 0, blocks / sval[..., None], 0).astype(np.float32)
    codes = e2m1_round(scaled).reshape(rows, cols)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed, sc, g


def quantize_nvfp4(w: np.ndarray, name: str = "") -> QTensor:
    packed, sc, g = nvfp4_encode(w, name)
    rows, cols = np.shape(w)
    return QTensor(name, "NVFP4", (rows, cols), _nvfp4_modelopt_to_ggml(packed, sc), global_scale=float(g))


def quantize_q8_0(w: np.ndarray, name: str = "") -> QTensor:
    w = np.asarray(w, np.float32)
    raw = gq.quantize(w, T.Q8_0)
    return QTensor(name, "Q8_0", w.shape, raw)


def to_bf16(w: np.ndarray, name: str = "") -> QTensor:
    return QTensor(name, "BF16", w.shape, f32_to_bf16_bits(w))


QUANTIZERS = {"nvfp4": quantize_nvfp4, "q8_0": quantize_q8_0, "bf16": to_bf16}


def requantize_checkpoint(ck, fmt: str, progress=None):
    """Re-encode every matrix of ``ck`` (in place) to ``fmt``; vectors (norms, biases) stay F32."""
    fn = QUANTIZERS[fmt]
    mats = [n for n, t in ck.tensors.items() if len(t.shape) == 2]
    for i, n in enumerate(mats):
        t = ck.tensors[n]
        if fmt == "nvfp4" and t.shape[1] % 64:
            continue  # rows the format cannot hold stay as they are (reported per layer)
        ck.tensors[n] = fn(t.dequantize(), n)
        if progress:
            progress((i + 1) / len(mats))
    return ck
