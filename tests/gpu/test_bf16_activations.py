"""The bf16-activation contract (opt-in, cuda_runner `activations="bf16"`): every matmul input
rounded to bf16 (round to nearest even) before the product, on both paths.

- decode matvec (act_bf16): the prologue's output rounded, then the format's contract — the
  float path's exact products on bf16(x), the integer-dot formats' act_quant(bf16(x)) — rows
  bit-identical for m = 1..8, and qx_out's codes are of the rounded outputs (the down
  projection's QX prologue gives the bits of prologue "none" on the same floats);
- prefill GEMM (act_bf16): bf16(x) as the one x plane, W split where its values are not bf16
  numbers, so it follows the exact weights to ~2^-17 and the decode rows to the integer codes'
  2^-16 of the block maximum; rows independent of T; gemm_i8 (Q8_0) quantizes the rounded x.
References: kernel_refs.bf16_round, act_quant_ref; NumpyBackend(act_bf16=True) for the prologue
formulas."""
import numpy as np
import pytest

from bw24chat.backends import cuda_weights as cw
from bw24chat.backends.kernel_refs import act_q8, act_quant_ref, bf16_round
from tests.gpu.test_dequant_embed import FMTS, block_of, make_weight
from tests.gpu.test_gemm import assert_same_bits, check, impls
from tests.gpu.test_matvec import _PICKED, EPS, geometry, prologue_f32


def contract_input(x, pro, in_, norm_w, fmt):
    """The product's input under the contract: the prologue in float32 with the kernels'
    formulas, rounded to bf16, then act_quant for the integer-dot formats."""
    xr = bf16_round(prologue_f32(x, pro, in_, norm_w))
    return (act_quant_ref(xr) if act_q8(fmt) else xr).astype(np.float64)


def matvec(cp, W, x, m, pro="none", epi="store", norm_w=None, act_bf16=True, **kw):
    from bw24chat.backends import cuda_linear as cl

    n = W.out // 2 if epi == "swiglu" else W.out
    out = cp.full((m, n), cp.nan, dtype=cp.float32)
    cl.matvec(W, cp.asarray(np.ascontiguousarray(x[:m])), out, m, prologue=pro, epilogue=epi,
              norm_w=None if norm_w is None else cp.asarray(norm_w), eps=EPS, act_bf16=act_bf16, **kw)
    return cp.asnumpy(out)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("pro", ["none", "rmsnorm", "swiglu"])
def test_matvec_bf16_contract_matches_reference_and_is_m_invariant(cp, rng, fmt, pro):
    nb = int(rng.integers(1, 4)) * (1024 // block_of(fmt) if block_of(fmt) <= 256 else 1) + int(rng.integers(0, 3))
    ts, w = make_weight(rng, fmt, rows=(int(rng.integers(40, 200)),), nblocks=nb)
    W = cw.upload(ts)
    ldx = 2 * W.in_ if pro == "swiglu" else W.in_
    x = rng.standard_normal((8, ldx)).astype(np.float32)
    norm_w = rng.uniform(0.5, 1.5, W.in_).astype(np.float32) if pro == "rmsnorm" else None
    y8 = matvec(cp, W, x, 8, pro, norm_w=norm_w)
    xin = contract_input(x, pro, W.in_, norm_w, fmt)
    ref = xin @ w.astype(np.float64).T
    bound = np.abs(xin) @ np.abs(w.astype(np.float64)).T
    # the float32 prologue may land one ulp from NumpyBackend's, which can move a bf16 rounding:
    # 2^-8 of one input at most, inside the bound below
    assert np.all(np.abs(y8 - ref) <= 4e-3 * bound + 1e-30), np.max(np.abs(y8 - ref) / (bound + 1e-30))
    for m in (1, 3):
        assert_same_bits(y8[:m], matvec(cp, W, x, m, pro, norm_w=norm_w))
    # the flag changes the input: the f32 contract differs from it on random data
    assert not np.array_equal(y8, matvec(cp, W, x, 8, pro, norm_w=norm_w, act_bf16=False))


@pytest.mark.parametrize("fmt", ["NVFP4", "Q4_K", "Q8_0"])
@pytest.mark.parametrize("m", [1, 3])
def test_qx_of_the_bf16_contract_gives_the_bits_of_prologue_none(cp, rng, fmt, m, monkeypatch):
    """gate|up (swiglu epilogue, 64-row tiles as in test_matvec's QX test) writes the codes of its
    rounded outputs (qx_ref of bf16(out), word for word); the down projection reading them
    (prologue "qx") equals prologue "none" on the f32 outputs under the contract bit for bit."""
    from bw24chat.backends import cuda_linear as cl
    from bw24chat.backends.kernel_refs import qx_ref, qx_row_words

    geometry(monkeypatch, MV_NW=16, MV_R=4, MV_STAT8=1)
    unit = max(32, block_of(fmt))
    F = unit * int(rng.integers(1, 4) if unit == 256 else rng.integers(3, 12))
    ts, _ = make_weight(rng, fmt, rows=(F, F), nblocks=4096 // block_of(fmt))
    G = cw.upload(ts, interleave=True)
    assert cl.writes_qx(G, m), "64-row tiles expected"
    td, _ = make_weight(rng, fmt, rows=(int(rng.integers(20, 90)),), nblocks=F // block_of(fmt))
    D = cw.upload(td)
    assert D.in_ == F and cl.takes_qx(D)
    x = rng.standard_normal((m, G.in_)).astype(np.float32)
    norm_w = rng.uniform(0.5, 1.5, G.in_).astype(np.float32)
    qx = cp.zeros((m, qx_row_words(F)), cp.uint32)
    act = cp.full((m, F), cp.nan, dtype=cp.float32)
    cl.matvec(G, cp.asarray(x), act, m, prologue="rmsnorm", epilogue="swiglu", norm_w=cp.asarray(norm_w), eps=EPS,
              qx_out=qx, act_bf16=True)
    a = cp.asnumpy(act)
    assert np.array_equal(cp.asnumpy(qx), qx_ref(bf16_round(a))), "the QX words are not those of the rounded outputs"
    monkeypatch.setattr(cl, "_simt_defines", _PICKED)
    via_qx = cp.full((m, D.out), cp.nan, dtype=cp.float32)
    cl.matvec(D, act, via_qx, m, prologue="qx", qx_in=qx, act_bf16=True)
    assert_same_bits(matvec(cp, D, a, m), cp.asnumpy(via_qx))


def gemm(cp, W, x, T, impl=None, act_bf16=True):
    from bw24chat.backends import cuda_linear as cl

    out = cp.full((T, W.out), cp.nan, dtype=cp.float32)
    cl.gemm(W, cp.asarray(np.ascontiguousarray(x[:T])), out, T, impl=impl, act_bf16=act_bf16)
    return cp.asnumpy(out)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("impl", ["mma", "wg"])
def test_gemm_bf16_contract_matches_reference_and_decode(cp, rng, fmt, impl):
    if impl not in impls():
        pytest.skip("gemm_wg needs sm_90a")
    nb = max(1, 320 // block_of(fmt)) + int(rng.integers(0, 3))
    ts, w = make_weight(rng, fmt, rows=(int(rng.integers(100, 200)), int(rng.integers(1, 40))), nblocks=nb)
    W = cw.upload(ts)
    for T in (1, 7, 100, 300):
        x = rng.standard_normal((T, W.in_)).astype(np.float32)
        got = gemm(cp, W, x, T, impl)
        # W split where not bf16-exact: the exact weights (W_lo's own rounding, 2^-17, and f32
        # accumulation over up to ~450 products: the portable Q8_0 kernel measured 2.03e-5)
        check(got, bf16_round(x), w, 3e-5)
        rows = gemm(cp, W, x[:T // 2 + 1], T // 2 + 1, impl)  # T-independence
        assert_same_bits(got[:T // 2 + 1], rows)
    # the decode rows of the same tokens (matvec, act_bf16): the same products up to f32
    # summation order and, for the integer-dot formats, the codes' error on the rounded x (exact
    # for values of at least 1/128 of their block's maximum, within 2^-16 of it below): the gap is
    # bounded by that error times |w| (NVFP4's random block scales concentrate it: up to 1.5e-5
    # of sum |x||w| measured at ~400 inputs).  The codes' old round-to-even h with l clamped at
    # +-127 also lost every half step (1.9e-5 on NVFP4, 8.9e-6 Q4_K; the contract fixed it).
    y = matvec(cp, W, x, 8)
    xr = bf16_round(x[:8])
    wa = np.abs(w.astype(np.float64))
    bound = np.abs(xr).astype(np.float64) @ wa.T
    code_err = (np.abs(act_quant_ref(xr).astype(np.float64) - xr) @ wa.T) if act_q8(fmt) else 0.0
    gap = np.abs(got[:8].astype(np.float64) - y)
    assert np.all(gap <= code_err + 4e-6 * bound + 1e-30), np.max((gap - code_err) / (bound + 1e-30))
    check(y, act_quant_ref(xr) if act_q8(fmt) else xr, w, 2e-6)  # the decode's own contract


@pytest.mark.parametrize("fmt", ["NVFP4", "Q4_K", "Q8_0"])
def test_wide_gemm_bf16_contract_on_gemm_wra(cp, rng, fmt):
    """The wide matrices' register-operand GEMM (gemm_wra on sm_90a) under the contract: x one
    plane, W_hi + W_lo registers for Q4_K / Q8_0 (gemm_wgmma.cu WRA_WLO)."""
    from bw24chat.backends import cuda_linear as cl

    if "wg" not in impls():
        pytest.skip("gemm_wra needs sm_90a")
    from bw24chat.backends.tuning import GEMM_WIDE_ROWS

    rows = GEMM_WIDE_ROWS + int(rng.integers(1, 100))
    ts, w = make_weight(rng, fmt, rows=(rows,), nblocks=512 // block_of(fmt) if block_of(fmt) <= 256 else 2)
    W = cw.upload(ts)
    assert cl.uses_gemm_wra(W)
    T = int(rng.integers(100, 300))
    x = rng.standard_normal((T, W.in_)).astype(np.float32)
    got = gemm(cp, W, x, T)
    check(got, bf16_round(x), w, 3e-5)
    assert_same_bits(got[:37], gemm(cp, W, x[:37], 37))


@pytest.mark.parametrize("impl", ["mma", "wg"])
def test_gemm_i8_quantizes_the_rounded_x(cp, rng, impl):
    """Q8_0's integer-dot prefill (gemm_i8 / gemm_i8_mma) under the contract is the decode's
    act_quant(bf16(x)) . W: within f32 summation order of the decode rows."""
    from bw24chat.backends import cuda_linear as cl

    if impl not in impls():
        pytest.skip("gemm_i8 needs sm_90a")
    ts, w = make_weight(rng, "Q8_0", rows=(int(rng.integers(100, 200)),), nblocks=16)
    W = cw.upload(ts)
    assert cl.uses_gemm_i8(W, impl)
    T = 64
    x = rng.standard_normal((T, W.in_)).astype(np.float32)
    got = gemm(cp, W, x, T, impl)
    xin = act_quant_ref(bf16_round(x)).astype(np.float64)
    ref = xin @ w.astype(np.float64).T
    bound = np.abs(xin) @ np.abs(w.astype(np.float64)).T
    assert np.all(np.abs(got - ref) <= 2e-6 * bound + 1e-30)
    y = matvec(cp, W, x, 8)
    assert np.all(np.abs(got[:8] - y) <= 2e-6 * bound[:8] + 1e-30)
