"""The dense decoder-only transformer shared by the llama, qwen2 and qwen3 families.

Pre-norm blocks (RMSNorm -> GQA attention with RoPE -> residual; RMSNorm -> SwiGLU MLP ->
residual), final RMSNorm, LM head (tied to the embedding or not).  Family files only choose
the switches (q/k/v bias, per-head QK-norm) and defaults.  All math goes through a backend
object (NumPy reference or CUDA); this file never touches an array library directly.

Shape legend: T tokens in the step, D model width, H query heads, K kv heads, hd head dim,
F ffn width, V vocabulary.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from ..rope import build_rope_table


@dataclass
class BaseArgs:
    model_type: str = "llama"
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    vocab_size: int = 32000
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    rope_style: str = "neox"  # "neox" (HF layout) | "normal" (llama.cpp-permuted llama weights)
    partial_rotary_factor: float = 1.0
    rope_freqs: list | None = None  # GGUF llama3 frequency factors
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict):
        """Build from an HF config.json-style dict; unknown keys are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        args = cls(**{k: v for k, v in d.items() if k in names and k != "extra"})
        if args.num_key_value_heads is None:
            args.num_key_value_heads = args.num_attention_heads
        if args.head_dim is None:
            args.head_dim = args.hidden_size // args.num_attention_heads
        rp = d.get("rope_parameters")  # transformers >= 5 nests rope settings here
        if isinstance(rp, dict):
            args.rope_theta = rp.get("rope_theta", args.rope_theta)
            if rp.get("rope_type", "default") != "default" and args.rope_scaling is None:
                args.rope_scaling = rp
        if args.rope_freqs is not None:
            args.rope_scaling = {"rope_type": "freq_factors", "freq_factors": args.rope_freqs}
        return args


@dataclass
class LayerWeights:
    attn_norm: object
    wq: object
    wk: object
    wv: object
    wo: object
    ffn_norm: object
    w_gate: object
    w_up: object
    w_down: object
    bq: object = None
    bk: object = None
    bv: object = None
    q_norm: object = None
    k_norm: object = None


class DenseTransformer:
    Args = BaseArgs

    def __init__(self, args: BaseArgs, backend, tensors: dict, n_ctx: int, progress=None):
        self.args = args
        self.backend = backend
        self.n_ctx = n_ctx
        B = backend
        a = args
        self.tok_embd = B.load_embedding(tensors["tok_embd"])
        self.output_norm = B.load_vector(tensors["output_norm"])
        self.output = self.tok_embd if (a.tie_word_embeddings or "output" not in tensors) else B.load_matrix(tensors["output"])
        self.layers: list[LayerWeights] = []
        opt = lambda name, load: load(tensors[name]) if name in tensors else None  # noqa: E731
        for i in range(a.num_hidden_layers):
            p = f"blk.{i}."
            self.layers.append(
                LayerWeights(
                    attn_norm=B.load_vector(tensors[p + "attn_norm"]),
                    wq=B.load_matrix(tensors[p + "attn_q"]),
                    wk=B.load_matrix(tensors[p + "attn_k"]),
                    wv=B.load_matrix(tensors[p + "attn_v"]),
                    wo=B.load_matrix(tensors[p + "attn_o"]),
                    ffn_norm=B.load_vector(tensors[p + "ffn_norm"]),
                    w_gate=B.load_matrix(tensors[p + "ffn_gate"]),
                    w_up=B.load_matrix(tensors[p + "ffn_up"]),
                    w_down=B.load_matrix(tensors[p + "ffn_down"]),
                    bq=opt(p + "attn_q_bias", B.load_vector),
                    bk=opt(p + "attn_k_bias", B.load_vector),
                    bv=opt(p + "attn_v_bias", B.load_vector),
                    q_norm=opt(p + "attn_q_norm", B.load_vector),
                    k_norm=opt(p + "attn_k_norm", B.load_vector),
                )
            )
            if progress:
                progress((i + 1) / a.num_hidden_layers)
        self.rope = build_rope_table(
            a.head_dim, a.partial_rotary_factor, a.rope_theta, a.rope_scaling, n_ctx, a.rope_style, a.max_position_embeddings
        )
        self.attn_scale = 1.0 / math.sqrt(a.head_dim)

    def new_cache(self):
        a = self.args
        return self.backend.new_kv_cache(a.num_hidden_layers, a.num_key_value_heads, a.head_dim, self.n_ctx)

    def forward(self, ids: np.ndarray, start: int, cache, last_only: bool = True):
        """Run tokens ``ids`` at positions start..start+T-1, appending to ``cache``.
        Returns logits (1, V) for the last position, or (T, V) with last_only=False."""
        B, a = self.backend, self.args
        T = len(ids)
        H, K, hd, eps = a.num_attention_heads, a.num_key_value_heads, a.head_dim, a.rms_norm_eps
        pos = np.arange(start, start + T)
        x = B.embed(self.tok_embd, ids)  # (T, D)
        for li, L in enumerate(self.layers):
            h = B.rmsnorm(x, L.attn_norm, eps)
            q = B.linear(h, L.wq, L.bq).reshape(T, H, hd)  # (T, H, hd)
            k = B.linear(h, L.wk, L.bk).reshape(T, K, hd)  # (T, K, hd)
            v = B.linear(h, L.wv, L.bv).reshape(T, K, hd)
            if L.q_norm is not None:  # Qwen3: RMSNorm over each head before RoPE
                q = B.rmsnorm(q, L.q_norm, eps)
                k = B.rmsnorm(k, L.k_norm, eps)
            q = B.rope(q, pos, self.rope)
            k = B.rope(k, pos, self.rope)
            o = B.attention(q, k, v, cache, li, start, self.attn_scale)  # (T, H*hd)
            x = B.add(x, B.linear(o, L.wo))
            h = B.rmsnorm(x, L.ffn_norm, eps)
            x = B.add(x, B.linear(B.swiglu(B.linear(h, L.w_gate), B.linear(h, L.w_up)), L.w_down))
        if last_only:
            x = x[-1:]
        return B.linear(B.rmsnorm(x, self.output_norm, eps), self.output)  # (T|1, V)
