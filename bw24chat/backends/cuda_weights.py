"""Weights on the device in their quantized form, repacked at load for coalesced 16-byte loads.

The device layout (kernels/formats.cuh is the contract) cuts every row into 16-byte *chunks*
of VPC values: F32 4, F16/BF16 8, Q8_0 16, and 32 for every 4-bit-based format, whose chunk is
a "nibble chunk" (byte j: value j in the low nibble, value 16+j in the high one; the E2M1
formats NVFP4 and MXFP4 instead four "selector words", pack_selector_words; Q2_K and Q3_K an
8-byte chunk of 2-bit codes, pack_h6's layout, so that they keep their 2.6 / 3.4 bits per weight).  Scales and
high bits live in separate planes (``s``, ``d``, ``h``), so a warp's chunk loads are one
contiguous 512-byte run.  Several tensors of one format and width are concatenated along the
output rows (the runner fuses Wq|Wk|Wv and Wgate|Wup).

``upload`` copies a checkpoint's blocks to the device as they stand and repacks them there
(kernels/repack.cu); ``repack_host`` builds the same planes with NumPy (no GPU needed: the
references, the tests, an expert's image on the host); ``decode_planes`` is the NumPy
mirror of the device decoder (same integer tricks, same float op order) and is tested bit for
bit against ``bw24chat.quants.dequantize`` (tests/test_repack.py).
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


def check_width(fmt: str, in_: int) -> None:
    """Refuse a format without a CUDA layout, or rows that are not whole chunks and blocks."""
    if fmt not in FORMATS:
        raise NotImplementedError(f"no CUDA layout for {fmt}")
    V = vpc(fmt)
    if in_ % V:
        raise ValueError(f"{fmt}: in={in_} must be a multiple of {V} (one 16-byte chunk)")
    if fmt not in FLOAT_FORMATS:
        bs = quants.block_info(quants.T[fmt])[0]
        if in_ % bs:
            raise ValueError(f"{fmt}: in={in_} must be a multiple of the block ({bs})")


def repack_one(fmt: str, raw: np.ndarray, out: int, in_: int) -> dict:
    """The planes of one tensor (uint8 arrays with `out` rows)."""
    check_width(fmt, in_)
    u8 = _rows(raw, out)
    if fmt in FLOAT_FORMATS:
        return {"q": u8}
    bs, ts = quants.block_info(quants.T[fmt])
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
    fmt, in_, out = fused_shape(qtensors, interleave)
    parts, gs = [], []
    for t in qtensors:
        parts.append(repack_one(fmt, t.raw, int(t.shape[0]), in_))
        gs.append(np.full(int(t.shape[0]), np.float32(t.global_scale), np.float32))

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
    return hp


def fused_shape(qtensors: list, interleave: bool = False) -> tuple[str, int, int]:
    """(format, input width, output rows) of the matrix QTensors fuse into (repack_host's and
    upload's rule: one format and width, 2-D; equal row counts to interleave; a global scale
    only for NVFP4)."""
    if not qtensors:
        raise ValueError("nothing to upload")
    fmt, in_ = qtensors[0].fmt, int(qtensors[0].shape[-1])
    for t in qtensors:
        if t.fmt != fmt or int(t.shape[-1]) != in_ or len(t.shape) != 2:
            raise ValueError(f"upload fuses 2-D tensors of one format and width: {t.name} is {t.fmt} {t.shape}")
    if interleave and len({int(t.shape[0]) for t in qtensors}) != 1:
        raise ValueError("interleave needs tensors with equal row counts")
    if fmt != "NVFP4" and any(t.global_scale != 1.0 for t in qtensors):
        raise ValueError("a global scale is only supported for NVFP4")
    check_width(fmt, in_)
    return fmt, in_, sum(int(t.shape[0]) for t in qtensors)


# Bytes per raw block (quants.block_info; the float formats: a 16-byte chunk) and per block in each
# resident plane q, h, s, d: kernels/repack.cu's TS, Q_PB, H_PB, S_PB, D_PB (0: no such plane)
PLANE_BYTES = {
    "F32": (16, 16, 0, 0, 0), "F16": (16, 16, 0, 0, 0), "BF16": (16, 16, 0, 0, 0),
    "Q8_0": (34, 32, 0, 2, 0), "Q4_0": (18, 16, 0, 2, 0), "Q4_1": (20, 16, 0, 4, 0),
    "Q5_0": (22, 16, 4, 2, 0), "Q5_1": (24, 16, 4, 4, 0),
    "Q4_K": (144, 128, 0, 16, 0), "Q5_K": (176, 128, 32, 16, 0), "Q6_K": (210, 128, 64, 16, 2),
    "NVFP4": (36, 32, 0, 4, 0), "MXFP4": (17, 16, 0, 1, 0),
    "Q2_K": (84, 64, 0, 16, 4), "Q3_K": (110, 64, 32, 16, 2),
}
PLANES = ("q", "h", "s", "d", "gscale")  # a matrix's planes, in kernel-argument order


def raw_row_bytes(fmt: str, in_: int) -> int:
    """Bytes of one row of ``in_`` values as the checkpoint holds them."""
    if fmt in FLOAT_FORMATS:
        return in_ * (4 if fmt == "F32" else 2)
    bs, ts = quants.block_info(quants.T[fmt])
    return in_ // bs * ts


def plane_shapes(fmt: str, rows: int, in_: int) -> dict:
    """name -> (shape, dtype) of the planes repack_host makes for ``rows`` rows of ``in_`` values
    (uint8 rows of the plane's bytes; NVFP4's gscale: float32 per row), in PLANES order."""
    check_width(fmt, in_)
    ts, *per_block = PLANE_BYTES[fmt]
    nb = raw_row_bytes(fmt, in_) // ts
    out = {name: ((rows, nb * b), np.uint8) for name, b in zip(PLANES, per_block) if b}
    if fmt == "NVFP4":
        out["gscale"] = ((rows,), np.float32)
    return out


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


def repack_on_device(t, raw: int, planes: dict, row_mul: int = 1, row_add: int = 0, rows: int | None = None) -> None:
    """QTensor t's blocks as the checkpoint holds them, at device address ``raw`` (its first
    ``rows`` rows, default all), repacked into the planes at the device addresses ``planes``
    (name -> address; row r becomes plane row r * row_mul + row_add) on the current stream:
    kernels/repack.cu, repack_host's bytes."""
    from .kernel_build import get_kernel

    rows = int(t.shape[0]) if rows is None else rows
    row_bytes = raw_row_bytes(t.fmt, int(t.shape[-1]))
    nb = row_bytes // PLANE_BYTES[t.fmt][0]
    args = (np.uint64(raw), np.int32(rows), np.int32(nb), np.int64(row_bytes),
            *(np.uint64(planes.get(name, 0)) for name in PLANES), np.float32(t.global_scale),
            np.int32(row_mul), np.int32(row_add))
    get_kernel("repack", "repack_blocks", FMT=fmt_id(t.fmt))((max(1, min(-(-rows * nb // 256), 4096)),), (256,), args)


def raw_blocks(t) -> np.ndarray:
    """QTensor t's bytes as the checkpoint holds them (uint8, rows x raw_row_bytes), checked."""
    data = np.ascontiguousarray(t.raw).reshape(-1).view(np.uint8)
    want = int(t.shape[0]) * raw_row_bytes(t.fmt, int(t.shape[-1]))
    if data.nbytes != want:
        raise ValueError(f"{t.name}: {data.nbytes} bytes for {tuple(t.shape)} {t.fmt} ({want} expected)")
    return data


UPLOAD_CHUNK = 64 << 20  # raw bytes on the device at a time while a matrix uploads (beside its planes)


def upload(qtensors: list, *, interleave: bool = False) -> DeviceWeight:
    """QTensors (one format, one width) -> DeviceWeight of their rows concatenated (interleaved
    with interleave=True: repack_host's rule): each tensor's blocks copied to the device as they
    stand and repacked there (repack_on_device; repack_host's NumPy route runs at 0.03-0.3 GB/s
    on the quantized formats, minutes for a large model)."""
    import cupy as cp

    fmt, in_, out = fused_shape(qtensors, interleave)
    planes = {name: cp.empty(shape, dt) for name, (shape, dt) in plane_shapes(fmt, out, in_).items()}
    ptrs = {name: int(a.data.ptr) for name, a in planes.items()}
    row_bytes, n = raw_row_bytes(fmt, in_), len(qtensors)
    step = max(1, UPLOAD_CHUNK // row_bytes)  # rows a piece; the raw scratch is reused piece by piece
    scratch = cp.empty(min(step, max(int(t.shape[0]) for t in qtensors)) * row_bytes, cp.uint8)
    stream = cp.cuda.get_current_stream()
    r0 = 0
    for j, t in enumerate(qtensors):
        data, rows = raw_blocks(t), int(t.shape[0])
        for a in range(0, rows, step):
            b = min(rows, a + step)
            scratch[:(b - a) * row_bytes].set(data[a * row_bytes:b * row_bytes], stream=stream)  # after the last repack
            repack_on_device(t, int(scratch.data.ptr), ptrs, n if interleave else 1,
                             a * n + j if interleave else r0 + a, rows=b - a)
        r0 += rows
    gs: float | tuple = 1.0
    if fmt == "NVFP4":
        scales = tuple(float(t.global_scale) for t in qtensors)
        gs = scales[0] if len(set(scales)) == 1 else scales
    return DeviceWeight(fmt, out, in_, planes["q"], planes.get("h"), planes.get("s"), planes.get("d"), planes.get("gscale"),
                        gs, int(sum(a.nbytes for a in planes.values())), fmt_id(fmt), vpc(fmt))
