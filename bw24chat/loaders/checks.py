"""Checks of a loaded checkpoint against itself: the config's numbers are sane, and every tensor
the model will use is there with the shape the config implies.

A config.json or GGUF header can lie (a layer count, a width, a context length of 2^40); the
model code would then fail deep inside a matrix product, or allocate for the lie.  Here each
problem becomes a :class:`ModelFileError` naming the field or tensor, before any weight is used.
"""
from __future__ import annotations

import math
import re

from .errors import ModelFileError
from .names import GGUF_MAP, HF_MAP

# Bounds no real model of these families comes near; beyond them a number is a corrupt header.
MAX_WIDTH = 1 << 20
MAX_LAYERS = 4096
MAX_CONTEXT = 1 << 24  # the RoPE table is built for the whole context


def _resolved_args(ckpt, names: dict[str, str]):
    from ..models import REGISTRY, get_family

    if ckpt.arch not in REGISTRY:
        raise ModelFileError(ckpt.path, f"architecture {ckpt.arch!r} is not supported (supported: {sorted(REGISTRY)})",
                             names.get("model_type", "model_type"))
    where = lambda key: names.get(key, key)  # noqa: E731
    for key in ("hidden_size", "num_attention_heads"):
        v = ckpt.config.get(key)
        if not _int_in(v, 1, MAX_WIDTH):
            raise ModelFileError(ckpt.path, f"{v!r} is not a positive integer up to {MAX_WIDTH}", where(key))
    try:
        return get_family(ckpt.arch).ModelArgs.from_dict(ckpt.config)
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        raise ModelFileError(ckpt.path, f"the model settings cannot be read: {exc}", "config") from None


def _int_in(v, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _number_ok(v, lo: float) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > lo


def check_config(ckpt, names: dict[str, str] | None = None):
    """The resolved model arguments, after checking each number; ``names`` maps config keys to
    the file's own field names (GGUF) for the messages."""
    names = names or {}
    a = _resolved_args(ckpt, names)
    where = lambda key: names.get(key, key)  # noqa: E731
    ints = {"hidden_size": MAX_WIDTH, "intermediate_size": MAX_WIDTH, "num_hidden_layers": MAX_LAYERS,
            "num_attention_heads": MAX_WIDTH, "num_key_value_heads": MAX_WIDTH, "head_dim": MAX_WIDTH,
            "vocab_size": 1 << 24, "max_position_embeddings": MAX_CONTEXT}
    for key, hi in ints.items():
        v = getattr(a, key)
        if not _int_in(v, 1, hi):
            raise ModelFileError(ckpt.path, f"{v!r} is not a positive integer up to {hi}", where(key))
    if a.num_attention_heads % a.num_key_value_heads:
        raise ModelFileError(ckpt.path, f"{a.num_attention_heads} query heads cannot be shared by "
                                        f"{a.num_key_value_heads} key/value heads", where("num_key_value_heads"))
    for key in ("rms_norm_eps", "rope_theta"):
        v = getattr(a, key)
        if not _number_ok(v, 0):
            raise ModelFileError(ckpt.path, f"{v!r} is not a positive finite number", where(key))
    f = a.partial_rotary_factor
    if not (_number_ok(f, 0) and f <= 1 and int(a.head_dim * f) % 2 == 0):
        raise ModelFileError(ckpt.path, f"{f!r} does not give an even rotary width of a {a.head_dim}-wide head",
                             where("partial_rotary_factor"))
    if a.rope_scaling is not None and not isinstance(a.rope_scaling, dict):
        raise ModelFileError(ckpt.path, f"{a.rope_scaling!r} is not a table of settings", where("rope_scaling"))
    _check_rope(ckpt, a, where("rope_scaling"))
    if hasattr(a, "deltanet_spec"):
        check_deltanet(ckpt.path, a, where)
    return a


def check_deltanet(path, a, where=lambda key: key) -> None:
    """A hybrid model's linear-attention settings (models/qwen3_next.py ModelArgs): positive
    widths, value heads a multiple of key heads, a known head order, one kind per layer."""
    for key in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                "linear_conv_kernel_dim", "full_attention_interval"):
        v = getattr(a, key)
        if not _int_in(v, 1, MAX_WIDTH):
            raise ModelFileError(path, f"{v!r} is not a positive integer up to {MAX_WIDTH}", where(key))
    if a.linear_num_value_heads % a.linear_num_key_heads:
        raise ModelFileError(path, f"{a.linear_num_value_heads} value heads cannot be shared by "
                                   f"{a.linear_num_key_heads} key heads", where("linear_num_value_heads"))
    if a.linear_v_head_order not in ("grouped", "tiled"):
        raise ModelFileError(path, f"{a.linear_v_head_order!r} is not a value-head order", where("linear_v_head_order"))
    from ..models.qwen3_next import LAYER_KINDS

    kinds = a.layer_types
    if kinds is not None and (not isinstance(kinds, list) or len(kinds) != a.num_hidden_layers
                              or not all(isinstance(k, str) and k in LAYER_KINDS for k in kinds)):
        raise ModelFileError(path, f"expected 'linear_attention' or 'full_attention' for each of the "
                                   f"{a.num_hidden_layers} layers", where("layer_types"))


def _check_rope(ckpt, a, where: str) -> None:
    """The RoPE table for a few positions, so that bad scaling settings fail here, by name."""
    from ..rope import build_rope_table

    try:
        build_rope_table(a.head_dim, a.partial_rotary_factor, a.rope_theta, a.rope_scaling, 4, a.rope_style,
                         a.max_position_embeddings)
    except (TypeError, ValueError, KeyError, ZeroDivisionError, OverflowError) as exc:
        raise ModelFileError(ckpt.path, f"the RoPE settings cannot be used: {exc}", where) from None


_LAYER = re.compile(r"^blk\.(\d+)\.")


def split_nextn(tensors: dict, cfg: dict) -> tuple[dict, dict]:
    """(trunk tensors, NextN / MTP tensors) of canonical-named ``tensors``: the MTP ones are those
    of the layers the file declares after the trunk (GLM-4.5's ``num_nextn_predict_layers``; GGUF
    ``nextn_predict_layers``), for ``Checkpoint.mtp`` (models/mtp.py).  Any other layer past the
    trunk stays in the trunk, for the checks to refuse."""
    n, extra = cfg.get("num_hidden_layers"), cfg.get("num_nextn_predict_layers") or 0
    trunk, mtp = {}, {}
    for name, t in tensors.items():
        m = _LAYER.match(name)
        nextn = bool(m and isinstance(n, int) and isinstance(extra, int) and n <= int(m.group(1)) < n + extra)
        (mtp if nextn else trunk)[name] = t
    return trunk, mtp


def check_checkpoint(ckpt) -> None:
    """Config numbers, then tensors: none missing, none unexpected, each of the expected shape,
    and a tokenizer whose ids all index the embedding.  Messages use the file's own names
    (``ckpt.config_fields``, the name maps)."""
    from ..models import get_family

    a = check_config(ckpt, ckpt.config_fields)
    names_map = GGUF_MAP if ckpt.source == "gguf" else HF_MAP
    shown = names_map.source
    model = get_family(ckpt.arch).Model
    _check_tensors(ckpt, a, model.tensor_shapes(a), ckpt.tensors, shown)
    if ckpt.mtp:
        _check_tensors(ckpt, a, model.mtp_tensor_shapes(a, ckpt.config.get("num_nextn_predict_layers") or 0),
                       ckpt.mtp, shown)
    n_tok = ckpt.tokenizer.vocab_size
    if n_tok > a.vocab_size:
        raise ModelFileError(ckpt.path, f"the tokenizer has {n_tok} tokens, but the embedding has {a.vocab_size} rows",
                             "tokenizer")
    tok = ckpt.tokenizer
    for what, i in (("BOS", tok.bos_id), ("EOS", tok.eos_id), *(("stop", s) for s in sorted(tok.stop_ids))):
        if i is not None and not _int_in(i, 0, n_tok - 1):
            raise ModelFileError(ckpt.path, f"the {what} token id {i!r} is not in the vocabulary of {n_tok}", "tokenizer")


def _check_tensors(ckpt, a, shapes: dict, tensors: dict, shown, path=None) -> None:
    """None missing, none unexpected, each of the expected shape (``shapes``: Model.tensor_shapes);
    ``path``: the file the tensors come from, if not the checkpoint's (a draft head's)."""
    path = path or ckpt.path
    want = {name: shape for name, (shape, _) in shapes.items()}
    for name, t in tensors.items():
        if name not in want:
            raise ModelFileError(path, f"unexpected for a {a.num_hidden_layers}-layer model (the header or config "
                                       "says fewer layers than the file holds)", f"tensor {shown(name)}")
        if tuple(t.shape) != want[name]:
            raise ModelFileError(path, f"shape {list(t.shape)}, but the model settings imply {list(want[name])}",
                                 f"tensor {shown(name)}")
    for name in want:
        if name not in tensors and shapes[name][1]:
            raise ModelFileError(path, f"missing (a {a.num_hidden_layers}-layer model needs it)", f"tensor {shown(name)}")
