"""The NumPy reference backend (float32): the op set (``bw24chat.ops``) and the CPU runner.

This is the specification every CUDA kernel is checked against, so it is kept plain: each op
is the textbook formula in float32.  It also serves users without an NVIDIA GPU
(``--device cpu``): weights are dequantized to float32 once at load so that each matrix product
is one BLAS call.

Shape legend: T tokens in the step, D model width, H query heads, K kv heads, G = H/K,
hd head dim, S cached positions, F ffn width, V vocabulary, E routed experts, k experts per token.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..api import SamplingParams
from ..loaders.tensor import QTensor
from ..ops import AttentionSpec, DeltaNetSpec, Loader, Ops, RouterSpec
from ..rope import apply_rope
from ..sampling import sample_token
from .kernel_refs import act_q8, act_quant_ref, bf16_round
from .runner import SeqWork

NUMPY_MAX_BATCH = 64  # sequences per batched step: rows run one by one here, so any number would do


class NumpyKVCache:
    """One sequence's K and V, (n_layers, capacity, K, hd) float32, grown by doubling."""

    def __init__(self, n_layers: int, n_kv: int, head_dim: int, n_ctx: int):
        self.n_ctx = n_ctx
        self.shape = (n_layers, 0, n_kv, head_dim)
        self.k = np.zeros((n_layers, 0, n_kv, head_dim), np.float32)
        self.v = np.zeros_like(self.k)

    def ensure(self, length: int) -> None:
        cap = self.k.shape[1]
        if length <= cap:
            return
        new_cap = min(max(length, 2 * cap, 256), max(self.n_ctx, length))
        for name in ("k", "v"):
            old = getattr(self, name)
            new = np.zeros((old.shape[0], new_cap, *old.shape[2:]), np.float32)
            new[:, :cap] = old
            setattr(self, name, new)

    def write(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> None:
        """K and V (T, K, hd) of positions start..start+T-1."""
        end = start + len(k)
        self.ensure(end)
        self.k[layer, start:end] = k
        self.v[layer, start:end] = v

    def read(self, layer: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """K and V (end, K, hd) of positions 0..end-1."""
        return self.k[layer, :end], self.v[layer, :end]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


class NumpyKVPool:
    """The paged KV cache (backends/runner.py: batch_step): K and V of ``n_blocks`` blocks of
    ``block_size`` positions, held as (n_layers, n_blocks * block_size, K, hd) float32 slots
    (block b holds slots b * block_size ..).  Which block belongs to which sequence is the engine's
    bookkeeping (kv_pages.py); a sequence's pass reads and writes through its block table
    (``view``).  np.zeros leaves untouched pages unmapped, so an unused pool costs no memory."""

    def __init__(self, n_layers: int, n_kv: int, head_dim: int, n_blocks: int, block_size: int):
        self.n_blocks, self.block_size = n_blocks, block_size
        self.k = np.zeros((n_layers, n_blocks * block_size, n_kv, head_dim), np.float32)
        self.v = np.zeros(self.k.shape, np.float32)  # (np.zeros_like writes its zeros: every page resident)

    def view(self, table: np.ndarray) -> "PagedKV":
        return PagedKV(self, np.asarray(table, np.int32))

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


class PagedKV:
    """One sequence's K and V in a NumpyKVPool, through its block table (the NumpyKVCache
    interface: ``write``, ``read``).  ``read`` gathers the positions into a fresh contiguous
    (end, K, hd) array: the same layout a NumpyKVCache hands out, so attention sees the same
    operands either way."""

    def __init__(self, pool: NumpyKVPool, table: np.ndarray):
        self.pool, self.table = pool, table

    def slots(self, start: int, end: int) -> np.ndarray:
        pos = np.arange(start, end)
        bs = self.pool.block_size
        if end > len(self.table) * bs:
            raise ValueError(f"positions up to {end - 1}, but the block table covers {len(self.table) * bs}")
        return self.table[pos // bs].astype(np.int64) * bs + pos % bs

    def write(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> None:
        s = self.slots(start, start + len(k))
        self.pool.k[layer, s] = k
        self.pool.v[layer, s] = v

    def read(self, layer: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        s = self.slots(0, end)
        return self.pool.k[layer, s], self.pool.v[layer, s]


class NumpyRecurrentState:
    """One sequence's gated DeltaNet state, per DeltaNet layer: the conv's last kernel - 1 input
    rows (n, kernel - 1, C) and the delta rule's S (n, Hv, dk, dv), float32, zeros at the start;
    ``pos``: the positions they have consumed.  Unlike a KV cache it cannot be truncated, so the
    runner keeps copies (``snapshot`` / ``restore``) for rollback."""

    def __init__(self, spec: DeltaNetSpec, n_layers: int):
        self.spec, self.n_layers = spec, n_layers
        self.reset()

    def reset(self) -> None:
        s = self.spec
        self.conv = np.zeros((self.n_layers, s.conv_kernel - 1, s.conv_dim), np.float32)
        self.ssm = np.zeros((self.n_layers, s.n_v_heads, s.k_head_dim, s.v_head_dim), np.float32)
        self.pos = 0

    def snapshot(self) -> tuple:
        return self.conv.copy(), self.ssm.copy(), self.pos

    def restore(self, snap: tuple) -> None:
        conv, ssm, self.pos = snap
        self.conv, self.ssm = conv.copy(), ssm.copy()

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.ssm.nbytes


def vocab_map_ref(ids, vocab_size: int) -> np.ndarray:
    """Loader.load_vocab_map: (vocab_size,) int32, the index of each id in ``ids``, else -1."""
    ids = np.asarray(ids, np.int64).reshape(-1)
    if len(ids) and (ids[0] < 0 or ids[-1] >= vocab_size or np.any(np.diff(ids) <= 0)):
        raise ValueError(f"a draft vocabulary is ascending token ids below {vocab_size}")
    out = np.full(vocab_size, -1, np.int32)
    out[ids] = np.arange(len(ids), dtype=np.int32)
    return out


def vocab_expand_ref(logits: np.ndarray, vmap: np.ndarray) -> np.ndarray:
    """ops.vocab_expand (elementwise.cu vocab_expand_rows): (T, n) -> (T, V), -inf outside."""
    logits = np.asarray(logits, np.float32)
    lead = logits.shape[:-1]
    out = np.full((*lead, len(vmap)), -np.inf, np.float32)
    keep = vmap >= 0
    out[..., keep] = logits[..., vmap[keep]]
    return out


def silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1.0) + np.exp(-x))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return np.float32(1.0) / (np.float32(1.0) + np.exp(-x))


def rmsnorm_ref(x: np.ndarray, w: np.ndarray, eps: float, ms: np.ndarray | None = None) -> np.ndarray:
    """x * rsqrt(mean(x^2) + eps) * w over the last axis (Zhang & Sennrich 2019), in x's dtype
    (float32 in the engine; float64 where a check wants an exact reference); ``ms``: the mean
    square where it spans more than x (a QK-norm over heads split among GPUs: numpy_sharded.py)."""
    if ms is None:
        ms = np.mean(x * x, axis=-1, keepdims=True, dtype=x.dtype if x.dtype == np.float64 else np.float32)
    one, e = (1.0, eps) if x.dtype == np.float64 else (np.float32(1.0), np.float32(eps))
    return (x * (one / np.sqrt(ms + e))) * w


def swiglu_ref(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up (Shazeer 2020, GLU variants)."""
    return silu(gate) * up


# The gated DeltaNet's ops (ops.py: causal_conv1d, gated_delta_rule, gated_rmsnorm) as functions of
# arrays, in the inputs' dtype (float32 in the engine; float64 where a check wants an exact
# reference): the specification of kernels/deltanet.cu.

def causal_conv1d_ref(x: np.ndarray, w: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(silu(conv) of the rows x (T, C), the new state): w (C, kernel), state (kernel - 1, C) the
    rows before x; tap by tap, oldest first, each product rounded before its add."""
    T, Kc = len(x), w.shape[1]
    xs = np.concatenate([state, x])  # (kernel - 1 + T, C)
    acc = w[:, 0] * xs[0:T]
    for j in range(1, Kc):
        acc = acc + w[:, j] * xs[j:j + T]
    return silu(acc), xs[T:]


def delta_rule_inputs(qkv: np.ndarray, b: np.ndarray, a: np.ndarray, A: np.ndarray, dt_bias: np.ndarray,
                      spec: DeltaNetSpec) -> tuple:
    """(q, k (T, Hv, dk), v (T, Hv, dv), beta, g (T, Hv)) of ops.gated_delta_rule: q and k
    l2-normalized (q scaled by 1 / sqrt(dk)) and repeated to the value heads, beta = sigmoid(b),
    g = A * softplus(a + dt_bias) (the log of the row's decay)."""
    T, Hk, Hv, dk, dv = len(qkv), spec.n_k_heads, spec.n_v_heads, spec.k_head_dim, spec.v_head_dim
    f = qkv.dtype.type
    q = qkv[:, :Hk * dk].reshape(T, Hk, dk)
    k = qkv[:, Hk * dk:2 * Hk * dk].reshape(T, Hk, dk)
    v = qkv[:, 2 * Hk * dk:].reshape(T, Hv, dv)
    eps = f(1e-6)  # transformers l2norm's (FLA's) eps
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + eps)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + eps)
    q = q * f(1.0 / np.sqrt(dk))
    if spec.v_head_order == "tiled":  # llama.cpp's ggml_repeat: head j <- key head j % Hk
        q, k = np.tile(q, (1, Hv // Hk, 1)), np.tile(k, (1, Hv // Hk, 1))
    else:  # transformers' repeat_interleave: head j <- key head j // (Hv / Hk)
        q, k = np.repeat(q, Hv // Hk, axis=1), np.repeat(k, Hv // Hk, axis=1)
    beta = sigmoid(b)
    x = a + dt_bias  # softplus as torch's (threshold 20)
    g = A * np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))
    return q, k, v, beta, g


def gated_delta_rule_ref(qkv: np.ndarray, b: np.ndarray, a: np.ndarray, A: np.ndarray, dt_bias: np.ndarray,
                         spec: DeltaNetSpec, S: np.ndarray, states: list | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(o (T, Hv * dv), the new S) of ops.gated_delta_rule from the state S (Hv, dk, dv); ``states``
    (a list) receives a copy of S before each row (the CUDA runner's checkpoints)."""
    T, Hv, dv = len(qkv), spec.n_v_heads, spec.v_head_dim
    q, k, v, beta, g = delta_rule_inputs(qkv, b, a, A, dt_bias, spec)
    o = np.empty((T, Hv, dv), qkv.dtype)
    for t in range(T):
        if states is not None:
            states.append(S.copy())
        S = S * np.exp(g[t])[:, None, None]
        kv_mem = (S * k[t][:, :, None]).sum(axis=1)  # S^T k, (Hv, dv)
        delta = (v[t] - kv_mem) * beta[t][:, None]
        S = S + k[t][:, :, None] * delta[:, None, :]
        o[t] = (S * q[t][:, :, None]).sum(axis=1)
    return o.reshape(T, Hv * dv), S


DELTA_CHUNK = 64  # rows per chunk of the chunked form (kernels/deltanet_chunk.cu GDN_CHUNK)


def gated_delta_rule_chunked_ref(qkv: np.ndarray, b: np.ndarray, a: np.ndarray, A: np.ndarray,
                                 dt_bias: np.ndarray, spec: DeltaNetSpec, S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """gated_delta_rule_ref's (o, new S) in the chunked (WY / UT-transform) form of the gated
    delta rule (Yang, Kautz & Hatamizadeh 2024, "Gated Delta Networks", arXiv:2412.06464, sec. 3;
    flash-linear-attention's chunk_gated_delta_rule): the same function of the inputs up to
    rounding, computed per chunk of DELTA_CHUNK rows counted from the first row (the last chunk
    may be shorter), in the inputs' dtype.  Per chunk and head, with S the state before it:
      gam_t = g_1 + ... + g_t (within the chunk), last = the chunk's last row;
      A[t, s] = beta_t exp(gam_t - gam_s) (k_t . k_s) for s < t, else 0;  Tm = (I + A)^-1;
      W = Tm diag(beta exp(gam)) K,  U~ = Tm diag(beta) V        (the row-wise deltas are
      U = U~ - W S: row t's beta_t (v_t - (exp(g_t) S_{t-1})^T k_t), as the recurrence's);
      M[t, s] = exp(gam_t - gam_s) (q_t . k_s) for s <= t, else 0;
      O = diag(exp(gam)) Q S + M U;   S = exp(gam_last) S + K^T diag(exp(gam_last - gam)) U.
    Every exponent is a difference gam_t - gam_s with s <= t (or gam itself): <= 0, no overflow
    however strong the decay.  kernels/deltanet_chunk.cu computes exactly these quantities."""
    T, Hv, dv = len(qkv), spec.n_v_heads, spec.v_head_dim
    q, k, v, beta, g = delta_rule_inputs(qkv, b, a, A, dt_bias, spec)
    o = np.empty((T, Hv, dv), qkv.dtype)
    for c0 in range(0, T, DELTA_CHUNK):
        c1 = min(T, c0 + DELTA_CHUNK)
        n = c1 - c0
        # per head: (Hv, n, .)
        qc, kc, vc = (x[c0:c1].transpose(1, 0, 2) for x in (q, k, v))
        bc, gam = beta[c0:c1].T, np.cumsum(g[c0:c1].T, axis=1)
        lower = np.tril(np.ones((n, n), bool))
        diff = np.where(lower, gam[:, :, None] - gam[:, None, :], 0)  # gam_t - gam_s, s <= t
        decay = np.where(lower, np.exp(diff), 0)
        strict = decay * ~np.eye(n, dtype=bool)
        Am = bc[:, :, None] * strict * (kc @ kc.transpose(0, 2, 1))
        eye = np.eye(n, dtype=qkv.dtype)
        eq = np.exp(gam)  # (Hv, n)
        W = np.linalg.solve(eye + Am, (bc * eq)[:, :, None] * kc)
        Ut = np.linalg.solve(eye + Am, bc[:, :, None] * vc)
        U = Ut - W @ S
        M = decay * (qc @ kc.transpose(0, 2, 1))
        o[c0:c1] = (eq[:, :, None] * (qc @ S) + M @ U).transpose(1, 0, 2)
        ek = np.exp(gam[:, -1:] - gam)
        S = eq[:, -1, None, None] * S + kc.transpose(0, 2, 1) @ (ek[:, :, None] * U)
    return o.reshape(T, Hv * dv), S


def deltanet_columns(y, spec: DeltaNetSpec) -> tuple:
    """ops.deltanet_split on an array with column slicing (NumPy, CuPy): views."""
    c, vd, hv = spec.conv_dim, spec.n_v_heads * spec.v_head_dim, spec.n_v_heads
    if y.shape[-1] != c + vd + 2 * hv:
        raise ValueError(f"a DeltaNet input projection of {c + vd + 2 * hv} columns, got {y.shape}")
    return y[:, :c], y[:, c:c + vd], y[:, c + vd:c + vd + hv], y[:, c + vd + hv:]


def gated_rmsnorm_ref(x: np.ndarray, z: np.ndarray, w: np.ndarray, spec: DeltaNetSpec) -> np.ndarray:
    """rmsnorm(x) * w * silu(z) over each value head of dv (ops.gated_rmsnorm)."""
    T, H, dv = len(x), spec.n_v_heads, spec.v_head_dim
    return (rmsnorm_ref(x.reshape(T, H, dv), w, spec.eps) * silu(z.reshape(T, H, dv))).reshape(T, H * dv)


class ActQuantMatrix(np.ndarray):
    """A dequantized weight matrix whose products follow the integer-dot contract:
    ``linear`` quantizes the activations first (kernel_refs.act_quant_ref), as the CUDA engine
    does for these formats."""


class MixedActMatrix(np.ndarray):
    """A fused matrix whose tensors' formats differ in that contract (a K-quant mix's Q5_0 q, k
    beside a Q8_0 v): ``a8`` marks the rows under it, the others take exact activations, as the
    CUDA engine runs each format's rows on their own (cuda_weights.PartedWeight)."""

    def __array_finalize__(self, obj):
        self.a8 = getattr(obj, "a8", None)


@dataclass
class NumpyExperts:
    """A layer's routed experts, each as the dense MLP's two float32 matrices."""

    gu: list  # E x (2F, D), rows gate_0, up_0, gate_1, up_1, ...
    down: list  # E x (D, F)
    layer: int = 0  # among the MoE layers: the tiers' index
    tiers: object = None  # expert_tiers.ExpertTiers simulating the CUDA tiers' accounting, or None
    first: int = 0  # the layer's index of gu[0]: a GPU holds experts first.. (numpy_sharded.py)


def top_k_by_index(s: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest of each row, largest first, ties to the lower index (a stable
    sort of -s keeps equal values in index order)."""
    return np.argsort(-s, axis=-1, kind="stable")[..., :k]


def exp32(v: np.ndarray) -> np.ndarray:
    """The float32 exponential of the routers: exp in float64, rounded once (correctly rounded
    but for a ~2^-29 chance per value), so that kernels/moe_router.cu (the same in double) gives
    the same bits; NumPy's and CUDA's float32 exp differ by an ulp now and then."""
    return np.exp(np.asarray(v, np.float32).astype(np.float64)).astype(np.float32)


def warp_sum_rows(v: np.ndarray) -> np.ndarray:
    """Sum of each row of v (T, E) float32 in moe_router.cu's order: lane L adds columns L, L+32,
    ... in order from 0.0, then common.cuh warp_sum's xor butterfly (lane i + lane i^16, ^8, ...)."""
    T, E = v.shape
    pad = np.zeros((T, -(-E // 32) * 32), np.float32)
    pad[:, :E] = v
    lanes = np.zeros((T, 32), np.float32)
    for c in range(pad.shape[1] // 32):
        lanes = lanes + pad[:, 32 * c:32 * c + 32]
    for o in (16, 8, 4, 2, 1):
        lanes = lanes[:, :o] + lanes[:, o:2 * o]
    return lanes[:, 0]


def route_logits(logits: np.ndarray, spec: RouterSpec, bias: np.ndarray | None = None):
    """ops.RouterSpec's rule on router logits (T, E) float32: (ids (T, k) int32, weights (T, k)
    float32) in ranking order.  The specification of kernels/moe_router.cu, op for op (exp32,
    warp_sum_rows), so the kernel's ids and weights equal these bit for bit."""
    logits = np.asarray(logits, np.float32)
    if spec.scoring == "softmax":
        e = exp32(logits - logits.max(axis=-1, keepdims=True))
        p = e / warp_sum_rows(e)[:, None]
    else:
        p = np.float32(1.0) / (np.float32(1.0) + exp32(-logits))
    s = p if bias is None else p + bias
    if spec.n_group > 1:  # DeepSeek-V3: only the topk_group best groups (by their top-2 sum) compete
        T, E = s.shape
        sg = s.reshape(T, spec.n_group, E // spec.n_group)
        top2 = np.take_along_axis(sg, top_k_by_index(sg, 2), axis=-1)
        keep = np.zeros((T, spec.n_group), bool)
        np.put_along_axis(keep, top_k_by_index(top2[..., 0] + top2[..., 1], spec.topk_group), True, axis=-1)
        s = np.where(keep[:, :, None], sg, -np.inf).reshape(T, E)
    ids = top_k_by_index(s, spec.top_k)
    w = np.take_along_axis(p, ids, axis=-1)
    if spec.norm_topk_prob:
        total = w[:, 0].copy()
        for j in range(1, spec.top_k):  # in ranking order, as the contract says
            total += w[:, j]
        w = w / total[:, None]
    return ids.astype(np.int32), (w * np.float32(spec.scale)).astype(np.float32)


class NumpyBackend(Loader):
    name = "numpy"
    device_name = "CPU"

    def __init__(self, act_quant: bool = False, act_bf16: bool = False, tiers=None):
        # act_quant=False: exact activations for every format (the specification, and the numbers
        # transformers gives on the dequantized weights); True: the CUDA engine's integer-dot
        # contract for the formats that use it (kernel_refs.act_q8), e.g. for quality figures of
        # what a GPU user gets.  act_bf16: the CUDA engine's opt-in bf16-activation contract, every
        # product's input rounded to bf16 first (before act_quant's codes; common.cuh bf16_round)
        self.act_quant = act_quant
        self.act_bf16 = act_bf16
        self.tiers, self.moe_layers = tiers, 0  # expert_tiers.ExpertTiers: simulated accounting only

    def _matrix(self, rows: np.ndarray, fmts, a8_rows=None) -> np.ndarray:
        """The float32 matrix, under the integer-dot contract where every format takes it; where
        the formats differ in that, a MixedActMatrix (``a8_rows``: the rows whose format does)."""
        w = np.ascontiguousarray(rows, dtype=np.float32)
        a8 = [act_q8(f) for f in fmts]
        if not self.act_quant or not any(a8):
            return w
        if all(a8):
            return w.view(ActQuantMatrix)
        m = w.view(MixedActMatrix)
        m.a8 = np.asarray(a8_rows, bool)
        return m

    def load_linear(self, tensors: list[QTensor], interleave: bool = False, role: str = "") -> np.ndarray:
        parts = [np.asarray(t.dequantize(), np.float32) for t in tensors]  # each (out, in)
        a8 = [act_q8(t.fmt) for t in tensors]
        if interleave:  # gate_0, up_0, gate_1, up_1, ...
            w = np.stack(parts, axis=1).reshape(-1, parts[0].shape[1])
            a8_rows = np.tile(a8, len(parts[0]))
        else:
            w = np.concatenate(parts) if len(parts) > 1 else parts[0]
            a8_rows = np.repeat(a8, [len(p) for p in parts])
        return self._matrix(w, [t.fmt for t in tensors], a8_rows)

    def load_vector(self, tensors: list[QTensor]) -> np.ndarray:
        return np.concatenate([np.asarray(t.dequantize(), np.float32).reshape(-1) for t in tensors])

    def load_embedding(self, t: QTensor) -> np.ndarray:
        return self.load_linear([t])  # (V, D)

    def load_vocab_map(self, ids, vocab_size: int) -> np.ndarray:
        return vocab_map_ref(ids, vocab_size)

    def load_experts(self, gate, up, down, role: str = "experts") -> NumpyExperts:
        E = gate.shape[0]
        self.moe_layers += 1
        return NumpyExperts([self.load_linear([gate.expert(e), up.expert(e)], interleave=True) for e in range(E)],
                            [self.load_linear([down.expert(e)]) for e in range(E)], self.moe_layers - 1, self.tiers)

    def load_conv(self, t: QTensor) -> np.ndarray:
        return np.asarray(t.dequantize(), np.float32).reshape(t.shape[0], -1)  # (C, kernel)

    def new_kv_cache(self, n_layers: int, n_kv: int, head_dim: int, n_ctx: int) -> NumpyKVCache:
        return NumpyKVCache(n_layers, n_kv, head_dim, n_ctx)

    def new_recurrent_state(self, spec: DeltaNetSpec, n_layers: int) -> NumpyRecurrentState:
        return NumpyRecurrentState(spec, n_layers)

    def ops(self, cache: NumpyKVCache, start: int, n_rows: int, eps: float, all_rows: bool = True,
            state: NumpyRecurrentState | None = None, prefill: bool | None = None) -> "NumpyOps":
        """A pass over one sequence's rows start..start+n_rows-1 in ``cache``: prefill rows
        (tiled products) or decode rows (one-row products); by default decode rows for a single
        row, as a decode step, else prefill rows."""
        prefill = n_rows > 1 if prefill is None else prefill
        return self.pass_ops([RowSpan(0, n_rows, start, cache, prefill)], eps, all_rows, state)

    def pass_ops(self, spans: list["RowSpan"], eps: float, all_rows: bool = True,
                 state: NumpyRecurrentState | None = None) -> "NumpyOps":
        """A pass over the rows of ``spans`` (one sequence's, or several: batch_step)."""
        return NumpyOps(self, spans, eps, all_rows, state)


PREFILL_TILE = 64
"""Rows per product of a prefill pass on the NumPy backend.  BLAS picks its kernel, and with it
the order of each dot product's additions, from the product's shape: OpenBLAS uses another kernel
for one row (gemv) and, on some CPUs, for small products (its small-matrix path), so a row's
value could depend on how many rows share its product; and inside one product a row's value may
depend on its slot (OpenBLAS 0.3.31 on AMD EPYC: three classes of slot mod 16).  A prefill pass
therefore runs every product over tiles of exactly PREFILL_TILE rows, each row in the slot of its
position mod PREFILL_TILE (the free slots zero): a row's value then depends only on itself, not
on the chunk it was computed in or on the rows beside it, which is what makes a prompt's K/V the
same whether it was prefilled whole, in chunks of any size, beside other sequences, or taken from
another sequence's cached prefix (kv_pages.py).  Its price, with row-by-row attention: prefill of
128 tokens 17 % slower on SmolLM2 (docs/performance.md)."""


@dataclass
class RowSpan:
    """Rows lo..hi-1 of a pass: one sequence's tokens at positions start.., its K/V in ``kv``
    (NumpyKVCache or PagedKV), prefill rows (tiled products) or decode rows (one-row products)."""

    lo: int
    hi: int
    start: int
    kv: object
    prefill: bool
    all_logits: bool = False  # in a pass that only samples: every row reaches the LM head, not just the last


def one_row_products(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ w^T one row at a time: each row is the product a one-row decode step computes."""
    if len(x) == 1:
        return x @ w.T
    return np.concatenate([x[i:i + 1] @ w.T for i in range(len(x))]) if len(x) else np.zeros((0, w.shape[0]), np.float32)


def tiled_products(x: np.ndarray, w: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """x @ w^T over tiles of PREFILL_TILE rows, row i in slot positions[i] mod PREFILL_TILE of the
    first tile where that slot is free (PREFILL_TILE says why)."""
    R = PREFILL_TILE
    slot = np.asarray(positions, np.int64) % R
    tile = np.empty(len(x), np.int64)  # how many rows before it took the same slot
    seen: dict[int, int] = {}
    for i, sl in enumerate(slot.tolist()):
        tile[i] = seen.get(sl, 0)
        seen[sl] = tile[i] + 1
    out = np.empty((len(x), w.shape[0]), np.float32)
    for t in range(int(tile.max()) + 1 if len(x) else 0):
        rows = np.flatnonzero(tile == t)
        buf = np.zeros((R, x.shape[1]), np.float32)
        buf[slot[rows]] = x[rows]
        out[rows] = (buf @ w.T)[slot[rows]]
    return out


def attend_row(q: np.ndarray, keys: np.ndarray, vals: np.ndarray, spec: AttentionSpec) -> np.ndarray:
    """One row's GQA attention over the S positions it sees: q (H, hd), keys / vals (S, K, hd)
    -> (H * hd,).  Every row of every pass goes through here with S = its own position + 1, so
    its value does not depend on the pass it is in (prefill chunk, decode step or batch)."""
    H, hd = q.shape
    K = spec.n_kv_heads
    s = np.matmul(q.reshape(K, H // K, hd), keys.transpose(1, 2, 0)) * np.float32(spec.scale)  # (K, G, S)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return np.matmul(p, vals.transpose(1, 0, 2)).reshape(H * hd)  # (K, G, hd)


class NumpyOps(Ops):
    """The op set over a pass's rows (bw24chat.ops): one sequence's rows (prefill or a decode
    step), or several sequences' rows at once (``NumpyRunner.batch_step``), as RowSpans.

    Every row's value is independent of the other rows of the pass: elementwise and per-row ops
    are so by construction, a prefill row's products are tiled (PREFILL_TILE), a decode row's
    are one-row products, and attention runs row by row (attend_row).  The LM head of a pass that
    only samples (``all_rows=False``: the last row of each span, every row of a span with
    ``all_logits``) runs one-row products."""

    def __init__(self, backend: NumpyBackend, spans: list[RowSpan], eps: float, all_rows: bool = True,
                 state: NumpyRecurrentState | None = None):
        self.b, self.spans, self.eps, self.all_rows, self.state = backend, spans, eps, all_rows, state
        self.T = spans[-1].hi
        self.positions = np.concatenate([np.arange(sp.start, sp.start + sp.hi - sp.lo) for sp in spans])
        self.prefill_rows = np.concatenate([np.full(sp.hi - sp.lo, sp.prefill) for sp in spans])
        # a single sequence's pass (the runner's prefill / step): its cache and first position
        self.cache, self.start = spans[0].kv, spans[0].start

    def embed(self, table: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return np.asarray(table)[np.asarray(ids, dtype=np.int64)]  # (T, D), a plain array

    def rmsnorm(self, x: np.ndarray, w: np.ndarray, eps: float | None = None) -> np.ndarray:
        return rmsnorm_ref(x, w, self.eps if eps is None else eps)

    def concat(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.concatenate([a, b], axis=-1)

    def products(self, x: np.ndarray, w: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """x @ w^T of rows of this pass (``rows``: their indices in the pass; None: all), after the
        activation contract (bf16 rounding, integer-dot quantization: both per row)."""
        if isinstance(w, MixedActMatrix):  # each format's rows under its own contract
            y = np.empty((len(x), w.shape[0]), np.float32)
            plain = np.asarray(w)
            y[:, w.a8] = self.products(x, np.ascontiguousarray(plain[w.a8]).view(ActQuantMatrix), rows)
            y[:, ~w.a8] = self.products(x, np.ascontiguousarray(plain[~w.a8]), rows)
            return y
        prefill, positions = (self.prefill_rows, self.positions) if rows is None else \
            (self.prefill_rows[rows], self.positions[rows])
        if self.b.act_bf16:
            x = bf16_round(x)
        if isinstance(w, ActQuantMatrix):
            x, w = act_quant_ref(x), w.view(np.ndarray)
        if prefill.all():
            return tiled_products(x, w, positions)
        if not prefill.any():
            return one_row_products(x, w)
        y = np.empty((len(x), w.shape[0]), np.float32)
        y[prefill] = tiled_products(x[prefill], w, positions[prefill])
        y[~prefill] = one_row_products(x[~prefill], w)
        return y

    def linear(self, x: np.ndarray, w: np.ndarray, residual: np.ndarray | None = None) -> np.ndarray:
        y = self.products(x, w)
        return y if residual is None else residual + y

    def swiglu(self, gu: np.ndarray) -> np.ndarray:
        return swiglu_ref(gu[:, 0::2], gu[:, 1::2])

    def rope_kv(self, qkv: np.ndarray, spec: AttentionSpec, layer: int, bias=None, q_norm=None, k_norm=None):
        T, H, K, hd = len(qkv), spec.n_heads, spec.n_kv_heads, spec.head_dim
        if bias is not None:
            qkv = qkv + bias
        qw = 2 * H * hd if spec.output_gate else H * hd  # the q projection's width (with its gate half)
        q, k, v = qkv[:, :qw], qkv[:, qw:qw + K * hd], qkv[:, qw + K * hd:]
        if spec.output_gate:  # per head [q | gate] (ops.AttentionSpec)
            q = q.reshape(T, H, 2, hd)[:, :, 0].reshape(T, H * hd)
        if q_norm is not None and spec.qk_norm == "full":  # MiniMax-M2: over the whole projections
            q, k = self.rmsnorm(q, q_norm, spec.eps), self.rmsnorm(k, k_norm, spec.eps)
        q, k, v = q.reshape(T, H, hd), k.reshape(T, K, hd), v.reshape(T, K, hd)
        if q_norm is not None and spec.qk_norm == "head":  # Qwen3: RMSNorm over each head before RoPE
            q, k = self.rmsnorm(q, q_norm, spec.eps), self.rmsnorm(k, k_norm, spec.eps)
        q = apply_rope(q, self.positions, spec.rope)
        k = apply_rope(k, self.positions, spec.rope)
        for sp in self.spans:
            sp.kv.write(layer, sp.start, k[sp.lo:sp.hi], v[sp.lo:sp.hi])
        return q

    def attention(self, q: np.ndarray, spec: AttentionSpec, layer: int) -> np.ndarray:
        T, H, hd = q.shape
        out = np.empty((T, H * hd), np.float32)
        for sp in self.spans:
            keys, vals = sp.kv.read(layer, sp.start + sp.hi - sp.lo)
            for i in range(sp.lo, sp.hi):
                n = sp.start + i - sp.lo + 1  # the row sees positions 0..its own
                out[i] = attend_row(q[i], keys[:n], vals[:n], spec)
        return out

    def output_gate(self, o: np.ndarray, qkv: np.ndarray, spec: AttentionSpec) -> np.ndarray:
        H, hd = spec.n_heads, spec.head_dim
        gate = qkv[:, :2 * H * hd].reshape(len(qkv), H, 2, hd)[:, :, 1].reshape(len(qkv), H * hd)
        return o * sigmoid(gate)

    def deltanet_split(self, y: np.ndarray, spec: DeltaNetSpec) -> tuple:
        return deltanet_columns(y, spec)

    def causal_conv1d(self, x: np.ndarray, w: np.ndarray, spec: DeltaNetSpec, layer: int) -> np.ndarray:
        out, self.state.conv[layer] = causal_conv1d_ref(x, w, self.state.conv[layer])
        return out

    def gated_delta_rule(self, qkv: np.ndarray, b: np.ndarray, a: np.ndarray, A: np.ndarray, dt_bias: np.ndarray,
                         spec: DeltaNetSpec, layer: int) -> np.ndarray:
        o, self.state.ssm[layer] = gated_delta_rule_ref(qkv, b, a, A, dt_bias, spec, self.state.ssm[layer])
        return o

    def gated_rmsnorm(self, x: np.ndarray, z: np.ndarray, w: np.ndarray, spec: DeltaNetSpec) -> np.ndarray:
        return gated_rmsnorm_ref(x, z, w, spec)

    def router(self, x: np.ndarray, gate: np.ndarray, spec: RouterSpec, bias: np.ndarray | None = None):
        return route_logits(self.linear(x, gate), spec, bias)  # logits (T, E) float32

    def experts(self, x: np.ndarray, ids: np.ndarray, weights: np.ndarray, experts: NumpyExperts,
                residual: np.ndarray, shared=None) -> np.ndarray:
        T, k = ids.shape
        if experts.tiers is not None:  # the CUDA tiers' accounting: a decode pass goes through the slot
            tiers, layer = experts.tiers, experts.layer  # cache, a prefill chunk streams past it (cuda_tiers)
            if T * k <= tiers.plan.vram_slots[layer]:
                tiers.route(layer, ids, T)
            else:
                tiers.lookup(layer, np.unique(ids).tolist(), set(tiers.cache.resident(layer)))
        # y[t, j]: expert ids[t, j] on row t; zeros where another GPU holds it (numpy_sharded.py),
        # which the ranking-order sum below then passes over exactly (acc + w * 0 = acc)
        y = np.zeros((T, k, x.shape[-1]), np.float32)
        here = ids[(ids >= experts.first) & (ids < experts.first + len(experts.gu))]
        for e in np.unique(here):  # the rows each selected expert serves, in one product
            rows, slots = np.nonzero(ids == e)
            i = e - experts.first
            y[rows, slots] = self.products(self.swiglu(self.products(x[rows], experts.gu[i], rows)), experts.down[i], rows)
        acc = weights[:, 0:1] * y[:, 0]
        for j in range(1, k):  # ranking order; each product rounded before its add (NumPy never fuses)
            acc = acc + weights[:, j:j + 1] * y[:, j]
        if shared is not None:
            gu, down, gate = shared
            out = self.linear(self.swiglu(self.linear(x, gu)), down)
            if gate is not None:  # Qwen2-MoE: sigmoid(x . gate) scales the shared expert
                out = out * sigmoid(self.products(x, gate[None, :]))
            acc = acc + out
        return residual + acc

    def lm_head(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        if self.all_rows:
            return self.linear(x, w)
        rows = [i for sp in self.spans for i in (range(sp.lo, sp.hi) if sp.all_logits else [sp.hi - 1])]
        return one_row_products(x[rows], w)

    def vocab_expand(self, logits: np.ndarray, vmap: np.ndarray) -> np.ndarray:
        return vocab_expand_ref(logits, vmap)


class NumpyRunner:
    """The reference runner (the interface: backends/runner.py): a model on the NumPy backend,
    its KV cache, host sampling (bw24chat.sampling, the specification of the device sampler)."""

    state_checkpoints = True  # a hybrid model's recurrent state is copied at every step row (speculative.make_drafter)

    def __init__(self, model, backend: NumpyBackend | None = None):
        self.model = model
        self.backend = backend or NumpyBackend()
        a = self.args = model.args
        self.cache = self.backend.new_kv_cache(model.n_kv_layers, a.num_key_value_heads, a.head_dim, model.n_ctx)
        # hybrid models (gated DeltaNet layers): the recurrent state, the copies of it before and
        # after each row of the latest step (position -> snapshot, for an exact rollback of a
        # speculative verify), and the ids at positions 0.. (to recompute the state for any other
        # rollback)
        self.state = self.backend.new_recurrent_state(model.deltanet, model.n_state_layers) if model.deltanet else None
        self._snaps: dict[int, tuple] = {}
        self._ids: list[int] = []
        self._passes: list[tuple[int, int, bool]] = []  # (start, rows, prefill) of every pass the state consumed
        self.n_ctx = model.n_ctx
        self.vocab_size = a.vocab_size
        self._logits = np.zeros((1, a.vocab_size), np.float32)
        self._hidden = np.zeros((1, a.hidden_size), np.float32)
        self.mtp = getattr(model, "mtp", None)  # models/mtp.py MTPHead, or None
        # the head's own KV cache: one layer, positions as the trunk's
        self.mtp_cache = self.backend.new_kv_cache(1, a.num_key_value_heads, a.head_dim, model.n_ctx) if self.mtp else None
        # batched steps (runner.py: batch_step) over the paged pool; a recurrent state is one
        # sequence's, so hybrid models run one sequence at a time
        self.max_batch = 1 if self.state is not None else NUMPY_MAX_BATCH
        self.pool: NumpyKVPool | None = None

    def forward(self, ids, start: int, all_rows: bool = False, prefill: bool | None = None) -> np.ndarray:
        """Run ``ids`` at positions start.. as prefill rows or decode rows (``prefill``; by default
        decode rows for one id, as a decode step, else prefill rows); logits (T, V) with
        all_rows, else (1, V) of the last."""
        ids = np.asarray(ids)
        prefill = len(ids) > 1 if prefill is None else prefill
        if self.state is not None:
            if start > self.state.pos:
                raise ValueError(f"a pass at position {start}, but the recurrent state holds {self.state.pos} positions")
            self.rollback(start)  # a pass that does not continue the state: rewind it first
            self._snaps = {p: v for p, v in self._snaps.items() if p <= start}
            self._ids[start:] = [int(t) for t in ids]
            self._passes.append((start, len(ids), prefill))
        ops = self.backend.ops(self.cache, start, len(ids), self.args.rms_norm_eps, all_rows, self.state, prefill)
        self._hidden = self.model.trunk(ops, ids)
        self._logits = self.model.logits(ops, self._hidden)
        if self.state is not None:
            self.state.pos = start + len(ids)
        return self._logits

    def prefill(self, ids, start: int, params: SamplingParams | None = None, seed: int = 0,
                history: list[int] = ()) -> int | None:
        self.forward(ids, start, prefill=True)
        if params is None:
            return None
        return sample_token(self._logits[-1], params, seed, start + len(ids), [*history, *map(int, ids)])

    def prefill_logits(self, ids, start: int, chunk: int | None = None) -> np.ndarray:
        """Logits at every position (T, V) (checks, perplexity); ``chunk`` rows per pass."""
        chunk = chunk or max(len(ids), 1)
        return np.concatenate([self.forward(ids[s:s + chunk], start + s, all_rows=True, prefill=True)
                               for s in range(0, len(ids), chunk)])

    def step(self, tokens, start: int, params: SamplingParams, seed: int, history: list[int]) -> list[int]:
        # one pass per row: a hybrid model's recurrent state is copied after each (rollback)
        tokens = [int(t) for t in tokens]
        if self.state is not None and start <= self.state.pos:  # the state before row 0 as well: a rollback
            self.rollback(start)  # to any position the step covers is a restore (forward would rewind too)
            self._snaps = {start: self.state.snapshot()}
        logits, hidden = [], []
        for i, t in enumerate(tokens):
            logits.append(self.forward([t], start + i, prefill=False))
            hidden.append(self._hidden)
            if self.state is not None:  # the state after row i: rollback(start + i + 1) restores it
                self._snaps[start + i + 1] = self.state.snapshot()
        self._logits, self._hidden = np.concatenate(logits), np.concatenate(hidden)
        return [sample_token(self._logits[i], params, seed, start + i + 1, [*history, *tokens[:i + 1]]) for i in range(len(tokens))]

    def last_logits(self) -> np.ndarray:
        return self._logits

    def last_hidden(self) -> np.ndarray:
        """(m, D): the trunk's last-layer output of each row of the last prefill / step, before
        the final norm (what the MTP head pairs with the next token: models/mtp.py)."""
        return self._hidden

    def mtp_forward(self, ids, hidden, start: int, from_trunk: bool) -> tuple[np.ndarray, np.ndarray]:
        """The MTP head over rows pairing ``ids`` with ``hidden`` at positions start.. (its own KV
        cache; positions >= start are overwritten): (logits (V,) of the last row, g (D,) of the
        last row)."""
        ids = np.asarray(ids)
        ops = self.backend.ops(self.mtp_cache, start, len(ids), self.args.rms_norm_eps, all_rows=False)
        logits, g = self.mtp.forward(ops, ids, np.asarray(hidden, np.float32), from_trunk)
        return logits[-1], g[-1]

    def mtp_draft(self, ids, hidden, start: int, k: int, params: SamplingParams | None, seed: int,
                  history: list[int]) -> list[int]:
        """k drafts from the MTP head (backends/runner.py): the catch-up rows, then k - 1 rows
        chained on the head's own g; draft j is the token at position p = start + len(ids) + 1 + j,
        drawn as the trunk draws its token there (sample_token keyed by seed and p, the history
        and the drafts before it)."""
        params = params or SamplingParams(temperature=0)
        logits, g = self.mtp_forward(ids, hidden, start, True)
        p = start + len(ids) + 1
        drafts: list[int] = []
        for j in range(k):
            drafts.append(sample_token(logits, params, seed, p + j, [*history, *drafts]))
            if j + 1 < k:
                logits, g = self.mtp_forward([drafts[-1]], g[None], p - 1 + j, False)
        return drafts

    def rollback(self, n: int) -> None:
        """Positions >= n are stale; the KV cache's are overwritten before anything reads them
        again.  A recurrent state has no positions to drop: it is restored to the copy taken
        at position n in the latest step (the speculative verify's case), or else
        recomputed from the ids at positions 0..n-1, replaying the passes that consumed them, cut
        at n (bit for bit: a prefill row's value does not depend on its pass, PREFILL_TILE)."""
        st = self.state
        if st is None or n >= st.pos:  # nothing the state consumed is stale
            return
        passes = [(s, min(s + m, n) - s, pre) for s, m, pre in self._passes if s < n]
        if n in self._snaps:
            st.restore(self._snaps[n])
            self._passes = passes
            return
        logits, ids = self._logits, self._ids[:n]  # (each replayed pass truncates self._ids after it)
        st.reset()
        self._snaps, self._passes = {}, []
        for s, m, pre in passes:
            self.forward(ids[s:s + m], s, prefill=pre)
        self._logits = logits

    # ------------------------------------------------------------------ batched steps (runner.py)
    block_size = 16  # positions per KV block of the paged pool

    def kv_block_bytes(self) -> int:
        a = self.args
        return 2 * self.model.n_kv_layers * self.block_size * a.num_key_value_heads * a.head_dim * 4

    def init_kv_pool(self, n_blocks: int) -> None:
        a = self.args
        self.pool = NumpyKVPool(self.model.n_kv_layers, a.num_key_value_heads, a.head_dim, n_blocks, self.block_size)

    def batch_step(self, work: list[SeqWork]) -> list[list[int]]:
        """One pass over every work item's rows (runner.py); each item's values equal its solo
        pass bit for bit, as every row of a NumpyOps pass is independent of the others."""
        if not 1 <= len(work) <= self.max_batch:
            raise ValueError(f"a batched step of {len(work)} sequences; this runner takes 1..{self.max_batch}")
        spans, lo = [], 0
        for w in work:
            spans.append(RowSpan(lo, lo + len(w.ids), w.start, self.pool.view(w.table), w.prefill, w.sample_all))
            lo += len(w.ids)
        ids = np.concatenate([np.asarray(w.ids, np.int64) for w in work])
        ops = self.backend.pass_ops(spans, self.args.rms_norm_eps, all_rows=False)
        self._hidden = self.model.trunk(ops, ids)
        logits = self.model.logits(ops, self._hidden)  # the rows that reach the LM head, items in order
        out, r, keep = [], 0, []
        for w in work:
            ids_w = [int(t) for t in w.ids]
            rows = range(len(ids_w)) if w.sample_all else [len(ids_w) - 1]
            if w.params is None:
                out.append([])
            else:
                out.append([sample_token(logits[r + j], w.params, w.seed, w.start + i + 1, [*w.history, *ids_w[:i + 1]])
                            for j, i in enumerate(rows)])
                keep.extend(range(r, r + len(rows)))
            r += len(rows)
        self._logits = logits[keep]
        return out

    def memory_info(self) -> dict:
        return {"kv_bytes": self.cache.nbytes, **({"state_bytes": self.state.nbytes} if self.state is not None else {})}

    def expert_stats(self) -> dict:
        """The simulated tiers' ExpertStats (empty unless a budget spilled experts)."""
        t = self.backend.tiers
        return t.stats.as_dict() if t is not None else {}


def numpy_runner(checkpoint, n_ctx: int = 0, backend: NumpyBackend | None = None, progress=None) -> NumpyRunner:
    """A checkpoint's model on the NumPy backend, ready to run."""
    from ..models import build_model

    backend = backend or NumpyBackend()
    return NumpyRunner(build_model(checkpoint, backend, n_ctx, progress), backend)
