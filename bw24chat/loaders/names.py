"""Weight-name maps: one explicit dict per source format into the canonical naming.

Canonical names (what the model code and backends use):
  tok_embd, output_norm, output
  blk.{i}.attn_norm, blk.{i}.attn_q, blk.{i}.attn_k, blk.{i}.attn_v, blk.{i}.attn_o,
  blk.{i}.attn_q_bias, blk.{i}.attn_k_bias, blk.{i}.attn_v_bias,
  blk.{i}.attn_q_norm, blk.{i}.attn_k_norm,
  blk.{i}.ffn_norm, blk.{i}.ffn_gate, blk.{i}.ffn_up, blk.{i}.ffn_down
"""
from __future__ import annotations

import re

# GGUF tensor names (llama.cpp gguf-py/gguf/constants.py TENSOR_NAMES)
GGUF_NAMES: dict[str, str] = {
    "token_embd.weight": "tok_embd",
    "output_norm.weight": "output_norm",
    "output.weight": "output",
    "blk.{i}.attn_norm.weight": "blk.{i}.attn_norm",
    "blk.{i}.attn_q.weight": "blk.{i}.attn_q",
    "blk.{i}.attn_k.weight": "blk.{i}.attn_k",
    "blk.{i}.attn_v.weight": "blk.{i}.attn_v",
    "blk.{i}.attn_output.weight": "blk.{i}.attn_o",
    "blk.{i}.attn_q.bias": "blk.{i}.attn_q_bias",
    "blk.{i}.attn_k.bias": "blk.{i}.attn_k_bias",
    "blk.{i}.attn_v.bias": "blk.{i}.attn_v_bias",
    "blk.{i}.attn_q_norm.weight": "blk.{i}.attn_q_norm",
    "blk.{i}.attn_k_norm.weight": "blk.{i}.attn_k_norm",
    "blk.{i}.ffn_norm.weight": "blk.{i}.ffn_norm",
    "blk.{i}.ffn_gate.weight": "blk.{i}.ffn_gate",
    "blk.{i}.ffn_up.weight": "blk.{i}.ffn_up",
    "blk.{i}.ffn_down.weight": "blk.{i}.ffn_down",
}

# Hugging Face transformers names (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)
HF_NAMES: dict[str, str] = {
    "model.embed_tokens.weight": "tok_embd",
    "model.norm.weight": "output_norm",
    "lm_head.weight": "output",
    "model.layers.{i}.input_layernorm.weight": "blk.{i}.attn_norm",
    "model.layers.{i}.self_attn.q_proj.weight": "blk.{i}.attn_q",
    "model.layers.{i}.self_attn.k_proj.weight": "blk.{i}.attn_k",
    "model.layers.{i}.self_attn.v_proj.weight": "blk.{i}.attn_v",
    "model.layers.{i}.self_attn.o_proj.weight": "blk.{i}.attn_o",
    "model.layers.{i}.self_attn.q_proj.bias": "blk.{i}.attn_q_bias",
    "model.layers.{i}.self_attn.k_proj.bias": "blk.{i}.attn_k_bias",
    "model.layers.{i}.self_attn.v_proj.bias": "blk.{i}.attn_v_bias",
    "model.layers.{i}.self_attn.q_norm.weight": "blk.{i}.attn_q_norm",
    "model.layers.{i}.self_attn.k_norm.weight": "blk.{i}.attn_k_norm",
    "model.layers.{i}.post_attention_layernorm.weight": "blk.{i}.ffn_norm",
    "model.layers.{i}.mlp.gate_proj.weight": "blk.{i}.ffn_gate",
    "model.layers.{i}.mlp.up_proj.weight": "blk.{i}.ffn_up",
    "model.layers.{i}.mlp.down_proj.weight": "blk.{i}.ffn_down",
}


class NameMap:
    """Compiled form of one of the dicts above: source name <-> canonical name."""

    def __init__(self, table: dict[str, str]):
        self._rules = []
        self._back = []
        for src, dst in table.items():
            pat = "^" + re.escape(src).replace(r"\{i\}", r"(?P<i>\d+)") + "$"
            self._rules.append((re.compile(pat), dst))
            self._back.append((re.compile("^" + re.escape(dst).replace(r"\{i\}", r"(?P<i>\d+)") + "$"), src))

    def canonical(self, source_name: str) -> str | None:
        for pat, dst in self._rules:
            m = pat.match(source_name)
            if m:
                return dst.format(**m.groupdict())
        return None

    def source(self, canonical_name: str) -> str:
        """The source format's name of a canonical one (itself when the map has none)."""
        for pat, src in self._back:
            m = pat.match(canonical_name)
            if m:
                return src.format(**m.groupdict())
        return canonical_name


GGUF_MAP = NameMap(GGUF_NAMES)
HF_MAP = NameMap(HF_NAMES)
