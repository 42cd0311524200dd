"""Where a MoE model's routed experts live: the residency plan, decided from
sizes alone before anything is loaded, the decode-speed estimate it implies, and the tiers'
accounting (``ExpertTiers`` + ``ExpertStats``) that the engines report.

Tiers: VRAM slots (a cache per layer, policy in expert_cache.py; the kernels read experts through
``cuda_moe.ExpertStore``'s tables, so a miss is one copy into a slot plus its table rows:
cuda_tiers.py), pinned host RAM (a fixed set of experts per layer, chosen at load), and the
memory-mapped model file (disk, through the page cache).  All experts stay in VRAM when they fit.  Pure functions: the sizes
come from the checkpoint's tensor table and the budgets from the flags.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ..options import OptionError
from .expert_cache import DEFAULT_POLICY, ExpertCache

GiB = 2**30
# Assumed tier rates for the estimate (the real ones get measured on the GPU machine):
VRAM_BYTES_PER_S = 3.0e12  # H100 copy, measured ~2.9-3.0 TB/s (engine notes); the H200 does ~4.2
PCIE_BYTES_PER_S = 50e9  # PCIe 5.0 x16: 64 GB/s per direction by the spec, pinned copies ~80 % of it
DISK_BYTES_PER_S = 3.0e9  # NVMe PCIe 4.0 x4: ~7 GB/s sequential by datasheets; MB-sized expert reads, half
# VRAM kept back beyond the weights and the KV cache: activations, workspaces, the context's slack
# (cuda_budget.RESERVE_BYTES is ~1.6 GiB; the slot copies' staging adds little)
HEADROOM_BYTES = 2 * GiB


class DoesNotFit(OptionError):
    """The model cannot run at these budgets even with experts spilled (the CLI prints it, exit 2)."""


@dataclass(frozen=True)
class MoELayout:
    """The sizes the plan needs: per MoE layer, its experts' count and bytes of one expert (gate,
    up and down together); the rest of the weights; the bytes one decode step reads of them."""
    n_experts: tuple[int, ...]
    expert_bytes: tuple[int, ...]
    top_k: int
    other_bytes: int  # every non-expert weight
    other_read_bytes: int  # what a decode step reads of them (one embedding row, not the table)

    @property
    def n_layers(self) -> int:
        return len(self.n_experts)

    @property
    def total_expert_bytes(self) -> int:
        return sum(n * b for n, b in zip(self.n_experts, self.expert_bytes))

    @property
    def active_expert_bytes(self) -> int:
        """Expert bytes one token reads: k experts in every MoE layer."""
        return self.top_k * sum(self.expert_bytes)


def layout_of(ck) -> MoELayout | None:
    """A checkpoint's MoELayout (None for a dense model): from its ExpertTensors, no data read."""
    from ..loaders.tensor import ExpertTensor
    from ..models import get_family

    experts = [(n, t.shape[0], t.nbytes) for n, t in ck.tensors.items() if isinstance(t, ExpertTensor)]
    if not experts:
        return None
    a = get_family(ck.arch).ModelArgs.from_dict(ck.config)
    emb = ck.tensors.get("tok_embd")
    return layout_from_tensors(experts, ck.nbytes, a.num_experts_per_tok, emb.nbytes if emb else 0, a.vocab_size,
                               tied="output" not in ck.tensors)


def layout_from_tensors(experts: list, total_bytes: int, top_k: int, embd_bytes: int, vocab: int, tied: bool) -> MoELayout | None:
    """From a tensor table: ``experts`` (name, experts, bytes) of the routed-expert tensors
    (``blk.N.ffn_*_exps``), the file's weight bytes, the embedding's bytes (a decode step reads
    one of its ``vocab`` rows unless it is also the LM head)."""
    per: dict[int, list] = {}
    for name, n, nbytes in experts:
        m = re.match(r"blk\.(\d+)\.", name)
        per.setdefault(int(m.group(1)) if m else -1, []).append((n, nbytes))
    if not per:
        return None
    layers = [per[i] for i in sorted(per)]
    other = total_bytes - sum(b for ts in layers for _, b in ts)
    skip = 0 if tied else embd_bytes - embd_bytes // max(vocab, 1)
    return MoELayout(tuple(ts[0][0] for ts in layers), tuple(sum(b for _, b in ts) // ts[0][0] for ts in layers),
                     top_k, other, other - skip)


def layout_from_config(cfg: dict, fmt: str) -> MoELayout | None:
    """A MoELayout from a config alone, every matrix in ``fmt`` (the router and norms in F32):
    for a model manager entry whose tensors are not read, and for plans of shapes not at hand."""
    from gguf.constants import GGMLQuantizationType

    from .. import quants
    from ..models import get_family

    a = get_family(cfg["model_type"]).ModelArgs.from_dict(cfg)
    if not getattr(a, "num_experts", 0):
        return None
    bs, ts = quants.block_info(GGMLQuantizationType[fmt])
    mat = lambda rows, cols: rows * cols * ts // bs  # noqa: E731
    D, V, E, L = a.hidden_size, a.vocab_size, a.num_experts, a.num_hidden_layers
    Fe, H, K, hd = a.moe_intermediate_size, a.num_attention_heads, a.num_key_value_heads, a.head_dim
    moe = [i for i in range(L) if a.is_moe_layer(i)]
    Fs = Fe * a.n_shared_experts
    per_layer = mat(2 * H * hd + 2 * K * hd, D) + 4 * (E * D + 2 * D + 2 * hd)
    dense = (L - len(moe)) * 3 * mat(a.intermediate_size, D) + len(moe) * 3 * mat(Fs, D)
    emb = mat(V, D)
    other = L * per_layer + dense + emb * (1 if a.tie_word_embeddings else 2) + 4 * D
    return MoELayout(tuple(E for _ in moe), tuple(3 * mat(Fe, D) for _ in moe), a.num_experts_per_tok,
                     other, other - (0 if a.tie_word_embeddings else emb - emb // V))


@dataclass(frozen=True)
class TierPlan:
    """Per MoE layer: experts with a VRAM slot, held in pinned host RAM, left to the file."""
    vram_slots: tuple[int, ...]
    host_experts: tuple[int, ...]
    disk_experts: tuple[int, ...]
    vram_budget: int
    host_budget: int
    fixed_bytes: int  # non-expert weights + KV cache + headroom, in VRAM whatever happens

    @property
    def all_resident(self) -> bool:
        return not any(self.host_experts) and not any(self.disk_experts)

    def as_dict(self, layout: MoELayout) -> dict:
        eb = layout.expert_bytes
        return {"vram_slots_per_layer": min(self.vram_slots), "experts_per_layer": max(layout.n_experts),
                "vram_expert_bytes": sum(s * b for s, b in zip(self.vram_slots, eb)),
                "host_expert_bytes": sum(h * b for h, b in zip(self.host_experts, eb)),
                "disk_expert_bytes": sum(d * b for d, b in zip(self.disk_experts, eb)),
                "vram_budget": self.vram_budget, "host_budget": self.host_budget, "all_resident": self.all_resident}


def plan_tiers(layout: MoELayout, kv_bytes: int, free_vram: int, vram_budget: int = 0, host_budget: int = 0,
               headroom: int = HEADROOM_BYTES) -> TierPlan:
    """The residency plan.  ``vram_budget`` 0: all free VRAM; ``host_budget``: bytes of pinned
    host RAM for experts (0: none, misses read from the file).  Raises DoesNotFit, with the
    numbers, when VRAM cannot hold the fixed part plus ``top_k`` slots per layer (one token's
    experts: the kernels read them all in one launch)."""
    budget = min(vram_budget, free_vram) if vram_budget else free_vram
    fixed = layout.other_bytes + kv_bytes + headroom
    eb, E = layout.expert_bytes, layout.n_experts
    room = budget - fixed
    if room >= layout.total_expert_bytes:
        zero = tuple(0 for _ in E)
        return TierPlan(tuple(E), zero, zero, budget, host_budget, fixed)
    per_slot = sum(eb)  # one slot in every layer: layers get the same count (the same routing load)
    slots = min(room // per_slot if room > 0 else 0, min(E))
    need = fixed + layout.top_k * per_slot
    if slots < layout.top_k:
        raise DoesNotFit(
            f"the model does not fit: VRAM budget {budget / GiB:.1f} GiB < {need / GiB:.1f} GiB needed "
            f"(other weights {layout.other_bytes / GiB:.1f} + KV cache {kv_bytes / GiB:.1f} + headroom "
            f"{headroom / GiB:.1f} + {layout.top_k} expert slots x {layout.n_layers} layers "
            f"{layout.top_k * per_slot / GiB:.2f}); experts in all {layout.total_expert_bytes / GiB:.1f} GiB")
    # the host tier holds whole experts, the same count per layer; the VRAM cache evicts freely,
    # so every expert may miss and host holds any expert it can, not only those without a slot
    host = min(host_budget // per_slot, min(E))
    return TierPlan(tuple(slots for _ in E), tuple(host for _ in E), tuple(e - host for e in E), budget, host_budget, fixed)


def fixed_plan(layout: MoELayout, slots: int, host: int) -> TierPlan:
    """A plan of ``slots`` VRAM slots and ``host`` pinned host experts per layer, the rest on
    disk, whatever the budgets (the spilled = resident gate and tests force every tier)."""
    E = layout.n_experts
    return TierPlan(tuple(min(slots, e) for e in E), tuple(min(host, e) for e in E), tuple(max(e - host, 0) for e in E),
                    0, 0, 0)


def available_host_memory() -> int:
    """MemAvailable (Linux), else physical memory; what the auto host budget takes half of."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def host_budget_bytes(gb: float | None) -> int:
    """--host-budget in bytes; None (auto): half the available memory, so the page cache that
    serves the disk tier keeps the other half (pinning it all would slow the file reads)."""
    return int(gb * GiB) if gb is not None else available_host_memory() // 2


def plan_for(layout: MoELayout, free_vram: int, vram_budget_gb: float, host_budget_gb: float | None, kv_bytes: int) -> TierPlan:
    """plan_tiers at the flags' budgets (--vram-budget GiB, 0 all free; --host-budget GiB, None auto)."""
    return plan_tiers(layout, kv_bytes, free_vram, int(vram_budget_gb * GiB), host_budget_bytes(host_budget_gb))


def tiers_for(ck, options, free_vram: int) -> ExpertTiers | None:
    """The engine's tiers for a checkpoint at its options, decided before any weight is loaded
    (DoesNotFit otherwise); None for a dense model, or when the experts all fit in VRAM."""
    from ..model_catalog import ESTIMATE_CTX
    from ..models import get_family

    layout = layout_of(ck)
    if layout is None:
        return None
    a = get_family(ck.arch).ModelArgs.from_dict(ck.config)
    kv = model_kv_bytes(a, options.n_ctx or ESTIMATE_CTX, options.kv_cache)
    plan = plan_for(layout, free_vram, options.vram_budget_gb, options.host_budget_gb, kv)
    return None if plan.all_resident else ExpertTiers(layout, plan)


def kv_cache_bytes(n_ctx: int, n_layers: int, n_kv: int, head_dim: int, kv_type: str = "bf16") -> int:
    from .cuda_budget import kv_token_bytes

    return int(kv_token_bytes(n_layers, n_kv, head_dim, kv_type) * n_ctx)


def model_kv_bytes(args, n_ctx: int, kv_type: str = "bf16") -> int:
    """The KV cache of a model's attention layers at min(n_ctx, its maximum) positions (a hybrid's
    DeltaNet layers keep a fixed-size state instead: ModelArgs.is_linear)."""
    is_linear = getattr(args, "is_linear", None)
    layers = sum(1 for i in range(args.num_hidden_layers) if not (is_linear and is_linear(i)))
    return kv_cache_bytes(min(n_ctx, args.max_position_embeddings), layers, args.num_key_value_heads, args.head_dim, kv_type)


@dataclass(frozen=True)
class SpeedEstimate:
    vram_bytes: float  # per token, read by the kernels
    host_bytes: float  # per token, copied host -> VRAM
    disk_bytes: float  # per token, read from the file
    vram_hit_rate: float
    tokens_per_s: float  # the bound: bytes / assumed rates, no compute or latency

    def as_dict(self) -> dict:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in self.__dict__.items()}


def estimate_decode(layout: MoELayout, plan: TierPlan, vram_hit_rate: float | None = None) -> SpeedEstimate:
    """Decode speed bound at a plan.  The hit rate defaults to the slot fraction, what uniform
    routing gives (real routing is skewed, so the measured rate is higher: docs/performance.md)."""
    E = max(layout.n_experts)
    hit = min(plan.vram_slots) / E if vram_hit_rate is None else vram_hit_rate
    active = layout.active_expert_bytes
    miss = active * (1 - hit)
    host_share = min(plan.host_experts) / E
    host_b, disk_b = miss * host_share, miss * (1 - host_share)
    vram_b = layout.other_read_bytes + active
    t = vram_b / VRAM_BYTES_PER_S + host_b / PCIE_BYTES_PER_S + disk_b / DISK_BYTES_PER_S
    return SpeedEstimate(vram_b, host_b, disk_b, hit, 1.0 / t)


def describe_plan(layout: MoELayout, plan: TierPlan) -> list[str]:
    """Lines for `bw24chat info` and the model manager."""
    d, est = plan.as_dict(layout), estimate_decode(layout, plan)
    E = d["experts_per_layer"]
    if plan.all_resident:
        where = f"all {E} experts x {layout.n_layers} layers in VRAM ({d['vram_expert_bytes'] / GiB:.1f} GiB)"
    else:
        where = (f"VRAM {d['vram_slots_per_layer']}/{E} expert slots per layer ({d['vram_expert_bytes'] / GiB:.1f} GiB), "
                 f"pinned host {min(plan.host_experts)}/{E} ({d['host_expert_bytes'] / GiB:.1f} GiB), "
                 f"file {min(plan.disk_experts)}/{E} ({d['disk_expert_bytes'] / GiB:.1f} GiB)")
    speed = (f"decode <= {est.tokens_per_s:.3g} tok/s (per token: {est.vram_bytes / 1e9:.2f} GB read in VRAM, "
             f"{est.host_bytes / 1e9:.2f} GB over PCIe, {est.disk_bytes / 1e9:.2f} GB from disk at "
             f"{VRAM_BYTES_PER_S / 1e12:.1f} TB/s, {PCIE_BYTES_PER_S / 1e9:.0f} GB/s, {DISK_BYTES_PER_S / 1e9:.0f} GB/s "
             f"assumed; hit rate {est.vram_hit_rate:.0%})")
    return [f"experts: {where}", speed]


# ----------------------------------------------------------------------------- accounting
@dataclass
class ExpertStats:
    """What the tiers did: lookups served per tier, bytes copied in, tokens, slot occupancy."""
    vram_hits: int = 0
    host_hits: int = 0  # VRAM misses served from pinned host RAM
    disk_hits: int = 0  # VRAM misses read from the file
    bytes_host: int = 0
    bytes_disk: int = 0
    tokens: int = 0
    slots_used: int = 0
    slots: int = 0
    prefill_bytes: int = 0  # streamed through the prefill's staging slots (not counted above)

    def as_dict(self) -> dict:
        n = max(self.vram_hits + self.host_hits + self.disk_hits, 1)
        return {"expert_hit_vram": round(self.vram_hits / n, 4), "expert_hit_host": round(self.host_hits / n, 4),
                "expert_hit_disk": round(self.disk_hits / n, 4),
                "expert_bytes_per_token": (self.bytes_host + self.bytes_disk) // max(self.tokens, 1),
                "expert_cache_occupancy": round(self.slots_used / max(self.slots, 1), 4),
                "expert_prefill_bytes": self.prefill_bytes}


@dataclass
class ExpertTiers:
    """A plan at work: the slot cache decides hits and loads, the static host set decides which
    tier serves a miss (experts 0 .. host_experts - 1 of each layer), the stats count it all."""
    layout: MoELayout
    plan: TierPlan
    policy: str = DEFAULT_POLICY
    stats: ExpertStats = field(default_factory=ExpertStats)

    def __post_init__(self):
        self.cache = ExpertCache(self.layout.n_layers, max(self.layout.n_experts), list(self.plan.vram_slots), self.policy)

    def route(self, layer: int, expert_ids, n_tokens: int) -> list[tuple[int, int, int]]:
        """Account one step's routing in a layer; the loads (expert, slot, evicted) to copy in."""
        s = self.stats
        if layer == 0:
            s.tokens += n_tokens
        hits, _, _ = self.cache.on_route(layer, expert_ids)
        s.vram_hits += hits
        for e, _slot, _ev in self.cache.loads:
            from_host = e < self.plan.host_experts[layer]
            s.host_hits += from_host
            s.disk_hits += not from_host
            b = self.layout.expert_bytes[layer]
            s.bytes_host += b if from_host else 0
            s.bytes_disk += 0 if from_host else b
        if self.cache.loads or not s.slots:  # occupancy changes only with loads (a sum over every layer)
            s.slots_used, s.slots = self.cache.occupancy()
        return self.cache.loads

    def lookup(self, layer: int, experts, resident: set) -> None:
        """Account a prefill chunk's experts of a layer, streamed past the slot cache (which
        stays as decode left it): the bytes of those not ``resident``."""
        self.stats.prefill_bytes += self.layout.expert_bytes[layer] * sum(e not in resident for e in experts)
