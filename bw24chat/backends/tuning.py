"""The CUDA engine's tuned launch geometry, as data: one table per kernel family, each read by one
planning function (named at the table) of the launch wrappers.  What a table leaves to the GPU (grids
from its SM count; the deepest ring, or the smaller-footprint variant, that its shared memory holds)
those functions derive from the device's properties (kernel_build.current_device_attribute,
smem_block_limit, active_arch), so that backends/plan.py plans any GPU without one.  Every decision
these tables make for the shapes the engine is tuned on is printed in the golden plans
(tests/data/decode_plan_*.txt, prefill_plan_*.txt, attention_plans.txt): a change here shows there.
Figures behind the choices: docs/performance.md.
"""
from __future__ import annotations

from .kernel_refs import FLOAT_FORMATS


# ============================================================================ decode: matvec.cu
# matvec.cu geometry at m = 1 (m > 1: MATVEC_ROWS_TUNING below), by (integer-dot contract, weight
# format, cuda_linear.shape_class), read by cuda_linear._simt_defines; "*" is any other format.
# Each entry measured on the Qwen3-8B shapes, us per launch and decode tok/s (docs/performance.md):
# - integer dot, "o" / "down" (one partial wave of tiles): more loads in flight at 2 blocks per SM
#   (MV_U 3, Q8_0 4), 16 warps for down and NVFP4's o (one prologue per SM), NVFP4's o 2 slots;
# - integer dot, "mid" / "wide" (qkv, gate|up, LM head) of NVFP4 / Q4_K / Q8_0: 4 rows per warp,
#   1 slot, 16 warps with the 8-warp rmsnorm statistic (MV_STAT8: rows bit-identical to 8 warps),
#   a 64-row gate|up tile whose swiglu epilogue writes the down projection's x codes (QX);
# - branch-free steady windows (MV_STEADY) for Q8_0, and Q4_K / NVFP4 but on the square o;
# - BF16 (SIMT at every shape): steady windows; o / down 16 warps; gate|up / LM head as the wide
#   integer-dot ones (qkv, "mid", loses at 4 rows).  Q5_K / Q6_K / Q2_K / Q3_K keep the kernel's
#   defaults (their decoders need the registers; Q2_K / Q3_K not measured).  MV_STAT8 means "allowed behind an rmsnorm" (_warps_per_block).
# - "few" (at most FEW_ROWS rows, where an entry exists: an MoE router's F32 / BF16 logits, 128 x
#   2048 for Qwen3-30B-A3B): a row is one warp's, so 2 rows per warp left 8 blocks for a 1 MB
#   matrix (8.6 us a launch on the H100, docs/performance.md); one row per warp doubles the
#   blocks and 8 slots per lane put half a lane's 16 chunks in flight at once.
_WIDE = {"MV_R": 4, "MV_U": 1, "MV_MINB": 2, "MV_STEADY": 1, "MV_NW": 16, "MV_STAT8": 1}
MATVEC_TUNING: dict[tuple[bool, str, str], dict] = {
    (True, "Q8_0", "o"): {"MV_U": 4, "MV_MINB": 2, "MV_STEADY": 1},
    (True, "Q8_0", "down"): {"MV_U": 4, "MV_MINB": 2, "MV_STEADY": 1, "MV_NW": 16},
    (True, "Q8_0", "mid"): _WIDE, (True, "Q8_0", "wide"): _WIDE,
    (True, "Q4_K", "o"): {"MV_U": 3, "MV_MINB": 2},
    (True, "Q4_K", "down"): {"MV_U": 3, "MV_MINB": 2, "MV_STEADY": 1, "MV_NW": 16},
    (True, "Q4_K", "mid"): _WIDE, (True, "Q4_K", "wide"): _WIDE,
    (True, "NVFP4", "o"): {"MV_U": 2, "MV_MINB": 2, "MV_STEADY": 1, "MV_NW": 16},
    (True, "NVFP4", "down"): {"MV_U": 3, "MV_MINB": 2, "MV_STEADY": 1, "MV_NW": 16},
    (True, "NVFP4", "mid"): _WIDE, (True, "NVFP4", "wide"): _WIDE,
    **{(True, f, c): {} for f in ("Q5_K", "Q6_K", "Q2_K", "Q3_K") for c in ("o", "down", "mid", "wide")},
    (True, "*", "o"): {"MV_U": 3, "MV_MINB": 2}, (True, "*", "down"): {"MV_U": 3, "MV_MINB": 2},
    (False, "BF16", "o"): {"MV_STEADY": 1, "MV_NW": 16}, (False, "BF16", "down"): {"MV_STEADY": 1, "MV_NW": 16},
    (False, "BF16", "mid"): {"MV_STEADY": 1}, (False, "BF16", "wide"): _WIDE,
    **{(False, f, "few"): {"MV_R": 1, "MV_U": 8, "MV_MINB": 2, "MV_STEADY": 1} for f in ("F32", "BF16")},
}
A8_SMALL_ROWS = 4096  # the shape classes' row / input bound (cuda_linear.shape_class)
FEW_ROWS = 1024  # the "few" class's row bound (an MoE router's experts)


# matvec.cu geometry at m >= 2 rows (speculative verify, batched decode), by (integer-dot contract,
# weight format, "*": every call, or "swiglu": the swiglu epilogue's, where one is given), read by
# cuda_linear._simt_defines; rows equal the one-row step bit for bit whatever the geometry.
# - The float path (BF16, F16, F32) at the registers of 2 blocks per SM (MV_MINB 2: <= 128, no
#   spills at m = 2..8): the kernel's default (1) let ptxas take 133-142 registers at m = 2 and
#   6-8, one block of 8 warps per SM, and BF16's 2-row step (9.1 ms) ran slower than its 3-row
#   step (7.1 ms, 118 registers, 2 blocks); at 2 blocks its 2- and 6-8-row steps ran 1.41-1.55x
#   faster.
# - Q4_1 (float contract; SmolLM2-135M's 576-input matrices, tools/matvec_rows_sweep.py): a row
#   per warp and one load slot (a 576-input row is 18 chunks: the lanes hold little to stream, the
#   warps' serial dots over m tokens are what costs) — o / qkv / down 1.14-1.34x faster at m = 2..8;
#   the swiglu epilogue pairs rows in a warp, so gate|up takes 16 warps instead (1.13-1.25x).
# - Q8_0 under the integer dot where matvec_mma does not take the matrix (inputs not a multiple
#   of 256: SmolLM2's tied LM head, 49152 x 576): one load slot, 1.07-1.52x at m = 2..8.
# The other integer-dot builds keep the kernel's defaults (docs/performance.md).
MATVEC_ROWS_TUNING: dict[tuple[bool, str, str], dict] = {
    **{(False, f, "*"): {"MV_MINB": 2} for f in FLOAT_FORMATS},
    (False, "Q4_1", "*"): {"MV_R": 1, "MV_U": 1},
    (False, "Q4_1", "swiglu"): {"MV_NW": 16, "MV_STAT8": 1},
    (True, "Q8_0", "*"): {"MV_U": 1},
}


# matvec_mma.cu (the integer-dot matvec on int8 tensor cores, m = 1..16 rows; cuda_linear.mma_plan;
# the m-row steps' pick at m = 2..16, cuda_linear.matvec_impl), by (weight format, "*": any; rows
# class "one_tile" (m <= 4: one n-tile of 4 tokens x 2 code levels) / "two_tiles" (m <= 8) /
# "four_tiles" (m <= 16: 8 warps, as 16 would hold 128 registers and NVFP4 spills)): warps per block
# (MV_NW; 16 sum the rmsnorm statistic in the 8-warp order, MV_STAT8), warps per 16-row sub-tile
# (MQ_KW: the K split; MV_NW / MQ_KW sub-tiles per pass), the deepest weight ring (MQ_STAGES; fewer
# where the staged x leaves less room) and the blocks per SM the registers must allow (MV_MINB;
# <= 128 registers either way).  No row depends on any of it (matvec_mma.cu: the f32 order is the
# SIMT kernel's).  From the napkin math in matvec_mma.cu; tools/matvec_mma_timing.py --sweep times
# the alternatives.
MATVEC_MMA_TUNING: dict[tuple[str, str], dict] = {
    ("*", "one_tile"): {"MV_NW": 8, "MQ_KW": 8, "MQ_STAGES": 6, "MV_MINB": 2},
    ("*", "two_tiles"): {"MV_NW": 16, "MQ_KW": 8, "MQ_STAGES": 6, "MV_MINB": 1},
    ("*", "four_tiles"): {"MV_NW": 8, "MQ_KW": 8, "MQ_STAGES": 6, "MV_MINB": 1},
}


# ============================================================================ decode: moe_experts.cu
# moe_experts.cu geometry per (kernel, weight format), read by cuda_moe.geometry; "*" is any other
# format.  No output depends on any of it (moe_experts.cu: exactness); the grids come from the GPU's
# SM count and the blocks one SM holds (gu_blocks, down_rows).  Starting values for the integer-dot
# kernels, to be measured (tools/moe_geometry.py):
# - MOE_NW 16 warps, MOE_MINB 1 block per SM (the same 16 warps and 128 registers a thread as two
#   blocks of 8): a block stages and quantizes its whole x (moe_down: k*F = 6144 inputs at
#   Qwen3-30B-A3B, ~0.7 us of an SM's issue), so one block per SM does it once, not twice (the
#   dense matvec's 16-warp entries, for its prologue);
# - MOE_U, 16-byte items in flight per lane: the most that compile without register spills for
#   sm_90a and sm_120a (tests/test_kernel_compile.py); moe_gu's items are 2 rows (twice the
#   registers), and the decoders with more scale state take fewer.  At m = 1 a lane has ~12 items
#   in all (Q8_0; 24 BF16, 6 the 32-value formats);
# - MOE_R (moe_down's outputs per unit): the kernel's 1, as a block's 16 outputs at m = 1 give each
#   warp one.
def _geo(u: int) -> dict:
    return {"MOE_NW": 16, "MOE_U": u, "MOE_MINB": 1}


_GU_WINDOW = {"BF16": 8, "F16": 8, "F32": 8, "Q8_0": 6, "Q4_0": 8, "Q4_1": 8, "Q5_0": 6, "Q5_1": 6, "NVFP4": 5,
              "MXFP4": 6, "Q4_K": 4, "Q2_K": 4, "Q5_K": 3, "Q3_K": 3, "*": 2}
_DOWN_WINDOW = {"BF16": 12, "F16": 12, "F32": 12, "Q8_0": 12, "Q4_0": 8, "Q4_1": 8, "Q5_0": 8, "Q5_1": 8, "NVFP4": 8,
                "MXFP4": 8, "Q4_K": 8, "Q2_K": 8, "Q5_K": 6, "Q3_K": 6, "Q6_K": 5, "*": 4}
MOE_TUNING: dict[tuple[str, str], dict] = {**{("gu", f): _geo(u) for f, u in _GU_WINDOW.items()},
                                           **{("down", f): _geo(u) for f, u in _DOWN_WINDOW.items()}}


# ============================================================================ attention: attention_*.cu
def gpu_class(arch: int) -> str:
    """ATTN_DECODE_TUNING's GPU class of an sm_XY architecture number: "sm90" (Hopper),
    "clusters" (the later GPUs with thread-block clusters: sm_100, sm_120), "*" (before sm_90)."""
    return "sm90" if arch == 90 else "clusters" if arch > 90 else "*"


# Split-K decode attention, by (kernel, gpu_class); read by cuda_ops.attn_decode_geometry.  Kernel
# "tc": attention_decode_tc.cu (bf16 caches, head dims 32..128, sm_80+), "fma": attention_decode.cu
# (every other cache):
# - blocks_per_sm: the splits of one (row, kv head, head group) give about this many blocks per SM
#   at one row (the tensor-core kernel 1: its blocks stream 4x the bytes);
# - cluster: C, the splits merged in distributed shared memory inside a thread-block cluster of C
#   blocks (measured faster than the merge through the global workspace, 0 here: no clusters before
#   sm_90); 16 is Hopper's non-portable cluster size, 8 the portable one (a divisor of the largest:
#   the workspace holds whole clusters of it);
# - cluster_tiles (FMA): its rows of up to this many key tiles merge in the cluster, longer ones
#   over more blocks through the workspace (the FMA kernel needs more than 16 splits at long
#   context): ATTN_HYBRID = cluster_tiles / C.
ATTN_DECODE_TUNING: dict[tuple[str, str], dict] = {
    ("tc", "sm90"): {"blocks_per_sm": 1, "cluster": 8},
    ("tc", "clusters"): {"blocks_per_sm": 1, "cluster": 8},
    ("tc", "*"): {"blocks_per_sm": 1, "cluster": 0},
    ("fma", "sm90"): {"blocks_per_sm": 2, "cluster": 16, "cluster_tiles": 64},
    ("fma", "clusters"): {"blocks_per_sm": 2, "cluster": 8, "cluster_tiles": 64},
    ("fma", "*"): {"blocks_per_sm": 2, "cluster": 0},
}
# attention_decode_tc.cu's (four-warp halves per block, key tiles in its ring): the first whose ring
# the block's shared memory holds (two halves measured faster at long context)
ATTN_DECODE_TC_RINGS = ((2, 4), (1, 3), (1, 2))
# attention_prefill.cu's K/V stages (64 x 64 tiles): the first that the block's shared memory holds
ATTN_PREFILL_STAGES = (2, 1)


# ============================================================================ prefill GEMMs: gemm_*.cu
# Prefill GEMMs, by (kernels, weight format, row class); read by cuda_linear.gemm_geometry (through
# uses_gemm_i8, uses_gemm_wra, wra_geometry, wgp_geometry, gemm_bufs).  Kernels "wg": Hopper's
# warpgroup MMAs (sm_90a), "mma": the portable mma.sync ones (every other GPU, and what
# BW24CHAT_PORTABLE=1 forces).  Row class "wide": at least GEMM_WIDE_ROWS rows (qkv, gate|up), "*"
# the rest; "*" is also any other format.  Kernel:
# - "wra" (gemm_wgmma.cu gemm_wra): the codes decoded into wgmma's register operand, no
#   dequantization pass — the wide NVFP4 / Q4_K / Q8_0 matrices (the 4096-row ones measured faster on
#   the pass: too little tensor work per k tile to hide the decoding); tiles of 256 tokens when x or
#   W is split in bf16 hi + lo, "tiles_one_plane" when both are one plane (NVFP4 under the
#   bf16-activation contract);
# - "i8" (gemm_i8.cu: gemm_i8 on Hopper's int8 wgmma, gemm_i8_mma on mma.sync): Q8_0 under the
#   integer-dot contract, exact int32 block dots (measured faster than the bf16 split on Hopper; the
#   same rows as the decode's on the portable kernels, where the split left them 1.6e-5 to 4.2e-5
#   apart);
# - "wgp" (gemm_wgmma.cu gemm_wgp, weights dequantized to bf16 a row block at a time): "tiles" the
#   weight rows per block, the first whose 3-stage ring fits (256-row tiles leave SMs idle on the
#   4096-row matrices), a ring as deep as fits up to "stages";
# - "mma" (gemm_mma.cu): "bufs", its k-tile buffers, the first that fits (one on the 99 KB GPUs'
#   kernels with x or W split: the same order of MMAs, one more barrier per k tile).
# A matrix a kernel cannot take (gemm_wra and the portable gemm_i8_mma need whole 64-input k tiles,
# gemm_i8 128; gemm_wgp 16-byte rows: a multiple of 8 inputs) takes the next entry that can, in
# the order (format, row class), (format, *), (*, row class), (*, *); on "wg" the portable gemm last.
GEMM_WIDE_ROWS = 6144
_WRA = {"kernel": "wra", "tiles": (256,), "tiles_one_plane": (128,), "stages": 4}
GEMM_TUNING: dict[tuple[str, str, str], dict] = {
    ("wg", "NVFP4", "wide"): _WRA, ("wg", "Q4_K", "wide"): _WRA, ("wg", "Q8_0", "wide"): _WRA,
    ("wg", "Q8_0", "*"): {"kernel": "i8"},
    ("wg", "*", "wide"): {"kernel": "wgp", "tiles": (256, 128), "stages": 4},
    ("wg", "*", "*"): {"kernel": "wgp", "tiles": (128,), "stages": 4},
    ("mma", "Q8_0", "*"): {"kernel": "i8"},
    ("mma", "*", "*"): {"kernel": "mma", "bufs": (2, 1)},
}
# the MoE prefill's grouped expert GEMMs (moe_group.cu GG_BM, read by cuda_moe.group_tile): the
# first tile of tokens that the mean rows per expert fill to at most two thirds (Qwen3-30B-A3B at
# pp512: 32 rows, 64-token tiles; the spread of the counts then leaves nearly every expert in one
# tile, whose weight tiles are read once, and the tile's empty 16-row slices skip their MMAs)
GROUPED_GEMM_TILES = (64, 128)
# rows of a weight dequantized per gemm_wgp launch, in values (128 MB of bf16 per plane): smaller
# blocks split a 4096 x 12288 down projection into 80- and 48-block launches (SMs idle)
GEMM_DEQ_VALUES = 64 * 1024 * 1024


# ============================================================================ prefill: deltanet_chunk.cu
# The gated delta rule's prefill (cuda_deltanet.chunked_rows, chunk_smem): a prefill pass runs its
# whole 64-row chunks chunked on tensor cores, and its partial last chunk too when it has at least
# DELTANET_CHUNK_MIN_TAIL rows; shorter tails (and prompts) run the recurrence row by row (~0.2-0.4
# us a row, one launch) rather than pay the chunked form's two launches and sequential chunk step
# (~10 us whatever the rows).  Estimated, not yet measured on a GPU.  DELTANET_CHUNK_BV: state
# columns per block of the state pass (deltanet_chunk.cu CH_BV): 16 fits sm_120's 99 KB at key
# head dim 128 and gives the 9B shape's 32 heads 256 blocks, two per SM on sm_90.
DELTANET_CHUNK_MIN_TAIL = 32
DELTANET_CHUNK_BV = 16
