"""Thin launch wrappers for kernels/norm.cu, rope.cu, attention_*.cu, sampling.cu and elementwise.cu
(deltanet.cu: cuda_deltanet.py).

Conventions (the CUDA-graph decode runner relies on them): arguments are CuPy arrays; every op
launches on the current stream into preallocated outputs, never allocates device memory, never
synchronizes, never copies to the host.  Values that change per decode step (positions,
lengths, sampling parameters, seed, ring fill) are read by the kernels from device memory.
Kernel handles are memoized by kernel_build.get_kernel; scalars are passed as NumPy scalars of
the kernel's parameter type (CuPy would pass a Python int as a 64-bit integer).

Shape legend: T tokens, D width, H query heads, K kv heads, G = H/K, hd head dim, R rotary dims,
N cache positions (n_ctx), m decode rows, V vocabulary.  KV cache layouts: kernel_refs.py.
"""
from __future__ import annotations

import math
import struct
from typing import NamedTuple

import numpy as np

from . import kernel_build
from .kernel_build import get_kernel
from .kernel_refs import DECODE_TILE, KV_TYPES, kv_cache_shape
from .tuning import ATTN_DECODE_TC_RINGS, ATTN_DECODE_TUNING, ATTN_PREFILL_STAGES, gpu_class

KV_CODE = {"bf16": 0, "q8_0": 1, "fp8": 2, "f32": 3}
KV_NONE = 255  # rope.cu: no cache write
DECODE_MAX_ROWS = 8
KV_PAGE = 64  # positions per block of a paged KV pool (attention_common.cuh KV_PAGE; every attention tile divides it)
SAMPLE_PARAM_WORDS = 16
_M64 = (1 << 64) - 1

_smem_set: dict = {}  # CUfunction handle -> dynamic shared memory limit already requested


def _launch(kernel, grid, block, args, smem: int = 0):
    # opt in above 47 KB: the 48 KB default also covers the kernel's static shared memory
    key = getattr(kernel, "ptr", None) or id(kernel)
    if smem > 47 * 1024 and _smem_set.get(key, 0) < smem:
        kernel.max_dynamic_shared_size_bytes = smem
        _smem_set[key] = smem
    kernel(grid, block, args, shared_mem=smem)


def _i32(v) -> np.int32:
    return np.int32(v)


def _f32(v) -> np.float32:
    return np.float32(v)


# ============================================================================ KV cache buffers


def kv_cache_alloc(kv_type: str, n_ctx: int, n_kv: int, head_dim: int):
    """A zeroed device buffer for one layer's K (or V) cache (allocation: call at setup only).
    Its shape is kv_cache_shape(...): (N, K, ...) for every type, so that N and K can be read
    off it; the bytes of q8_0 / fp8 are planar (kernel_refs.py), not indexed by that shape."""
    import cupy as cp

    shape, dtype = kv_cache_shape(kv_type, n_ctx, n_kv, head_dim)
    return cp.zeros(shape, dtype)


def _cache_ctx(cache, kv_type: str, n_kv: int, hd: int) -> int:
    if kv_type not in KV_TYPES:
        raise ValueError(f"unknown kv cache type {kv_type!r}")
    n = cache.shape[0]
    if tuple(cache.shape) != kv_cache_shape(kv_type, n, n_kv, hd)[0]:
        raise ValueError(f"cache shape {cache.shape} is not a {kv_type} cache for {n_kv} kv heads of {hd}")
    return n


# ============================================================================ norm.cu


def _norm_cfg(D: int) -> tuple[int, int]:
    if D % 4:
        raise ValueError("rmsnorm needs D % 4 == 0")
    nt = 256 if D <= 8192 else 1024
    vpt = max(1, -(-D // (4 * nt)))
    if vpt > 8:
        raise ValueError(f"rmsnorm: D={D} too large")
    return nt, vpt


def rmsnorm(x, w, eps: float, out) -> None:
    """out[t] = x[t] * rsqrt(mean(x[t]^2) + eps) * w.  x, out: float32 (..., D) contiguous
    (rows = everything but the last axis: pass (T*H, hd) views for a per-head norm); w (D,)."""
    D = x.shape[-1]
    rows = x.size // D
    nt, vpt = _norm_cfg(D)
    k = get_kernel("norm", "rmsnorm", NT=nt, VPT=vpt)
    if rows:
        _launch(k, (rows,), (nt,), (x, w, _f32(eps), _i32(D), out))


def add_rmsnorm(x, residual, w, eps: float, out) -> None:
    """residual += x (in place); out = rmsnorm(residual) * w.  x, residual, out: float32 (T, D)."""
    D = x.shape[-1]
    rows = x.size // D
    nt, vpt = _norm_cfg(D)
    k = get_kernel("norm", "add_rmsnorm", NT=nt, VPT=vpt)
    if rows:
        _launch(k, (rows,), (nt,), (x, residual, w, _f32(eps), _i32(D), out))


def rmsnorm_concat(xa, wa, xb, wb, eps: float, out) -> None:
    """out (T, Da + Db) = [rmsnorm(xa) * wa | rmsnorm(xb) * wb] in one launch; a half whose weight
    is None is copied as is (ops.concat; kernel_refs.rmsnorm_concat_ref).  xa (T, Da), xb (T, Db):
    float32, contiguous rows."""
    T, Da = xa.shape
    Db = xb.shape[1]
    if out.shape != (T, Da + Db) or xb.shape[0] != T:
        raise ValueError(f"rmsnorm_concat: {xa.shape} | {xb.shape} -> {out.shape}")
    for a in (xa, xb, out):
        if a.strides != (a.shape[1] * 4, 4):
            raise ValueError("rmsnorm_concat: contiguous float32 rows")
    nt, vpt = _norm_cfg(max(Da, Db))
    if Da % 4 or Db % 4:
        raise ValueError("rmsnorm_concat needs Da, Db % 4 == 0")
    k = get_kernel("norm", "rmsnorm_concat", NT=nt, VPT=vpt)
    null = np.uint64(0)
    if T:
        _launch(k, (T, 2), (nt,), (xa, null if wa is None else wa, _i32(Da), xb, null if wb is None else wb, _i32(Db),
                                   _f32(eps), out))


# ============================================================================ rope.cu


FULLNORM_MAX_WARPS = 16  # rope.cu FN_MAX_WARPS


def fullnorm_geometry(H: int, K: int) -> tuple[int, int]:
    """(warps, slots per warp) of qk_fullnorm_rope_kv_write's one block per token: the H + 2K
    head vectors spread over at most 16 warps, as few slots per warp as that allows."""
    slots = H + 2 * K
    spw = -(-slots // FULLNORM_MAX_WARPS)
    return -(-slots // spw), spw


def qk_norm_rope_kv_write(q, k, v, q_norm_w, k_norm_w, eps: float, cos, sin, positions_dev, rope_style: str,
                          rot_dim: int, cache_k, cache_v, kv_type: str | None, bias=None, q_out=None,
                          qk_norm: str = "head", q_gated: bool = False, cache_rows=None, split_ss=None) -> None:
    """Fused attention prologue for T tokens (decode T=1..8, or a prefill chunk).

    q (T, H, hd), k (T, K, hd), v (T, K, hd) float32: q and k are normalized (if q_norm_w /
    k_norm_w are given: both or neither) and rotated IN PLACE; k and v are stored at cache row
    positions_dev[t] (int32 (T,), device) in cache_k / cache_v (kv_type "bf16" | "q8_0" | "fp8" |
    "f32"; None: no cache write).  qk_norm "head": RMSNorm over each head, weights (hd,) float32;
    "full": over the whole q row (H * hd) and the whole k row (K * hd), weights (H * hd,) and
    (K * hd,) (MiniMax-M2; rope.cu QK_NORM 2: one block per token, the sums' order fixed per
    row).  cos / sin: float32 (n_pos, R/2) device copies of rope.build_rope_table's tables.
    rope_style "neox" | "normal".  q, k, v may be column slices of one fused (T, (H+2K)*hd)
    buffer (their row strides are passed); bias: optional float32 ((H+2K)*hd,) q|k|v biases added
    first (v is then updated in place too); q_out: optional contiguous float32 (T, H, hd) that
    receives the rotated q instead of q itself.  q_gated: q's heads lie 2 hd apart, each followed by
    its output gate (ops.AttentionSpec.output_gate; rope.cu Q_GATED): q_out is then required.
    cache_rows: optional int32 (T,) device array, the cache row of each token instead of its
    position (a paged pool: kernel_refs.paged_rows); the rotation still uses positions_dev.
    split_ss (full QK-norm split by heads over GPUs, cuda_sharded.py): (ss, mode, n_q, n_k), ss
    float32 (T, 2) on the device; mode 1 only writes each row's sums of squares over these heads
    (q, k) there, mode 2 normalizes by the totals found there (the GPUs' sums, all-reduced);
    n_q, n_k: the model's q and k heads the mean square is over (rope.cu QK_NORM 2)."""
    T, H, hd = q.shape
    K = k.shape[1]
    for a, head in ((q, hd * (2 if q_gated else 1)), (k, hd), (v, hd)):  # a stride over one head
        if (a.shape[1] > 1 and a.strides[1] != head * 4) or a.strides[2] != 4:  # (MQA's kv head) is not checked
            raise ValueError("q, k, v: heads and head dims must be contiguous (only the token stride may differ; "
                             "gated q: heads 2 hd apart)")
    if q_gated and q_out is None:
        raise ValueError("a gated q projection needs q_out (the gate halves stay in place)")
    if T == 0:
        return
    if (q_norm_w is None) != (k_norm_w is None):
        raise ValueError("q_norm_w and k_norm_w: both or neither")
    if qk_norm not in ("head", "full"):
        raise ValueError(f"qk_norm: head or full, got {qk_norm!r}")
    full = q_norm_w is not None and qk_norm == "full"
    if q_norm_w is not None:
        want = (H * hd, K * hd) if full else (hd, hd)
        if (q_norm_w.size, k_norm_w.size) != want:
            raise ValueError(f"{qk_norm} QK-norm weights of {q_norm_w.size} and {k_norm_w.size} values, {want} expected")
    kvt = KV_NONE if kv_type is None else KV_CODE[kv_type]
    gated = {"Q_GATED": 1} if q_gated else {}
    n_ctx = 0 if kv_type is None else _cache_ctx(cache_k, kv_type, K, hd)
    qn = q_norm_w if q_norm_w is not None else q  # unused pointer when QK_NORM == 0
    kn = k_norm_w if k_norm_w is not None else q
    ck = cache_k if kv_type is not None else q
    cv = cache_v if kv_type is not None else q
    args = (q, k, v, qn, kn, _f32(eps), cos, sin, positions_dev, _i32(rot_dim), _i32(T), _i32(H), _i32(K), ck, cv,
            _i32(n_ctx), _i32(q.strides[0] // 4), _i32(k.strides[0] // 4), _i32(v.strides[0] // 4),
            bias if bias is not None else np.uint64(0), q_out if q_out is not None else np.uint64(0),
            cache_rows if cache_rows is not None else np.uint64(0))
    if full:
        nw, spw = fullnorm_geometry(H, K)
        kern = get_kernel("rope", "qk_fullnorm_rope_kv_write", HD=hd, NEOX=int(rope_style == "neox"), QK_NORM=2,
                          KV_TYPE=kvt, FN_SPW=spw, **gated)
        ss, mode, n_q, n_k = (np.uint64(0), 0, H, K) if split_ss is None else split_ss
        _launch(kern, (T,), (32 * nw,), args + (ss, _i32(mode), _i32(n_q), _i32(n_k)))
        return
    kern = get_kernel("rope", "qk_norm_rope_kv_write", HD=hd, NEOX=int(rope_style == "neox"),
                      QK_NORM=int(q_norm_w is not None), KV_TYPE=kvt, **gated)
    _launch(kern, ((T * (H + 2 * K) + 3) // 4,), (128,), args)


# ============================================================================ attention_*.cu


def _decode_gq(G: int) -> int:
    return max(d for d in range(1, min(G, 8) + 1) if G % d == 0)


def _n_sm() -> int:
    return kernel_build.current_device_attribute("MultiProcessorCount")


def _arch_number() -> int:
    return int(kernel_build.active_arch()[3:].rstrip("a"))


def _decode_tuning(tc: bool) -> dict:
    """ATTN_DECODE_TUNING's entry of the tensor-core (tc) or FMA decode kernel on this GPU."""
    return ATTN_DECODE_TUNING[("tc" if tc else "fma", gpu_class(_arch_number()))]


# the decode workspace holds the most splits any decode launch takes: the larger blocks per SM,
# rounded up to whole clusters of the largest size (every cluster size divides it)
_WS_BLOCKS_PER_SM = max(e["blocks_per_sm"] for e in ATTN_DECODE_TUNING.values())
_WS_CLUSTER = max(e["cluster"] for e in ATTN_DECODE_TUNING.values())


def attn_decode_max_splits(n_heads: int, n_kv_heads: int, n_sm: int | None = None,
                           blocks_per_sm: int = _WS_BLOCKS_PER_SM) -> int:
    """Splits per (row, kv head, head group): enough blocks for ~blocks_per_sm per SM at one row
    (ATTN_DECODE_TUNING's; the default, the largest, is what the workspace is sized for), at most 64."""
    nsg = (n_heads // n_kv_heads) // _decode_gq(n_heads // n_kv_heads)
    n_sm = n_sm or _n_sm()
    return max(1, min(64, -(-blocks_per_sm * n_sm // (n_kv_heads * nsg))))


def attn_decode_cluster(tc: bool) -> int:
    """Cluster size C of the decode's split merge through distributed shared memory
    (attention_merge.cuh ATTN_CLUSTER: max_splits = C), 0 for the merge through the global
    workspace: ATTN_DECODE_TUNING's for the tensor-core (tc) or FMA kernel on this GPU.  The
    cluster merge gives the same bits as the workspace merge with max_splits = C."""
    return _decode_tuning(tc)["cluster"]


def _decode_cluster_smem(hd: int, gq: int, nparts: int, cluster: int) -> int:
    """attention_merge.cuh decode_finish_cluster's shared memory: the block's parts, then this
    split's O, (m, l), split weights and sums (floats)."""
    return (nparts * gq * (hd + 2) + gq * hd + 2 * gq + gq * cluster + gq) * 4 if cluster else 0


def attn_decode_hybrid(cluster: int) -> int:
    """ATTN_HYBRID = P of the FMA decode under a cluster of C: rows of up to C * P tiles
    (ATTN_DECODE_TUNING's cluster_tiles) merge in the cluster, longer ones over
    attn_decode_long_splits blocks through the workspace.  The tensor-core decode takes the
    cluster at every length."""
    return max(1, _decode_tuning(False)["cluster_tiles"] // cluster)


def attn_decode_long_splits(n_heads: int, n_kv_heads: int, cluster: int, n_sm: int | None = None,
                            blocks_per_sm: int = _WS_BLOCKS_PER_SM) -> int:
    """Splits per (row, kv head, head group) of a hybrid launch's long rows (its grid y): the FMA
    kernel's max_splits rounded up to a whole number of clusters."""
    return -(-attn_decode_max_splits(n_heads, n_kv_heads, n_sm, blocks_per_sm) // cluster) * cluster


def _decode_ws_splits(n_heads, n_kv_heads, n_sm=None) -> int:
    """Splits per (row, kv head, head group) the decode workspace holds: max_splits rounded up to
    the largest cluster."""
    return -(-attn_decode_max_splits(n_heads, n_kv_heads, n_sm) // _WS_CLUSTER) * _WS_CLUSTER


def _decode_ws_layout(n_heads, n_kv_heads, head_dim, max_rows, n_sm=None):
    ms = _decode_ws_splits(n_heads, n_kv_heads, n_sm)
    nsg = (n_heads // n_kv_heads) // _decode_gq(n_heads // n_kv_heads)
    cnt_bytes = -(-(max_rows * n_kv_heads * nsg * 4) // 256) * 256
    part_bytes = max_rows * n_heads * ms * (head_dim + 2) * 4
    return ms, cnt_bytes, part_bytes


def attn_decode_workspace_bytes(n_heads: int, n_kv_heads: int, head_dim: int, max_rows: int = DECODE_MAX_ROWS,
                                n_sm: int | None = None) -> int:
    """Bytes of the decode workspace (split partials + arrival counters).  Allocate it ZEROED
    once (cp.zeros(n, cp.uint8)); the kernel leaves the counters at zero after each launch."""
    _, cnt, part = _decode_ws_layout(n_heads, n_kv_heads, head_dim, max_rows, n_sm)
    return cnt + part


DECODE_TC_TILE = 64  # keys per block tile of attn_decode_tc (attention_decode_tc.cu TCK)


def decode_on_tensor_cores(kv_type: str, hd: int) -> bool:
    """attn_decode_tc serves bf16 caches with head dims 32..128 (mma.sync bf16: sm_80+); the FMA
    kernel attn_decode the other caches (tests monkeypatch this to run it on bf16 too)."""
    return kv_type == "bf16" and 32 <= hd <= 128 and hd % 16 == 0 and _arch_number() >= 80


def _decode_tc_stage_bytes(hd: int) -> int:
    return 2 * DECODE_TC_TILE * (hd + 8) * 2  # (K, V) x TCK x LDK bf16


def decode_tc_config(hd: int) -> tuple[int, int]:
    """(TC_HALVES, TCSTAGES) of attn_decode_tc: the first of ATTN_DECODE_TC_RINGS whose ring the
    block's shared memory holds (two four-warp halves, each computing every other key tile, over 4
    tiles; else one half over 3, or 2: sm_120's 99 KB at hd = 128, where 3 tiles need 102 KB)."""
    stage, limit = _decode_tc_stage_bytes(hd), kernel_build.smem_block_limit()
    return next((r for r in ATTN_DECODE_TC_RINGS if r[1] * stage <= limit), ATTN_DECODE_TC_RINGS[-1])


def _decode_tc_smem(hd: int) -> int:
    return decode_tc_config(hd)[1] * _decode_tc_stage_bytes(hd)  # TCSTAGES x (K, V) x TCK x LDK bf16


def _decode_smem(hd: int, gq: int, kv_type: str, cluster: int = 0) -> int:
    es = {"bf16": 2, "q8_0": 1, "fp8": 1, "f32": 4}[kv_type]
    scb = {"bf16": 0, "q8_0": hd // 16, "fp8": 4, "f32": 0}[kv_type]
    stage = 2 * DECODE_TILE * hd * es + 2 * DECODE_TILE * scb
    nsub = 4 * (32 // (hd // 8))
    return max(3 * stage, nsub * gq * (hd + 2) * 4, _decode_cluster_smem(hd, gq, nsub, cluster))


class AttnDecodeGeometry(NamedTuple):
    """One decode attention launch's geometry (attn_decode_geometry): the kernel, its defines, and
    the grid (row groups, splits, K x groups) of blocks of ``threads`` with ``smem`` bytes, each
    block ``rows`` rows."""
    family: str
    kernel: str
    defines: dict
    splits: int  # blocks per (row, kv head, head group): the kernels' max_splits
    groups: int  # head groups per kv head
    threads: int
    smem: int
    cluster: int
    rows: int  # rows per block (attention_decode_tc.cu ATTN_ROWS)


ATTN_ROWS_FILL = 0.75  # attn_decode_rows: the share of the SMs a verify's blocks may fill before rows share blocks


def attn_decode_rows(m: int, gq: int, tc: bool, paged: bool, row_blocks: int, n_sm: int) -> int:
    """Rows per block of an m-row decode attention: on tensor cores over a contiguous cache (one
    sequence, whose rows read the same keys: a speculative verify) as many as fill the 16 MMA rows
    with their gq heads each, so a key tile is read and multiplied once for all of them; else one
    (a paged pass's rows are different sequences).  A row's bits do not depend on it.  Where a
    row's own blocks are few (``row_blocks``: splits x KV heads x head groups; a small model's 3 KV
    heads give 24), the fewest rows per block whose blocks stay within ATTN_ROWS_FILL of the
    ``n_sm`` SMs: spread over more SMs, the rows' chains run side by side (SmolLM2-135M, 4 rows:
    4.80 us a launch at one row a block against 8.36 at four; Qwen3-8B's 64 blocks a row keep
    sharing, 14.4 us at four rows a block against 17.1 at two: docs/performance.md)."""
    if not tc or paged:
        return 1
    most = max(1, min(m, 16 // gq))
    return next((r for r in range(1, most) if -(-m // r) * row_blocks <= ATTN_ROWS_FILL * n_sm), most)


def attn_decode_geometry(n_heads: int, n_kv_heads: int, hd: int, kv_type: str, qx: bool = False,
                         paged: bool = False, m: int = 1) -> AttnDecodeGeometry:
    """Every launch decision of attn_decode of m rows for these heads over a kv_type cache on this
    GPU: the kernel (decode_on_tensor_cores), heads per block (_decode_gq), rows per block
    (attn_decode_rows), the split count and merge (ATTN_DECODE_TUNING: attn_decode_max_splits,
    attn_decode_cluster, attn_decode_hybrid), the tensor-core ring (decode_tc_config), the shared
    memory; qx: the o projection's QX codes too; paged: keys read through block tables (KV_PAGE)."""
    G = n_heads // n_kv_heads
    gq = _decode_gq(G)
    tc = decode_on_tensor_cores(kv_type, hd)
    blocks_per_sm = _decode_tuning(tc)["blocks_per_sm"]
    ms = attn_decode_max_splits(n_heads, n_kv_heads, blocks_per_sm=blocks_per_sm)  # the workspace merge's
    extra = {"ATTN_QX": 1} if qx else {}
    if paged:
        extra["KV_PAGE"] = KV_PAGE
    halves = 1
    if tc:  # both always given: the defaults in the kernel serve the compile-only checks
        halves, stages = decode_tc_config(hd)
        extra.update(TC_HALVES=halves, TCSTAGES=stages)
    cluster = attn_decode_cluster(tc)
    if cluster:  # the splits of one (row, kv head, head group) merge in a thread-block cluster (ATTN_CLUSTER)
        extra["ATTN_CLUSTER"] = cluster
        ms = cluster
        if not tc:  # long rows take the workspace merge over more blocks, a whole number of clusters
            extra["ATTN_HYBRID"] = attn_decode_hybrid(cluster)
            ms = attn_decode_long_splits(n_heads, n_kv_heads, cluster, blocks_per_sm=blocks_per_sm)
    rows = attn_decode_rows(m, gq, tc, paged, ms * n_kv_heads * (G // gq), _n_sm())
    if rows > 1:
        extra["ATTN_ROWS"] = rows
    if tc:
        return AttnDecodeGeometry("attention_decode_tc", "attn_decode_tc", dict(HD=hd, GQ=gq, **extra), ms, G // gq,
                                  128 * halves, _decode_tc_smem(hd), cluster, rows)
    return AttnDecodeGeometry("attention_decode", "attn_decode", dict(HD=hd, GQ=gq, KV_TYPE=KV_CODE[kv_type], **extra),
                              ms, G // gq, 128, _decode_smem(hd, gq, kv_type, cluster), cluster, rows)


def attn_decode(q, cache_k, cache_v, kv_type: str, lengths_dev, m: int, scale: float, out, workspace,
                max_rows: int = DECODE_MAX_ROWS, qx_out=None, act_bf16: bool = False, tables=None,
                table_stride: int = 0, ws_rows: int = 0) -> None:
    """Split-K decode attention for m (1..max_rows) query rows.

    q (m', H, hd) float32 with m' >= m (rows 0..m-1 used); row r attends keys 0..lengths_dev[r]-1
    (int32 device array, >= 1; for speculative verify the rows are consecutive positions so
    lengths are L, L+1, ...); cache_k / cache_v: one layer (kv_cache_alloc); out (m', H, hd)
    float32 (rows < m written); workspace: uint8 device buffer of attn_decode_workspace_bytes
    (zeroed once at allocation); scale: softmax scale (1/sqrt(hd)).  qx_out (uint32 [m', qx_row_words(H
    * hd)], attention_merge.cuh ATTN_QX): also the o projection's QX codes of the outputs (of their
    bf16 roundings with act_bf16), for its matvec's prologue "qx".  tables (int32 device array,
    row r's block table at r * table_stride): the cache is a paged pool of KV_PAGE-position
    blocks (attention_common.cuh KV_PAGE; kernel_refs.paged_rows); each row's bits are those of
    the contiguous cache holding the same keys (max_rows too changes only the workspace layout
    and when the newest keys are fetched, never a value).  ws_rows (default max_rows): the rows
    the workspace is laid out for, >= max_rows: launches of different max_rows that share one
    workspace find its arrival counters in one place (the split partials are rewritten by every
    launch before they are read)."""
    _, H, hd = q.shape
    K = cache_k.shape[1]
    ws_rows = ws_rows or max_rows
    if not 1 <= m <= max_rows <= ws_rows:
        raise ValueError(f"m={m}, max_rows={max_rows}, ws_rows={ws_rows}: need 1 <= m <= max_rows <= ws_rows")
    n_ctx = _cache_ctx(cache_k, kv_type, K, hd)
    _, cnt_bytes, part_bytes = _decode_ws_layout(H, K, hd, ws_rows)
    assert workspace.nbytes >= cnt_bytes + part_bytes, "decode workspace too small"
    ws_cnt = workspace[:cnt_bytes].view(np.int32)
    ws_part = workspace[cnt_bytes:cnt_bytes + part_bytes].view(np.float32)
    if qx_out is not None and (H * hd) % 32:
        raise ValueError("the QX codes cover whole 32-value blocks")
    g = attn_decode_geometry(H, K, hd, kv_type, qx_out is not None, paged=tables is not None, m=m)
    kern = get_kernel(g.family, g.kernel, **g.defines)
    if g.cluster > 8:
        from .kernel_build import allow_nonportable_clusters

        allow_nonportable_clusters(kern)
    _launch(kern, (-(-m // g.rows), g.splits, K * g.groups), (g.threads,),
            (q, cache_k, cache_v, lengths_dev, _i32(H), _i32(K), _i32(n_ctx), _i32(g.splits), _i32(max_rows),
             _f32(scale * math.log2(math.e)), out, ws_part, ws_cnt, qx_out if qx_out is not None else np.uint64(0),
             _i32(int(act_bf16)), tables if tables is not None else np.uint64(0), _i32(table_stride), _i32(m)),
            smem=g.smem)


def prefill_smem_bytes(hd: int, kv_type: str, stages: int = 2) -> int:
    """attention_prefill.cu PREFILL_SMEM: stages x tiles x 64 keys x (hd+8) bf16, tiles = K, V,
    plus K_lo, V_lo for q8_0 / fp8 / f32 caches (two stages: 73728 B at hd=64, 139264 B at
    hd=128: one block per SM there)."""
    tiles = 4 if kv_type != "bf16" else 2
    return stages * tiles * 64 * (hd + 8) * 2


def prefill_stages(hd: int, kv_type: str) -> int:
    """attn_prefill's K/V stages (PREFILL_STAGES): the first of ATTN_PREFILL_STAGES that the
    block's shared memory holds, 2 (the next key block fills while this one is used) or 1 (fill,
    barrier, use: the same arithmetic in the same order, so the same bits).  One stage is what the
    prefill over a q8_0 / fp8 / f32 cache at head dim 128 fits in on the 99 KB GPUs (sm_86 /
    sm_89 / sm_120)."""
    limit = kernel_build.smem_block_limit()
    return next((s for s in ATTN_PREFILL_STAGES if prefill_smem_bytes(hd, kv_type, s) <= limit),
                ATTN_PREFILL_STAGES[-1])


def attn_prefill_geometry(hd: int, gq: int, kv_type: str, paged: bool = False) -> tuple[dict, int]:
    """attn_prefill's defines and shared memory for head dim hd, gq query heads per kv head and a
    kv_type cache (its K/V stages: prefill_stages); paged: keys read through a block table
    (KV_PAGE; addresses only)."""
    stages = prefill_stages(hd, kv_type)
    defines = dict(HD=hd, GQ=gq, KV_TYPE=KV_CODE[kv_type], **({"PREFILL_STAGES": 1} if stages == 1 else {}),
                   **({"KV_PAGE": KV_PAGE} if paged else {}))
    return defines, prefill_smem_bytes(hd, kv_type, stages)


def attn_prefill(q, cache_k, cache_v, kv_type: str, start: int, T: int, scale: float, out, table=None) -> None:
    """Causal prefill attention (tensor cores) for T queries at positions start..start+T-1 over
    keys 0..start+T-1 already in the cache.  q, out: float32 (T', H, hd), T' >= T; cache:
    kv_cache_alloc; start: host int (prefill is not graph-captured).  Q and P enter the MMAs as
    split bf16 (hi + lo), and for q8_0 / fp8 / f32 caches the exact f32 K and V values too (three
    MMAs: hi.hi, lo.hi, hi.lo), ~1e-5 from the float64 reference on the stored values for every
    kv type, close to the f32 decode path.  Rows are bit-identical whatever the chunking.  table
    (int32 device array): the sequence's block table in a paged pool of KV_PAGE-position blocks
    (attn_decode's tables); the same bits as the contiguous cache holding the same keys."""
    _, H, hd = q.shape
    K = cache_k.shape[1]
    if T == 0:
        return
    G = H // K
    n_ctx = _cache_ctx(cache_k, kv_type, K, hd)
    defines, smem = attn_prefill_geometry(hd, G, kv_type, paged=table is not None)
    limit = kernel_build.smem_block_limit()
    if smem > limit:
        raise ValueError(f"attn_prefill: hd={hd} kv={kv_type} needs {smem} B of shared memory "
                         f"(> {limit} B on this GPU)")
    _launch(get_kernel("attention_prefill", "attn_prefill", **defines), (-(-(T * G) // 64), K), (128,),
            (q, cache_k, cache_v, _i32(T), _i32(H), _i32(K), _i32(start), _i32(n_ctx),
             _f32(scale * math.log2(math.e)), out, table if table is not None else np.uint64(0)), smem=smem)


# ============================================================================ sampling.cu


# the device params' words: temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed
# (low, high 64 bits), ring fill, push; float64 words hold the value's bits; the rest are zero
_SAMPLE_PARAMS = struct.Struct(f"<dQdddQQQQQ{8 * (SAMPLE_PARAM_WORDS - 10)}x")


def pack_sampling_params(p, seed: int, hist_len: int = 0, push: bool = False) -> np.ndarray:
    """SamplingParams + seed (int, up to 128 bits) + ring fill -> the uint64[16] host image of
    the device params (copy it into a device array; a graph replays with new contents).  One
    struct.pack: every decode step packs a row's image on the host."""
    words = _SAMPLE_PARAMS.pack(float(p.temperature), max(int(p.top_k), 0), float(p.top_p), float(p.min_p),
                                float(p.repeat_penalty), max(int(p.repeat_last_n), 0), seed & _M64, (seed >> 64) & _M64,
                                hist_len, 1 if push else 0)
    return np.frombuffer(bytearray(words), np.uint64)


SAMPLE_NT = 512  # sampling.cu SNT
SAMPLE_MAX_GRID = 256  # sampling.cu MAX_GRID
_SAMPLE_NBIN = 256
# sampling.cu SampleState (two per workspace slot): arrive, leave (u32), first_c, last, total, found_c[4] (u64), cnt[3][256]
# (u32), mass[3][256] (u64), partial[MAX_GRID] (f64)
_SAMPLE_STATE = 8 + 8 * 7 + 3 * _SAMPLE_NBIN * 4 + 3 * _SAMPLE_NBIN * 8 + SAMPLE_MAX_GRID * 8
# sampling.cu SampleShared: cnt (u32), mass, scan (u64) [256]; red_u64, red_f64 [SNT/32]; sum_part[MAX_GRID]; 2 ints
_SAMPLE_SHARED = _SAMPLE_NBIN * (4 + 8 + 8) + 2 * (SAMPLE_NT // 32) * 8 + SAMPLE_MAX_GRID * 8 + 8


def _sample_layout(vocab: int) -> tuple[int, int, int, int]:
    """Byte offsets of the parts of one slot of the sampler workspace: keys uint32 [V], e float64
    [V], fixed-point weights uint64 [V], SampleState [2]; and the slot's bytes (sampling.cu)."""
    e_off = -(-vocab * 4 // 8) * 8
    fx_off = e_off + vocab * 8
    st_off = fx_off + vocab * 8
    return e_off, fx_off, st_off, st_off + 2 * _SAMPLE_STATE


def sample_grid(vocab: int, n_sm: int | None = None) -> int:
    """Blocks that sample one row: about one per 2048 logits, at most one per SM (they must all
    be resident: sampling.cu waits at grid barriers) and MAX_GRID.  A function of the vocabulary
    and the GPU alone: a row's token does not depend on how many rows a launch samples."""
    n_sm = _n_sm() if n_sm is None else n_sm
    return max(1, min(n_sm, SAMPLE_MAX_GRID, -(-vocab // 2048)))


def sample_slots(vocab: int, rows: int, n_sm: int | None = None) -> int:
    """Rows a launch over ``rows`` rows samples at once (sampling.cu: slots, each sample_grid(V)
    blocks taking its rows in turn): as many as the SMs hold whole grids of, one block per SM
    (a block takes more than half an SM's registers)."""
    if rows <= 1:
        return 1
    n_sm = _n_sm() if n_sm is None else n_sm
    return max(1, min(rows, n_sm // sample_grid(vocab, n_sm)))


def sample_workspace_bytes(vocab: int, rows: int = 1) -> int:
    """Bytes of the workspace of a sampler launch over up to ``rows`` rows (allocate it zeroed:
    its states must start at zero, and every launch leaves them so)."""
    return sample_slots(vocab, rows) * _sample_layout(vocab)[3]


def sample(logits, params_dev, out_token_dev, recent_ids_dev, pos_dev, workspace) -> None:
    """Tokens per bw24chat/sampling.py for R rows in one launch: row r from logits[r] (logits
    (R, V) float32; (V,): R = 1) with its params image params_dev[r] (uint64, pack_sampling_params;
    (R, 16) rows of any stride, e.g. a step image's rows; (16,) for R = 1), its ring
    recent_ids_dev[r] (int32 (R, C) or (C,); C >= repeat_last_n; C = 0: no penalty) and position
    pos_dev[r] (int32 (R,), keys the Philox draw), into out_token_dev[r] (int32 (R,)).  Row r's
    token is the one a launch of that row alone draws.  workspace: zero-initialised uint8 device
    buffer of at least sample_workspace_bytes(V, R), used by one launch at a time."""
    R = 1 if logits.ndim == 1 else int(logits.shape[0])
    V = int(logits.shape[-1])
    slots = sample_slots(V, R)
    slot_bytes = _sample_layout(V)[3]
    if workspace.size < slots * slot_bytes:
        raise ValueError(f"sampler workspace of {workspace.size} bytes, {slots * slot_bytes} needed for {R} rows")
    for name, a in (("out_token_dev", out_token_dev), ("pos_dev", pos_dev)):
        if a.size < R or a.strides[0] != 4:
            raise ValueError(f"sample: {name} needs {R} contiguous int32")
    G = sample_grid(V)
    per = -(-V // G)
    smem = _SAMPLE_SHARED + 16 + ((per + 31) // 32) * 4
    kern = get_kernel("sampling", "sample")
    ring_cap = int(recent_ids_dev.shape[-1])
    ring = recent_ids_dev if ring_cap else out_token_dev
    l_stride = logits.strides[0] // 4 if logits.ndim == 2 else 0
    p_stride = params_dev.strides[0] // 8 if params_dev.ndim == 2 else 0
    r_stride = recent_ids_dev.strides[0] // 4 if ring_cap and recent_ids_dev.ndim == 2 else 0
    _launch(kern, (G, slots), (SAMPLE_NT,),
            (logits, _i32(V), np.int64(l_stride), _i32(R), params_dev, _i32(p_stride), pos_dev, ring, _i32(r_stride),
             _i32(ring_cap), workspace, np.int64(slot_bytes), out_token_dev), smem=smem)


def argmax(x, out_token_dev) -> None:
    """out_token_dev[0] = first index of the maximum of x (V,) float32 (np.argmax, no NaNs)."""
    kern = get_kernel("sampling", "argmax")
    _launch(kern, (1,), (1024,), (x, _i32(x.shape[-1]), out_token_dev))


def philox_raw(keys_dev, positions_dev, out_dev) -> None:
    """Test hook: out[i] = first raw 64-bit Philox4x64-10 output for key keys_dev[i] (uint64[n,2])
    and counter (positions_dev[i] (uint64), 0, 0, 0), as np.random.Philox(...).random_raw()."""
    n = int(out_dev.size)
    kern = get_kernel("sampling", "philox_raw")
    _launch(kern, (-(-n // 256),), (256,), (keys_dev, positions_dev, _i32(n), out_dev))


# ============================================================================ elementwise.cu


def swiglu(gu, act) -> None:
    """act (T, F) = silu(gate) * up from gu (T, 2F) = gate | up (float32)."""
    T, F = act.shape
    _launch(get_kernel("elementwise", "swiglu_rows"), (-(-F // 256), T), (256,), (gu, act, _i32(T), _i32(F)))


def output_gate(o, q, H: int, hd: int) -> None:
    """o (T, H * hd) *= sigmoid(gate) in place, the gate of head h at q[t, 2 h hd + hd:2 (h + 1) hd]
    (ops.output_gate; elementwise.cu output_gate_rows).  o: float32 contiguous rows; q: the q
    projection's float32 rows (a column slice of the fused qkv output)."""
    T = o.shape[0]
    if o.dtype != np.float32 or o.shape != (T, H * hd) or o.strides != (4 * H * hd, 4):
        raise ValueError(f"output_gate: o float32 (T, {H * hd}) contiguous, got {o.dtype} {o.shape}")
    if q.dtype != np.float32 or q.shape[0] < T or q.shape[1] < 2 * H * hd or q.strides[1] != 4:
        raise ValueError(f"output_gate: q float32 rows of >= {2 * H * hd}, got {q.dtype} {q.shape}")
    if T:
        _launch(get_kernel("elementwise", "output_gate_rows"), (-(-(H * hd) // 256), T), (256,),
                (o, q, _i32(q.strides[0] // 4), _i32(T), _i32(H), _i32(hd)))


def put_columns(src, dst, add: bool = False) -> None:
    """dst (T, n) = src, or dst += src (one rounding): a column slice of a fused linear's output,
    filled by one format's share of it (cuda_weights.PartedWeight; elementwise.cu
    put_columns_rows).  src: float32 (T, n) contiguous; dst: float32 rows of n (a column slice)."""
    T, n = src.shape
    if src.dtype != np.float32 or src.strides != (4 * n, 4):
        raise ValueError(f"put_columns: src float32 (T, n) contiguous, got {src.dtype} {src.shape}")
    if dst.dtype != np.float32 or dst.shape != (T, n) or dst.strides[1] != 4:
        raise ValueError(f"put_columns: dst float32 ({T}, {n}) rows, got {dst.dtype} {dst.shape}")
    if T:
        _launch(get_kernel("elementwise", "put_columns_rows"), (-(-n // 256), T), (256,),
                (src, dst, _i32(dst.strides[0] // 4), _i32(n), _i32(int(add))))


def vocab_expand(sub, vmap, out) -> None:
    """out (T, V) = a reduced vocabulary's logits sub (T, n) at their ids, -inf elsewhere
    (ops.vocab_expand; elementwise.cu vocab_expand_rows).  float32 contiguous rows; vmap int32 (V,)."""
    T, n = sub.shape
    V = int(vmap.shape[0])
    if sub.dtype != np.float32 or sub.strides != (4 * n, 4) or vmap.dtype != np.int32:
        raise ValueError(f"vocab_expand: sub float32 (T, n) contiguous and vmap int32, got {sub.dtype} {vmap.dtype}")
    if out.dtype != np.float32 or out.shape[0] < T or out.shape[1] != V or out.strides[1] != 4 or out.strides[0] != 4 * V:
        raise ValueError(f"vocab_expand: out float32 (>= {T}, {V}) contiguous, got {out.dtype} {out.shape}")
    if T:
        _launch(get_kernel("elementwise", "vocab_expand_rows"), (-(-V // 256), T), (256,), (sub, vmap, out, _i32(n), _i32(V)))


def shared_gate(s, x, gate) -> None:
    """s (T, D) *= sigmoid(x[t] . gate) per row, in place: a gated shared expert (ops.experts;
    elementwise.cu shared_gate_rows).  s, x: float32 (T, D) contiguous rows; gate (D,)."""
    T, D = s.shape
    for a in (s, x):
        if a.dtype != np.float32 or a.shape != (T, D) or a.strides != (4 * D, 4):
            raise ValueError(f"shared_gate: float32 (T, {D}) contiguous rows, got {a.dtype} {a.shape}")
    if T:
        _launch(get_kernel("elementwise", "shared_gate_rows"), (T,), (256,), (s, x, gate, _i32(D)))
