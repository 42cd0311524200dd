"""Launch wrappers for the linear-algebra kernels on repacked weights (DeviceWeight):
``matvec`` (decode, m = 1..8 rows, 1..16 on matvec_mma, fused rmsnorm/swiglu prologue and
store/add epilogue),
``gemm`` (prefill on tensor cores), ``embed`` (row gather) and ``dequantize`` (whole tensor).

All take preallocated CuPy outputs, launch on the current stream and neither allocate nor
synchronize, so the decode step can be captured in a CUDA graph.  Absent optional pointers are
passed as a null 64-bit value.  Contracts: kernels/matvec.cu, matvec_tc.cu, gemm_*.cu, dequant.cu.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import kernel_build, tuning
from .cuda_weights import DeviceWeight
from .kernel_build import get_kernel
from .kernel_refs import FLOAT_FORMATS, act_q8, qx_row_words  # noqa: F401 (qx_row_words: the runner's QX buffers)
from .tuning import A8_SMALL_ROWS, FEW_ROWS, GEMM_TUNING, MATVEC_MMA_TUNING, MATVEC_ROWS_TUNING, MATVEC_TUNING

MV_R = 2  # rows per warp in matvec.cu (MV_R); 8 warps per block
MV_MAX_ROWS = 8  # tokens one matvec.cu / matvec_tc.cu launch takes (MV_M)
MMA_MAX_ROWS = 16  # tokens one matvec_mma.cu launch takes (MV_M: four n-tiles of 4)
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
    """The portable gemm's tile buffers (gemm_mma.cuh GM_BUFS): the first of GEMM_TUNING's that
    the block's shared memory holds, 2 (k tile i+1 stored while tile i is used) or 1 (one more
    barrier per k tile; the same order of MMAs per output, so the same bits).  With x split the
    kernels need 108 KB (W exact) and 144 KB (W split too) with two buffers at 128 tokens: above
    the 99 KB of sm_86 / sm_89 / sm_120, whose prefill this kernel is."""
    bufs, limit = GEMM_TUNING[("mma", "*", "*")]["bufs"], kernel_build.smem_block_limit()
    return next((b for b in bufs if _gemm_smem(x_split, w_split, b, bm) <= limit), bufs[-1])


def _mma_defines(fmt_id: int, x_split: bool, bufs: int, **defines) -> dict:
    """The defines of a kernel on gemm_mma.cuh's block for this x split and tile buffers (the
    kernels split W by its format, as gemm_contract: gemm_common.cuh W_SPLIT)."""
    return dict(FMT=fmt_id, GEMM_SPLIT=int(x_split), **({"GM_BUFS": 1} if bufs == 1 else {}), **defines)


def _gemm_kernel(fmt_id: int, x_split: bool, w_split: bool, family: str = "gemm_mma", name: str = "gemm",
                 bm: int = GM_TILE, **defines):
    """A kernel on gemm_mma.cuh's block (the portable gemm, or moe_group.cu's grouped one with
    tiles of bm tokens) for these splits, and its dynamic shared memory (set as its limit)."""
    bufs = gemm_bufs(x_split, w_split, bm)
    k = get_kernel(family, name, **_mma_defines(fmt_id, x_split, bufs, **defines))
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


def wg_stage_bytes(x_split: bool, w_lo: bool, bn: int) -> int:
    """Shared bytes of one stage of gemm_wgp: [x hi (| x lo)] tiles of WG_BM rows and [W (| W
    lo)] tiles of bn rows, 64 bf16 per row.  The kernel adds 1 KB to align its stages to 1024
    bytes (the 128-byte swizzle)."""
    return ((2 if x_split else 1) * WG_BM + (2 if w_lo else 1) * bn) * 64 * 2


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
    """"tc" (matvec_tc.cu), "simt" (matvec.cu) or "mma" (matvec_mma.cu), by measurement
    (docs/performance.md, Qwen3-8B shapes): NVFP4 on the float contract always tc (~2 instructions
    per weight against ~6 in SIMT); F16 tc up to 4096 rows (their SIMT grids are one partial wave),
    SIMT above; BF16 SIMT at every row count (16-warp SIMT blocks beat tc on every BF16 shape).  The
    integer-dot contract: SIMT at one row (1.2-1.6x faster than matvec_mma there), matvec_mma for
    m = 2..8 where takes_mma (its m-row steps 1.03-1.69x faster at every point measured: the SIMT
    kernel's m-row dots are bound by issue and registers, the MMA's by the weight stream), and
    at m = 9..16, which only it takes.  The two give the same bits (matvec_mma.cu: contract), so a
    row's value does not depend on m.  a8: the integer-dot contract (None: act_q8)."""
    if W.fmt not in FLOAT_FORMATS and (act_q8(W.fmt) if a8 is None else a8):
        return "mma" if m >= 2 and takes_mma(W) and _planes_aligned(W) else "simt"
    if W.fmt not in TC_FORMATS or (act_q8(W.fmt) if a8 is None else a8):
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




def shape_class(out: int, in_: int) -> str:
    """A decode matrix's class in MATVEC_TUNING: "o" (at most A8_SMALL_ROWS rows and inputs: the
    attention output projection), "down" (few rows, wide inputs), "mid" (up to twice that many
    rows: qkv), "wide" (gate|up, LM head)."""
    if out <= A8_SMALL_ROWS:
        return "o" if in_ <= A8_SMALL_ROWS else "down"
    return "mid" if out <= 2 * A8_SMALL_ROWS else "wide"


def rows_tuning_key(fmt: str, a8: bool, swiglu: bool) -> tuple[bool, str, str]:
    """MATVEC_ROWS_TUNING's key of an m-row matvec.cu call: its swiglu entry under that epilogue
    where the format has one, else its "*" entry."""
    return (a8, fmt, "swiglu") if swiglu and (a8, fmt, "swiglu") in MATVEC_ROWS_TUNING else (a8, fmt, "*")


def _simt_defines(W: DeviceWeight | None = None, m: int = 1, a8: bool = False, swiglu: bool = False) -> dict:
    """matvec.cu's compile-time geometry for W at m rows: MATVEC_TUNING's entry at one row,
    MATVEC_ROWS_TUNING's at more (a copy; rows_tuning_key).  The "few" class (one row per warp)
    is a plain output's only: a swiglu epilogue pairs rows inside a warp."""
    if W is None:
        return {}
    if m != 1:
        return dict(MATVEC_ROWS_TUNING.get(rows_tuning_key(W.fmt, a8, swiglu), {}))
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
    if m > 1 and -(-W.in_ // 4) <= 32 * nw:  # a row of x is at most a float4 a thread: the rows' loads at once
        defs["MV_X1"] = 1
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
    """Whether matvec(W, ..., epilogue="swiglu", qx_out=..., impl=impl) can write the next matvec's
    x codes (matvec.cu / matvec_mma.cu qx_out): the integer-dot contract, and tiles of 64 rows (32
    outputs = one block of 32 inputs) over whole blocks (impl None: matvec_impl's pick)."""
    if not 1 <= m <= MMA_MAX_ROWS or W.fmt in FLOAT_FORMATS or not act_q8(W.fmt):
        return False
    impl = impl or matvec_impl(W, True, m)
    if impl == "mma":
        return mma_writes_qx(W, m, prologue)
    if m > MV_MAX_ROWS or (W.out // 2) % 32 or W.out % 2 or impl != "simt":
        return False
    _, rows, nw = _simt_geometry(W, m, True, PROLOGUES[prologue], swiglu=True)
    return nw * rows == 64 and m <= a8_rows_per_launch(W, nw, True)


def takes_qx(W: DeviceWeight, m: int = 1, impl: str | None = None) -> bool:
    """Whether W's matvec (impl None: matvec_impl's pick) can read its x codes from a QX buffer
    (prologue "qx") for m rows: the integer-dot contract, inputs in whole 32-blocks, and the m rows
    staged by one launch (the SIMT kernel's a8_rows_per_launch: on a 99 KB GPU a 12288-input down
    projection stages 2) or by launches over K ranges (matvec_mma: mma_plan's m_fit is m)."""
    if W.fmt in FLOAT_FORMATS or not act_q8(W.fmt) or W.in_ % 32:
        return False
    impl = impl or matvec_impl(W, True, m)
    if impl == "mma":
        return 1 <= m <= MMA_MAX_ROWS and mma_plan(W, m, "qx").m_fit >= m
    if impl != "simt" or not 1 <= m <= MV_MAX_ROWS:
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


MMA_FORMATS = ("Q8_0", "NVFP4", "Q4_K")  # the weights matvec_mma.cu decodes (integer-dot contract)
MMA_QX_ROWS = 64  # matvec_mma.cu MQ_QX_ROWS: a qx_out tile (32 outputs: one 32-input block of the next x)
MMA_KT = 32  # matvec_mma.cu MQ_KT: chunks per k-tile (one step of every chain)
MMA_SPLIT_PROLOGUES = ("none", "qx")  # the prologues whose staging is per 32-input block: the K ranges'


class MmaPlan(NamedTuple):
    """One matvec_mma call's geometry (mma_plan): its defines, threads per block, rows per pass
    (16 x sub-tiles), dynamic shared bytes, the x rows one launch stages (more run in groups), and
    the K ranges: the k-tile bounds (0, ..., all k-tiles) of its ranges, one launch each (one range:
    (0, nkt), no split)."""
    defines: dict
    threads: int
    rows: int
    smem: int
    m_fit: int
    kt_bounds: tuple

    @property
    def ranges(self) -> int:
        return len(self.kt_bounds) - 1


MMA_S4_FORMATS = ("Q8_0", "NVFP4")  # matvec_mma.cu MQ_S4: rows of 64k inputs (4-byte scale pieces)


def takes_mma(W: DeviceWeight) -> bool:
    """Whether matvec_mma.cu can run W: its formats under the integer-dot contract, rows of a
    multiple of 256 inputs (every scale plane's row 16-byte aligned: its ring copies whole 16-byte
    pieces), or for Q8_0 and NVFP4 of 64 (MQ_S4: the scale rows copied in 4-byte pieces)."""
    if W.fmt not in MMA_FORMATS or not act_q8(W.fmt):
        return False
    return W.in_ % 256 == 0 or (W.fmt in MMA_S4_FORMATS and W.in_ % 64 == 0)


_MMA_RULE = (f"{', '.join(MMA_FORMATS)} under the integer-dot contract, rows of a multiple of 256 inputs "
             f"(of 64: {', '.join(MMA_S4_FORMATS)})")  # takes_mma's rule, as its errors state it


def _planes_aligned(W: DeviceWeight) -> bool:
    """W's q and s planes start on 16 bytes (matvec_mma's ring copies 16-byte pieces); planes not
    on the device (planning without a GPU) count as aligned."""
    return not any(getattr(getattr(p, "data", None), "ptr", 0) % 16 for p in (getattr(W, "q", None), getattr(W, "s", None)))


def mma_smem(W: DeviceWeight, m: int, defines: dict, inputs: int | None = None) -> int:
    """matvec_mma.cu's dynamic shared bytes (its header's layout): the ring (MQ_STAGES k-tiles of
    16 MV_NW / MQ_KW rows: q at a 528-byte pitch, 2 VPC + 16 scale bytes), x's code planes (2 m
    planes of inputs + 16 bytes; inputs: those of the widest K range, default the row's), x's
    scales (a float2 per 32-input block and token), the pass partials (2 parities x 2 MQ_KW
    residues x rows x m floats), the statistic (MV_NW floats) and qx_out's tile buffers (2 x m x
    32 floats)."""
    nw, kw = defines["MV_NW"], defines["MQ_KW"]
    rows = 16 * (nw // kw)
    n = W.in_ if inputs is None else inputs
    ring = defines["MQ_STAGES"] * rows * (32 * 16 + 16 + 2 * W.vpc + 16)
    return ring + 2 * m * (n + 16) + (n // 32) * m * 8 + 2 * 2 * kw * rows * m * 4 + nw * 4 + 2 * m * 32 * 4


def mma_class(m: int) -> str:
    """MATVEC_MMA_TUNING's rows class of an m-row matvec_mma launch: its n-tiles of 4 tokens."""
    if not 1 <= m <= MMA_MAX_ROWS:
        raise ValueError(f"matvec_mma takes 1..{MMA_MAX_ROWS} rows a launch, got {m}")
    return "one_tile" if m <= 4 else "two_tiles" if m <= 8 else "four_tiles"


def mma_k_tiles(W: DeviceWeight) -> int:
    """matvec_mma's k-tiles per row: 32 chunks each, the last possibly partial."""
    return -(-(W.in_ // W.vpc) // MMA_KT)


def mma_ranges(nkt: int, r: int) -> tuple[int, ...]:
    """The k-tile bounds of r contiguous K ranges over nkt k-tiles, as even as possible (their
    sizes differ by at most one k-tile)."""
    return tuple(i * nkt // r for i in range(r + 1))


def _range_inputs(W: DeviceWeight, bounds: tuple) -> int:
    """The inputs of the widest K range of these bounds (the last k-tile may be partial)."""
    nck = W.in_ // W.vpc
    return max((min(b * MMA_KT, nck) - a * MMA_KT) * W.vpc for a, b in zip(bounds, bounds[1:]))


def mma_plan(W: DeviceWeight, m: int, prologue: str = "none", ranges: int | None = None) -> MmaPlan:
    """matvec_mma's geometry for W at m rows: MATVEC_MMA_TUNING's entry (format, else "*"; the
    rows class of the launch's rows, mma_class); its ring as deep as the entry allows and the
    shared memory holds with the entry's blocks per SM resident, else with one, at least 2 stages.
    Where even that does not hold m rows of x (a 12288-input down projection at m > 6 on a 227 KB
    GPU, a 4096-input one at m > 4 on a 99 KB GPU): under prologue none or qx
    (MMA_SPLIT_PROLOGUES: the down and o projections) launches over K ranges, the fewest
    (mma_ranges) whose x fits (the same bits: matvec_mma.cu's contract); under rmsnorm or swiglu,
    whose prologue reads all of x (the statistic; the up half), the plan of the most rows that fit
    in their own class's geometry (m_fit: so that each full group's launch is mma_plan(W, m_fit)),
    and the rows run per launch of that many (each row equals its m = 1 call whatever the
    grouping).  ranges: that many K ranges instead (tests, tools/matvec_mma_timing.py; none / qx
    only)."""
    limit = min(WGP_SMEM_MAX, kernel_build.smem_block_limit())
    _, smem_sm = _sm_resources()
    nkt = mma_k_tiles(W)
    split = prologue in MMA_SPLIT_PROLOGUES

    def fit(mm: int, r: int) -> MmaPlan | None:
        cls = mma_class(mm)
        defs = dict(MATVEC_MMA_TUNING.get((W.fmt, cls), MATVEC_MMA_TUNING[("*", cls)]))
        nw, deepest = defs["MV_NW"], defs["MQ_STAGES"]
        if nw == 16:
            defs["MV_STAT8"] = 1  # the 8-warp rmsnorm statistic (the SIMT kernel's order)
        bounds = mma_ranges(nkt, r)
        inputs = _range_inputs(W, bounds)
        if r > 1:
            defs["MQ_SPLIT"] = 1  # the K-range code, compiled out of the one-range launches
        if W.in_ % 256:
            defs["MQ_S4"] = 1  # scale rows not 16-byte aligned: 4-byte pieces
        for budget in (min(limit, smem_sm // defs.get("MV_MINB", 1) - 1024), limit):
            fixed = mma_smem(W, mm, {**defs, "MQ_STAGES": 0}, inputs)
            stage = mma_smem(W, mm, {**defs, "MQ_STAGES": 1}, inputs) - fixed
            stages = min(deepest, (budget - fixed) // stage)
            if stages >= 2:
                return MmaPlan({**defs, "MQ_STAGES": stages}, 32 * nw, 16 * (nw // defs["MQ_KW"]), fixed + stages * stage,
                               mm, bounds)
        return None

    if ranges is not None:
        if not (1 <= ranges <= nkt) or (ranges > 1 and not split):
            raise ValueError(f"matvec_mma: {ranges} K ranges of {nkt} k-tiles under prologue {prologue!r}")
        tries = [(m, ranges)]
    else:
        tries = [(m, r) for r in range(1, nkt + 1)] if split else [(mm, 1) for mm in range(m, 0, -1)]
    for mm, r in tries:
        plan = fit(mm, r)
        if plan is not None:
            return plan
    raise ValueError(f"matvec_mma: {W.in_} inputs of {m} rows do not fit the shared memory in {tries[-1][1]} K ranges")


def mma_part_floats(W: DeviceWeight, m: int, plan: MmaPlan) -> int:
    """Floats of matvec_mma's chain scratch (part) for K ranges of W at m rows: per pass of
    plan.rows rows, every thread's MQ_NV = MQ_NP * 2 * 2 * MQ_NT chains (MQ_NP = 16 / MQ_KW chunk
    pairs, 2 chunks, rows g and g + 8, MQ_NT = ceil(m / 4) n-tiles: 1, 2 or, in the four-tile
    class, up to 4), over the passes of whole 64-row qx_out tiles (the last launch's tiles may pass
    the others' last pass; such a pass's chains are read and never stored)."""
    tile = max(plan.rows, MMA_QX_ROWS)
    passes = -(-W.out // tile) * tile // plan.rows
    return passes * plan.threads * (16 // plan.defines["MQ_KW"]) * 4 * -(-m // 4)


_parts: dict = {}


def _mma_part(n: int):
    """The chain scratch of n floats for K ranges (mma_part_floats), one per (device, stream,
    size): the launches of one stream run in order (each reads it after its pdl_wait), those of
    two streams never share it.  Allocated on first use: when a decode plan is traced (before any
    graph is captured), or by an eager call (tools time a graph after one)."""
    if kernel_build.planning_active():
        return kernel_build.device_empty("mma_part", (n,), np.float32)
    import cupy as cp

    key = (cp.cuda.Device().id, cp.cuda.get_current_stream().ptr, n)
    if key not in _parts:
        _parts[key] = cp.empty(n, cp.float32)
    return _parts[key]


def mma_writes_qx(W: DeviceWeight, m: int, prologue: str = "rmsnorm") -> bool:
    """Whether matvec(W, ..., impl="mma", prologue=prologue, epilogue="swiglu", qx_out=...) can write
    the next matvec's x codes: takes_mma, 32 outputs per 64-row tile over whole 32-input blocks,
    and the m rows in one launch (or over K ranges: the last range's launch writes them)."""
    return (takes_mma(W) and W.out % 2 == 0 and (W.out // 2) % 32 == 0 and 1 <= m <= MMA_MAX_ROWS
            and mma_plan(W, m, prologue).m_fit >= m)


def _matvec_mma(W: DeviceWeight, x, out, m: int, prologue: str, pro_arg, epi: int, ldx: int, n_y: int, norm_w,
                eps: float, qx_in, qx_out, ranges: int | None = None) -> None:
    """matvec_mma.cu on W (takes_mma) for m rows: one launch per K range of mma_plan's (the chains
    carried between them in a scratch: _mma_part), or in groups of its m_fit rows."""
    plan = mma_plan(W, m, prologue, ranges)
    if plan.m_fit < m:
        if qx_in is not None or qx_out is not None:
            raise ValueError("the QX buffers take at most the rows one launch stages")
        xf, of = x.reshape(-1), out.reshape(-1)
        for r0 in range(0, m, plan.m_fit):
            mm = min(plan.m_fit, m - r0)
            _matvec_mma(W, xf[r0 * ldx:(r0 + mm) * ldx], of[r0 * n_y:(r0 + mm) * n_y], mm, prologue, pro_arg, epi, ldx,
                        n_y, norm_w, eps, None, None)
        return
    k = get_kernel("matvec_mma", "matvec_mma", FMT=W.fmt_id, MV_M=m, **plan.defines)
    _ensure_smem(k, plan.smem)
    part = _mma_part(mma_part_floats(W, m, plan)) if plan.ranges > 1 else None
    bounds = plan.kt_bounds
    for kt0, kt1 in zip(bounds, bounds[1:]):
        qo = qx_out if kt1 == bounds[-1] else None  # the last range's launch combines the passes
        tile_rows = MMA_QX_ROWS if qo is not None else plan.rows
        grid = (persistent_grid(k, plan.threads, plan.smem, -(-W.out // tile_rows)),)
        k(grid, (plan.threads,), (*_wargs(W), x, out, _ptr(norm_w), np.int32(W.out), np.int32(W.in_), np.int32(ldx),
                                  pro_arg, np.int32(epi), np.float32(eps), _ptr(qx_in), _ptr(qo), _ptr(part),
                                  np.int32(kt0), np.int32(kt1)), shared_mem=plan.smem)


def matvec(W: DeviceWeight, x, out, m: int, prologue: str = "none", epilogue: str = "store",
           norm_w=None, eps: float = 1e-6, impl: str | None = None, act_quant: bool | None = None,
           qx_in=None, qx_out=None, act_bf16: bool = False, k_ranges: int | None = None) -> None:
    """out[m, W.out] (=|+=) prologue(x)[m, W.in] @ W.T; epilogue "swiglu" (W's rows interleaved
    gate_i, up_i): out[m, W.out/2] = silu(y[:, 0::2]) * y[:, 1::2].

    x: float32 [m, W.in] (rmsnorm: the raw residual; swiglu: [m, 2*W.in] = gate|up);
    norm_w: float32 [W.in] for rmsnorm.  Row r of an m-row call equals bit for bit the 1-row
    call on that row.  act_quant: the integer-dot contract on/off (None: kernel_refs.act_q8).
    qx_out (uint32 [m, qx_row_words(W.out/2)], swiglu epilogue, where writes_qx): also write the
    outputs' integer-dot codes (kernel_refs.qx_ref); prologue "qx" reads x's codes from qx_in
    instead of quantizing x (rows bit-identical to prologue "none" on the floats qx_in came from).
    act_bf16: the bf16-activation contract, x rounded to bf16 after the prologue (qx_out's codes
    are of the rounded outputs; kernel_refs.bf16_round).  impl: "tc" | "simt" | "mma" (default
    matvec_impl: tests run the kernel production picks for another shape; "mma": matvec_mma.cu,
    the integer-dot contract on int8 tensor cores, where takes_mma, the only one past 8 rows;
    qx_out where mma_writes_qx).  k_ranges: matvec_mma over that many K ranges instead of
    mma_plan's (tests and tools: every split gives the same bits; prologues none and qx)."""
    if not 1 <= m <= MMA_MAX_ROWS:
        raise ValueError(f"matvec handles 1..{MV_MAX_ROWS} rows ({MMA_MAX_ROWS} on matvec_mma), got {m}")
    pro, epi = PROLOGUES[prologue], EPILOGUES[epilogue]
    pro_arg = np.int32(pro | (PRO_BF16 if act_bf16 else 0))
    if (pro == PROLOGUES["qx"]) != (qx_in is not None):
        raise ValueError('prologue "qx" and qx_in go together')
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
    a8 = act_q8(W.fmt) if act_quant is None else bool(act_quant)
    if (pro == PROLOGUES["qx"] or qx_out is not None) and not a8:
        raise ValueError("the QX buffers are the integer-dot contract's")
    if a8 and W.fmt in FLOAT_FORMATS:
        raise ValueError("the integer-dot contract applies to the quantized formats")
    impl = impl or matvec_impl(W, a8, m)
    if impl != "mma" and m > MV_MAX_ROWS:
        raise ValueError(f"matvec: {m} rows take matvec_mma ({_MMA_RULE}), not {impl} on {W.fmt} x {W.in_} "
                         f"(1..{MV_MAX_ROWS} rows)")
    if (impl == "tc" or a8) and (x.data.ptr % 16 or ldx % 4):  # both read x as float4
        raise ValueError("matvec_tc and the integer-dot matvec read x as float4: 16-byte aligned rows")
    if k_ranges is not None and impl != "mma":
        raise ValueError("k_ranges: matvec_mma's K ranges (impl \"mma\")")
    if impl == "mma":
        if not (a8 and takes_mma(W)):
            raise ValueError(f"matvec_mma runs {_MMA_RULE}, not {W.fmt} x {W.in_} (a8={a8})")
        if not _planes_aligned(W):
            raise ValueError("matvec_mma copies 16-byte pieces of the q and s planes: 16-byte aligned planes")
        _matvec_mma(W, x, out, m, prologue, pro_arg, epi, ldx, n_y, norm_w, eps, qx_in, qx_out, k_ranges)
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


def gemm(W: DeviceWeight, x, out, T: int, epilogue: str = "store", impl: str | None = None,
         act_quant: bool | None = None, act_bf16: bool = False) -> None:
    """out[T, W.out] (=|+=) x[T, W.in] @ W.T on tensor cores (f32 accumulation): x, and W where
    its values are not bf16 numbers, are split into bf16 hi + lo parts (error ~2^-16, matching
    the exact decode path).  act_bf16: the bf16-activation contract, x rounded to bf16 (one
    plane, so one wgmma fewer per product) and W split where not exact, as the decode matvec
    with act_bf16 computes it; Q8_0 on gemm_i8 quantizes the rounded x.  Row values do not
    depend on T (no split-K).  impl: "wg" | "mma" (default gemm_impl()); act_quant: the
    integer-dot contract (x quantized first) on/off (None: kernel_refs.act_q8) — under act_bf16
    the GEMM takes bf16(x) itself, within the integer codes' 2^-16 of the block maximum of the
    decode's act_quant(bf16(x))."""
    if x.dtype != np.float32 or out.dtype != np.float32 or x.size < T * W.in_ or out.size < T * W.out:
        raise ValueError("gemm: x and out must be float32 [T, in] / [T, out]")
    if T <= 0:
        return
    impl = impl or gemm_impl()
    c = gemm_contract(W, act_bf16, act_quant, impl)
    g = gemm_geometry(W, c, impl)
    epi = np.int32(EPILOGUES[epilogue])
    k = get_kernel(g.family, g.name, **g.defines)
    _ensure_smem(k, g.smem)
    if g.kernel == "i8":  # x quantized once into QX rows (gemm_act.cu act_quant_qx)
        args = (W.q, W.s, _qx_rows(x, T, W.in_, c.xb16), out, np.int32(T), np.int32(W.out), np.int32(W.in_),
                np.int32(W.out), epi)
        k(g.grid(T, W.out), (256,), args, shared_mem=g.smem)
        return
    if g.kernel == "mma":
        x, xl = mma_operands(c, x, T, W.in_)
        k(g.grid(T, W.out), (256,), (*_wargs(W), x, out, np.int32(T), np.int32(W.out), np.int32(W.in_), epi, _ptr(xl)),
          shared_mem=g.smem)
        return
    alloc = -(-T // g.tokens) * g.tokens * W.in_ if g.kernel == "wra" else 0  # gemm_wra reads x in whole token tiles
    if c.a8:
        xh, xl = _act_quant(x, T * W.in_, alloc)
    else:
        xh, xl = _bf16_planes(x, T * W.in_, c.x_split, alloc)
    if g.kernel == "wra":
        k(g.grid(T, W.out), (256,), (W.q, W.s, _ptr(W.gscale), xh, _ptr(xl), out, np.int32(T), np.int32(W.out),
                                     np.int32(W.in_), np.int32(W.out), epi), shared_mem=g.smem)
        return
    _gemm_wgp(W, k, g, xh, xl, out, T, epi, c.w_split)


class GemmGeometry(NamedTuple):
    """One prefill GEMM launch's geometry (gemm_geometry): the kernel (GEMM_TUNING's name for it),
    its defines, and blocks of ``tokens`` x ``rows`` outputs with ``smem`` bytes."""
    kernel: str  # "i8", "wra", "wgp" or "mma"
    family: str
    name: str
    defines: dict
    tokens: int
    rows: int
    smem: int

    def grid(self, T: int, n_out: int) -> tuple[int, int]:
        """The grid over T tokens and n_out weight rows (gemm_mma.cu: the rows on x)."""
        tiles = (-(-T // self.tokens), -(-n_out // self.rows))
        return tiles[::-1] if self.kernel == "mma" else tiles


def gemm_geometry(W, c: "GemmContract", impl: str) -> GemmGeometry:
    """Every launch decision of gemm for W under contract c on impl's kernels: the kernel
    (GEMM_TUNING: c.i8 from uses_gemm_i8, then uses_gemm_wra), its tiles and ring (wra_geometry,
    wgp_geometry, gemm_bufs) and shared memory."""
    if c.i8:
        if impl == "mma":
            return GemmGeometry("i8", "gemm_i8", "gemm_i8_mma", {"FMT": W.fmt_id}, IM_BM, IM_BN, gemm_i8_mma_smem())
        return GemmGeometry("i8", "gemm_i8", "gemm_i8", {"FMT": W.fmt_id}, WG_BM, I8_BN, gemm_i8_smem())
    # gemm_wgp copies 8-value (16-byte) units of rows that must start 16-byte aligned: n_in a
    # multiple of 8 (every format but F32 guarantees it; F32 rows of 4k+4 values take the
    # portable kernel, which compiles for sm_90a too)
    if impl == "wg" and W.in_ % 8 == 0:
        if uses_gemm_wra(W):
            bt, stages, stage = wra_geometry(W.out, c.x_split, W.fmt)
            return GemmGeometry("wra", "gemm_wgmma", "gemm_wra",
                                dict(FMT=W.fmt_id, GEMM_SPLIT=int(c.x_split), WRA_BT=bt, WRA_STAGES=stages),
                                bt, WRA_ROWS, wgp_smem(stages, stage))
        bn, stages, stage = wgp_geometry(W.out, c.x_split, c.w_split)
        return GemmGeometry("wgp", "gemm_wgmma", "gemm_wgp",
                            dict(GEMM_SPLIT=int(c.x_split), WG_BN=bn, WGP_STAGES=stages, WGP_WLO=int(c.w_split)),
                            WG_BM, bn, wgp_smem(stages, stage))
    bufs = gemm_bufs(c.x_split, c.w_split)
    return GemmGeometry("mma", "gemm_mma", "gemm",
                        _mma_defines(W.fmt_id, c.x_split, bufs, **({"GEMM_XPLANES": 1} if c.a8 else {})),
                        GM_TILE, GM_TILE, _gemm_smem(c.x_split, c.w_split, bufs))


class GemmContract(NamedTuple):
    """What a prefill GEMM of one matrix computes (gemm's switches resolved): i8, the integer-dot
    contract on gemm_i8 / gemm_i8_mma (QX rows); a8, x as the integer-dot planes (GEMM_XPLANES);
    xb16, x rounded to bf16 first; x_split / w_split, x / W as bf16 hi + lo."""
    i8: bool
    a8: bool
    xb16: bool
    x_split: bool
    w_split: bool


def gemm_contract(W, act_bf16: bool = False, act_quant: bool | None = None, impl: str = "wg") -> GemmContract:
    """gemm's contract for W (anything with fmt / in_ / out: a DeviceWeight, cuda_moe.ExpertStore)
    on the kernels of impl: x as two bf16 planes (hi + lo split, or the integer-dot contract's two
    exact code levels), W split where its values are not bf16 numbers.  The bf16-activation
    contract's GEMMs take the rounded x as their one plane (a8 off), but gemm_i8's."""
    a8 = act_q8(W.fmt) if act_quant is None else bool(act_quant)
    i8 = a8 and uses_gemm_i8(W, impl)
    return GemmContract(i8, a8 and not act_bf16 and not i8, act_bf16, not act_bf16, W.fmt not in _W_EXACT_IN_BF16)


def mma_operands(c: GemmContract, x, T: int, n_in: int, tag: str = "x", r0: int = 0):
    """x (f32 [T, n_in]) as the portable kernels read it under contract c: QX rows and None
    (gemm_i8_mma: act_quant_qx), the integer-dot planes hi, lo (GEMM_XPLANES: act_quant), or x
    itself and None (split or rounded in the tile load).  Rows [r0, T) only are prepared, into
    the scratch buffers ``tag``_* (rows before r0 keep what they held: the spilled MoE prefill
    prepares one expert's grouped rows at a time)."""
    if c.i8:
        return _qx_rows(x, T, n_in, c.xb16, tag, r0), None
    if c.a8:
        return _act_quant(x, T * n_in, tag=tag, start=r0 * n_in)
    return x, None


I8_BN = 64  # gemm_i8.cu gemm_i8: out rows per block
I8_BK = 128  # its k tile: four 32-blocks
# gemm_i8.cu I8_STAGE_BYTES, same formula: x h and l tiles (2 x 128 x 128 B), the W tile (64 x 128 B),
# the records (128 tokens x 4 blocks x 16 B), the scales (64 rows x 4 f16), rounded up to 1 KB = 49 KB
I8_STAGE_BYTES = -(-(2 * WG_BM * I8_BK + I8_BN * I8_BK + WG_BM * 4 * 16 + I8_BN * 4 * 2) // 1024) * 1024
I8_STAGES = 4


def gemm_i8_smem() -> int:
    """gemm_i8.cu I8_SMEM_BYTES: the ring plus 1 KB of alignment slack, plus the f32 scales (1 KB)
    (tests/test_smem_contract.py compiles the kernel with a static_assert that the two agree)."""
    return I8_STAGES * I8_STAGE_BYTES + 1024 + 64 * 4 * 4


def uses_gemm_i8(W: DeviceWeight, impl: str = "wg") -> bool:
    """Whether the prefill of W on impl's kernels runs on the integer-dot contract's own
    (GEMM_TUNING's "i8"): Q8_0's code bytes against x's two code levels, exact int32 block dots
    (gemm_i8.cu: gemm_i8 on Hopper's int8 wgmma for rows of a multiple of 128 inputs that are not
    on gemm_wra; gemm_i8_mma on the portable path, rows of a multiple of 64)."""
    return _gemm_entry(W, impl)["kernel"] == "i8"


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


# the inputs a GEMM kernel's rows come in (whole k tiles; gemm_wgp: 16-byte rows), by (kernels,
# GEMM_TUNING's kernel)
_GEMM_K_UNIT = {("wg", "wra"): 64, ("wg", "i8"): I8_BK, ("mma", "i8"): IM_BK, ("wg", "wgp"): 8}


def _gemm_entry(W, impl: str) -> dict:
    """GEMM_TUNING's entry for W on impl's kernels: the first that takes W's rows (_GEMM_K_UNIT)
    of (impl, format, row class), (impl, format, any rows), (impl, any format, row class), (impl,
    any, any); none on "wg" for rows of 8k + 4 values (F32): the portable kernel."""
    cls = "wide" if W.out >= tuning.GEMM_WIDE_ROWS else "*"
    for key in dict.fromkeys(((impl, W.fmt, cls), (impl, W.fmt, "*"), (impl, "*", cls), (impl, "*", "*"))):
        e = GEMM_TUNING.get(key)
        if e is not None and W.in_ % _GEMM_K_UNIT.get((impl, e["kernel"]), 1) == 0:
            return e
    return GEMM_TUNING[("mma", "*", "*")]


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


WGP_SMEM_MAX = 227 * 1024  # opt-in shared memory per block (sm_90)
WGP_SCRATCH_BYTES = 2 * 2 * tuning.GEMM_DEQ_VALUES  # the dequantized weight planes (hi, lo) at their largest
_scratch: dict = {}


def _scratch_u16(name: str, n: int):
    """A grow-only device scratch of n uint16 per (name, device).  Prefill is not graph-captured
    and each user runs on its stream right after filling the buffer; when another stream (another
    runner) takes it over, the previous owner's work is waited for first, so two streams never
    share it in flight."""
    if kernel_build.planning_active():
        return kernel_build.device_empty(name, (n,), np.uint16)
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


def _act_quant(x, n: int, alloc: int = 0, tag: str = "x", start: int = 0):
    """x[start:n] (f32, rows of a multiple of 32 inputs; start on a row) quantized by the
    integer-dot contract (gemm_act.cu act_quant) into bf16 planes: (hi = 2^e h, lo = 2^(e-8) l)."""
    if n % 32 or start % 32:
        raise ValueError("the integer-dot contract quantizes whole blocks of 32 inputs")
    return _x_planes("act_quant", x, n, True, alloc, tag, start)


def _bf16_planes(x, n: int, with_lo: bool, alloc: int = 0):
    """x[:n] (f32) as bf16 planes hi = bf16(x), lo = bf16(x - hi) (gemm_act.cu split_bf16)."""
    return _x_planes("split_bf16", x, n, with_lo, alloc)


def _wg_ring(tiles: tuple, max_stages: int, stage_bytes) -> tuple[int, int, int]:
    """(tile, ring stages, bytes per stage) of a gemm_wgmma.cu kernel: the first of ``tiles``
    whose 3-stage ring (prefetch distance 1) fits one block's shared memory (else the last), a
    ring as deep as fits, at most max_stages; stage_bytes(tile) is one stage's bytes."""
    for tile in tiles:
        stage = stage_bytes(tile)
        fit = (WGP_SMEM_MAX - 1024) // stage
        if fit >= 3:
            break
    return tile, max(3, min(max_stages, fit)), stage


def wgp_geometry(n_out: int, x_split: bool, w_lo: bool) -> tuple[int, int, int]:
    """(rows per block, ring stages, bytes per stage) of gemm_wgp for a matrix of n_out rows
    (GEMM_TUNING's "wgp" entry of its row class: _wg_ring)."""
    e = GEMM_TUNING[("wg", "*", "wide" if n_out >= tuning.GEMM_WIDE_ROWS else "*")]
    return _wg_ring(e["tiles"], e["stages"], lambda bn: wg_stage_bytes(x_split, w_lo, bn))


def wgp_smem(stages: int, stage: int) -> int:
    """gemm_wgmma.cu WGP_SMEM_BYTES / WRA_SMEM_BYTES: the ring plus 1 KB of alignment slack."""
    return stages * stage + 1024


WRA_ROWS = 128  # gemm_wgmma.cu gemm_wra: weight rows per block (2 warpgroups x 64)
WRA_RECORD_BYTES = {"NVFP4": 4, "Q4_K": 16, "Q8_0": 4}  # gemm_wra's formats, their per-row record per k tile (WRA_REC)
WRA_PITCH = {"NVFP4": 48, "Q4_K": 48, "Q8_0": 80}  # WRA_PITCH: a row's codes of a k tile in the stage, padded
WRA_FORMATS = tuple(WRA_RECORD_BYTES)


def wra_stage_bytes(x_split: bool, bt: int, fmt: str = "NVFP4") -> int:
    """gemm_wgmma.cu WRA_STAGE_BYTES: the x_hi (| x_lo) tiles of bt tokens x 64 bf16, then the k
    tile's codes (WRA_ROWS rows at WRA_PITCH) and per-row records, rounded up to 1 KB."""
    return (2 if x_split else 1) * bt * 64 * 2 + -(-(WRA_ROWS * (WRA_PITCH[fmt] + WRA_RECORD_BYTES[fmt])) // 1024) * 1024


def wra_geometry(n_out: int, x_split: bool, fmt: str = "NVFP4") -> tuple[int, int, int]:
    """(tokens per block, ring stages, bytes per stage) of gemm_wra for a matrix of n_out rows
    (GEMM_TUNING's "wra" entry of its format and row class: its tiles when x or W is split (W:
    where not exact in bf16), its tiles_one_plane when both are one bf16 plane; _wg_ring)."""
    e = GEMM_TUNING.get(("wg", fmt, "wide" if n_out >= tuning.GEMM_WIDE_ROWS else "*"), {})
    if e.get("kernel") != "wra":
        raise ValueError(f"GEMM_TUNING puts no {n_out}-row {fmt} matrix on gemm_wra")
    tiles = e["tiles"] if x_split or fmt not in _W_EXACT_IN_BF16 else e["tiles_one_plane"]
    return _wg_ring(tiles, e["stages"], lambda bt: wra_stage_bytes(x_split, bt, fmt))


def uses_gemm_wra(W: DeviceWeight) -> bool:
    """Whether the prefill of W on the sm_90a kernels runs on gemm_wra (GEMM_TUNING's "wra": the
    codes decoded into wgmma's register operand, no dequantization pass; rows of whole 64-input k
    tiles)."""
    return _gemm_entry(W, "wg")["kernel"] == "wra"


def _gemm_wgp(W: DeviceWeight, k, g: GemmGeometry, xh, xl, out, T: int, epi, w_lo: bool) -> None:
    """gemm_wgp (kernel k of geometry g) on x as bf16 planes (xh, and xl when x is split).  BF16
    weights are read in place; other weights are dequantized to bf16 (and W_lo when w_lo) one row
    block at a time into scratch (llama.cpp's dequantize-then-GEMM prefill), each block's GEMM
    writing its columns of out (row blocks do not change any output's k order)."""
    def launch(wq, wl, r0: int, n: int) -> None:
        gs = _NULL if W.gscale is None else np.uint64(W.gscale.data.ptr + 4 * r0)
        k(g.grid(T, n), (256,),
          (wq, _ptr(wl), gs, xh, _ptr(xl), np.uint64(out.data.ptr + 4 * r0), np.int32(T), np.int32(n),
           np.int32(W.in_), np.int32(W.out), epi), shared_mem=g.smem)

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
    """Rows of W per dequantized row block of the prefill GEMM (GEMM_DEQ_VALUES values, whole
    256-row tiles, at most W.out)."""
    return min(W.out, max(256, tuning.GEMM_DEQ_VALUES // W.in_ // 256 * 256))


def dequant_block(W: DeviceWeight, r0: int, n: int, whi, wlo) -> None:
    """W's rows [r0, r0 + n) as bf16 planes whi (and wlo, W - hi, when not None) [n, W.in]:
    dequant.cu dequant_bf16 on the current stream."""
    deq = get_kernel("dequant", "dequant_bf16", FMT=W.fmt_id, DEQ_LO=int(wlo is not None))
    deq((max(1, min(-(-(n * W.nck) // 256), _sm_resources()[0] * 16)),), (256,),
        (W.q, _ptr(W.h), _ptr(W.s), _ptr(W.d), np.int64(r0), np.int32(n), np.int32(W.in_), whi, _ptr(wlo)))


def _dequant_rows(W: DeviceWeight, ids, n_rows: int, out, lo: int = 0, n_table: int = -1) -> None:
    if out.dtype != np.float32 or out.size < n_rows * W.in_:
        raise ValueError("out must be float32 [rows, in]")
    if n_rows <= 0:
        return
    total = n_rows * W.nck
    grid = (max(1, min(-(-total // 256), _sm_resources()[0] * 16)),)
    k = get_kernel("dequant", "dequant_rows", FMT=W.fmt_id)
    k(grid, (256,), (*_wargs(W), _ptr(ids), np.int64(lo), np.int64(n_table), np.int32(n_rows), np.int32(W.in_), out))


def embed(W: DeviceWeight, ids_dev, out, lo: int | None = None) -> None:
    """out[T, W.in] = rows ids[t] of the table, float32, bit-exact with quants.dequantize
    (NVFP4: times the global scale, as QTensor.dequantize).  ids_dev: int32 device array [T].
    ``lo``: the table holds the vocabulary's rows [lo, lo + W.out) (one GPU's share: parallel.py),
    ids outside it give zero rows."""
    if ids_dev.dtype != np.int32:
        raise ValueError("embed: ids must be int32")
    _dequant_rows(W, ids_dev, int(ids_dev.size), out, *(() if lo is None else (lo, W.out)))


def dequantize(W: DeviceWeight, out) -> None:
    """out[W.out, W.in] = the whole matrix as float32, bit-exact with QTensor.dequantize."""
    _dequant_rows(W, None, W.out, out)
