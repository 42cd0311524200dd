"""The arithmetic gemm_i8.cu gemm_i8 implements, checked in NumPy without a GPU: from the QX rows
(kernel_refs.qx_ref: the x codes h, l and exponent e per 32-block) and the resident Q8_0 planes
(cuda_weights.repack_host: signed int8 codes, one f16 scale per block), the per-block fold
sum_b float32(256 H + L) * (d * 2^(e-8)), with H, L the exact integer dots of the codes, equals
act_quant_ref(x) @ W.T (the integer-dot contract) to f32 rounding."""
import numpy as np

from bw24chat.backends import cuda_weights as cw
from bw24chat.backends.kernel_refs import act_quant_ref, qx_ref
from bw24chat.quantize import quantize_q8_0


def gemm_i8_fold(qx: np.ndarray, codes: np.ndarray, d: np.ndarray, n: int) -> np.ndarray:
    """qx uint32 [T, 5n/8], codes int8 [O, n], d float32 [O, n/32] -> y float32 [T, O], the
    kernel's operations in its order (f32 products and FMA emulated in float64, then rounded)."""
    T, nb = qx.shape[0], n // 32
    h = qx[:, :n // 4].copy().view(np.int8).astype(np.int64).reshape(T, nb, 32)
    lo = qx[:, n // 4:n // 2].copy().view(np.int8).astype(np.int64).reshape(T, nb, 32)
    e = qx[:, n // 2:].copy().view(np.int32).reshape(T, nb, 4)[..., 0]
    q = codes.astype(np.int64).reshape(-1, nb, 32)
    acc = np.zeros((T, q.shape[0]), np.float32)
    for b in range(nb):
        H, L = h[:, b] @ q[:, b].T, lo[:, b] @ q[:, b].T  # exact integers
        v = (256 * H + L).astype(np.float32)  # the kernel's I2F
        s = (d[None, :, b] * np.ldexp(np.float32(1), e[:, b, None] - 8)).astype(np.float32)  # exact
        acc = (v.astype(np.float64) * s + acc).astype(np.float32)  # one FMA rounding
    return acc


def test_the_fold_is_the_integer_dot_contract():
    rng = np.random.default_rng(11)
    n, O, T = 384, 37, 5
    w = rng.standard_normal((O, n)).astype(np.float32) * rng.uniform(0.01, 1.0, (O, 1)).astype(np.float32)
    qt = quantize_q8_0(w)
    hp = cw.repack_host([qt])
    codes = hp.q.reshape(O, n).view(np.int8)
    d = hp.s.reshape(O, -1).copy().view("<f2").astype(np.float32)  # one f16 scale per block
    wd = cw.decode_planes(hp)  # the exact resident values
    assert np.array_equal(wd, (codes.astype(np.float32).reshape(O, -1, 32) * d[..., None]).reshape(O, n))
    x = (rng.standard_normal((T, n)) * rng.uniform(0.01, 50.0, (T, 1))).astype(np.float32)
    got = gemm_i8_fold(qx_ref(x), codes, d, n)
    xq = act_quant_ref(x).astype(np.float64)
    ref = xq @ wd.astype(np.float64).T
    bound = np.abs(xq) @ np.abs(wd.astype(np.float64)).T
    assert np.all(np.abs(got - ref) <= 2e-6 * bound)
