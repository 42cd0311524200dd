"""Qwen3 (dense): the llama block plus QK-norm (RMSNorm over each head of q and k before RoPE),
explicit head_dim (128 on every size, not hidden/heads), no q/k/v biases."""
from __future__ import annotations

from dataclasses import dataclass

from .dense import BaseArgs, DenseTransformer


@dataclass
class ModelArgs(BaseArgs):
    model_type: str = "qwen3"
    qk_norm: bool = True
    attention_bias: bool = False
    rope_theta: float = 1000000.0


class Model(DenseTransformer):
    Args = ModelArgs
