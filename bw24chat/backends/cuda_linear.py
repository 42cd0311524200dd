"""Launch wrappers for the linear-algebra kernels on repacked weights (DeviceWeight):
``matvec`` (decode, m = 1..8 rows, fused rmsnorm/swiglu prologue and store/add epilogue),
``gemm`` (prefill on tensor cores), ``embed`` (row gather) and ``dequantize`` (whole tensor).

All take preallocated CuPy outputs, launch on the current stream and neither allocate nor
synchronize, so the decode step can be captured in a CUDA graph.  Absent optional pointers are
passed as a null 64-bit value.  Contracts: kernels/matvec.cu, matvec_tc.cu, gemm_*.cu, dequant.cu.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from . import kernel_build
from .cuda_weights import DeviceWeight
from .kernel_build import get_kernel
from .kernel_refs import A8_FORMATS, FLOAT_FORMATS, act_q8, qx_row_words  # noqa: F401 (qx_row_words: the runner's QX buffers)

MV_R = 2  # rows per warp in matvec.cu (MV_R); 8 warps per block
MV_SMEM_FLOATS = 16384  # x staging budget per block (64 KB), split over the m rows: at m = 1 x stays
# resident up to 16k inputs (down 12288 no longer re-stages a second k-tile behind a barrier)
GM_TILE = 128  # gemm_mma.cu: tokens and out rows per block (gemm_mma.cuh GM_BN: the grouped GEMM's out rows too)
GM_LD = 72  # gemm_common.cuh GM_LD: bf16 per tile row (64 + 8 padding)
_W_EXACT_IN_BF16 = ("BF16", "NVFP4", "MXFP4")  # gemm_common.cuh W_SPLIT: the weights that need no lo plane
PROLOGUES = {"none": 0, "rmsnorm": 1, "swiglu": 2, "qx": 3}  # qx: x's codes ready-made (matvec.cu PRO_QX)
EPILOGUES = {"store": 0, "add": 1, "swiglu": 2}
PRO_BF16 = 8  # matvec.cu: the prologue flag of the bf16-activation contract (x rounded to bf16 first)
QX_HANDOFF = 2  # matvec.cu: qx_out's tile outputs reach the quantizing warp through named barriers
_NULL = np.uint64(0)


def _ptr(a):
    return _NULL if a is None else a


def _wargs(W: DeviceWeight) -> tuple:
    return (W.q, _ptr(W.h), _ptr(W.s), _ptr(W.d), _ptr(W.gscale))


def _gemm_smem(x_split: bool, w_split: bool, bufs: int = 2, bm: int = GM_TILE) -> int:
    """gemm_mma.cuh GM_SMEM_BYTES_FOR(bm): bufs x (the x tile of bm tokens, the W tile of 128
    rows, and their lo tiles when split), bf16 rows of GM_LD (tests/test_smem_contract.py holds
    the two equal)."""
    return bufs * 2 * GM_LD * ((1 + int(x_split)) * bm + (1 + int(w_split)) * GM_TILE)


def gemm_bufs(x_split: bool, w_split: bool, bm: int = GM_TILE) -> int:
    """The portable gemm's tile buffers (gemm_mma.cuh GM_BUFS): 2 (k tile i+1 stored while tile i
    is used) where the block's shared memory holds them, else 1 (one more barrier per k tile; the
    same order of MMAs per output, so the same bits).  The precise kernels need 108 KB (x split)
    and 144 KB (x and W split) with two buffers at 128 tokens: above the 99 KB of sm_86 / sm_89 /
    sm_120, whose prefill this kernel is."""
    return 2 if _gemm_smem(x_split, w_split, 2, bm) <= kernel_build.smem_block_limit() else 1


def _wsplit_define(W: DeviceWeight | None, x_split: bool, w_split: bool) -> dict:
    """gemm_common.cuh GEMM_WSPLIT where it differs from its default (GEMM_SPLIT): W split with x
    as one bf16 plane (the bf16-activation contract on weights not exact in bf16).  The kernels
    derive W_SPLIT from it and the format, as w_split here (_W_EXACT_IN_BF16)."""
    return {"GEMM_WSPLIT": 1} if w_split and not x_split else {}


def _gemm_kernel(fmt_id: int, x_split: bool, w_split: bool, family: str = "gemm_mma", name: str = "gemm",
                 bm: int = GM_TILE, **defines):
    """A kernel on gemm_mma.cuh's block (the portable gemm, or moe_group.cu's grouped one with
    tiles of bm tokens) for these splits, and its dynamic shared memory (set as its limit)."""
    bufs = gemm_bufs(x_split, w_split, bm)
    k = get_kernel(family, name, FMT=fmt_id, GEMM_SPLIT=int(x_split), **({"GM_BUFS": 1} if bufs == 1 else {}),
                   **_wsplit_define(None, x_split, w_split), **defines)
    smem = _gemm_smem(x_split, w_split, bufs, bm)
    k.max_dynamic_shared_size_bytes = smem
    return k, smem


WG_BM = 128  # gemm_wgmma.cu gemm_wgp: tokens per block


def gemm_impl() -> str:
    """"wg" (the Hopper warpgroup-MMA kernels) where the GPU is compiled for sm_90a, else "mma"
    (the portable mma.sync kernels, also what sm_120a runs and what BW24CHAT_PORTABLE=1 forces;
    tests pass gemm(impl="mma") to run them on Hopper)."""
    from .kernel_build import active_arch

    return "wg" if active_arch() == "sm_90a" else "mma"


def wg_stage_bytes(precise: bool, w_lo: bool, bn: int) -> int:
    """Shared bytes of one stage of gemm_wgp: [x hi (| x lo)] tiles of WG_BM rows and [W (| W
    lo)] tiles of bn rows, 64 bf16 per row.  The kernel adds 1 KB to align its stages to 1024
    bytes (the 128-byte swizzle)."""
    return ((2 if precise else 1) * WG_BM + (2 if w_lo else 1) * bn) * 64 * 2


def matvec_tile(W: DeviceWeight, m: int) -> int:
    """k-tile width (values) staged in shared memory: a multiple of 32 chunks; any value gives
    the same results (the per-lane chunk order does not depend on it)."""
    wt = 32 * W.vpc
    need = -(-W.in_ // wt) * wt
    return min(need, max(wt, (MV_SMEM_FLOATS // m) // wt * wt))


TC_ROWS = 32  # matvec_tc.cu: output rows per block
TC_SMEM_X = 64 * 1024  # x staging budget of matvec_tc (4 bytes per value and token)
_smem_set: dict = {}


def _ensure_smem(k, smem: int) -> None:
    """Raise the kernel's dynamic shared-memory limit past the 48 KB default when needed."""
    if smem > 47 * 1024 and _smem_set.get(id(k), 0) < smem:
        k.max_dynamic_shared_size_bytes = smem
        _smem_set[id(k)] = smem


TC_LARGE_ROWS = 8192  # matvec_tc geometry switch (tc_geometry)
TC_FORMATS = ("NVFP4", "F16")  # the formats matvec_tc.cu decodes
TC_FLOAT_MAX_ROWS = 4096  # F16: tensor cores up to this many rows, the SIMT kernel above


def matvec_impl(W: DeviceWeight, a8: bool | None = None, m: int = 1) -> str:
    """"tc" (matvec_tc.cu), "simt" (matvec.cu) or "i8" (matvec_i8.cu) for m rows, by measurement
    (docs/performance.md, Qwen3-8B shapes): NVFP4 on the float contract always tc (~2
    instructions per weight against ~6 in SIMT); F16 tc up to 4096 rows (their SIMT grids are
    one partial wave), SIMT above; BF16 SIMT (16-warp SIMT blocks beat tc on every BF16 shape);
    the integer-dot contract SIMT at one row (an int8 tensor-core kernel of its own reduction
    order measured 10-50 % slower there) and matvec_i8 where MATVEC_ROWS_TUNING says so for m
    rows (the same bits as SIMT).  a8: the integer-dot contract (None: act_q8)."""
    a8 = act_q8(W.fmt) if a8 is None else a8
    if a8 and W.fmt not in FLOAT_FORMATS and m > 1 and _rows_entry(W, a8).get("impl") == "i8":
        return "i8"
    if W.fmt not in TC_FORMATS or a8:
        return "simt"
    return "tc" if W.fmt == "NVFP4" or W.out <= TC_FLOAT_MAX_ROWS else "simt"


def tc_geometry(W: DeviceWeight) -> tuple[int, int]:
    """(warps per block, super-steps in flight) of matvec_tc (docs/performance.md, us per launch on
    the Qwen3-8B shapes): NVFP4 16 x 2 up to 4096 rows, 8 x 2 below 8192, 4 x 2 from 8192; F16
    16 x 1."""
    if W.fmt == "NVFP4":
        return (16 if W.out <= 4096 else 8 if W.out < TC_LARGE_ROWS else 4), 2
    return 16, 1


def _sm_resources() -> tuple[int, int]:
    """(multiprocessors, shared memory per multiprocessor) of the current device (read once per
    device: kernel_build.device_attributes)."""
    return (kernel_build.current_device_attribute("MultiProcessorCount"),
            kernel_build.current_device_attribute("MaxSharedMemoryPerMultiprocessor"))


_resident: dict = {}


def resident_blocks(k, threads: int, smem: int) -> int:
    """Blocks of ``k`` one multiprocessor holds at once (registers, shared memory, warps), from
    the compiled kernel's register count: the occupancy calculator's rules (registers allocated
    per warp in units of 256, 1 KB of shared memory reserved per block, 64 warps per SM).
    Memoized per (kernel, threads, shared bytes, device): the register count is a driver query."""
    key = (id(k), threads, smem, _sm_resources())
    if key not in _resident:
        _resident[key] = _resident_blocks(k.num_regs, threads, smem)
    return _resident[key]


def _resident_blocks(num_regs: int, threads: int, smem: int) -> int:
    _, smem_sm = _sm_resources()
    warps = -(-threads // 32)
    regs_warp = -(-max(1, num_regs) * 32 // 256) * 256
    by_regs = (65536 // regs_warp) // warps
    by_smem = smem_sm // (smem + 1024)
    return max(1, min(by_regs, by_smem, 64 // warps, 32))


def persistent_grid(k, threads: int, smem: int, ntiles: int) -> int:
    """Grid of the persistent matvec kernels: at most the resident capacity, tiles spread evenly
    (the same count per block, so no block runs a lone extra tile at the end)."""
    sms, _ = _sm_resources()
    per_block = -(-ntiles // (sms * resident_blocks(k, threads, smem)))
    return -(-ntiles // per_block)


A8_SMALL_ROWS = 4096  # the matvec shape classes' row / input bound (shape_class)


# matvec.cu geometry at m = 1 (m > 1: MATVEC_ROWS_TUNING below), by (integer-dot contract,
# weight format, shape class); "*" is any other format.  Each entry measured on the Qwen3-8B
# shapes, us per launch and decode tok/s (docs/performance.md):
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
FEW_ROWS = 1024  # the "few" class's row bound (an MoE router's experts)


# The decode matvecs of m >= 2 rows (speculative verify, batched decode), by (integer-dot contract,
# weight format, "swiglu" for a gate|up build whose epilogue writes the down projection's QX codes,
# else "*"); rows must equal the one-row step bit for bit, which every build below keeps.
# - integer dot: matvec_i8.cu (int8 tensor cores, the SIMT kernel's reduction order): the m-row
#   SIMT kernel repeats its dp4a work and shared-memory x reads per row (docs/performance.md, "What
#   a speculative verify costs": 1.9x a one-row step at m = 2, 3.5-4.7x at m = 8).  Passes of 16
#   rows by blocks of 8 warps (split K by super-step residue), 3 super-steps in flight (Q6_K, Q3_K 2),
#   the registers of one block per SM: no spills at m = 2..8 (ptxas); the swiglu builds take
#   tiles of 4 passes (64 rows) so that a tile's 32 outputs are one QX block.
# - float path (BF16, F16, F32): the registers of 2 blocks per SM (MV_MINB 2: <= 128, no spills at
#   m = 2..8); the kernel's default (1) let ptxas take 133-142 registers at m = 2 and 6-8, one
#   block of 8 warps per SM: BF16's 2-row step (9.1 ms) ran slower than its 3-row step (7.1 ms,
#   118 registers, 2 blocks).
def _i8_rows(fmt: str, passes: int = 1) -> dict:
    return {"impl": "i8", "I8_KW": 8, "I8_ST": 1, "I8_PH": passes, "I8_U": 2 if fmt in ("Q6_K", "Q3_K") else 3, "MV_MINB": 1}


MATVEC_ROWS_TUNING: dict[tuple[bool, str, str], dict] = {
    **{(True, f, "*"): _i8_rows(f) for f in A8_FORMATS},
    **{(True, f, "swiglu"): _i8_rows(f, passes=4) for f in A8_FORMATS},
    **{(False, f, "*"): {"MV_MINB": 2} for f in FLOAT_FORMATS},
}


def _rows_entry(W: DeviceWeight, a8: bool, swiglu: bool = False) -> dict:
    """MATVEC_ROWS_TUNING's entry for W (m >= 2; {} where none)."""
    kind = "swiglu" if swiglu and (a8, W.fmt, "swiglu") in MATVEC_ROWS_TUNING else "*"
    return MATVEC_ROWS_TUNING.get((a8, W.fmt, kind), {})


def shape_class(out: int, in_: int) -> str:
    """A decode matrix's class in MATVEC_TUNING: "o" (at most A8_SMALL_ROWS rows and inputs: the
    attention output projection), "down" (few rows, wide inputs), "mid" (up to twice that many
    rows: qkv), "wide" (gate|up, LM head)."""
    if out <= A8_SMALL_ROWS:
        return "o" if in_ <= A8_SMALL_ROWS else "down"
    return "mid" if out <= 2 * A8_SMALL_ROWS else "wide"


def _simt_defines(W: DeviceWeight | None = None, m: int = 1, a8: bool = False, swiglu: bool = False) -> dict:
    """matvec.cu's compile-time geometry for W at m rows: MATVEC_TUNING's entry at one row,
    MATVEC_ROWS_TUNING's SIMT entry at more (a copy).  The "few" class (one row per warp) is a
    plain output's only: a swiglu epilogue pairs rows inside a warp."""
    if W is None:
        return {}
    if m != 1:
        e = _rows_entry(W, a8)
        return {} if e.get("impl") else dict(e)
    cls = shape_class(W.out, W.in_)
    if W.out <= FEW_ROWS and not swiglu and (a8, W.fmt, "few") in MATVEC_TUNING:
        cls = "few"
    key = (a8, W.fmt, cls) if (a8, W.fmt, cls) in MATVEC_TUNING else (a8, "*", cls)
    return dict(MATVEC_TUNING.get(key, {}))


def _warps_per_block(defs: dict, pro: int) -> int:
    """matvec.cu MV_NW from the picked defines (updated in place): 8, or 16 where picked and the
    prologue has no rmsnorm statistic (its summation order follows the block size) or MV_STAT8
    was picked with it (the statistic summed by 8 of the warps in the 8-warp order: the rows are
    the 8-warp kernel's bit for bit).  A block of 16 warps stands for two of 8: the blocks per
    SM the registers must allow halve."""
    nw = int(defs.get("MV_NW", 8))
    stat8 = bool(defs.pop("MV_STAT8", 0)) and pro == PROLOGUES["rmsnorm"]
    if nw == 8 or (pro == PROLOGUES["rmsnorm"] and not stat8):
        defs.pop("MV_NW", None)
        return 8
    if stat8:
        defs["MV_STAT8"] = 1
    defs["MV_MINB"] = max(1, int(defs.get("MV_MINB", 2)) // 2)
    return nw


def _simt_geometry(W: DeviceWeight, m: int, a8: bool, pro: int, swiglu: bool = False) -> tuple[dict, int, int]:
    """(defines, rows per warp, warps per block) of matvec.cu for this call; swiglu: the call's
    epilogue pairs rows (2i, 2i+1) inside a warp, so the rows per warp stay even."""
    defs = _simt_defines(W, m, a8, swiglu)
    rows = defs.pop("MV_R", MV_R)
    nw = _warps_per_block(defs, pro)
    if rows == 4 and not swiglu and m == 1:
        rows = _fill_rows(W.out, nw)
        if rows == 3 and W.fmt == "Q8_0":  # two load slots: Q8_0 qkv +0.4 % decode; NVFP4 / Q4_K lose 1 %
            defs["MV_U"] = 2
    if swiglu and rows % 2:
        raise ValueError(f"the swiglu epilogue pairs rows (2i, 2i+1) inside one warp: {rows} rows per warp")
    return defs, rows, nw


def _fill_rows(n_out: int, nw: int) -> int:
    """Rows per warp of a wide matvec picked at 4 (_simt_defines): 3 where tiles of 4 rows would
    leave multiprocessors without a tile and tiles of 3 do not need a second one — the Qwen3-8B
    qkv (6144 rows, one 16-warp block per SM): 96 tiles of 64 rows on 132 SMs, 128 of 48.  The
    rows' values do not depend on it (matvec.cu: each row is one warp's, its lanes' chunk order
    fixed).  Not under the swiglu epilogue (row pairs; its QX tiles are 64 rows)."""
    sms, _ = _sm_resources()
    if -(-n_out // (4 * nw)) < sms and -(-n_out // (3 * nw)) <= sms:
        return 3
    return 4


def writes_qx(W: DeviceWeight, m: int, prologue: str = "rmsnorm", impl: str | None = None) -> bool:
    """Whether matvec(W, ..., epilogue="swiglu", qx_out=...) can write the next matvec's x codes
    (matvec.cu qx_out): the integer-dot contract, and tiles of 64 rows (32 outputs = one block of
    32 inputs) over whole blocks, on the SIMT kernel or matvec_i8 (impl: as matvec's)."""
    if not 1 <= m <= 8 or W.fmt in FLOAT_FORMATS or not act_q8(W.fmt):
        return False
    if (W.out // 2) % 32 or W.out % 2:
        return False
    impl = impl or matvec_impl(W, True, m)
    if impl == "i8":
        d = i8_defines(W, m, swiglu=True)
        return i8_tile_rows(d) == 64 and m <= i8_rows_per_launch(W, d, qx_out=True)
    if impl != "simt":
        return False
    _, rows, nw = _simt_geometry(W, m, True, PROLOGUES[prologue], swiglu=True)
    return nw * rows == 64 and m <= a8_rows_per_launch(W, nw, True)


def takes_qx(W: DeviceWeight, m: int = 1) -> bool:
    """Whether W's matvec can read its x codes from a QX buffer (prologue "qx") for m rows: the
    integer-dot contract on the SIMT kernel or matvec_i8, inputs in whole 32-blocks, and the m rows
    staged by one launch (a8_rows_per_launch / i8_rows_per_launch: on a 99 KB GPU a 12288-input
    down projection stages 2)."""
    if W.fmt in FLOAT_FORMATS or not act_q8(W.fmt) or W.in_ % 32:
        return False
    impl = matvec_impl(W, True, m)
    if impl == "i8":
        return m <= i8_rows_per_launch(W, i8_defines(W, m))
    if impl != "simt":
        return False
    _, _, nw = _simt_geometry(W, m, True, PROLOGUES["qx"])
    return m <= a8_rows_per_launch(W, nw)


def a8_rows_per_launch(W: DeviceWeight, nw: int, qx_out: bool = False) -> int:
    """Rows of x one integer-dot matvec launch stages in shared memory (matvec.cu ACT_Q8: two int8
    code planes and a 16-byte record per 32 inputs per row, plus a float per warp; with qx_out
    two 128-byte tile buffers per row); more rows run in groups of this many (each row equals its
    m = 1 call), except with QX buffers, which one launch must take whole."""
    per_row = _a8_row_bytes(W, nw) + (256 if qx_out else 0)
    return max(1, (min(WGP_SMEM_MAX, kernel_build.smem_block_limit()) - 1024) // per_row)


def _a8_row_bytes(W: DeviceWeight, nw: int) -> int:
    """Shared bytes of one staged x row of the integer-dot matvec (matvec.cu ACT_Q8)."""
    return 2 * W.in_ + 32 * (W.in_ // 32) + 4 * nw


def i8_defines(W: DeviceWeight, m: int, swiglu: bool = False) -> dict:
    """matvec_i8.cu's geometry for W at m rows (MATVEC_ROWS_TUNING; swiglu: the gate|up build)."""
    d = dict(_rows_entry(W, True, swiglu))
    d.pop("impl", None)
    return d


def i8_tile_rows(defines: dict) -> int:
    """Rows per tile of matvec_i8 (I8_ROWS): passes of 16 * I8_ST rows, I8_PH of them."""
    return 16 * defines["I8_ST"] * defines.get("I8_PH", 1)


def _i8_row_bytes(W: DeviceWeight, defines: dict, qx_out: bool = False) -> int:
    """Shared bytes per token of matvec_i8: the staged x (as matvec.cu ACT_Q8), the warps' chains
    (one row's 32 lanes per warp) and, with qx_out, the tile's 32 outputs."""
    nw = defines["I8_KW"] * defines["I8_ST"]
    return 2 * W.in_ + 32 * (W.in_ // 32) + 128 * nw + (128 if qx_out else 0)


def i8_rows_per_launch(W: DeviceWeight, defines: dict, qx_out: bool = False) -> int:
    """Tokens one matvec_i8 launch stages (more run in groups, each equal to its one-row call)."""
    nw = defines["I8_KW"] * defines["I8_ST"]
    limit = min(WGP_SMEM_MAX, kernel_build.smem_block_limit()) - 1024 - 4 * nw
    return max(1, limit // _i8_row_bytes(W, defines, qx_out))


def _matvec_i8(W: DeviceWeight, x, out, m: int, prologue: str, epilogue: str, norm_w, eps: float, qx_in, qx_out,
               act_bf16: bool) -> None:
    """matvec() on matvec_i8.cu (the checks done): the m rows in one launch, or in groups where
    their staged x does not fit one block's shared memory (each group picks its own kernel)."""
    pro, epi = PROLOGUES[prologue], EPILOGUES[epilogue]
    ldx = 2 * W.in_ if pro == 2 else W.in_
    n_y = W.out // 2 if epi == 2 else W.out
    defs = i8_defines(W, m, swiglu=epi == EPILOGUES["swiglu"])
    m_fit = i8_rows_per_launch(W, defs, qx_out is not None)
    if m > m_fit:
        if qx_in is not None or qx_out is not None:
            raise ValueError("the QX buffers take at most the rows one launch stages")
        xf, of = x.reshape(-1), out.reshape(-1)
        for r0 in range(0, m, m_fit):
            mm = min(m_fit, m - r0)
            matvec(W, xf[r0 * ldx:(r0 + mm) * ldx], of[r0 * n_y:(r0 + mm) * n_y], mm, prologue, epilogue, norm_w, eps,
                   None, True, act_bf16=act_bf16)
        return
    if qx_out is not None and i8_tile_rows(defs) != 64:
        raise ValueError("matvec_i8 writes qx_out from 64-row tiles")
    nw = defs["I8_KW"] * defs["I8_ST"]
    smem = m * _i8_row_bytes(W, defs, qx_out is not None) + 4 * nw
    k = get_kernel("matvec_i8", "matvec_i8", FMT=W.fmt_id, MV_M=m, **defs)
    _ensure_smem(k, smem)
    grid = (persistent_grid(k, 32 * nw, smem, -(-W.out // i8_tile_rows(defs))),)
    k(grid, (32 * nw,), (*_wargs(W), x, out, _ptr(norm_w), np.int32(W.out), np.int32(W.in_), np.int32(ldx),
                         np.int32(pro | (PRO_BF16 if act_bf16 else 0)), np.int32(epi), np.float32(eps), _ptr(qx_in),
                         _ptr(qx_out)), shared_mem=smem)


def matvec(W: DeviceWeight, x, out, m: int, prologue: str = "none", epilogue: str = "store",
           norm_w=None, eps: float = 1e-6, impl: str | None = None, act_quant: bool | None = None,
           qx_in=None, qx_out=None, act_bf16: bool = False) -> None:
    """out[m, W.out] (=|+=) prologue(x)[m, W.in] @ W.T; epilogue "swiglu" (W's rows interleaved
    gate_i, up_i): out[m, W.out/2] = silu(y[:, 0::2]) * y[:, 1::2].

    x: float32 [m, W.in] (rmsnorm: the raw residual; swiglu: [m, 2*W.in] = gate|up);
    norm_w: float32 [W.in] for rmsnorm.  Row r of an m-row call equals bit for bit the 1-row
    call on that row.  act_quant: the integer-dot contract on/off (None: kernel_refs.act_q8).
    qx_out (uint32 [m, qx_row_words(W.out/2)], swiglu epilogue, where writes_qx): also write the
    outputs' integer-dot codes (kernel_refs.qx_ref); prologue "qx" reads x's codes from qx_in
    instead of quantizing x (rows bit-identical to prologue "none" on the floats qx_in came from).
    act_bf16: the bf16-activation contract, x rounded to bf16 after the prologue (qx_out's codes
    are of the rounded outputs; kernel_refs.bf16_round).  impl: "tc" | "simt" | "i8" (default
    matvec_impl: tests run the kernel production picks for another shape or row count)."""
    if not 1 <= m <= 8:
        raise ValueError(f"matvec handles 1..8 rows, got {m}")
    pro, epi = PROLOGUES[prologue], EPILOGUES[epilogue]
    pro_arg = np.int32(pro | (PRO_BF16 if act_bf16 else 0))
    if (pro == PROLOGUES["qx"]) != (qx_in is not None):
        raise ValueError('prologue "qx" and qx_in go together')
    a8 = act_q8(W.fmt) if act_quant is None else bool(act_quant)
    if a8 and W.fmt in FLOAT_FORMATS:
        raise ValueError("the integer-dot contract applies to the quantized formats")
    impl = impl or matvec_impl(W, a8, m)
    if qx_out is not None and not (epi == EPILOGUES["swiglu"] and writes_qx(W, m, prologue, impl)):
        raise ValueError("qx_out: the swiglu epilogue of a matvec whose tiles cover whole 32-input blocks (writes_qx)")
    ldx = 2 * W.in_ if pro == 2 else W.in_
    n_y = W.out // 2 if epi == 2 else W.out
    if epi == 2 and W.out % 2:
        raise ValueError("the swiglu epilogue needs interleaved gate/up rows (an even row count)")
    if x.dtype != np.float32 or out.dtype != np.float32 or x.size < m * ldx or out.size < m * n_y:
        raise ValueError("matvec: x and out must be float32 [m, in] / [m, out] ([m, out/2] for swiglu)")
    if pro == 1 and norm_w is None:
        raise ValueError("rmsnorm prologue needs norm_w")
    if (pro == PROLOGUES["qx"] or qx_out is not None) and not a8:
        raise ValueError("the QX buffers are the integer-dot contract's")
    if (impl == "tc" or a8) and (x.data.ptr % 16 or ldx % 4):  # both read x as float4
        raise ValueError("matvec_tc and the integer-dot matvecs read x as float4: 16-byte aligned rows")
    if impl == "i8":
        if not a8 or W.fmt not in A8_FORMATS:
            raise ValueError(f"matvec_i8 is the integer-dot contract's ({', '.join(A8_FORMATS)}), not {W.fmt} (a8={a8})")
        _matvec_i8(W, x, out, m, prologue, epilogue, norm_w, eps, qx_in, qx_out, act_bf16)
        return
    if impl == "tc":
        if a8 or W.fmt not in TC_FORMATS:
            raise ValueError(f"matvec_tc decodes {', '.join(TC_FORMATS)} on the float contract, not {W.fmt} (a8={a8})")
        nw, u = tc_geometry(W)
        unit = 4 * W.vpc * nw * u  # matvec_tc: whole rolling windows (super-steps of 4 chunks) per k-tile
        need = -(-W.in_ // unit) * unit
        tkx = min(need, max(unit, (TC_SMEM_X // (4 * m)) // unit * unit))
        smem = 4 * m * tkx + 4 * (nw * TC_ROWS * 8 + 2 * nw + 2 * m)
        k = get_kernel("matvec_tc", "matvec_tc", FMT=W.fmt_id, MV_M=m, TC_NW=nw, TC_U=u)
        _ensure_smem(k, smem)
        k((persistent_grid(k, 32 * nw, smem, -(-W.out // TC_ROWS)),), (32 * nw,), (*_wargs(W), x, out, _ptr(norm_w), np.int32(W.out), np.int32(W.in_), np.int32(ldx),
                                            np.int32(tkx), pro_arg, np.int32(epi), np.float32(eps)), shared_mem=smem)
        return
    defs, rows, nw = _simt_geometry(W, m, a8, pro, swiglu=epi == EPILOGUES["swiglu"])
    if a8:  # x resident as two int8 code planes + 16-byte records per 32 inputs (matvec.cu ACT_Q8)
        per_row = _a8_row_bytes(W, nw)
        m_fit = a8_rows_per_launch(W, nw, qx_out is not None)
        if m > m_fit:  # rows are independent (each equals its m = 1 call): run them in groups
            xf, of = x.reshape(-1), out.reshape(-1)
            for r0 in range(0, m, m_fit):
                mm = min(m_fit, m - r0)
                if qx_in is not None or qx_out is not None:
                    raise ValueError("the QX buffers take at most the rows one launch stages")
                matvec(W, xf[r0 * ldx:(r0 + mm) * ldx], of[r0 * n_y:(r0 + mm) * n_y], mm, prologue, epilogue, norm_w, eps, impl, True,
                       act_bf16=act_bf16)
            return
        tk = W.in_
        if qx_out is not None:
            defs["QX_HANDOFF"] = QX_HANDOFF
        smem = m * per_row + (2 * 128 * m if qx_out is not None else 0)  # + qx_out's two tile buffers
        k = get_kernel("matvec", "matvec", FMT=W.fmt_id, MV_M=m, MV_R=rows, ACT_Q8=1, **defs)
    else:
        tk = matvec_tile(W, m)
        smem = 4 * (m * tk + m * (tk // 32) + m * nw)
        k = get_kernel("matvec", "matvec", FMT=W.fmt_id, MV_M=m, MV_R=rows, **defs)
    _ensure_smem(k, smem)
    grid = (persistent_grid(k, 32 * nw, smem, -(-W.out // (nw * rows))),)
    k(grid, (32 * nw,), (*_wargs(W), x, out, _ptr(norm_w), np.int32(W.out), np.int32(W.in_), np.int32(ldx),
                         np.int32(tk), pro_arg, np.int32(epi), np.float32(eps), _ptr(qx_in), _ptr(qx_out)),
      shared_mem=smem)


def gemm(W: DeviceWeight, x, out, T: int, epilogue: str = "store", precise: bool = True, impl: str | None = None,
         act_quant: bool | None = None, act_bf16: bool = False) -> None:
    """out[T, W.out] (=|+=) x[T, W.in] @ W.T on tensor cores (f32 accumulation).  precise=True:
    x, and W where its values are not bf16 numbers, are split into bf16 hi + lo parts (error
    ~2^-16, matching the exact decode path); precise=False: x and W rounded to bf16 (fastest,
    benchmarks only: the decode path does not round W).  act_bf16 (with precise): the
    bf16-activation contract, x rounded to bf16 (one plane, so one wgmma fewer per product)
    and W split where not exact, as the decode matvec with act_bf16 computes it; Q8_0 on
    gemm_i8 quantizes the rounded x.  Row values do not depend on T (no split-K).  impl: "wg" |
    "mma" (default gemm_impl()); act_quant: the integer-dot contract (x quantized first) on/off
    (None: kernel_refs.act_q8) — under act_bf16 the GEMM takes bf16(x) itself, within the
    integer codes' 2^-16 of the block maximum of the decode's act_quant(bf16(x))."""
    if x.dtype != np.float32 or out.dtype != np.float32 or x.size < T * W.in_ or out.size < T * W.out:
        raise ValueError("gemm: x and out must be float32 [T, in] / [T, out]")
    if T <= 0:
        return
    impl = impl or gemm_impl()
    c = gemm_contract(W, precise, act_bf16, act_quant, impl)
    epi = np.int32(EPILOGUES[epilogue])
    if c.i8:
        _gemm_i8(W, x, out, T, epi, impl, c.xb16)
        return
    # gemm_wgp copies 8-value (16-byte) units of rows that must start 16-byte aligned: n_in a
    # multiple of 8 (every format but F32 guarantees it; F32 rows of 4k+4 values take the
    # portable kernel, which compiles for sm_90a too)
    if impl == "wg" and W.in_ % 8 == 0:
        alloc = -(-T // 256) * 256 * W.in_ if uses_gemm_wra(W) else 0  # gemm_wra reads x in whole tiles of up to 256 tokens
        if c.a8:
            xh, xl = _act_quant(x, T * W.in_, c.x_split, alloc)
        else:
            xh, xl = _bf16_planes(x, T * W.in_, c.x_split, alloc)
        _gemm_wgp(W, xh, xl, out, T, epi, c.x_split, c.w_split)
        return
    x, xl = mma_operands(c, x, T, W.in_)
    k, smem = _gemm_kernel(W.fmt_id, c.x_split, c.w_split, **({"GEMM_XPLANES": 1} if c.a8 else {}))
    k((-(-W.out // GM_TILE), -(-T // GM_TILE)), (256,),
      (*_wargs(W), x, out, np.int32(T), np.int32(W.out), np.int32(W.in_), epi, _ptr(xl)), shared_mem=smem)


class GemmContract(NamedTuple):
    """What a prefill GEMM of one matrix computes (gemm's precision switches resolved): i8, the
    integer-dot contract on gemm_i8 / gemm_i8_mma (QX rows); a8, x as the integer-dot planes
    (GEMM_XPLANES); xb16, x rounded to bf16 first; x_split / w_split, x / W as bf16 hi + lo."""
    i8: bool
    a8: bool
    xb16: bool
    x_split: bool
    w_split: bool


def gemm_contract(W, precise: bool = True, act_bf16: bool = False, act_quant: bool | None = None,
                  impl: str = "wg") -> GemmContract:
    """gemm's contract for W (anything with fmt / in_ / out: a DeviceWeight, cuda_moe.ExpertStore)
    on the kernels of impl.  precise: x as two bf16 planes (hi + lo split, or the integer-dot
    contract's two exact code levels), W split where its values are not bf16 numbers; fast: one
    plane (bf16(x), or the high code level only), W rounded to bf16.  The bf16-activation
    contract's GEMMs take the rounded x as their one plane (a8 off), but gemm_i8's."""
    a8 = act_q8(W.fmt) if act_quant is None else bool(act_quant)
    xb16 = precise and act_bf16
    i8 = a8 and precise and uses_gemm_i8(W, impl)
    return GemmContract(i8, a8 and not xb16 and not i8, xb16, precise and not xb16, precise and W.fmt not in _W_EXACT_IN_BF16)


def mma_operands(c: GemmContract, x, T: int, n_in: int, tag: str = "x", r0: int = 0):
    """x (f32 [T, n_in]) as the portable kernels read it under contract c: QX rows and None
    (gemm_i8_mma: act_quant_qx), the integer-dot planes hi, lo (GEMM_XPLANES: act_quant), or x
    itself and None (split or rounded in the tile load).  Rows [r0, T) only are prepared, into
    the scratch buffers ``tag``_* (rows before r0 keep what they held: the spilled MoE prefill
    prepares one expert's grouped rows at a time)."""
    if c.i8:
        return _qx_rows(x, T, n_in, c.xb16, tag, r0), None
    if c.a8:
        return _act_quant(x, T * n_in, c.x_split, tag=tag, start=r0 * n_in)
    return x, None


# gemm_i8.cu I8_STAGE_BYTES, same formula: x h and l tiles (2 x 128 x 128 B), the W tile (64 x 128 B),
# the records (128 tokens x 4 blocks x 16 B), the scales (64 rows x 4 f16), rounded up to 1 KB = 49 KB
I8_STAGE_BYTES = -(-(2 * WG_BM * 128 + 64 * 128 + WG_BM * 4 * 16 + 64 * 4 * 2) // 1024) * 1024
I8_STAGES = 4


def gemm_i8_smem() -> int:
    """gemm_i8.cu I8_SMEM_BYTES: the ring plus 1 KB of alignment slack, plus the f32 scales (1 KB)
    (tests/test_smem_contract.py compiles the kernel with a static_assert that the two agree)."""
    return I8_STAGES * I8_STAGE_BYTES + 1024 + 64 * 4 * 4


def uses_gemm_i8(W: DeviceWeight, impl: str = "wg") -> bool:
    """Whether the precise prefill of W runs on the integer-dot contract's own kernels: Q8_0's
    code bytes against x's two code levels, exact int32 block dots (gemm_i8.cu).  impl "wg":
    gemm_i8 on Hopper's int8 wgmma, rows whose width is a multiple of 128 that are not on
    gemm_wra (the wide ones, uses_gemm_wra); measured faster than the bf16 split
    (docs/performance.md).  impl "mma" (the portable path: sm_86 / sm_89 / sm_120): gemm_i8_mma,
    every Q8_0 matrix of a multiple of 64 inputs — the same rows as gemm_i8, where the bf16 split
    left them 1.6e-5 to 4.2e-5 from the decode's."""
    if W.fmt != "Q8_0":
        return False
    if impl == "mma":
        return W.in_ % IM_BK == 0
    return W.in_ % 128 == 0 and not uses_gemm_wra(W)


IM_BM = 128  # gemm_i8.cu gemm_i8_mma: tokens per block, out rows per block, k tile (two 32-blocks)
IM_BN = 64
IM_BK = 64
IM_STAGES = 3


def im_stage_bytes(bm: int = IM_BM) -> int:
    """gemm_i8_mma.cuh IM_STAGE_BYTES_FOR(bm, 8192 / bm): the x h and l code tiles (bm rows at an
    80-byte pitch), the W code tile (8192 / bm rows: 8 warps as bm / 32 x 256 / bm), the records
    (bm tokens x 2 blocks x 16 B), the scales (2 f16 per W row), rounded up to 1 KB."""
    bn = 8192 // bm
    return -(-(2 * bm * 80 + bn * 80 + bm * 2 * 16 + bn * 4) // 1024) * 1024


def gemm_i8_mma_smem(bm: int = IM_BM) -> int:
    """gemm_i8.cu IM_SMEM_BYTES / moe_group.cu GI_SMEM_BYTES (tests/test_smem_contract.py): 90 KB
    at 128 tokens, 69 KB at 64, inside the 99 KB GPUs' limit."""
    return IM_STAGES * im_stage_bytes(bm)


def _qx_rows(x, T: int, n: int, xb16: bool, tag: str = "x", r0: int = 0):
    """x (f32 [T, n]; rounded to bf16 first with xb16) quantized into QX rows (gemm_act.cu
    act_quant_qx) in the scratch ``tag``_qx: rows [r0, T) (mma_operands)."""
    words = qx_row_words(n)
    qx = _scratch_u16(f"{tag}_qx", 2 * T * words)  # uint32 words as pairs of uint16
    n4 = (T - r0) * n // 4
    if n4 > 0:
        q = get_kernel("gemm_act", "act_quant_qx")
        xs, qs = (x, qx) if r0 == 0 else (x.reshape(-1)[r0 * n:], qx[2 * r0 * words:])
        q((max(1, min(-(-n4 // 256), _sm_resources()[0] * 8)),), (256,), (xs, qs, np.int32(n), np.int64(n4), np.int32(xb16)))
    return qx


def _gemm_i8(W: DeviceWeight, x, out, T: int, epi, impl: str = "wg", xb16: bool = False) -> None:
    """x (f32 [T, W.in]; rounded to bf16 first with xb16) quantized once into QX rows
    (gemm_act.cu act_quant_qx), then gemm_i8 (impl "wg") or gemm_i8_mma (the portable path):
    the same rows."""
    n = W.in_
    qx = _qx_rows(x, T, n, xb16)
    args = (W.q, W.s, qx, out, np.int32(T), np.int32(W.out), np.int32(n), np.int32(W.out), epi)
    if impl == "mma":
        k, smem, grid = get_kernel("gemm_i8", "gemm_i8_mma", FMT=W.fmt_id), gemm_i8_mma_smem(), (-(-T // IM_BM), -(-W.out // IM_BN))
    else:
        k, smem, grid = get_kernel("gemm_i8", "gemm_i8", FMT=W.fmt_id), gemm_i8_smem(), (-(-T // WG_BM), -(-W.out // 64))
    _ensure_smem(k, smem)
    k(grid, (256,), args, shared_mem=smem)


WGP_SMEM_MAX = 227 * 1024  # opt-in shared memory per block (sm_90)
WGP_DEQ_VALUES = 64 * 1024 * 1024  # row block dequantized per gemm_wgp launch (128 MB of bf16 per plane):
# smaller blocks split a 4096 x 12288 down projection into 80- and 48-block launches (SMs idle)
WGP_SCRATCH_BYTES = 2 * 2 * WGP_DEQ_VALUES  # the dequantized weight planes (hi, lo) at their largest
_scratch: dict = {}


def _scratch_u16(name: str, n: int):
    """A grow-only device scratch of n uint16 per (name, device).  Prefill is not graph-captured
    and each user runs on its stream right after filling the buffer; when another stream (another
    runner) takes it over, the previous owner's work is waited for first, so two streams never
    share it in flight."""
    import cupy as cp

    key = (name, cp.cuda.Device().id)
    cur = cp.cuda.get_current_stream()
    buf, owner = _scratch.get(key, (None, None))
    if owner is not None and owner.ptr != cur.ptr:
        owner.synchronize()
    if buf is None or buf.size < n:
        buf = cp.empty(n, cp.uint16)
    _scratch[key] = (buf, cur)
    return buf


def _x_planes(kernel: str, x, n: int, with_lo: bool, alloc: int, tag: str = "x", start: int = 0):
    """x[start:n] (f32) as bf16 planes hi (and lo with with_lo) by gemm_act.cu `kernel`, into the
    scratch ``tag``_hi / _lo at the same places; the planes stay readable up to alloc values
    (gemm_wra reads whole token tiles; what lies past n is never used)."""
    hi = _scratch_u16(f"{tag}_hi", max(n, alloc))
    lo = _scratch_u16(f"{tag}_lo", max(n, alloc)) if with_lo else None
    n4 = (n - start) // 4
    if n4 > 0:
        k = get_kernel("gemm_act", kernel)
        xs, hs, ls = (x, hi, lo) if start == 0 else (x.reshape(-1)[start:], hi[start:], None if lo is None else lo[start:])
        k((max(1, min(-(-n4 // 256), _sm_resources()[0] * 8)),), (256,), (xs, hs, _ptr(ls), np.int64(n4)))
    return hi, lo


def _act_quant(x, n: int, with_lo: bool = True, alloc: int = 0, tag: str = "x", start: int = 0):
    """x[start:n] (f32, rows of a multiple of 32 inputs; start on a row) quantized by the
    integer-dot contract (gemm_act.cu act_quant) into bf16 planes: (hi = 2^e h, lo = 2^(e-8) l),
    lo None without with_lo (the fast mode's one-level x)."""
    if n % 32 or start % 32:
        raise ValueError("the integer-dot contract quantizes whole blocks of 32 inputs")
    return _x_planes("act_quant", x, n, with_lo, alloc, tag, start)


def _bf16_planes(x, n: int, with_lo: bool, alloc: int = 0):
    """x[:n] (f32) as bf16 planes hi = bf16(x), lo = bf16(x - hi) (gemm_act.cu split_bf16)."""
    return _x_planes("split_bf16", x, n, with_lo, alloc)


WGP_WIDE_ROWS = 6144  # gemm_wgp: 256-row tiles from this many rows (qkv, gate|up), 128 below


def wgp_geometry(n_out: int, precise: bool, w_lo: bool) -> tuple[int, int, int]:
    """(rows per block, ring stages, bytes per stage) of gemm_wgp: 256-row tiles on the wide
    matrices, 128 on the 4096-row ones (256-row tiles leave SMs idle there); a ring as deep as
    fits in one block's shared memory, at most 4 (measured, docs/performance.md); a tile width
    whose 3-stage ring does not fit falls back to 128 rows."""
    bn = 256 if n_out >= WGP_WIDE_ROWS else 128
    while True:
        stage = wg_stage_bytes(precise, w_lo, bn)
        fit = (WGP_SMEM_MAX - 1024) // stage
        if fit >= 3 or bn == 128:
            break
        bn = 128
    return bn, max(3, min(4, fit)), stage


def wgp_smem(stages: int, stage: int) -> int:
    """gemm_wgmma.cu WGP_SMEM_BYTES / WRA_SMEM_BYTES: the ring plus 1 KB of alignment slack."""
    return stages * stage + 1024


WRA_ROWS = 128  # gemm_wgmma.cu gemm_wra: weight rows per block (2 warpgroups x 64)
WRA_RECORD_BYTES = {"NVFP4": 4, "Q4_K": 16, "Q8_0": 4}  # gemm_wra's formats, their per-row record per k tile (WRA_REC)
WRA_PITCH = {"NVFP4": 48, "Q4_K": 48, "Q8_0": 80}  # WRA_PITCH: a row's codes of a k tile in the stage, padded
WRA_FORMATS = tuple(WRA_RECORD_BYTES)


def wra_stage_bytes(precise: bool, bt: int, fmt: str = "NVFP4") -> int:
    """gemm_wgmma.cu WRA_STAGE_BYTES: the x_hi (| x_lo) tiles of bt tokens x 64 bf16, then the k
    tile's codes (WRA_ROWS rows at WRA_PITCH) and per-row records, rounded up to 1 KB."""
    return (2 if precise else 1) * bt * 64 * 2 + -(-(WRA_ROWS * (WRA_PITCH[fmt] + WRA_RECORD_BYTES[fmt])) // 1024) * 1024


def wra_geometry(n_out: int, precise: bool, fmt: str = "NVFP4", w_split: bool = False) -> tuple[int, int, int]:
    """(tokens per block, ring stages, bytes per stage) of gemm_wra: 256 tokens on the wide
    matrices when x or W is split (128 when both are one plane, and on the 4096-row matrices,
    where 256 leaves half the SMs idle), a ring of up to 4 stages as fits (measured,
    docs/performance.md)."""
    bt = 256 if (precise or w_split) and n_out >= WGP_WIDE_ROWS else 128
    stage = wra_stage_bytes(precise, bt, fmt)
    return bt, max(3, min(4, (WGP_SMEM_MAX - 1024) // stage)), stage


def uses_gemm_wra(W: DeviceWeight) -> bool:
    """Prefill on gemm_wra (the codes decoded into wgmma's register operand, no dequantization
    pass) for the wide matrices (>= WGP_WIDE_ROWS rows: qkv, gate|up) of NVFP4, Q4_K and Q8_0,
    rows of a multiple of 64 inputs (whole k tiles).  The 4096-row ones stay on the pass, which
    measured faster there (too little tensor work per k tile to hide the decoding;
    docs/performance.md)."""
    return W.fmt in WRA_FORMATS and W.in_ % 64 == 0 and W.out >= WGP_WIDE_ROWS


def _gemm_wra(W: DeviceWeight, xh, xl, out, T: int, epi, x_split: bool, w_split: bool) -> None:
    bt, stages, stage = wra_geometry(W.out, x_split, W.fmt, w_split)
    k = get_kernel("gemm_wgmma", "gemm_wra", FMT=W.fmt_id, GEMM_SPLIT=int(x_split), WRA_BT=bt, WRA_STAGES=stages,
                   **_wsplit_define(W, x_split, w_split))
    smem = wgp_smem(stages, stage)
    _ensure_smem(k, smem)
    k((-(-T // bt), -(-W.out // WRA_ROWS)), (256,),
      (W.q, W.s, _ptr(W.gscale), xh, _ptr(xl), out, np.int32(T), np.int32(W.out), np.int32(W.in_), np.int32(W.out), epi),
      shared_mem=smem)


def _gemm_wgp(W: DeviceWeight, xh, xl, out, T: int, epi, x_split: bool, w_lo: bool) -> None:
    """gemm_wgp on x as bf16 planes (xh, and xl when x_split).  BF16 weights are read in place;
    the wide NVFP4 / Q4_K / Q8_0 matrices go to gemm_wra (uses_gemm_wra); other weights are
    dequantized to bf16 (and W_lo when w_lo) one row block at a time into scratch (llama.cpp's
    dequantize-then-GEMM prefill), each block's GEMM writing its columns of out (row blocks do not
    change any output's k order)."""
    if uses_gemm_wra(W):
        _gemm_wra(W, xh, xl, out, T, epi, x_split, w_lo)
        return
    bn, stages, stage = wgp_geometry(W.out, x_split, w_lo)
    k = get_kernel("gemm_wgmma", "gemm_wgp", GEMM_SPLIT=int(x_split), WG_BN=bn, WGP_STAGES=stages, WGP_WLO=int(w_lo))
    smem = wgp_smem(stages, stage)
    _ensure_smem(k, smem)

    def launch(wq, wl, r0: int, n: int) -> None:
        gs = _NULL if W.gscale is None else np.uint64(W.gscale.data.ptr + 4 * r0)
        k((-(-T // WG_BM), -(-n // bn)), (256,),
          (wq, _ptr(wl), gs, xh, _ptr(xl), np.uint64(out.data.ptr + 4 * r0), np.int32(T), np.int32(n),
           np.int32(W.in_), np.int32(W.out), epi), shared_mem=smem)

    if W.fmt == "BF16":
        launch(W.q, None, 0, W.out)
        return
    rows = dequant_block_rows(W)
    whi = _scratch_u16("w_hi", rows * W.in_)
    wlo = _scratch_u16("w_lo", rows * W.in_) if w_lo else None
    for r0 in range(0, W.out, rows):
        n = min(rows, W.out - r0)
        dequant_block(W, r0, n, whi, wlo)
        launch(whi, wlo, r0, n)


def dequant_block_rows(W: DeviceWeight) -> int:
    """Rows of W per dequantized row block of the prefill GEMM (WGP_DEQ_VALUES values, whole
    256-row tiles, at most W.out)."""
    return min(W.out, max(256, WGP_DEQ_VALUES // W.in_ // 256 * 256))


def dequant_block(W: DeviceWeight, r0: int, n: int, whi, wlo) -> None:
    """W's rows [r0, r0 + n) as bf16 planes whi (and wlo, W - hi, when not None) [n, W.in]:
    dequant.cu dequant_bf16 on the current stream."""
    deq = get_kernel("dequant", "dequant_bf16", FMT=W.fmt_id, DEQ_LO=int(wlo is not None))
    deq((max(1, min(-(-(n * W.nck) // 256), _sm_resources()[0] * 16)),), (256,),
        (W.q, _ptr(W.h), _ptr(W.s), _ptr(W.d), np.int64(r0), np.int32(n), np.int32(W.in_), whi, _ptr(wlo)))


def _dequant_rows(W: DeviceWeight, ids, n_rows: int, out) -> None:
    if out.dtype != np.float32 or out.size < n_rows * W.in_:
        raise ValueError("out must be float32 [rows, in]")
    if n_rows <= 0:
        return
    total = n_rows * W.nck
    grid = (max(1, min(-(-total // 256), _sm_resources()[0] * 16)),)
    k = get_kernel("dequant", "dequant_rows", FMT=W.fmt_id)
    k(grid, (256,), (*_wargs(W), _ptr(ids), np.int32(n_rows), np.int32(W.in_), out))


def embed(W: DeviceWeight, ids_dev, out) -> None:
    """out[T, W.in] = rows ids[t] of the table, float32, bit-exact with quants.dequantize
    (NVFP4: times the global scale, as QTensor.dequantize).  ids_dev: int32 device array [T]."""
    if ids_dev.dtype != np.int32:
        raise ValueError("embed: ids must be int32")
    _dequant_rows(W, ids_dev, int(ids_dev.size), out)


def dequantize(W: DeviceWeight, out) -> None:
    """out[W.out, W.in] = the whole matrix as float32, bit-exact with QTensor.dequantize."""
    _dequant_rows(W, None, W.out, out)
