"""Every kernel family compiles to a cubin (ptxas runs) for sm_90a and sm_120a, without a GPU,
through NVRTC (pip nvidia-cuda-nvrtc + CUDA headers from nvidia-cuda-runtime)."""
import types

import numpy as np
import pytest

from bw24chat.backends import kernel_build as kb
from bw24chat.backends.cuda_weights import FORMATS
from bw24chat.backends.kernel_refs import A8_FORMATS

pytestmark = [pytest.mark.slow, pytest.mark.kernels]


def test_there_are_kernels():
    assert len(kb.families()) >= 1


BARE_DEFINES = {"matvec_tc": {"FMT": 11, "TC_NW": 4, "TC_U": 2}, "matvec_mma": {"FMT": 3}}  # the defines a family cannot do without


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
@pytest.mark.parametrize("family", kb.families())
def test_kernel_compiles(family, arch):
    cubin, log = kb.compile_cubin(family, arch, BARE_DEFINES.get(family))
    assert cubin[:4] == b"\x7fELF", "NVRTC returned something that is not a cubin"
    assert "error" not in log.lower()


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_repack_compiles_for_every_format(fmt):
    """kernels/repack.cu has an arm per format (the expert file tier repacks any of them)."""
    cubin, log = kb.compile_cubin("repack", "sm_90a", {"FMT": FORMATS[fmt][0]})
    assert cubin[:4] == b"\x7fELF" and "error" not in log.lower()


def test_compile_error_carries_the_log(tmp_path, monkeypatch):
    (tmp_path / "broken.cu").write_text('extern "C" __global__ void k() { this is not C++; }\n')
    monkeypatch.setattr(kb, "kernel_dir", lambda: tmp_path)
    with pytest.raises(kb.KernelCompileError) as ei:
        kb.compile_cubin("broken", "sm_90a")
    assert "broken.cu" in ei.value.log and "error" in ei.value.log


class _Buffer:
    """A stand-in for a device array: what cuda_linear.matvec reads of one (dtype, size, address)."""

    def __init__(self, size: int, dtype: str = "float32"):
        self.size, self.dtype, self.data = size, np.dtype(dtype), types.SimpleNamespace(ptr=0)

    def reshape(self, *shape):
        return self

    def __getitem__(self, s: slice):
        return _Buffer(len(range(*s.indices(self.size))), self.dtype)


def production_matvec_builds() -> list[tuple[str, dict]]:
    """A cross-section of the decode matvec builds cuda_linear launches (no GPU: H100 resources):
    the Qwen3-8B qkv / gate|up (with QX) / down (prologue qx) / LM head of NVFP4, Q4_K, Q8_0 on
    the integer-dot contract, Q6_K, MXFP4, Q2_K, Q3_K, BF16 at m = 1 and 3, F16's and NVFP4's (float
    contract) tensor-core o projection, an MoE router in F32 and BF16, SmolLM2-135M's Q4_1 matrices
    and Q8_0 LM head at m = 1 and 8; every define is the wrapper's own choice."""
    from bw24chat.backends import cuda_linear as cl, kernel_build
    from bw24chat.backends.cuda_weights import FORMATS

    calls = []
    rec = lambda fam, name, **d: (lambda *a, **k: calls.append((fam, d)))  # noqa: E731
    arr = _Buffer
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cl, "get_kernel", rec)
        mp.setattr(cl, "_sm_resources", lambda: (132, 228 * 1024))
        mp.setattr(cl, "resident_blocks", lambda k, t, s: 1)
        mp.setattr(cl, "_mma_part", arr)  # the K ranges' chain scratch (the down projection at m = 8)
        mp.setattr(kernel_build, "smem_block_limit", lambda: 227 * 1024)
        mp.delenv("BW24CHAT_A8", raising=False)
        for fmt, ms in (("NVFP4", (1, 3)), ("Q4_K", (1,)), ("Q8_0", (1, 8)), ("Q6_K", (1,)), ("BF16", (1, 3)), ("F16", (1,)),
                        ("MXFP4", (1, 3)), ("Q2_K", (1, 3)), ("Q3_K", (1, 8))):
            W = lambda o, i: cl.DeviceWeight(fmt, o, i, None, fmt_id=FORMATS[fmt][0], vpc=FORMATS[fmt][1])  # noqa: E731
            for m in ms:
                qx = cl.writes_qx(W(24576, 4096), m) and cl.takes_qx(W(4096, 12288), m)
                q = arr(m * 8192, "uint32") if qx else None
                cl.matvec(W(6144, 4096), arr(m * 4096), arr(m * 6144), m, "rmsnorm", norm_w=0)
                cl.matvec(W(24576, 4096), arr(m * 4096), arr(m * 12288), m, "rmsnorm", "swiglu", norm_w=0, qx_out=q)
                cl.matvec(W(4096, 12288), arr(m * 12288), arr(m * 4096), m, "qx" if qx else "none", "add", qx_in=q)
                cl.matvec(W(49152, 4096), arr(m * 4096), arr(m * 49152), m, "rmsnorm", norm_w=0)
                cl.matvec(W(4096, 4096), arr(m * 4096), arr(m * 4096), m, epilogue="add")
        for m in (1, 8):  # SmolLM2-135M: Q4_1 on the float contract, its tied Q8_0 LM head (576 inputs: no matvec_mma)
            W = lambda o, i, f="Q4_1": cl.DeviceWeight(f, o, i, None, fmt_id=FORMATS[f][0], vpc=FORMATS[f][1])  # noqa: E731
            cl.matvec(W(960, 576), arr(m * 576), arr(m * 960), m, "rmsnorm", norm_w=0)
            cl.matvec(W(3072, 576), arr(m * 576), arr(m * 1536), m, "rmsnorm", "swiglu", norm_w=0)
            cl.matvec(W(576, 1536), arr(m * 1536), arr(m * 576), m, epilogue="add")
            cl.matvec(W(576, 576), arr(m * 576), arr(m * 576), m, epilogue="add")
            cl.matvec(W(49152, 576, "Q8_0"), arr(m * 576), arr(m * 49152), m, "rmsnorm", norm_w=0)
        cl.matvec(cl.DeviceWeight("NVFP4", 4096, 4096, None, fmt_id=11, vpc=32), arr(4096), arr(4096), 1, act_quant=False)
        for fmt in ("F32", "BF16"):  # an MoE router's logits (Qwen3-30B-A3B: 128 x 2048)
            cl.matvec(cl.DeviceWeight(fmt, 128, 2048, None, fmt_id=FORMATS[fmt][0], vpc=FORMATS[fmt][1]), arr(2048), arr(128), 1,
                      "rmsnorm", norm_w=0)
    return [(f, d) for f, d in dict.fromkeys((f, tuple(sorted(d.items()))) for f, d in calls)
            for f, d in [(f, dict(d))]]


def production_moe_builds() -> list[tuple[str, dict]]:
    """The moe_experts.cu builds cuda_moe launches, (kernel, defines): every resident format (the
    integer-dot ones with ACT_Q8, cuda_moe._defines) at its MOE_TUNING geometry for moe_gu and
    for moe_down, each also as a GPU of a split model builds it (MOE_HELD)."""
    from bw24chat.backends import cuda_moe
    from bw24chat.backends.cuda_weights import FORMATS

    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("BW24CHAT_A8", raising=False)
        return [(f"moe_{kern}", {**cuda_moe._defines(f), **cuda_moe.geometry(kern, f, bool(held)), **held})
                for f in FORMATS for kern in ("gu", "down") for held in ({}, {"MOE_HELD": 1})]


VARIANTS = [  # compile-time variants the default build of a family does not reach
    *production_matvec_builds(),
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
    # rows of one sequence sharing the key tiles (a verify): 4 x 4 heads (both MMA row halves), 2 x 3, 8 x 1
    ("attention_decode_tc", {"HD": 128, "GQ": 4, "ATTN_CLUSTER": 8, "TC_HALVES": 2, "TCSTAGES": 4, "ATTN_QX": 1, "ATTN_ROWS": 4}),
    ("attention_decode_tc", {"HD": 128, "GQ": 4, "ATTN_CLUSTER": 8, "TC_HALVES": 1, "TCSTAGES": 2, "ATTN_ROWS": 4}),
    ("attention_decode_tc", {"HD": 64, "GQ": 3, "TC_HALVES": 2, "TCSTAGES": 4, "ATTN_ROWS": 2}),
    ("attention_decode_tc", {"HD": 32, "GQ": 1, "TC_HALVES": 1, "TCSTAGES": 3, "ATTN_ROWS": 8}),
    # the paged pool's variants (KV_PAGE: the batched step's block tables), every cache type
    ("attention_decode", {"HD": 128, "GQ": 4, "KV_TYPE": 1, "ATTN_CLUSTER": 16, "ATTN_HYBRID": 4, "KV_PAGE": 64}),
    ("attention_decode", {"HD": 64, "GQ": 2, "KV_TYPE": 2, "KV_PAGE": 64}),
    ("attention_decode", {"HD": 64, "GQ": 8, "KV_TYPE": 3, "ATTN_QX": 1, "ATTN_CLUSTER": 8, "KV_PAGE": 64}),
    ("attention_decode_tc", {"HD": 128, "GQ": 4, "ATTN_CLUSTER": 8, "TC_HALVES": 2, "TCSTAGES": 4, "ATTN_QX": 1, "KV_PAGE": 64}),
    ("attention_decode_tc", {"HD": 64, "GQ": 8, "TC_HALVES": 1, "TCSTAGES": 2, "KV_PAGE": 64}),
    ("attention_prefill", {"HD": 128, "GQ": 4, "KV_TYPE": 0, "KV_PAGE": 64}),
    ("attention_prefill", {"HD": 64, "GQ": 3, "KV_TYPE": 1, "PREFILL_STAGES": 1, "KV_PAGE": 64}),
    ("attention_prefill", {"HD": 128, "GQ": 4, "KV_TYPE": 2, "KV_PAGE": 64}),
    # the prefill: one K/V stage (K and V split in 99 KB), GQ 3
    ("attention_prefill", {"HD": 128, "GQ": 4, "KV_TYPE": 1, "PREFILL_STAGES": 1}),
    ("attention_prefill", {"HD": 128, "GQ": 4, "KV_TYPE": 0, "PREFILL_STAGES": 1}),
    ("attention_prefill", {"HD": 64, "GQ": 3, "KV_TYPE": 2}),
    # gemm_wra: NVFP4 / Q4_K / Q8_0 codes into wgmma's register operand
    ("gemm_wgmma", {"FMT": 11, "WRA_BT": 128, "WRA_STAGES": 4, "GEMM_SPLIT": 0}),
    ("gemm_wgmma", {"FMT": 8, "WRA_BT": 256, "WRA_STAGES": 3}),
    ("gemm_wgmma", {"FMT": 3, "WRA_BT": 256, "WRA_STAGES": 4, "GEMM_SPLIT": 0}),
    # the portable gemm: integer-dot x planes, one tile buffer (99 KB), the bf16-activation contract
    ("gemm_mma", {"FMT": 3, "GEMM_XPLANES": 1}),
    ("gemm_mma", {"FMT": 8, "GEMM_XPLANES": 1, "GM_BUFS": 1}),
    ("gemm_mma", {"FMT": 11, "GEMM_SPLIT": 0}),
    ("gemm_mma", {"FMT": 8, "GEMM_SPLIT": 0, "GM_BUFS": 1}),
    ("gemm_mma", {"FMT": 0}),  # F32 (4-value chunks): the rows gemm_wgp cannot take
    *[("gemm_mma", {"FMT": FORMATS[f][0]}) for f in FORMATS if f != "F32"],  # every format's decoder in the producer
    *[("dequant", {"FMT": FORMATS[f][0]}) for f in FORMATS],  # every format's dequantization / embedding rows
    ("gemm_i8", {"FMT": 3}),
    ("dequant", {"FMT": 11, "DEQ_LO": 0}),  # the dequantization pass for the hi plane alone
    ("dequant", {"FMT": 0, "DEQ_LO": 0}),  # F32 chunks (8-byte store units)
    # the QK-norm over whole projections (MiniMax-M2: 4 slots per warp), per head, with cache writes
    ("rope", {"HD": 128, "QK_NORM": 2, "FN_SPW": 4, "KV_TYPE": 0}),
    ("rope", {"HD": 256, "QK_NORM": 2, "FN_SPW": 1, "NEOX": 0, "KV_TYPE": 1}),
    ("rope", {"HD": 64, "QK_NORM": 1, "KV_TYPE": 2}),
    # the gated attention's q (per head [q | gate], rope.cu Q_GATED): Qwen3.5's head dim 256, a q8_0 cache
    ("rope", {"HD": 256, "QK_NORM": 1, "KV_TYPE": 0, "Q_GATED": 1}),
    ("rope", {"HD": 64, "QK_NORM": 1, "KV_TYPE": 1, "Q_GATED": 1}),
    # the gated DeltaNet (deltanet.cu): key head dims the models use (128, 256) and odd ones, conv taps 2..4
    ("deltanet", {"DK": 256}),
    ("deltanet", {"DK": 40, "KC": 3}),
    ("deltanet", {"DK": 8, "KC": 2}),
    # its chunked prefill (deltanet_chunk.cu): the production CH_BV and the other column counts
    ("deltanet_chunk", {"DK": 256, "CH_BV": 16}),
    ("deltanet_chunk", {"DK": 40, "CH_BV": 8}),
    ("deltanet_chunk", {"DK": 128, "CH_BV": 32}),
    # MoE expert kernels (moe_experts.cu): every resident format at its production geometries
    *[("moe_experts", dict(t)) for t in dict.fromkeys(tuple(sorted(d.items())) for _, d in production_moe_builds())],
    # the grouped MoE prefill (moe_group.cu): every format on its contract's planes, both tiles,
    # one buffer (99 KB GPUs), the bf16-activation contract, Q8_0 on gemm_i8_grouped
    *[("moe_group", {"FMT": FORMATS[f][0], "GG_BM": 64, **({"GEMM_XPLANES": 1} if f in A8_FORMATS else {})}) for f in FORMATS],
    ("moe_group", {"FMT": 10, "GG_BM": 128, "GEMM_XPLANES": 1, "GM_BUFS": 1}),
    ("moe_group", {"FMT": 11, "GG_BM": 128, "GEMM_SPLIT": 0}),
    ("moe_group", {"FMT": 8, "GG_BM": 64, "GEMM_SPLIT": 0}),
    ("moe_group", {"FMT": 3, "GG_BM": 128}),
]


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
@pytest.mark.parametrize("family,defines", VARIANTS, ids=[f"{f}-{'-'.join(f'{k}{v}' for k, v in d.items())}" for f, d in VARIANTS])
def test_kernel_variant_compiles(family, defines, arch):
    cubin, log = kb.compile_cubin(family, arch, defines)
    assert cubin[:4] == b"\x7fELF"
    assert "error" not in log.lower()


def production_gemm_builds() -> list[dict]:
    """The sm_90a GEMM builds of gemm_wgmma.cu the wrappers launch: gemm_wra per format and mode
    (the wide matrices: cuda_linear.uses_gemm_wra), gemm_wgp per x split, W_lo and tile width."""
    from bw24chat.backends import cuda_linear as cl

    out = []
    for fmt, code in (("NVFP4", 11), ("Q4_K", 8), ("Q8_0", 3)):
        # f32 x split, and the bf16-activation contract (x one plane; W split where not bf16-exact)
        for x_split in (True, False):
            bt, stages, _ = cl.wra_geometry(24576, x_split, fmt)
            out.append({"FMT": code, "GEMM_SPLIT": int(x_split), "WRA_BT": bt, "WRA_STAGES": stages})
    for x_split in (True, False):
        for w_lo in (False, True):
            for n_out in (4096, 24576):
                bn, stages, _ = cl.wgp_geometry(n_out, x_split, w_lo)
                out.append({"GEMM_SPLIT": int(x_split), "WG_BN": bn, "WGP_STAGES": stages, "WGP_WLO": int(w_lo)})
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


@pytest.mark.parametrize("defines", [d for f, d in production_matvec_builds() if f == "matvec" and d.get("ACT_Q8")],
                         ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
def test_integer_dot_matvec_builds_do_not_spill(defines):
    """ptxas's report on the sm_90a integer-dot matvec builds (every such format, m = 1 and more):
    no spills (the rolling window's loads and the decoders' scales stay in registers at the
    MV_MINB blocks per SM the wrapper asks for; matvec.cu's MV_U / MV_MINB defaults)."""
    _, log = kb.compile_cubin("matvec", "sm_90a", defines, extra=("-Xptxas=-v",))
    i = log.index("Function properties for matvec")
    props = log[i:log.index("\n", log.index("\n", i) + 1)]
    assert " 0 bytes spill stores" in props, props


def mma_matvec_builds() -> list[dict]:
    """The matvec_mma.cu builds cuda_linear.mma_plan picks (H100 resources: the ring depth follows
    the shared memory) for Q8_0, NVFP4, Q4_K at m = 1..16 (MMA_MAX_ROWS: the batched pass's
    16-row linears) on the Qwen3-8B widths (4096 and 12288 inputs), the Llama-3-8B down
    projection's (14336) and SmolLM2-135M's 576 (Q8_0 / NVFP4: 4-byte scale pieces), under
    prologue qx (the launches over K ranges from m = 7 at 12288) and
    rmsnorm (rows in groups), and the other warps per sub-tile (4) at both block sizes."""
    from bw24chat.backends import cuda_linear as cl, kernel_build

    out = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cl, "_sm_resources", lambda: (132, 228 * 1024))
        mp.setattr(kernel_build, "smem_block_limit", lambda: 227 * 1024)
        mp.delenv("BW24CHAT_A8", raising=False)
        for fmt in cl.MMA_FORMATS:
            fid, vpc = FORMATS[fmt]
            for in_ in (4096, 12288, 14336) + ((576,) if fmt in cl.MMA_S4_FORMATS else ()):
                W = cl.DeviceWeight(fmt, 4096, in_, None, fmt_id=fid, vpc=vpc)
                for m in range(1, cl.MMA_MAX_ROWS + 1):
                    for pro in ("qx", "rmsnorm"):
                        p = cl.mma_plan(W, m, pro)
                        out.append({"FMT": fid, "MV_M": p.m_fit, **p.defines})
            out += [{"FMT": fid, "MV_M": m, "MV_NW": nw, "MQ_KW": 4, "MQ_STAGES": 3, "MV_MINB": 2 if nw == 8 else 1,
                     **({"MV_STAT8": 1} if nw == 16 else {})} for m, nw in ((3, 8), (8, 16))]
    return [dict(t) for t in dict.fromkeys(tuple(sorted(d.items())) for d in out)]


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
@pytest.mark.parametrize("defines", mma_matvec_builds(), ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
def test_mma_matvec_builds_do_not_spill(defines, arch):
    """ptxas's report on the tensor-core integer-dot matvec builds: no spills at the registers of
    MV_MINB blocks per SM (its chains, fragments and MMA results stay in registers; the weight
    bytes in flight live in the shared-memory ring, not in registers)."""
    _, log = kb.compile_cubin("matvec_mma", arch, defines, extra=("-Xptxas=-v",))
    i = log.index("Function properties for matvec_mma")
    props = log[i:log.index("\n", log.index("\n", i) + 1)]
    assert " 0 bytes spill stores" in props, props


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
@pytest.mark.parametrize("fn,defines", production_moe_builds(),
                         ids=[f"{fn}-" + "-".join(f"{k}{v}" for k, v in d.items()) for fn, d in production_moe_builds()])
def test_moe_builds_do_not_spill(fn, defines, arch):
    """ptxas's report on the production MoE expert builds: the kernel each build is for (moe_gu or
    moe_down) keeps its window of loads in registers (MOE_U is the most that fits at MOE_MINB
    blocks per SM; a spill would put the in-flight loads through local memory)."""
    _, log = kb.compile_cubin("moe_experts", arch, defines, extra=("-Xptxas=-v",))
    i = log.index(f"Function properties for {fn}")
    props = log[i:log.index("\n", log.index("\n", i) + 1)]
    assert " 0 bytes spill stores" in props, (fn, props)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
@pytest.mark.parametrize("defines", [{"DK": 128, "KC": 4}, {"DK": 256, "KC": 4}, {"DK": 40, "KC": 3}, {"DK": 8, "KC": 2},
                                     {"DK": 64, "KC": 8}], ids=lambda d: f"DK{d['DK']}-KC{d['KC']}")
def test_deltanet_builds_do_not_spill(arch, defines):
    """ptxas's report on deltanet.cu's kernels: no spills (the recurrence keeps a lane's part of S,
    DK / 8 values, in registers for the whole pass; the conv its KC taps and window); and on
    deltanet_chunk.cu's at the same DK (the state pass keeps its tiles of S and of Q S in registers)."""
    from bw24chat.backends.cuda_deltanet import CH_BV

    builds = (("deltanet", defines, ("deltanet_conv", "deltanet_recurrent", "deltanet_gated_norm")),
              ("deltanet_chunk", {"DK": defines["DK"], "CH_BV": CH_BV}, ("deltanet_chunk_prep", "deltanet_chunk_state")))
    for family, defs, fns in builds:
        _, log = kb.compile_cubin(family, arch, defs, extra=("-Xptxas=-v",))
        for fn in fns:
            i = log.index(f"Function properties for {fn}")
            props = log[i:log.index("\n", log.index("\n", i) + 1)]
            assert " 0 bytes spill stores" in props, (fn, props)

@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
def test_sampler_does_not_spill(arch):
    """ptxas's report on sampling.cu's sample: no spills (its rows loop keeps a row's sums, keys
    and select state in registers at one 512-thread block per SM: __launch_bounds__(SNT, 1))."""
    _, log = kb.compile_cubin("sampling", arch, {}, extra=("-Xptxas=-v",))
    i = log.index("Function properties for sample\n")
    props = log[i:log.index("\n", log.index("\n", i) + 1)]
    assert " 0 bytes spill stores" in props, props
