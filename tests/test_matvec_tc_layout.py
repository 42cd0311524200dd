"""CPU mirror of kernels/matvec_tc.cu's data movement (NVFP4 and F16 on tensor cores): the
per-lane loads, the E2M1 -> E4M3 byte trick, the scale handling and the MMA k-slot order are
replayed in NumPy, lane by lane, and the resulting products must equal x @ W.T of the reference
dequantization.  A wrong slot, nibble or scale mapping fails here without a GPU; the GPU tests
(tests/gpu/test_matvec_tc.py) then check the kernel itself."""
import numpy as np
import pytest

from bw24chat.backends import cuda_weights as cw
from bw24chat.loaders.tensor import FP8_E4M3
from tests.test_repack import random_qtensor


def e4m3_bytes(w: np.uint32, h: int) -> np.uint32:
    """tc_afrag: the four E2M1 codes of half h of a selector word (formats.cuh: code j at bits
    16h+4j) spread one per byte by a byte permute, then magnitude -> E4M3 bits 2-4, sign -> bit 7."""
    v = (int(w) >> (16 * h)) & 0xFFFF
    a, b = v & 0x0F0F, (v >> 4) & 0x0F0F
    t = (a & 0xFF) | ((b & 0xFF) << 8) | ((a >> 8) << 16) | ((b >> 8) << 24)  # __byte_perm(a, b, 0x5140)
    return np.uint32((((t << 2) & 0x1C1C1C1C) | ((t << 4) & 0x80808080)) & 0xFFFFFFFF)


def scale_value(sw: int, c: int, h: int) -> float:
    """tc_scales: E4M3 * 2^6 as the kernel's f16, from a repacked scale byte (bit 7 clear, the
    reference's zero-decoding 0x7F stored as 0x00: cuda_weights.nvfp4_scale_bytes)."""
    b = (int(sw) >> (16 * (c & 1) + 8 * h)) & 0xFF
    assert b < 0x80
    return float(FP8_E4M3[b]) * 64.0 if b != 0x7F else 480.0 * 64.0  # 0x7F here is 0xFF's 240 * 2


def replay_mmas(out: int, nck: int, ksteps: int, x: np.ndarray, a_values, x_group) -> np.ndarray:
    """The MMA sequence of matvec_tc with exact (float64) arithmetic: for every 32-row tile, its
    two 16-row MMA tiles, super-step ss (chunks 4 ss + t) and k-step ks, lane (g, t) fills A rows
    g and g+8 at k-slots {2t, 2t+1, 2t+8, 2t+9} with a_values(row, c, ks) (4 numbers) and B
    column g with x at positions 4 * x_group(c, ks) + 0..3.  Returns y[m, out]."""
    m = x.shape[0]
    y = np.zeros((m, out))
    slots_of = lambda t: [2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9]  # noqa: E731
    for row0 in range(0, out, 32):
        for tile in range(2):
            for ss in range(-(-nck // 4)):  # any warp order: exact arithmetic here
                for ks in range(ksteps):
                    A = np.zeros((16, 16))
                    B = np.zeros((16, m))
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        c = ss * 4 + t
                        if c >= nck:
                            continue
                        for r8 in (0, 8):
                            A[g + r8, slots_of(t)] = a_values(min(row0 + 16 * tile + g + r8, out - 1), c, ks)
                        B[slots_of(t), :] = x[:, 4 * x_group(c, ks) + np.arange(4)].T
                    rows = np.arange(row0 + 16 * tile, row0 + 16 * tile + 16)
                    ok = rows < out
                    y[:, rows[ok]] += (A @ B).T[:, ok]
    return y


def emulate(hp, x: np.ndarray) -> np.ndarray:
    """y[m, o] as matvec_tc computes it for NVFP4: k-step ks = 4h + wi takes the E4M3 bytes of
    word wi's low (h = 0) or high (h = 1) nibbles, pre-scaled by block 2c + h's scale."""
    out, in_ = hp.out, hp.in_
    nck = in_ // 32
    q = hp.q.reshape(out, nck, 16)
    s32 = hp.s.reshape(out, -1).view("<u4").reshape(out, nck // 2)

    def a_values(row, c, ks):
        h, wi = ks >> 2, ks & 3
        e4 = int(e4m3_bytes(q[row, c, 4 * wi:4 * wi + 4].view("<u4")[0], h))
        return [float(FP8_E4M3[(e4 >> (8 * j)) & 0xFF]) * scale_value(s32[row, c >> 1], c, h) for j in range(4)]

    y = replay_mmas(out, nck, 8, x, a_values, lambda c, ks: c * 8 + 4 * (ks >> 2) + (ks & 3))
    return y * hp.gscale[None, :].astype(np.float64)


def test_e4m3_byte_trick_is_e2m1_times_2_pow_minus_6():
    e2m1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    for code in range(16):
        want = (-1 if code & 8 else 1) * e2m1[code & 7] * 2.0**-6
        lo = int(e4m3_bytes(np.uint32(code), 0)) & 0xFF
        hi = int(e4m3_bytes(np.uint32(code << 16), 1)) & 0xFF
        assert float(FP8_E4M3[lo]) == want and float(FP8_E4M3[hi]) == want


def emulate_f16(hp, x: np.ndarray) -> np.ndarray:
    """matvec_tc for F16 weights: a chunk is 8 values in natural order; k-step ks puts
    words 2ks (values 4ks, 4ks+1) in slots 2t, 2t+1 and 2ks+1 (values 4ks+2, 4ks+3) in 2t+8, 2t+9,
    B takes x group 2c + ks of the staged uint4s."""
    out, in_ = hp.out, hp.in_
    nck = in_ // 8
    words = hp.q.reshape(out, nck, 16).view("<u4").reshape(out, nck, 4)
    bits = hp.q.reshape(out, nck, 16).view("<u2").reshape(out, nck, 8)

    def a_values(row, c, ks):
        lo, hi = words[row, c, 2 * ks], words[row, c, 2 * ks + 1]
        halves = np.array([lo & 0xFFFF, lo >> 16, hi & 0xFFFF, hi >> 16], dtype=np.uint16)
        assert np.array_equal(halves, bits[row, c, 4 * ks:4 * ks + 4])  # a word is a value pair, low first
        return halves.view(np.float16).astype(np.float64)

    return replay_mmas(out, nck, 2, x, a_values, lambda c, ks: 2 * c + ks)


@pytest.mark.parametrize("fmt,rows,in_", [("NVFP4", 37, 256), ("NVFP4", 64, 576), ("NVFP4", 5, 128),
                                         ("F16", 37, 256), ("F16", 5, 40), ("F16", 64, 96)])
def test_matvec_tc_mapping_equals_reference(fmt, rows, in_):
    rng = np.random.default_rng()
    ts = [random_qtensor(rng, fmt, rows, in_, "w", 0.75)]
    hp = cw.repack_host(ts)
    x = rng.standard_normal((3, in_))
    w = ts[0].dequantize().astype(np.float64)
    got = (emulate if fmt == "NVFP4" else emulate_f16)(hp, x)
    ref = x @ w.T
    assert np.allclose(got, ref, rtol=1e-12, atol=1e-9 * np.abs(ref).max())
