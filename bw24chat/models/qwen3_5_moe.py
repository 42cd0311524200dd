"""Qwen3.5-MoE (Qwen3.5-35B-A3B, Qwen3.6-35B-A3B): the Qwen3.5 hybrid
(qwen3_5.py: checkpoint layout, RoPE) with Qwen3-Next's sparse MoE block in every layer, a
softmax top-k router over ``num_experts`` plus a shared expert scaled by sigmoid(gate(x))
(transformers modular_qwen3_5_moe.py: Qwen3_5MoeDecoderLayer, Qwen3NextSparseMoeBlock).  The
router always renormalizes its top-k weights (Qwen3VLMoeTextTopKRouter; the config has no
norm_topk_prob)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..ops import RouterSpec
from . import qwen3_next


@dataclass
class ModelArgs(qwen3_next.ModelArgs):  # transformers configuration_qwen3_5_moe.py Qwen3_5MoeTextConfig defaults
    model_type: str = "qwen3_5_moe"
    vocab_size: int = 248320
    hidden_size: int = 2048
    num_hidden_layers: int = 40
    num_experts: int = 256
    num_experts_per_tok: int = 8
    max_position_embeddings: int = 32768

    def is_moe_layer(self, i: int) -> bool:
        return True

    def router_spec(self) -> RouterSpec:
        return dataclasses.replace(super().router_spec(), norm_topk_prob=True)


class Model(qwen3_next.Model):
    Args = ModelArgs
