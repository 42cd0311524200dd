"""Host-side planning of the CUDA runner (no GPU needed): the KV cache is sized to the VRAM budget."""
import pytest
from bw24chat.backends.cuda_budget import fit_context


def test_context_fits_the_budget():
    # Llama-3.1-8B-like: 32 layers, 8 kv heads of 128, bf16 cache = 128 KiB per token
    gib = 2**30
    n = fit_context(131072, 0, 24 * gib, 16 * gib, 32, 8, 128, "bf16")
    assert n % 256 == 0 and 256 <= n < 131072
    per_token = 2 * 32 * 8 * 128 * 2
    assert 16 * gib + n * per_token + (3 << 29) <= 24 * gib
    assert fit_context(131072, 0, 140 * gib, 16 * gib, 32, 8, 128, "bf16") == 131072  # an H200 holds it all
    assert fit_context(131072, 8192, 24 * gib, 16 * gib, 32, 8, 128, "bf16") == 8192  # a request that fits
    assert fit_context(131072, 0, 24 * gib, 16 * gib, 32, 8, 128, "q8_0") > n  # a smaller cache holds more
    assert fit_context(4096, 0, 17 * gib, 16 * gib + gib // 2, 32, 8, 128, "bf16") == 256  # never below 256


def test_pdl_launch_structures_match_cuda_h():
    """The ctypes mirrors used for cuLaunchKernelEx (kernel_build.launch_pdl) have cuda.h's
    layout: CUlaunchAttribute 72 bytes (id, pad to 8, 64-byte value union), CUlaunchConfig 56
    bytes with hStream at 32 and attrs at 40; kernel arguments become the C types the kernels
    declare, and anything else is refused rather than guessed."""
    import ctypes

    import numpy as np
    import pytest

    from bw24chat.backends import kernel_build as kb

    assert ctypes.sizeof(kb._LaunchAttr) == 72 and kb._LaunchAttr.value.offset == 8
    assert ctypes.sizeof(kb._LaunchConfig) == 56
    assert kb._LaunchConfig.hStream.offset == 32 and kb._LaunchConfig.attrs.offset == 40
    assert isinstance(kb._arg(np.int32(-3)), ctypes.c_int32) and kb._arg(np.int32(-3)).value == -3
    assert isinstance(kb._arg(np.float32(1.5)), ctypes.c_float)
    assert isinstance(kb._arg(np.uint64(0)), ctypes.c_uint64)
    with pytest.raises(TypeError):
        kb._arg(3)  # a Python int has no fixed width: the launch wrappers pass NumPy scalars


def test_pdl_on_every_kernel_but_matvec_tc(monkeypatch):
    """PDL on every kernel but matvec_tc (kernel_build.PDL_OFF), never below sm_90 (compute
    capabilities compared as numbers: "120" >= "90"), never inside eager_launches."""
    from bw24chat.backends import kernel_build as kb

    monkeypatch.setattr(kb, "pdl_supported", lambda: True)
    assert kb.pdl_enabled("matvec") and kb.pdl_enabled("attn_decode") and not kb.pdl_enabled("matvec_tc")
    with kb.eager_launches():
        assert not kb.pdl_enabled("matvec")
    monkeypatch.setattr(kb, "pdl_supported", lambda: False)
    assert not kb.pdl_enabled("matvec")


def test_pdl_supported_compares_numbers(monkeypatch):
    import sys
    import types

    from bw24chat.backends import kernel_build as kb

    for cc, want in (("80", False), ("90", True), ("100", True), ("120", True)):
        dev = types.SimpleNamespace(compute_capability=cc)
        fake = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=lambda d=dev: d))
        monkeypatch.setitem(sys.modules, "cupy", fake)
        kb._device_pdl.cache_clear()
        assert kb.pdl_supported() is want, cc
    kb._device_pdl.cache_clear()


def test_resident_blocks_match_the_occupancy_calculator(monkeypatch):
    """Nsight Compute's "Block Limit Registers" on the H200: 151 registers x 256
    threads -> 1 block per SM, 93 x 128 -> 5, 80 x 256 -> 3; shared memory and warps cap too."""
    from bw24chat.backends import cuda_linear as cl

    monkeypatch.setattr(cl, "_sm_resources", lambda: (132, 233472))
    assert cl._resident_blocks(151, 256, 24 * 1024) == 1
    assert cl._resident_blocks(93, 128, 20 * 1024) == 5
    assert cl._resident_blocks(80, 256, 17 * 1024) == 3
    assert cl._resident_blocks(32, 128, 100 * 1024) == 2  # shared memory: 228 KB / (100 + 1) KB
    assert cl._resident_blocks(16, 1024, 0) == 2  # warps: 64 per SM


def test_persistent_grid_spreads_tiles_evenly(monkeypatch):
    from bw24chat.backends import cuda_linear as cl

    monkeypatch.setattr(cl, "_sm_resources", lambda: (132, 233472))
    monkeypatch.setattr(cl, "resident_blocks", lambda k, t, s: 5)  # capacity 660 blocks
    assert cl.persistent_grid(None, 128, 0, 768) == 384  # 2 tiles per block, none with a lone extra
    assert cl.persistent_grid(None, 128, 0, 128) == 128
    assert cl.persistent_grid(None, 128, 0, 1000) == 500  # 2 per block: 500 blocks, not 660 with some idle at the end


@pytest.mark.parametrize("x_split", [True, False])
@pytest.mark.parametrize("w_lo", [True, False])
@pytest.mark.parametrize("n_out", [100, 4096, 6144, 24576])
def test_wgp_geometry_fits_shared_memory(x_split, w_lo, n_out):
    """gemm_wgp's ring always fits one block's shared memory (227 KB opt-in), has 3 or 4 stages
    (prefetch distance >= 1), and its bytes per stage match the tiles it holds."""
    from bw24chat.backends import cuda_linear as cl
    from bw24chat.backends.tuning import GEMM_WIDE_ROWS

    bn, stages, stage = cl.wgp_geometry(n_out, x_split, w_lo)
    assert bn in (128, 256) and stages in (3, 4)
    assert stage == ((2 if x_split else 1) * 128 + (2 if w_lo else 1) * bn) * 64 * 2  # x tiles 128 rows, W tiles bn
    assert stages * stage + 1024 <= 227 * 1024
    wide_fits = 3 * ((2 if x_split else 1) * 128 + (2 if w_lo else 1) * 256) * 128 + 1024 <= 227 * 1024
    assert bn == (256 if n_out >= GEMM_WIDE_ROWS and wide_fits else 128)


def test_which_prefill_matrices_take_gemm_wra():
    """uses_gemm_wra: the wide NVFP4 / Q4_K / Q8_0 matrices only (measured faster there); never a
    format it does not decode, nor rows off whole k tiles; and Q8_0 leaves gemm_i8 exactly when
    it takes gemm_wra."""
    from types import SimpleNamespace

    from bw24chat.backends import cuda_linear as cl

    for fmt in ("NVFP4", "Q4_K", "Q8_0", "BF16", "Q6_K"):
        for n in (4096, 6144, 24576):
            W = SimpleNamespace(fmt=fmt, out=n, in_=4096)
            assert cl.uses_gemm_wra(W) == (fmt in ("NVFP4", "Q4_K", "Q8_0") and n >= 6144), (fmt, n)
            assert cl.uses_gemm_i8(W) == (fmt == "Q8_0" and not cl.uses_gemm_wra(W))
            assert not cl.uses_gemm_wra(SimpleNamespace(fmt=fmt, out=n, in_=4096 + 32))


def test_device_attributes_are_read_once_per_device(monkeypatch):
    """kernel_build.device_attributes: CuPy's Device.attributes queries every attribute on each
    read; the launch wrappers' SM count and shared-memory sizes come from one read per device."""
    import sys
    import types

    from bw24chat.backends import cuda_linear as cl
    from bw24chat.backends import cuda_ops as ops
    from bw24chat.backends import kernel_build as kb

    reads = []

    class FakeDevice:
        def __init__(self, device_id=None):
            self.id = 0 if device_id is None else device_id

        @property
        def attributes(self):
            reads.append(self.id)
            return {"MultiProcessorCount": 132 + self.id, "MaxSharedMemoryPerMultiprocessor": 233472,
                    "MaxSharedMemoryPerBlockOptin": 232448}

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=FakeDevice))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    kb.device_attributes.cache_clear()
    try:
        for _ in range(3):
            assert cl._sm_resources() == (132, 233472)
            assert ops._n_sm() == 132
        assert kb.smem_block_limit() == 232448
        assert kb.device_attributes(1)["MaxSharedMemoryPerBlockOptin"] == 232448
        assert kb.device_attributes(1)["MultiProcessorCount"] == 133
        assert reads == [0, 1]
    finally:
        kb.device_attributes.cache_clear()


def test_a_model_the_vram_budget_cannot_hold_is_refused_before_loading():
    """Weights the runner keeps resident over the budget are refused with the numbers and what
    would run instead; spilled MoE experts count with their VRAM slots only."""
    from types import SimpleNamespace

    from bw24chat.backends.cuda_budget import RESERVE_BYTES, check_fits, resident_weight_bytes
    from bw24chat.backends.expert_tiers import DoesNotFit, MoELayout, plan_tiers

    gib = 2**30
    check_fits("m", 16 * gib, 16 * gib + RESERVE_BYTES)  # fits exactly
    with pytest.raises(DoesNotFit, match=r"the weights take 16.0 GiB .* budget is 16.0 GiB.*--device cpu"):
        check_fits("m", 16 * gib, 16 * gib)
    lay = MoELayout((128,) * 48, (5 << 20,) * 48, 8, 2 * gib, 2 * gib)
    plan = plan_tiers(lay, gib, 16 * gib)
    ck = SimpleNamespace(nbytes=lay.other_bytes + lay.total_expert_bytes)
    assert resident_weight_bytes(ck) == ck.nbytes
    spilled = resident_weight_bytes(ck, SimpleNamespace(layout=lay, plan=plan))
    assert spilled == 2 * gib + 48 * plan.vram_slots[0] * (5 << 20) < 16 * gib
