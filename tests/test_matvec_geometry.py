"""The decode matvec geometry the wrapper picks (cuda_linear._simt_defines), checked without a GPU:
the measured choices (docs/performance.md) stay wired to the shapes they were measured on (the
compile side of the picked builds: tests/test_kernel_compile.py).  Shapes: Qwen3-8B (qkv 6144x4096, o 4096x4096, gate|up 24576x4096,
down 4096x12288, LM head 49152x4096)."""
import types

import pytest

from bw24chat.backends import cuda_linear as cl, tuning
from bw24chat.backends.cuda_weights import FORMATS

QKV, O, GATE_UP, DOWN, LM_HEAD = (6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (49152, 4096)
def defs(fmt, shape, m=1, a8=True):
    return cl._simt_defines(types.SimpleNamespace(fmt=fmt, out=shape[0], in_=shape[1]), m, a8)


def test_nvfp4_wide_matrices_take_four_rows_per_warp():
    for shape in (QKV, GATE_UP, LM_HEAD):
        d = defs("NVFP4", shape)
        assert (d["MV_R"], d["MV_U"], d["MV_MINB"], d["MV_STEADY"]) == (4, 1, 2, 1), shape
    for shape in (O, DOWN):  # 128 tiles of 32 rows would leave blocks idle: two rows per warp
        assert "MV_R" not in defs("NVFP4", shape), shape
    assert defs("NVFP4", O) == {"MV_U": 2, "MV_MINB": 2, "MV_STEADY": 1, "MV_NW": 16}


def test_nvfp4_o_and_down_at_sixteen_warps_per_block():
    """Blocks of 16 warps for NVFP4's 4096-row matrices (one prologue per SM instead of two); the
    wrapper keeps 8 where the prologue is an rmsnorm (qkv / gate|up of small models), and m > 1
    keeps the defaults."""
    for shape in (O, DOWN):
        d = defs("NVFP4", shape)
        assert d["MV_NW"] == 16, shape
        assert cl._warps_per_block(dict(d), cl.PROLOGUES["none"]) == 16
        assert cl._warps_per_block(dict(d), cl.PROLOGUES["rmsnorm"]) == 8
    assert "MV_NW" not in defs("NVFP4", DOWN, m=2)


def test_sixteen_warps_where_measured_faster():
    """NVFP4 / Q8_0 / Q4_K's rmsnorm matrices (qkv, gate|up, LM head) at 16 warps with the 8-warp
    statistic (rows bit-identical) and 4 rows per warp (64-row gate|up tiles, so QX); Q8_0 /
    Q4_K down at 16 warps but not their o; BF16 all on SIMT: o / down at 16 warps, gate|up / LM
    head with the 8-warp statistic, qkv at 8."""
    rms, none = cl.PROLOGUES["rmsnorm"], cl.PROLOGUES["none"]
    for fmt in ("NVFP4", "Q8_0", "Q4_K"):
        for shape in (QKV, GATE_UP, LM_HEAD):
            d = defs(fmt, shape)
            assert cl._warps_per_block(d, rms) == 16 and d["MV_STAT8"] == 1 and d["MV_MINB"] == 1, (fmt, shape)
            assert d["MV_R"] == 4, (fmt, shape)
    for fmt in ("Q8_0", "Q4_K"):
        assert cl._warps_per_block(defs(fmt, DOWN), none) == 16, fmt
        assert cl._warps_per_block(defs(fmt, O), none) == 8, fmt
    for shape in (O, DOWN):
        assert cl._warps_per_block(defs("BF16", shape, a8=False), none) == 16, shape
    for shape in (GATE_UP, LM_HEAD):
        d = defs("BF16", shape, a8=False)
        assert cl._warps_per_block(d, rms) == 16 and d["MV_STAT8"] == 1, shape
    assert cl._warps_per_block(defs("BF16", QKV, a8=False), rms) == 8
    for shape in (O, DOWN, QKV, GATE_UP, LM_HEAD):
        assert cl.matvec_impl(types.SimpleNamespace(fmt="BF16", out=shape[0], in_=shape[1])) == "simt", shape


def test_wide_integer_dot_matrices_as_two_blocks_of_eight_warps_per_sm():
    """4 rows per warp at 2 blocks of 8 warps per SM (one of 16 after _warps_per_block), the LM
    head included."""
    for fmt in ("NVFP4", "Q4_K", "Q8_0"):
        for shape in (QKV, GATE_UP, LM_HEAD):
            d = defs(fmt, shape)
            assert (d["MV_MINB"], d["MV_R"], d["MV_U"], d["MV_STEADY"]) == (2, 4, 1, 1), (fmt, shape)


def test_speculative_rows_take_their_own_table():
    """m > 1 (verify / batched decode): Q8_0, NVFP4 and Q4_K under the integer-dot contract on
    matvec_mma (the same bits as the SIMT kernel, its m-row steps faster: docs/performance.md), the
    other integer-dot formats on the SIMT kernel at its defaults; the float path's SIMT builds keep
    the registers of 2 blocks per SM (MATVEC_ROWS_TUNING: BF16's 2-row step ran at one block of 8
    warps per SM and slower than its 3-row step); rows stay bit-equal to m = 1 whatever the kernel
    or geometry (tests/gpu/test_matvec.py, tests/gpu/test_matvec_mma.py)."""
    W = lambda fmt, shape: types.SimpleNamespace(fmt=fmt, out=shape[0], in_=shape[1])  # noqa: E731
    for fmt in ("NVFP4", "Q4_K", "Q8_0", "Q5_K", "Q6_K"):
        for shape in (QKV, O, GATE_UP, DOWN, LM_HEAD):
            assert cl.matvec_impl(W(fmt, shape), True) == "simt", (fmt, shape)
            for m in range(2, 9):
                assert cl.matvec_impl(W(fmt, shape), True, m) == ("mma" if fmt in cl.MMA_FORMATS else "simt"), (fmt, m)
                assert defs(fmt, shape, m=m) == ({"MV_U": 1} if fmt == "Q8_0" else {}), (fmt, shape, m)
    assert cl.matvec_impl(W("Q8_0", (4096, 4000)), True, 4) == "simt"  # matvec_mma takes rows of 256k inputs,
    for fmt in ("Q8_0", "NVFP4"):  # or of 64k for Q8_0 / NVFP4 (4-byte scale pieces: MQ_S4)
        assert cl.matvec_impl(W(fmt, (49152, 576)), True, 4) == "mma", fmt
    assert cl.matvec_impl(W("Q4_K", (4096, 576)), True, 4) == "simt"  # its scales are per 256-value superblock
    assert cl.matvec_impl(W("NVFP4", O), False) == "tc"  # NVFP4's float contract stays on matvec_tc
    for fmt in ("BF16", "F16", "F32"):
        for m in range(2, 9):
            assert defs(fmt, O, m=m, a8=False) == {"MV_MINB": 2}, (fmt, m)
    assert defs("Q4_1", O, m=1, a8=False) == {}


def test_small_float_contract_rows_take_a_row_per_warp():
    """Q4_1's m-row builds (SmolLM2-135M's 576-input matrices: MATVEC_ROWS_TUNING) take one row
    per warp and one load slot, except under the swiglu epilogue, which pairs rows inside a warp:
    16 warps there, the rmsnorm statistic in the 8-warp order; the one-row step keeps its own."""
    rms = cl.PROLOGUES["rmsnorm"]
    for shape in ((960, 576), (576, 576), (576, 1536)):
        W = types.SimpleNamespace(fmt="Q4_1", out=shape[0], in_=shape[1])
        for m in range(2, 9):
            d, rows, nw = cl._simt_geometry(W, m, False, rms)
            assert (rows, nw, d.get("MV_U")) == (1, 8, 1), (shape, m)
        assert cl._simt_geometry(W, 1, False, rms)[1] == cl.MV_R
    gu = types.SimpleNamespace(fmt="Q4_1", out=3072, in_=576)
    for m in range(2, 9):
        d, rows, nw = cl._simt_geometry(gu, m, False, rms, swiglu=True)
        assert (rows, nw, d.get("MV_STAT8")) == (cl.MV_R, 16, 1), m
    assert cl._simt_geometry(gu, 1, False, rms, swiglu=True)[2] == 8


def test_bf16_wide_matrices_take_four_rows_per_warp():
    """BF16 on the SIMT kernel at m = 1: gate|up and the LM head at 4 rows per warp, 1 slot, 2
    blocks per SM; qkv and the 4096-row matrices keep 2 rows."""
    for shape in (GATE_UP, LM_HEAD):
        d = defs("BF16", shape, a8=False)
        assert (d["MV_R"], d["MV_U"], d["MV_MINB"], d["MV_STEADY"]) == (4, 1, 2, 1), shape
    assert defs("BF16", QKV, a8=False) == {"MV_STEADY": 1}
    for shape in (O, DOWN):
        assert defs("BF16", shape, a8=False) == {"MV_STEADY": 1, "MV_NW": 16}, shape
    assert "MV_R" not in defs("BF16", GATE_UP, m=2, a8=False)


def test_sixteen_warps_only_without_an_rmsnorm_statistic():
    """Blocks of 16 warps for the matvecs whose prologue has no rmsnorm statistic (its summation order follows the block size); a 16-warp block stands for
    two of 8, so the blocks per SM the registers must allow halve."""
    d = {"MV_NW": 16, "MV_MINB": 2, "MV_U": 3}
    assert cl._warps_per_block(d, cl.PROLOGUES["none"]) == 16 and d["MV_MINB"] == 1
    d = {"MV_NW": 16}
    assert cl._warps_per_block(d, cl.PROLOGUES["swiglu"]) == 16 and d["MV_MINB"] == 1
    d = {"MV_NW": 16, "MV_MINB": 3}
    assert cl._warps_per_block(d, cl.PROLOGUES["rmsnorm"]) == 8 and d == {"MV_MINB": 3}
    d = {"MV_U": 2}
    assert cl._warps_per_block(d, cl.PROLOGUES["none"]) == 8 and d == {"MV_U": 2}


def test_qx_is_written_where_tiles_cover_whole_input_blocks(monkeypatch):
    """The gate|up epilogue writes the down projection's x codes (matvec.cu qx_out) only where
    its tiles are 64 rows = 32 outputs = one 32-input block: the gate|up of NVFP4, Q8_0 and Q4_K
    (16 warps x 4 rows) at m = 1, and matvec_mma's 64-row qx tiles at m = 2..8, which the down
    projection takes at every m (at 7 and 8 on an H100 in two K ranges: its x does not fit one
    launch); the SIMT kernel at m > 1, BF16 and a geometry of 8 warps x 2 rows keep the down
    prologue's quantization."""
    W = lambda fmt, shape: types.SimpleNamespace(fmt=fmt, out=shape[0], in_=shape[1], vpc=FORMATS[fmt][1])  # noqa: E731
    monkeypatch.setattr(cl, "_sm_resources", lambda: (132, 228 * 1024))
    monkeypatch.setattr(cl.kernel_build, "smem_block_limit", lambda: 227 * 1024)
    for fmt in ("NVFP4", "Q8_0", "Q4_K"):
        assert cl.writes_qx(W(fmt, GATE_UP), 1), fmt
        assert not cl.writes_qx(W(fmt, GATE_UP), 2, impl="simt"), fmt
        for m in range(2, 9):
            assert cl.writes_qx(W(fmt, GATE_UP), m), (fmt, m)
            assert cl.takes_qx(W(fmt, DOWN), m), (fmt, m)
            nkt = cl.mma_k_tiles(W(fmt, DOWN))  # 24 Q8_0, 12 NVFP4 / Q4_K
            assert cl.mma_plan(W(fmt, DOWN), m, "qx").kt_bounds == ((0, nkt) if m <= 6 else (0, nkt // 2, nkt)), (fmt, m)
            assert cl.mma_plan(W(fmt, DOWN), m, "rmsnorm").m_fit == min(m, 6), (fmt, m)
    assert not cl.writes_qx(W("BF16", GATE_UP), 1)
    with monkeypatch.context() as mp:  # Q8_0 / Q4_K at 2 rows per warp
        for fmt in ("Q8_0", "Q4_K"):
            mp.setitem(tuning.MATVEC_TUNING, (True, fmt, "wide"), {})
        for fmt in ("Q8_0", "Q4_K"):
            assert not cl.writes_qx(W(fmt, GATE_UP), 1), fmt
    for fmt in ("NVFP4", "Q8_0", "Q4_K"):
        assert cl.takes_qx(W(fmt, DOWN)), fmt
    assert not cl.takes_qx(W("BF16", DOWN))


def test_qx_ref_layout():
    """kernel_refs.qx_ref: h words, l words, then per 32-block {e, sum h 0-15, sum h 16-31,
    packed l sums}; the codes reproduce act_quant_ref's values."""
    import numpy as np

    from bw24chat.backends.kernel_refs import act_quant_codes, act_quant_ref, qx_ref, qx_row_words

    rng = np.random.default_rng(7)
    x = (rng.standard_normal((3, 160)) * rng.uniform(0.01, 100, (3, 1))).astype(np.float32)
    q = qx_ref(x)
    assert q.shape == (3, qx_row_words(160)) and q.dtype == np.uint32
    n = 160
    h = q[:, :n // 4].copy().view(np.int8).astype(np.int64)
    lo = q[:, n // 4:n // 2].copy().view(np.int8).astype(np.int64)
    rec = q[:, n // 2:].copy().view(np.int32).reshape(3, n // 32, 4)
    e = rec[..., 0]
    vals = (h.reshape(3, -1, 32) * 2.0 ** e[..., None] + lo.reshape(3, -1, 32) * 2.0 ** (e[..., None] - 8)).reshape(3, n)
    assert np.array_equal(vals.astype(np.float32), act_quant_ref(x))
    hh, ll, ee = act_quant_codes(x)
    assert np.array_equal(rec[..., 1], hh.reshape(3, -1, 2, 16).sum(-1, dtype=np.int64)[..., 0])
    assert np.array_equal(rec[..., 2], hh.reshape(3, -1, 2, 16).sum(-1, dtype=np.int64)[..., 1])
    sl = ll.reshape(3, -1, 2, 16).sum(-1, dtype=np.int64)
    assert np.array_equal(rec[..., 3] >> 16, sl[..., 1])
    assert np.array_equal(((rec[..., 3] & 0xFFFF) ^ 0x8000) - 0x8000, sl[..., 0])


def test_gemm_i8_serves_q8_0_rows_of_a_multiple_of_128():
    """gemm_i8 (faster than the bf16 split) serves Q8_0 rows of a multiple of 128, gemm_i8_mma the
    portable path's of a multiple of 64."""
    W = lambda fmt, in_: types.SimpleNamespace(fmt=fmt, out=4096, in_=in_)  # noqa: E731
    assert cl.uses_gemm_i8(W("Q8_0", 4096)) and cl.uses_gemm_i8(W("Q8_0", 12288))
    assert not cl.uses_gemm_i8(W("Q8_0", 4096 + 32)) and not cl.uses_gemm_i8(W("Q4_K", 4096))
    # the portable path (gemm_i8_mma): every Q8_0 matrix of whole 64-input k tiles, wide ones too
    assert cl.uses_gemm_i8(W("Q8_0", 4096 + 64), "mma") and not cl.uses_gemm_i8(W("Q8_0", 4096 + 32), "mma")
    assert cl.uses_gemm_i8(types.SimpleNamespace(fmt="Q8_0", out=24576, in_=4096), "mma")
    assert not cl.uses_gemm_i8(W("Q4_K", 4096), "mma")


def test_wide_matrices_fill_the_multiprocessors_with_three_rows_per_warp(monkeypatch):
    """Where 64-row tiles (4 rows x 16 warps) leave multiprocessors without a tile (Qwen3-8B qkv:
    96 tiles on 132 SMs) and 48-row tiles do not need a second round (128), the wrapper takes 3
    rows per warp — Q8_0's with 2 load slots (the others keep 1) — never under the swiglu
    epilogue (row pairs, QX's 64-row tiles: gate|up keeps 4 and writes QX); an odd row count
    under swiglu is refused."""
    monkeypatch.setattr(cl, "_sm_resources", lambda: (132, 233472))
    rms = cl.PROLOGUES["rmsnorm"]

    def geometry(shape, swiglu=False, fmt="NVFP4", m=1):
        W = types.SimpleNamespace(fmt=fmt, out=shape[0], in_=shape[1])
        defs, rows, nw = cl._simt_geometry(W, m, True, rms, swiglu=swiglu)
        return rows, nw, defs["MV_U"] if "MV_U" in defs else None

    for fmt in ("NVFP4", "Q8_0", "Q4_K"):
        assert geometry(QKV, fmt=fmt) == (3, 16, 2 if fmt == "Q8_0" else 1), fmt
        assert geometry(GATE_UP, fmt=fmt) == (4, 16, 1) and geometry(LM_HEAD, fmt=fmt) == (4, 16, 1), fmt
        assert geometry((5120, 2048), swiglu=True, fmt=fmt)[:2] == (4, 16), fmt  # a small gate|up keeps QX's tiles
    assert geometry((5120, 2048))[:2] == (3, 16)  # Qwen3-30B-A3B's qkv: 80 tiles of 64 rows, 107 of 48
    assert geometry((8448, 4096))[:2] == (4, 16)  # 132 tiles of 64 rows fill them already
    assert geometry((9000, 4096))[:2] == (4, 16)  # 188 tiles of 48 rows would need a second round
    assert geometry(QKV, m=2)[0] != 3
    # a plain BF16 / F32 output of at most FEW_ROWS rows (an MoE router's) takes one row per warp;
    # a gate|up that small (tiny models, a MoE's small shared expert) keeps row pairs under swiglu
    for fmt in ("BF16", "F32"):
        W = types.SimpleNamespace(fmt=fmt, out=512, in_=256)
        assert cl._simt_geometry(W, 1, False, rms)[1] == 1
        assert cl._simt_geometry(W, 1, False, rms, swiglu=True)[1] % 2 == 0
    monkeypatch.setattr(cl, "_simt_defines", lambda W, m, a8, swiglu=False: {"MV_R": 3})
    with pytest.raises(ValueError, match="pairs rows"):
        geometry(GATE_UP, swiglu=True)


def test_a_router_takes_one_row_per_warp():
    """An MoE router's logits (F32 / BF16, at most FEW_ROWS rows: 128 x 2048 for Qwen3-30B-A3B):
    one row per warp (a row is one warp's, so this doubles the blocks of a 1 MB matrix) and 8
    load slots; quantized matrices that short keep what they had, and m > 1 takes
    MATVEC_ROWS_TUNING's entry."""
    for fmt in ("F32", "BF16"):
        d = defs(fmt, (128, 2048), a8=False)
        assert (d["MV_R"], d["MV_U"], d["MV_MINB"]) == (1, 8, 2), fmt
        assert defs(fmt, (128, 2048), m=2, a8=False) == tuning.MATVEC_ROWS_TUNING[(False, fmt, "*")]
        assert defs(fmt, (tuning.FEW_ROWS + 1, 2048), a8=False).get("MV_R") != 1
    assert defs("Q8_0", (128, 2048)) == defs("Q8_0", O)


def test_rows_of_64k_inputs_copy_their_scales_in_4_byte_pieces(monkeypatch):
    """matvec_mma's plan for Q8_0 / NVFP4 rows whose scale rows are not 16-byte aligned (576 and
    896 inputs: SmolLM2-135M's LM head, Qwen2.5-0.5B) builds MQ_S4; rows of 256k inputs do not."""
    from bw24chat.backends import kernel_build
    from bw24chat.backends.cuda_weights import FORMATS

    monkeypatch.setattr(cl, "_sm_resources", lambda: (132, 228 * 1024))
    monkeypatch.setattr(kernel_build, "smem_block_limit", lambda: 227 * 1024)
    W = lambda fmt, shape: types.SimpleNamespace(fmt=fmt, out=shape[0], in_=shape[1], vpc=FORMATS[fmt][1])  # noqa: E731
    for fmt in ("Q8_0", "NVFP4"):
        for in_ in (576, 896):
            for m in (2, 8, 16):
                p = cl.mma_plan(W(fmt, (49152, in_)), m)
                assert p.defines.get("MQ_S4") == 1 and p.m_fit == m and p.ranges == 1, (fmt, in_, m)
        assert "MQ_S4" not in cl.mma_plan(W(fmt, (4096, 4096)), 4).defines, fmt
