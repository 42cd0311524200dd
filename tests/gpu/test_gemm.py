"""Prefill GEMM on tensor cores: vs float64 references, relative to sum |x||w|: the precise
(split-bf16 activations, and weights where their values are not bf16 numbers) variant <= 2e-5
against the exact x and W; the plain-bf16 variant <= 1e-3 when x and W are rounded to bf16 first; T not a multiple of
the tile, the add epilogue, and T-independence (rows computed in a T=256 call equal the same
rows of a T=512 call bit for bit)."""
import numpy as np
import pytest

from bw24chat.backends import cuda_weights as cw, tuning
from tests.gpu.test_dequant_embed import FMTS, block_of, make_weight


from bw24chat.backends.kernel_refs import act_q8, act_quant_ref  # noqa: E402
from bw24chat.backends.kernel_refs import bf16_round as bf16  # noqa: E402


def check(got, x, w, tol):
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    bound = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T
    err = np.abs(got.astype(np.float64) - ref)
    assert np.all(err <= tol * bound + 1e-30), f"max rel err {np.max(err / (bound + 1e-30)):.3g}"


def impls():
    """The GEMM kernels this GPU runs: the portable mma.sync kernel always, the wgmma kernel on
    sm_90a (both are tested where both run)."""
    from bw24chat.backends.kernel_build import active_arch

    return ["mma", "wg"] if active_arch() == "sm_90a" else ["mma"]


def run_ab(cp, monkeypatch, W, x, T, precise, base_plan: dict, got_plan: dict):
    """The sm_90a GEMM's output with cuda_linear's planning functions replaced by base_plan (name
    -> function), then by got_plan on top: two paths' A/B."""
    from bw24chat.backends import cuda_linear as cl

    out = []
    for plan in (base_plan, got_plan):
        for name, f in plan.items():
            monkeypatch.setattr(cl, name, f)
        out.append(run(cp, W, x, T, impl="wg", precise=precise))
    return out


def assert_same_bits(base, got):
    bad = np.argwhere(base.view(np.uint32) != got.view(np.uint32))
    assert bad.size == 0, (f"{len(bad)} of {base.size} differ; tokens {np.unique(bad[:, 0])[:12]}, rows "
                           f"{np.unique(bad[:, 1])[:12]}; max |diff| {np.nanmax(np.abs(base - got)):.3g}")


@pytest.fixture(params=["mma", "wg"])
def impl(request, cp):
    if request.param not in impls():
        pytest.skip("the wgmma kernels need sm_90a")
    return request.param


def run(cp, W, x, T, epi="store", init=None, precise=True, impl=None):
    from bw24chat.backends import cuda_linear as cl

    out = cp.full((T, W.out), cp.nan, dtype=cp.float32) if init is None else cp.asarray(init)
    cl.gemm(W, cp.asarray(np.ascontiguousarray(x[:T])), out, T, epilogue=epi, precise=precise, impl=impl)
    return cp.asnumpy(out)


@pytest.mark.parametrize("fmt", FMTS)
def test_gemm_matches_reference(cp, rng, fmt, impl):
    nb = max(1, 320 // block_of(fmt)) + int(rng.integers(0, 3))
    ts, w = make_weight(rng, fmt, rows=(int(rng.integers(100, 200)), int(rng.integers(1, 40))), nblocks=nb)
    W = cw.upload(ts)
    hp = cw.repack_host(ts)
    gs = hp.gscale if hp.gscale is not None else np.ones(W.out, np.float32)
    hp.gscale = None  # the kernel rounds W to bf16 before applying the NVFP4 global scale
    wq = bf16(cw.decode_planes(hp)).astype(np.float64) * gs[:, None]
    for T in (1, 7, 100, 513):
        x = rng.standard_normal((T, W.in_)).astype(np.float32)
        got = run(cp, W, x, T, impl=impl)
        a8 = act_q8(fmt)  # integer-dot formats: x quantized to two exact bf16 levels (fast: the high one)
        check(got, act_quant_ref(x) if a8 else x, w, 2e-5)  # precise: split x (and W where not bf16-exact) -> the exact weights
        fast = run(cp, W, x, T, precise=False, impl=impl)
        check(fast, act_quant_ref(x, 1) if a8 else bf16(x), wq, 1e-3)


@pytest.mark.parametrize("precise", [True, False])
@pytest.mark.parametrize("fmt", ["BF16", "Q8_0", "Q4_K", "NVFP4"])
def test_gemm_rows_do_not_depend_on_T(cp, rng, fmt, precise, impl):
    ts, w = make_weight(rng, fmt, rows=(136,), nblocks=max(1, 512 // block_of(fmt)))
    W = cw.upload(ts)
    x = rng.standard_normal((512, W.in_)).astype(np.float32)
    full = run(cp, W, x, 512, precise=precise, impl=impl)
    a = run(cp, W, x[:256], 256, precise=precise, impl=impl)
    b = run(cp, W, x[256:], 256, precise=precise, impl=impl)
    c = run(cp, W, x[100:], 412, precise=precise, impl=impl)  # a shift that moves rows to other places in their tiles
    assert np.array_equal(full[:256].view(np.uint32), a.view(np.uint32))
    assert np.array_equal(full[256:].view(np.uint32), b.view(np.uint32))
    assert np.array_equal(full[100:].view(np.uint32), c.view(np.uint32))


def test_gemm_add_epilogue(cp, rng, impl):
    ts, w = make_weight(rng, "Q6_K", rows=(130,), nblocks=2)
    W = cw.upload(ts)
    x = rng.standard_normal((9, W.in_)).astype(np.float32)
    res = rng.standard_normal((9, W.out)).astype(np.float32)
    y = run(cp, W, x, 9, impl=impl)
    assert np.array_equal(run(cp, W, x, 9, epi="add", init=res, impl=impl), (res + y).astype(np.float32))


@pytest.mark.parametrize("precise", [True, False])
@pytest.mark.parametrize("stages,bn", [(3, 128), (4, 128), (3, 256), (4, 256)])
@pytest.mark.parametrize("fmt", ["BF16", "Q8_0", "NVFP4", "F16"])
def test_gemm_wgp_geometries_agree(cp, rng, fmt, stages, bn, precise, monkeypatch):
    """gemm_wgp (x as bf16 planes, weights as bf16 planes read in place (BF16) or dequantized a
    row block at a time (others), cp.async ring) gives the same bits for every ring depth, tile
    width and row blocking it runs with (cuda_linear.wgp_geometry picks them by matrix shape), T
    and n_in off the tiles; the add epilogue."""
    from bw24chat.backends import cuda_linear as cl

    if "wg" not in impls():
        pytest.skip("gemm_wgp needs sm_90a")
    nb = max(1, 600 // block_of(fmt))  # n_in ~600: a partial last k tile (Q8_0: off gemm_i8's multiples of 128)
    ts, w = make_weight(rng, fmt, rows=(333, 290), nblocks=nb)
    W = cw.upload(ts)
    x = rng.standard_normal((259, W.in_)).astype(np.float32)
    from bw24chat.backends.kernel_build import smem_block_limit

    w_lo = precise and fmt not in cl._W_EXACT_IN_BF16
    if cl.wgp_smem(stages, cl.wg_stage_bytes(precise, w_lo, bn)) > smem_block_limit():
        pytest.skip("a ring this deep does not fit the shared memory (wgp_geometry never picks it)")
    base = run(cp, W, x, 259, impl="wg", precise=precise)
    monkeypatch.setattr(cl, "wgp_geometry", lambda n_out, p, w_lo: (bn, stages, cl.wg_stage_bytes(p, w_lo, bn)))
    monkeypatch.setattr(tuning, "GEMM_DEQ_VALUES", 1)  # 256-row blocks: 623 rows take three
    got = run(cp, W, x, 259, impl="wg", precise=precise)
    assert_same_bits(base, got)
    res = rng.standard_normal((259, W.out)).astype(np.float32)
    added = run(cp, W, x, 259, epi="add", init=res, impl="wg", precise=precise)
    assert np.array_equal(added, (res + got).astype(np.float32))
    if precise:
        check(got, act_quant_ref(x) if act_q8(fmt) else x, w, 2e-5)


@pytest.mark.parametrize("precise", [True, False])
@pytest.mark.parametrize("stages", [3, 4])
@pytest.mark.parametrize("bt", [128, 256])
@pytest.mark.parametrize("fmt", ["NVFP4", "Q4_K", "Q8_0"])
def test_gemm_wra_equals_the_dequant_pass(cp, rng, fmt, bt, stages, precise, monkeypatch):
    """gemm_wra (the codes decoded into wgmma's register operand A, weights as M and tokens as
    N) gives the bits of the dequantize-then-gemm_wgp path (the 4096-row matrices'): the same bf16
    products (Q4_K precise: W_hi and W_lo) and the same order per k16 step, with the operand
    roles swapped.  Rows, T and the k-tile count off every tile (501 rows, 259 tokens; NVFP4 9 k
    tiles: the two-set loop's tail), and the add epilogue."""
    if "wg" not in impls():
        pytest.skip("gemm_wra needs sm_90a")
    ts, w = make_weight(rng, fmt, rows=(301, 200), nblocks={"NVFP4": 9, "Q4_K": 3, "Q8_0": 18}[fmt])
    W = cw.upload(ts)
    x = rng.standard_normal((259, W.in_)).astype(np.float32)
    # Q8_0: the pass + gemm_wgp (the bf16 split), not gemm_i8, is the base
    from bw24chat.backends import cuda_linear as cl

    from bw24chat.backends.kernel_build import smem_block_limit

    if cl.wgp_smem(stages, cl.wra_stage_bytes(precise, bt, fmt)) > smem_block_limit():
        pytest.skip("a ring this deep does not fit the shared memory (wra_geometry never picks it)")
    geometry = lambda n_out, p, fmt, w_split=False: (bt, stages, cl.wra_stage_bytes(p, bt, fmt))  # noqa: E731
    no_i8 = lambda W, impl="wg": False  # noqa: E731
    base, got = run_ab(cp, monkeypatch, W, x, 259, precise, {"uses_gemm_wra": lambda W: False, "uses_gemm_i8": no_i8},
                       {"uses_gemm_wra": lambda W: True, "wra_geometry": geometry})
    assert_same_bits(base, got)
    res = rng.standard_normal((259, W.out)).astype(np.float32)
    added = run(cp, W, x, 259, epi="add", init=res, impl="wg", precise=precise)
    assert np.array_equal(added, (res + got).astype(np.float32))


@pytest.mark.parametrize("precise", [True, False])
@pytest.mark.parametrize("fmt", ["BF16", "Q8_0", "Q4_K", "NVFP4"])
def test_portable_gemm_one_buffer_gives_the_same_bits(cp, rng, fmt, precise, monkeypatch):
    """The portable mma.sync gemm with one tile buffer (gemm_mma.cu GM_BUFS = 1, what the 99 KB GPUs
    run in precise mode: cuda_linear.gemm_bufs) equals the double-buffered kernel bit for bit:
    the same MMAs per output in the same order.  Odd rows, tokens and k tiles."""
    ts, w = make_weight(rng, fmt, rows=(150, 83), nblocks=max(1, 1100 // block_of(fmt)))
    W = cw.upload(ts)
    x = rng.standard_normal((203, W.in_)).astype(np.float32)
    from bw24chat.backends import cuda_linear as cl

    monkeypatch.setattr(cl, "uses_gemm_i8", lambda W, impl="wg": False)  # Q8_0 precise on this kernel, not gemm_i8_mma
    base = run(cp, W, x, 203, impl="mma", precise=precise)
    assert not np.isnan(base).any()
    monkeypatch.setattr(cl, "gemm_bufs", lambda x_split, w_split, bm=cl.GM_TILE: 1)
    assert_same_bits(base, run(cp, W, x, 203, impl="mma", precise=precise))


@pytest.mark.parametrize("precise", [True, False])
@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_K", "NVFP4"])
def test_integer_dot_prefill_kernels_give_the_same_bits(cp, rng, fmt, precise):
    """Under the integer-dot contract the portable mma.sync kernel (the sm_120a path) and gemm_wgp /
    gemm_wra take x as the same two code-level planes, so a prefill gives the same bits whichever
    kernel the GPU runs."""
    if "wg" not in impls():
        pytest.skip("the comparison needs the sm_90a kernels")
    ts, w = make_weight(rng, fmt, rows=(150,), nblocks=max(1, 800 // block_of(fmt)))
    W = cw.upload(ts)
    x = rng.standard_normal((140, W.in_)).astype(np.float32)
    ref = run(cp, W, x, 140, impl="mma", precise=precise)
    for impl in ("wg",):
        got = run(cp, W, x, 140, impl=impl, precise=precise)
        assert np.array_equal(ref.view(np.uint32), got.view(np.uint32)), impl


def test_gemm_f32_rows_not_a_multiple_of_8(cp, rng, impl):
    """F32 weights of 4k + 4 inputs (the one format whose rows need not hold whole 16-byte bf16
    units): sm_90a takes the portable kernel for them, every path matches the reference."""
    ts, w = make_weight(rng, "F32", rows=(70,), nblocks=81)  # n_in = 324
    W = cw.upload(ts)
    x = rng.standard_normal((37, W.in_)).astype(np.float32)
    check(run(cp, W, x, 37, impl=impl), x, w, 2e-5)


def test_act_quant_kernel_matches_reference(cp, rng):
    """gemm_act.cu act_quant (the integer-dot contract's activation quantization, shared with the
    decode matvec's staging) equals kernel_refs.act_quant_codes bit for bit: the bf16 planes
    2^e h and 2^(e-8) l (their exact sum is kernel_refs.act_quant_ref), and the one-level hi
    plane alone; random rows, an all-zero block, tiny (subnormal) and huge blocks, exact .5 ties."""
    from bw24chat.backends import cuda_linear as cl
    from bw24chat.backends.kernel_refs import act_quant_codes, bf16_round_bits

    T, n = 7, 32 * 37
    x = (rng.standard_normal((T, n)) * np.exp(rng.uniform(-8, 8, (T, n // 32, 1))).repeat(32, -1).reshape(T, n)).astype(np.float32)
    x[0, :32] = 0.0
    x[1, 32:64] = rng.standard_normal(32).astype(np.float32) * np.float32(1e-39)  # subnormal inputs
    x[2, 64:96] = rng.standard_normal(32).astype(np.float32) * np.float32(1e37)
    x[3, 96:128] = (np.arange(32) - 15.5).astype(np.float32)  # amax 16.5 -> e = -2: codes at .5 ties
    h, l, e = act_quant_codes(x)
    step = np.ldexp(1.0, e).repeat(32, -1).reshape(T, n)
    hi, lo = (h * step).astype(np.float32), (l * step / 256).astype(np.float32)
    xd = cp.asarray(x)
    g_hi, g_lo = cl._act_quant(xd, T * n)
    assert np.array_equal(cp.asnumpy(g_hi[: T * n]).reshape(T, n), bf16_round_bits(hi))
    assert np.array_equal(cp.asnumpy(g_lo[: T * n]).reshape(T, n), bf16_round_bits(lo))
    assert np.array_equal(bf16(hi), hi) and np.array_equal(bf16(lo), lo)  # both parts exact in bf16
    assert np.array_equal((hi + lo).view(np.uint32), act_quant_ref(x).view(np.uint32))  # their sum: the contract's x
    one, none = cl._act_quant(xd, T * n, with_lo=False)
    assert none is None
    assert np.array_equal(cp.asnumpy(one[: T * n]).reshape(T, n), bf16_round_bits(act_quant_ref(x, 1)))


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_K", "Q6_K", "NVFP4", "Q4_1"])
def test_integer_dot_gemm_matches_reference(cp, rng, fmt, impl):
    """The integer-dot contract in prefill, forced for every quantized format: x quantized into
    two exact bf16 levels (act_quant), precise = both levels and W split where not bf16-exact ->
    act_quant_ref(x) @ W within f32 accumulation error; fast = the high level, W rounded."""
    from bw24chat.backends import cuda_linear as cl

    nb = max(1, 320 // block_of(fmt)) + int(rng.integers(0, 3))
    ts, w = make_weight(rng, fmt, rows=(int(rng.integers(100, 200)), int(rng.integers(1, 40))), nblocks=nb)
    W = cw.upload(ts)
    hp = cw.repack_host(ts)
    gs = hp.gscale if hp.gscale is not None else np.ones(W.out, np.float32)
    hp.gscale = None
    wq = bf16(cw.decode_planes(hp)).astype(np.float64) * gs[:, None]
    for T in (1, 100, 513):
        x = rng.standard_normal((T, W.in_)).astype(np.float32)
        xq = act_quant_ref(x)
        for precise, xin, ref_w, tol in ((True, xq, w, 2e-5), (False, act_quant_ref(x, 1), wq, 1e-3)):
            out = cp.full((T, W.out), cp.nan, dtype=cp.float32)
            cl.gemm(W, cp.asarray(x), out, T, precise=precise, impl=impl, act_quant=True)
            check(cp.asnumpy(out), xin, ref_w, tol)


@pytest.mark.parametrize("T", [1, 77, 300])
def test_gemm_i8_mma_is_gemm_i8s_contract(cp, rng, T, monkeypatch):
    """gemm_i8_mma (gemm_i8.cu: the portable path's Q8_0 precise prefill on mma.sync s8): within
    2e-6 of act_quant_ref(x) @ W.T (integer block dots exact, one I2F and one FMA rounding per
    block), rows independent of T, the add epilogue, the decode matvec within 1e-6 — and on
    sm_90a bit-identical to gemm_i8 (the same fold in the same order).  Odd rows and tokens,
    more k tiles than ring stages."""
    from bw24chat.backends import cuda_linear as cl
    from bw24chat.backends.kernel_build import active_arch

    ts, w = make_weight(rng, "Q8_0", rows=(int(rng.integers(60, 200)),), nblocks=4 * int(rng.integers(2, 25)))
    W = cw.upload(ts)
    assert cl.uses_gemm_i8(W, "mma")
    x = (rng.standard_normal((T, W.in_)) * rng.uniform(0.01, 10.0, (T, 1))).astype(np.float32)
    got = run(cp, W, x, T, impl="mma")
    xq = act_quant_ref(x)
    check(got, xq, w, 2e-6)
    for r in {0, T // 2, T - 1}:
        one = run(cp, W, x[r:r + 1], 1, impl="mma")
        assert np.array_equal(one.view(np.uint32), got[r:r + 1].view(np.uint32)), f"row {r} depends on T"
    res = rng.standard_normal((T, W.out)).astype(np.float32)
    assert np.array_equal(run(cp, W, x, T, epi="add", init=res, impl="mma"), (res + got).astype(np.float32))
    mv = cp.full((1, W.out), cp.nan, dtype=cp.float32)
    cl.matvec(W, cp.asarray(x[:1]), mv, 1)
    bound = np.abs(xq[:1].astype(np.float64)) @ np.abs(w.astype(np.float64)).T
    assert np.all(np.abs(cp.asnumpy(mv).astype(np.float64) - got[:1]) <= 1e-6 * bound + 1e-30)
    if active_arch() == "sm_90a":
        assert cl.uses_gemm_i8(W)
        assert_same_bits(run(cp, W, x, T, impl="wg"), got)


@pytest.mark.parametrize("T", [1, 77, 300])
def test_gemm_i8_matches_the_integer_dot_reference(cp, rng, T, monkeypatch):
    """gemm_i8 (gemm_i8.cu: Q8_0 precise prefill on the int8 wgmma): act_quant_qx
    writes kernel_refs.qx_ref(x) word for word; the product equals act_quant_ref(x) @ W.T within
    2e-6 of sum |x||w| (integer dots exact, one I2F and one FMA rounding per block); rows do not
    depend on T (each row of the T-row call equals its 1-row call bit for bit); the add epilogue;
    and it agrees with the decode matvec on the same contract (~1e-7)."""
    from bw24chat.backends import cuda_linear as cl
    from bw24chat.backends.kernel_build import active_arch
    from bw24chat.backends.kernel_refs import qx_ref, qx_row_words

    if active_arch() != "sm_90a":
        pytest.skip("gemm_i8 runs on sm_90a (int8 wgmma)")
    # more k tiles (128 inputs) than ring stages, so the cp.async ring wraps (an undersized stage
    # would overrun shared memory only from the fourth tile on)
    ts, w = make_weight(rng, "Q8_0", rows=(int(rng.integers(60, 200)),), nblocks=4 * int(rng.integers(9, 25)))
    W = cw.upload(ts)
    assert cl.uses_gemm_i8(W)
    x = (rng.standard_normal((T, W.in_)) * rng.uniform(0.01, 10.0, (T, 1))).astype(np.float32)
    got = run(cp, W, x, T)
    check(got, act_quant_ref(x), w, 2e-6)
    qx = cl._scratch_u16("x_qx", 2 * T * qx_row_words(W.in_))[:2 * T * qx_row_words(W.in_)]
    assert np.array_equal(cp.asnumpy(qx).view(np.uint32).reshape(T, -1), qx_ref(x))
    for r in {0, T // 2, T - 1}:
        one = run(cp, W, x[r:r + 1], 1)
        assert np.array_equal(one.view(np.uint32), got[r:r + 1].view(np.uint32)), f"row {r} depends on T"
    res = rng.standard_normal((T, W.out)).astype(np.float32)
    assert np.array_equal(run(cp, W, x, T, epi="add", init=res), (res + got).astype(np.float32))
    mv = cp.full((1, W.out), cp.nan, dtype=cp.float32)
    cl.matvec(W, cp.asarray(x[:1]), mv, 1)
    ref = act_quant_ref(x[:1]).astype(np.float64) @ w.astype(np.float64).T
    bound = np.abs(act_quant_ref(x[:1]).astype(np.float64)) @ np.abs(w.astype(np.float64)).T
    assert np.all(np.abs(cp.asnumpy(mv).astype(np.float64) - got[:1]) <= 1e-6 * bound + 1e-30)
    assert np.all(np.abs(got[:1] - ref) <= 2e-6 * bound + 1e-30)
