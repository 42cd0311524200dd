"""The NumPy reference backend (float32).

This is the specification every CUDA kernel is checked against, so it is kept plain: each op
is the textbook formula in float32.  It also serves users without an NVIDIA GPU
(``--device cpu``): weights are dequantized to float32 once at load so that each matrix product
is one BLAS call.

Shape legend: T tokens in the step, D model width, H query heads, K kv heads, G = H/K,
hd head dim, S cached positions, F ffn width, V vocabulary.
"""
from __future__ import annotations

import numpy as np

from ..loaders.tensor import QTensor
from ..rope import RopeTable, apply_rope
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


class ActQuantMatrix(np.ndarray):
    """A dequantized weight matrix whose products follow the integer-dot contract:
    ``linear`` quantizes the activations first (kernel_refs.act_quant_ref), as the CUDA engine
    does for these formats."""


class NumpyBackend:
    name = "numpy"
    device_name = "CPU"

    def __init__(self, act_quant: bool = False, act_bf16: bool = False):
        # act_quant=False: exact activations for every format (the specification, and the numbers
        # transformers gives on the dequantized weights); True: the CUDA engine's integer-dot
        # contract for the formats that use it (kernel_refs.act_q8), e.g. for quality figures of
        # what a GPU user gets.  act_bf16: the CUDA engine's opt-in bf16-activation contract, every
        # product's input rounded to bf16 first (before act_quant's codes; common.cuh bf16_round)
        self.act_quant = act_quant
        self.act_bf16 = act_bf16

    # -- weights
    def load_matrix(self, t: QTensor) -> np.ndarray:
        w = np.ascontiguousarray(t.dequantize(), dtype=np.float32)  # (out, in)
        return w.view(ActQuantMatrix) if self.act_quant and act_q8(t.fmt) else w

    def load_vector(self, t: QTensor) -> np.ndarray:
        return np.ascontiguousarray(t.dequantize(), dtype=np.float32).reshape(-1)

    def load_embedding(self, t: QTensor) -> np.ndarray:
        return self.load_matrix(t)  # (V, D)

    def new_kv_cache(self, n_layers: int, n_kv: int, head_dim: int, n_ctx: int) -> NumpyKVCache:
        return NumpyKVCache(n_layers, n_kv, head_dim, n_ctx)

    # -- ops
    def embed(self, table: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return np.asarray(table)[np.asarray(ids, dtype=np.int64)]  # (T, D), a plain array

    def rmsnorm(self, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        """x * rsqrt(mean(x^2) + eps) * w over the last axis (Zhang & Sennrich 2019)."""
        ms = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
        return (x * (np.float32(1.0) / np.sqrt(ms + np.float32(eps)))) * w

    def linear(self, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        """(T, in) @ (out, in)^T -> (T, out)."""
        if self.act_bf16:
            x = bf16_round(x)
        if isinstance(w, ActQuantMatrix):
            x, w = act_quant_ref(x), w.view(np.ndarray)
        y = x @ w.T
        return y + bias if bias is not None else y

    def rope(self, x: np.ndarray, positions: np.ndarray, table: RopeTable) -> np.ndarray:
        return apply_rope(x, positions, table)

    def swiglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        """silu(gate) * up (Shazeer 2020, GLU variants)."""
        return gate / (np.float32(1.0) + np.exp(-gate)) * up

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a + b

    def attention(self, q, k, v, cache: NumpyKVCache, layer: int, start: int, scale: float) -> np.ndarray:
        """Causal GQA attention of T new queries at positions start..start+T-1 over the cache.

        q: (T, H, hd), k/v: (T, K, hd) are written to the cache first.  Returns (T, H*hd)."""
        T, H, hd = q.shape
        K = k.shape[1]
        G = H // K
        end = start + T
        cache.ensure(end)
        cache.k[layer, start:end] = k
        cache.v[layer, start:end] = v
        keys = cache.k[layer, :end]  # (S, K, hd)
        vals = cache.v[layer, :end]
        qg = q.reshape(T, K, G, hd).transpose(1, 2, 0, 3).reshape(K, G * T, hd)  # (K, G*T, hd)
        s = np.matmul(qg, keys.transpose(1, 2, 0)) * np.float32(scale)  # (K, G*T, S)
        s = s.reshape(K, G, T, end)
        causal = np.arange(end)[None, :] > (start + np.arange(T))[:, None]  # (T, S)
        s[:, :, causal] = -np.inf
        s = s - s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=-1, keepdims=True)
        o = np.matmul(p.reshape(K, G * T, end), vals.transpose(1, 0, 2))  # (K, G*T, hd)
        return o.reshape(K, G, T, hd).transpose(2, 0, 1, 3).reshape(T, H * hd)

    def to_host(self, x) -> np.ndarray:
        return x

    def memory_info(self) -> dict:
        return {}
