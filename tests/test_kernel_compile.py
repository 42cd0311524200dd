"""Every kernel family compiles to a cubin (ptxas runs) for sm_90a and sm_120a, without a GPU,
through NVRTC (pip nvidia-cuda-nvrtc + CUDA headers from nvidia-cuda-runtime)."""
import pytest

from bw24chat.backends import kernel_build as kb

pytestmark = [pytest.mark.slow, pytest.mark.kernels]


def test_there_are_kernels():
    assert len(kb.families()) >= 1


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
@pytest.mark.parametrize("family", kb.families())
def test_kernel_compiles(family, arch):
    cubin, log = kb.compile_cubin(family, arch)
    assert cubin[:4] == b"\x7fELF", "NVRTC returned something that is not a cubin"
    assert "error" not in log.lower()


def test_compile_error_carries_the_log(tmp_path, monkeypatch):
    (tmp_path / "broken.cu").write_text('extern "C" __global__ void k() { this is not C++; }\n')
    monkeypatch.setattr(kb, "kernel_dir", lambda: tmp_path)
    with pytest.raises(kb.KernelCompileError) as ei:
        kb.compile_cubin("broken", "sm_90a")
    assert "broken.cu" in ei.value.log and "error" in ei.value.log


VARIANTS = [  # compile-time variants the default build of a family does not reach
    ("matvec", {"FMT": 3, "ACT_Q8": 1}),  # Q8_0, integer dot
    ("matvec", {"FMT": 8, "ACT_Q8": 1, "MV_M": 8}),  # Q4_K (min), 8 tokens
    ("matvec", {"FMT": 10, "ACT_Q8": 1}),  # Q6_K (two scales, offset)
    ("matvec", {"FMT": 11, "ACT_Q8": 1, "MV_M": 3}),  # NVFP4 (table decoder)
    ("matvec", {"FMT": 11, "ACT_Q8": 1, "MV_STEADY": 1}),  # NVFP4 integer dot (one chain per half), steady windows
    ("matvec", {"FMT": 11, "ACT_Q8": 1, "MV_M": 8}),
    ("matvec", {"FMT": 8, "ACT_Q8": 1, "A8_JOIN": 1, "MV_STEADY": 1}),  # Q4_K, both code levels in one integer dot
    ("matvec", {"FMT": 11, "ACT_Q8": 1, "MV_R": 4, "MV_U": 1, "MV_MINB": 2, "MV_STEADY": 1}),  # NVFP4 wide matrices
    ("matvec", {"FMT": 2, "MV_R": 4, "MV_U": 1, "MV_MINB": 2, "MV_STEADY": 1}),  # BF16 wide matrices at 4 rows per warp
    ("matvec", {"FMT": 11, "ACT_Q8": 1, "MV_ABLATE": 3, "MV_STEADY": 1}),  # timing ablations (no prologue, no dot)
    ("matvec", {"FMT": 11, "ACT_Q8": 1, "MV_NW": 16, "MV_MINB": 1, "MV_U": 3, "MV_STEADY": 1}),  # 16 warps per block
    ("matvec", {"FMT": 3, "ACT_Q8": 1, "MV_NW": 16, "MV_MINB": 1, "MV_U": 4, "MV_M": 3}),
    ("matvec", {"FMT": 2, "MV_NW": 16, "MV_MINB": 1, "MV_STEADY": 1}),
    ("matvec", {"FMT": 11, "ACT_Q8": 1, "MV_NW": 16, "MV_STAT8": 1, "MV_MINB": 1, "MV_R": 4, "MV_U": 1, "MV_STEADY": 1}),
    ("matvec", {"FMT": 2, "MV_NW": 16, "MV_STAT8": 1, "MV_MINB": 1, "MV_M": 3}),  # 8-warp rmsnorm statistic
    ("matvec", {"FMT": 2, "MV_NW": 16, "MV_STAT8": 1, "MV_MINB": 1, "MV_R": 4, "MV_U": 1, "MV_STEADY": 1}),  # BF16 wide (adopted)
    ("matvec", {"FMT": 3, "ACT_Q8": 1, "MV_NW": 16, "MV_MINB": 1, "MV_U": 4, "MV_STEADY": 1}),  # Q8_0 down (adopted)
    ("matvec", {"FMT": 8, "ACT_Q8": 1, "MV_NW": 16, "MV_MINB": 1, "MV_U": 3, "MV_STEADY": 1}),  # Q4_K down (adopted)
    # qx_out's hand-off modes (QX_HANDOFF 1: two buffers, one barrier; 2: named producer / consumer barriers)
    ("matvec", {"FMT": 11, "ACT_Q8": 1, "MV_NW": 16, "MV_STAT8": 1, "MV_MINB": 1, "MV_R": 4, "MV_U": 1, "MV_STEADY": 1, "QX_HANDOFF": 1}),
    ("matvec", {"FMT": 11, "ACT_Q8": 1, "MV_NW": 16, "MV_STAT8": 1, "MV_MINB": 1, "MV_R": 4, "MV_U": 1, "MV_STEADY": 1, "QX_HANDOFF": 2}),
    ("matvec", {"FMT": 3, "ACT_Q8": 1, "MV_NW": 16, "MV_STAT8": 1, "MV_MINB": 1, "MV_R": 4, "MV_M": 3, "QX_HANDOFF": 2}),
    # Q8_0 / Q4_K wide matrices as adopted in the fourteenth session (gate|up writing QX)
    ("matvec", {"FMT": 3, "ACT_Q8": 1, "MV_NW": 16, "MV_STAT8": 1, "MV_MINB": 1, "MV_R": 4, "MV_U": 1, "MV_STEADY": 1, "QX_HANDOFF": 2}),
    ("matvec", {"FMT": 8, "ACT_Q8": 1, "MV_NW": 16, "MV_STAT8": 1, "MV_MINB": 1, "MV_R": 4, "MV_U": 1, "MV_STEADY": 1, "QX_HANDOFF": 2}),
    ("matvec", {"FMT": 7, "ACT_Q8": 1}),  # Q5_1 (5th bits, min)
    ("matvec", {"FMT": 3, "ACT_Q8": 1, "MV_STEADY": 1, "MV_U": 2}),  # branch-free steady-state windows (Q8_0 wide)
    ("matvec", {"FMT": 8, "ACT_Q8": 1, "MV_STEADY": 1, "MV_U": 3, "MV_MINB": 2}),  # the same, Q4_K down
    ("matvec", {"FMT": 2, "MV_STEADY": 1}),  # the same on the float path (BF16)
    ("matvec", {"FMT": 3, "ACT_Q8": 1, "MV_R": 4, "MV_U": 2, "MV_MINB": 2}),  # 4 rows per warp (experiment)
    # the integer-dot rmsnorm prologue from the statistic's one batch (A8_STAT_CACHE, the default) on the
    # wide NVFP4 / Q4_K / Q8_0 geometry (16 warps, 8-warp statistic); its two-batch path (0) on the 8-warp kernel
    ("matvec", {"FMT": 11, "ACT_Q8": 1, "A8_STAT_CACHE": 1, "MV_R": 4, "MV_U": 1, "MV_MINB": 1, "MV_STEADY": 1,
                "MV_NW": 16, "MV_STAT8": 1}),
    ("matvec", {"FMT": 8, "ACT_Q8": 1, "A8_STAT_CACHE": 1, "MV_R": 4, "MV_U": 1, "MV_MINB": 1, "MV_STEADY": 1,
                "MV_NW": 16, "MV_STAT8": 1}),
    ("matvec", {"FMT": 3, "ACT_Q8": 1, "A8_STAT_CACHE": 0}),
    ("matvec", {"FMT": 3, "ACT_Q8": 1, "A8_STAT_CACHE": 0, "MV_M": 8}),
    # three rows per warp where 64-row tiles would leave SMs idle (cuda_linear._fill_rows: the qkv shape)
    *[("matvec", {"FMT": f, "ACT_Q8": 1, "MV_R": 3, "MV_U": 1, "MV_MINB": 1, "MV_STEADY": 1, "MV_NW": 16, "MV_STAT8": 1})
      for f in (11, 8, 3)],
    # weights asked of L2 ahead of the loads (opt-in MV_L2AHEAD): every plane layout
    *[("matvec", {"FMT": f, "MV_L2AHEAD": 2, **extra}) for f, extra in
      ((11, {"ACT_Q8": 1, "MV_R": 4, "MV_U": 1, "MV_MINB": 1, "MV_STEADY": 1, "MV_NW": 16, "MV_STAT8": 1}),
       (3, {"ACT_Q8": 1}), (8, {"ACT_Q8": 1}), (9, {}), (10, {}), (2, {}), (5, {}), (6, {}))],
    # the quantizing warp of the QX epilogue rotating with the tile (opt-in QX_ROTATE), every hand-off
    *[("matvec", {"FMT": 11, "ACT_Q8": 1, "QX_ROTATE": 1, "QX_HANDOFF": h, "MV_R": 4, "MV_U": 1, "MV_MINB": 1,
                  "MV_STEADY": 1, "MV_NW": 16, "MV_STAT8": 1}) for h in (0, 1, 2)],
    ("matvec", {"FMT": 3, "ACT_Q8": 1, "QX_ROTATE": 1, "QX_HANDOFF": 2, "MV_M": 8, "MV_R": 4, "MV_NW": 16, "MV_STAT8": 1}),
    # steady windows through per-row plane pointers (opt-in MV_ROWPTR): every plane layout
    *[("matvec", {"FMT": f, "MV_ROWPTR": 1, "MV_STEADY": 1, **extra}) for f, extra in
      ((11, {"ACT_Q8": 1, "MV_R": 4, "MV_U": 1, "MV_MINB": 1, "MV_NW": 16, "MV_STAT8": 1, "QX_HANDOFF": 2}),
       (11, {"ACT_Q8": 1, "MV_U": 2, "MV_NW": 16, "MV_MINB": 1}), (3, {"ACT_Q8": 1, "MV_M": 8}),
       (8, {"ACT_Q8": 1, "MV_R": 3, "MV_U": 1, "MV_MINB": 1, "MV_NW": 16, "MV_STAT8": 1}),
       (9, {}), (10, {}), (10, {"ACT_Q8": 1}), (2, {"MV_M": 4}), (5, {}), (6, {}))],
    # the one-slot window loop in pairs (opt-in MV_PINGPONG), with and without row pointers
    *[("matvec", {"FMT": f, "MV_PINGPONG": 1, "MV_ROWPTR": rp, "MV_U": 1, "MV_STEADY": 1, **extra}) for f, rp, extra in
      ((11, 1, {"ACT_Q8": 1, "MV_R": 4, "MV_MINB": 1, "MV_NW": 16, "MV_STAT8": 1, "QX_HANDOFF": 2}),
       (11, 0, {"ACT_Q8": 1, "MV_R": 3, "MV_MINB": 1, "MV_NW": 16, "MV_STAT8": 1}),
       (8, 1, {"ACT_Q8": 1, "MV_R": 4, "MV_MINB": 1, "MV_NW": 16, "MV_STAT8": 1}), (3, 1, {"ACT_Q8": 1, "MV_M": 8}),
       (2, 1, {"MV_R": 4, "MV_MINB": 1, "MV_NW": 16, "MV_STAT8": 1}), (2, 0, {"MV_M": 3}))],
    # one load slot more, consumed in place (opt-in MV_NOCOPY): the o / down geometries, m = 8, a guarded build
    *[("matvec", {"FMT": f, "MV_NOCOPY": 1, "MV_ROWPTR": 1, **extra}) for f, extra in
      ((11, {"ACT_Q8": 1, "MV_U": 2, "MV_STEADY": 1, "MV_NW": 16, "MV_MINB": 1}),
       (11, {"ACT_Q8": 1, "MV_U": 3, "MV_STEADY": 1, "MV_NW": 16, "MV_MINB": 1}),
       (3, {"ACT_Q8": 1, "MV_U": 4, "MV_STEADY": 1, "MV_NW": 16, "MV_MINB": 1}), (8, {"ACT_Q8": 1, "MV_U": 3, "MV_MINB": 2}),
       (3, {"ACT_Q8": 1, "MV_M": 8}), (10, {"ACT_Q8": 1}), (2, {"MV_NW": 16, "MV_MINB": 1, "MV_STEADY": 1}))],
    # attention: the FMA decode (q8_0 / fp8 / f32 caches) with and without a cluster merge, hybrid long rows
    ("attention_decode", {"HD": 128, "GQ": 4, "KV_TYPE": 1, "ATTN_CLUSTER": 8}),
    ("attention_decode", {"HD": 64, "GQ": 2, "KV_TYPE": 3, "ATTN_CLUSTER": 16}),
    ("attention_decode", {"HD": 128, "GQ": 4, "KV_TYPE": 2, "ATTN_CLUSTER": 16, "ATTN_HYBRID": 4}),
    ("attention_decode", {"HD": 64, "GQ": 8, "KV_TYPE": 1, "ATTN_QX": 1, "ATTN_CLUSTER": 16, "ATTN_HYBRID": 4}),
    # the tensor-core decode (bf16 caches): one or two halves, cluster merge, QX codes
    ("attention_decode_tc", {"HD": 128, "GQ": 4, "ATTN_CLUSTER": 8, "TC_HALVES": 2, "TCSTAGES": 4, "ATTN_QX": 1}),
    ("attention_decode_tc", {"HD": 128, "GQ": 4, "ATTN_CLUSTER": 8, "TC_HALVES": 1, "TCSTAGES": 2}),  # sm_120's 99 KB
    ("attention_decode_tc", {"HD": 64, "GQ": 8, "TC_HALVES": 2, "TCSTAGES": 4}),
    ("attention_decode_tc", {"HD": 32, "GQ": 1, "TC_HALVES": 2, "TCSTAGES": 4}),
    # the prefill: one K/V stage (the precise prefill in 99 KB), the fast mode
    ("attention_prefill", {"HD": 128, "GQ": 4, "KV_TYPE": 1, "PREFILL_STAGES": 1}),
    ("attention_prefill", {"HD": 128, "GQ": 4, "KV_TYPE": 0, "PREFILL_STAGES": 1}),
    ("attention_prefill", {"HD": 64, "GQ": 3, "KV_TYPE": 2, "PREFILL_SPLIT": 0}),
    # gemm_wra: NVFP4 / Q4_K / Q8_0 codes into wgmma's register operand
    ("gemm_wgmma", {"FMT": 11, "WRA_BT": 128, "WRA_STAGES": 4, "GEMM_SPLIT": 0}),
    ("gemm_wgmma", {"FMT": 8, "WRA_BT": 256, "WRA_STAGES": 3}),
    ("gemm_wgmma", {"FMT": 3, "WRA_BT": 256, "WRA_STAGES": 4, "GEMM_SPLIT": 0, "GEMM_WSPLIT": 1}),
    # the portable gemm: integer-dot x planes, one tile buffer (99 KB), the bf16-activation contract
    ("gemm_mma", {"FMT": 3, "GEMM_XPLANES": 1}),
    ("gemm_mma", {"FMT": 8, "GEMM_XPLANES": 1, "GM_BUFS": 1}),
    ("gemm_mma", {"FMT": 11, "GEMM_XPLANES": 1, "GEMM_SPLIT": 0}),
    ("gemm_mma", {"FMT": 8, "GEMM_SPLIT": 0, "GEMM_WSPLIT": 1, "GM_BUFS": 1}),
    ("gemm_mma", {"FMT": 0}),  # F32 (4-value chunks): the rows gemm_wgp cannot take
    ("gemm_i8", {"FMT": 3}),
    ("dequant", {"FMT": 11, "DEQ_LO": 0}),  # the dequantization pass for the hi plane alone
    ("dequant", {"FMT": 0, "DEQ_LO": 0}),  # F32 chunks (8-byte store units)
    # MoE expert kernels (moe_experts.cu): every resident format, the integer-dot ones with ACT_Q8 (cuda_moe._defines)
    *[("moe_experts", {"FMT": f, **({"ACT_Q8": 1} if f in (3, 8, 9, 10, 11) else {})}) for f in range(12)],
]


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
@pytest.mark.parametrize("family,defines", VARIANTS, ids=[f"{f}-{'-'.join(f'{k}{v}' for k, v in d.items())}" for f, d in VARIANTS])
def test_kernel_variant_compiles(family, defines, arch):
    cubin, log = kb.compile_cubin(family, arch, defines)
    assert cubin[:4] == b"\x7fELF"
    assert "error" not in log.lower()


def production_gemm_builds() -> list[dict]:
    """The sm_90a GEMM builds of gemm_wgmma.cu the wrappers launch: gemm_wra per format, mode and
    tile width, gemm_wgp per mode, W_lo and tile width."""
    from bw24chat.backends import cuda_linear as cl

    out = []
    for fmt, code in (("NVFP4", 11), ("Q4_K", 8), ("Q8_0", 3)):
        # precise f32 x, fast, and the bf16-activation contract (x one plane, W split: GEMM_WSPLIT)
        for precise, wsplit in ((True, None), (False, None), (False, fmt != "NVFP4")):
            for n_out in (4096, 24576):
                bt, stages, _ = cl.wra_geometry(n_out, precise, fmt, bool(wsplit))
                out.append({"FMT": code, "GEMM_SPLIT": int(precise), "WRA_BT": bt, "WRA_STAGES": stages,
                            **({"GEMM_WSPLIT": 1} if wsplit else {})})
    for precise in (True, False):
        for w_lo in (False, True):
            for n_out in (4096, 24576):
                bn, stages, _ = cl.wgp_geometry(n_out, precise, w_lo)
                out.append({"GEMM_SPLIT": int(precise), "WG_BN": bn, "WGP_STAGES": stages, "WGP_WLO": int(w_lo)})
    return [dict(t) for t in dict.fromkeys(tuple(sorted(d.items())) for d in out)]


@pytest.mark.parametrize("defines", production_gemm_builds(), ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
def test_wgmma_builds_are_not_serialized_and_do_not_spill(defines):
    """ptxas's own report on the default sm_90a GEMM builds: no "Potential Performance Loss" (C7513 /
    C7515: wgmma serialized), and gemm_wgp / gemm_wra without spills.  Why: a register-operand
    pipeline can compile and give the right bits while ptxas serializes every wgmma."""
    _, log = kb.compile_cubin("gemm_wgmma", "sm_90a", defines, extra=("-Xptxas=-v",))
    assert "Potential Performance Loss" not in log, [line for line in log.splitlines() if "Potential" in line]
    for fn in ("gemm_wgp", "gemm_wra"):
        i = log.index(f"Function properties for {fn}")
        props = log[i:log.index("\n", log.index("\n", i) + 1)]
        assert " 0 bytes spill stores" in props, props
