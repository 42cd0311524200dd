"""The kernels the 99 KB GPUs run (sm_86 / sm_89 / sm_120: 101,376 bytes of dynamic shared memory
per block, CUDA C++ Programming Guide) ask for no more than that.  The H200 the GPU tests run on
allows 227 KB, so an oversized launch there passes and fails only on the consumer GPUs: these
checks size every such launch's shared memory with the limit replaced by 99 KB (no GPU needed).
The smaller variants they pick (one GEMM tile buffer, one prefill K/V stage, one decode half
over two tiles, fewer integer-dot rows per launch) compute the same arithmetic in the same order;
tests/gpu/test_gemm.py and test_attention.py check their bits against the default variants."""
import types

import pytest

from bw24chat.backends import cuda_linear as cl
from bw24chat.backends import cuda_ops as co
from bw24chat.backends import kernel_build as kb

LIMIT = 99 * 1024  # 101,376 B: cudaDevAttrMaxSharedMemoryPerBlockOptin on sm_86 / sm_89 / sm_120


@pytest.fixture
def small_gpu(monkeypatch):
    monkeypatch.setattr(kb, "smem_block_limit", lambda: LIMIT)


@pytest.mark.parametrize("x_split,w_split", [(False, False), (True, False), (True, True), (False, True)])
def test_portable_gemm_fits(small_gpu, x_split, w_split):
    bufs = cl.gemm_bufs(x_split, w_split)
    assert cl._gemm_smem(x_split, w_split, bufs) <= LIMIT
    assert bufs == (1 if x_split or w_split else 2)  # x and W as one plane each keep the double buffer (72 KB)


def test_portable_integer_dot_gemm_fits(small_gpu):
    """gemm_i8_mma (the portable path's Q8_0 prefill) fits one block of a 99 KB GPU."""
    assert cl.gemm_i8_mma_smem() <= LIMIT


@pytest.mark.parametrize("bm", [64, 128])
def test_grouped_expert_gemms_fit(small_gpu, bm):
    """moe_group.cu's grouped GEMMs (the MoE prefill on every GPU) fit too: gemm_grouped with the
    buffers gemm_bufs picks for its tile, gemm_i8_grouped's ring; at 64 tokens only the kernel of x
    and W split drops to one buffer."""
    for x_split, w_split in [(False, False), (True, False), (True, True), (False, True)]:
        bufs = cl.gemm_bufs(x_split, w_split, bm)
        assert cl._gemm_smem(x_split, w_split, bufs, bm) <= LIMIT
        if bm == 64:
            assert bufs == (1 if x_split and w_split else 2)
    assert cl.gemm_i8_mma_smem(bm) <= LIMIT


def test_portable_gemm_keeps_two_buffers_on_hopper(monkeypatch):
    monkeypatch.setattr(kb, "smem_block_limit", lambda: kb.SMEM_BLOCK_SM90)
    assert all(cl.gemm_bufs(x, w) == 2 for x, w in [(False, False), (True, False), (True, True)])


@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("kv_type", ["bf16", "q8_0", "fp8", "f32"])
def test_prefill_attention_fits(small_gpu, hd, kv_type):
    stages = co.prefill_stages(hd, kv_type)
    assert co.prefill_smem_bytes(hd, kv_type, stages) <= LIMIT
    # two stages wherever they fit: only the hd-128 prefill over a non-bf16 cache (K and V split) drops one
    assert stages == (1 if (hd == 128 and kv_type != "bf16") else 2)


@pytest.mark.parametrize("hd", [64, 128])
def test_decode_attention_fits(small_gpu, hd):
    assert co._decode_tc_smem(hd) + 8 * 1024 <= LIMIT  # + the static shared memory reserve
    for kv_type in ("bf16", "q8_0", "fp8", "f32"):
        for gq in (1, 2, 4, 8):
            for cluster in (0, 8):
                assert co._decode_smem(hd, gq, kv_type, cluster) <= LIMIT, (kv_type, gq, cluster)


def _weight(fmt: str, n_out: int, n_in: int):
    return types.SimpleNamespace(fmt=fmt, out=n_out, in_=n_in)  # what the planning functions read


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_K", "NVFP4"])
@pytest.mark.parametrize("n_in", [2048, 4096, 5120, 12288, 14336, 25600])
def test_integer_dot_matvec_rows_fit(small_gpu, fmt, n_in):
    """Decode and speculative verify (m = 1..8 rows): one launch stages a8_rows_per_launch rows,
    more go in groups; a QX hand-off (which one launch must take whole) only where they fit."""
    W = _weight(fmt, 4096, n_in)
    for m in range(1, 9):
        for nw in (8, 16):
            for qx_out in (False, True):
                fit = cl.a8_rows_per_launch(W, nw, qx_out)
                per_row = 2 * n_in + 32 * (n_in // 32) + 4 * nw + (256 if qx_out else 0)
                assert min(m, fit) * per_row <= LIMIT
        if cl.takes_qx(W, m, impl="simt"):
            _, _, nw = cl._simt_geometry(W, m, True, cl.PROLOGUES["qx"])
            assert m <= cl.a8_rows_per_launch(W, nw)
    if n_in == 12288:  # Qwen3-8B's down projection: 2 rows per launch in 99 KB, so no QX for m = 3
        assert not cl.takes_qx(W, 3, impl="simt")


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_K", "NVFP4"])
@pytest.mark.parametrize("n_in", [2048, 4096, 5120, 12288, 14336, 25600])
def test_tensor_core_matvec_rows_fit(small_gpu, monkeypatch, fmt, n_in):
    """The m-row steps' matvec_mma (m = 2..8, and 9..16 of the batched pass's spans): its ring,
    staged rows and buffers fit 99 KB; under prologue qx / none launches over K ranges take every
    row (the QX hand-off at every m), under rmsnorm more rows than fit go in groups of m_fit, each
    group's launch the plan of its own rows."""
    from bw24chat.backends.cuda_weights import FORMATS

    monkeypatch.setattr(cl, "_sm_resources", lambda: (84, 100 * 1024))
    W = types.SimpleNamespace(fmt=fmt, out=4096, in_=n_in, vpc=FORMATS[fmt][1])
    for m in range(2, cl.MMA_MAX_ROWS + 1):
        assert cl.matvec_impl(W, True, m) == "mma"
        plan, grouped = cl.mma_plan(W, m, "qx"), cl.mma_plan(W, m, "rmsnorm")
        for p in (plan, grouped):
            assert p.smem <= LIMIT and 1 <= p.m_fit <= m and p.defines["MQ_STAGES"] >= 2
        assert plan.m_fit == m and cl.takes_qx(W, m) and grouped.ranges == 1
        assert plan.kt_bounds[0] == 0 and plan.kt_bounds[-1] == cl.mma_k_tiles(W)
        assert plan.smem == cl.mma_smem(W, m, plan.defines, cl._range_inputs(W, plan.kt_bounds))
        assert (plan.ranges > 1) == (grouped.m_fit < m)
        assert grouped.smem == cl.mma_smem(W, grouped.m_fit, grouped.defines)
        assert cl.mma_plan(W, grouped.m_fit, "rmsnorm") == grouped
    if n_in == 12288:
        assert cl.mma_plan(W, 3, "qx").ranges == 2


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_K", "NVFP4"])
def test_sixteen_rows_of_a_4096_input_matrix_fit_one_launch_on_hopper(monkeypatch, fmt):
    """The batched pass's 16-row spans (cuda_batch.wide_rows) on a 227 KB GPU: matvec_mma's four
    n-tile class (8 warps, one 16-row sub-tile a pass) stages 16 rows of a 4096-input x (qkv, o,
    gate|up, the LM head of Qwen3-8B) in one launch with a ring of at least 2 stages, so QX codes
    pass between them; the 12288-input down projection takes its 16 rows (and their QX codes) over
    3 K ranges, where a prologue that reads all of x would run them in groups of at most 8."""
    from bw24chat.backends.cuda_weights import FORMATS

    monkeypatch.setattr(kb, "smem_block_limit", lambda: kb.SMEM_BLOCK_SM90)
    monkeypatch.setattr(cl, "_sm_resources", lambda: (132, 228 * 1024))
    vpc = FORMATS[fmt][1]
    W = types.SimpleNamespace(fmt=fmt, out=4096, in_=4096, vpc=vpc)
    for m in range(9, cl.MMA_MAX_ROWS + 1):
        plan = cl.mma_plan(W, m)
        assert plan.m_fit == m and plan.ranges == 1 and plan.smem <= kb.SMEM_BLOCK_SM90 and plan.defines["MQ_STAGES"] >= 2
        assert cl.mma_class(m) == "four_tiles" and plan.defines["MV_NW"] == 8 and plan.rows == 16
        assert cl.takes_qx(W, m) and cl.mma_writes_qx(types.SimpleNamespace(fmt=fmt, out=24576, in_=4096, vpc=vpc), m)
    down = types.SimpleNamespace(fmt=fmt, out=4096, in_=12288, vpc=vpc)
    split = cl.mma_plan(down, 16, "qx")
    assert split.m_fit == 16 and split.ranges == 3 and split.defines["MV_NW"] == 8 and cl.takes_qx(down, 16)
    assert 1 < cl.mma_plan(down, 16, "rmsnorm").m_fit <= 8


def test_only_matvec_mma_takes_more_than_8_rows():
    """m = 9..16: matvec_mma's formats under the integer-dot contract; every other path refuses
    them with an error that says so (before touching the arrays)."""
    import numpy as np

    from bw24chat.backends.cuda_weights import FORMATS

    for fmt in ("BF16", "Q6_K"):
        W = types.SimpleNamespace(fmt=fmt, out=64, in_=256, vpc=FORMATS[fmt][1], q=None, s=None)
        assert not cl.takes_qx(W, 12) and not cl.writes_qx(W, 12)
        x, out = np.zeros((12, 256), np.float32), np.zeros((12, 64), np.float32)
        with pytest.raises(ValueError, match="take matvec_mma"):
            cl.matvec(W, x, out, 12)
    W = types.SimpleNamespace(fmt="Q8_0", out=64, in_=256, vpc=FORMATS["Q8_0"][1])
    assert cl.matvec_impl(W, True, 12) == "mma"
    with pytest.raises(ValueError, match="1..16 rows"):
        cl.mma_class(17)
