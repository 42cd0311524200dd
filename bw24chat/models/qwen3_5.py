"""Qwen3.5 (Qwen3.5-9B, -27B): Qwen3-Next's hybrid of gated DeltaNet and gated full-attention
layers with a dense SwiGLU MLP in every layer (transformers modular_qwen3_5.py: Qwen3_5TextModel,
Qwen3_5DecoderLayer).  The block is qwen3_next.py's; what differs is the checkpoint, which the
loaders bring to the canonical layout:

- the DeltaNet's projections are stored apart and flat (in_proj_qkv q | k | v, in_proj_z,
  in_proj_b, in_proj_a), no grouping by key head (Qwen3_5GatedDeltaNet);
- llama.cpp's qwen35 GGUF stores the value heads tiled (``linear_v_head_order``, ops.DeltaNetSpec);
- the multimodal checkpoints (Qwen3_5ForConditionalGeneration) nest the text model under
  ``text_config`` and ``model.language_model.*`` (hf_loader).

RoPE is Qwen3-VL's interleaved MRoPE (Qwen3_5TextRotaryEmbedding, ``mrope_section``): the
rotary frequencies are dealt to the temporal, height and width position rows; for text all
three rows are the token's position, so it is plain partial rotary (neox) over
head_dim x partial_rotary_factor dims, as in Qwen3-Next (tests/test_qwen3_5.py checks it).
"""
from __future__ import annotations

from dataclasses import dataclass

from . import qwen3_next


@dataclass
class ModelArgs(qwen3_next.ModelArgs):  # transformers configuration_qwen3_5.py Qwen3_5TextConfig defaults
    model_type: str = "qwen3_5"
    vocab_size: int = 248320
    hidden_size: int = 4096
    intermediate_size: int = 12288
    num_hidden_layers: int = 32
    num_attention_heads: int = 16
    num_key_value_heads: int | None = 4
    max_position_embeddings: int = 32768
    num_experts: int = 0  # no MoE: every layer's MLP is dense


class Model(qwen3_next.Model):
    Args = ModelArgs
