"""The op set: what an architecture may call, and what every backend implements.

A model file (``models/*.py``) writes its forward pass once, as calls on an ``Ops`` object; the
NumPy backend (``backends/numpy_backend.py``, the reference) and the CUDA backend
(``backends/cuda_opset.py``) each implement these ops.  A CUDA implementation may defer an op
and fuse it into the next one (rmsnorm into the following matvec's prologue, swiglu into the
gate|up matvec's epilogue, the residual add into the output projection's epilogue), so a model
must use values only through further op calls, never look inside them.

An ``Ops`` object is bound to one forward pass: the rows it runs (T tokens at positions
``start .. start + T - 1`` of one sequence, prefill or a decode step of m rows) and the KV
cache it writes.  Weights are loaded through the backend's ``load_*`` methods (below), which a
model calls once at load.

Shape legend: T rows, D width, H query heads, K kv heads, hd head dim, F ffn width, V vocabulary,
E routed experts, k experts per token.
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
    # QK-norm width: "head" = RMSNorm over each head of q and of k (Qwen3, GLM-4.5); "full" = over
    # the whole q projection (H * hd) and the whole k projection (K * hd) (MiniMax-M2,
    # transformers modeling_minimax_m2.py: q_norm = RMSNorm(num_attention_heads * head_dim))
    qk_norm: str = "head"
    # output gate (Qwen3-Next full attention, transformers modeling_qwen3_next.py
    # Qwen3NextAttention): the q projection is 2 * H * hd wide, per head [q (hd) | gate (hd)], and
    # the attention output is multiplied by sigmoid(gate) (ops.output_gate)
    output_gate: bool = False


@dataclass(frozen=True)
class DeltaNetSpec:
    """A gated DeltaNet token mixer (Yang et al. 2024, "Gated Delta Networks", arXiv:2412.06464;
    transformers modeling_qwen3_next.py Qwen3NextGatedDeltaNet), the same for every linear-attention
    layer of a model.  Hk key heads of dk (q and k), Hv value heads of dv (Hv a multiple of Hk:
    value head j reads key head j // (Hv / Hk), transformers' repeat_interleave, or with
    ``v_head_order`` "tiled" key head j % Hk, the order llama.cpp's converter gives Qwen3.5's
    value heads (conversion/qwen.py _LinearAttentionVReorderBase); the conv runs over the
    C = 2 Hk dk + Hv dv channels of q | k | v with ``conv_kernel`` taps."""

    n_k_heads: int
    n_v_heads: int
    k_head_dim: int
    v_head_dim: int
    conv_kernel: int
    eps: float  # of the gated output RMSNorm
    v_head_order: str = "grouped"  # "grouped" | "tiled"

    @property
    def conv_dim(self) -> int:
        return 2 * self.n_k_heads * self.k_head_dim + self.n_v_heads * self.v_head_dim


@dataclass(frozen=True)
class RouterSpec:
    """A layer's expert routing (the same for every MoE layer of a model).

    softmax (Qwen3-MoE, Mixtral): p = softmax(logits); rank by p.
    sigmoid (DeepSeek-V3 routing: GLM-4.5, MiniMax-M2): p = sigmoid(logits); rank by
      s = p + bias (the selection bias, ``e_score_correction_bias``), which picks experts but
      never enters the weights; with n_group > 1 only the topk_group groups of the highest group
      score (sum of the two largest s of the group's E/n_group experts) compete, the others are
      out (-inf, as DeepSeek-V3's reference inference code; transformers fills 0.0, which only
      differs when a selected group has fewer than k experts with s > 0).
    Then: ids = the k best in ranking order (descending; ties go to the lower expert index, at
    every step: group choice and expert choice), w = p[ids]; with norm_topk_prob w /= sum(w)
    (summed in ranking order); then w *= scale (routed_scaling_factor)."""

    n_experts: int
    top_k: int
    scoring: str = "softmax"  # "softmax" | "sigmoid"
    norm_topk_prob: bool = True
    n_group: int = 1
    topk_group: int = 1
    scale: float = 1.0


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

    def load_experts(self, gate, up, down, role: str = "experts"):
        """A layer's routed experts from three (E, out, in) expert tensors
        (loaders.tensor.ExpertTensor: gate and up (E, F, D), down (E, D, F)).  Expert e is the
        dense SwiGLU MLP pair (gu_e, down_e) with gu_e interleaved like ``load_linear(...,
        interleave=True)`` (gate_0, up_0, gate_1, up_1, ...), so a backend can run each expert
        with its dense matvec layouts; a backend may keep experts anywhere (VRAM, host, the
        memory-mapped file) as long as ``experts`` reads only the selected ones."""
        raise NotImplementedError

    def load_conv(self, tensor):
        """A depthwise causal conv1d's taps, (C, kernel) (``ops.causal_conv1d``).  The base class
        refuses: a backend without the gated DeltaNet ops stops here, at load, with a clear message."""
        raise NotImplementedError(f"{type(self).__name__}: gated DeltaNet layers (Qwen3-Next / Qwen3.5) have no "
                                  "kernels on this backend; use --device cpu")

    def load_vocab_map(self, ids, vocab_size: int):
        """A reduced draft vocabulary (``ops.vocab_expand``): ``ids`` (n,), ascending token ids,
        as the int32 (vocab_size,) map of each token id to its index in ``ids``, -1 for the rest."""
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

    def concat(self, a, b):
        """(T, Da), (T, Db) -> (T, Da + Db), a's columns first (the MTP head's eh_proj input,
        models/mtp.py).  Either may be a deferred rmsnorm: a CUDA backend may write both normed
        halves into one buffer, so that the product after it is one matvec over Da + Db inputs
        (one reduction, as vLLM's torch.cat + Linear), not two products summed."""
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
        each head of q and k (``q_norm`` / ``k_norm``, both or neither: Qwen3; over the whole q
        and k projections when ``spec.qk_norm == "full"``: MiniMax-M2), rotate q and k
        (RoPE at the pass's positions), write k and v into the cache of ``layer``.  Returns q
        (T, H, hd)."""
        raise NotImplementedError

    def attention(self, q, spec: AttentionSpec, layer: int):
        """Causal GQA attention of the pass's rows over the cache of ``layer`` (every position
        up to each row's own): (T, H, hd) -> (T, H * hd)."""
        raise NotImplementedError

    def output_gate(self, o, qkv, spec: AttentionSpec):
        """o * sigmoid(gate), (T, H * hd): the attention output scaled by the gate half of the q
        projection (``spec.output_gate`` layout, ``qkv`` as ``rope_kv`` received it; the gated
        families have no q/k/v bias).  transformers Qwen3NextAttention: attn_output *
        torch.sigmoid(gate)."""
        raise NotImplementedError

    def deltanet_split(self, y, spec: DeltaNetSpec):
        """A DeltaNet layer's fused input projection (T, C + Hv dv + 2 Hv), the rows of
        attn_qkv | attn_gate | ssm_beta | ssm_alpha stacked (one product), as its column blocks:
        qkv (T, C), z (T, Hv dv), b (T, Hv), a (T, Hv), in ``spec``'s sizes (views where the backend
        has them; a backend over several GPUs splits each GPU's share by its own heads)."""
        raise NotImplementedError

    def causal_conv1d(self, x, w, spec: DeltaNetSpec, layer: int):
        """silu(causal depthwise conv1d) of the (T, C) rows: out[t, c] = silu(sum_j w[c, j] *
        x'[t + j, c]) over x' = (the last kernel - 1 rows before this pass | x), the rows before
        the sequence's start being zeros.  The kernel - 1 rows before the pass are the rolling
        conv state of DeltaNet layer ``layer`` in the pass's recurrent state, which the op
        advances to the pass's last kernel - 1 rows (transformers torch_causal_conv1d_update /
        F.conv1d(padding=kernel - 1)[:T], then silu)."""
        raise NotImplementedError

    def gated_delta_rule(self, qkv, b, a, A, dt_bias, spec: DeltaNetSpec, layer: int):
        """The gated delta rule over the pass's rows (transformers torch_recurrent_gated_delta_rule
        with use_qk_l2norm_in_kernel=True, as Qwen3NextGatedDeltaNet calls it), in float32:
          q | k | v = qkv (T, C) (the conv's output), per head; beta = sigmoid(b) (T, Hv);
          g = A * softplus(a + dt_bias) (T, Hv), A = -exp(A_log) (the loaders store A);
          q, k = l2norm(q), l2norm(k) (x * rsqrt(sum x^2 + 1e-6)); q *= 1/sqrt(dk);
          q, k repeated to the Hv value heads (head j <- key head j // (Hv / Hk), or j % Hk
          with spec.v_head_order "tiled");
          per row t and head:  S = S * exp(g_t);  delta = beta_t (v_t - S^T k_t);
                               S = S + k_t delta^T;  o_t = S^T q_t
        with S (dk, dv) the recurrent state of DeltaNet layer ``layer`` (zeros at the sequence's
        start), which the op advances.  Returns o (T, Hv * dv)."""
        raise NotImplementedError

    def gated_rmsnorm(self, x, z, w, spec: DeltaNetSpec):
        """rmsnorm(x) * w * silu(z) over each value head of dv (eps ``spec.eps``): (T, Hv * dv)
        (transformers Qwen3NextRMSNormGated: norm before gate)."""
        raise NotImplementedError

    def router(self, x, gate, spec: RouterSpec, bias=None):
        """Expert choice of each row: logits = x @ gate^T (float32, gate (E, D) from
        ``load_linear``), then the RouterSpec rule with ``bias`` (E,) the selection bias (sigmoid
        routers).  Returns (ids (T, k) int32, weights (T, k) float32), both in ranking order.
        ``x`` may be a deferred rmsnorm, as for ``linear``."""
        raise NotImplementedError

    def experts(self, x, ids, weights, experts, residual, shared=None):
        """The MoE FFN of (T, D) rows ``x`` (may be a deferred rmsnorm), added to ``residual``
        (which it replaces, as ``linear(..., residual=)``):
            y_j = down_e @ swiglu(gu_e @ x)      for e = ids[:, j]   (each a dense-MLP product)
            acc = w_0 * y_0;  acc += w_j * y_j   for j = 1 .. k-1, in the router's ranking order
            acc += g * (down_s @ swiglu(gu_s @ x))   with shared = (gu_s, down_s, gate_s or None),
                   g = sigmoid(x . gate_s) (Qwen2-MoE) or 1 (GLM-4.5's shared experts)
            out = residual + acc
        every product w_j * y_j rounded to float32 before its add (no fused multiply-add), so
        that every CUDA path (resident, spilled, decode of m rows) reproduces the same bits.
        The grouping is transformers' (routed sum, + shared, then the residual)."""
        raise NotImplementedError

    def lm_head(self, x, w):
        """Logits (T, V) of the final hidden states (already normed)."""
        raise NotImplementedError

    def vocab_expand(self, logits, vmap):
        """(T, V) logits of a reduced vocabulary's (T, n) logits (FR-Spec, Zhao et al. 2025: a
        draft LM head over the n most frequent tokens only): out[t, j] = logits[t, vmap[j]], -inf
        where vmap[j] = -1 (``Loader.load_vocab_map``), so the sampler draws among the n tokens
        by their ids and a greedy draft is the first id of the maximum, as over the full head."""
        raise NotImplementedError
