"""Llama family: Llama 2/3, SmolLM2, Mistral (dense, GQA, SwiGLU, RMSNorm, RoPE with linear /
llama3 / yarn scaling; tied or untied embeddings)."""
from __future__ import annotations

from dataclasses import dataclass

from .dense import BaseArgs, DenseTransformer


@dataclass
class ModelArgs(BaseArgs):
    model_type: str = "llama"
    attention_bias: bool = False
    qk_norm: bool = False


class Model(DenseTransformer):
    Args = ModelArgs
