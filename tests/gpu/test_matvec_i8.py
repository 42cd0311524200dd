"""The int8 tensor-core decode matvec (kernels/matvec_i8.cu: the integer-dot contract at m = 2..8
rows, cuda_linear.MATVEC_ROWS_TUNING) gives the SIMT kernel's bits: every row of an m-row call
equals the SIMT kernel's one-row call and kernel_refs.matvec_a8_exact (the NumPy mirror of the
bits), bit for bit, for every integer-dot format, prologue, epilogue, geometry and grid, with the
QX hand-off written and read; fresh random data every run, odd sizes."""
import numpy as np
import pytest

from bw24chat.backends import cuda_linear as cl
from bw24chat.backends import cuda_weights as cw
from bw24chat.backends.kernel_refs import A8_FORMATS, matvec_a8_exact, qx_ref, qx_row_words
from tests.gpu.test_dequant_embed import block_of, make_weight
from tests.gpu.test_matvec import EPS, check_close, ref_input, tiles_per_block

_PICKED = cl.i8_defines  # the wrapper's matvec_i8 geometry, before any test overrides it


def run(cp, W, x, m, impl, pro="none", epi="store", norm_w=None, init=None, act_bf16=False, qx_in=None, qx_out=None):
    n_y = W.out // 2 if epi == "swiglu" else W.out
    out = cp.full((m, n_y), cp.nan, dtype=cp.float32) if init is None else cp.asarray(init[:m])
    cl.matvec(W, cp.asarray(np.ascontiguousarray(x[:m])), out, m, prologue=pro, epilogue=epi,
              norm_w=None if norm_w is None else cp.asarray(norm_w), eps=EPS, impl=impl, act_bf16=act_bf16,
              qx_in=qx_in, qx_out=qx_out)
    return cp.asnumpy(out)


def one_row_each(cp, W, x, m, **kw):
    """The SIMT kernel's one-row calls on rows 0..m-1, stacked (what a one-row decode step computes)."""
    init = kw.pop("init", None)
    return np.concatenate([run(cp, W, x[r:r + 1], 1, "simt", init=None if init is None else init[r:r + 1], **kw)
                           for r in range(m)])


def same_bits(a, b) -> bool:
    return np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))


def geometry(monkeypatch, **override):
    """matvec_i8 builds of another geometry (cuda_linear.i8_defines overridden)."""
    monkeypatch.setattr(cl, "i8_defines", lambda W, m, swiglu=False: {**_PICKED(W, m, swiglu), **override})


def _weight(rng, fmt, rows, inputs=None, interleave=False):
    nb = inputs // block_of(fmt) if inputs else int(rng.integers(1, 5)) * (1024 // block_of(fmt)) + int(rng.integers(0, 3))
    ts, w = make_weight(rng, fmt, rows=rows, nblocks=max(1, nb))
    hp = cw.repack_host(ts, interleave=interleave)
    return cw.upload(ts, hp), hp, w


@pytest.mark.parametrize("fmt", list(A8_FORMATS))
def test_rows_are_the_simt_kernels_and_the_numpy_bits(cp, rng, fmt):
    """m = 2..8 on matvec_i8 (what the wrapper picks), odd row counts (partial 16-row tiles) and
    chunk counts that leave the last super-step partial: each row equals the SIMT kernel's
    one-row call, the SIMT kernel's 8-row call and matvec_a8_exact, bit for bit."""
    W, hp, w = _weight(rng, fmt, (int(rng.integers(1, 60)), int(rng.integers(1, 9))))
    x = (rng.standard_normal((8, W.in_)) * rng.uniform(0.01, 10, (8, 1))).astype(np.float32)
    x[2, :32] = 0.0  # an all-zero activation block
    want = matvec_a8_exact(hp, x)
    assert same_bits(one_row_each(cp, W, x, 8), want), "the SIMT kernel differs from matvec_a8_exact"
    assert same_bits(run(cp, W, x, 8, "simt"), want)
    for m in range(2, 9):
        assert cl.matvec_impl(W, True, m) == "i8"
        assert same_bits(run(cp, W, x, m, None), want[:m]), f"matvec_i8 at m={m}"
    check_close(want, ref_input(x, "none", W.in_, None, fmt), w)


@pytest.mark.parametrize("fmt", list(A8_FORMATS))
@pytest.mark.parametrize("pro", ["none", "rmsnorm", "swiglu"])
@pytest.mark.parametrize("act_bf16", [False, True])
def test_prologues_and_epilogues_give_the_one_row_bits(cp, rng, fmt, pro, act_bf16):
    """The rmsnorm (the 8-warp statistic) and swiglu prologues, the store / add / swiglu
    (interleaved gate|up rows) epilogues, both activation contracts: m = 3 and 8 rows on
    matvec_i8 equal the SIMT kernel's one-row calls bit for bit; 8192-input rows (several
    statistic batches) and odd row counts."""
    n = int(rng.integers(9, 80))
    W, _, w = _weight(rng, fmt, (n, n), inputs=8192 if pro == "rmsnorm" else None, interleave=True)
    ldx = 2 * W.in_ if pro == "swiglu" else W.in_
    x = rng.standard_normal((8, ldx)).astype(np.float32)
    norm_w = rng.uniform(0.5, 1.5, W.in_).astype(np.float32) if pro == "rmsnorm" else None
    res = rng.standard_normal((8, W.out)).astype(np.float32)
    kw = dict(pro=pro, norm_w=norm_w, act_bf16=act_bf16)
    for m in (3, 8):
        assert same_bits(run(cp, W, x, m, "i8", **kw), one_row_each(cp, W, x, m, **kw)), ("store", m)
        assert same_bits(run(cp, W, x, m, "i8", epi="add", init=res, **kw), one_row_each(cp, W, x, m, epi="add", init=res, **kw)), ("add", m)
        assert same_bits(run(cp, W, x, m, "i8", epi="swiglu", **kw), one_row_each(cp, W, x, m, epi="swiglu", **kw)), ("swiglu", m)
    if not act_bf16:
        w_rows = np.empty_like(w)  # the uploaded row order: gate_0, up_0, gate_1, ...
        w_rows[0::2], w_rows[1::2] = w[:n], w[n:]
        check_close(run(cp, W, x, 8, "i8", **kw), ref_input(x, pro, W.in_, norm_w, fmt), w_rows)


GEOMETRIES = [dict(I8_KW=8, I8_ST=1, I8_PH=1, I8_U=3), dict(I8_KW=8, I8_ST=1, I8_PH=4, I8_U=3),
              dict(I8_KW=8, I8_ST=2, I8_PH=1, I8_U=2), dict(I8_KW=4, I8_ST=2, I8_PH=2, I8_U=2),
              dict(I8_KW=4, I8_ST=4, I8_PH=1, I8_U=2), dict(I8_KW=2, I8_ST=4, I8_PH=1, I8_U=4),
              dict(I8_KW=1, I8_ST=8, I8_PH=1, I8_U=8), dict(I8_KW=8, I8_ST=1, I8_PH=1, I8_U=1, MV_MINB=2)]


@pytest.mark.parametrize("fmt", ["NVFP4", "Q8_0", "Q4_K", "Q6_K", "MXFP4", "Q2_K", "Q3_K"])
@pytest.mark.parametrize("m", [2, 5])
def test_geometries_and_grids_give_the_same_bits(cp, rng, fmt, m, monkeypatch):
    """Warps per 16-row sub-tile (split K by super-step residue: 1, 2, 4, 8 chains folded in the
    xor order), sub-tiles per pass, passes per tile, super-steps in flight, and persistent grids of
    3 blocks (many tiles per block: the chain buffer and the window reused) or one tile per
    block: the same bits, for the rmsnorm prologue and the add and swiglu epilogues."""
    n = int(rng.integers(150, 400))
    W, _, _ = _weight(rng, fmt, (n, n), inputs=4096 if fmt in ("Q4_K", "Q6_K", "Q2_K", "Q3_K") else None, interleave=True)
    x = rng.standard_normal((m, W.in_)).astype(np.float32)
    norm_w = rng.uniform(0.5, 1.5, W.in_).astype(np.float32)
    res = rng.standard_normal((m, W.out)).astype(np.float32)

    def all_epilogues():
        return (run(cp, W, x, m, "i8", "rmsnorm", norm_w=norm_w), run(cp, W, x, m, "i8", epi="add", init=res),
                run(cp, W, x, m, "i8", epi="swiglu"))

    want = (one_row_each(cp, W, x, m, pro="rmsnorm", norm_w=norm_w), one_row_each(cp, W, x, m, epi="add", init=res),
            one_row_each(cp, W, x, m, epi="swiglu"))
    for g in GEOMETRIES:
        geometry(monkeypatch, **g)
        for cap in (3, None):
            tiles_per_block(monkeypatch, cap)
            for a, b in zip(all_epilogues(), want):
                assert same_bits(a, b), (g, cap)
        monkeypatch.undo()


@pytest.mark.parametrize("producer,consumer", [("NVFP4", "NVFP4"), ("Q8_0", "Q4_K"), ("Q4_K", "Q8_0"), ("Q6_K", "Q5_K")])
@pytest.mark.parametrize("m", [2, 5, 8])
@pytest.mark.parametrize("blocks", [None, 2, 3])
def test_qx_written_and_read_by_matvec_i8(cp, rng, producer, consumer, m, blocks, monkeypatch):
    """The gate|up build (tiles of 4 passes of 16 rows) writes the down projection's x codes: equal to qx_ref of
    its float outputs word for word, the floats the same as without qx_out; the down matvec's
    prologue "qx" over them gives the bits of prologue "none" over the floats and of the SIMT
    kernel's one-row calls; default grids and grids of 2 and 3 blocks (tile buffers reused)."""
    if blocks:
        tiles_per_block(monkeypatch, blocks)
    unit = max(32, block_of(consumer))
    F = unit * int(rng.integers(1, 4) if unit == 256 else rng.integers(3, 12))
    ts, _ = make_weight(rng, producer, rows=(F, F), nblocks=4096 // block_of(producer))
    W_gu = cw.upload(ts, cw.repack_host(ts, interleave=True))
    assert cl.matvec_impl(W_gu, True, m) == "i8" and cl.writes_qx(W_gu, m)
    ts_d, _ = make_weight(rng, consumer, rows=(int(rng.integers(20, 90)),), nblocks=F // block_of(consumer))
    W_d = cw.upload(ts_d)
    assert W_d.in_ == F and cl.takes_qx(W_d, m)
    x = rng.standard_normal((m, W_gu.in_)).astype(np.float32)
    norm_w = rng.uniform(0.5, 1.5, W_gu.in_).astype(np.float32)
    act = cp.full((m, F), cp.nan, dtype=cp.float32)
    qx = cp.zeros((m, qx_row_words(F)), dtype=cp.uint32)
    cl.matvec(W_gu, cp.asarray(x), act, m, prologue="rmsnorm", epilogue="swiglu", norm_w=cp.asarray(norm_w), eps=EPS, qx_out=qx)
    act_h = cp.asnumpy(act)
    assert np.array_equal(cp.asnumpy(qx), qx_ref(act_h)), "the QX words differ from qx_ref of the outputs"
    assert same_bits(run(cp, W_gu, x, m, "i8", "rmsnorm", "swiglu", norm_w=norm_w), act_h), "qx_out changed the floats"
    assert same_bits(act_h, one_row_each(cp, W_gu, x, m, pro="rmsnorm", epi="swiglu", norm_w=norm_w))
    res = rng.standard_normal((m, W_d.out)).astype(np.float32)
    got = cp.asarray(res)
    cl.matvec(W_d, act, got, m, prologue="qx", epilogue="add", qx_in=qx)
    assert same_bits(cp.asnumpy(got), run(cp, W_d, act_h, m, "i8", epi="add", init=res)), "prologue qx differs from none"
    assert same_bits(cp.asnumpy(got), one_row_each(cp, W_d, act_h, m, epi="add", init=res))


def test_rows_split_past_shared_memory(cp, rng):
    """A 12288-input down projection at m = 7, 8 does not fit one block's staging (6 rows do): the
    wrapper runs the rows in groups (each picks its kernel), every row still the one-row call's
    bits."""
    W, hp, _ = _weight(rng, "Q8_0", (40,), inputs=12288)
    x = rng.standard_normal((8, W.in_)).astype(np.float32)
    assert cl.i8_rows_per_launch(W, cl.i8_defines(W, 8)) == 6
    want = matvec_a8_exact(hp, x)
    for m in (6, 7, 8):
        assert same_bits(run(cp, W, x, m, None), want[:m]), m
