"""Architecture registry: model_type -> module exporting ``ModelArgs`` and ``Model``."""
from __future__ import annotations

import importlib

REGISTRY = {
    "llama": "bw24chat.models.llama",
    "mistral": "bw24chat.models.llama",
    "qwen2": "bw24chat.models.qwen2",
    "qwen3": "bw24chat.models.qwen3",
    "qwen3_moe": "bw24chat.models.qwen3_moe",
    "qwen3_next": "bw24chat.models.qwen3_next",
    "qwen3_5": "bw24chat.models.qwen3_5",
    "qwen3_5_moe": "bw24chat.models.qwen3_5_moe",
    "glm4_moe": "bw24chat.models.glm4_moe",
    "minimax_m2": "bw24chat.models.minimax_m2",
}


def get_family(model_type: str):
    try:
        return importlib.import_module(REGISTRY[model_type])
    except KeyError:
        raise ValueError(f"unsupported architecture {model_type!r}; supported: {sorted(REGISTRY)}") from None


def build_model(checkpoint, backend, n_ctx: int = 0, progress=None):
    fam = get_family(checkpoint.arch)
    args = fam.ModelArgs.from_dict(checkpoint.config)
    n_ctx = min(n_ctx or args.max_position_embeddings, args.max_position_embeddings) if n_ctx else args.max_position_embeddings
    model = fam.Model(args, backend, checkpoint.tensors, n_ctx, progress)
    from .mtp import load_mtp

    model.mtp = load_mtp(model, backend, checkpoint.mtp)  # None without NextN layers
    return model
