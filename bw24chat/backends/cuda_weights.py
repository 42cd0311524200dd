"""Weights on the device in their quantized form, repacked at load for coalesced 16-byte loads.

The device layout (kernels/formats.cuh is the contract) cuts every row into 16-byte *chunks*
of VPC values: F32 4, F16/BF16 8, Q8_0 16, and 32 for every 4-bit-based format, whose chunk is
a "nibble chunk" (byte j: value j in the low nibble, value 16+j in the high one; the E2M1
formats NVFP4 and MXFP4 instead four "selector words", pack_selector_words; Q2_K and Q3_K an
8-byte chunk of 2-bit codes, pack_h6's layout, so that they keep their 2.6 / 3.4 bits per weight).  Scales and
high bits live in separate planes (``s``, ``d``, ``h``), so a warp's chunk loads are one
contiguous 512-byte run.  Several tensors of one format and width are concatenated along the
output rows (the runner fuses Wq|Wk|Wv and Wgate|Wup).

``repack_host`` builds the planes with NumPy (no GPU needed); ``decode_planes`` is the NumPy
mirror of the device decoder (same integer tricks, same float op order) and is tested bit for
bit against ``bw24chat.quants.dequantize`` (tests/test_repack.py); ``upload`` moves the planes
to CuPy arrays.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import quants
from .kernel_refs import FLOAT_FORMATS

# format id (the FMT define of kernels/formats.cuh) and values per 16-byte chunk
FORMATS = {
    "F32": (0, 4), "F16": (1, 8), "BF16": (2, 8), "Q8_0": (3, 16),
    "Q4_0": (4, 32), "Q4_1": (5, 32), "Q5_0": (6, 32), "Q5_1": (7, 32),
    "Q4_K": (8, 32), "Q5_K": (9, 32), "Q6_K": (10, 32), "NVFP4": (11, 32), "MXFP4": (12, 32),
    "Q2_K": (13, 32), "Q3_K": (14, 32),
}
E2M1_FORMATS = ("NVFP4", "MXFP4")  # E2M1 codes as selector words (pack_selector_words)
TWO_BIT_FORMATS = ("Q2_K", "Q3_K")  # q = 2-bit codes, 8 bytes per chunk (pack_h6's layout)
HAS_MIN = {"Q4_1", "Q5_1", "Q4_K", "Q5_K", "Q2_K"}


def q_chunk_bytes(fmt: str) -> int:
    """Bytes of one chunk in the q plane: 16, or 8 for the 2-bit formats."""
    return 8 if fmt in TWO_BIT_FORMATS else 16


def fmt_id(fmt: str) -> int:
    return FORMATS[fmt][0]


def vpc(fmt: str) -> int:
    return FORMATS[fmt][1]


@dataclass
class HostPlanes:
    """Repacked planes of one (possibly fused) matrix, all row-major with `out` rows."""
    fmt: str
    out: int
    in_: int
    q: np.ndarray  # uint8 [out, in/VPC*q_chunk_bytes]
    h: np.ndarray | None = None  # uint8 [out, nck*4] (5th bits, Q3_K's 3rd bits) or [out, nck*8] (Q6_K)
    s: np.ndarray | None = None  # uint8 scale records
    d: np.ndarray | None = None  # uint8 [out, nsb*2] (Q6_K / Q3_K f16 d) or [out, nsb*4] (Q2_K d, dmin)
    gscale: np.ndarray | None = None  # float32 [out] (NVFP4 per-row global scale)
    global_scales: tuple = ()  # the per-tensor NVFP4 scales, in order


# ----------------------------------------------------------------------------- packing helpers
def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """(..., 32) 4-bit codes -> (..., 16) bytes: byte j = code j | code (16+j) << 4."""
    c = codes.astype(np.uint8)
    return (c[..., :16] & 0x0F) | ((c[..., 16:] & 0x0F) << 4)


def pack_selector_words(codes: np.ndarray) -> np.ndarray:
    """NVFP4: (..., 32) 4-bit codes -> (..., 16) bytes as 4 little-endian u32 "selector words":
    word g holds code 4g+j at bits 4j..4j+3 and code 16+4g+j at bits 16+4j.. (j = 0..3), so each
    16-bit half is four PRMT selector nibbles as they stand (kernels/formats.cuh qwords, nvfp4_s4;
    matvec.cu nvfp4_weight_bytes)."""
    c = codes.astype(np.uint32).reshape(*codes.shape[:-1], 2, 4, 4) & 0x0F  # [half, g, j]
    sh = (4 * np.arange(4, dtype=np.uint32)).reshape(1, 1, 4)
    w = (c[..., 0, :, :] << sh).sum(-1, dtype=np.uint32) | ((c[..., 1, :, :] << sh).sum(-1, dtype=np.uint32) << 16)
    return np.ascontiguousarray(w.astype("<u4")).view(np.uint8).reshape(*codes.shape[:-1], 16)


def nvfp4_scale_bytes(s: np.ndarray) -> np.ndarray:
    """ue4m3 scale bytes as the kernels read them: bit 7 cleared (the reference ignores it) and
    0x7F, the one code that decodes to 0 besides 0x00 (quants.ue4m3_to_f32_half), made 0x00; so a
    scale is f16 bits (byte << 7) read as E4M3 * 2^-8, with no per-value test (0xFF, whose
    magnitude the reference reads as 0x7F = 480 / 2, stays 0x7F)."""
    s = np.asarray(s, np.uint8)
    return np.where(s == 0x7F, np.uint8(0), s & np.uint8(0x7F)).astype(np.uint8)


def pack_h5(bits: np.ndarray) -> np.ndarray:
    """(..., 32) 5th bits -> (..., 4) bytes: u32 bit 8j+g = value 4g+j, bit 8j+4+g = value 16+4g+j."""
    b = bits.astype(np.uint32) & 1
    lo = b[..., :16].reshape(*b.shape[:-1], 4, 4)  # [g, j]
    hi = b[..., 16:].reshape(*b.shape[:-1], 4, 4)
    g = np.arange(4, dtype=np.uint32).reshape(4, 1)
    j = np.arange(4, dtype=np.uint32).reshape(1, 4)
    w = ((lo << (8 * j + g)) | (hi << (8 * j + 4 + g))).sum(axis=(-2, -1), dtype=np.uint32)
    return w.astype("<u4").view(np.uint8).reshape(*b.shape[:-1], 4)


def pack_h6(hi2: np.ndarray) -> np.ndarray:
    """(..., 32) 2-bit fields (Q6_K's highs, Q2_K / Q3_K's codes) -> (..., 8) bytes: word0 byte j
    bits 2g..2g+1 = value 4g+j; word1 of 16+4g+j."""
    b = hi2.astype(np.uint32) & 3
    g = np.arange(4, dtype=np.uint32).reshape(4, 1)
    j = np.arange(4, dtype=np.uint32).reshape(1, 4)
    words = []
    for half in (b[..., :16], b[..., 16:]):
        t = half.reshape(*b.shape[:-1], 4, 4)
        words.append((t << (8 * j + 2 * g)).sum(axis=(-2, -1), dtype=np.uint32))
    w = np.stack(words, axis=-1).astype("<u4")
    return w.view(np.uint8).reshape(*b.shape[:-1], 8)


def _rows(raw: np.ndarray, out: int) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.uint8).reshape(out, -1)


# The formats whose planes are byte ranges of each block as they stand: (plane, first byte, bytes)
BLOCK_FIELDS = {"Q8_0": (("q", 2, 32), ("s", 0, 2)), "Q4_0": (("q", 2, 16), ("s", 0, 2)),
                "Q4_1": (("q", 4, 16), ("s", 0, 4))}


def repack_one(fmt: str, raw: np.ndarray, out: int, in_: int) -> dict:
    """The planes of one tensor (uint8 arrays with `out` rows)."""
    if fmt not in FORMATS:
        raise NotImplementedError(f"no CUDA layout for {fmt}")
    V = vpc(fmt)
    if in_ % V:
        raise ValueError(f"{fmt}: in={in_} must be a multiple of {V} (one 16-byte chunk)")
    u8 = _rows(raw, out)
    if fmt in FLOAT_FORMATS:
        return {"q": u8}
    bs, ts = quants.block_info(quants.T[fmt])
    if in_ % bs:
        raise ValueError(f"{fmt}: in={in_} must be a multiple of the block ({bs})")
    nb = in_ // bs
    b = u8.reshape(out, nb, ts)
    if fmt in BLOCK_FIELDS:
        return {name: b[:, :, o:o + w].reshape(out, -1) for name, o, w in BLOCK_FIELDS[fmt]}
    if fmt in ("Q5_0", "Q5_1"):
        o = 2 if fmt == "Q5_0" else 4
        qh = np.ascontiguousarray(b[:, :, o:o + 4]).view("<u4")  # (out, nb, 1)
        bits = (qh >> np.arange(32, dtype=np.uint32)) & 1  # bit v -> value v
        return {"q": b[:, :, o + 4:o + 20].reshape(out, -1), "h": pack_h5(bits).reshape(out, -1),
                "s": b[:, :, 0:o].reshape(out, -1)}
    if fmt in ("Q4_K", "Q5_K"):
        off = 16 if fmt == "Q4_K" else 48
        qs = b[:, :, off:off + 128].reshape(out, nb, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)
        codes = (qs & 0x0F).reshape(out, nb, 8, 32)  # sub-block s, value v (quants._q4_k)
        planes = {"q": pack_nibbles(codes).reshape(out, -1), "s": b[:, :, 0:16].reshape(out, -1)}
        if fmt == "Q5_K":
            qh = b[:, :, 16:48].reshape(out, nb, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)
            planes["h"] = pack_h5(qh & 1).reshape(out, -1)
        return planes
    if fmt == "Q6_K":
        ql, qh = b[:, :, 0:128], b[:, :, 128:192]
        lo = ((ql.reshape(out, nb, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)) & 0x0F).reshape(out, nb, 8, 32)
        hi = ((qh.reshape(out, nb, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 1, 4, 1)) & 0x03).reshape(out, nb, 8, 32)
        return {"q": pack_nibbles(lo).reshape(out, -1), "h": pack_h6(hi).reshape(out, -1),
                "s": b[:, :, 192:208].reshape(out, -1), "d": b[:, :, 208:210].reshape(out, -1)}
    if fmt == "NVFP4":
        qs = b[:, :, 4:36].reshape(out, nb, 4, 8)
        codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(out, nb, 2, 32)  # value order
        return {"q": pack_selector_words(codes).reshape(out, -1), "s": nvfp4_scale_bytes(b[:, :, 0:4]).reshape(out, -1)}
    if fmt in TWO_BIT_FORMATS:  # value 128h + 32s + l: bits 2s of code byte 32h + l (quants._q2_k)
        o = 16 if fmt == "Q2_K" else 32
        codes = ((b[:, :, o:o + 64].reshape(out, nb, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 1, 4, 1))
                 & 3).reshape(out, nb, 8, 32)
        if fmt == "Q2_K":  # s = the 16 scale / min bytes, d = (d, dmin)
            return {"q": pack_h6(codes).reshape(out, -1), "s": b[:, :, 0:16].reshape(out, -1),
                    "d": b[:, :, 80:84].reshape(out, -1)}
        hm = (b[:, :, 0:32].reshape(out, nb, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & 1  # chunk c: bit c
        return {"q": pack_h6(codes).reshape(out, -1), "h": pack_h5(hm).reshape(out, -1),
                "s": quants.q3_k_scales(b[:, :, 96:108].reshape(-1, 12)).view(np.uint8).reshape(out, -1),
                "d": b[:, :, 108:110].reshape(out, -1)}
    if fmt == "MXFP4":  # one block per chunk: its e8m0 byte as it stands (s, u8 per chunk)
        qs = b[:, :, 1:17]
        codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # value order (ggml's Q4_0 nibble order)
        return {"q": pack_selector_words(codes).reshape(out, -1), "s": b[:, :, 0:1].reshape(out, -1)}
    raise AssertionError(fmt)


def repack_host(qtensors: list, interleave: bool = False) -> HostPlanes:
    """Repack one or more QTensors (same format and width) into one matrix of concatenated rows,
    or with interleave=True (equal row counts) of interleaved rows: row n*i + j = row i of
    tensor j (the fused gate/up matrix: gate_i, up_i side by side, so the warp that finishes
    row 2i also holds row 2i+1 and the matvec can apply SwiGLU in its epilogue)."""
    if not qtensors:
        raise ValueError("nothing to upload")
    fmt = qtensors[0].fmt
    in_ = int(qtensors[0].shape[-1])
    parts, gs = [], []
    for t in qtensors:
        if t.fmt != fmt or int(t.shape[-1]) != in_ or len(t.shape) != 2:
            raise ValueError(f"upload fuses 2-D tensors of one format and width: {t.name} is {t.fmt} {t.shape}")
        parts.append(repack_one(fmt, t.raw, int(t.shape[0]), in_))
        gs.append(np.full(int(t.shape[0]), np.float32(t.global_scale), np.float32))
    out = sum(int(t.shape[0]) for t in qtensors)
    if interleave and len({int(t.shape[0]) for t in qtensors}) != 1:
        raise ValueError("interleave needs tensors with equal row counts")

    def join(arrays):
        if not interleave:
            return np.ascontiguousarray(np.concatenate(arrays, axis=0))
        st = np.stack(arrays, axis=1)  # (rows, n, ...) -> rows interleaved
        return np.ascontiguousarray(st.reshape((-1,) + st.shape[2:]))

    cat = lambda k: join([p[k] for p in parts]) if k in parts[0] else None  # noqa: E731
    hp = HostPlanes(fmt, out, in_, cat("q"), cat("h"), cat("s"), cat("d"))
    if fmt == "NVFP4":
        hp.gscale = join(gs)
        hp.global_scales = tuple(float(t.global_scale) for t in qtensors)
    elif any(t.global_scale != 1.0 for t in qtensors):
        raise ValueError("a global scale is only supported for NVFP4")
    return hp


# ----------------------------------------------------------------------------- NumPy mirror of formats.cuh
def _f16(u8: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(u8).view("<f2").astype(np.float32)


def _ue4m3_half(x: np.ndarray) -> np.ndarray:
    """Repacked scale bytes (nvfp4_scale_bytes) -> ue4m3 / 2: f16 bits (x << 7) times 2^7."""
    return ((x.astype(np.uint16) << 7).view("<f2").astype(np.float32) * np.float32(128.0)).astype(np.float32)


def chunk_codes(hp: HostPlanes) -> tuple:
    """The chunks of a quantized matrix's planes as formats.cuh decodes them: (q, a0, a1, b0, b1)
    with q float32 [out, nck, VPC] the exact integer values in value order (Q8_0 the int8 codes;
    the nibble and 2-bit families the codes minus QOFF, high bits merged; NVFP4 / MXFP4 the
    doubled E2M1 values), a0 / a1 float32 [out, nck, 1] the scales of values 0-15 / 16-31
    (chunk_scales: Q8_0 d; the K-quants d * sc; NVFP4 ue4m3 / 2) and b0 / b1 the additive mins
    of the halves (HAS_MIN formats, else None): w = a * q (+ b).  decode_planes and
    kernel_refs.matvec_a8_exact read them."""
    fmt, out, in_ = hp.fmt, hp.out, hp.in_
    nck = in_ // vpc(fmt)
    words = hp.q.reshape(out, nck, -1, 4).view("<u4")[..., 0]  # (out, nck, 4) words g (2-bit: 2 words)
    kc = np.arange(nck)
    if fmt == "Q8_0":
        d = _f16(hp.s.reshape(out, -1, 2))[..., 0][:, kc // 2, None]  # (out, nck, 1)
        w = words ^ np.uint32(0x80808080)
        bytes_ = ((w[..., None] >> (8 * np.arange(4, dtype=np.uint32))) & 0xFF).reshape(out, nck, 16)
        q = (bytes_ | np.uint32(0x4B000000)).view(np.float32) - np.float32(8388608.0 + 128.0)
        return q, d, d, None, None

    def sh(v, s):
        return (v << np.uint32(s)) if s >= 0 else (v >> np.uint32(-s))

    # nibble family: code bytes lo (values 4g+j), hi (16+4g+j)
    if fmt in TWO_BIT_FORMATS:  # word 0 byte j bits 2g.. = value 4g+j, word 1 of 16+4g+j
        lo = np.stack([(words[..., 0] >> np.uint32(2 * gg)) & np.uint32(0x03030303) for gg in range(4)], -1)
        hi = np.stack([(words[..., 1] >> np.uint32(2 * gg)) & np.uint32(0x03030303) for gg in range(4)], -1)
    elif fmt in E2M1_FORMATS:  # selector words: nibble j of each half -> byte j
        spread = lambda v: sum(((v >> np.uint32(4 * jj)) & np.uint32(0xF)) << np.uint32(8 * jj) for jj in range(4))  # noqa: E731
        lo, hi = spread(words), spread(words >> np.uint32(16))
    else:
        lo = words & np.uint32(0x0F0F0F0F)
        hi = (words >> 4) & np.uint32(0x0F0F0F0F)
    if fmt in ("Q5_0", "Q5_1", "Q5_K"):
        h = hp.h.reshape(out, nck, 4).view("<u4")  # (out, nck, 1)
        lo = lo | (np.stack([h[..., 0] << np.uint32(4 - gg) for gg in range(4)], -1) & np.uint32(0x10101010))
        hi = hi | (np.stack([h[..., 0] >> np.uint32(gg) for gg in range(4)], -1) & np.uint32(0x10101010))
    elif fmt == "Q3_K":  # the third bits at bit 2 (pack_h5's layout)
        h = hp.h.reshape(out, nck, 4).view("<u4")[..., 0]  # (out, nck)
        lo = lo | (np.stack([sh(h, 2 - gg) for gg in range(4)], -1) & np.uint32(0x04040404))
        hi = hi | (np.stack([h >> np.uint32(gg + 2) for gg in range(4)], -1) & np.uint32(0x04040404))
    elif fmt == "Q6_K":
        h = hp.h.reshape(out, nck, 2, 4).view("<u4")[..., 0]  # (out, nck, 2)
        lo = lo | (np.stack([sh(h[..., 0], 4 - 2 * gg) for gg in range(4)], -1) & np.uint32(0x30303030))
        hi = hi | (np.stack([sh(h[..., 1], 4 - 2 * gg) for gg in range(4)], -1) & np.uint32(0x30303030))
    j = (8 * np.arange(4, dtype=np.uint32))

    def qvals(w):  # (out, nck, 4 words) -> (out, nck, 16) values 4g+j
        c = (w[..., None] >> j) & np.uint32(0xFF)
        if fmt in E2M1_FORMATS:
            mag = (c << 22) & np.uint32(0x01C00000)
            bits = mag | np.where(mag != 0, (c << 28) & np.uint32(0x80000000), np.uint32(0))
            return (bits.view(np.float32) * np.float32(2.0**127)).reshape(out, nck, 16)
        off = {"Q4_0": 8.0, "Q5_0": 16.0, "Q6_K": 32.0, "Q3_K": 4.0}.get(fmt, 0.0)
        return ((c | np.uint32(0x4B000000)).view(np.float32) - np.float32(8388608.0 + off)).reshape(out, nck, 16)

    qlo, qhi = qvals(lo), qvals(hi)
    b0 = b1 = None  # the additive mins of values 0-15 / 16-31 (one per chunk but Q2_K's)
    if fmt in ("Q4_0", "Q5_0"):
        a0 = _f16(hp.s.reshape(out, nck, 2))
        a1 = a0
    elif fmt in ("Q4_1", "Q5_1"):
        dm = _f16(hp.s.reshape(out, nck, 2, 2))  # (out, nck, 2, 1)
        a0, b0 = dm[:, :, 0], dm[:, :, 1]
        a1, b1 = a0, b0
    elif fmt in ("Q4_K", "Q5_K"):
        s = hp.s.reshape(out, nck // 8, 16)
        d, dmin = _f16(s[..., 0:2]), _f16(s[..., 2:4])
        sc, mn = quants.k_scale_min(s[..., 4:16].reshape(-1, 12))
        sc, mn = sc.reshape(out, -1, 8), mn.reshape(out, -1, 8)
        a0 = (d * sc.astype(np.float32)).reshape(out, nck, 1)
        b0 = -(dmin * mn.astype(np.float32)).reshape(out, nck, 1)
        a1, b1 = a0, b0
    elif fmt in ("Q6_K", "Q3_K"):
        sc = hp.s.reshape(out, nck // 8, 16).view(np.int8).astype(np.float32)
        d = _f16(hp.d.reshape(out, nck // 8, 2))
        ds = (d * sc).reshape(out, nck, 2)
        a0, a1 = ds[..., 0:1], ds[..., 1:2]
    elif fmt == "Q2_K":  # sub-block scale byte: low nibble scale, high nibble min
        s = hp.s.reshape(out, nck // 8, 16)
        dm = hp.d.reshape(out, nck // 8, 4)
        ds = (_f16(dm[..., 0:2]) * (s & 0x0F).astype(np.float32)).reshape(out, nck, 2)
        mn = -(_f16(dm[..., 2:4]) * (s >> 4).astype(np.float32)).reshape(out, nck, 2)
        a0, a1, b0, b1 = ds[..., 0:1], ds[..., 1:2], mn[..., 0:1], mn[..., 1:2]
    elif fmt == "NVFP4":
        sc = _ue4m3_half(hp.s.reshape(out, nck, 2))
        a0, a1 = sc[..., 0:1], sc[..., 1:2]
    elif fmt == "MXFP4":  # formats.cuh e8m0_half: the bits quants.e8m0_to_f32_half builds
        a0 = quants.e8m0_to_f32_half(hp.s.reshape(out, nck, 1))
        a1 = a0
    return np.concatenate([qlo, qhi], axis=-1), a0, a1, b0, b1


def decode_planes(hp: HostPlanes) -> np.ndarray:
    """float32 [out, in] exactly as formats.cuh decode_exact computes it (global scale applied
    per row for NVFP4, as the dequantize kernel does)."""
    fmt, out, in_ = hp.fmt, hp.out, hp.in_
    if fmt == "F32":
        return hp.q.view("<f4").reshape(out, in_).astype(np.float32)
    if fmt == "F16":
        return hp.q.view("<f2").astype(np.float32).reshape(out, in_)
    if fmt == "BF16":
        return (hp.q.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(out, in_)
    q, a0, a1, b0, b1 = chunk_codes(hp)
    if fmt == "Q8_0":  # 16 values, one scale
        return (q * a0).reshape(out, in_)
    vlo, vhi = a0 * q[..., :16], a1 * q[..., 16:]
    if b0 is not None:
        vlo, vhi = vlo + b0, vhi + b1
    v = np.concatenate([vlo, vhi], axis=-1).reshape(out, in_)
    if hp.gscale is not None:
        v = v * hp.gscale[:, None]
    return v.astype(np.float32)


# ----------------------------------------------------------------------------- device side
@dataclass
class DeviceWeight:
    """A (possibly fused) matrix on the device.  ``in_`` is the input width (``in`` is a Python
    keyword).  Planes absent for a format are None; ``gscale`` (NVFP4) is the per-row global
    scale as a float32 device array, ``global_scale`` the Python float when all fused tensors
    share one (else the tuple of them)."""
    fmt: str
    out: int
    in_: int
    q: object
    h: object = None
    s: object = None
    d: object = None
    gscale: object = None
    global_scale: float | tuple = 1.0
    nbytes: int = 0
    fmt_id: int = field(default=0)
    vpc: int = field(default=0)
    role: str = ""  # its place in the block (ops.Loader.load_linear): output buffers, plans, profiles

    @property
    def nck(self) -> int:
        return self.in_ // self.vpc


@dataclass
class PartedWeight:
    """A fused matrix (ops.Loader.load_linear) whose tensors come in more than one format, held as
    its runs of one format side by side: llama.cpp's K-quant mixes (Q4_K_M, Q5_K_M, ...) keep
    attn_v in Q6_K beside Q4_K q and k on some layers (llama-quant.cpp use_more_bits).  Each part
    is a DeviceWeight of its own (its own kernels); the output is their outputs' columns in order
    (cuda_opset: each into a scratch buffer, then put_columns)."""
    parts: list
    role: str = ""

    @property
    def out(self) -> int:
        return sum(P.out for P in self.parts)

    @property
    def in_(self) -> int:
        return self.parts[0].in_

    @property
    def fmt(self) -> str:
        return "+".join(P.fmt for P in self.parts)

    @property
    def nbytes(self) -> int:
        return sum(P.nbytes for P in self.parts)


def format_runs(tensors: list, interleave: bool = False) -> list[list]:
    """The tensors of one fused matrix in runs of one format (one run: one DeviceWeight).  An
    interleaved pair (gate|up, whose rows alternate) must share a format."""
    runs: list[list] = []
    for t in tensors:
        if runs and runs[-1][0].fmt == t.fmt:
            runs[-1].append(t)
        else:
            runs.append([t])
    if interleave and len(runs) > 1:
        names = ", ".join(f"{t.name} {t.fmt}" for t in tensors)
        raise ValueError(f"a gate/up pair in two formats ({names}) is not supported")
    return runs


class RepackMemo:
    """repack_host of source tensors that recur while a model loads.  Random-weight models
    (synthetic.py) share one set of arrays across layers: each is repacked on its second sighting
    and kept, not repacked per layer.  A checkpoint's tensors never recur, so nothing of theirs
    is kept but references to the source arrays: a key is the arrays' ids, and an id stays its
    array's while the memo holds it (temporaries such as one GPU's share of a matrix are freed
    and their ids reused otherwise).  For loading only: after ``close`` it keeps nothing and
    repacks every call (the expert file tier's images: a memo there would keep every expert it
    ever fetched in host memory)."""

    def __init__(self):
        self._seen: dict = {}  # key -> the source arrays
        self._planes: dict = {}  # key -> HostPlanes, from a key's second sighting
        self._open = True

    def repack(self, qtensors: list, interleave: bool = False) -> HostPlanes:
        if not self._open:
            return repack_host(list(qtensors), interleave)
        raws = tuple(t.raw for t in qtensors)
        key = tuple(id(a) for a in raws) + (interleave,)
        hp = self._planes.get(key)
        if hp is None:
            hp = repack_host(list(qtensors), interleave)
            if key in self._seen:
                self._planes[key] = hp
            else:
                self._seen[key] = raws
        return hp

    def close(self) -> None:
        self._open = False
        self._seen.clear()
        self._planes.clear()


def upload(qtensors: list, host: HostPlanes | None = None) -> DeviceWeight:
    """QTensors (one format, one width) -> DeviceWeight of their rows concatenated."""
    import cupy as cp

    hp = host if host is not None else repack_host(list(qtensors))
    dev = lambda a: None if a is None else cp.asarray(a)  # noqa: E731
    planes = [hp.q, hp.h, hp.s, hp.d, hp.gscale]
    gsu = set(hp.global_scales)
    gs = (hp.global_scales[0] if len(gsu) == 1 else hp.global_scales) if hp.global_scales else 1.0
    return DeviceWeight(
        hp.fmt, hp.out, hp.in_, dev(hp.q), dev(hp.h), dev(hp.s), dev(hp.d), dev(hp.gscale), gs,
        int(sum(a.nbytes for a in planes if a is not None)), fmt_id(hp.fmt), vpc(hp.fmt),
    )
