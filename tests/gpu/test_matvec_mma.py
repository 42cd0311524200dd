"""The integer-dot matvec on int8 tensor cores (kernels/matvec_mma.cu, cuda_linear.matvec(impl="mma")):
every row of its m-row call (m = 1..16) equals the SIMT kernel's one-row call on that row bit for
bit (so a speculative verify or a batched step on it equals plain decoding), and its m-row call
(m <= 8, the SIMT kernel's rows);
for Q8_0, NVFP4 and Q4_K, every prologue (none, rmsnorm, swiglu, qx; the bf16-activation flag),
every epilogue (store, add, swiglu, qx_out), odd row counts and rows that end in a partial k-tile,
the geometry alternatives (warps, K split, ring depth, grid), launches over K ranges (the wide
down projections) and the Qwen3-8B shapes (o, qkv, gate|up, down, the 151936-row LM head); the
contract's NumPy bits (kernel_refs.matvec_a8_exact) on small matrices.  Fresh random data every run."""
import numpy as np
import pytest

from bw24chat.backends import cuda_linear as cl
from bw24chat.backends import cuda_weights as cw
from bw24chat.backends.kernel_refs import matvec_a8_exact, qx_ref, qx_row_words
from tests.gpu.test_dequant_embed import block_of, make_weight
from tests.gpu.test_matvec import EPS, check_close, ref_input, tiles_per_block

FMTS = list(cl.MMA_FORMATS)


def call(cp, W, x, m, impl, pro="none", epi="store", norm_w=None, init=None, act_bf16=False, qx_in=None, qx_out=None,
         k_ranges=None):
    """out (numpy) of one matvec call on rows x[:m] (a host array, or a device one taken as it is)."""
    n_y = W.out // 2 if epi == "swiglu" else W.out
    out = cp.full((m, n_y), cp.nan, dtype=cp.float32) if init is None else cp.asarray(np.ascontiguousarray(init[:m]))
    xd = x if isinstance(x, cp.ndarray) else cp.asarray(np.ascontiguousarray(x[:m]))
    cl.matvec(W, xd, out, m, prologue=pro, epilogue=epi, norm_w=None if norm_w is None else cp.asarray(norm_w), eps=EPS,
              impl=impl, act_bf16=act_bf16, qx_in=qx_in, qx_out=qx_out, k_ranges=k_ranges)
    return cp.asnumpy(out)


def one_row_steps(cp, W, x, m, **kw):
    """The SIMT kernel's one-row call on each of the m rows (plain decoding), stacked."""
    init = kw.pop("init", None)
    return np.concatenate([call(cp, W, x[r:r + 1], 1, "simt", init=None if init is None else init[r:r + 1], **kw)
                           for r in range(m)])


def same_bits(a, b, what=""):
    diff = int(np.sum(a.view(np.uint32) != b.view(np.uint32)))
    assert diff == 0, f"{diff} of {a.size} outputs differ {what}"


def odd_weight(rng, fmt, rows=None, interleave=False):
    """Random weights of an odd row count (two tensors of it, rows interleaved, with interleave)
    and 256 k inputs (k = 1..6: rows that end in a partial 32-chunk k-tile for every format),
    uploaded; with the host planes and the reference weights."""
    in_ = 256 * int(rng.integers(1, 7))
    nb = in_ // block_of(fmt)
    n = rows or int(rng.integers(1, 60)) * 2 + 1
    ts, w = make_weight(rng, fmt, rows=(n, n) if interleave else (n,), nblocks=nb)
    hp = cw.repack_host(ts, interleave=interleave)
    return cw.upload(ts, interleave=interleave), hp, w


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("pro", ["none", "rmsnorm", "swiglu"])
def test_rows_equal_the_one_row_simt_step(cp, rng, fmt, pro):
    W, hp, w = odd_weight(rng, fmt)
    ldx = 2 * W.in_ if pro == "swiglu" else W.in_
    R = cl.MMA_MAX_ROWS
    x = (rng.standard_normal((R, ldx)) * rng.uniform(0.1, 10.0, (R, 1))).astype(np.float32)
    norm_w = rng.uniform(0.5, 1.5, W.in_).astype(np.float32) if pro == "rmsnorm" else None
    one = one_row_steps(cp, W, x, R, pro=pro, norm_w=norm_w)
    for m in range(1, R + 1):  # 9..16: three and four n-tiles (the batched pass's spans)
        got = call(cp, W, x, m, "mma", pro, norm_w=norm_w)
        same_bits(got, one[:m], f"from the one-row SIMT steps at m = {m}")
        if m <= cl.MV_MAX_ROWS:
            same_bits(got, call(cp, W, x, m, "simt", pro, norm_w=norm_w), f"from the SIMT {m}-row step")
    check_close(one, ref_input(x, pro, W.in_, norm_w, fmt), w)
    if pro == "none":
        same_bits(one, matvec_a8_exact(hp, x), "from kernel_refs.matvec_a8_exact")


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("act_bf16", [False, True])
def test_add_and_swiglu_epilogues(cp, rng, fmt, act_bf16):
    """The add epilogue (the residual) and the swiglu epilogue (gate / up rows interleaved), behind
    the rmsnorm prologue, under both activation contracts."""
    W, _, _ = odd_weight(rng, fmt, interleave=True)
    R = cl.MMA_MAX_ROWS
    x = rng.standard_normal((R, W.in_)).astype(np.float32)
    norm_w = rng.uniform(0.5, 1.5, W.in_).astype(np.float32)
    res = rng.standard_normal((R, W.out)).astype(np.float32)
    one_add = one_row_steps(cp, W, x, R, pro="rmsnorm", epi="add", norm_w=norm_w, init=res, act_bf16=act_bf16)
    one_sw = one_row_steps(cp, W, x, R, pro="rmsnorm", epi="swiglu", norm_w=norm_w, act_bf16=act_bf16)
    for m in (2, 3, 4, 5, 8, 9, 13, 16):
        same_bits(call(cp, W, x, m, "mma", "rmsnorm", "add", norm_w, init=res, act_bf16=act_bf16), one_add[:m], f"(add, m = {m})")
        same_bits(call(cp, W, x, m, "mma", "rmsnorm", "swiglu", norm_w, act_bf16=act_bf16), one_sw[:m], f"(swiglu, m = {m})")


GEOMETRIES = [{"MV_NW": 8, "MQ_KW": 8}, {"MV_NW": 8, "MQ_KW": 4}, {"MV_NW": 16, "MQ_KW": 8}, {"MV_NW": 16, "MQ_KW": 4},
              {"MV_NW": 8, "MQ_KW": 8, "MQ_STAGES": 2}, {"MV_NW": 16, "MQ_KW": 4, "MQ_STAGES": 3}]


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("geo", GEOMETRIES, ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
@pytest.mark.parametrize("blocks", [None, 3])
def test_geometries_and_grids_give_the_same_bits(cp, rng, fmt, geo, blocks, monkeypatch):
    """Warps per block, warps per sub-tile (the K split: the chains' warps and the tree's split
    between registers and shared memory), ring depth and persistent grids of 3 blocks (dozens of
    passes per block, the pass buffers reused) change no bit: rmsnorm / store and swiglu."""
    for cls in ("one_tile", "two_tiles", "four_tiles"):
        monkeypatch.setitem(cl.MATVEC_MMA_TUNING, ("*", cls), {**cl.MATVEC_MMA_TUNING[("*", cls)], "MV_MINB": 1, **geo})
    if blocks:
        tiles_per_block(monkeypatch, blocks)
    W, _, _ = odd_weight(rng, fmt, rows=int(rng.integers(150, 400)) * 2 + 1)
    x = rng.standard_normal((14, W.in_)).astype(np.float32)
    norm_w = rng.uniform(0.5, 1.5, W.in_).astype(np.float32)
    W2, _, _ = odd_weight(rng, fmt, interleave=True)
    x2 = rng.standard_normal((14, W2.in_)).astype(np.float32)
    for m in (3, 6):
        same_bits(call(cp, W, x, m, "mma", "rmsnorm", norm_w=norm_w), call(cp, W, x, m, "simt", "rmsnorm", norm_w=norm_w), f"(m = {m})")
        same_bits(call(cp, W2, x2, m, "mma", epi="swiglu"), call(cp, W2, x2, m, "simt", epi="swiglu"), f"(swiglu, m = {m})")
    # 14 rows (four n-tiles, the last one partial) against the one-row SIMT steps
    same_bits(call(cp, W, x, 14, "mma", "rmsnorm", norm_w=norm_w), one_row_steps(cp, W, x, 14, pro="rmsnorm", norm_w=norm_w), "(m = 14)")
    same_bits(call(cp, W2, x2, 14, "mma", epi="swiglu"), one_row_steps(cp, W2, x2, 14, epi="swiglu"), "(swiglu, m = 14)")


@pytest.mark.parametrize("producer", FMTS)
@pytest.mark.parametrize("consumer", FMTS)
@pytest.mark.parametrize("m", [1, 3, 8, 11, 16])
@pytest.mark.parametrize("blocks", [None, 2, 3])
def test_qx_buffers(cp, rng, producer, consumer, m, blocks, monkeypatch):
    """qx_out: the gate|up matvec's swiglu epilogue (64-row tiles of passes, tile buffers by
    parity, quantized one item after their last pass) writes qx_ref of its float outputs, and
    those outputs equal the SIMT kernel's; prologue qx: the down matvec over those codes equals
    the one-row SIMT steps over the floats.  Grids of 2 and 3 blocks: several tiles per block."""
    if blocks:
        tiles_per_block(monkeypatch, blocks)
    F = 256 * int(rng.integers(1, 5))
    ts, _ = make_weight(rng, producer, rows=(F, F), nblocks=2048 // block_of(producer))
    W_gu = cw.upload(ts, interleave=True)
    assert cl.mma_writes_qx(W_gu, m)
    x = rng.standard_normal((m, W_gu.in_)).astype(np.float32)
    norm_w = rng.uniform(0.5, 1.5, W_gu.in_).astype(np.float32)
    act = cp.full((m, F), cp.nan, dtype=cp.float32)
    qx = cp.zeros((m, qx_row_words(F)), dtype=cp.uint32)
    cl.matvec(W_gu, cp.asarray(x), act, m, prologue="rmsnorm", epilogue="swiglu", norm_w=cp.asarray(norm_w), eps=EPS,
              qx_out=qx, impl="mma")
    act_h = cp.asnumpy(act)
    same_bits(act_h, one_row_steps(cp, W_gu, x, m, pro="rmsnorm", epi="swiglu", norm_w=norm_w), "(gate|up with qx_out)")
    assert np.array_equal(cp.asnumpy(qx), qx_ref(act_h)), "the QX words differ from qx_ref of the outputs"
    ts_d, _ = make_weight(rng, consumer, rows=(int(rng.integers(20, 90)) * 2 + 1,), nblocks=F // block_of(consumer))
    W_d = cw.upload(ts_d)
    res = rng.standard_normal((m, W_d.out)).astype(np.float32)
    got = call(cp, W_d, act, m, "mma", "qx", "add", init=res, qx_in=qx)
    same_bits(got, one_row_steps(cp, W_d, act_h, m, epi="add", init=res), "(down over the QX codes)")


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("in_", [12288, 14336])
@pytest.mark.parametrize("blocks", [None, 3])
def test_k_ranges_rows_equal_the_one_row_simt_step(cp, rng, fmt, in_, blocks, monkeypatch):
    """K ranges (one launch per range of k-tiles, the chains carried through the scratch) on
    12288- and 14336-input matrices (the Qwen3-8B and Llama-3-8B down projections) of odd row
    counts: at m = 1..16, prologue qx and none, epilogue store and add, in mma_plan's ranges (a
    split from m = 7 / 6 on an H100; at 9..16 the four-tile class's chains, 3 and 4 n-tiles) and
    in 2 and 3 (past 8 rows: one more than mma_plan's, where 2 do not fit), every row equals the
    SIMT kernel's one-row step bit for bit.  Grids of 3 blocks: dozens of passes per block, any
    block's chains in part."""
    from bw24chat.synthetic import random_matrix

    if blocks:
        tiles_per_block(monkeypatch, blocks)
    rows = int(rng.integers(100, 300)) * 2 + 1
    W = cw.upload([random_matrix(fmt, rows, in_, rng)])
    R = cl.MMA_MAX_ROWS
    x = (rng.standard_normal((R, in_)) * rng.uniform(0.5, 4.0, (R, 1))).astype(np.float32)
    res = rng.standard_normal((R, rows)).astype(np.float32)
    one = one_row_steps(cp, W, x, R)
    one_add = one_row_steps(cp, W, x, R, epi="add", init=res)
    for m in range(1, R + 1):
        qx_in = cp.asarray(qx_ref(x[:m]))
        for r in (None, 2, 3) if m <= cl.MV_MAX_ROWS else (None, cl.mma_plan(W, m, "qx").ranges + 1):
            what = f"(m = {m}, {r or cl.mma_plan(W, m, 'qx').ranges} ranges)"
            same_bits(call(cp, W, x, m, "mma", k_ranges=r), one[:m], "none / store " + what)
            same_bits(call(cp, W, x, m, "mma", "qx", "add", init=res, qx_in=qx_in, k_ranges=r), one_add[:m], "qx / add " + what)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("m", [1, 3, 8, 12, 16])
@pytest.mark.parametrize("blocks", [None, 2])
def test_k_ranges_write_qx(cp, rng, fmt, m, blocks, monkeypatch):
    """qx_out behind K ranges (prologue none, swiglu epilogue): the last range's launch combines
    the passes into 64-row tiles and quantizes them; the outputs equal the SIMT kernel's one-row
    steps and the QX words qx_ref of them, in 2 and 3 ranges (the grids of the ranges' launches
    differ: passes of MQ_RB rows before, qx tiles in the last)."""
    if blocks:
        tiles_per_block(monkeypatch, blocks)
    F = 32 * int(rng.integers(3, 12))
    ts, _ = make_weight(rng, fmt, rows=(F, F), nblocks=3072 // block_of(fmt))
    W = cw.upload(ts, interleave=True)
    x = rng.standard_normal((m, W.in_)).astype(np.float32)
    one = one_row_steps(cp, W, x, m, epi="swiglu")
    for r in (2, 3):
        act = cp.full((m, F), cp.nan, dtype=cp.float32)
        qx = cp.zeros((m, qx_row_words(F)), dtype=cp.uint32)
        cl.matvec(W, cp.asarray(x), act, m, epilogue="swiglu", qx_out=qx, impl="mma", k_ranges=r)
        act_h = cp.asnumpy(act)
        same_bits(act_h, one, f"(swiglu with qx_out, {r} ranges)")
        assert np.array_equal(cp.asnumpy(qx), qx_ref(act_h)), f"the QX words differ from qx_ref of the outputs ({r} ranges)"


@pytest.mark.parametrize("fmt", cl.MMA_S4_FORMATS)
@pytest.mark.parametrize("in_", [576, 896, 1344])
@pytest.mark.parametrize("pro", ["none", "rmsnorm", "swiglu"])
@pytest.mark.parametrize("blocks", [None, 2])
def test_rows_of_64k_inputs(cp, rng, fmt, in_, pro, blocks, monkeypatch):
    """Rows of 576 / 896 / 1344 inputs (SmolLM2-135M's, Qwen2.5-0.5B's, a K range's partial
    k-tiles past one): the scale rows are not 16-byte aligned, so matvec_mma copies them in 4-byte
    pieces (MQ_S4); its rows at m = 2..16 equal the one-row SIMT steps bit for bit, also with the
    add epilogue, on odd row counts and grids of 2 blocks (many passes per block)."""
    from bw24chat.synthetic import random_matrix

    if blocks:
        tiles_per_block(monkeypatch, blocks)
    rows = int(rng.integers(40, 200)) * 2 + 1
    W = cw.upload([random_matrix(fmt, rows, in_, rng)])
    assert cl.matvec_impl(W, True, 2) == "mma" and cl.mma_plan(W, 2).defines.get("MQ_S4") == 1
    R = cl.MMA_MAX_ROWS
    ldx = 2 * in_ if pro == "swiglu" else in_
    x = (rng.standard_normal((R, ldx)) * rng.uniform(0.1, 10.0, (R, 1))).astype(np.float32)
    norm_w = rng.uniform(0.5, 1.5, in_).astype(np.float32) if pro == "rmsnorm" else None
    res = rng.standard_normal((R, rows)).astype(np.float32)
    one = one_row_steps(cp, W, x, R, pro=pro, norm_w=norm_w)
    one_add = one_row_steps(cp, W, x, R, pro=pro, norm_w=norm_w, epi="add", init=res)
    for m in range(2, R + 1):
        same_bits(call(cp, W, x, m, "mma", pro, norm_w=norm_w), one[:m], f"(m = {m})")
        same_bits(call(cp, W, x, m, "mma", pro, "add", norm_w=norm_w, init=res), one_add[:m], f"(add, m = {m})")


QWEN3_8B = [  # (name, rows, inputs, prologue, epilogue)
    ("o", 4096, 4096, "qx", "add"), ("qkv", 6144, 4096, "rmsnorm", "store"), ("gate|up", 24576, 4096, "rmsnorm", "swiglu"),
    ("down", 4096, 12288, "qx", "add"), ("lm_head", 151936, 4096, "rmsnorm", "store")]


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("shape", QWEN3_8B, ids=[s[0] for s in QWEN3_8B])
def test_qwen3_8b_shapes(cp, rng, fmt, shape):
    """Every row of the m-row calls at m = 2..16 equals the one-row SIMT steps (the production
    geometry of each shape) bit for bit, on synthetic weights (bw24chat.synthetic); prologue qx
    over codes quantized from the same floats (the one-row steps take the floats): the down
    projection at m = 7..16 over K ranges (its x does not fit one launch beside the ring)."""
    from bw24chat.synthetic import random_matrix

    name, rows, in_, pro, epi = shape
    W = cw.upload([random_matrix(fmt, rows, in_, rng)])
    R = cl.MMA_MAX_ROWS
    x = (rng.standard_normal((R, in_)) * rng.uniform(0.5, 4.0, (R, 1))).astype(np.float32)
    norm_w = rng.uniform(0.5, 1.5, in_).astype(np.float32) if pro == "rmsnorm" else None
    init = rng.standard_normal((R, rows)).astype(np.float32) if epi == "add" else None
    one = one_row_steps(cp, W, x, R, pro="none" if pro == "qx" else pro, epi=epi, norm_w=norm_w, init=init)
    for m in range(2, R + 1):
        use_qx = pro == "qx" and cl.takes_qx(W, m, impl="mma")
        qx_in = cp.asarray(qx_ref(x[:m])) if use_qx else None
        got = call(cp, W, x, m, "mma", "qx" if use_qx else ("none" if pro == "qx" else pro), epi, norm_w, init=init, qx_in=qx_in)
        same_bits(got, one[:m], f"({name}, m = {m})")
