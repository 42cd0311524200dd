"""The op set (``bw24chat.ops``) in PyTorch, for training: the model files' own blocks run here
unchanged, so the trunk a draft head is trained on is the one the engine runs (train_draft.py).

PyTorch is an optional extra (``pip install 'bw24chat[train]'``); this module is imported only
by the trainer.  Rows carry a batch axis: values are (B, T, ...) where the other backends have
(T, ...), B sequences of one pass side by side.

Two kinds of pass:
  generation  a ``TorchKVCache`` holds B left-padded sequences; a pass writes its T rows at
              cache slots start..start+T-1 and each row attends causally to the slots of its own
              sequence (slots before the sequence's padding are masked; RoPE positions count
              from the first real token)
  training    no cache: the pass is whole sequences from position 0 (``PassKV``).  A draft
              head's chained rows (models/mtp.py) are trained as they run at inference: a
              pass of depth d holds, at row s, the d-th chained row of the chain that starts
              after trunk row s (position s + d); it attends to the head's depth-0 rows at
              positions <= s and to the rows of its own chain at depths 1..d (the drafter's
              cache holds exactly those when it drafts: speculative.MTPDrafter).  EAGLE-3's
              "training-time test" (Li et al. 2025, arXiv:2503.01840) trains the same way.

Numerics: weights are kept in ``dtype`` (bf16 on a GPU, float32 on the CPU); each product runs
in that dtype and returns float32; the residual stream, norms and softmax are float32.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..ops import AttentionSpec, Loader, Ops


@dataclass
class Source:
    """Where a trainable parameter came from: the canonical tensors whose rows (or, for a vector,
    whose values) it concatenates, ``interleave``d as ``Loader.load_linear`` says."""

    names: list[str]
    shapes: list[tuple[int, ...]]
    interleave: bool = False


class TorchBackend(Loader):
    """Weights as torch tensors on ``device``.  ``trainable``: every weight becomes a float32
    ``nn.Parameter`` whose origin is kept in ``sources`` (for saving it under the canonical
    names: ``unfuse``)."""

    name = "torch"

    def __init__(self, device: str = "cpu", dtype=torch.float32, trainable: bool = False):
        self.device, self.dtype, self.trainable = torch.device(device), dtype, trainable
        self.sources: list[tuple[torch.Tensor, Source]] = []
        self._rope: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _tensor(self, a: np.ndarray, tensors: list, interleave: bool, matrix: bool) -> torch.Tensor:
        t = torch.from_numpy(np.array(a, np.float32))  # a copy: a file's weights are read-only memory maps
        if self.trainable:
            p = torch.nn.Parameter(t.to(self.device))
            self.sources.append((p, Source([x.name for x in tensors], [tuple(x.shape) for x in tensors], interleave)))
            return p
        return t.to(self.device, self.dtype if matrix else torch.float32)

    def load_linear(self, tensors: list, interleave: bool = False, role: str = "") -> torch.Tensor:
        parts = [np.asarray(t.dequantize(), np.float32) for t in tensors]
        if interleave:  # gate_0, up_0, gate_1, up_1, ...
            w = np.stack(parts, axis=1).reshape(-1, parts[0].shape[1])
        else:
            w = np.concatenate(parts) if len(parts) > 1 else parts[0]
        return self._tensor(w, tensors, interleave, True)

    def load_vector(self, tensors: list) -> torch.Tensor:
        return self._tensor(np.concatenate([np.asarray(t.dequantize(), np.float32).reshape(-1) for t in tensors]),
                            tensors, False, False)

    def load_embedding(self, t) -> torch.Tensor:
        return self.load_linear([t])

    def load_experts(self, gate, up, down, role: str = "experts"):
        raise NotImplementedError("the PyTorch backend runs the dense families (llama, qwen2, qwen3); "
                                  "MoE layers are not implemented there")

    def rope(self, spec: AttentionSpec) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's RoPE table (rope.py, shared with every backend) as device tensors."""
        key = id(spec.rope)
        if key not in self._rope:
            self._rope[key] = (torch.from_numpy(spec.rope.cos).to(self.device), torch.from_numpy(spec.rope.sin).to(self.device))
        return self._rope[key]

    def unfuse(self) -> dict[str, np.ndarray]:
        """The trainable parameters as the canonical tensors they were loaded from (float32)."""
        out = {}
        for p, src in self.sources:
            w = p.detach().float().cpu().numpy()
            if src.interleave:
                pairs = w.reshape(-1, len(src.names), w.shape[1])
                out.update({n: np.ascontiguousarray(pairs[:, i]) for i, n in enumerate(src.names)})
                continue
            sizes = [s[0] if len(s) > 1 else int(np.prod(s)) for s in src.shapes]
            for n, s, part in zip(src.names, src.shapes, np.split(w, np.cumsum(sizes)[:-1])):
                out[n] = part.reshape(s)
        return out


class TorchKVCache:
    """B left-padded sequences' K and V, (n_layers, B, capacity, K, hd), in the backend's dtype;
    ``pad[b]``: the padding slots before sequence b's first token."""

    def __init__(self, backend: TorchBackend, n_layers: int, pad: torch.Tensor, capacity: int, n_kv: int, head_dim: int):
        B = len(pad)
        self.pad = pad.to(backend.device)
        self.k = torch.zeros((n_layers, B, capacity, n_kv, head_dim), dtype=backend.dtype, device=backend.device)
        self.v = torch.zeros_like(self.k)


class PassKV:
    """A training pass's K and V per layer and depth (no cache): layer -> [(k, v) of depth 0, ...]."""

    def __init__(self):
        self.layers: dict[int, list] = {}


@dataclass
class LMHeadInput:
    """What ``lm_head`` returns here: the normed rows and the head matrix, not the (B, T, V)
    logits, which the caller forms for the rows and chunks it needs (train_draft.py)."""

    x: torch.Tensor
    w: torch.Tensor

    def logits(self, backend: TorchBackend, rows=slice(None)) -> torch.Tensor:
        return _linear(backend, self.x[rows], self.w)


def _linear(backend: TorchBackend, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    cd = backend.dtype
    return F.linear(x.to(cd), w.to(cd)).float()


class TorchOps(Ops):
    """One pass over (B, T) rows: a generation pass (``cache``, slots start..start+T-1) or a
    training pass of ``depth`` d (``kv``: rows at positions d .. d + T - 1)."""

    def __init__(self, backend: TorchBackend, eps: float, cache: TorchKVCache | None = None, start: int = 0,
                 kv: PassKV | None = None, depth: int = 0):
        if (cache is None) == (kv is None):
            raise ValueError("a pass has either a cache (generation) or a PassKV (training)")
        self.b, self.eps, self.cache, self.start, self.kv, self.depth = backend, eps, cache, start, kv, depth

    def embed(self, table, ids):
        return table[ids].float()

    def rmsnorm(self, x, w, eps: float | None = None):
        x = x.float()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + (self.eps if eps is None else eps)) * w

    def concat(self, a, b):
        return torch.cat([a, b], dim=-1)

    def linear(self, x, w, residual=None):
        y = _linear(self.b, x, w)
        return y if residual is None else residual + y

    def swiglu(self, gu):
        return F.silu(gu[..., 0::2]) * gu[..., 1::2]

    def _positions(self, T: int) -> torch.Tensor:
        """(B, T) or (1, T) RoPE positions of the pass's rows."""
        if self.cache is not None:
            slots = torch.arange(self.start, self.start + T, device=self.b.device)
            return (slots[None, :] - self.cache.pad[:, None]).clamp(min=0)
        return torch.arange(self.depth, self.depth + T, device=self.b.device)[None, :]

    def _rotate(self, x, pos, spec: AttentionSpec):
        cos, sin = self.b.rope(spec)
        c, s = cos[pos][:, :, None, :], sin[pos][:, :, None, :]  # (B, T, 1, rot/2)
        r = spec.rope.rot_dim
        if spec.rope.style == "neox":
            a, b = x[..., : r // 2], x[..., r // 2 : r]
        else:
            a, b = x[..., 0:r:2], x[..., 1:r:2]
        ra, rb = a * c - b * s, b * c + a * s
        rot = torch.cat([ra, rb], -1) if spec.rope.style == "neox" else torch.stack([ra, rb], -1).flatten(-2)
        return torch.cat([rot, x[..., r:]], -1)

    def rope_kv(self, qkv, spec: AttentionSpec, layer: int, bias=None, q_norm=None, k_norm=None):
        if spec.output_gate:
            raise NotImplementedError("gated attention (Qwen3-Next) is not implemented on the PyTorch backend")
        B, T = qkv.shape[:2]
        H, K, hd = spec.n_heads, spec.n_kv_heads, spec.head_dim
        if bias is not None:
            qkv = qkv + bias
        q, k, v = qkv[..., : H * hd], qkv[..., H * hd : (H + K) * hd], qkv[..., (H + K) * hd :]
        if q_norm is not None and spec.qk_norm == "full":
            q, k = self.rmsnorm(q, q_norm, spec.eps), self.rmsnorm(k, k_norm, spec.eps)
        q, k, v = q.reshape(B, T, H, hd), k.reshape(B, T, K, hd), v.reshape(B, T, K, hd)
        if q_norm is not None and spec.qk_norm == "head":
            q, k = self.rmsnorm(q, q_norm, spec.eps), self.rmsnorm(k, k_norm, spec.eps)
        pos = self._positions(T)
        q, k = self._rotate(q, pos, spec), self._rotate(k, pos, spec)
        if self.cache is not None:
            self.cache.k[layer, :, self.start:self.start + T] = k.to(self.cache.k.dtype)
            self.cache.v[layer, :, self.start:self.start + T] = v.to(self.cache.v.dtype)
        else:
            depths = self.kv.layers.setdefault(layer, [])
            del depths[self.depth:]
            depths.append((k, v))
        return q

    def attention(self, q, spec: AttentionSpec, layer: int):
        B, T, H, hd = q.shape
        G = H // spec.n_kv_heads
        if self.cache is not None:
            end = self.start + T
            k, v = self.cache.k[layer, :, :end], self.cache.v[layer, :, :end]
            slots = torch.arange(end, device=q.device)
            rows = torch.arange(self.start, end, device=q.device)
            # causal within the sequence's real slots; a padding row sees itself (finite values)
            mask = (slots[None, None, :] <= rows[None, :, None]) & (slots[None, None, :] >= self.cache.pad[:, None, None])
            mask = mask | (slots[None, None, :] == rows[None, :, None])
            cd = self.b.dtype
            o = F.scaled_dot_product_attention(q.to(cd).transpose(1, 2), k.repeat_interleave(G, 2).transpose(1, 2).to(cd),
                                               v.repeat_interleave(G, 2).transpose(1, 2).to(cd), attn_mask=mask[:, None],
                                               scale=spec.scale)
            return o.transpose(1, 2).reshape(B, T, H * hd).float()
        depths = self.kv.layers[layer]
        k0, v0 = (t.repeat_interleave(G, 2).transpose(1, 2) for t in depths[0])  # (B, H, T, hd)
        qt = q.transpose(1, 2)
        if self.depth == 0:
            cd = self.b.dtype
            o = F.scaled_dot_product_attention(qt.to(cd), k0.to(cd), v0.to(cd), is_causal=True, scale=spec.scale)
            return o.transpose(1, 2).reshape(B, T, H * hd).float()
        # depth d: the depth-0 keys of positions <= s, then the chain's own rows at depths 1..d
        s0 = (qt @ k0.transpose(-1, -2)) * spec.scale  # (B, H, T, T)
        s0 = s0.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        chain = [tuple(t.repeat_interleave(G, 2).transpose(1, 2) for t in kv) for kv in depths[1:self.depth + 1]]
        sj = [((qt * kj).sum(-1, keepdim=True) * spec.scale) for kj, _ in chain]  # (B, H, T, 1) each
        p = torch.softmax(torch.cat([s0, *sj], -1), -1)
        o = p[..., :T] @ v0
        for j, (_, vj) in enumerate(chain):
            o = o + p[..., T + j:T + j + 1] * vj
        return o.transpose(1, 2).reshape(B, T, H * hd)

    def lm_head(self, x, w):
        return LMHeadInput(x, w)
