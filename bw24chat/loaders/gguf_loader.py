"""GGUF files through the `gguf` package's memory-mapped reader (no copy of the file).

GGUF metadata -> an HF-style config dict (so one ``ModelArgs.from_dict`` serves both formats),
tensors -> QTensor under canonical names (names.GGUF_NAMES), tokenizer -> tokenizers.Tokenizer.

RoPE: llama.cpp's converter permutes the Q and K rows of *llama*-arch models so that rotation
pairs are adjacent (GPT-J style, "normal" rope); qwen2/qwen3 keep HF's half-split ("neox")
layout.  The config records which, as ``rope_style``.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.constants import GGMLQuantizationType as T

from .. import quants
from ..tokenizer import TokenizerInfo, collect_stop_ids, tokenizer_from_gguf_fields
from .names import GGUF_ARCH_MAPS, GGUF_MAP
from .tensor import ExpertTensor, QTensor

# llama.cpp architectures -> our model families, and their rope layout in GGUF
ARCH_FAMILY = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
               "qwen3moe": "qwen3_moe", "glm4moe": "glm4_moe", "minimax-m2": "minimax_m2"}
ROPE_STYLE = {"llama": "normal", "mistral": "normal", "qwen2": "neox", "qwen3": "neox",
              "qwen3moe": "neox", "glm4moe": "neox", "minimax-m2": "neox"}
# MoE metadata (gguf-py constants.py Keys.LLM) -> the HF-style config keys models/moe.py reads
MOE_KEYS = {
    "expert_count": "num_experts", "expert_used_count": "num_experts_per_tok",
    "expert_feed_forward_length": "moe_intermediate_size", "expert_shared_count": "n_shared_experts",
    "expert_weights_scale": "routed_scaling_factor", "expert_weights_norm": "norm_topk_prob",
    "leading_dense_block_count": "first_k_dense_replace", "expert_group_count": "n_group",
    "expert_group_used_count": "topk_group",
}
GATING_FUNC = {1: "softmax", 2: "sigmoid"}  # gguf-py ExpertGatingFuncType
_LAYER = re.compile(r"^blk\.(\d+)\.")


def _field(reader: GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def read_metadata(reader: GGUFReader) -> dict:
    """All scalar/string metadata (arrays of tokens/merges are read lazily elsewhere)."""
    out = {}
    for k, f in reader.fields.items():
        if k in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            continue
        try:
            out[k] = f.contents()
        except Exception:  # noqa: BLE001 - exotic field types are not needed
            pass
    return out


def config_from_metadata(md: dict, tensor_names: set[str]) -> dict:
    arch = md["general.architecture"]
    if arch not in ARCH_FAMILY:
        raise ValueError(f"unsupported GGUF architecture {arch!r} (supported: {sorted(ARCH_FAMILY)})")

    def g(key, default=None):
        return md.get(f"{arch}.{key}", default)

    n_head = g("attention.head_count")
    d_model = g("embedding_length")
    cfg = {
        "model_type": ARCH_FAMILY[arch],
        "hidden_size": d_model,
        "intermediate_size": g("feed_forward_length"),
        "num_hidden_layers": g("block_count"),
        "num_attention_heads": n_head,
        "num_key_value_heads": g("attention.head_count_kv", n_head),
        "head_dim": g("attention.key_length", d_model // n_head),
        "rms_norm_eps": g("attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": g("rope.freq_base", 10000.0),
        "max_position_embeddings": g("context_length", 4096),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "rope_style": ROPE_STYLE[arch],
        "partial_rotary_factor": (g("rope.dimension_count") or g("attention.key_length", d_model // n_head))
        / g("attention.key_length", d_model // n_head),
    }
    # NextN / MTP layers are counted in block_count but follow the trunk (llama.cpp glm4-moe.cpp)
    cfg["num_hidden_layers"] -= g("nextn_predict_layers", 0) or 0
    for key, hf_key in MOE_KEYS.items():
        v = g(key)
        if v is not None:  # a per-layer array (minimax-m2's expert_feed_forward_length) is uniform
            cfg[hf_key] = max(v) if isinstance(v, list) else v
    if g("expert_gating_func") is not None:
        cfg["scoring_func"] = GATING_FUNC[g("expert_gating_func")]
    if cfg.get("routed_scaling_factor") == 0:  # llama.cpp: 0 = no scaling
        cfg["routed_scaling_factor"] = 1.0
    vocab = g("vocab_size")
    if vocab is not None:
        cfg["vocab_size"] = vocab
    st = g("rope.scaling.type")
    if st and st != "none":
        rs = {"rope_type": st, "factor": g("rope.scaling.factor", 1.0)}
        if st == "yarn":
            rs["original_max_position_embeddings"] = g("rope.scaling.original_context_length")
            rs["beta_fast"] = g("rope.scaling.yarn_beta_fast", 32.0)
            rs["beta_slow"] = g("rope.scaling.yarn_beta_slow", 1.0)
        cfg["rope_scaling"] = rs
    elif "rope_freqs.weight" in tensor_names:
        cfg["rope_scaling"] = {"rope_type": "freq_factors"}  # llama3 scaling baked into a tensor
    return cfg


def load_gguf(path: Path):
    from . import Checkpoint  # late: avoids an import cycle

    reader = GGUFReader(str(path), "r")
    md = read_metadata(reader)
    names = {t.name for t in reader.tensors}
    cfg = config_from_metadata(md, names)
    name_map = GGUF_ARCH_MAPS.get(md["general.architecture"], GGUF_MAP)
    tensors: dict[str, QTensor] = {}
    unknown = []
    extra = {}
    for t in reader.tensors:
        qtype = T(t.tensor_type)
        if qtype not in quants.SUPPORTED:
            raise ValueError(f"{path.name}: tensor {t.name} has ggml type {qtype.name}, which bw24chat does not support")
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))  # ggml ne[] is innermost first
        if t.name == "rope_freqs.weight":
            extra["rope_freqs"] = np.array(t.data, dtype=np.float32)
            continue
        m = _LAYER.match(t.name)
        if m and int(m.group(1)) >= cfg["num_hidden_layers"]:
            continue  # NextN / MTP layers: not used yet
        canon = name_map.canonical(t.name)
        if canon is None:
            unknown.append(t.name)
            continue
        if canon.endswith("_exps"):  # (E, out, in): one memory-mapped tensor, experts are its slices
            tensors[canon] = ExpertTensor.from_array(canon, qtype.name, shape, t.data)
        else:
            tensors[canon] = QTensor(canon, qtype.name, shape, t.data)
    if unknown:
        raise ValueError(f"{path.name}: tensors with no mapping: {unknown[:5]}{'...' if len(unknown) > 5 else ''}")
    if extra.get("rope_freqs") is not None:
        cfg["rope_freqs"] = extra["rope_freqs"].tolist()

    fields = {
        k[len("tokenizer.ggml.") :]: _field(reader, k)
        for k in reader.fields
        if k.startswith("tokenizer.ggml.")
    }
    tk = tokenizer_from_gguf_fields(fields)
    eos = fields.get("eos_token_id")
    eot = [fields[k] for k in ("eot_token_id", "eom_token_id") if fields.get(k) is not None]
    add_bos = fields.get("add_bos_token")
    if add_bos is None:
        add_bos = fields.get("model") == "llama"  # llama.cpp's default for SentencePiece vocabularies
    tok = TokenizerInfo(
        tk,
        bos_id=fields.get("bos_token_id"),
        eos_id=eos,
        stop_ids=collect_stop_ids(tk, eos, eot),
        add_bos=bool(add_bos),
        chat_template=md.get("tokenizer.chat_template"),
    )
    if "vocab_size" not in cfg:
        cfg["vocab_size"] = tensors["tok_embd"].shape[0]
    return Checkpoint(
        path=path,
        source="gguf",
        name=md.get("general.name") or path.stem,
        config=cfg,
        tensors=tensors,
        tokenizer=tok,
        generation_config={},
        _keepalive=reader,
    )
