"""MiniMax-M2 (transformers modeling_minimax_m2.py; llama.cpp src/models/minimax-m2.cpp): GQA
attention whose QK-norm is one RMSNorm over the whole q projection (H * hd) and one over the
whole k projection (K * hd), not per head; partial RoPE (``rotary_dim`` 64 of head_dim 128);
every layer sparse: sigmoid scores, a selection-only bias (``e_score_correction_bias``), top-k
always renormalized and never scaled; no shared experts.  The checkpoint's ``intermediate_size``
is the expert width."""
from __future__ import annotations

from dataclasses import dataclass

from .moe import MoEArgs, MoETransformer


@dataclass
class ModelArgs(MoEArgs):
    aliases = {"num_local_experts": "num_experts", "intermediate_size": "moe_intermediate_size"}
    model_type: str = "minimax_m2"
    qk_norm: bool = True
    rope_theta: float = 5000000.0
    rotary_dim: int | None = None  # the original config's name for the rotated width
    num_experts: int = 256
    scoring_func: str = "sigmoid"

    @classmethod
    def from_dict(cls, d: dict):
        args = super().from_dict(d)
        if args.rotary_dim:
            args.partial_rotary_factor = args.rotary_dim / args.head_dim
        # transformers' router always renormalizes and never scales, whatever the config says
        args.norm_topk_prob, args.routed_scaling_factor = True, 1.0
        return args

class Model(MoETransformer):
    Args = ModelArgs
    qk_norm_width = "full"
