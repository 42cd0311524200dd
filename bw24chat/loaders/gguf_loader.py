"""GGUF files through our own bounds-checked, memory-mapped reader (gguf_reader.py; no copy).

GGUF metadata -> an HF-style config dict (so one ``ModelArgs.from_dict`` serves both formats),
tensors -> QTensor under canonical names (names.GGUF_NAMES), tokenizer -> tokenizers.Tokenizer.

RoPE: llama.cpp's converter permutes the Q and K rows of *llama*-arch models so that rotation
pairs are adjacent (GPT-J style, "normal" rope); qwen2/qwen3 keep HF's half-split ("neox")
layout.  The config records which, as ``rope_style``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import quants
from ..tokenizer import TokenizerInfo, collect_stop_ids, tokenizer_from_gguf_fields
from .checks import split_nextn
from .errors import ModelFileError
from .gguf_reader import GGUFFile
from .layouts import GGUF_LAYOUTS
from .names import GGUF_ARCH_MAPS, GGUF_MAP
from .tensor import ExpertTensor, QTensor

# llama.cpp architectures -> our model families, and their rope layout in GGUF
ARCH_FAMILY = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
               "qwen3moe": "qwen3_moe", "glm4moe": "glm4_moe", "minimax-m2": "minimax_m2", "qwen3next": "qwen3_next",
               "qwen35": "qwen3_5", "qwen35moe": "qwen3_5_moe"}
ROPE_STYLE = {"llama": "normal", "mistral": "normal", "qwen2": "neox", "qwen3": "neox",
              "qwen3moe": "neox", "glm4moe": "neox", "minimax-m2": "neox", "qwen3next": "neox", "qwen35": "neox",
              "qwen35moe": "neox"}
# llama.cpp's converter reorders Qwen3.5's value heads from grouped by key head to tiled, for
# ggml's broadcasting repeat (conversion/qwen.py _LinearAttentionVReorderBase; ops.DeltaNetSpec)
V_HEAD_ORDER = {"qwen35": "tiled", "qwen35moe": "tiled"}
# MoE metadata (gguf-py constants.py Keys.LLM) -> the HF-style config keys models/moe.py reads
MOE_KEYS = {
    "expert_count": "num_experts", "expert_used_count": "num_experts_per_tok",
    "expert_feed_forward_length": "moe_intermediate_size", "expert_shared_count": "n_shared_experts",
    "expert_weights_scale": "routed_scaling_factor", "expert_weights_norm": "norm_topk_prob",
    "leading_dense_block_count": "first_k_dense_replace", "expert_group_count": "n_group",
    "expert_group_used_count": "topk_group", "expert_shared_feed_forward_length": "shared_expert_intermediate_size",
}
# gated DeltaNet metadata (llama.cpp qwen3next.cpp load_arch_hparams; conversion/qwen.py writes
# state_size = linear_key_head_dim, group_count = key heads, time_step_rank = value heads,
# inner_size = value heads x linear_value_head_dim)
SSM_KEYS = {
    "ssm.conv_kernel": "linear_conv_kernel_dim", "ssm.state_size": "linear_key_head_dim",
    "ssm.group_count": "linear_num_key_heads", "ssm.time_step_rank": "linear_num_value_heads",
    "full_attention_interval": "full_attention_interval",
}
GATING_FUNC = {1: "softmax", 2: "sigmoid"}  # gguf-py ExpertGatingFuncType

# config key -> GGUF key under "{arch}." (llama.cpp's LLM_KV names), for values and messages
CONFIG_KEYS = {
    "hidden_size": "embedding_length",
    "intermediate_size": "feed_forward_length",
    "num_hidden_layers": "block_count",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv",
    "head_dim": "attention.key_length",
    "rms_norm_eps": "attention.layer_norm_rms_epsilon",
    "rope_theta": "rope.freq_base",
    "max_position_embeddings": "context_length",
    "vocab_size": "vocab_size",
    "partial_rotary_factor": "rope.dimension_count",
    "rope_scaling": "rope.scaling.type",
}
CONFIG_DEFAULTS = {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 4096}

# tokenizer.ggml.* fields and the Python types they must have (gguf.md "Tokenizer")
_TOKENIZER_TYPES = {
    "model": str, "pre": str, "tokens": list, "merges": list, "token_type": np.ndarray, "scores": np.ndarray,
    "bos_token_id": int, "eos_token_id": int, "eot_token_id": int, "eom_token_id": int, "unknown_token_id": int,
    "padding_token_id": int, "add_bos_token": bool, "add_space_prefix": bool,
}


def _typed(path: Path, md: dict, key: str, kind: type):
    """``md[key]`` (None when absent), refused unless it is a ``kind`` (a bool is no int)."""
    v = md.get(key)
    if v is not None and (not isinstance(v, kind) or (kind is int and isinstance(v, bool))):
        raise ModelFileError(path, f"expected {kind.__name__}, found {type(v).__name__}", key)
    return v


def config_from_metadata(path: Path, md: dict, tensor_names: set[str]) -> tuple[dict, dict[str, str]]:
    """(HF-style config, config key -> GGUF field name).  Values are taken as the file has them;
    loaders.checks judges them."""
    arch = _typed(path, md, "general.architecture", str)
    if arch is None:
        raise ModelFileError(path, "missing: the file does not say which model it holds", "general.architecture")
    if arch not in ARCH_FAMILY:
        raise ModelFileError(path, f"{arch!r} is not supported (supported: {sorted(ARCH_FAMILY)})", "general.architecture")
    names = {k: f"{arch}.{v}" for k, v in CONFIG_KEYS.items()}
    cfg = {"model_type": ARCH_FAMILY[arch], "rope_style": ROPE_STYLE[arch],
           "tie_word_embeddings": "output.weight" not in tensor_names}
    for key, field in names.items():
        if key not in ("partial_rotary_factor", "rope_scaling") and (v := md.get(field, CONFIG_DEFAULTS.get(key))) is not None:
            cfg[key] = v
    rot = _typed(path, md, names["partial_rotary_factor"], int)
    hd = cfg.get("head_dim")
    if hd is None and isinstance(cfg.get("hidden_size"), int) and isinstance(cfg.get("num_attention_heads"), int) \
            and cfg["num_attention_heads"] > 0:
        hd = cfg["hidden_size"] // cfg["num_attention_heads"]
    if rot is not None and isinstance(hd, int) and hd > 0:
        cfg["partial_rotary_factor"] = rot / hd
    # NextN / MTP layers are counted in block_count but follow the trunk (llama.cpp glm4-moe.cpp)
    nextn = _typed(path, md, f"{arch}.nextn_predict_layers", int) or 0
    if nextn and isinstance(cfg.get("num_hidden_layers"), int):
        cfg["num_hidden_layers"] -= nextn
        cfg["num_nextn_predict_layers"] = nextn
    for key, hf_key in MOE_KEYS.items():
        v = md.get(f"{arch}.{key}")
        if v is not None:  # a per-layer array (minimax-m2's expert_feed_forward_length) is uniform
            cfg[hf_key] = max(v.tolist() if isinstance(v, np.ndarray) else v) if isinstance(v, (list, np.ndarray)) else v
            names[hf_key] = f"{arch}.{key}"
    _deltanet_config(path, md, arch, cfg, names)
    gating = md.get(f"{arch}.expert_gating_func")
    if gating is not None:
        if gating not in GATING_FUNC:
            raise ModelFileError(path, f"{gating!r} is not a gating function bw24chat knows ({GATING_FUNC})",
                                 f"{arch}.expert_gating_func")
        cfg["scoring_func"] = GATING_FUNC[gating]
    if cfg.get("routed_scaling_factor") == 0:  # llama.cpp: 0 = no scaling
        cfg["routed_scaling_factor"] = 1.0
    st = _typed(path, md, f"{arch}.rope.scaling.type", str)
    if st and st != "none":
        rs = {"rope_type": st, "factor": md.get(f"{arch}.rope.scaling.factor", 1.0)}
        if st == "yarn":
            rs["original_max_position_embeddings"] = md.get(f"{arch}.rope.scaling.original_context_length")
            rs["beta_fast"] = md.get(f"{arch}.rope.scaling.yarn_beta_fast", 32.0)
            rs["beta_slow"] = md.get(f"{arch}.rope.scaling.yarn_beta_slow", 1.0)
        cfg["rope_scaling"] = rs
    elif "rope_freqs.weight" in tensor_names:
        cfg["rope_scaling"] = {"rope_type": "freq_factors"}  # llama3 scaling baked into a tensor
    return cfg, names


def _deltanet_config(path: Path, md: dict, arch: str, cfg: dict, names: dict) -> None:
    """The gated DeltaNet settings of a hybrid file into ``cfg`` (HF config keys)."""
    if arch in V_HEAD_ORDER:
        cfg["linear_v_head_order"] = V_HEAD_ORDER[arch]
    for key, hf_key in SSM_KEYS.items():
        if (v := md.get(f"{arch}.{key}")) is not None:
            cfg[hf_key], names[hf_key] = v, f"{arch}.{key}"
    inner, hv = md.get(f"{arch}.ssm.inner_size"), cfg.get("linear_num_value_heads")
    if isinstance(inner, int) and isinstance(hv, int) and hv > 0:
        cfg["linear_value_head_dim"] = inner // hv
        names["linear_value_head_dim"] = f"{arch}.ssm.inner_size"
    # which layers are recurrent, where the file lists them (trunk first, then any MTP layers)
    flags = md.get(f"{arch}.attention.recurrent_layers")
    if flags is not None and isinstance(cfg.get("num_hidden_layers"), int):
        flags = flags.tolist() if isinstance(flags, np.ndarray) else flags
        if not isinstance(flags, list) or len(flags) < cfg["num_hidden_layers"]:
            raise ModelFileError(path, f"expected a flag for each of the {cfg['num_hidden_layers']} layers",
                                 f"{arch}.attention.recurrent_layers")
        cfg["layer_types"] = ["linear_attention" if f else "full_attention" for f in flags[:cfg["num_hidden_layers"]]]


def _tokenizer_fields(path: Path, md: dict) -> dict:
    """tokenizer.ggml.* (without the prefix), each of the type the spec gives it and with ids and
    per-token arrays that agree with the token list."""
    f = {}
    for key, kind in _TOKENIZER_TYPES.items():
        v = _typed(path, md, f"tokenizer.ggml.{key}", kind)
        if v is not None:
            f[key] = v
    tokens = f.get("tokens")
    if not tokens:
        raise ModelFileError(path, "missing or empty: the file has no vocabulary", "tokenizer.ggml.tokens")
    for key in ("token_type", "scores"):
        if key in f:
            if len(f[key]) != len(tokens):
                raise ModelFileError(path, f"{len(f[key])} entries for {len(tokens)} tokens", f"tokenizer.ggml.{key}")
            f[key] = f[key].tolist()
    for i, m in enumerate(f.get("merges") or []):
        if not isinstance(m, str) or " " not in m:
            raise ModelFileError(path, f"{m!r} is not a merge ('left right')", f"tokenizer.ggml.merges[{i}]")
    for key in ("bos_token_id", "eos_token_id", "eot_token_id", "eom_token_id", "unknown_token_id", "padding_token_id"):
        if key in f and not 0 <= f[key] < len(tokens):
            raise ModelFileError(path, f"{f[key]} is not a token id (the vocabulary has {len(tokens)})", f"tokenizer.ggml.{key}")
    return f


def load_gguf(path: Path):
    from . import Checkpoint  # late: avoids an import cycle

    gf = GGUFFile(path)
    md = gf.fields
    names = {t.name for t in gf.tensors}
    cfg, config_fields = config_from_metadata(path, md, names)
    name_map = GGUF_ARCH_MAPS.get(md["general.architecture"], GGUF_MAP)
    tensors: dict[str, QTensor] = {}
    unknown = []
    for t in gf.tensors:
        if t.ggml_type not in quants.SUPPORTED:
            raise ModelFileError(path, f"ggml type {t.ggml_type.name}, which bw24chat does not support", f"tensor {t.name}")
        if t.name == "rope_freqs.weight":
            cfg["rope_freqs"] = quants.dequantize(t.data, t.ggml_type).reshape(-1).tolist()
            continue
        canon = name_map.canonical(t.name)
        if canon is None:
            unknown.append(t.name)
            continue
        if canon.endswith("_exps"):  # (E, out, in): one memory-mapped tensor, experts are its slices
            tensors[canon] = ExpertTensor.from_array(canon, t.ggml_type.name, t.shape, t.data)
        else:
            tensors[canon] = QTensor(canon, t.ggml_type.name, t.shape, t.data)
    if cfg["model_type"] in GGUF_LAYOUTS:  # a family's file layout -> the canonical one
        tensors = GGUF_LAYOUTS[cfg["model_type"]](tensors, cfg, path)
    tensors, mtp = split_nextn(tensors, cfg)
    if unknown:
        raise ModelFileError(path, f"tensors bw24chat has no use for: {unknown[:5]}{'...' if len(unknown) > 5 else ''}")
    if "tok_embd" not in tensors:
        raise ModelFileError(path, "missing: a model needs its token embedding", "tensor token_embd.weight")

    fields = _tokenizer_fields(path, md)
    try:
        tk = tokenizer_from_gguf_fields(fields)
    except Exception as exc:  # noqa: BLE001 - the tokenizers library reports bad vocabularies in many ways
        raise ModelFileError(path, f"the vocabulary cannot be built: {exc}", "tokenizer.ggml") from None
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
        chat_template=_typed(path, md, "tokenizer.chat_template", str),
    )
    if "vocab_size" not in cfg:
        cfg["vocab_size"] = tensors["tok_embd"].shape[0]
    name = _typed(path, md, "general.name", str)
    return Checkpoint(
        path=path,
        source="gguf",
        name=name or path.stem,
        config=cfg,
        tensors=tensors,
        tokenizer=tok,
        generation_config={},
        mtp=mtp,
        config_fields=config_fields,
        _keepalive=gf,
    )
