"""Tiny random checkpoints for tests: HF directories (config.json, safetensors in BF16/F16/F32,
FP8 block-scaled, ModelOpt NVFP4; a byte-level tokenizer.json) written from NumPy arrays, and
the same weights as a GGUF file (MoE families: ``write_gguf``)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from bw24chat.loaders.hf_loader import write_safetensors  # noqa: F401  (re-exported for tests)
from bw24chat.quants import f32_to_bf16_bits


def byte_level_tokenizer_json(path: Path, extra_special: list[str] = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")) -> int:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(alphabet))}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(list(extra_special))
    tk.save(str(path))
    return tk.get_vocab_size()


TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=256)

ARCHS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
         "qwen3_moe": "Qwen3MoeForCausalLM", "glm4_moe": "Glm4MoeForCausalLM", "minimax_m2": "MiniMaxM2ForCausalLM"}

# tiny MoE configs in each family's own config.json keys: 8 experts, top-3, a dense layer where
# the family has them, and every routing switch on (groups, scaling, shared expert, QK-norms)
TINY_MOE = {
    "qwen3_moe": dict(num_hidden_layers=3, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
                      norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1]),
    "glm4_moe": dict(num_hidden_layers=3, n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
                     n_shared_experts=1, first_k_dense_replace=1, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                     norm_topk_prob=True, partial_rotary_factor=0.5, use_qk_norm=True, attention_bias=True),
    "minimax_m2": dict(num_local_experts=8, num_experts_per_tok=3, intermediate_size=32, rotary_dim=8),
}


def random_weights(cfg: dict, family: str, vocab: int, rng: np.random.Generator, tied: bool) -> dict[str, np.ndarray]:
    from bw24chat.models import get_family

    moe_args = get_family(family).ModelArgs.from_dict(cfg) if family in TINY_MOE else None
    D, F, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    H, K, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    w = lambda *s: (rng.standard_normal(s) * 0.08).astype(np.float32)  # noqa: E731
    norm = lambda n: (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)  # noqa: E731
    t = {"model.embed_tokens.weight": w(vocab, D), "model.norm.weight": norm(D)}
    if not tied:
        t["lm_head.weight"] = w(vocab, D)
    n_mtp = cfg.get("num_nextn_predict_layers") or 0
    for i in range(L + n_mtp):  # NextN / MTP layers (GLM-4.5 naming) follow the trunk's
        p = f"model.layers.{i}."
        if i >= L:
            t.update({p + "eh_proj.weight": w(D, 2 * D), p + "enorm.weight": norm(D), p + "hnorm.weight": norm(D),
                      p + "shared_head.norm.weight": norm(D), p + "shared_head.head.weight": w(vocab, D)})
        t[p + "input_layernorm.weight"] = norm(D)
        t[p + "post_attention_layernorm.weight"] = norm(D)
        t[p + "self_attn.q_proj.weight"] = w(H * hd, D)
        t[p + "self_attn.k_proj.weight"] = w(K * hd, D)
        t[p + "self_attn.v_proj.weight"] = w(K * hd, D)
        t[p + "self_attn.o_proj.weight"] = w(D, H * hd)
        if family in TINY_MOE and moe_args.is_moe_layer(i):
            t.update(_moe_layer(p, family, moe_args, w, rng))
        else:
            t[p + "mlp.gate_proj.weight"] = w(F, D)
            t[p + "mlp.up_proj.weight"] = w(F, D)
            t[p + "mlp.down_proj.weight"] = w(D, F)
        if family == "qwen2" or (family == "glm4_moe" and cfg.get("attention_bias")):
            for n, o in (("q", H * hd), ("k", K * hd), ("v", K * hd)):
                t[p + f"self_attn.{n}_proj.bias"] = w(o)
        if family in ("qwen3", "qwen3_moe") or (family == "glm4_moe" and cfg.get("use_qk_norm")):
            t[p + "self_attn.q_norm.weight"] = norm(hd)
            t[p + "self_attn.k_norm.weight"] = norm(hd)
        if family == "minimax_m2":  # one norm over the whole q / k projection
            t[p + "self_attn.q_norm.weight"] = norm(H * hd)
            t[p + "self_attn.k_norm.weight"] = norm(K * hd)
    return t


def _moe_layer(p: str, family: str, a, w, rng) -> dict[str, np.ndarray]:
    """One sparse layer's tensors under the checkpoint's names (per-expert layout)."""
    D, E, F = a.hidden_size, a.num_experts, a.moe_intermediate_size
    moe = "block_sparse_moe." if family == "minimax_m2" else "mlp."
    proj = ("w1", "w3", "w2") if family == "minimax_m2" else ("gate_proj", "up_proj", "down_proj")
    t = {p + moe + "gate.weight": w(E, D) * 4}  # larger logits: routing far from uniform
    for j in range(E):
        for name, shape in zip(proj, ((F, D), (F, D), (D, F))):
            t[p + f"{moe}experts.{j}.{name}.weight"] = w(*shape)
    if a.scoring_func == "sigmoid":
        bias = (0.05 * rng.standard_normal(E)).astype(np.float32)
        t[p + ("block_sparse_moe.e_score_correction_bias" if family == "minimax_m2" else "mlp.gate.e_score_correction_bias")] = bias
    if a.n_shared_experts:
        Fs = F * a.n_shared_experts
        for name, shape in zip(("gate_proj", "up_proj", "down_proj"), ((Fs, D), (Fs, D), (D, Fs))):
            t[p + f"mlp.shared_experts.{name}.weight"] = w(*shape)
    return t


def fuse_experts(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """transformers >= 5's in-memory expert layout (gate_up_proj (E, 2F, D), down_proj (E, D, F)),
    as a checkpoint saved without the reverse conversion would hold it."""
    import re

    out, parts = {}, {}
    for name, a in weights.items():
        m = re.match(r"^(model\.layers\.\d+\.)(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight$", name)
        if m:
            parts.setdefault(m.group(1), {}).setdefault(m.group(3), {})[int(m.group(2))] = a
        else:
            out[name] = a
    for prefix, by_proj in parts.items():
        gate, up, down = (by_proj.get(g) or by_proj[h] for g, h in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")))
        E = len(gate)
        out[prefix + "mlp.experts.gate_up_proj"] = np.stack([np.concatenate([gate[j], up[j]]) for j in range(E)])
        out[prefix + "mlp.experts.down_proj"] = np.stack([down[j] for j in range(E)])
    return out


def make_hf_dir(root: Path, family: str = "llama", dtype: str = "BF16", tied: bool = False, seed: int = 0,
                fused_experts: bool = False, edit=None, **overrides) -> tuple[Path, dict]:
    """Write a tiny random model; return (dir, float32 weights as stored, i.e. after rounding).
    MoE families get TINY_MOE's config; ``fused_experts`` stores their experts fused;
    ``num_nextn_predict_layers`` adds NextN / MTP layers in GLM-4.5's naming; ``edit(weights)``
    may change the float32 weights (by name) before they are written."""
    root.mkdir(parents=True, exist_ok=True)
    vocab = byte_level_tokenizer_json(root / "tokenizer.json")
    cfg = {**TINY, **TINY_MOE.get(family, {}), **overrides}
    cfg.update(architectures=[ARCHS[family]], model_type=family, vocab_size=vocab, tie_word_embeddings=tied)
    (root / "config.json").write_text(json.dumps(cfg))
    (root / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|im_end|>", "bos_token": None,
        "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    }))
    rng = np.random.default_rng(seed)
    weights = random_weights(cfg, family, vocab, rng, tied)
    if edit:
        edit(weights)
    if fused_experts:
        weights = fuse_experts(weights)
    stored, as_float = {}, {}
    for name, a in weights.items():
        if dtype == "BF16" and a.ndim >= 2:
            bits = f32_to_bf16_bits(a)
            stored[name] = ("BF16", bits)
            as_float[name] = (bits.astype(np.uint32) << 16).view(np.float32)
        elif dtype == "F16" and a.ndim >= 2:
            h = a.astype(np.float16)
            stored[name] = ("F16", h)
            as_float[name] = h.astype(np.float32)
        else:
            stored[name] = ("F32", a)
            as_float[name] = a
    write_safetensors(root / "model.safetensors", stored)
    return root, as_float


# llama.cpp's names for the HF layer tensors (gguf-py tensor_mapping.py), written out here rather
# than derived from bw24chat.loaders.names so that a wrong entry there cannot go unnoticed
_GGUF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight", "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
    "mlp.gate.e_score_correction_bias": "exp_probs_b.bias", "block_sparse_moe.e_score_correction_bias": "exp_probs_b.bias",
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight", "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
    # NextN / MTP (gguf-py constants.py MODEL_TENSOR.NEXTN_*)
    "eh_proj.weight": "nextn.eh_proj.weight", "enorm.weight": "nextn.enorm.weight", "hnorm.weight": "nextn.hnorm.weight",
    "shared_head.norm.weight": "nextn.shared_head_norm.weight", "shared_head.head.weight": "nextn.shared_head_head.weight",
}
_GGUF_ARCH = {"qwen3_moe": "qwen3moe", "glm4_moe": "glm4moe", "minimax_m2": "minimax-m2"}


def write_gguf(path: Path, hf_dir: Path, weights: dict[str, np.ndarray]) -> Path:
    """The MoE checkpoint of ``make_hf_dir`` (its float32 ``weights``, per-expert layout) as a
    llama.cpp-style F32 GGUF: 3-D ``ffn_*_exps``, MoE metadata keys, the same tokenizer."""
    import re

    import gguf

    cfg = json.loads((hf_dir / "config.json").read_text())
    family = cfg["model_type"]
    arch = _GGUF_ARCH[family]
    hd = cfg["head_dim"]
    wr = gguf.GGUFWriter(str(path), arch)
    wr.add_name("tiny-" + family)
    n_mtp = cfg.get("num_nextn_predict_layers") or 0
    wr.add_block_count(cfg["num_hidden_layers"] + n_mtp)  # llama.cpp counts NextN layers in block_count
    if n_mtp:
        wr.add_uint32(f"{arch}.nextn_predict_layers", n_mtp)
    wr.add_context_length(cfg["max_position_embeddings"])
    wr.add_embedding_length(cfg["hidden_size"])
    wr.add_feed_forward_length(cfg["intermediate_size"])
    wr.add_head_count(cfg["num_attention_heads"])
    wr.add_head_count_kv(cfg["num_key_value_heads"])
    wr.add_key_length(hd)
    wr.add_value_length(hd)
    wr.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    wr.add_rope_freq_base(cfg["rope_theta"])
    wr.add_rope_dimension_count(cfg.get("rotary_dim") or int(hd * cfg.get("partial_rotary_factor", 1.0)))
    wr.add_expert_count(cfg.get("num_experts") or cfg.get("n_routed_experts") or cfg.get("num_local_experts"))
    wr.add_expert_used_count(cfg["num_experts_per_tok"])
    wr.add_expert_feed_forward_length(cfg.get("moe_intermediate_size") or cfg["intermediate_size"])
    if family != "qwen3_moe":
        wr.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    if family == "glm4_moe":
        wr.add_expert_shared_count(cfg["n_shared_experts"])
        wr.add_leading_dense_block_count(cfg["first_k_dense_replace"])
        wr.add_expert_weights_scale(cfg["routed_scaling_factor"])
        wr.add_expert_weights_norm(cfg["norm_topk_prob"])
        wr.add_uint32(f"{arch}.expert_group_count", cfg["n_group"])
        wr.add_uint32(f"{arch}.expert_group_used_count", cfg["topk_group"])
    vocab = Tokenizer.from_file(str(hf_dir / "tokenizer.json")).get_vocab()
    wr.add_tokenizer_model("gpt2")
    wr.add_tokenizer_pre("default")
    wr.add_token_list([t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])])
    wr.add_token_merges([])
    wr.add_eos_token_id(vocab["<|im_end|>"])

    experts: dict[str, dict[int, np.ndarray]] = {}
    for name, a in weights.items():
        if name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
            wr.add_tensor({"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                           "lm_head.weight": "output.weight"}[name], a)
            continue
        i, rest = re.match(r"^model\.layers\.(\d+)\.(.+)$", name).groups()
        m = re.match(r"^(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight$", rest)
        if m:
            proj = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down", "w2": "down"}[m.group(2)]
            experts.setdefault(f"blk.{i}.ffn_{proj}_exps.weight", {})[int(m.group(1))] = a
            continue
        gname = _GGUF_LAYER[rest]
        if family == "glm4_moe" and gname == "ffn_norm.weight":
            gname = "post_attention_norm.weight"  # llama.cpp's glm4moe name for the pre-FFN norm
        wr.add_tensor(f"blk.{i}.{gname}", a)
    for name, by_id in experts.items():
        wr.add_tensor(name, np.stack([by_id[j] for j in range(len(by_id))]))  # (E, out, in)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path


def make_gguf(path: Path, seed: int = 0, metadata: dict | None = None, **overrides) -> Path:
    """A tiny llama GGUF as llama.cpp's converter writes one: F32 norms, Q8_0 embedding, Q4_1
    projections, a byte-level BPE vocabulary with ChatML markers and a chat template.
    ``metadata`` replaces header fields (key -> value, None drops the key), so that a header
    can lie about the weights it describes."""
    import gguf
    from gguf.constants import GGMLQuantizationType as Q
    from gguf.quants import quantize

    cfg = dict(TINY, **overrides)
    D, F, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = alphabet + ["Ġt", "he", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    rng = np.random.default_rng(seed)
    weights = random_weights(cfg, "llama", len(tokens), rng, tied=True)
    U32, F32, STR = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.STRING
    meta = {
        "general.name": ("Tiny Llama", STR),
        "llama.context_length": (cfg["max_position_embeddings"], U32),
        "llama.embedding_length": (D, U32),
        "llama.feed_forward_length": (F, U32),
        "llama.block_count": (L, U32),
        "llama.attention.head_count": (cfg["num_attention_heads"], U32),
        "llama.attention.head_count_kv": (cfg["num_key_value_heads"], U32),
        "llama.rope.freq_base": (cfg["rope_theta"], F32),
        "llama.attention.layer_norm_rms_epsilon": (cfg["rms_norm_eps"], F32),
        "general.file_type": (3, U32),
        "tokenizer.ggml.model": ("gpt2", STR),
        "tokenizer.ggml.pre": ("smollm", STR),
        "tokenizer.ggml.tokens": (tokens, gguf.GGUFValueType.ARRAY),
        "tokenizer.ggml.token_type": ([1] * (len(alphabet) + 2) + [3, 3, 3], gguf.GGUFValueType.ARRAY),
        "tokenizer.ggml.merges": (["Ġ t", "h e"], gguf.GGUFValueType.ARRAY),
        "tokenizer.ggml.bos_token_id": (len(tokens) - 1, U32),
        "tokenizer.ggml.eos_token_id": (len(tokens) - 2, U32),
        "tokenizer.ggml.add_bos_token": (False, gguf.GGUFValueType.BOOL),
        "tokenizer.chat_template": ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                                    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}", STR),
    }
    for key, value in (metadata or {}).items():
        kind = meta[key][1] if key in meta else STR if isinstance(value, str) else F32 if isinstance(value, float) else U32
        meta[key] = (value, kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "llama")
    for key, (value, kind) in meta.items():
        if value is not None:
            w.add_key_value(key, value, kind, gguf.GGUFValueType.get_type(value[0]) if kind == gguf.GGUFValueType.ARRAY else None)
    hf_to_gguf = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    roles = {"input_layernorm.weight": "attn_norm", "post_attention_layernorm.weight": "ffn_norm",
             "self_attn.q_proj.weight": "attn_q", "self_attn.k_proj.weight": "attn_k", "self_attn.v_proj.weight": "attn_v",
             "self_attn.o_proj.weight": "attn_output", "mlp.gate_proj.weight": "ffn_gate", "mlp.up_proj.weight": "ffn_up",
             "mlp.down_proj.weight": "ffn_down"}
    for i in range(L):
        hf_to_gguf.update({f"model.layers.{i}.{k}": f"blk.{i}.{v}.weight" for k, v in roles.items()})
    for hf_name, a in weights.items():
        name = hf_to_gguf[hf_name]
        qtype = Q.F32 if a.ndim == 1 else Q.Q8_0 if name == "token_embd.weight" else Q.Q4_1
        data = a if qtype == Q.F32 else quantize(a, qtype)
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
