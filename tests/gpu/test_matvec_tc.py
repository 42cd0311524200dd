"""The tensor-core decode matvec (kernels/matvec_tc.cu: NVFP4 on the float contract, F16) against
kernel_refs.matvec_ref: every prologue and epilogue, rows bit-identical for m = 1..8, both tile
geometries (cuda_linear.tc_geometry: by row count), the bf16-activation flag; the shapes run
where production picks the kernel (F16 up to 4096 rows, NVFP4 with act_quant=False)."""
import numpy as np
import pytest

from bw24chat.backends import cuda_linear as cl
from bw24chat.backends import cuda_weights as cw
from bw24chat.backends.kernel_refs import bf16_round, matvec_ref_input
from tests.gpu.test_dequant_embed import block_of, make_weight
from tests.gpu.test_matvec import EPS, check_close


def run(cp, W, x, m, pro="none", epi="store", norm_w=None, init=None, act_bf16=False):
    n_y = W.out // 2 if epi == "swiglu" else W.out
    out = cp.full((m, n_y), cp.nan, dtype=cp.float32) if init is None else cp.asarray(init)
    cl.matvec(W, cp.asarray(np.ascontiguousarray(x[:m])), out, m, prologue=pro, epilogue=epi,
              norm_w=None if norm_w is None else cp.asarray(norm_w), eps=EPS, act_quant=False, act_bf16=act_bf16)
    return cp.asnumpy(out)


@pytest.mark.parametrize("fmt,rows", [("NVFP4", 90), ("NVFP4", 4100), ("NVFP4", 8200), ("F16", 70), ("F16", 4096)])
@pytest.mark.parametrize("pro", ["none", "rmsnorm", "swiglu"])
def test_matvec_tc_matches_reference_and_is_m_invariant(cp, rng, fmt, rows, pro):
    ts, w = make_weight(rng, fmt, rows=(rows,), nblocks=2048 // block_of(fmt) + 1)
    W = cw.upload(ts)
    assert cl.matvec_impl(W, False) == "tc"
    in_ = W.in_
    x = rng.standard_normal((8, 2 * in_ if pro == "swiglu" else in_)).astype(np.float32)
    norm_w = rng.uniform(0.5, 1.5, in_).astype(np.float32) if pro == "rmsnorm" else None
    y8 = run(cp, W, x, 8, pro, norm_w=norm_w)
    check_close(y8, matvec_ref_input(x, pro, in_, norm_w, EPS), w)
    for m in (1, 3, 5):
        assert np.array_equal(run(cp, W, x, m, pro, norm_w=norm_w).view(np.uint32), y8[:m].view(np.uint32)), m
    xb = bf16_round(matvec_ref_input(x, pro, in_, norm_w, EPS).astype(np.float32)).astype(np.float64)
    check_close(run(cp, W, x, 8, pro, norm_w=norm_w, act_bf16=True), xb, w)


@pytest.mark.parametrize("fmt", ["NVFP4", "F16"])
def test_matvec_tc_add_and_swiglu_epilogues(cp, rng, fmt):
    n = int(rng.integers(20, 60))
    ts, w = make_weight(rng, fmt, rows=(n, n), nblocks=4)
    W = cw.upload(ts, interleave=True)
    x = rng.standard_normal((3, W.in_)).astype(np.float32)
    res = rng.standard_normal((3, W.out)).astype(np.float32)
    y = run(cp, W, x, 3)
    assert np.array_equal(run(cp, W, x, 3, epi="add", init=res), (res + y).astype(np.float32))
    g, u = y[:, 0::2].astype(np.float64), y[:, 1::2].astype(np.float64)
    assert np.allclose(run(cp, W, x, 3, epi="swiglu"), g / (1.0 + np.exp(-g)) * u, rtol=1e-5, atol=1e-6)
