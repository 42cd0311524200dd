"""CPU mirror of kernels/matvec.cu matvec_tc's data movement (NVFP4 on tensor cores): the
per-lane loads, the E2M1 -> E4M3 byte trick, the scale handling and the MMA k-slot order are
replayed in NumPy, lane by lane, and the resulting products must equal x @ W.T of the reference
dequantization.  A wrong slot, nibble or scale mapping fails here without a GPU; the GPU tests
(tests/gpu/test_matvec.py) then check the kernel itself."""
import numpy as np
import pytest

from bw24chat.backends import cuda_weights as cw
from bw24chat.loaders.tensor import FP8_E4M3
from tests.test_repack import random_qtensor


def e4m3_bytes(w: np.uint32, h: int) -> np.uint32:
    """tc_afrag: four E2M1 nibbles (low nibbles if h == 0, else high) -> E4M3 bytes."""
    w = np.uint32(w)
    if h:
        return np.uint32(((w >> np.uint32(2)) & np.uint32(0x1C1C1C1C)) | (w & np.uint32(0x80808080)))
    return np.uint32(((w << np.uint32(2)) & np.uint32(0x1C1C1C1C)) | ((w << np.uint32(4)) & np.uint32(0x80808080)))


def scale_value(sw: int, c: int, h: int) -> float:
    """tc_scales: E4M3 * 2^6 as the kernel's f16 (byte 0x7F -> 0; bit 7 ignored otherwise)."""
    b = (int(sw) >> (16 * (c & 1) + 8 * h)) & 0xFF
    if b == 0x7F:
        return 0.0
    return float(FP8_E4M3[b & 0x7F]) * 64.0


def emulate(hp, x: np.ndarray) -> np.ndarray:
    """y[m, o] as matvec_tc computes it, with exact (float64) arithmetic in place of the MMAs."""
    out, in_ = hp.out, hp.in_
    nck = in_ // 32
    nss = -(-nck // 4)
    q = hp.q.reshape(out, nck, 16)
    s32 = hp.s.reshape(out, -1).view("<u4").reshape(out, nck // 2)
    m = x.shape[0]
    y = np.zeros((m, out))
    for row0 in range(0, out, 32):
        for tile in range(2):
            for ss in range(nss):  # any warp order: exact arithmetic here
                for h in range(2):
                    for wi in range(4):
                        A = np.zeros((16, 16))
                        B = np.zeros((16, m))
                        for lane in range(32):
                            g, t = lane >> 2, lane & 3
                            c = ss * 4 + t
                            if c >= nck:
                                continue
                            for r8 in (0, 8):
                                row = min(row0 + 16 * tile + g + r8, out - 1)
                                word = q[row, c, 4 * wi:4 * wi + 4].view("<u4")[0]
                                e4 = int(e4m3_bytes(word, h))
                                vals = [float(FP8_E4M3[(e4 >> (8 * j)) & 0xFF]) * scale_value(s32[row, c >> 1], c, h) for j in range(4)]
                                A[g + r8, [2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9]] = vals
                            pos = c * 32 + 16 * h + 4 * wi + np.arange(4)
                            B[[2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9], :] = x[:, pos].T
                        rows = np.arange(row0 + 16 * tile, row0 + 16 * tile + 16)
                        ok = rows < out
                        y[:, rows[ok]] += (A @ B).T[:, ok]
    return y * hp.gscale[None, :].astype(np.float64)


@pytest.mark.parametrize("rows,in_", [(37, 256), (64, 576), (5, 128)])
def test_matvec_tc_mapping_equals_reference(rows, in_):
    rng = np.random.default_rng()
    ts = [random_qtensor(rng, "NVFP4", rows, in_, "w", 0.75)]
    hp = cw.repack_host(ts)
    x = rng.standard_normal((3, in_))
    w = ts[0].dequantize().astype(np.float64)
    got = emulate(hp, x)
    ref = x @ w.T
    assert np.allclose(got, ref, rtol=1e-12, atol=1e-9 * np.abs(ref).max())


def test_e4m3_byte_trick_is_e2m1_times_2_pow_minus_6():
    e2m1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    for code in range(16):
        want = (-1 if code & 8 else 1) * e2m1[code & 7] * 2.0**-6
        lo = int(e4m3_bytes(np.uint32(code), 0)) & 0xFF
        hi = int(e4m3_bytes(np.uint32(code << 4), 1)) & 0xFF
        assert float(FP8_E4M3[lo]) == want and float(FP8_E4M3[hi]) == want


def emulate_float16bit(hp, x: np.ndarray) -> np.ndarray:
    """matvec_tc for BF16/F16 weights: lane (g, t) of super-step ss loads chunk c = 4 ss + t (8
    values, natural order) of rows g and g+8; k-step ks puts words 2ks (values 4ks, 4ks+1) in
    slots 2t, 2t+1 and 2ks+1 (values 4ks+2, 4ks+3) in 2t+8, 2t+9, and B column g takes x at the same
    positions (x group 2c + ks of the staged uint4s).  Exact arithmetic in place of the MMAs."""
    out, in_ = hp.out, hp.in_
    nck = in_ // 8
    words = hp.q.reshape(out, nck, 16).view("<u4").reshape(out, nck, 4)
    bits = hp.q.reshape(out, nck, 16).view("<u2").reshape(out, nck, 8)
    m = x.shape[0]
    y = np.zeros((m, out))
    as_float = (lambda b: (b.astype(np.uint32) << 16).view(np.float32)) if hp.fmt == "BF16" else (lambda b: b.view(np.float16))
    for row0 in range(0, out, 32):
        for tile in range(2):
            for ss in range(-(-nck // 4)):
                for ks in range(2):
                    A = np.zeros((16, 16))
                    B = np.zeros((16, m))
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        c = ss * 4 + t
                        if c >= nck:
                            continue
                        slots = [2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9]
                        for r8 in (0, 8):
                            row = min(row0 + 16 * tile + g + r8, out - 1)
                            lo, hi = words[row, c, 2 * ks], words[row, c, 2 * ks + 1]
                            halves = np.array([lo & 0xFFFF, lo >> 16, hi & 0xFFFF, hi >> 16], dtype=np.uint16)
                            assert np.array_equal(halves, bits[row, c, 4 * ks:4 * ks + 4])  # word = value pair
                            A[g + r8, slots] = as_float(halves).astype(np.float64)
                        group = 2 * c + ks  # the staged uint4 index: positions 4*group .. +3
                        B[slots, :] = x[:, 4 * group + np.arange(4)].T
                    rows = np.arange(row0 + 16 * tile, row0 + 16 * tile + 16)
                    ok = rows < out
                    y[:, rows[ok]] += (A @ B).T[:, ok]
    return y


@pytest.mark.parametrize("fmt", ["BF16", "F16"])
@pytest.mark.parametrize("rows,in_", [(37, 256), (5, 40), (64, 96)])
def test_matvec_tc_float_mapping_equals_reference(fmt, rows, in_):
    rng = np.random.default_rng()
    ts = [random_qtensor(rng, fmt, rows, in_, "w", 0.75)]
    hp = cw.repack_host(ts)
    x = rng.standard_normal((3, in_))
    w = ts[0].dequantize().astype(np.float64)
    got = emulate_float16bit(hp, x)
    ref = x @ w.T
    assert np.allclose(got, ref, rtol=1e-12, atol=1e-9 * np.abs(ref).max())
