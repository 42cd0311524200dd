"""Checkpoint layouts that differ from the canonical one by more than names (names.py): what a
loader does to a family's canonical-named tensors before the model file loads them.

Gated DeltaNet families (models/qwen3_next.py, qwen3_5.py, qwen3_5_moe.py; canonical layout in
names.py; Qwen3.5's projections are stored flat, the canonical layout already):
- transformers' Qwen3-Next ``in_proj_qkvz`` / ``in_proj_ba`` (and llama.cpp's legacy ``ssm_in`` /
  its ``ssm_ba``) hold their rows grouped by key head, per group [q | k | v | z] and [b | a]
  (Qwen3NextGatedDeltaNet.fix_query_key_value_ordering); they are split by row into the flat
  attn_qkv (all q | all k | all v), attn_gate (z), ssm_beta, ssm_alpha;
- A_log -> ssm_a = -exp(A_log) (float32, as the forward computes it; llama.cpp's converter
  stores ssm_a so);
- zero-centred norms w -> 1 + w (float32: Qwen3NextRMSNorm's (1.0 + weight.float()); llama.cpp's
  converter stores 1 + w), the gated DeltaNet norm excepted, the MTP head's included;
- conv1d (C, 1, kernel) -> (C, kernel); shared_expert_gate (1, D) -> (D,).
"""
from __future__ import annotations

import numpy as np

from .errors import ModelFileError
from .tensor import QTensor

# norms stored as w where the forward multiplies by (1 + w) (transformers Qwen3NextRMSNorm; the MTP
# head's too: vLLM qwen3_next_mtp.py builds them as Qwen3NextRMSNorm)
ZERO_CENTRED = ("attn_norm", "ffn_norm", "attn_q_norm", "attn_k_norm", "enorm", "hnorm", "shared_head_norm")


def _f32(name: str, w: np.ndarray) -> QTensor:
    w = np.ascontiguousarray(w, np.float32)
    return QTensor(name, "F32", tuple(w.shape), w)


def _deltanet_spec(cfg: dict, path):
    from ..models import get_family
    from .checks import check_deltanet

    try:
        a = get_family(cfg["model_type"]).ModelArgs.from_dict(cfg)
    except (TypeError, ValueError) as exc:
        raise ModelFileError(path, f"the model settings cannot be read: {exc}", "config") from None
    check_deltanet(path, a)
    return a.deltanet_spec()


def _split_grouped(t: QTensor, p: str, s, path) -> dict[str, QTensor]:
    """ssm_in (grouped [q | k | v | z] per key head) or ssm_ba (grouped [b | a]) -> canonical rows."""
    dk, dv, r = s.k_head_dim, s.v_head_dim, s.n_v_heads // s.n_k_heads
    groups = np.arange(s.n_k_heads)[:, None]
    part = lambda lo, n, width: (groups * width + lo + np.arange(n)[None, :]).reshape(-1)  # noqa: E731
    if t.name.endswith("ssm_in"):
        gw = 2 * dk + 2 * r * dv
        rows = {"attn_qkv": np.concatenate([part(0, dk, gw), part(dk, dk, gw), part(2 * dk, r * dv, gw)]),
                "attn_gate": part(2 * dk + r * dv, r * dv, gw)}
    else:
        gw = 2 * r
        rows = {"ssm_beta": part(0, r, gw), "ssm_alpha": part(r, r, gw)}
    if len(t.shape) != 2 or t.shape[0] != s.n_k_heads * gw:
        raise ModelFileError(path, f"shape {list(t.shape)}, but {s.n_k_heads} key-head groups of {gw} rows are "
                                   "expected", f"tensor {t.name}")
    return {p + k: t.take_rows(v, p + k) for k, v in rows.items()}


def deltanet_layout(tensors: dict, cfg: dict, path, stored_w: bool) -> dict:
    """A gated DeltaNet family's tensors (HF or GGUF, canonical names) -> the canonical layout
    (module docstring); ``stored_w``: the zero-centred norms hold w (transformers), not 1 + w
    (llama.cpp).  Tensors already in the canonical layout pass through unchanged."""
    s = None
    out = {}
    for name, t in tensors.items():
        base, _, role = name.rpartition(".")
        p = base + "." if base else ""
        if role in ("ssm_in", "ssm_ba"):
            s = s or _deltanet_spec(cfg, path)
            out.update(_split_grouped(t, p, s, path))
        elif role == "ssm_a_log":
            out[p + "ssm_a"] = _f32(p + "ssm_a", -np.exp(t.dequantize().astype(np.float32)))
        elif stored_w and (role in ZERO_CENTRED or name == "output_norm"):
            out[name] = _f32(name, np.float32(1.0) + t.dequantize())
        elif role == "ssm_conv1d" and len(t.shape) == 3:
            out[name] = _f32(name, t.dequantize().reshape(t.shape[0], -1))
        elif role == "ffn_gate_inp_shexp" and len(t.shape) == 2:
            out[name] = _f32(name, t.dequantize().reshape(-1))
        else:
            out[name] = t
    return out


def hf_deltanet(tensors: dict, cfg: dict, path) -> dict:
    return deltanet_layout(tensors, cfg, path, stored_w=True)


def gguf_deltanet(tensors: dict, cfg: dict, path) -> dict:
    return deltanet_layout(tensors, cfg, path, stored_w=False)


# model family -> its layout function (tensors, config, path) -> tensors, per source format
HF_LAYOUTS = {"qwen3_next": hf_deltanet, "qwen3_5": hf_deltanet, "qwen3_5_moe": hf_deltanet}
GGUF_LAYOUTS = {"qwen3_next": gguf_deltanet, "qwen3_5": gguf_deltanet, "qwen3_5_moe": gguf_deltanet}
