"""The NumPy reference of the tensor-parallel forward pass (``--gpus N``, bw24chat/parallel.py):
N NumPy backends, one per GPU, each holding its share of every weight, its KV heads and its
DeltaNet heads, and an op set over them that the model files run unchanged.  It is the
specification of the CUDA path's exchanges: where they go, what each GPU computes between them,
and the reduction order (``reduce_ranks``).

Values: a replicated value (the residual stream, norms' outputs, router choices, logits) is one
array, as every GPU holds the same bits of it (it comes out of a rank-order reduction that every
GPU computes alike, or of the same op on the same inputs); a value split among the GPUs (q / k / v,
the MLP's hidden units, the DeltaNet's heads) is a ``Shards``.  Each GPU's work between exchanges
is the NumPy backend's op on its share, so with one GPU the pass is the NumPy backend's bit for bit.

One sequence at a time (prefill, step, rollback): batched steps run over the unsplit paged pool.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ops import AttentionSpec, DeltaNetSpec, Loader, Ops, RouterSpec
from ..parallel import COLS, EXPERTS, REPLICATE, ROWS, PartitionPlan, kv_heads_per_gpu, local_attention, \
    local_deltanet, shard_of
from .numpy_backend import NumpyBackend, NumpyKVCache, NumpyOps, NumpyRecurrentState, NumpyRunner, rmsnorm_ref


def reduce_ranks(partials: list[np.ndarray]) -> np.ndarray:
    """The all-reduce's contract: the GPUs' float32 partial sums added in rank order,
    ((p_0 + p_1) + p_2) + ..., each addition rounded to float32.  Every GPU computes the same
    bits; with one GPU it is p_0 itself."""
    total = partials[0]
    for p in partials[1:]:
        total = total + p
    return total


@dataclass
class Shards:
    """A value split among the GPUs: ``parts[r]`` is GPU r's piece."""

    parts: list


@dataclass
class ShardedWeight:
    """A weight as the GPUs hold it: ``parts[r]`` the NumPy backend's object of GPU r's share
    (the same object on every GPU for a replicated one); ``first[r]`` the first vocabulary row
    or expert index of GPU r's range (VOCAB, EXPERTS)."""

    kind: str
    parts: list
    first: list


class ShardedKV:
    """One sequence's KV cache: each GPU's NumpyKVCache over its own KV heads."""

    def __init__(self, ranks: list[NumpyKVCache]):
        self.ranks = ranks

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.ranks)


class ShardedState:
    """One sequence's gated DeltaNet state: each GPU's NumpyRecurrentState over its own heads,
    moved together (the runner's rollback snapshots every GPU's)."""

    def __init__(self, ranks: list[NumpyRecurrentState]):
        self.ranks = ranks

    @property
    def pos(self) -> int:
        return self.ranks[0].pos

    @pos.setter
    def pos(self, value: int) -> None:
        for s in self.ranks:
            s.pos = value

    def reset(self) -> None:
        for s in self.ranks:
            s.reset()

    def snapshot(self) -> tuple:
        return tuple(s.snapshot() for s in self.ranks)

    def restore(self, snap: tuple) -> None:
        for s, one in zip(self.ranks, snap):
            s.restore(one)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.ranks)


class ShardedBackend(Loader):
    """Loads each weight as the plan splits it (by its canonical name) onto N NumPy backends, or
    onto the given per-GPU loaders ``ranks`` (the ops below then need NumPy ones: a GPU test
    uploads each GPU's pieces through CudaLoader to weigh them)."""

    name = "numpy-sharded"

    def __init__(self, plan: PartitionPlan, act_quant: bool = False, act_bf16: bool = False, ranks: list | None = None):
        self.plan, self.world = plan, plan.world
        self.ranks = ranks or [NumpyBackend(act_quant, act_bf16) for _ in range(plan.world)]
        self.device_name = f"CPU (NumPy, {plan.world} shards)"

    def _kind(self, tensors: list) -> str:
        kinds = {self.plan.splits[t.name].kind for t in tensors}
        if len(kinds) != 1:
            raise ValueError(f"{[t.name for t in tensors]}: one matrix of tensors split differently ({sorted(kinds)})")
        return kinds.pop()

    def _load(self, tensors: list, load) -> ShardedWeight:
        """``load(rank backend, its tensors)`` on every GPU (a replicated weight whole on each)."""
        kind = self._kind(tensors)
        if kind == REPLICATE:
            return ShardedWeight(kind, [load(b, tensors) for b in self.ranks], [0] * self.world)
        s = self.plan.splits[tensors[0].name]
        pieces = lambda r: [shard_of(t, self.plan.splits[t.name], r) for t in tensors]  # noqa: E731
        return ShardedWeight(kind, [load(b, pieces(r)) for r, b in enumerate(self.ranks)], [rr[0][0] for rr in s.ranges])

    def load_linear(self, tensors: list, interleave: bool = False, role: str = "") -> ShardedWeight:
        return self._load(tensors, lambda b, ts: b.load_linear(ts, interleave, role))

    def load_vector(self, tensors: list) -> ShardedWeight:
        return self._load(tensors, lambda b, ts: b.load_vector(ts))

    def load_embedding(self, tensor) -> ShardedWeight:
        return self._load([tensor], lambda b, ts: b.load_embedding(ts[0]))

    def load_conv(self, tensor) -> ShardedWeight:
        return self._load([tensor], lambda b, ts: b.load_conv(ts[0]))

    def load_vocab_map(self, ids, vocab_size: int):
        return self.ranks[0].load_vocab_map(ids, vocab_size)

    def load_experts(self, gate, up, down, role: str = "experts") -> ShardedWeight:
        s = self.plan.splits[gate.name]
        parts = []
        for r, b in enumerate(self.ranks):
            ex = b.load_experts(*(shard_of(t, s, r) for t in (gate, up, down)), role)
            ex.first = s.ranges[r][0][0]
            parts.append(ex)
        return ShardedWeight(EXPERTS, parts, [rr[0][0] for rr in s.ranges])

    def new_kv_cache(self, n_layers: int, n_kv: int, head_dim: int, n_ctx: int) -> ShardedKV:
        local = kv_heads_per_gpu(self.plan.heads[0], n_kv, self.world)
        return ShardedKV([b.new_kv_cache(n_layers, local, head_dim, n_ctx) for b in self.ranks])

    def new_recurrent_state(self, spec: DeltaNetSpec, n_layers: int) -> ShardedState:
        return ShardedState([b.new_recurrent_state(local_deltanet(spec, self.world), n_layers) for b in self.ranks])

    def ops(self, cache: ShardedKV, start: int, n_rows: int, eps: float, all_rows: bool = True,
            state: ShardedState | None = None, prefill: bool | None = None) -> "ShardedOps":
        return ShardedOps(self, [b.ops(cache.ranks[r], start, n_rows, eps, all_rows,
                                       state.ranks[r] if state is not None else None, prefill)
                                 for r, b in enumerate(self.ranks)])


class ShardedOps(Ops):
    """The op set over N GPUs' NumpyOps (module docstring).  Each op says what it exchanges;
    the rest is each GPU's own op on its share."""

    def __init__(self, backend: ShardedBackend, ranks: list[NumpyOps]):
        self.world, self.ranks = backend.world, ranks

    def _each(self, fn, *values) -> Shards:
        """GPU r's ``fn(its ops, its piece of each value, ...)``: a Shards."""
        return Shards([fn(o, *(v.parts[r] if isinstance(v, (Shards, ShardedWeight)) else v for v in values))
                       for r, o in enumerate(self.ranks)])

    def embed(self, table: ShardedWeight, ids):
        """Each GPU's rows of the ids in its vocabulary range, zeros for the rest; all-reduce
        (each sum has one nonzero term: exact)."""
        ids = np.asarray(ids, np.int64)
        T, D = len(ids), table.parts[0].shape[1]
        partials = []
        for r, o in enumerate(self.ranks):
            lo, n = table.first[r], table.parts[r].shape[0]
            mine = (ids >= lo) & (ids < lo + n)
            part = np.zeros((T, D), np.float32)
            part[mine] = o.embed(table.parts[r], ids[mine] - lo)
            partials.append(part)
        return reduce_ranks(partials)

    def rmsnorm(self, x, w: ShardedWeight):
        return self.ranks[0].rmsnorm(x, w.parts[0])

    def concat(self, a, b):
        return self.ranks[0].concat(a, b)

    def linear(self, x, w: ShardedWeight, residual=None):
        """Replicated: every GPU's same product.  ROWS (column-parallel): each GPU's outputs, a
        Shards.  COLS (row-parallel): each GPU's partial sum from its inputs, all-reduced, then
        the residual added (as the unsplit op adds it to its one product)."""
        if w.kind == REPLICATE:
            return self.ranks[0].linear(x, w.parts[0], residual)
        if w.kind == ROWS:
            if residual is not None:
                raise ValueError("a column-parallel product's outputs are split: no residual can be added to them")
            return self._each(lambda o, xr, wr: o.linear(xr, wr), x, w)
        total = reduce_ranks(self._each(lambda o, xr, wr: o.linear(xr, wr), x, w).parts)
        return total if residual is None else residual + total

    def swiglu(self, gu):
        return self._each(lambda o, g: o.swiglu(g), gu) if isinstance(gu, Shards) else self.ranks[0].swiglu(gu)

    def rope_kv(self, qkv: Shards, spec: AttentionSpec, layer: int, bias=None, q_norm=None, k_norm=None):
        """Each GPU's heads.  A QK-norm over the whole projections (MiniMax-M2) split with the
        heads: each GPU's sums of squares of its q and of its k, all-reduced, give the mean
        square each GPU normalizes its heads by; then the op runs on without norm or bias."""
        loc = local_attention(spec, self.world)
        if q_norm is None or q_norm.kind == REPLICATE:
            return self._each(lambda o, x, b, qn, kn: o.rope_kv(x, loc, layer, b, qn, kn), qkv, bias, q_norm, k_norm)
        H, K, hd = loc.n_heads, loc.n_kv_heads, loc.head_dim
        parts = [p + bias.parts[r] if bias is not None else p for r, p in enumerate(qkv.parts)]
        q, k = [p[:, :H * hd] for p in parts], [p[:, H * hd:(H + K) * hd] for p in parts]
        sq = lambda vs: reduce_ranks([np.sum(v * v, axis=-1, keepdims=True, dtype=np.float32) for v in vs])  # noqa: E731
        ms_q, ms_k = sq(q) / np.float32(spec.n_heads * hd), sq(k) / np.float32(spec.n_kv_heads * hd)
        normed = [np.concatenate([rmsnorm_ref(q[r], q_norm.parts[r], spec.eps, ms_q),
                                  rmsnorm_ref(k[r], k_norm.parts[r], spec.eps, ms_k), p[:, (H + K) * hd:]], axis=1)
                  for r, p in enumerate(parts)]
        return self._each(lambda o, x: o.rope_kv(x, loc, layer), Shards(normed))

    def attention(self, q: Shards, spec: AttentionSpec, layer: int):
        loc = local_attention(spec, self.world)
        return self._each(lambda o, qr: o.attention(qr, loc, layer), q)

    def output_gate(self, o: Shards, qkv: Shards, spec: AttentionSpec):
        loc = local_attention(spec, self.world)
        return self._each(lambda ops, orr, x: ops.output_gate(orr, x, loc), o, qkv)

    def deltanet_split(self, y: Shards, spec: DeltaNetSpec):
        """Each GPU's share of the fused projection holds its own heads' rows of each block."""
        loc = local_deltanet(spec, self.world)
        parts = [o.deltanet_split(y.parts[r], loc) for r, o in enumerate(self.ranks)]
        return tuple(Shards(list(p)) for p in zip(*parts))

    def causal_conv1d(self, x: Shards, w: ShardedWeight, spec: DeltaNetSpec, layer: int):
        loc = local_deltanet(spec, self.world)
        return self._each(lambda o, xr, wr: o.causal_conv1d(xr, wr, loc, layer), x, w)

    def gated_delta_rule(self, qkv: Shards, b, a, A, dt_bias, spec: DeltaNetSpec, layer: int):
        loc = local_deltanet(spec, self.world)
        return self._each(lambda o, *v: o.gated_delta_rule(*v, loc, layer), qkv, b, a, A, dt_bias)

    def gated_rmsnorm(self, x: Shards, z: Shards, w: ShardedWeight, spec: DeltaNetSpec):
        loc = local_deltanet(spec, self.world)
        return self._each(lambda o, xr, zr, wr: o.gated_rmsnorm(xr, zr, wr, loc), x, z, w)

    def router(self, x, gate: ShardedWeight, spec: RouterSpec, bias=None):
        """Replicated: every GPU picks the same experts from the same logits."""
        return self.ranks[0].router(x, gate.parts[0], spec, bias.parts[0] if bias is not None else None)

    def experts(self, x, ids, weights, experts: ShardedWeight, residual, shared=None):
        """Each GPU adds the weighted outputs of the experts it holds in the router's ranking
        order (the others' slots add nothing), plus its share of the shared expert, onto zeros;
        the partial sums are all-reduced, then added to the residual."""
        zeros = np.zeros_like(residual)
        partials = []
        for r, o in enumerate(self.ranks):
            sh = None if shared is None else tuple(None if s is None else s.parts[r] for s in shared)
            partials.append(o.experts(x, ids, weights, experts.parts[r], zeros, sh))
        return residual + reduce_ranks(partials)

    def lm_head(self, x, w: ShardedWeight):
        """Each GPU's vocabulary range of the logits; all-gathered in rank order (no arithmetic)."""
        return np.concatenate(self._each(lambda o, wr: o.lm_head(x, wr), w).parts, axis=-1)

    def vocab_expand(self, logits, vmap):
        return self.ranks[0].vocab_expand(logits, vmap)


def sharded_runner(checkpoint, world: int, n_ctx: int = 0, act_quant: bool = False) -> NumpyRunner:
    """A checkpoint's model split over ``world`` simulated GPUs (parallel.plan_for), on the NumPy
    reference runner; one sequence at a time (its batched step runs over the unsplit paged pool)."""
    from ..models import build_model
    from ..parallel import plan_for

    backend = ShardedBackend(plan_for(checkpoint, world), act_quant=act_quant)
    runner = NumpyRunner(build_model(checkpoint, backend, n_ctx), backend)
    runner.max_batch = 1
    return runner
