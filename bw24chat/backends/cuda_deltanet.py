"""Launch wrappers for kernels/deltanet.cu (the gated DeltaNet: the causal conv1d, the gated delta
rule's recurrence, the gated RMSNorm), kernels/deltanet_chunk.cu (the delta rule's chunked prefill)
and the recurrent state's place on the device.

Prefill passes (``prefill``) run the delta rule chunked, on tensor cores: every whole chunk of 64
rows, and the pass's partial last chunk from DELTANET_CHUNK_MIN_TAIL rows on (tuning.py); shorter tails (and short
prompts) and decode steps run the recurrence row by row.  Chunks are counted from the pass's first
row; the runner starts passes at multiples of 64 rows from a prefill call's first row, so a call's
results do not depend on how it is split into passes.

One sequence's state, float32, zeros at the sequence's start, one slab per DeltaNet layer (n):
  conv       (n, KC - 1, C)       the conv's last KC - 1 input rows (NumpyRecurrentState.conv)
  ssm        (n, Hv, DV, DK)      per head the transpose of the reference's S (DK x DV)
                                  (NumpyRecurrentState.ssm[l, h].T): a column's DK values contiguous
  conv_ckpt  (SLOTS, n, KC - 1, C) and ssm_ckpt (SLOTS, n, Hv, DV, DK): the state before each decode
                                  row, in slot position % SLOTS (CudaRunner.rollback restores one)
Conventions as cuda_ops.py: CuPy arrays (or plan.SymArray), preallocated outputs, the current
stream, no allocation, no synchronization; positions and checkpoints are read on the device, so a
decode step replays as a graph.

Shape legend: T rows, C conv channels, Hk / Hv key / value heads, DK / DV their dims, KC taps.
"""
from __future__ import annotations

import numpy as np

from ..ops import DeltaNetSpec
from .cuda_ops import _launch
from .kernel_build import get_kernel
from .tuning import DELTANET_CHUNK_BV, DELTANET_CHUNK_MIN_TAIL

# A verify of up to 8 drafts is 9 rows (speculative.MAX_K + 1, over passes of at most 8): every
# row of one step keeps its own slot, so a rollback to any position the step covers is exact.
STATE_SLOTS = 9
GDN_TT = 32  # deltanet.cu: rows per shared-memory tile
GDN_CHUNK = 64  # deltanet_chunk.cu: rows per chunk (numpy_backend.DELTA_CHUNK)
CH_BV = DELTANET_CHUNK_BV  # deltanet_chunk.cu CH_BV: state columns per block of the state pass
_CB = 16  # deltanet.cu CB: columns of S per block
_CONV_NT, _CONV_ROWS = 128, 64  # deltanet.cu: threads and rows per conv block


def state_shapes(spec: DeltaNetSpec, n_layers: int) -> dict[str, tuple[int, ...]]:
    """The state buffers (module docstring) by name: conv, ssm, conv_ckpt, ssm_ckpt."""
    conv = (n_layers, spec.conv_kernel - 1, spec.conv_dim)
    ssm = (n_layers, spec.n_v_heads, spec.v_head_dim, spec.k_head_dim)
    return {"conv": conv, "ssm": ssm, "conv_ckpt": (STATE_SLOTS, *conv), "ssm_ckpt": (STATE_SLOTS, *ssm)}


def state_bytes(spec: DeltaNetSpec, n_layers: int, checkpoints: bool = True) -> int:
    """Bytes of the state buffers (with the checkpoint slots, or the live state alone)."""
    return 4 * sum(int(np.prod(s)) for k, s in state_shapes(spec, n_layers).items() if checkpoints or "ckpt" not in k)


def _ptr(a):
    return np.uint64(0) if a is None else a


def _slots(ckpt, layer_slab, positions, what: str) -> tuple:
    """(checkpoint slab of the layer in slot 0, slot stride in floats) from ckpt[:, layer]; a
    decode pass gives both ``positions`` and ``ckpt``, a prefill pass neither."""
    if (positions is None) != (ckpt is None):
        raise ValueError(f"{what}: positions and ckpt go together")
    if ckpt is None:
        return np.uint64(0), np.int64(0)
    if ckpt.shape[1:] != layer_slab.shape or ckpt.shape[0] != STATE_SLOTS:
        raise ValueError(f"checkpoints {ckpt.shape}: {STATE_SLOTS} slots of {layer_slab.shape} expected")
    return ckpt[0], np.int64(ckpt.strides[0] // 4)


def _rows(a, T: int, cols: int, what: str) -> int:
    """Row stride (floats) of a float32 (>= T, cols) array of contiguous rows."""
    if a.dtype != np.float32 or a.ndim != 2 or a.shape[0] < T or a.shape[1] != cols or a.strides[1] != 4:
        raise ValueError(f"{what}: float32 rows of {cols}, got {a.dtype} {a.shape} strides {a.strides}")
    return a.strides[0] // 4


def conv1d(x, w, state, out, T: int, positions=None, ckpt=None) -> None:
    """out[:T] = silu(causal depthwise conv1d) of x[:T] (T, C) after the layer's conv ``state``
    (KC - 1, C), which advances by the T rows (kernels/deltanet.cu deltanet_conv;
    numpy_backend.causal_conv1d_ref).  w (C, KC) float32.  Decode: ``positions`` (int32 device, T)
    and ``ckpt`` (the conv_ckpt slots of this layer, ckpt[:, layer]): the state before row t goes
    to slot positions[t] % STATE_SLOTS."""
    C, Kc = w.shape
    ldx = _rows(x, T, C, "conv1d x")
    _rows(out, T, C, "conv1d out")
    if out.strides[0] != 4 * C or state.shape != (Kc - 1, C):
        raise ValueError(f"conv1d: out (T, {C}) contiguous and state ({Kc - 1}, {C}), got {out.shape}, {state.shape}")
    ck, stride = _slots(ckpt, state, positions, "conv1d")
    if T == 0:
        return
    k = get_kernel("deltanet", "deltanet_conv", KC=Kc)
    _launch(k, (-(-C // _CONV_NT), -(-T // _CONV_ROWS)), (_CONV_NT,),
            (x, np.int32(ldx), w, state, out, np.int32(T), np.int32(C), _ptr(positions), ck, stride, np.int32(STATE_SLOTS)))


def recurrent_smem(dk: int) -> int:
    """deltanet.cu GDN_SMEM_FLOATS x 4: a tile's q and k (dk padded to 32), v of the block's
    columns, exp(g) and beta."""
    dkp = -(-dk // 32) * 32
    return 4 * GDN_TT * (2 * dkp + _CB + 2)


def recurrent(qkv, b, a, A, dt_bias, spec: DeltaNetSpec, S, o, T: int, positions=None, ckpt=None) -> None:
    """The gated delta rule over T rows (kernels/deltanet.cu deltanet_recurrent;
    numpy_backend.gated_delta_rule_ref): qkv (T, C) the conv's output, b and a (T, Hv) the beta
    and decay projections, A, dt_bias (Hv,); S (Hv, DV, DK) this layer's state, advanced; o (T,
    Hv * DV) contiguous.  Decode: ``positions`` and ``ckpt`` (ssm_ckpt[:, layer]) as conv1d."""
    Hk, Hv, dk, dv = spec.n_k_heads, spec.n_v_heads, spec.k_head_dim, spec.v_head_dim
    if S.shape != (Hv, dv, dk) or o.dtype != np.float32 or o.shape[1:] != (Hv * dv,) or o.strides[0] != 4 * Hv * dv:
        raise ValueError(f"recurrent: S ({Hv}, {dv}, {dk}) and o (T, {Hv * dv}) contiguous, got {S.shape}, {o.shape}")
    ldq = _rows(qkv, T, spec.conv_dim, "recurrent qkv")
    ldb, lda = _rows(b, T, Hv, "recurrent b"), _rows(a, T, Hv, "recurrent a")
    ck, stride = _slots(ckpt, S, positions, "recurrent")
    if T == 0:
        return
    k = get_kernel("deltanet", "deltanet_recurrent", DK=dk)
    _launch(k, (-(-dv // _CB), Hv), (128,),
            (qkv, np.int32(ldq), b, np.int32(ldb), a, np.int32(lda), A, dt_bias, S, o, np.int32(Hv * dv), np.int32(T),
             np.int32(Hk), np.int32(Hv), np.int32(dv), np.int32(spec.v_head_order == "tiled"),
             np.float32(1.0 / np.sqrt(dk)), _ptr(positions), ck, stride, np.int32(STATE_SLOTS)),
            smem=recurrent_smem(dk))


def _pad32(n: int) -> int:
    return -(-n // 32) * 32


def chunk_workspace_shapes(spec: DeltaNetSpec, chunks: int) -> dict[str, tuple[int, int]]:
    """The chunked prefill's float32 workspace for passes of up to ``chunks`` chunks, as (chunks,
    floats a chunk) buffers: "ws" the records of (chunk, value head): W (64 x DKP) | U~ (64 x DVP)
    | M (64 x 64) | exp(gam) | exp(gam_last - gam) (64 each); "qk" those of (chunk, key head): the
    normalized q | k (64 x DKP each) (deltanet_chunk.cu)."""
    dkp, dvp = _pad32(spec.k_head_dim), _pad32(spec.v_head_dim)
    return {"ws": (chunks, spec.n_v_heads * GDN_CHUNK * (dkp + dvp + GDN_CHUNK + 2)),
            "qk": (chunks, spec.n_k_heads * GDN_CHUNK * 2 * dkp)}


def chunk_smem(dk: int) -> tuple[int, int]:
    """Dynamic shared memory (bytes) of deltanet_chunk_prep and deltanet_chunk_state
    (deltanet_chunk.cu PREP_SMEM_FLOATS, STATE_SMEM_FLOATS x 4)."""
    dkp = _pad32(dk)
    ldk, ldm, ldu = dkp + 4, GDN_CHUNK + 4, CH_BV + 8
    prep = 64 * ldk + max(64 * ldk, 64 * ldm + 768) + 64 * ldm + 5 * 64
    main = 64 * max(ldk, ldm)
    state = 2 * (main + 64 * ldu + 128) + 64 * ldu + CH_BV * ldk
    return 4 * prep, 4 * state


def chunked_rows(T: int, dk: int) -> int:
    """Rows of a prefill pass of T rows that run chunked (the first ones): its whole chunks, and
    its partial last chunk when that has DELTANET_CHUNK_MIN_TAIL rows or more; none where the GPU's
    block shared memory cannot hold the chunked kernels (DK = 256 before sm_90)."""
    from .kernel_build import smem_block_limit

    if max(chunk_smem(dk)) > smem_block_limit():
        return 0
    tail = T % GDN_CHUNK
    return T if tail >= DELTANET_CHUNK_MIN_TAIL else T - tail


def chunked(qkv, b, a, A, dt_bias, spec: DeltaNetSpec, S, o, T: int, ws, qk) -> None:
    """The gated delta rule over T prefill rows in chunks of 64 from row 0 (kernels/deltanet_chunk.cu;
    numpy_backend.gated_delta_rule_chunked_ref): arguments as ``recurrent`` (no checkpoints), and
    the workspace buffers ``ws`` and ``qk`` (chunk_workspace_shapes, at least T / 64 chunks
    rounded up)."""
    Hk, Hv, dk, dv = spec.n_k_heads, spec.n_v_heads, spec.k_head_dim, spec.v_head_dim
    if S.shape != (Hv, dv, dk) or o.dtype != np.float32 or o.shape[1:] != (Hv * dv,) or o.strides[0] != 4 * Hv * dv:
        raise ValueError(f"chunked: S ({Hv}, {dv}, {dk}) and o (T, {Hv * dv}) contiguous, got {S.shape}, {o.shape}")
    ldq = _rows(qkv, T, spec.conv_dim, "chunked qkv")
    ldb, lda = _rows(b, T, Hv, "chunked b"), _rows(a, T, Hv, "chunked a")
    if T == 0:
        return
    n = -(-T // GDN_CHUNK)
    need = chunk_workspace_shapes(spec, n)
    for name, buf in (("ws", ws), ("qk", qk)):
        if buf.dtype != np.float32 or buf.size < need[name][0] * need[name][1] or buf.strides[-1] != 4 \
                or buf.strides[0] != 4 * buf.shape[-1]:
            raise ValueError(f"chunked: workspace {name} of {need[name]} contiguous float32, got {buf.shape}")
    prep_smem, state_smem = chunk_smem(dk)
    _launch(get_kernel("deltanet_chunk", "deltanet_chunk_prep", DK=dk, CH_BV=CH_BV), (n, Hv), (128,),
            (qkv, np.int32(ldq), b, np.int32(ldb), a, np.int32(lda), A, dt_bias, np.int32(T), np.int32(Hk),
             np.int32(Hv), np.int32(dv), np.int32(spec.v_head_order == "tiled"), np.float32(1.0 / np.sqrt(dk)), ws, qk),
            smem=prep_smem)
    _launch(get_kernel("deltanet_chunk", "deltanet_chunk_state", DK=dk, CH_BV=CH_BV), (-(-dv // CH_BV), Hv), (128,),
            (ws, qk, S, o, np.int32(Hv * dv), np.int32(T), np.int32(Hk), np.int32(Hv), np.int32(dv),
             np.int32(spec.v_head_order == "tiled")),
            smem=state_smem)


def prefill(qkv, b, a, A, dt_bias, spec: DeltaNetSpec, S, o, T: int, ws, qk) -> None:
    """The gated delta rule over a prefill pass of T rows: its first chunked_rows(T) rows chunked,
    the rest (a short tail) row by row after them, on the state the chunks leave."""
    n = chunked_rows(T, spec.k_head_dim)
    if n:
        chunked(qkv, b, a, A, dt_bias, spec, S, o, n, ws, qk)
    if n < T:
        recurrent(qkv[n:], b[n:], a[n:], A, dt_bias, spec, S, o[n:], T - n)


def gated_norm(x, z, w, eps: float, out, spec: DeltaNetSpec, T: int) -> None:
    """out[:T] = rmsnorm(x) * w * silu(z) per value head of DV (deltanet_gated_norm;
    numpy_backend.gated_rmsnorm_ref): x, out float32 (T, Hv * DV) contiguous, z float32 rows of
    Hv * DV (a column block of the fused input projection), w (DV,)."""
    Hv, dv = spec.n_v_heads, spec.v_head_dim
    for name, arr in (("x", x), ("out", out)):
        if _rows(arr, T, Hv * dv, f"gated_norm {name}") != Hv * dv:
            raise ValueError(f"gated_norm {name}: contiguous rows")
    ldz = _rows(z, T, Hv * dv, "gated_norm z")
    if T == 0:
        return
    _launch(get_kernel("deltanet", "deltanet_gated_norm"), (-(-(T * Hv) // 4),), (128,),
            (x, z, np.int32(ldz), w, np.float32(eps), out, np.int32(T), np.int32(Hv), np.int32(dv)))
