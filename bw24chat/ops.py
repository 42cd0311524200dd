"""The op set: what an architecture may call, and what every backend implements.

A model file (``models/*.py``) writes its forward pass once, as calls on an ``Ops`` object; the
NumPy backend (``backends/numpy_backend.py``, the reference) and the CUDA backend
(``backends/cuda_runner.py``) each implement these ops.  A CUDA implementation may defer an op
and fuse it into the next one (rmsnorm into the following matvec's prologue, swiglu into the
gate|up matvec's epilogue, the residual add into the output projection's epilogue), so a model
must use values only through further op calls, never look inside them.

An ``Ops`` object is bound to one forward pass: the rows it runs (T tokens at positions
``start .. start + T - 1`` of one sequence, prefill or a decode step of m rows) and the KV
cache it writes.  Weights are loaded through the backend's ``load_*`` methods (below), which a
model calls once at load.

Shape legend: T rows, D width, H query heads, K kv heads, hd head dim, F ffn width, V vocabulary.
"""
from __future__ import annotations

from dataclasses import dataclass

from .rope import RopeTable


@dataclass(frozen=True)
class AttentionSpec:
    """What the attention ops need to know of a layer's attention (the same for every layer of
    the dense families)."""

    n_heads: int
    n_kv_heads: int
    head_dim: int
    eps: float  # of the per-head QK-norm
    rope: RopeTable
    scale: float  # softmax scale, 1/sqrt(hd) unless the family says otherwise


class Loader:
    """Weight loading, called by a model once (the backend decides the resident layout)."""

    def load_linear(self, tensors: list, interleave: bool = False, role: str = ""):
        """One matrix whose rows are the given tensors' rows, stacked (q | k | v), or with
        ``interleave`` taken alternately from two tensors (gate_0, up_0, gate_1, up_1, ...: the
        layout ``swiglu`` reads).  ``role`` names the matrix's place in the block (qkv, o, gu,
        down, lm_head) for buffers, plans and profiles."""
        raise NotImplementedError

    def load_vector(self, tensors: list):
        """A float32 vector: the given tensors concatenated (norm weights, q|k|v biases)."""
        raise NotImplementedError

    def load_embedding(self, tensor):
        raise NotImplementedError


class Ops:
    """One forward pass over T rows.  Values are backend objects; see the module docstring."""

    def embed(self, table, ids):
        """(T, D): rows ``ids`` of the embedding table (ids are the pass's tokens)."""
        raise NotImplementedError

    def rmsnorm(self, x, w):
        """x * rsqrt(mean(x^2) + eps) * w over the last axis (Zhang & Sennrich 2019); eps is the
        model's, fixed when the Ops object is made."""
        raise NotImplementedError

    def linear(self, x, w, residual=None):
        """x @ w^T, (T, in) -> (T, out); with ``residual``: residual + x @ w^T, and the result
        replaces ``residual`` (callers must not use the old value afterwards)."""
        raise NotImplementedError

    def swiglu(self, gu):
        """silu(gate) * up over the interleaved pairs of ``gu`` (T, 2F) -> (T, F) (Shazeer 2020)."""
        raise NotImplementedError

    def rope_kv(self, qkv, spec: AttentionSpec, layer: int, bias=None, q_norm=None, k_norm=None):
        """The attention prologue of (T, (H + 2K) * hd) fused projections: add ``bias``, RMSNorm
        each head of q and k (``q_norm`` / ``k_norm``, both or neither: Qwen3), rotate q and k
        (RoPE at the pass's positions), write k and v into the cache of ``layer``.  Returns q
        (T, H, hd)."""
        raise NotImplementedError

    def attention(self, q, spec: AttentionSpec, layer: int):
        """Causal GQA attention of the pass's rows over the cache of ``layer`` (every position
        up to each row's own): (T, H, hd) -> (T, H * hd)."""
        raise NotImplementedError

    def lm_head(self, x, w):
        """Logits (T, V) of the final hidden states (already normed)."""
        raise NotImplementedError
