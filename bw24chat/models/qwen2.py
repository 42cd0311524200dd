"""Qwen2 / Qwen2.5: the llama block with biases on the q, k and v projections."""
from __future__ import annotations

from dataclasses import dataclass

from .dense import BaseArgs, DenseTransformer


@dataclass
class ModelArgs(BaseArgs):
    model_type: str = "qwen2"
    attention_bias: bool = True  # q/k/v biases (o_proj has none)
    rope_theta: float = 1000000.0


class Model(DenseTransformer):
    Args = ModelArgs
