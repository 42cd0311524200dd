"""``bw24chat info -m MODEL [--quantize FMT] [--json]``: what a checkpoint is, the VRAM it needs (the
model manager's estimate), and which storage format each tensor role is in, per layer range (mixed
checkpoints, e.g. NVFP4 projections with a BF16 embedding and a Q8_0 LM head, show one row per format).  Reads the file's metadata and tensor
table only (GGUF and safetensors are memory-mapped); --quantize shows the formats after
quantize-at-load, which does convert the weights (slow for large models)."""
from __future__ import annotations

import argparse
import json
import sys

from .console import print_downloads
from .loaders import summarize_formats
from .model_store import model_aliases, open_checkpoint
from .options import add_budget_args, add_model_arg, batching, parser
from .loaders.tensor import ExpertTensor


def moe_facts(ck) -> dict | None:
    """Routed experts, experts per token, and the parameters one token uses (all but the
    unselected experts), or None for a dense model."""
    routed = [t for t in ck.tensors.values() if isinstance(t, ExpertTensor)]
    if not routed:
        return None
    from .models import get_family

    a = get_family(ck.arch).ModelArgs.from_dict(ck.config)
    E, k = routed[0].shape[0], a.num_experts_per_tok
    routed_params = sum(t.numel for t in routed)
    return {"experts": E, "experts_per_token": k, "shared_experts": a.n_shared_experts,
            "expert_bytes": sum(t.nbytes for t in routed),
            "active_parameters": ck.n_params - routed_params + routed_params * k // E}


def moe_tiers(ck, vram_budget_gb: float = 0.0, host_budget_gb: float | None = None, n_ctx: int = 0) -> dict | None:
    """Where the experts land at these budgets (the GPU's free memory, or --vram-budget without
    a GPU) and the decode speed to expect; None for a dense model or with no VRAM to plan for."""
    from .backends import expert_tiers as et
    from .model_catalog import ESTIMATE_CTX, gpu_memory
    from .models import get_family

    layout = et.layout_of(ck)
    gpu = gpu_memory()
    free = gpu.free if gpu else int(vram_budget_gb * et.GiB)
    if layout is None or not free:
        return None
    a = get_family(ck.arch).ModelArgs.from_dict(ck.config)
    ctx = min(n_ctx or ESTIMATE_CTX, a.max_position_embeddings)
    kv = et.model_kv_bytes(a, ctx)
    try:
        plan = et.plan_for(layout, free, vram_budget_gb, host_budget_gb, kv)
    except et.DoesNotFit as exc:
        return {"fits": False, "lines": [str(exc)]}
    return {"fits": True, "context": ctx, **plan.as_dict(layout), "decode": et.estimate_decode(layout, plan).as_dict(),
            "lines": et.describe_plan(layout, plan)}


def vram_estimate(ck, n_ctx: int = 0, max_batch: int = 0, tiers: dict | None = None) -> dict:
    """The model manager's VRAM estimate (model_catalog.estimate_parts) at ``n_ctx`` positions (0:
    the estimate's context), the pool of batched decoding counted where the engine batches: not at
    --max-batch 1, nor for a model with recurrent layers or with experts outside VRAM (``tiers``,
    moe_tiers), which decode one sequence at a time."""
    from .model_catalog import ESTIMATE_CTX, ModelShape, estimate_parts, kv_per_token
    from .models import get_family

    a = get_family(ck.arch).ModelArgs.from_dict(ck.config)
    ctx = min(n_ctx or ESTIMATE_CTX, a.max_position_embeddings)
    linear = sum(a.is_linear(i) for i in range(a.num_hidden_layers)) if hasattr(a, "deltanet_spec") else 0
    spilled = tiers is not None and not tiers.get("all_resident")
    pool = batching(max_batch, None) and not linear and not spilled
    per_token = kv_per_token(ModelShape(a.num_hidden_layers - linear, a.num_key_value_heads, a.head_dim))
    parts = estimate_parts(ck.nbytes, per_token, ctx, pool)
    return {"context": ctx, **parts, "total": sum(parts.values())}


def vram_line(v: dict) -> str:
    gib = 2**30
    pool = f", batched decoding's KV pool {v['kv_pool'] / gib:.2f}" if v["kv_pool"] else ""
    return (f"VRAM estimate: {v['total'] / gib:.2f} GiB (weights {v['weights'] / gib:.2f}, KV cache "
            f"{v['kv_cache'] / gib:.2f} at {v['context']} tokens{pool}, workspace {v['workspace'] / gib:.2f})")


def describe(ck, tiers: dict | None = None, vram: dict | None = None) -> dict:
    d = {
        "name": ck.name,
        "id": model_aliases(ck.path)[0],
        "path": str(ck.path),
        "arch": ck.arch,
        "parameters": ck.n_params,
        "bytes": ck.nbytes,
        "formats": [dict(role=r, format=f, layers=l) for r, f, l in summarize_formats(ck.formats())],
    }
    if vram:
        d["vram_estimate"] = vram
    moe = moe_facts(ck)
    if moe:
        d["moe"] = moe
        if tiers:
            d["moe"]["tiers"] = tiers
    return d


def format_table(rows: list[tuple[str, str, str]]) -> str:
    w = max([len(r[0]) for r in rows] + [4])
    lines = [f"{'tensor':{w}}  {'format':8}  layers"]
    lines += [f"{role:{w}}  {fmt:8}  {layers}" for role, fmt, layers in rows]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = parser("bw24chat info", __doc__)
    add_model_arg(p, default="default")
    p.add_argument("--quantize", choices=["nvfp4", "q8_0"], default=None,
                   help="show the formats after quantize-at-load (default: as stored)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    add_budget_args(p)
    p.add_argument("--ctx", dest="n_ctx", type=int, default=0,
                   help="context the KV cache holds in the estimate and the MoE plan (default: 0, 4096 or the "
                        "model's if smaller)")
    p.add_argument("--max-batch", type=int, default=0, metavar="N",
                   help="as the engine's: 1 (one request at a time) counts no KV pool of batched decoding (default: 0)")
    return p


def main(argv: list[str]) -> int:
    a = build_parser().parse_args(argv)
    try:
        ck = open_checkpoint(a.model, print_downloads("bw24chat info"))
        if a.quantize:
            from .quantize import requantize_checkpoint

            requantize_checkpoint(ck, a.quantize)
    except Exception as exc:  # noqa: BLE001 - one line for the user
        sys.stderr.write(f"bw24chat info: {exc}\n")
        return 2
    tiers = moe_tiers(ck, a.vram_budget_gb, a.host_budget_gb, a.n_ctx)
    d = describe(ck, tiers, vram_estimate(ck, a.n_ctx, a.max_batch, tiers))
    if a.json:
        print(json.dumps(d, indent=1))
        return 0
    print(f"{d['id']}: {d['name']}  ({d['arch']}, {d['parameters'] / 1e6:.1f} M parameters, {d['bytes'] / 2**20:.1f} MiB)")
    print(vram_line(d["vram_estimate"]))
    if "moe" in d:
        m = d["moe"]
        print(f"experts: {m['experts']} routed, {m['experts_per_token']} per token, {m['shared_experts']} shared; "
              f"{m['active_parameters'] / 1e6:.1f} M parameters active per token; experts {m['expert_bytes'] / 2**20:.1f} MiB")
        for line in m.get("tiers", {}).get("lines", ["tiers: no GPU found; --vram-budget GIB plans for a card of that size"]):
            print(line)
    print(format_table([(r["role"], r["format"], r["layers"]) for r in d["formats"]]))
    return 0
