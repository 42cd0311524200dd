"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): the Qwen3 attention (per-head QK-norm, no biases)
with a softmax top-k router (norm_topk_prob) over 128 experts and no shared expert
(transformers modeling_qwen3_moe.py).  Layers listed in ``mlp_only_layers``, or off the
``decoder_sparse_step`` stride, keep a dense MLP of ``intermediate_size``."""
from __future__ import annotations

from dataclasses import dataclass, field

from .moe import MoEArgs, MoETransformer


@dataclass
class ModelArgs(MoEArgs):
    # transformers >= 5 writes the expert count as num_local_experts (Qwen3MoeConfig.attribute_map)
    aliases = {"num_local_experts": "num_experts"}
    model_type: str = "qwen3_moe"
    qk_norm: bool = True
    rope_theta: float = 1000000.0
    num_experts: int = 128
    moe_intermediate_size: int = 768
    scoring_func: str = "softmax"
    norm_topk_prob: bool = True  # every released checkpoint; llama.cpp's qwen3moe assumes it
    decoder_sparse_step: int = 1
    mlp_only_layers: list = field(default_factory=list)

    def is_moe_layer(self, i: int) -> bool:
        return i not in self.mlp_only_layers and self.num_experts > 0 and (i + 1) % self.decoder_sparse_step == 0


class Model(MoETransformer):
    Args = ModelArgs
