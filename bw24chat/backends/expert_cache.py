"""The VRAM expert-slot cache's eviction policies, pure Python and deterministic,
so the same object drives the CUDA tiers (which slot an expert's image goes to: cuda_tiers.py)
and the NumPy engine's simulated accounting.

One cache per MoE layer, ``slots`` slots each.  ``on_route(layer, expert_ids)`` is one lookup per
distinct expert the step (a decode token, or a prefill chunk) routes to in that layer; the experts
of one call never evict each other while the call's experts fit in the slots (the kernels read
all of them in one launch).  Ties are broken by expert index, never by hashing or time.

Policies (the default chosen by measurement, docs/performance.md "MoE expert residency"):
- ``lru``: evict the least recently used.
- ``slru``: segmented LRU; a first use enters a probation segment, a second use promotes to a
  protected segment (``SLRU_PROTECTED`` of the slots), eviction takes probation's LRU first, so
  one-off experts cannot flush the ones used again and again.
- ``lfu``: frequency with aging; counts are kept for every expert (resident or not) and halved
  every ``LFU_AGE_EVERY`` lookups per expert of the layer, so popularity can shift with the topic;
  the victim is the resident expert of lowest count, then least recent.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

POLICIES = ("lru", "slru", "lfu")
DEFAULT_POLICY = "lfu"  # the best hit rate on every trace measured (docs/performance.md)
SLRU_PROTECTED = 0.8  # the usual split (Karedla et al., IEEE Computer 1994)
LFU_AGE_EVERY = 8  # lookups per expert of the layer between halvings of the counts


class _Layer:
    """One layer's slots: which expert each slot holds, and the policy's order."""

    def __init__(self, slots: int, n_experts: int):
        self.slots = slots
        self.free = list(range(slots - 1, -1, -1))  # pop() hands out slot 0 first
        self.slot_of: dict[int, int] = {}  # resident expert -> slot
        self.clock = 0

    def victim(self, protect: set) -> int:
        raise NotImplementedError

    def touch(self, e: int, hit: bool) -> None:
        raise NotImplementedError

    def drop(self, e: int) -> None:
        raise NotImplementedError


class _LRU(_Layer):
    def __init__(self, slots, n_experts):
        super().__init__(slots, n_experts)
        self.order: OrderedDict[int, None] = OrderedDict()  # least recent first

    def victim(self, protect):
        return next((e for e in self.order if e not in protect), next(iter(self.order)))

    def touch(self, e, hit):
        self.order[e] = None
        self.order.move_to_end(e)

    def drop(self, e):
        del self.order[e]


class _SLRU(_Layer):
    def __init__(self, slots, n_experts):
        super().__init__(slots, n_experts)
        self.cap = max(1, int(slots * SLRU_PROTECTED)) if slots > 1 else 0
        self.prob: OrderedDict[int, None] = OrderedDict()
        self.prot: OrderedDict[int, None] = OrderedDict()

    def victim(self, protect):
        for seg in (self.prob, self.prot):
            e = next((e for e in seg if e not in protect), None)
            if e is not None:
                return e
        return next(iter(self.prob or self.prot))

    def touch(self, e, hit):
        if not hit:
            self.prob[e] = None
            return
        self.prob.pop(e, None)
        self.prot[e] = None
        self.prot.move_to_end(e)
        if len(self.prot) > self.cap:  # the protected segment's LRU goes back to probation's MRU end
            d, _ = self.prot.popitem(last=False)
            self.prob[d] = None

    def drop(self, e):
        self.prob.pop(e, None)
        self.prot.pop(e, None)


class _LFU(_Layer):
    def __init__(self, slots, n_experts):
        super().__init__(slots, n_experts)
        self.count = [0] * n_experts
        self.last = [0] * n_experts
        self.age_every = LFU_AGE_EVERY * n_experts
        self.lookups = 0

    def victim(self, protect):
        cands = [e for e in self.slot_of if e not in protect] or list(self.slot_of)
        return min(cands, key=lambda e: (self.count[e], self.last[e], e))

    def touch(self, e, hit):
        self.count[e] += 1
        self.last[e] = self.clock
        self.lookups += 1
        if self.lookups % self.age_every == 0:
            self.count = [c // 2 for c in self.count]

    def drop(self, e):
        pass


_KINDS = {"lru": _LRU, "slru": _SLRU, "lfu": _LFU}


class ExpertCache:
    """Per-layer expert slots under one policy.  After ``on_route``, ``loads`` lists the
    (expert, slot, evicted expert or -1) of that call's misses: what the tier must copy in."""

    def __init__(self, n_layers: int, n_experts: int, slots: int | list[int], policy: str = "lru"):
        if policy not in _KINDS:
            raise ValueError(f"expert cache policy {policy!r}: one of {', '.join(POLICIES)}")
        per = [slots] * n_layers if isinstance(slots, int) else list(slots)
        if len(per) != n_layers or min(per, default=1) < 1 or max(per, default=0) > n_experts:
            raise ValueError(f"expert slots {per}: 1..{n_experts} per layer, {n_layers} layers")
        self.policy, self.n_experts = policy, n_experts
        self.layers = [_KINDS[policy](s, n_experts) for s in per]
        self.loads: list[tuple[int, int, int]] = []
        for L in self.layers:  # the load fills the slots with experts 0..slots-1, as uploaded
            for e in range(L.slots):
                L.slot_of[e] = L.free.pop()
                L.touch(e, False)

    def on_route(self, layer: int, expert_ids) -> tuple[int, int, int]:
        """(hits, misses, evictions) of the distinct experts in ``expert_ids`` (any shape)."""
        L = self.layers[layer]
        L.clock += 1
        ids = sorted(set(_flat(expert_ids)))
        protect = {e for e in ids if e in L.slot_of}  # this call's resident experts stay
        hits = misses = evictions = 0
        self.loads = []
        for e in ids:
            hit = e in L.slot_of
            if hit:
                hits += 1
            else:
                misses += 1
                evicted = -1
                if not L.free:
                    evicted = L.victim(protect)
                    L.drop(evicted)
                    L.free.append(L.slot_of.pop(evicted))
                    evictions += 1
                L.slot_of[e] = L.free.pop()
                self.loads.append((e, L.slot_of[e], evicted))
            protect.add(e)
            L.touch(e, hit)
        return hits, misses, evictions

    def resident(self, layer: int) -> dict[int, int]:
        """expert -> slot of the layer's residents."""
        return dict(self.layers[layer].slot_of)

    def occupancy(self) -> tuple[int, int]:
        """(slots holding an expert, slots) over all layers."""
        return sum(len(L.slot_of) for L in self.layers), sum(L.slots for L in self.layers)


def _flat(ids) -> list:
    return np.asarray(ids).reshape(-1).tolist()


def hit_rate(trace, n_experts: int, slots: int, policy: str) -> float:
    """The fraction of lookups a policy serves from its slots over ``trace``: a list of steps,
    each a list (one per layer) of the expert ids that step routes to."""
    cache = ExpertCache(len(trace[0]), n_experts, slots, policy)
    hits = lookups = 0
    for step in trace:
        for li, ids in enumerate(step):
            h, m, _ = cache.on_route(li, ids)
            hits, lookups = hits + h, lookups + h + m
    return hits / max(lookups, 1)


def synthetic_trace(n_layers: int, n_experts: int, k: int, n_tokens: int, seed: int = 0, zipf_s: float = 1.0,
                    reuse: float = 0.5, drift_every: int = 256, drift_frac: float = 0.1) -> list[list[list[int]]]:
    """A routing trace with what real MoE routing shows: skewed expert popularity (Zipf, exponent
    ``zipf_s``, a random ranking per layer), reuse between consecutive tokens (each of the previous
    token's experts is kept with probability ``reuse``) and popularity that drifts with the topic
    (every ``drift_every`` tokens, ``drift_frac`` of the ranking swaps places).  Deterministic in
    ``seed``.  The model and its sources: docs/performance.md, "MoE expert residency"."""
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, n_experts + 1) ** zipf_s
    rank = [rng.permutation(n_experts) for _ in range(n_layers)]  # rank[l][r]: the expert of rank r
    prev = [[] for _ in range(n_layers)]
    trace = []
    for t in range(n_tokens):
        if t and t % drift_every == 0:
            for r in rank:
                i = rng.choice(n_experts, 2 * int(n_experts * drift_frac / 2), replace=False)
                r[i] = r[i[::-1]]
        step = []
        for li in range(n_layers):
            keep = [e for e in prev[li] if rng.random() < reuse]
            p = w.copy()
            p[np.isin(rank[li], keep)] = 0
            new = rank[li][rng.choice(n_experts, k - len(keep), replace=False, p=p / p.sum())]
            prev[li] = keep + [int(e) for e in new]
            step.append(prev[li])
        trace.append(step)
    return trace
