"""Every kernel family compiles to a cubin (ptxas runs) for sm_90a and sm_120a, without a GPU,
through NVRTC (pip nvidia-cuda-nvrtc + CUDA headers from nvidia-cuda-runtime)."""
import types

import numpy as np
import pytest

from bw24chat.backends import kernel_build as kb

try:
    kb._find_nvrtc()
    HAVE_NVRTC = True
except FileNotFoundError:
    HAVE_NVRTC = False

pytestmark = pytest.mark.skipif(not HAVE_NVRTC, reason="libnvrtc not installed (pip install nvidia-cuda-nvrtc)")


def test_there_are_kernels():
    assert len(kb.families()) >= 1


BARE_DEFINES = {"matvec_tc": {"FMT": 11, "TC_NW": 4, "TC_U": 2}}  # the defines a family cannot do without


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
@pytest.mark.parametrize("family", kb.families())
def test_kernel_compiles(family, arch):
    cubin, log = kb.compile_cubin(family, arch, BARE_DEFINES.get(family))
    assert cubin[:4] == b"\x7fELF", "NVRTC returned something that is not a cubin"
    assert "error" not in log.lower()


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
    the integer-dot contract, Q6_K, BF16 at m = 1 and 3, F16's and NVFP4's (float contract)
    tensor-core o projection; every define is the wrapper's own choice."""
    from bw24chat.backends import cuda_linear as cl, kernel_build
    from bw24chat.backends.cuda_weights import FORMATS

    calls = []
    rec = lambda fam, name, **d: (lambda *a, **k: calls.append((fam, d)))  # noqa: E731
    arr = _Buffer
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cl, "get_kernel", rec)
        mp.setattr(cl, "_sm_resources", lambda: (132, 228 * 1024))
        mp.setattr(cl, "resident_blocks", lambda k, t, s: 1)
        mp.setattr(kernel_build, "smem_block_limit", lambda: 227 * 1024)
        mp.delenv("BW24CHAT_A8", raising=False)
        for fmt, ms in (("NVFP4", (1, 3)), ("Q4_K", (1,)), ("Q8_0", (1, 8)), ("Q6_K", (1,)), ("BF16", (1, 3)), ("F16", (1,))):
            W = lambda o, i: cl.DeviceWeight(fmt, o, i, None, fmt_id=FORMATS[fmt][0], vpc=FORMATS[fmt][1])  # noqa: E731
            for m in ms:
                qx = cl.writes_qx(W(24576, 4096), m) and cl.takes_qx(W(4096, 12288), m)
                q = arr(m * 8192, "uint32") if qx else None
                cl.matvec(W(6144, 4096), arr(m * 4096), arr(m * 6144), m, "rmsnorm", norm_w=0)
                cl.matvec(W(24576, 4096), arr(m * 4096), arr(m * 12288), m, "rmsnorm", "swiglu", norm_w=0, qx_out=q)
                cl.matvec(W(4096, 12288), arr(m * 12288), arr(m * 4096), m, "qx" if qx else "none", "add", qx_in=q)
                cl.matvec(W(49152, 4096), arr(m * 4096), arr(m * 49152), m, "rmsnorm", norm_w=0)
                cl.matvec(W(4096, 4096), arr(m * 4096), arr(m * 4096), m, epilogue="add")
        cl.matvec(cl.DeviceWeight("NVFP4", 4096, 4096, None, fmt_id=11, vpc=32), arr(4096), arr(4096), 1, act_quant=False)
    return [(f, d) for f, d in dict.fromkeys((f, tuple(sorted(d.items()))) for f, d in calls)
            for f, d in [(f, dict(d))]]


VARIANTS = [  # compile-time variants the default build of a family does not reach
    *production_matvec_builds(),
    # decode attention's split merge in a thread-block cluster (ATTN_CLUSTER: barrier.cluster, mapa, ld.shared::cluster)
    ("attention", {"HD": 128, "GQ": 4, "KV_TYPE": 0, "ATTN_CLUSTER": 16}),
    ("attention", {"HD": 128, "GQ": 4, "KV_TYPE": 0, "ATTN_CLUSTER": 8, "TC_HALVES": 2}),  # two tile streams per block
    ("attention", {"HD": 64, "GQ": 2, "KV_TYPE": 0, "TC_HALVES": 2, "TCSTAGES": 4}),
    ("attention", {"HD": 64, "GQ": 1, "KV_TYPE": 0, "ATTN_CLUSTER": 8}),
    ("attention", {"HD": 128, "GQ": 4, "KV_TYPE": 1, "ATTN_CLUSTER": 8}),  # the FMA kernel (q8_0, f32 caches)
    ("attention", {"HD": 64, "GQ": 2, "KV_TYPE": 3, "ATTN_CLUSTER": 16}),
    ("attention", {"HD": 128, "GQ": 4, "KV_TYPE": 1, "ATTN_CLUSTER": 8, "ATTN_HYBRID": 8}),  # cluster up to C * P tiles
    ("attention", {"HD": 128, "GQ": 4, "KV_TYPE": 2, "ATTN_CLUSTER": 16, "ATTN_HYBRID": 4}),
    ("gemm", {"FMT": 11, "WGP_DEQ": 1, "WG_BN": 256, "WGP_STAGES": 3}),  # gemm_wgp decoding NVFP4 in its pipeline
    ("gemm", {"FMT": 8, "WGP_DEQ": 1, "WGP_WLO": 1}),  # the same, Q4_K with the W_lo plane (precise)
    ("gemm", {"FMT": 11, "WRA_BT": 256, "WRA_STAGES": 3}),  # gemm_wra: NVFP4 codes into wgmma's register operand
    ("gemm", {"FMT": 11, "WRA_BT": 128, "WRA_STAGES": 4, "GEMM_SPLIT": 0}),
    ("gemm", {"FMT": 8, "WRA_BT": 256, "WRA_STAGES": 3}),  # gemm_wra on Q4_K (W_hi and W_lo registers)
    ("gemm", {"FMT": 3, "WRA_BT": 256, "WRA_STAGES": 3}),  # gemm_wra on Q8_0 (the bf16 split: W_hi, W_lo)
    ("gemm", {"FMT": 3, "I8_STAGES": 4}),
    ("gemm", {"FMT": 3, "I8_STAGES": 4, "I8_SCF32": 1}),  # gemm_i8 with the f32 scales converted once per tile  # gemm_i8 (Q8_0 on the int8 wgmma; its body exists on sm_90a only)
    ("gemm", {"FMT": 3, "GEMM_XPLANES": 1}),  # register-staged GEMMs on the integer-dot contract's x planes
    ("gemm", {"FMT": 3, "GEMM_XPLANES": 1, "GM_BUFS": 1}),  # one tile buffer: the precise gemm in 99 KB (sm_120a)
    ("gemm", {"FMT": 2, "GM_BUFS": 1}),
    ("attention", {"HD": 128, "GQ": 4, "KV_TYPE": 1, "PREFILL_STAGES": 1}),  # one K/V stage: precise prefill in 99 KB
    ("attention", {"HD": 128, "GQ": 4, "KV_TYPE": 0, "PREFILL_STAGES": 1}),
    ("gemm", {"FMT": 11, "GEMM_XPLANES": 1, "GEMM_SPLIT": 0}),  # the same, fast mode (one plane)
    ("gemm", {"FMT": 3, "GEMM_SPLIT": 0, "GEMM_WSPLIT": 1}),  # the bf16-activation contract: x one plane, W split
    ("gemm", {"FMT": 8, "GEMM_SPLIT": 0, "GEMM_WSPLIT": 1, "GM_BUFS": 1}),
    ("attention", {"HD": 64, "GQ": 8}),  # decode on tensor cores, head dim 64, 8 heads per block
    # ATTN_QX (opt-in): the finishing block writes the o projection's QX codes, every merge
    ("attention", {"HD": 128, "GQ": 4, "KV_TYPE": 0, "ATTN_QX": 1, "TC_HALVES": 2, "TCSTAGES": 4}),
    ("attention", {"HD": 128, "GQ": 4, "KV_TYPE": 0, "ATTN_QX": 1, "ATTN_CLUSTER": 8, "TC_HALVES": 2, "TCSTAGES": 4}),
    ("attention", {"HD": 64, "GQ": 8, "KV_TYPE": 1, "ATTN_QX": 1, "ATTN_CLUSTER": 16, "ATTN_HYBRID": 4}),
    # the tensor-core decode's hybrid merge (long rows over one wave of blocks, the workspace merge)
    ("attention", {"HD": 128, "GQ": 4, "KV_TYPE": 0, "ATTN_QX": 1, "ATTN_CLUSTER": 8, "ATTN_HYBRID": 4, "TC_HALVES": 2,
                   "TCSTAGES": 4}),
    # attn_decode_tc's cp.async issue unrolled with hoisted addresses (opt-in ATTN_ISSUE_HOIST)
    *[("attention", {"HD": hd, "GQ": gq, "KV_TYPE": 0, "ATTN_ISSUE_HOIST": 1, **extra}) for hd, gq, extra in
      ((128, 4, {"TC_HALVES": 2, "TCSTAGES": 4, "ATTN_CLUSTER": 8, "ATTN_QX": 1}), (128, 4, {"TC_HALVES": 1}),
       (64, 8, {"TC_HALVES": 2, "TCSTAGES": 4}), (32, 4, {"TC_HALVES": 2, "TCSTAGES": 4}))],
    ("dequant", {"FMT": 11, "DEQ_LO": 0}),  # the dequantization pass for the hi plane alone
    ("dequant", {"FMT": 0, "DEQ_LO": 0}),  # F32 chunks (8-byte store units)
]


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
@pytest.mark.parametrize("family,defines", VARIANTS, ids=[f"{f}-{'-'.join(f'{k}{v}' for k, v in d.items())}" for f, d in VARIANTS])
def test_kernel_variant_compiles(family, defines, arch):
    cubin, log = kb.compile_cubin(family, arch, defines)
    assert cubin[:4] == b"\x7fELF"
    assert "error" not in log.lower()


def production_gemm_builds() -> list[dict]:
    """The sm_90a GEMM builds the wrappers launch by default: gemm_wra per format, mode and tile
    width, gemm_wgp per mode, W_lo and tile width, gemm_i8."""
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
                out.append({"FMT": 2, "GEMM_SPLIT": int(precise), "WG_BN": bn, "WGP_STAGES": stages, "WGP_WLO": int(w_lo)})
    out.append({"FMT": 3, "I8_STAGES": cl.I8_STAGES, "I8_SCF32": 1})
    return [dict(t) for t in dict.fromkeys(tuple(sorted(d.items())) for d in out)]


@pytest.mark.parametrize("defines", production_gemm_builds(), ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
def test_wgmma_builds_are_not_serialized_and_do_not_spill(defines):
    """ptxas's own report on the default sm_90a GEMM builds: no "Potential Performance Loss" (C7513 /
    C7515: wgmma serialized), and gemm_wgp / gemm_wra without spills.  Why: the seventeenth
    session's first register-operand pipeline compiled and gave the right bits while ptxas had
    serialized every wgmma of its fast and Q4_K builds (bench/NOTES.md)."""
    _, log = kb.compile_cubin("gemm", "sm_90a", defines, extra=("-Xptxas=-v",))
    assert "Potential Performance Loss" not in log, [line for line in log.splitlines() if "Potential" in line]
    for fn in ("gemm_wgp", "gemm_wra"):
        i = log.index(f"Function properties for {fn}")
        props = log[i:log.index("\n", log.index("\n", i) + 1)]
        assert " 0 bytes spill stores" in props, props
