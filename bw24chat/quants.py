"""NumPy dequantization of every ggml tensor type our target models use.

This is the reference the CUDA dequantization kernels mirror, and it is tested bit for bit
against ``gguf.quants.dequantize``.  Bit equality needs the same float32 operations in the same
order as ggml's reference C (ggml-quants.c ``dequantize_row_*``): e.g. Q4_1 is ``d*q + m`` (a
rounded product, then a rounded sum: never a fused multiply-add) and Q4_K is
``(d*sc)*q - (dmin*m)``.  CUDA kernels therefore use ``__fmul_rn``/``__fadd_rn`` where a
compiler would otherwise contract to FMA.

Layouts (block = the unit that carries its own scales; sizes in bytes), from ggml-common.h:
  Q4_0   32 values: f16 d, 16 B nibbles (value j in low nibble of byte j, value j+16 in high)
  Q4_1   32 values: f16 d, f16 m, 16 B nibbles
  Q5_0   32 values: f16 d, u32 qh (5th bits), 16 B nibbles
  Q5_1   32 values: f16 d, f16 m, u32 qh, 16 B nibbles
  Q8_0   32 values: f16 d, 32 x i8
  Q2_K  256 values: 16 B scales (low nibble scale, high nibble min, one per 16 values), 64 B
         2-bit codes, f16 d, f16 dmin
  Q3_K  256 values: 32 B high-bit mask, 64 B 2-bit low codes, 12 B packed 6-bit scales, f16 d
  Q4_K  256 values: f16 d, f16 dmin, 12 B packed 6-bit (scale, min) x 8, 128 B nibbles
  Q5_K  256 values: as Q4_K + 32 B of 5th bits
  Q6_K  256 values: 128 B low nibbles, 64 B 2-bit highs, 16 x i8 scales, f16 d
  MXFP4  32 values: e8m0 exponent, 16 B E2M1 nibbles (OCP MX spec v1.0)
  NVFP4  64 values: 4 x ue4m3 scales (one per 16), 32 B E2M1 nibbles; within each 16-value
         group, byte i holds value i (low nibble) and value i+8 (high nibble)
  IQ4_NL 32 values: f16 d, 16 B indices into a fixed non-linear 16-entry table
  IQ4_XS 256 values: f16 d, u16 scales_h, 4 B scales_l, 128 B indices (IQ4_NL table)
"""
from __future__ import annotations

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

QK_K = 256

# E2M1 magnitudes doubled so that they are integers (0, .5, 1, 1.5, 2, 3, 4, 6) x 2; sign in bit 3.
E2M1_X2 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)
IQ4NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)


def _f16(b: np.ndarray) -> np.ndarray:
    """Little-endian f16 stored in 2 uint8 columns -> float32, shape (n, 1)."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles_lo_hi(qs: np.ndarray) -> np.ndarray:
    """(n, k) bytes -> (n, 2k): the k low nibbles, then the k high nibbles (ggml's order)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _bits(qh_u32: np.ndarray, count: int) -> np.ndarray:
    """(n, 1) uint32 -> (n, count) uint8 of its low `count` bits, bit i in column i."""
    return ((qh_u32 >> np.arange(count, dtype=np.uint32)) & 1).astype(np.uint8)


def _q4_0(b):
    d = _f16(b[:, 0:2])
    q = _nibbles_lo_hi(b[:, 2:18]).astype(np.int8) - np.int8(8)
    return d * q.astype(np.float32)


def _q4_1(b):
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    q = _nibbles_lo_hi(b[:, 4:20]).astype(np.float32)
    return d * q + m


def _q5_0(b):
    d = _f16(b[:, 0:2])
    qh = _bits(np.ascontiguousarray(b[:, 2:6]).view(np.uint32), 32)
    q = (_nibbles_lo_hi(b[:, 6:22]) | (qh << 4)).astype(np.int8) - np.int8(16)
    return d * q.astype(np.float32)


def _q5_1(b):
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    qh = _bits(np.ascontiguousarray(b[:, 4:8]).view(np.uint32), 32)
    q = (_nibbles_lo_hi(b[:, 8:24]) | (qh << 4)).astype(np.float32)
    return d * q + m


def _q8_0(b):
    d = _f16(b[:, 0:2])
    return np.ascontiguousarray(b[:, 2:34]).view(np.int8).astype(np.float32) * d


def k_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K 12-byte packed 6-bit (scale, min) pairs -> two (n, 8) uint8 arrays.

    Bytes 0-3: scales 0-3 (low 6 bits), high 2 bits feed scales 4-7; bytes 4-7 the same for
    mins; bytes 8-11: low nibble = low 4 bits of scale 4+i, high nibble = of min 4+i."""
    a, m, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([a & 0x3F, (hi & 0x0F) | ((a >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (hi >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def _q2_k(b):
    n = b.shape[0]
    sc = b[:, 0:16]
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    dl = (d * (sc & 0x0F).astype(np.float32))[:, :, None]  # (n, 16, 1)
    ml = (dmin * (sc >> 4).astype(np.float32))[:, :, None]
    # 2 halves of 128 values; value 128h + 32s + l is bits 2s of byte 32h + l
    q = (b[:, 16:80].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 3
    return (dl * q.reshape(n, 16, 16).astype(np.float32) - ml).reshape(n, QK_K)


def q3_k_scales(s: np.ndarray) -> np.ndarray:
    """Q3_K's 12 bytes of packed 6-bit scales -> (n, 16) int8 scales (stored value - 32): bytes
    0-7 hold the low nibbles (scales 0-7 low nibbles, 8-15 high ones), bytes 8-11 the 2-bit highs
    (byte 8+i bits 2j.. of scale 4j+i)."""
    n = s.shape[0]
    lo = (s[:, 0:8].reshape(n, 1, 8) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)).reshape(n, 16) & 0x0F
    hi = (s[:, 8:12].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)).reshape(n, 16) & 0x03
    return (lo | (hi << 4)).astype(np.int8) - np.int8(32)


def _q3_k(b):
    n = b.shape[0]
    d = _f16(b[:, 108:110])
    dl = (d * q3_k_scales(b[:, 96:108]).astype(np.float32)).reshape(n, 16, 1)
    # value 128h + 32s + l: low bits 2s of byte 32h + l, high bit 4h + s of mask byte l; a clear
    # high bit subtracts 4
    ql = (b[:, 32:96].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 3
    hm = (b[:, 0:32].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    q = ql.reshape(n, 8, 32).astype(np.int8) - ((hm ^ 1) << 2).astype(np.int8)
    return (dl * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, QK_K)


def _q4_k(b):
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = k_scale_min(b[:, 4:16])
    ds = (d * sc.astype(np.float32))[:, :, None]  # (n, 8, 1)
    dm = (dmin * mn.astype(np.float32))[:, :, None]
    # 4 chunks of 32 bytes; chunk c holds sub-blocks 2c (low nibbles) and 2c+1 (high nibbles)
    qs = b[:, 16:144].reshape(n, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    q = (qs & 0x0F).reshape(n, 8, 32).astype(np.float32)
    return (ds * q - dm).reshape(n, QK_K)


def _q5_k(b):
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = k_scale_min(b[:, 4:16])
    ds = (d * sc.astype(np.float32))[:, :, None]
    dm = (dmin * mn.astype(np.float32))[:, :, None]
    qh = b[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)  # bit j -> sub-block j
    ql = b[:, 48:176].reshape(n, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    q = ((ql & 0x0F).reshape(n, 8, 32) | ((qh & 1) << 4)).astype(np.float32)
    return (ds * q - dm).reshape(n, QK_K)


def _q6_k(b):
    n = b.shape[0]
    ql, qh = b[:, 0:128], b[:, 128:192]
    sc = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.float32)
    d = _f16(b[:, 208:210])
    ds = (d * sc).reshape(n, 16, 1)
    lo = ((ql.reshape(n, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 0x0F).reshape(n, 8, 32)
    hi = ((qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 0x03).reshape(n, 8, 32)
    q = ((lo | (hi << 4)).astype(np.int8) - np.int8(32)).reshape(n, 16, 16).astype(np.float32)
    return (ds * q).reshape(n, QK_K)


def e8m0_to_f32_half(e: np.ndarray) -> np.ndarray:
    """2^(e-127) / 2 as float32 (the halving undoes the doubled E2M1 table); e < 2 gives the
    subnormals 2^-128, 2^-127 (ggml_e8m0_to_fp32_half)."""
    e32 = e.astype(np.uint32)
    bits = np.where(e32 < 2, np.uint32(0x00200000) << e32, (e32 - 1) << np.uint32(23)).astype(np.uint32)
    return bits.view(np.float32)


def _mxfp4(b):
    d = e8m0_to_f32_half(b[:, 0:1])
    q = E2M1_X2[_nibbles_lo_hi(b[:, 1:17])]
    return d * q.astype(np.float32)


def ue4m3_to_f32_half(x: np.ndarray) -> np.ndarray:
    """Unsigned E4M3 scale (bias 7, no sign; 0x7F is NaN in E4M3 and decodes to 0 here, as in
    ggml) -> float32, halved to pair with the doubled E2M1 table."""
    exp = (x >> 3).astype(np.int32) & 0xF
    man = (x & 0x7).astype(np.float32)
    raw = np.where(exp == 0, man * np.float32(2.0**-9), (np.float32(1.0) + man / np.float32(8.0)) * np.exp2(exp.astype(np.float32) - 7))
    return np.where((x == 0) | (x == 0x7F), np.float32(0.0), raw * np.float32(0.5)).astype(np.float32)


def _nvfp4(b):
    n = b.shape[0]
    d = ue4m3_to_f32_half(b[:, 0:4]).reshape(n, 4, 1)
    qs = b[:, 4:36].reshape(n, 4, 8)
    q = E2M1_X2[np.concatenate([qs & 0x0F, qs >> 4], axis=-1)]  # (n, 4, 16)
    return (d * q.astype(np.float32)).reshape(n, 64)


def _iq4_nl(b):
    d = _f16(b[:, 0:2])
    return d * IQ4NL_VALUES[_nibbles_lo_hi(b[:, 2:18])].astype(np.float32)


def _iq4_xs(b):
    n = b.shape[0]
    d = _f16(b[:, 0:2])
    sh = np.ascontiguousarray(b[:, 2:4]).view(np.uint16)  # (n, 1)
    sl = b[:, 4:8]
    lo = np.stack([sl & 0x0F, sl >> 4], axis=-1).reshape(n, 8)
    hi = ((sh >> (2 * np.arange(8, dtype=np.uint16))) & 3).astype(np.uint8)
    ls = (lo | (hi << 4)).astype(np.int8) - np.int8(32)
    dl = (d * ls.astype(np.float32)).reshape(n, 8, 1)
    qs = b[:, 8:136].reshape(n, 8, 1, 16) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    q = IQ4NL_VALUES[(qs & 0x0F).reshape(n, 8, 32)].astype(np.float32)
    return (dl * q).reshape(n, QK_K)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even, as __float2bfloat16_rn
    and ggml_compute_fp32_to_bf16 (NaN becomes the quiet NaN 0x7FC0)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded).astype(np.uint16)


def _bf16(b):
    return (np.ascontiguousarray(b).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


_BLOCK_DEQUANT = {
    T.Q4_0: _q4_0, T.Q4_1: _q4_1, T.Q5_0: _q5_0, T.Q5_1: _q5_1, T.Q8_0: _q8_0,
    T.Q2_K: _q2_k, T.Q3_K: _q3_k, T.Q4_K: _q4_k, T.Q5_K: _q5_k, T.Q6_K: _q6_k,
    T.MXFP4: _mxfp4, T.NVFP4: _nvfp4, T.IQ4_NL: _iq4_nl, T.IQ4_XS: _iq4_xs,
}

SUPPORTED = {T.F32, T.F16, T.BF16, *_BLOCK_DEQUANT}


def block_info(qtype: T) -> tuple[int, int]:
    """(values per block, bytes per block)."""
    return GGML_QUANT_SIZES[qtype]


def row_bytes(qtype: T, n_cols: int) -> int:
    bs, ts = block_info(qtype)
    if n_cols % bs:
        raise ValueError(f"{qtype.name} rows need a multiple of {bs} values, got {n_cols}")
    return n_cols // bs * ts


def dequantize(raw: np.ndarray, qtype: T, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """Raw ggml bytes (any shape, uint8 or the type's own dtype) -> float32.

    With ``shape`` (numpy order, last axis contiguous) the result is reshaped to it; otherwise
    the last axis is expanded from bytes to values, like gguf.quants.dequantize."""
    qtype = T(qtype)
    if qtype == T.F32:
        out = np.ascontiguousarray(raw).view(np.float32)
    elif qtype == T.F16:
        out = np.ascontiguousarray(raw).view(np.float16).astype(np.float32)
    elif qtype == T.BF16:
        out = _bf16(raw)
    else:
        fn = _BLOCK_DEQUANT.get(qtype)
        if fn is None:
            raise NotImplementedError(f"ggml type {qtype.name} is not supported by bw24chat")
        bs, ts = block_info(qtype)
        u8 = np.ascontiguousarray(raw).view(np.uint8)
        lead = u8.shape[:-1]
        blocks = u8.reshape(-1, ts)
        out = fn(blocks).reshape(*lead, u8.shape[-1] // ts * bs)
    return out.reshape(shape) if shape is not None else out
