"""Decode matrix-vector products: vs a float64 reference on the dequantized weights (relative
error <= 1e-3 of sum |x||w|), bit-identity of every row for m = 1..8 (each prologue), the add
epilogue, and the rmsnorm / swiglu prologues, for every format; fresh random data every run."""
import numpy as np
import pytest

from bw24chat.backends import cuda_linear as cl
from bw24chat.backends import cuda_weights as cw
from bw24chat.backends.kernel_refs import act_q8, act_quant_ref, matvec_prologue_f32, matvec_ref_input
from tests.gpu.test_dequant_embed import FMTS, block_of, make_weight

EPS = 1e-6
_PICKED = cl._simt_defines  # the wrapper's geometry table, before any test overrides it


def prologue_f32(x, pro, in_, norm_w):
    return matvec_prologue_f32(x, pro, in_, norm_w, EPS)


def ref_input(x, pro, in_, norm_w, fmt):
    """The reference's input of the product under the format's default contract (kernel_refs)."""
    return matvec_ref_input(x, pro, in_, norm_w, EPS, act_q8(fmt))


def geometry(monkeypatch, **override):
    """The following matvecs with the wrapper's picked geometry (cuda_linear._simt_defines)
    overridden: a production build of another shape (e.g. MV_NW=16, MV_R=4, MV_STEADY=0)."""
    monkeypatch.setattr(cl, "_simt_defines", lambda W=None, m=1, a8=False, swiglu=False: {**_PICKED(W, m, a8, swiglu), **override})


def tiles_per_block(monkeypatch, cap):
    """Persistent grids of at most ``cap`` blocks (None: one tile per block)."""
    monkeypatch.setattr(cl, "persistent_grid", lambda k, threads, smem, ntiles: ntiles if cap is None else min(ntiles, cap))


def check_close(got, xin, w):
    ref = xin @ w.astype(np.float64).T
    bound = np.abs(xin) @ np.abs(w.astype(np.float64)).T
    err = np.abs(got.astype(np.float64) - ref)
    assert np.all(err <= 1e-3 * bound + 1e-30), f"max rel err {np.max(err / (bound + 1e-30)):.3g}"


def run(cp, W, x, m, pro="none", epi="store", norm_w=None, init=None, act_bf16=False, impl=None):
    out = cp.full((m, W.out), cp.nan, dtype=cp.float32) if init is None else cp.asarray(init)
    cl.matvec(W, cp.asarray(np.ascontiguousarray(x[:m])), out, m, prologue=pro, epilogue=epi,
              norm_w=None if norm_w is None else cp.asarray(norm_w), eps=EPS, act_bf16=act_bf16, impl=impl)
    return cp.asnumpy(out)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("pro", ["none", "rmsnorm", "swiglu"])
def test_matvec_matches_reference_and_is_m_invariant(cp, rng, fmt, pro):
    # widths up to several k-tiles for m = 8 (tile = 8192/m values, a multiple of 32 chunks)
    nb = int(rng.integers(1, 4)) * (1024 // block_of(fmt) if block_of(fmt) <= 256 else 1) + int(rng.integers(0, 3))
    ts, w = make_weight(rng, fmt, rows=(int(rng.integers(1, 40)), int(rng.integers(1, 9))), nblocks=nb)
    W = cw.upload(ts)
    in_ = W.in_
    x = rng.standard_normal((8, 2 * in_ if pro == "swiglu" else in_)).astype(np.float32)
    norm_w = rng.uniform(0.5, 1.5, in_).astype(np.float32) if pro == "rmsnorm" else None
    outs = {m: run(cp, W, x, m, pro, norm_w=norm_w) for m in range(1, 9)}
    check_close(outs[8], ref_input(x, pro, in_, norm_w, fmt), w)
    for m in range(1, 8):
        assert np.array_equal(outs[m].view(np.uint32), outs[8][:m].view(np.uint32)), f"m={m} differs from m=8"
    for r in range(8):  # each row alone (m=1) equals its row in the m=8 call
        one = run(cp, W, x[r:r + 1], 1, pro, norm_w=norm_w)
        assert np.array_equal(one.view(np.uint32), outs[8][r:r + 1].view(np.uint32)), f"row {r}"


@pytest.mark.parametrize("fmt", ["BF16", "Q8_0", "Q4_K", "Q6_K", "NVFP4", "Q5_1", "MXFP4", "Q2_K", "Q3_K"])
def test_matvec_add_epilogue(cp, rng, fmt):
    ts, w = make_weight(rng, fmt, rows=(45,), nblocks=5)
    W = cw.upload(ts)
    x = rng.standard_normal((3, W.in_)).astype(np.float32)
    res = rng.standard_normal((3, W.out)).astype(np.float32)
    y = run(cp, W, x, 3)
    got = run(cp, W, x, 3, epi="add", init=res)
    assert np.array_equal(got, (res + y).astype(np.float32))


def test_matvec_qwen_shape_q4_k(cp, rng):
    """A real width (4096 -> 1000 rows) against the reference."""
    ts, w = make_weight(rng, "Q4_K", rows=(1000,), nblocks=16)
    W = cw.upload(ts)
    x = rng.standard_normal((2, W.in_)).astype(np.float32)
    check_close(run(cp, W, x, 2), ref_input(x, "none", W.in_, None, "Q4_K"), w)


@pytest.mark.parametrize("fmt", ["BF16", "Q8_0", "Q4_K", "NVFP4", "Q6_K", "MXFP4", "Q2_K", "Q3_K", "Q4_1"])
def test_matvec_swiglu_epilogue_interleaved(cp, rng, fmt):
    """Gate and up rows interleaved at upload; the swiglu epilogue equals silu(gate.x) * up.x
    (each from the store epilogue on the same interleaved matrix), m-invariant bit for bit; and
    the prefill's swiglu_rows gives the same bits from the same interleaved GEMM-layout input."""
    from bw24chat.backends import cuda_ops as ops

    n = int(rng.integers(3, 40))
    ts, w = make_weight(rng, fmt, rows=(n, n), nblocks=int(rng.integers(2, 6)))
    W = cw.upload(ts, interleave=True)
    x = rng.standard_normal((8, W.in_)).astype(np.float32)
    y = run(cp, W, x, 8)  # (8, 2n): columns gate_0, up_0, gate_1, ...
    check_close(y[:, 0::2], ref_input(x, "none", W.in_, None, fmt), w[:n])
    check_close(y[:, 1::2], ref_input(x, "none", W.in_, None, fmt), w[n:])
    outs = {}
    for m in (1, 3, 8):
        out = cp.full((m, n), cp.nan, dtype=cp.float32)
        cl.matvec(W, cp.asarray(x[:m]), out, m, epilogue="swiglu")
        outs[m] = cp.asnumpy(out)
    for m in (1, 3):
        assert np.array_equal(outs[m].view(np.uint32), outs[8][:m].view(np.uint32))
    g, u = y[:, 0::2].astype(np.float64), y[:, 1::2].astype(np.float64)
    ref = g / (1.0 + np.exp(-g)) * u
    assert np.allclose(outs[8], ref, rtol=1e-5, atol=1e-6)
    act = cp.full((8, n), cp.nan, dtype=cp.float32)
    ops.swiglu(cp.asarray(y), act)
    assert np.array_equal(cp.asnumpy(act).view(np.uint32), outs[8].view(np.uint32))


@pytest.mark.parametrize("fmt", ["BF16", "Q8_0", "Q4_K", "Q6_K", "NVFP4", "F32", "MXFP4", "Q2_K", "Q3_K"])
@pytest.mark.parametrize("m", [1, 3])
def test_matvec_persistent_tiles_give_the_same_bits(cp, rng, fmt, m, monkeypatch):
    """The matvec kernels are persistent (each block loops over row tiles, the x staging done
    once per block).  A grid capped at 3 blocks — dozens of tiles per block, the next tile's loads
    issued before the current one's epilogue — gives the same bits as the default grid and as one
    tile per block, for the rmsnorm prologue and the store / add / swiglu epilogues."""
    n = int(rng.integers(300, 700))
    ts, w = make_weight(rng, fmt, rows=(n, n), nblocks=int(rng.integers(2, 5)))
    W = cw.upload(ts, interleave=True)
    x = rng.standard_normal((m, W.in_)).astype(np.float32)
    norm_w = rng.uniform(0.5, 1.5, W.in_).astype(np.float32)
    res = rng.standard_normal((m, W.out)).astype(np.float32)

    def all_epilogues():
        got = [run(cp, W, x, m, "rmsnorm", norm_w=norm_w), run(cp, W, x, m, epi="add", init=res)]
        sw = cp.full((m, n), cp.nan, dtype=cp.float32)
        cl.matvec(W, cp.asarray(x), sw, m, epilogue="swiglu")
        return got + [cp.asnumpy(sw)]

    base = all_epilogues()
    w_rows = np.empty_like(w)  # the uploaded row order: gate_0, up_0, gate_1, ...
    w_rows[0::2], w_rows[1::2] = w[:n], w[n:]
    check_close(base[0], ref_input(x, "rmsnorm", W.in_, norm_w, fmt), w_rows)
    for cap in (3, None):
        tiles_per_block(monkeypatch, cap)
        for a, b in zip(all_epilogues(), base):
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"a grid of {cap} blocks changed the bits"


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "NVFP4", "MXFP4", "Q2_K", "Q3_K"])
def test_integer_dot_matvec_is_the_exact_contract(cp, rng, fmt, monkeypatch):
    """Every quantized format under the integer-dot contract (forced for all of them): against
    the float64 product of the quantized activations and the exact weights, only the f32
    accumulation's rounding remains (<= 1e-5 of sum |x||w|), and rows stay m-invariant."""
    monkeypatch.setenv("BW24CHAT_A8", "all")
    nb = int(rng.integers(1, 4)) * (1024 // block_of(fmt) if block_of(fmt) <= 256 else 1) + int(rng.integers(0, 3))
    ts, w = make_weight(rng, fmt, rows=(int(rng.integers(1, 40)), int(rng.integers(1, 9))), nblocks=nb)
    W = cw.upload(ts)
    x = (rng.standard_normal((8, W.in_)) * 3).astype(np.float32)
    xin = act_quant_ref(x).astype(np.float64)
    got = run(cp, W, x, 8)
    ref = xin @ w.astype(np.float64).T
    bound = np.abs(xin) @ np.abs(w.astype(np.float64)).T
    assert np.all(np.abs(got - ref) <= 1e-5 * bound + 1e-30)
    for r in (0, 5):
        assert np.array_equal(run(cp, W, x[r:r + 1], 1).view(np.uint32), got[r:r + 1].view(np.uint32))


def test_integer_dot_rows_split_past_shared_memory(cp, rng):
    """At m = 8 a 12288-wide input (the Qwen3-8B down projection) does not fit its two code
    planes in one block's shared memory: the wrapper runs the rows in groups, and every row
    still equals its m = 1 call bit for bit and the contract's reference."""
    ts, w = make_weight(rng, "Q8_0", rows=(40,), nblocks=12288 // 32)
    W = cw.upload(ts)
    x = rng.standard_normal((8, W.in_)).astype(np.float32)
    res = rng.standard_normal((8, W.out)).astype(np.float32)
    y8 = run(cp, W, x, 8, epi="add", init=res)
    check_close(y8 - res, ref_input(x, "none", W.in_, None, "Q8_0"), w)
    for r in (0, 6, 7):
        one = run(cp, W, x[r:r + 1], 1, epi="add", init=res[r:r + 1])
        assert np.array_equal(one.view(np.uint32), y8[r:r + 1].view(np.uint32))


def _rmsnorm_rows_under(cp, rng, fmt, m, monkeypatch, overrides):
    """The rows of one rmsnorm-prologue matvec on the SIMT kernel (8192 inputs, 20..139 rows: odd
    and even) under each geometry override in turn (geometry); the last is also checked against
    the reference."""
    n = int(rng.integers(20, 140))
    ts, w = make_weight(rng, fmt, rows=(n,), nblocks=8192 // block_of(fmt))
    W = cw.upload(ts)
    x = rng.standard_normal((m, W.in_)).astype(np.float32)
    norm_w = rng.uniform(0.5, 1.5, W.in_).astype(np.float32)
    outs = []
    for override in overrides:
        geometry(monkeypatch, **override)
        outs.append(run(cp, W, x, m, "rmsnorm", norm_w=norm_w, impl="simt"))
    check_close(outs[-1], ref_input(x, "rmsnorm", W.in_, norm_w, fmt), w)
    return outs


@pytest.mark.parametrize("fmt", ["NVFP4", "Q4_K", "Q8_0"])
def test_wide_matrices_default_geometry_is_m_invariant(cp, rng, fmt):
    """Matrices of more than 4096 rows at m = 1 take their own geometry (cuda_linear._simt_defines:
    4 rows per warp, 16 warps, the 8-warp rmsnorm statistic) while m > 1 takes matvec.cu's
    default: every row of an m = 1 call equals its row of the m = 3 call bit for bit, for the
    rmsnorm prologue (qkv, gate|up, LM head) and the swiglu epilogue (gate|up), and the
    reference's tolerance holds."""
    n = 4096 + 2 * int(rng.integers(1, 60))
    ts, w = make_weight(rng, fmt, rows=(n,), nblocks=2048 // block_of(fmt))
    W = cw.upload(ts)
    x = rng.standard_normal((3, W.in_)).astype(np.float32)
    norm_w = rng.uniform(0.5, 1.5, W.in_).astype(np.float32)
    three = run(cp, W, x, 3, "rmsnorm", norm_w=norm_w)
    check_close(three, ref_input(x, "rmsnorm", W.in_, norm_w, fmt), w)
    half = n // 2  # the swiglu epilogue writes m rows of n / 2 outputs, packed
    three_swiglu = run(cp, W, x, 3, "rmsnorm", epi="swiglu", norm_w=norm_w).ravel()[:3 * half].reshape(3, half)
    for r in range(3):
        one = run(cp, W, x[r:r + 1], 1, "rmsnorm", norm_w=norm_w)
        assert np.array_equal(one.view(np.uint32), three[r:r + 1].view(np.uint32)), r
        one = run(cp, W, x[r:r + 1], 1, "rmsnorm", epi="swiglu", norm_w=norm_w).ravel()[:half]
        assert np.array_equal(one.view(np.uint32), three_swiglu[r].view(np.uint32)), r


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_K", "NVFP4", "BF16", "F32", "Q6_K", "MXFP4", "Q2_K", "Q3_K"])
@pytest.mark.parametrize("m", [1, 3])
def test_steady_windows_give_the_same_bits(cp, rng, fmt, m, monkeypatch):
    """MV_STEADY (branch-free steady-state load windows, picked per shape) runs the same operations
    in the same order as the guarded loop, so every row is bit-identical with it on and off;
    inputs wide enough (8192) that the steady branch covers most of each row, odd row counts, the
    rmsnorm prologue."""
    off, on = _rmsnorm_rows_under(cp, rng, fmt, m, monkeypatch, ({"MV_STEADY": 0}, {"MV_STEADY": 1}))
    assert np.array_equal(on.view(np.uint32), off.view(np.uint32))


@pytest.mark.parametrize("fmt", ["NVFP4", "Q8_0", "Q4_K", "BF16", "F32"])
@pytest.mark.parametrize("m", [1, 3])
def test_sixteen_warps_per_block_give_the_same_bits(cp, rng, fmt, m, monkeypatch):
    """MV_NW = 16 (blocks of 16 warps, picked for the matvecs without an rmsnorm prologue) changes
    which block and warp compute a row, not how: every row is bit-identical to the 8-warp
    kernel's, for no prologue (store, add, swiglu epilogues: odd and even row counts) and the
    swiglu prologue; with an rmsnorm prologue the wrapper keeps 8 warps unless MV_STAT8 (the
    statistic's order follows the block size), so those rows are unchanged as well."""
    n = int(rng.integers(20, 140))
    ts, w = make_weight(rng, fmt, rows=(n,), nblocks=8192 // block_of(fmt))
    W = cw.upload(ts)
    x = rng.standard_normal((m, 2 * W.in_)).astype(np.float32)
    xs = np.ascontiguousarray(x[:, :W.in_])
    norm_w = rng.uniform(0.5, 1.5, W.in_).astype(np.float32)
    res = rng.standard_normal((m, n)).astype(np.float32)
    got = {}
    for nw in (8, 16):
        geometry(monkeypatch, MV_NW=nw)
        got[nw] = (run(cp, W, xs, m, impl="simt"), run(cp, W, xs, m, epi="add", init=res, impl="simt"),
                   run(cp, W, x, m, "swiglu", impl="simt"), run(cp, W, xs, m, "rmsnorm", norm_w=norm_w, impl="simt"))
        if n % 2 == 0:
            got[nw] += (run(cp, W, xs, m, epi="swiglu", impl="simt"),)
    check_close(got[16][0], ref_input(xs, "none", W.in_, None, fmt), w)
    check_close(got[16][2], ref_input(x, "swiglu", W.in_, None, fmt), w)
    for a, b in zip(got[16], got[8]):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("fmt", ["NVFP4", "Q8_0", "Q4_K", "BF16", "F32"])
@pytest.mark.parametrize("m", [1, 3])
def test_sixteen_warps_with_the_eight_warp_statistic_give_the_same_bits(cp, rng, fmt, m, monkeypatch):
    """MV_STAT8 with 16 warps (the wide matrices' geometry): the rmsnorm prologue in a 16-warp block
    sums its statistic with 8 warps in the 8-warp kernel's order, so the rows equal the 8-warp
    kernel's bit for bit; inputs wide enough (8192) for several statistic batches."""
    eight, sixteen = _rmsnorm_rows_under(cp, rng, fmt, m, monkeypatch, ({"MV_NW": 8}, {"MV_NW": 16, "MV_STAT8": 1}))
    assert np.array_equal(sixteen.view(np.uint32), eight.view(np.uint32))


@pytest.mark.parametrize("fmt", ["NVFP4", "Q8_0", "Q4_K"])
@pytest.mark.parametrize("rows,inputs,m,pro", [(6144, 4096, 1, "rmsnorm"), (6150, 4096, 1, "rmsnorm"),
                                               (5120, 2048, 1, "rmsnorm"), (6144, 4096, 1, "none")])
@pytest.mark.parametrize("act_bf16", [False, True])
def test_three_rows_per_warp_give_the_same_bits(cp, rng, fmt, rows, inputs, m, pro, act_bf16, monkeypatch):
    """cuda_linear._fill_rows: a wide integer-dot matvec whose 64-row tiles would leave SMs idle
    (the qkv shape) runs 3 rows per warp (48-row tiles; Q8_0 with 2 load slots); every row equals
    the 4-row build's bit for bit, a partial last tile included (6150 rows), both activation
    contracts; within the reference's tolerance."""
    ts, w = make_weight(rng, fmt, rows=(rows,), nblocks=inputs // block_of(fmt))
    W = cw.upload(ts)
    x = rng.standard_normal((m, W.in_)).astype(np.float32)
    norm_w = rng.uniform(0.5, 1.5, W.in_).astype(np.float32) if pro == "rmsnorm" else None
    fill = run(cp, W, x, m, pro, norm_w=norm_w, act_bf16=act_bf16)
    monkeypatch.setattr(cl, "_fill_rows", lambda n_out, nw: 4)
    four = run(cp, W, x, m, pro, norm_w=norm_w, act_bf16=act_bf16)
    assert np.array_equal(fill.view(np.uint32), four.view(np.uint32))
    if not act_bf16:
        check_close(fill, ref_input(x, pro, W.in_, norm_w, fmt), w)


QX_CASES = [(p, c, m, b) for p in ("NVFP4", "Q8_0", "Q4_K") for c in ("NVFP4", "Q8_0", "Q4_K")
            for m in (1, 3, 8) for b in (None, 2, 3)]
QX_CASES += [(p, c, m, b) for p, c in (("MXFP4", "MXFP4"), ("Q2_K", "Q3_K"), ("Q3_K", "Q2_K")) for m in (1, 3, 8) for b in (None, 3)]


@pytest.mark.parametrize("producer,consumer,m,blocks", QX_CASES)
def test_qx_written_by_the_swiglu_epilogue_gives_the_same_bits(cp, rng, producer, consumer, m, blocks, monkeypatch):
    """matvec.cu QX: the gate|up matvec's swiglu epilogue, in tiles of 64 rows (16 warps x 4
    rows; the 8-warp rmsnorm statistic), writes its outputs' integer-dot codes; they equal
    kernel_refs.qx_ref of its float outputs word for word (codes and records), and the down
    matvec's prologue "qx" over them gives the same bits as prologue "none" over the floats —
    for every pair of formats (the QX layout does not depend on either), odd block counts; the
    default grid and grids of 2 and 3 blocks (the two tile buffers reused, odd and even tile
    counts per block: the named-barrier hand-off)."""
    from bw24chat.backends.kernel_refs import qx_ref, qx_row_words

    if blocks:
        tiles_per_block(monkeypatch, blocks)
    geometry(monkeypatch, MV_NW=16, MV_R=4, MV_STAT8=1)
    unit = max(32, block_of(consumer))  # the down projection's inputs: whole blocks (Q4_K 256, NVFP4 64, Q8_0 32)
    F = unit * int(rng.integers(1, 4) if unit == 256 else rng.integers(3, 12))
    ts, _ = make_weight(rng, producer, rows=(F, F), nblocks=4096 // block_of(producer))
    W_gu = cw.upload(ts, interleave=True)
    assert cl.writes_qx(W_gu, m), "64-row tiles expected"
    n_down = int(rng.integers(20, 90))
    ts_d, w_d = make_weight(rng, consumer, rows=(n_down,), nblocks=F // block_of(consumer))
    W_d = cw.upload(ts_d)
    assert W_d.in_ == F and cl.takes_qx(W_d)
    x = rng.standard_normal((m, W_gu.in_)).astype(np.float32)
    norm_w = rng.uniform(0.5, 1.5, W_gu.in_).astype(np.float32)
    act = cp.full((m, F), cp.nan, dtype=cp.float32)
    qx = cp.zeros((m, qx_row_words(F)), dtype=cp.uint32)
    cl.matvec(W_gu, cp.asarray(x), act, m, prologue="rmsnorm", epilogue="swiglu", norm_w=cp.asarray(norm_w), eps=EPS, qx_out=qx)
    act_h = cp.asnumpy(act)
    assert np.array_equal(cp.asnumpy(qx), qx_ref(act_h)), "the QX words differ from qx_ref of the outputs"
    plain = cp.full((m, F), cp.nan, dtype=cp.float32)  # the floats are the ones without qx_out
    cl.matvec(W_gu, cp.asarray(x), plain, m, prologue="rmsnorm", epilogue="swiglu", norm_w=cp.asarray(norm_w), eps=EPS)
    assert np.array_equal(cp.asnumpy(plain).view(np.uint32), act_h.view(np.uint32)), "qx_out changed the float outputs"
    monkeypatch.setattr(cl, "_simt_defines", _PICKED)
    res = rng.standard_normal((m, n_down)).astype(np.float32)
    want = run(cp, W_d, act_h, m, epi="add", init=res)
    got = cp.asarray(res)
    cl.matvec(W_d, act, got, m, prologue="qx", epilogue="add", qx_in=qx)
    assert np.array_equal(cp.asnumpy(got).view(np.uint32), want.view(np.uint32)), "prologue qx differs from none"
    check_close(run(cp, W_d, act_h, m), ref_input(act_h, "none", F, None, consumer), w_d)  # (store: no residual rounding)


@pytest.mark.parametrize("fmt", ["BF16", "F32", "F16", "Q4_1"])
@pytest.mark.parametrize("pro", ["none", "rmsnorm", "swiglu"])
@pytest.mark.parametrize("m", [1, 3])
def test_float_path_reads_give_the_same_bits_aligned_or_not(cp, rng, fmt, pro, m):
    """The float path's prologue reads x in float4 groups where x, its row stride and normw allow
    16-byte loads, else as four guarded scalar loads (matvec.cu load_group); the statistic's
    order and the staged values are the same either way.  x one float past a 16-byte boundary
    takes the scalar reads; rows several statistic batches wide; the SIMT kernel (impl)."""
    ts, w = make_weight(rng, fmt, rows=(int(rng.integers(20, 90)),), nblocks=8192 // block_of(fmt))
    W = cw.upload(ts)
    ldx = 2 * W.in_ if pro == "swiglu" else W.in_
    x = rng.standard_normal((m, ldx)).astype(np.float32)
    norm_w = rng.uniform(0.5, 1.5, W.in_).astype(np.float32) if pro == "rmsnorm" else None

    def rows(offset: int):
        buf = cp.zeros(m * ldx + 4, dtype=cp.float32)
        xd = buf[offset:offset + m * ldx]
        xd[...] = cp.asarray(x.reshape(-1))
        out = cp.full((m, W.out), cp.nan, dtype=cp.float32)
        cl.matvec(W, xd, out, m, prologue=pro, norm_w=None if norm_w is None else cp.asarray(norm_w), eps=EPS, impl="simt")
        return cp.asnumpy(out)

    aligned, scalar = rows(0), rows(1)
    assert np.array_equal(aligned.view(np.uint32), scalar.view(np.uint32))
    check_close(aligned, ref_input(x, pro, W.in_, norm_w, fmt), w)



def test_small_float_rows_take_their_geometry_with_the_same_bits(cp, rng):
    """Q4_1's m-row geometry (MATVEC_ROWS_TUNING: a row per warp and one load slot; under the
    swiglu epilogue 16 warps with the 8-warp rmsnorm statistic) on SmolLM2-135M's shapes: every
    row of m = 2..8 equals its one-row call (8 warps, 2 rows per warp) bit for bit, behind the
    rmsnorm prologue, with the store, add and swiglu epilogues."""
    for rows, in_, epi in ((960, 576, "store"), (576, 1536, "add"), (3072, 576, "swiglu")):
        n_y = rows // 2 if epi == "swiglu" else rows
        ts, _ = make_weight(rng, "Q4_1", rows=(n_y, n_y) if epi == "swiglu" else (rows,), nblocks=in_ // 32)
        W = cw.upload(ts, interleave=epi == "swiglu")
        x = rng.standard_normal((8, in_)).astype(np.float32)
        norm_w = cp.asarray(rng.uniform(0.5, 1.5, in_).astype(np.float32))
        res = rng.standard_normal((8, n_y)).astype(np.float32)

        def call(r0: int, m: int):  # rows r0 .. r0 + m - 1 in one call
            out = cp.asarray(res[r0:r0 + m]) if epi == "add" else cp.full((m, n_y), cp.nan, dtype=cp.float32)
            cl.matvec(W, cp.asarray(x[r0:r0 + m]), out, m, "rmsnorm", epi, norm_w=norm_w, eps=EPS, impl="simt")
            return cp.asnumpy(out)

        one = np.concatenate([call(r, 1) for r in range(8)])
        for m in range(2, 9):
            assert np.array_equal(call(0, m).view(np.uint32), one[:m].view(np.uint32)), (rows, in_, epi, m)


@pytest.mark.parametrize("T, n, ld, lo", [(1, 1024, 6144, 5120), (7, 300, 1000, 13), (33, 5120, 6144, 0)])
def test_put_columns_equals_its_reference(cp, rng, T, n, ld, lo):
    """put_columns (a PartedWeight's share into its columns): a copy, or an add rounded once,
    bit for bit; the other columns untouched."""
    from bw24chat.backends import cuda_ops

    src = rng.standard_normal((T, n)).astype(np.float32)
    base = rng.standard_normal((T, ld)).astype(np.float32)
    for add in (False, True):
        dst = cp.asarray(base)
        cuda_ops.put_columns(cp.asarray(src), dst[:, lo:lo + n], add=add)
        want = base.copy()
        want[:, lo:lo + n] = base[:, lo:lo + n] + src if add else src
        assert np.array_equal(cp.asnumpy(dst).view(np.uint32), want.view(np.uint32)), add
