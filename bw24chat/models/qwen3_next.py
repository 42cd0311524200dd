"""Qwen3-Next (Qwen3-Next-80B-A3B): a hybrid of gated DeltaNet layers and gated full attention
(transformers modeling_qwen3_next.py; the DeltaNet: Yang et al. 2024, "Gated Delta Networks",
arXiv:2412.06464).

- Layer types from ``layer_types`` (default: every ``full_attention_interval``-th layer is full
  attention, the others "linear_attention").
- Gated DeltaNet layer (Qwen3NextGatedDeltaNet): q | k | v projection -> causal depthwise conv1d
  (+ silu, rolling state) -> gated delta rule (recurrent state) -> RMSNorm gated by silu(z) ->
  out projection.  Ops: causal_conv1d, gated_delta_rule, gated_rmsnorm (ops.py).
- Full attention (Qwen3NextAttention): Qwen3's per-head QK-norm, partial rotary
  (partial_rotary_factor 0.25), and an output gate: q_proj is twice as wide, per head
  [q | gate], and the output is attn * sigmoid(gate) before o_proj (ops.output_gate).
- FFN: Qwen3-MoE's sparse layers (softmax top-k, norm_topk_prob; mlp_only_layers /
  decoder_sparse_step) plus a shared expert scaled by sigmoid(shared_expert_gate(x))
  (Qwen3NextSparseMoeBlock), or a dense MLP.
- MTP head (``mtp.*``): models/mtp.py's NextN head with a full-attention layer, chaining its
  normed output.
- Every RMSNorm but the DeltaNet's gated one is zero-centred: y = norm(x) * (1 + w)
  (Qwen3NextRMSNorm); the loaders hand 1 + w, as llama.cpp's converter stores it, and the other
  checkpoint layouts in canonical form (loaders/layouts.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ops import DeltaNetSpec, Loader, Ops
from .dense import Layer
from .moe import MoETransformer
from .qwen3_moe import ModelArgs as Qwen3MoeArgs


# layer_types' names -> is the layer linear attention; with transformers' legacy names
# (configuration_utils.py _LEGACY_LAYER_TYPE_REMAP)
LAYER_KINDS = {"linear_attention": True, "full_attention": False, "mamba": True, "attention": False}


@dataclass
class ModelArgs(Qwen3MoeArgs):  # transformers configuration_qwen3_next.py defaults
    model_type: str = "qwen3_next"
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 0.25
    num_experts: int = 512
    num_experts_per_tok: int = 10
    moe_intermediate_size: int = 512
    shared_expert_intermediate_size: int = 512
    layer_types: list | None = None
    full_attention_interval: int = 4
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    linear_v_head_order: str = "grouped"  # set by the GGUF loader for llama.cpp's tiled qwen35 files (ops.DeltaNetSpec)

    def is_linear(self, i: int) -> bool:
        if i >= self.num_hidden_layers:  # an MTP layer is a full-attention layer (vLLM qwen3_next_mtp.py)
            return False
        if self.layer_types:
            return LAYER_KINDS[self.layer_types[i]]
        return (i + 1) % self.full_attention_interval != 0

    def deltanet_spec(self) -> DeltaNetSpec:
        return DeltaNetSpec(self.linear_num_key_heads, self.linear_num_value_heads, self.linear_key_head_dim,
                            self.linear_value_head_dim, self.linear_conv_kernel_dim, self.rms_norm_eps,
                            self.linear_v_head_order)


@dataclass
class DeltaNet:
    # the input projections as one matrix (one product): qkv (C, D) rows q | k | v (all heads of
    # each), z (Hv dv, D) the output gate, b (Hv, D) -> beta, a (Hv, D) -> the decay's input
    in_proj: object
    conv: object  # (C, kernel)
    A: object  # (Hv,) -exp(A_log)
    dt_bias: object  # (Hv,)
    norm: object  # (dv,)
    out: object  # (D, Hv dv)


class Model(MoETransformer):
    Args = ModelArgs
    output_gate = True
    mtp_chains_normed = True  # the mtp.* head (vLLM qwen3_next_mtp.py): models/mtp.py

    def __init__(self, args: ModelArgs, loader: Loader, tensors: dict, n_ctx: int, progress=None):
        n = args.num_hidden_layers
        # each layer's index among the layers of its kind: the KV cache holds the attention
        # layers, the recurrent state the DeltaNet layers
        kinds = [args.is_linear(i) for i in range(n)]
        self.slot = [sum(kinds[:i]) if kinds[i] else i - sum(kinds[:i]) for i in range(n)]
        self.n_state_layers = sum(kinds)
        self.deltanet = args.deltanet_spec()
        super().__init__(args, loader, tensors, n_ctx, progress)

    n_kv_layers = property(lambda self: self.args.num_hidden_layers - self.n_state_layers)

    def kv_layer(self, li: int) -> int:
        return self.slot[li]

    @classmethod
    def mixer_shapes(cls, a: ModelArgs, i: int) -> dict:
        if not a.is_linear(i):
            return super().mixer_shapes(a, i)
        s, D = a.deltanet_spec(), a.hidden_size
        Hv, vd = s.n_v_heads, s.n_v_heads * s.v_head_dim
        return {"attn_qkv": ((s.conv_dim, D), True), "attn_gate": ((vd, D), True), "ssm_beta": ((Hv, D), True),
                "ssm_alpha": ((Hv, D), True), "ssm_conv1d": ((s.conv_dim, s.conv_kernel), True),
                "ssm_a": ((Hv,), True), "ssm_dt": ((Hv,), True), "ssm_norm": ((s.v_head_dim,), True),
                "ssm_out": ((D, vd), True)}

    def load_mixer(self, L: Loader, i: int, t, has) -> dict:
        if not self.args.is_linear(i):
            return super().load_mixer(L, i, t, has)
        return dict(deltanet=DeltaNet(
            in_proj=L.load_linear([t("attn_qkv"), t("attn_gate"), t("ssm_beta"), t("ssm_alpha")], role="ssm_in"),
            conv=L.load_conv(t("ssm_conv1d")), A=L.load_vector([t("ssm_a")]), dt_bias=L.load_vector([t("ssm_dt")]),
            norm=L.load_vector([t("ssm_norm")]), out=L.load_linear([t("ssm_out")], role="ssm_out")))

    def attention(self, ops: Ops, li: int, L: Layer, x):
        """The token mixer: gated full attention (dense.py, output gate on), or the gated
        DeltaNet: x + out(gated_rmsnorm(delta_rule(conv(qkv(h)), b(h), a(h)), z(h))), the four
        input projections one product."""
        if L.deltanet is None:
            return super().attention(ops, li, L, x)
        d, s, i = L.deltanet, self.deltanet, self.slot[li]
        qkv, z, b, a = ops.deltanet_split(ops.linear(ops.rmsnorm(x, L.attn_norm), d.in_proj), s)
        o = ops.gated_delta_rule(ops.causal_conv1d(qkv, d.conv, s, i), b, a, d.A, d.dt_bias, s, i)
        return ops.linear(ops.gated_rmsnorm(o, z, d.norm, s), d.out, residual=x)

