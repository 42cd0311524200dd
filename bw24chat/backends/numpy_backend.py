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


class NumpyKVCache:
    """Per-layer K and V, (n_layers, capacity, K, hd) float32, grown by doubling."""

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

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


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


def silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1.0) + np.exp(-x))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return np.float32(1.0) / (np.float32(1.0) + np.exp(-x))


def rmsnorm_ref(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x * rsqrt(mean(x^2) + eps) * w over the last axis (Zhang & Sennrich 2019), in x's dtype
    (float32 in the engine; float64 where a check wants an exact reference)."""
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


def gated_delta_rule_ref(qkv: np.ndarray, b: np.ndarray, a: np.ndarray, A: np.ndarray, dt_bias: np.ndarray,
                         spec: DeltaNetSpec, S: np.ndarray, states: list | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(o (T, Hv * dv), the new S) of ops.gated_delta_rule from the state S (Hv, dk, dv); ``states``
    (a list) receives a copy of S before each row (the CUDA runner's checkpoints)."""
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


def gated_rmsnorm_ref(x: np.ndarray, z: np.ndarray, w: np.ndarray, spec: DeltaNetSpec) -> np.ndarray:
    """rmsnorm(x) * w * silu(z) over each value head of dv (ops.gated_rmsnorm)."""
    T, H, dv = len(x), spec.n_v_heads, spec.v_head_dim
    return (rmsnorm_ref(x.reshape(T, H, dv), w, spec.eps) * silu(z.reshape(T, H, dv))).reshape(T, H * dv)


class ActQuantMatrix(np.ndarray):
    """A dequantized weight matrix whose products follow the integer-dot contract:
    ``linear`` quantizes the activations first (kernel_refs.act_quant_ref), as the CUDA engine
    does for these formats."""


@dataclass
class NumpyExperts:
    """A layer's routed experts, each as the dense MLP's two float32 matrices."""

    gu: list  # E x (2F, D), rows gate_0, up_0, gate_1, up_1, ...
    down: list  # E x (D, F)
    layer: int = 0  # among the MoE layers: the tiers' index
    tiers: object = None  # expert_tiers.ExpertTiers simulating the CUDA tiers' accounting, or None


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

    def _matrix(self, rows: np.ndarray, fmts) -> np.ndarray:
        w = np.ascontiguousarray(rows, dtype=np.float32)
        return w.view(ActQuantMatrix) if self.act_quant and all(act_q8(f) for f in fmts) else w

    def load_linear(self, tensors: list[QTensor], interleave: bool = False, role: str = "") -> np.ndarray:
        parts = [np.asarray(t.dequantize(), np.float32) for t in tensors]  # each (out, in)
        if interleave:  # gate_0, up_0, gate_1, up_1, ...
            w = np.stack(parts, axis=1).reshape(-1, parts[0].shape[1])
        else:
            w = np.concatenate(parts) if len(parts) > 1 else parts[0]
        return self._matrix(w, [t.fmt for t in tensors])

    def load_vector(self, tensors: list[QTensor]) -> np.ndarray:
        return np.concatenate([np.asarray(t.dequantize(), np.float32).reshape(-1) for t in tensors])

    def load_embedding(self, t: QTensor) -> np.ndarray:
        return self.load_linear([t])  # (V, D)

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
            state: NumpyRecurrentState | None = None) -> "NumpyOps":
        return NumpyOps(self, cache, start, n_rows, eps, all_rows, state)


class NumpyOps(Ops):
    """The op set over T rows at positions start..start+T-1 (bw24chat.ops)."""

    def __init__(self, backend: NumpyBackend, cache: NumpyKVCache, start: int, n_rows: int, eps: float,
                 all_rows: bool = True, state: NumpyRecurrentState | None = None):
        self.b, self.cache, self.start, self.T, self.eps, self.all_rows = backend, cache, start, n_rows, eps, all_rows
        self.state = state
        self.positions = np.arange(start, start + n_rows)

    def embed(self, table: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return np.asarray(table)[np.asarray(ids, dtype=np.int64)]  # (T, D), a plain array

    def rmsnorm(self, x: np.ndarray, w: np.ndarray, eps: float | None = None) -> np.ndarray:
        return rmsnorm_ref(x, w, self.eps if eps is None else eps)

    def concat(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.concatenate([a, b], axis=-1)

    def linear(self, x: np.ndarray, w: np.ndarray, residual: np.ndarray | None = None) -> np.ndarray:
        if self.b.act_bf16:
            x = bf16_round(x)
        if isinstance(w, ActQuantMatrix):
            x, w = act_quant_ref(x), w.view(np.ndarray)
        y = x @ w.T
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
        end = self.start + T
        self.cache.ensure(end)
        self.cache.k[layer, self.start:end] = k
        self.cache.v[layer, self.start:end] = v
        return q

    def attention(self, q: np.ndarray, spec: AttentionSpec, layer: int) -> np.ndarray:
        T, H, hd = q.shape
        K = spec.n_kv_heads
        G = H // K
        start, end = self.start, self.start + T
        keys = self.cache.k[layer, :end]  # (S, K, hd)
        vals = self.cache.v[layer, :end]
        qg = q.reshape(T, K, G, hd).transpose(1, 2, 0, 3).reshape(K, G * T, hd)  # (K, G*T, hd)
        s = np.matmul(qg, keys.transpose(1, 2, 0)) * np.float32(spec.scale)  # (K, G*T, S)
        s = s.reshape(K, G, T, end)
        causal = np.arange(end)[None, :] > (start + np.arange(T))[:, None]  # (T, S)
        s[:, :, causal] = -np.inf
        s = s - s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=-1, keepdims=True)
        o = np.matmul(p.reshape(K, G * T, end), vals.transpose(1, 0, 2))  # (K, G*T, hd)
        return o.reshape(K, G, T, hd).transpose(2, 0, 1, 3).reshape(T, H * hd)

    def output_gate(self, o: np.ndarray, qkv: np.ndarray, spec: AttentionSpec) -> np.ndarray:
        H, hd = spec.n_heads, spec.head_dim
        gate = qkv[:, :2 * H * hd].reshape(len(qkv), H, 2, hd)[:, :, 1].reshape(len(qkv), H * hd)
        return o * sigmoid(gate)

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
        y = np.empty((T, k, x.shape[-1]), np.float32)  # y[t, j]: expert ids[t, j] on row t
        for e in np.unique(ids):  # the rows each selected expert serves, in one product
            rows, slots = np.nonzero(ids == e)
            y[rows, slots] = self.linear(self.swiglu(self.linear(x[rows], experts.gu[e])), experts.down[e])
        acc = weights[:, 0:1] * y[:, 0]
        for j in range(1, k):  # ranking order; each product rounded before its add (NumPy never fuses)
            acc = acc + weights[:, j:j + 1] * y[:, j]
        if shared is not None:
            gu, down, gate = shared
            out = self.linear(self.swiglu(self.linear(x, gu)), down)
            if gate is not None:  # Qwen2-MoE: sigmoid(x . gate) scales the shared expert
                out = out * sigmoid(x @ gate)[:, None]
            acc = acc + out
        return residual + acc

    def lm_head(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return self.linear(x if self.all_rows else x[-1:], w)


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
        self._passes: list[tuple[int, int]] = []  # (start, rows) of every pass the state consumed
        self.n_ctx = model.n_ctx
        self.vocab_size = a.vocab_size
        self._logits = np.zeros((1, a.vocab_size), np.float32)
        self._hidden = np.zeros((1, a.hidden_size), np.float32)
        self.mtp = getattr(model, "mtp", None)  # models/mtp.py MTPHead, or None
        # the head's own KV cache: one layer, positions as the trunk's
        self.mtp_cache = self.backend.new_kv_cache(1, a.num_key_value_heads, a.head_dim, model.n_ctx) if self.mtp else None

    def forward(self, ids, start: int, all_rows: bool = False) -> np.ndarray:
        """Run ``ids`` at positions start..; logits (T, V) with all_rows, else (1, V) of the last."""
        ids = np.asarray(ids)
        if self.state is not None:
            if start > self.state.pos:
                raise ValueError(f"a pass at position {start}, but the recurrent state holds {self.state.pos} positions")
            self.rollback(start)  # a pass that does not continue the state: rewind it first
            self._snaps = {p: v for p, v in self._snaps.items() if p <= start}
            self._ids[start:] = [int(t) for t in ids]
            self._passes.append((start, len(ids)))
        ops = self.backend.ops(self.cache, start, len(ids), self.args.rms_norm_eps, all_rows, self.state)
        self._hidden = self.model.trunk(ops, ids)
        self._logits = self.model.logits(ops, self._hidden)
        if self.state is not None:
            self.state.pos = start + len(ids)
        return self._logits

    def prefill(self, ids, start: int, params: SamplingParams | None = None, seed: int = 0,
                history: list[int] = ()) -> int | None:
        self.forward(ids, start)
        if params is None:
            return None
        return sample_token(self._logits[-1], params, seed, start + len(ids), [*history, *map(int, ids)])

    def prefill_logits(self, ids, start: int, chunk: int | None = None) -> np.ndarray:
        """Logits at every position (T, V) (checks, perplexity); ``chunk`` rows per pass."""
        chunk = chunk or max(len(ids), 1)
        return np.concatenate([self.forward(ids[s:s + chunk], start + s, all_rows=True) for s in range(0, len(ids), chunk)])

    def step(self, tokens, start: int, params: SamplingParams, seed: int, history: list[int]) -> list[int]:
        # one row at a time: BLAS products over several rows may round differently from one row,
        # and each row must equal a one-row step bit for bit (runner.py)
        tokens = [int(t) for t in tokens]
        if self.state is not None and start <= self.state.pos:  # the state before row 0 as well: a rollback
            self.rollback(start)  # to any position the step covers is a restore (forward would rewind too)
            self._snaps = {start: self.state.snapshot()}
        logits, hidden = [], []
        for i, t in enumerate(tokens):
            logits.append(self.forward([t], start + i))
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
        recomputed from the ids at positions 0..n-1, replaying the passes that consumed them (so
        bit for bit, unless n splits a multi-row pass: then up to the rounding of its products)."""
        st = self.state
        if st is None or n >= st.pos:  # nothing the state consumed is stale
            return
        passes = [(s, min(s + m, n) - s) for s, m in self._passes if s < n]
        if n in self._snaps:
            st.restore(self._snaps[n])
            self._passes = passes
            return
        logits, ids = self._logits, self._ids[:n]  # (each replayed pass truncates self._ids after it)
        st.reset()
        self._snaps, self._passes = {}, []
        for s, m in passes:
            self.forward(ids[s:s + m], s)
        self._logits = logits

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
