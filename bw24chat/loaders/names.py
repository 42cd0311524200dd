"""Weight-name maps: one explicit dict per source format into the canonical naming.

Canonical names (what the model code and backends use):
  tok_embd, output_norm, output
  blk.{i}.attn_norm, blk.{i}.attn_q, blk.{i}.attn_k, blk.{i}.attn_v, blk.{i}.attn_o,
  blk.{i}.attn_q_bias, blk.{i}.attn_k_bias, blk.{i}.attn_v_bias,
  blk.{i}.attn_q_norm, blk.{i}.attn_k_norm,
  blk.{i}.ffn_norm, blk.{i}.ffn_gate, blk.{i}.ffn_up, blk.{i}.ffn_down
MoE layers (llama.cpp's names):
  blk.{i}.ffn_gate_inp (E, D) router, blk.{i}.exp_probs_b (E,) selection bias,
  blk.{i}.ffn_gate_exps, blk.{i}.ffn_up_exps (E, F, D), blk.{i}.ffn_down_exps (E, D, F)
      (loaders.tensor.ExpertTensor; HF per-expert tensors arrive as blk.{i}.ffn_gate_exps.{j}
      and are stacked by the loader, transformers' fused gate|up as blk.{i}.ffn_gate_up_exps),
  blk.{i}.ffn_gate_shexp, blk.{i}.ffn_up_shexp, blk.{i}.ffn_down_shexp (shared experts),
  blk.{i}.ffn_gate_inp_shexp (D,) the shared expert's sigmoid gate (Qwen2-MoE)
NextN / MTP layers (DeepSeek-V3 / GLM-4.5; i = num_hidden_layers ..; loaded into Checkpoint.mtp,
models/mtp.py), besides the decoder layer's usual names above (llama.cpp's names):
  blk.{i}.nextn.eh_proj (D, 2D), blk.{i}.nextn.enorm, blk.{i}.nextn.hnorm (D,),
  blk.{i}.nextn.shared_head_norm (D,), blk.{i}.nextn.shared_head_head (V, D) (optional: the
  trunk's LM head), blk.{i}.nextn.embed_tokens (V, D) (optional: the trunk's embedding)
Gated DeltaNet layers (llama.cpp's qwen35 names, models/qwen3_next.py):
  blk.{i}.attn_qkv (C, D) q | k | v, blk.{i}.attn_gate (Hv dv, D) z, blk.{i}.ssm_beta,
  blk.{i}.ssm_alpha (Hv, D), blk.{i}.ssm_conv1d (C, kernel), blk.{i}.ssm_a (Hv,) = -exp(A_log),
  blk.{i}.ssm_dt (Hv,) dt_bias, blk.{i}.ssm_norm (dv,), blk.{i}.ssm_out (D, Hv dv)
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
    "blk.{i}.ffn_gate_inp.weight": "blk.{i}.ffn_gate_inp",
    "blk.{i}.exp_probs_b.bias": "blk.{i}.exp_probs_b",
    "blk.{i}.ffn_gate_exps.weight": "blk.{i}.ffn_gate_exps",
    "blk.{i}.ffn_up_exps.weight": "blk.{i}.ffn_up_exps",
    "blk.{i}.ffn_down_exps.weight": "blk.{i}.ffn_down_exps",
    "blk.{i}.ffn_gate_shexp.weight": "blk.{i}.ffn_gate_shexp",
    "blk.{i}.ffn_up_shexp.weight": "blk.{i}.ffn_up_shexp",
    "blk.{i}.ffn_down_shexp.weight": "blk.{i}.ffn_down_shexp",
    "blk.{i}.ffn_gate_inp_shexp.weight": "blk.{i}.ffn_gate_inp_shexp",
    # NextN / MTP (gguf-py constants.py MODEL_TENSOR.NEXTN_*)
    "blk.{i}.nextn.eh_proj.weight": "blk.{i}.nextn.eh_proj",
    "blk.{i}.nextn.enorm.weight": "blk.{i}.nextn.enorm",
    "blk.{i}.nextn.hnorm.weight": "blk.{i}.nextn.hnorm",
    "blk.{i}.nextn.shared_head_norm.weight": "blk.{i}.nextn.shared_head_norm",
    "blk.{i}.nextn.shared_head_head.weight": "blk.{i}.nextn.shared_head_head",
    "blk.{i}.nextn.embed_tokens.weight": "blk.{i}.nextn.embed_tokens",
    # gated DeltaNet layers (llama.cpp src/models/qwen3next.cpp, qwen35.cpp): qwen3next files hold
    # ssm_ba (and, written by older converters, ssm_in) in the grouped layout loaders/layouts.py
    # splits; qwen35 files ssm_beta and ssm_alpha
    "blk.{i}.attn_qkv.weight": "blk.{i}.attn_qkv",
    "blk.{i}.attn_gate.weight": "blk.{i}.attn_gate",
    "blk.{i}.ssm_in.weight": "blk.{i}.ssm_in",
    "blk.{i}.ssm_ba.weight": "blk.{i}.ssm_ba",
    "blk.{i}.ssm_beta.weight": "blk.{i}.ssm_beta",
    "blk.{i}.ssm_alpha.weight": "blk.{i}.ssm_alpha",
    "blk.{i}.ssm_conv1d.weight": "blk.{i}.ssm_conv1d",
    "blk.{i}.ssm_dt.bias": "blk.{i}.ssm_dt",
    "blk.{i}.ssm_a": "blk.{i}.ssm_a",
    "blk.{i}.ssm_norm.weight": "blk.{i}.ssm_norm",
    "blk.{i}.ssm_out.weight": "blk.{i}.ssm_out",
}

# per-architecture exceptions: glm4moe names its pre-FFN norm ATTN_POST_NORM (llama.cpp
# src/models/glm4-moe.cpp: attn_post_norm feeds the FFN), which other architectures use for a
# norm of the attention output
GGUF_ARCH_NAMES: dict[str, dict[str, str]] = {
    arch: {"blk.{i}.post_attention_norm.weight": "blk.{i}.ffn_norm"}
    for arch in ("glm4moe", "qwen3next", "qwen35", "qwen35moe")  # the Qwen hybrids likewise (qwen3next.cpp)
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
    # MoE (transformers modeling_qwen3_moe.py, modeling_glm4_moe.py, modeling_qwen2_moe.py): the
    # checkpoints' per-expert layout, which save_pretrained writes back (conversion_mapping.py)
    "model.layers.{i}.mlp.gate.weight": "blk.{i}.ffn_gate_inp",
    "model.layers.{i}.mlp.gate.e_score_correction_bias": "blk.{i}.exp_probs_b",
    "model.layers.{i}.mlp.experts.{j}.gate_proj.weight": "blk.{i}.ffn_gate_exps.{j}",
    "model.layers.{i}.mlp.experts.{j}.up_proj.weight": "blk.{i}.ffn_up_exps.{j}",
    "model.layers.{i}.mlp.experts.{j}.down_proj.weight": "blk.{i}.ffn_down_exps.{j}",
    "model.layers.{i}.mlp.shared_experts.gate_proj.weight": "blk.{i}.ffn_gate_shexp",
    "model.layers.{i}.mlp.shared_experts.up_proj.weight": "blk.{i}.ffn_up_shexp",
    "model.layers.{i}.mlp.shared_experts.down_proj.weight": "blk.{i}.ffn_down_shexp",
    "model.layers.{i}.mlp.shared_expert.gate_proj.weight": "blk.{i}.ffn_gate_shexp",
    "model.layers.{i}.mlp.shared_expert.up_proj.weight": "blk.{i}.ffn_up_shexp",
    "model.layers.{i}.mlp.shared_expert.down_proj.weight": "blk.{i}.ffn_down_shexp",
    "model.layers.{i}.mlp.shared_expert_gate.weight": "blk.{i}.ffn_gate_inp_shexp",
    # transformers >= 5 in-memory layout, for checkpoints saved without the reverse conversion:
    # gate_up_proj (E, 2F, D) = gate rows then up rows; down_proj (E, D, F)
    "model.layers.{i}.mlp.experts.gate_up_proj": "blk.{i}.ffn_gate_up_exps",
    "model.layers.{i}.mlp.experts.down_proj": "blk.{i}.ffn_down_exps",
    "model.layers.{i}.mlp.e_score_correction_bias": "blk.{i}.exp_probs_b",
    # Qwen3-Next gated DeltaNet layers (modeling_qwen3_next.py Qwen3NextGatedDeltaNet);
    # loaders/layouts.py turns ssm_in, ssm_ba, ssm_a_log into the canonical attn_qkv, attn_gate,
    # ssm_beta, ssm_alpha, ssm_a (llama.cpp's qwen35 names) at load
    "model.layers.{i}.linear_attn.in_proj_qkvz.weight": "blk.{i}.ssm_in",
    "model.layers.{i}.linear_attn.in_proj_ba.weight": "blk.{i}.ssm_ba",
    "model.layers.{i}.linear_attn.conv1d.weight": "blk.{i}.ssm_conv1d",
    "model.layers.{i}.linear_attn.dt_bias": "blk.{i}.ssm_dt",
    "model.layers.{i}.linear_attn.A_log": "blk.{i}.ssm_a_log",
    "model.layers.{i}.linear_attn.norm.weight": "blk.{i}.ssm_norm",
    "model.layers.{i}.linear_attn.out_proj.weight": "blk.{i}.ssm_out",
    # Qwen3.5 (modular_qwen3_5.py Qwen3_5GatedDeltaNet): the canonical layout already
    "model.layers.{i}.linear_attn.in_proj_qkv.weight": "blk.{i}.attn_qkv",
    "model.layers.{i}.linear_attn.in_proj_z.weight": "blk.{i}.attn_gate",
    "model.layers.{i}.linear_attn.in_proj_b.weight": "blk.{i}.ssm_beta",
    "model.layers.{i}.linear_attn.in_proj_a.weight": "blk.{i}.ssm_alpha",
    # MiniMax-M2 checkpoints (Mixtral-style names: w1 gate, w3 up, w2 down)
    "model.layers.{i}.block_sparse_moe.gate.weight": "blk.{i}.ffn_gate_inp",
    "model.layers.{i}.block_sparse_moe.e_score_correction_bias": "blk.{i}.exp_probs_b",
    "model.layers.{i}.block_sparse_moe.experts.{j}.w1.weight": "blk.{i}.ffn_gate_exps.{j}",
    "model.layers.{i}.block_sparse_moe.experts.{j}.w3.weight": "blk.{i}.ffn_up_exps.{j}",
    "model.layers.{i}.block_sparse_moe.experts.{j}.w2.weight": "blk.{i}.ffn_down_exps.{j}",
    # NextN / MTP layer i = num_hidden_layers (GLM-4.5 / DeepSeek-V3 checkpoints; vLLM
    # deepseek_mtp.py / glm4_moe_mtp.py read these names)
    "model.layers.{i}.eh_proj.weight": "blk.{i}.nextn.eh_proj",
    "model.layers.{i}.enorm.weight": "blk.{i}.nextn.enorm",
    "model.layers.{i}.hnorm.weight": "blk.{i}.nextn.hnorm",
    "model.layers.{i}.shared_head.norm.weight": "blk.{i}.nextn.shared_head_norm",
    "model.layers.{i}.shared_head.head.weight": "blk.{i}.nextn.shared_head_head",
    "model.layers.{i}.embed_tokens.weight": "blk.{i}.nextn.embed_tokens",
}


# Qwen3-Next / Qwen3.5 MTP heads (vLLM qwen3_next_mtp.py, qwen3_5_mtp.py): mtp.fc, the two pre-fc
# norms and the final norm around decoder layer(s) mtp.layers.{j}; loaded as NextN layer N + j under
# the DeepSeek names above (N = num_hidden_layers), as llama.cpp's converter does (conversion/qwen.py
# _Qwen35MtpMixin)
QWEN_MTP_NAMES = {"fc": "eh_proj", "pre_fc_norm_embedding": "enorm", "pre_fc_norm_hidden": "hnorm",
                  "norm": "shared_head.norm"}


def qwen_mtp_name(name: str, n_layers: int) -> str | None:
    """transformers' name of an ``mtp.*`` tensor as a NextN layer's (model.layers.{N + j}.*), or None."""
    parts = name.split(".")
    if len(parts) >= 4 and parts[1] == "layers" and parts[2].isdigit():
        return f"model.layers.{n_layers + int(parts[2])}." + ".".join(parts[3:])
    if len(parts) == 3 and parts[1] in QWEN_MTP_NAMES:
        return f"model.layers.{n_layers}.{QWEN_MTP_NAMES[parts[1]]}.{parts[2]}"
    return None


class NameMap:
    """Compiled form of one of the dicts above: source name <-> canonical name."""

    def __init__(self, table: dict[str, str]):
        self._rules = []
        self._back = []
        for src, dst in table.items():
            pat = "^" + re.escape(src).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{j\}", r"(?P<j>\d+)") + "$"
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
GGUF_ARCH_MAPS = {arch: NameMap({**extra, **GGUF_NAMES}) for arch, extra in GGUF_ARCH_NAMES.items()}
HF_MAP = NameMap(HF_NAMES)
