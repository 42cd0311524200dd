"""The wrappers' dynamic shared-memory sizes equal what the kernels lay out, checked without a GPU.

Each kernel that takes dynamic shared memory names its total in a macro next to its layout
(gemm_mma.cu GM_SMEM_BYTES, gemm_wgmma.cu WGP_SMEM_BYTES / WRA_SMEM_BYTES, gemm_i8.cu
I8_SMEM_BYTES / IM_SMEM_BYTES, moe_group.cu GG_SMEM_BYTES / GI_SMEM_BYTES; attention_decode.cu DECODE_SMEM, attention_decode_tc.cu
DECODE_TC_SMEM, attention_prefill.cu PREFILL_SMEM, deltanet_chunk.cu PREP_SMEM_FLOATS /
STATE_SMEM_FLOATS); the Python launch code computes the size it
passes on its own.  Here each kernel is compiled (NVRTC, sm_90a, the wrapper's defines) with a
static_assert that the two agree.  Why: a hand-summed stage size once overran a ring's
allocation, which only a GPU run showed (illegal addresses).
"""
import pytest

from bw24chat.backends import kernel_build as kb

pytestmark = [pytest.mark.slow, pytest.mark.kernels]


def assert_equal(family: str, defines: dict, macro: str, host: int) -> None:
    check = f'static_assert(({macro}) == {host}, "{macro} differs from the wrapper\'s {host} bytes");'
    kb.compile_cubin(family, "sm_90a", defines, (), append=check)


def gemm_cases():
    from bw24chat.backends import cuda_linear as cl

    out = []
    # BF16 W exact, Q8_0 W split; x split, or one plane under the bf16-activation contract
    for x_split, fmt in ((0, 2), (0, 3), (1, 2), (1, 3)):
        w_split = fmt == 3
        defs = {"FMT": fmt, "GEMM_SPLIT": x_split}
        out.append(("gemm_mma", defs, "GM_SMEM_BYTES", cl._gemm_smem(bool(x_split), w_split)))
        out.append(("gemm_mma", {**defs, "GM_BUFS": 1}, "GM_SMEM_BYTES", cl._gemm_smem(bool(x_split), w_split, 1)))
    for x_split in (False, True):
        for w_lo in (False, True):
            for n_out in (4096, 24576):
                bn, stages, stage = cl.wgp_geometry(n_out, x_split, w_lo)
                defs = {"GEMM_SPLIT": int(x_split), "WG_BN": bn, "WGP_STAGES": stages, "WGP_WLO": int(w_lo)}
                out.append(("gemm_wgmma", defs, "WGP_SMEM_BYTES", cl.wgp_smem(stages, stage)))
    for fmt, code in (("NVFP4", 11), ("Q4_K", 8), ("Q8_0", 3)):
        for x_split in (False, True):  # Q4_K / Q8_0 with x one plane: W split, 256 tokens; NVFP4: 128
            bt, stages, stage = cl.wra_geometry(24576, x_split, fmt)
            out.append(("gemm_wgmma", {"FMT": code, "GEMM_SPLIT": int(x_split), "WRA_BT": bt, "WRA_STAGES": stages},
                        "WRA_SMEM_BYTES", cl.wgp_smem(stages, stage)))
    out.append(("gemm_i8", {"FMT": 3}, "I8_SMEM_BYTES", cl.gemm_i8_smem()))
    out.append(("gemm_i8", {"FMT": 3}, "IM_SMEM_BYTES", cl.gemm_i8_mma_smem()))
    # moe_group.cu's grouped expert GEMMs, 64- and 128-token tiles (cuda_moe.grouped_gemm's defines)
    for bm in (64, 128):
        for x_split, fmt in ((1, 2), (1, 8), (0, 11), (0, 8)):
            w_split = fmt not in (2, 11)
            defs = {"FMT": fmt, "GG_BM": bm, "GEMM_SPLIT": x_split}
            for bufs in (2, 1):
                out.append(("moe_group", {**defs, **({"GM_BUFS": 1} if bufs == 1 else {})}, "GG_SMEM_BYTES",
                            cl._gemm_smem(bool(x_split), w_split, bufs, bm)))
        out.append(("moe_group", {"FMT": 3, "GG_BM": bm}, "GI_SMEM_BYTES", cl.gemm_i8_mma_smem(bm)))
    return out


def attention_cases():
    from bw24chat.backends import cuda_ops as co

    out = []
    for hd, kv in [(128, k) for k in ("bf16", "q8_0", "fp8", "f32")] + [(64, "bf16"), (64, "q8_0")]:
        out.append(("attention_decode", {"HD": hd, "GQ": 4, "KV_TYPE": co.KV_CODE[kv]}, "DECODE_SMEM",
                    co._decode_smem(hd, 4, kv)))
        out.append(("attention_prefill", {"HD": hd, "GQ": 4, "KV_TYPE": co.KV_CODE[kv]}, "PREFILL_SMEM",
                    co.prefill_smem_bytes(hd, kv)))
        out.append(("attention_prefill", {"HD": hd, "GQ": 4, "KV_TYPE": co.KV_CODE[kv], "PREFILL_STAGES": 1}, "PREFILL_SMEM",
                    co.prefill_smem_bytes(hd, kv, 1)))
    for gq in (1, 8):  # the merge area (GQ rows per sub-warp) can exceed the pipeline stages
        out.append(("attention_decode", {"HD": 128, "GQ": gq, "KV_TYPE": 0}, "DECODE_SMEM", co._decode_smem(128, gq, "bf16")))
    for hd in (64, 128):
        halves, stages = co.decode_tc_config(hd)
        out.append(("attention_decode_tc", {"HD": hd, "GQ": 4, "TC_HALVES": halves, "TCSTAGES": stages},
                    "DECODE_TC_SMEM", co._decode_tc_smem(hd)))
    # the kernel's own TCSTAGES default per TC_HALVES is the wrapper's: two halves at 227 KB, one
    # half over 3 tiles where 3 but not 4 fit
    for limit in (kb.SMEM_BLOCK_SM90, 7 * co._decode_tc_stage_bytes(64) // 2):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(kb, "smem_block_limit", lambda limit=limit: limit)
            halves = co.decode_tc_config(64)[0]
            out.append(("attention_decode_tc", {"HD": 64, "GQ": 4, "TC_HALVES": halves}, "DECODE_TC_SMEM",
                        co._decode_tc_smem(64)))
    return out


def deltanet_cases():
    """deltanet_chunk.cu's two kernels at the key head dims the models use and odd ones."""
    from bw24chat.backends import cuda_deltanet as dn

    out = []
    for dk in (128, 256, 40, 8):
        prep, state = dn.chunk_smem(dk)
        defs = {"DK": dk, "CH_BV": dn.CH_BV}
        out += [("deltanet_chunk", defs, "4 * PREP_SMEM_FLOATS", prep), ("deltanet_chunk", defs, "4 * STATE_SMEM_FLOATS", state)]
    return out


@pytest.mark.parametrize("family,defines,macro,host", gemm_cases() + attention_cases() + deltanet_cases(),
                         ids=lambda v: "-".join(f"{k}{x}" for k, x in v.items()) if isinstance(v, dict) else str(v))
def test_shared_memory_matches_the_wrapper(family, defines, macro, host):
    assert_equal(family, defines, macro, host)


def test_a_wrong_size_fails_to_compile():
    """The check bites: a hand-summed 41 KB gemm_i8 stage (the ring is 49 KB a stage) does not compile."""
    from bw24chat.backends import cuda_linear as cl

    with pytest.raises(kb.KernelCompileError, match="I8_SMEM_BYTES differs"):
        assert_equal("gemm_i8", {"FMT": 3}, "I8_SMEM_BYTES", cl.I8_STAGES * 41 * 1024 + 1024)


@pytest.mark.parametrize("limit_kb,hd,want", [(227, 128, (2, 4)), (227, 64, (2, 4)), (99, 128, (1, 2)), (99, 64, (2, 4)),
                                              (48, 128, (1, 2))])
def test_decode_tc_config_fits_the_gpu_shared_memory(monkeypatch, limit_kb, hd, want):
    """attn_decode_tc's (halves, stages) fit the block's opt-in shared memory: sm_90's 227 KB takes
    two halves over 4 tiles; sm_120's 99 KB at head dim 128 (34,816 B per tile) one half over 2."""
    from bw24chat.backends import cuda_ops as co

    monkeypatch.setattr(kb, "smem_block_limit", lambda: limit_kb * 1024)
    assert co.decode_tc_config(hd) == want
    if limit_kb >= 99:
        assert co._decode_tc_smem(hd) <= limit_kb * 1024
