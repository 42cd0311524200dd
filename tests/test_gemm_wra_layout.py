"""CPU mirror of kernels/gemm_wgmma.cu gemm_wra's fragment decoding: for every weight row, k tile,
lane (t = lane % 4) and k16 step, the four A-fragment values the thread builds from the resident
planes (the words it reads, the PRMT selectors, the E2M1 / E4M3 tables and bit tricks of the NVFP4
decoder, the byte and scale choice of Q8_0, the nibble choice of Q4_K) must be the weights at k =
16 s + {2t, 2t + 1, 2t + 8, 2t + 9} (PTX ISA wgmma A fragment: register 0 holds k 2t..2t+1 of
row g, register 2 k 2t+8..2t+9).  A wrong word, byte, nibble, table entry or scale fails here
without a GPU; tests/gpu/test_gemm.py then checks the kernel's bits against the dequantization
pass."""
import struct

import numpy as np
import pytest

from bw24chat.backends import cuda_weights as cw
from tests.test_repack import random_qtensor


def prmt(a: int, b: int, sel: int) -> int:
    """PTX prmt.b32 (default mode): byte i of the result is byte (sel >> 4i) & 7 of {b, a}, or
    that byte's sign replicated when bit 3 of the selector nibble is set."""
    src = (a & 0xFFFFFFFF).to_bytes(4, "little") + (b & 0xFFFFFFFF).to_bytes(4, "little")
    out = 0
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        v = src[nib & 7]
        if nib & 8:
            v = 0xFF if v & 0x80 else 0
        out |= v << (8 * i)
    return out


def bf16(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", (bits & 0xFFFF) << 16))[0]


def word(row: bytes, off: int) -> int:
    return int.from_bytes(row[off:off + 4], "little")


def wanted_k(t: int) -> list[int]:
    return [2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9]


def nvfp4_fragment(codes: bytes, sw: int, t: int, s: int) -> list[float]:
    """wra_fragments (NVFP4) for one row, k16 step s and lane t: e2m1x4_bf16 on the selector of
    byte 2h + t%2 of words t/2 and 2 + t/2 of chunk s/2, times wra_scale (the E4M3 byte as bf16
    bits << 4, i.e. E4M3 x 2^-120; the tables hold 2^120 x E2M1)."""
    c, h = s >> 1, s & 1
    qa, qb = word(codes, 16 * c + 4 * (t >> 1)), word(codes, 16 * c + 8 + 4 * (t >> 1))
    b = 2 * h + (t & 1)
    sel = prmt(qa, qb, b | ((4 + b) << 4)) & 0xFFFF
    idx = sel & 0x7777
    lo = prmt(0xC0800000, 0xC0804000, idx)
    hp = prmt(0x7B7B7B00, 0x7C7C7C7C, idx)
    hn = prmt(0xFBFBFB00, 0xFCFCFCFC, idx)
    hi = prmt(hp, hn, ((sel & 0x8888) >> 1) | 0x3210)
    w01, w23 = prmt(lo, hi, 0x5140), prmt(lo, hi, 0x7362)
    sc = prmt(sw, 0, 0x4040 | s | (s << 8)) << 4
    scale = bf16(sc)  # the low half; the kernel multiplies both halves by the same value
    assert bf16(sc >> 16) == scale
    return [bf16(w01) * scale, bf16(w01 >> 16) * scale, bf16(w23) * scale, bf16(w23 >> 16) * scale]


def wra_bytes(codes: bytes, chunk_off: int, t: int) -> list[int]:
    """wra_bytes: bytes 2t, 2t + 1 of word t/2 and of word 2 + t/2 of a 16-byte chunk."""
    p = 2 * (t & 1)
    pick = p | ((p + 1) << 4) | ((p + 4) << 8) | ((p + 5) << 12)
    w = prmt(word(codes, chunk_off + 4 * (t >> 1)), word(codes, chunk_off + 8 + 4 * (t >> 1)), pick)
    return [(w >> (8 * j)) & 0xFF for j in range(4)]


@pytest.mark.parametrize("fmt", ["NVFP4", "Q8_0", "Q4_K"])
def test_wra_fragments_hold_the_weights_of_their_k_slots(fmt):
    rng = np.random.default_rng(17)
    rows, n_in = 24, 512
    t_ = random_qtensor(rng, fmt, rows, n_in)
    hp = cw.repack_host([t_])
    W = cw.decode_planes(hp)  # the exact values decode_exact gives (what the pass turns into bf16)
    q = hp.q.view(np.uint8).reshape(rows, -1)
    s8 = hp.s.view(np.uint8).reshape(rows, -1)
    row_bytes = 32 if fmt != "Q8_0" else 64  # codes per row and 64-wide k tile
    chunk_values: dict = {}  # Q4_K: (row, chunk) -> {code: value}
    for r in range(rows):
        for kt in range(n_in // 64):
            codes = q[r, row_bytes * kt: row_bytes * (kt + 1)].tobytes()
            for t in range(4):
                for s in range(4):
                    k = [64 * kt + 16 * s + j for j in wanted_k(t)]
                    if fmt == "NVFP4":
                        sw = int.from_bytes(s8[r, 4 * kt: 4 * kt + 4].tobytes(), "little")
                        got = nvfp4_fragment(codes, sw, t, s)
                        assert got == [float(W[r, kk]) for kk in k], (r, kt, t, s)
                    elif fmt == "Q8_0":
                        sw = int.from_bytes(s8[r, 4 * kt: 4 * kt + 4].tobytes(), "little")
                        scale = float(np.frombuffer(struct.pack("<H", (sw & 0xFFFF) if s < 2 else sw >> 16), "<f2")[0])
                        vals = [((b ^ 0x80) - 128) * scale for b in wra_bytes(codes, 16 * s, t)]
                        assert np.array_equal(np.float32(vals), W[r, k]), (r, kt, t, s)
                    else:  # Q4_K: the nibbles; W = a q + b per 32-value chunk, so W must be a function of them
                        c, h = s >> 1, s & 1
                        nib = [(b >> (4 * h)) & 0xF for b in wra_bytes(codes, 16 * c, t)]
                        for qv, kk in zip(nib, k):
                            seen = chunk_values.setdefault((r, kk // 32), {})
                            assert seen.setdefault(qv, float(W[r, kk])) == float(W[r, kk]), (r, kk, qv)
    if fmt == "Q4_K":  # every chunk was visited, and most chunks (a != 0) map distinct codes to distinct values
        assert len(chunk_values) == rows * n_in // 32
        assert np.mean([len(set(v.values())) == len(v) for v in chunk_values.values()]) > 0.9


def test_the_mirror_uses_the_kernels_constants():
    """The tables and selectors replayed above are the ones in kernels/gemm_wgmma.cu (a mirror that
    drifted from the kernel would test nothing)."""
    from bw24chat.backends.kernel_build import load_source

    src = load_source("gemm_wgmma")
    body = lambda name: src[src.index(name):src.index("\n}\n", src.index(name))]  # noqa: E731
    e2m1 = body("BW24_DEVICE void e2m1x4_bf16(")
    for const in ("0xC0800000u, 0xC0804000u", "0x7B7B7B00u, 0x7C7C7C7Cu", "0xFBFBFB00u, 0xFCFCFCFCu", "0x7777u",
                  "((sel & 0x8888u) >> 1) | 0x3210u", "0x5140u", "0x7362u"):
        assert const in e2m1, const
    assert "0x4040u | (uint32_t)s | ((uint32_t)s << 8)) << 4" in body("BW24_DEVICE uint32_t wra_scale(")
    assert "p | ((p + 1) << 4) | ((p + 4) << 8) | ((p + 5) << 12)" in body("BW24_DEVICE uint32_t wra_pick(")
    assert "b | ((4 + b) << 4)" in body("BW24_DEVICE void wra_fragments(")
