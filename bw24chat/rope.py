"""Rotary position embedding tables (RoFormer, arXiv:2104.09864), with the scaling variants of
transformers' ``modeling_rope_utils``: linear (position interpolation, arXiv:2306.15595),
llama3 (Meta's Llama 3.1 frequency-dependent scaling), yarn (arXiv:2309.00071), and GGUF
``rope_freqs`` factors.

The tables (cos, sin per position and frequency, float32) are computed once on the host and
used by every backend, so the NumPy reference and the CUDA kernels rotate by identical numbers.

Two pairings of the rotated dimensions:
  "neox"   (HF layout): dims (i, i + rot/2) form a pair   (rotate_half)
  "normal" (GPT-J / llama.cpp on permuted llama weights): dims (2i, 2i+1)
Only the first ``rot_dim`` dims of a head rotate (partial rotary); the rest pass through.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass
class RopeTable:
    cos: np.ndarray  # (n_pos, rot_dim/2) float32
    sin: np.ndarray
    rot_dim: int
    style: str  # "neox" | "normal"


def inv_frequencies(rot_dim: int, theta: float, scaling: dict | None, max_pos: int) -> tuple[np.ndarray, float]:
    """(inv_freq float32 (rot_dim/2,), attention factor applied to cos and sin)."""
    exps = np.arange(0, rot_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(rot_dim)
    inv = (np.float32(1.0) / (np.float32(theta) ** exps)).astype(np.float32)
    if not scaling:
        return inv, 1.0
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    factor = float(scaling.get("factor", 1.0))
    if kind in ("default", "none"):
        return inv, 1.0
    if kind == "linear":
        return (inv / np.float32(factor)).astype(np.float32), 1.0
    if kind == "freq_factors":
        return (inv / np.asarray(scaling["freq_factors"], np.float32)).astype(np.float32), 1.0
    if kind == "llama3":
        low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
        old = float(scaling.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        return np.where(medium, smoothed, scaled).astype(np.float32), 1.0
    if kind == "yarn":
        orig = scaling.get("original_max_position_embeddings") or max_pos / factor
        beta_fast, beta_slow = float(scaling.get("beta_fast") or 32.0), float(scaling.get("beta_slow") or 1.0)
        attn = scaling.get("attention_factor")
        if attn is None:
            attn = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0

        def corr_dim(n_rot):
            return (rot_dim * math.log(orig / (n_rot * 2 * math.pi))) / (2 * math.log(theta))

        lo = max(math.floor(corr_dim(beta_fast)), 0)
        hi = min(math.ceil(corr_dim(beta_slow)), rot_dim - 1)
        if lo == hi:
            hi += 0.001
        ramp = np.clip((np.arange(rot_dim // 2, dtype=np.float32) - lo) / (hi - lo), 0, 1)
        extrap = 1 - ramp
        pos_freqs = np.float32(theta) ** exps
        inv = (1.0 / (factor * pos_freqs)) * (1 - extrap) + (1.0 / pos_freqs) * extrap
        return inv.astype(np.float32), float(attn)
    raise ValueError(f"unsupported rope scaling {kind!r}")


def build_rope_table(head_dim: int, partial: float, theta: float, scaling: dict | None, n_pos: int, style: str, max_pos: int) -> RopeTable:
    rot_dim = int(head_dim * partial)
    rot_dim -= rot_dim % 2
    inv, attn = inv_frequencies(rot_dim, theta, scaling, max_pos)
    ang = np.arange(n_pos, dtype=np.float32)[:, None] * inv[None, :]  # float32 angles, as transformers
    cos = (np.cos(ang.astype(np.float64)) * attn).astype(np.float32)
    sin = (np.sin(ang.astype(np.float64)) * attn).astype(np.float32)
    return RopeTable(cos, sin, rot_dim, style)


def apply_rope(x: np.ndarray, positions: np.ndarray, t: RopeTable) -> np.ndarray:
    """x: (T, H, hd) float32, positions: (T,) -> rotated copy (NumPy reference)."""
    c = t.cos[positions][:, None, :]  # (T, 1, rot/2)
    s = t.sin[positions][:, None, :]
    out = x.copy()
    r = t.rot_dim
    if t.style == "neox":
        a, b = x[..., : r // 2], x[..., r // 2 : r]
        out[..., : r // 2] = a * c - b * s
        out[..., r // 2 : r] = b * c + a * s
    else:
        a, b = x[..., 0:r:2], x[..., 1:r:2]
        out[..., 0:r:2] = a * c - b * s
        out[..., 1:r:2] = b * c + a * s
    return out
