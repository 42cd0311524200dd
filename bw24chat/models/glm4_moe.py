"""GLM-4.5 / 4.6 / 4.5-Air (transformers modeling_glm4_moe.py): GQA attention with q/k/v
biases, partial RoPE (``partial_rotary_factor`` 0.5: the first half of each head rotates),
optional per-head QK-norm (``use_qk_norm``, loaded when the checkpoint has it); DeepSeek-V3
routing (arXiv:2412.19437): sigmoid scores, ``e_score_correction_bias`` for selection only,
group-limited top-k (``n_group`` / ``topk_group``), renormalized weights times
``routed_scaling_factor``; ``n_shared_experts`` always-on experts (one MLP of
n_shared * moe_intermediate_size, no gate); the first ``first_k_dense_replace`` layers dense."""
from __future__ import annotations

from dataclasses import dataclass

from .moe import MoEArgs, MoETransformer


@dataclass
class ModelArgs(MoEArgs):
    aliases = {"n_routed_experts": "num_experts"}
    model_type: str = "glm4_moe"
    attention_bias: bool = True
    partial_rotary_factor: float = 0.5
    scoring_func: str = "sigmoid"
    norm_topk_prob: bool = True
    n_shared_experts: int = 1
    first_k_dense_replace: int = 1

    def is_moe_layer(self, i: int) -> bool:
        return i >= self.first_k_dense_replace


class Model(MoETransformer):
    Args = ModelArgs
