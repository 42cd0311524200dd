"""Token sampling: the NumPy reference, which the CUDA sampling kernel reproduces.

The contract (both implementations, in this order):
 1. repetition penalty (CTRL, arXiv:1909.05858, as llama.cpp applies it): for each distinct id
    in the last ``repeat_last_n`` tokens (0: none, as in llama.cpp; at most REPEAT_WINDOW_MAX,
    the device sampler's ring of recent ids), logit / p if logit > 0 else logit * p;
 2. temperature 0 -> greedy: the first index of the maximum;
 3. logits / temperature (float32);
 4. candidates sorted by logit descending, ties by lower id; keep the first top_k (if > 0);
 5. probabilities exp(l - max) / sum in float64 over the candidates, summed in sorted order;
 6. min-p: keep p >= min_p * p_max;  top-p: keep the shortest sorted prefix whose cumulative
    probability reaches top_p (always at least one);
 7. u = one uniform draw in [0, 1): the first 64-bit output of Philox4x64-10 (Salmon et al.,
    SC'11) keyed by the seed with counter (position, 0, 0, 0) exactly as NumPy's
    ``np.random.Philox(key=seed, counter=position).random_raw()``, mapped as (x >> 11) * 2^-53;
 8. the token is the first candidate whose running sum of kept probabilities exceeds u * total.
Keying by (seed, position) makes a seed reproduce a run whatever path produced the logits.
"""
from __future__ import annotations

import numpy as np

from .api import SamplingParams

_MASK64 = (1 << 64) - 1
REPEAT_WINDOW_MAX = 256  # repeat_last_n's ceiling: the CUDA runner's per-row ring of recent ids


def philox_uniform(seed: int, position: int) -> float:
    bg = np.random.Philox(key=[seed & _MASK64, (seed >> 64) & _MASK64], counter=[position & _MASK64, 0, 0, 0])
    x = int(bg.random_raw())
    return (x >> 11) * (1.0 / 9007199254740992.0)


def apply_repeat_penalty(logits: np.ndarray, history: list[int], penalty: float, last_n: int) -> np.ndarray:
    last_n = min(last_n, REPEAT_WINDOW_MAX)
    if penalty == 1.0 or not history or last_n <= 0:
        return logits
    recent = history[-last_n:]
    ids = np.unique(np.asarray(recent, dtype=np.int64))
    ids = ids[(ids >= 0) & (ids < logits.shape[-1])]
    out = logits.copy()
    v = out[ids]
    out[ids] = np.where(v > 0, v / np.float32(penalty), v * np.float32(penalty))
    return out


def sample_token(logits: np.ndarray, p: SamplingParams, seed: int, position: int, history: list[int] = ()) -> int:
    """logits: (V,) float32 -> token id, per the contract above."""
    logits = np.asarray(logits, dtype=np.float32).reshape(-1)
    logits = apply_repeat_penalty(logits, list(history), p.repeat_penalty, p.repeat_last_n)
    if p.greedy:
        return int(np.argmax(logits))
    scaled = logits / np.float32(p.temperature)
    order = np.argsort(-scaled, kind="stable")
    if p.top_k > 0:
        order = order[: p.top_k]
    cand = scaled[order].astype(np.float64)
    probs = np.exp(cand - cand[0])
    probs /= probs.sum()
    keep = len(order)
    if p.min_p > 0.0:
        keep = min(keep, int(np.count_nonzero(probs >= p.min_p * probs[0])))
    if p.top_p < 1.0:
        cum = np.cumsum(probs)
        keep = min(keep, int(np.searchsorted(cum, p.top_p, side="left")) + 1)
    keep = max(keep, 1)
    kept = probs[:keep]
    u = philox_uniform(seed, position)
    target = u * kept.sum()
    idx = int(np.searchsorted(np.cumsum(kept), target, side="right"))
    return int(order[min(idx, keep - 1)])


def log_softmax(logits: np.ndarray) -> np.ndarray:
    l = np.asarray(logits, dtype=np.float64)
    m = l.max()
    return l - m - np.log(np.exp(l - m).sum())
