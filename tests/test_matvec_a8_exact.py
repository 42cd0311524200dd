"""The NumPy mirror of the integer-dot decode matvec's bits (kernel_refs.matvec_a8_exact), which
the SIMT kernel (matvec.cu ACT_Q8) and the int8 tensor-core kernel (matvec_i8.cu) must both equal
bit for bit (tests/gpu/test_matvec_i8.py): its FMA is one rounding, its product is the contract's
within the f32 accumulation, and the tensor-core kernel's split of the 32 chains over warps and
residues folds them in warp_sum's xor order."""
from fractions import Fraction

import numpy as np
import pytest

from bw24chat.backends import cuda_weights as cw
from bw24chat.backends import kernel_refs as kr
from tests.test_repack import random_qtensor


@pytest.fixture
def rng():
    seed = np.random.SeedSequence().entropy % (2**32)
    print(f"rng seed {seed}")
    return np.random.default_rng(seed)


def _f32_nearest(v: Fraction) -> np.float32:
    """The float32 nearest to v, ties to even (the exact reference of one rounding)."""
    c = np.float32(float(v))
    cands = [np.nextafter(c, np.float32(-np.inf)), c, np.nextafter(c, np.float32(np.inf))]
    dist = [abs(Fraction(float(x)) - v) for x in cands]
    best = min(dist)
    ties = [x for x, d in zip(cands, dist) if d == best]
    return ties[0] if len(ties) == 1 else next(x for x in ties if int(np.float32(x).view(np.uint32)) % 2 == 0)


def test_fma32_rounds_once(rng):
    """fma32 equals the exactly rounded a * b + c, also where rounding the sum to float64 first
    lands on a float32 halfway point (double rounding: 1 + 2^-23 + 2^-24 - 2^-70 must give
    1 + 2^-23, not the even 1 + 2^-22)."""
    a, b, c = np.float32(2.0**-24 * (1 + 2.0**-23)), np.float32(1 - 2.0**-23), np.float32(1 + 2.0**-23)
    assert np.float32(np.float64(a) * np.float64(b) + np.float64(c)) == np.float32(1 + 2.0**-22)  # the trap
    assert kr.fma32(a, b, c) == c
    n = 3000
    mag = lambda: (rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)).astype(np.float32)  # noqa: E731
    a, b = mag(), mag()
    c = np.where(rng.random(n) < 0.5, -(a.astype(np.float64) * b).astype(np.float32), mag())  # cancellation too
    got = kr.fma32(a, b, c)
    for i in range(n):
        want = _f32_nearest(Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i])))
        assert got[i] == want or (got[i] == 0 and want == 0), (a[i], b[i], c[i], got[i], want)


def _xor_tree(v: np.ndarray) -> np.ndarray:
    """warp_sum's order over the last axis (32 lanes): v[L] + v[L + o] for o = 16, 8, 4, 2, 1."""
    for o in (16, 8, 4, 2, 1):
        v = v[..., :o] + v[..., o:2 * o]
    return v[..., 0]


@pytest.mark.parametrize("kw", [1, 2, 4, 8])
def test_i8_chain_fold_is_the_xor_tree(rng, kw):
    """matvec_i8.cu: lane t of warp kg (of I8_KW per sub-tile) holds the chains of the residues
    r = kg + I8_KW a (a < 8 / I8_KW), i.e. SIMT lanes L = 4 r + t; it folds a with a + I8_NA / 2,
    then a + I8_NA / 4, ..., and the leaves 4 kg + t left are summed by the levels o = 2 I8_KW ..
    1 — warp_sum's xor tree over the 32 chains, bit for bit (signed zeros and cancellation too)."""
    na = 8 // kw
    v = (rng.standard_normal((4000, 32)) * 2.0 ** rng.integers(-20, 20, (4000, 32))).astype(np.float32)
    v[rng.random(v.shape) < 0.1] = np.float32(-0.0)
    v[:, 16:] = np.where(rng.random((4000, 16)) < 0.2, -v[:, :16], v[:, 16:])  # exact cancellations
    acc = v.reshape(-1, 8, 4)  # [.., residue r, t]: chain of SIMT lane 4 r + t
    per_warp = np.stack([acc[:, kg + kw * np.arange(na)] for kg in range(kw)], 1)  # [.., kg, a, t]
    o = na // 2
    while o >= 1:
        per_warp = np.concatenate([per_warp[:, :, :o] + per_warp[:, :, o:2 * o], per_warp[:, :, 2 * o:]], 2)
        o //= 2
    leaves = per_warp[:, :, 0].reshape(-1, 4 * kw)  # L = 4 kg + t
    o = 2 * kw
    while o >= 1:
        leaves = leaves[..., :o] + leaves[..., o:2 * o]
        o //= 2
    assert np.array_equal(leaves[..., 0].view(np.uint32), _xor_tree(v).view(np.uint32))


@pytest.mark.parametrize("fmt", list(kr.A8_FORMATS))
def test_matvec_a8_exact_is_the_contracts_product(rng, fmt):
    """Against the float64 product of the quantized activations (act_quant_ref) and the exact
    weights only the f32 accumulation's rounding remains (<= 1e-5 of sum |x||w|, as the GPU test
    of the kernels), odd row counts and chunk counts not a multiple of 32; each row is the same
    whatever the other rows (a NumPy truth the kernels must match)."""
    block = {"Q8_0": 32, "NVFP4": 64, "MXFP4": 32}.get(fmt, 256)
    in_ = block * int(rng.integers(1, 12 if block < 256 else 7))
    out = int(rng.integers(1, 40))
    t = random_qtensor(rng, fmt, out, in_, "w", 3.0e-2 if fmt == "NVFP4" else 1.0)
    hp = cw.repack_host([t])
    w = t.dequantize().astype(np.float64)
    x = (rng.standard_normal((5, in_)) * rng.uniform(0.01, 10, (5, 1))).astype(np.float32)
    x[1, :32] = 0.0  # an all-zero activation block
    y = kr.matvec_a8_exact(hp, x)
    assert y.dtype == np.float32 and y.shape == (5, out)
    xin = kr.act_quant_ref(x).astype(np.float64)
    ref, bound = xin @ w.T, np.abs(xin) @ np.abs(w).T
    assert np.all(np.abs(y - ref) <= 1e-5 * bound + 1e-30), np.max(np.abs(y - ref) / (bound + 1e-30))
    assert np.array_equal(kr.matvec_a8_exact(hp, x[3:4]).view(np.uint32), y[3:4].view(np.uint32))
