"""Tiny random checkpoints for tests: HF directories (config.json, safetensors in BF16/F16/F32,
FP8 block-scaled, ModelOpt NVFP4; a byte-level tokenizer.json) written from NumPy arrays."""
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

ARCHS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def random_weights(cfg: dict, family: str, vocab: int, rng: np.random.Generator, tied: bool) -> dict[str, np.ndarray]:
    D, F, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    H, K, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    w = lambda *s: (rng.standard_normal(s) * 0.08).astype(np.float32)  # noqa: E731
    norm = lambda n: (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)  # noqa: E731
    t = {"model.embed_tokens.weight": w(vocab, D), "model.norm.weight": norm(D)}
    if not tied:
        t["lm_head.weight"] = w(vocab, D)
    for i in range(L):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(D)
        t[p + "post_attention_layernorm.weight"] = norm(D)
        t[p + "self_attn.q_proj.weight"] = w(H * hd, D)
        t[p + "self_attn.k_proj.weight"] = w(K * hd, D)
        t[p + "self_attn.v_proj.weight"] = w(K * hd, D)
        t[p + "self_attn.o_proj.weight"] = w(D, H * hd)
        t[p + "mlp.gate_proj.weight"] = w(F, D)
        t[p + "mlp.up_proj.weight"] = w(F, D)
        t[p + "mlp.down_proj.weight"] = w(D, F)
        if family == "qwen2":
            for n, o in (("q", H * hd), ("k", K * hd), ("v", K * hd)):
                t[p + f"self_attn.{n}_proj.bias"] = w(o)
        if family == "qwen3":
            t[p + "self_attn.q_norm.weight"] = norm(hd)
            t[p + "self_attn.k_norm.weight"] = norm(hd)
    return t


def make_hf_dir(root: Path, family: str = "llama", dtype: str = "BF16", tied: bool = False, seed: int = 0, **overrides) -> tuple[Path, dict]:
    """Write a tiny random model; return (dir, float32 weights as stored, i.e. after rounding)."""
    root.mkdir(parents=True, exist_ok=True)
    vocab = byte_level_tokenizer_json(root / "tokenizer.json")
    cfg = dict(TINY, **overrides)
    cfg.update(architectures=[ARCHS[family]], model_type=family, vocab_size=vocab, tie_word_embeddings=tied)
    (root / "config.json").write_text(json.dumps(cfg))
    (root / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|im_end|>", "bos_token": None,
        "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    }))
    rng = np.random.default_rng(seed)
    weights = random_weights(cfg, family, vocab, rng, tied)
    stored, as_float = {}, {}
    for name, a in weights.items():
        if dtype == "BF16" and a.ndim == 2:
            bits = f32_to_bf16_bits(a)
            stored[name] = ("BF16", bits)
            as_float[name] = (bits.astype(np.uint32) << 16).view(np.float32)
        elif dtype == "F16" and a.ndim == 2:
            h = a.astype(np.float16)
            stored[name] = ("F16", h)
            as_float[name] = h.astype(np.float32)
        else:
            stored[name] = ("F32", a)
            as_float[name] = a
    write_safetensors(root / "model.safetensors", stored)
    return root, as_float


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
