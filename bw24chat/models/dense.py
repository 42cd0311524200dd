"""The dense decoder-only transformer shared by the llama, qwen2 and qwen3 families.

Pre-norm blocks (RMSNorm -> GQA attention with RoPE -> residual; RMSNorm -> SwiGLU MLP ->
residual), final RMSNorm, LM head (tied to the embedding or not).  Family files only choose
the switches (q/k/v bias, per-head QK-norm) and defaults.  All math is op calls (``bw24chat.ops``)
that both backends implement; this file never touches an array library.

Shape legend: T tokens in the step, D model width, H query heads, K kv heads, hd head dim,
F ffn width, V vocabulary.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field

from ..ops import AttentionSpec, Loader, Ops
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

    # a family's config keys that mean one of our fields (GLM's n_routed_experts = num_experts)
    aliases: typing.ClassVar[dict[str, str]] = {}

    @classmethod
    def from_dict(cls, d: dict):
        """Build from an HF config.json-style dict; unknown keys are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        d = {**{cls.aliases[k]: v for k, v in d.items() if k in cls.aliases and cls.aliases[k] not in d}, **d}
        args = cls(**{k: v for k, v in d.items() if k in names and k != "extra"})
        if args.num_key_value_heads is None:
            args.num_key_value_heads = args.num_attention_heads
        if args.head_dim is None:
            args.head_dim = args.hidden_size // args.num_attention_heads
        rp = d.get("rope_parameters")  # transformers >= 5 nests rope settings here
        if isinstance(rp, dict):
            args.rope_theta = rp.get("rope_theta", args.rope_theta)
            args.partial_rotary_factor = rp.get("partial_rotary_factor", args.partial_rotary_factor)
            if rp.get("rope_type", "default") != "default" and args.rope_scaling is None:
                args.rope_scaling = rp
        if args.rope_freqs is not None:
            args.rope_scaling = {"rope_type": "freq_factors", "freq_factors": args.rope_freqs}
        return args


@dataclass
class Layer:
    attn_norm: object = None
    qkv: object = None  # rows q | k | v
    o: object = None
    ffn_norm: object = None
    gu: object = None  # dense MLP: rows gate_0, up_0, gate_1, up_1, ...
    down: object = None
    bias: object = None  # q | k | v biases (qwen2)
    q_norm: object = None  # RMSNorm weights of q and k (qwen3: per head)
    k_norm: object = None
    moe: object = None  # a sparse layer's router and experts (models/moe.py), else None
    deltanet: object = None  # a gated DeltaNet layer's weights (models/qwen3_next.py), else None


class DenseTransformer:
    """Weights on one backend plus the forward pass written once as op calls."""

    Args = BaseArgs
    qk_norm_width = "head"  # AttentionSpec.qk_norm: what the family's QK-norm normalizes over

    def __init__(self, args: BaseArgs, loader: Loader, tensors: dict, n_ctx: int, progress=None):
        self.args = a = args
        self.n_ctx = n_ctx
        L = loader
        self.tok_embd = L.load_embedding(tensors["tok_embd"])
        self.output_norm = L.load_vector([tensors["output_norm"]])
        tied = a.tie_word_embeddings or "output" not in tensors
        # a tied LM head is the embedding table itself (load_embedding's result serves as a linear)
        self.output = self.tok_embd if tied else L.load_linear([tensors["output"]], role="lm_head")
        self.layers: list[Layer] = []
        for i in range(a.num_hidden_layers):
            self.layers.append(self.load_layer(L, i, tensors))
            if progress:
                progress((i + 1) / a.num_hidden_layers)
        rope = build_rope_table(a.head_dim, a.partial_rotary_factor, a.rope_theta, a.rope_scaling, n_ctx, a.rope_style,
                                a.max_position_embeddings)
        self.attn = AttentionSpec(a.num_attention_heads, a.num_key_value_heads, a.head_dim, a.rms_norm_eps, rope,
                                  1.0 / math.sqrt(a.head_dim), self.qk_norm_width, self.output_gate)

    # the runner's per-sequence state: KV-cache layers, and (hybrid models) the gated DeltaNet's
    n_kv_layers = property(lambda self: self.args.num_hidden_layers)
    deltanet = None  # ops.DeltaNetSpec of a hybrid model
    n_state_layers = 0
    output_gate = False  # AttentionSpec.output_gate
    mtp_chains_normed = False  # models/mtp.py: an MTP head chains its normed output (Qwen3-Next) or g (DeepSeek-V3)

    def load_mixer(self, L: Loader, i: int, t, has) -> dict:
        """Layer ``i``'s token-mixer (attention) weights as Layer fields."""
        return dict(qkv=L.load_linear([t("attn_q"), t("attn_k"), t("attn_v")], role="qkv"),
                    o=L.load_linear([t("attn_o")], role="o"),
                    bias=L.load_vector([t("attn_q_bias"), t("attn_k_bias"), t("attn_v_bias")]) if has("attn_q_bias") else None,
                    q_norm=L.load_vector([t("attn_q_norm")]) if has("attn_q_norm") else None,
                    k_norm=L.load_vector([t("attn_k_norm")]) if has("attn_k_norm") else None)

    def load_layer(self, L: Loader, i: int, tensors: dict) -> Layer:
        """Decoder layer ``i`` from its canonical tensors ``blk.{i}.*`` (the trunk's, or a NextN
        layer's: models/mtp.py)."""
        t = lambda name: tensors[f"blk.{i}.{name}"]  # noqa: E731
        has = lambda name: f"blk.{i}.{name}" in tensors  # noqa: E731
        return Layer(
            attn_norm=L.load_vector([t("attn_norm")]),
            ffn_norm=L.load_vector([t("ffn_norm")]),
            **self.load_mixer(L, i, t, has),
            **self.load_ffn(L, i, t, has),
        )

    @classmethod
    def tensor_shapes(cls, a: BaseArgs) -> dict[str, tuple[tuple[int, ...], bool]]:
        """Every tensor the family may hold: canonical name -> (shape, required).  The loaders'
        checks refuse a file whose tensors disagree (loaders/checks.py)."""
        D, V = a.hidden_size, a.vocab_size
        out = {"tok_embd": ((V, D), True), "output": ((V, D), False), "output_norm": ((D,), True)}
        for i in range(a.num_hidden_layers):
            out.update(cls.layer_shapes(a, i))
        return out

    @classmethod
    def layer_shapes(cls, a: BaseArgs, i: int) -> dict[str, tuple[tuple[int, ...], bool]]:
        """Decoder layer ``i``'s tensors (tensor_shapes' entries for blk.{i}.*)."""
        D, p = a.hidden_size, f"blk.{i}."
        out = {p + "attn_norm": ((D,), True), p + "ffn_norm": ((D,), True)}
        out.update({p + k: v for k, v in cls.mixer_shapes(a, i).items()})
        out.update({p + k: v for k, v in cls.ffn_shapes(a, i).items()})
        return out

    @classmethod
    def mtp_tensor_shapes(cls, a: BaseArgs, n_layers: int) -> dict[str, tuple[tuple[int, ...], bool]]:
        """The NextN / MTP layers' tensors (Checkpoint.mtp; models/mtp.py)."""
        from .mtp import nextn_shapes

        return nextn_shapes(cls, a, n_layers)

    @classmethod
    def mixer_shapes(cls, a: BaseArgs, i: int) -> dict[str, tuple[tuple[int, ...], bool]]:
        D, hd = a.hidden_size, a.head_dim
        q, kv = a.num_attention_heads * hd, a.num_key_value_heads * hd
        qn = (q, kv) if cls.qk_norm_width == "full" else (hd, hd)
        return {"attn_q": ((q * (2 if cls.output_gate else 1), D), True), "attn_k": ((kv, D), True),
                "attn_v": ((kv, D), True), "attn_o": ((D, q), True), "attn_q_bias": ((q,), False),
                "attn_k_bias": ((kv,), False), "attn_v_bias": ((kv,), False), "attn_q_norm": ((qn[0],), False),
                "attn_k_norm": ((qn[1],), False)}

    @classmethod
    def ffn_shapes(cls, a: BaseArgs, i: int) -> dict[str, tuple[tuple[int, ...], bool]]:
        D, F = a.hidden_size, a.intermediate_size
        return {"ffn_gate": ((F, D), True), "ffn_up": ((F, D), True), "ffn_down": ((D, F), True)}

    def load_ffn(self, L: Loader, i: int, t, has) -> dict:
        """Layer ``i``'s FFN weights as Layer fields (``t(name)`` / ``has(name)``: its tensors)."""
        return dict(gu=L.load_linear([t("ffn_gate"), t("ffn_up")], interleave=True, role="gu"),
                    down=L.load_linear([t("ffn_down")], role="down"))

    def attention(self, ops: Ops, li: int, L: Layer, x):
        """The attention half of a block: x + o(attention(rope_kv(qkv(rmsnorm(x)))))."""
        qkv = ops.linear(ops.rmsnorm(x, L.attn_norm), L.qkv)
        kv = self.kv_layer(li)
        o = ops.attention(ops.rope_kv(qkv, self.attn, kv, L.bias, L.q_norm, L.k_norm), self.attn, kv)
        if self.attn.output_gate:
            o = ops.output_gate(o, qkv, self.attn)
        return ops.linear(o, L.o, residual=x)

    def kv_layer(self, li: int) -> int:
        """Layer ``li``'s layer in the KV cache (hybrid models cache only their attention layers)."""
        return li

    def ffn(self, ops: Ops, li: int, L: Layer, x):
        """The FFN half: x + down(swiglu(gu(rmsnorm(x))))."""
        return ops.linear(ops.swiglu(ops.linear(ops.rmsnorm(x, L.ffn_norm), L.gu)), L.down, residual=x)

    def block(self, ops: Ops, li: int, L: Layer, x):
        return self.ffn(ops, li, L, self.attention(ops, li, L, x))

    def forward(self, ops: Ops, ids):
        """Logits of the pass's rows (the Ops object decides which rows reach the LM head)."""
        return self.logits(ops, self.trunk(ops, ids))

    def trunk(self, ops: Ops, ids):
        """The last layer's output of every row, before the final norm (what an MTP head takes:
        models/mtp.py)."""
        x = ops.embed(self.tok_embd, ids)
        for li, L in enumerate(self.layers):
            x = self.block(ops, li, L, x)
        return x

    def logits(self, ops: Ops, x):
        return ops.lm_head(ops.rmsnorm(x, self.output_norm), self.output)
