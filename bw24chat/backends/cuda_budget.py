"""The CUDA engine's memory budget, from sizes alone (no GPU, no CuPy): what the KV cache of one
position costs, the reserve the engine keeps beside the weights and the cache, the context that
fits a VRAM budget, whether a model's resident weights fit at all, and the room left for batched
decoding's paged pool.  make_cuda_runner applies them before loading; expert_tiers plans spilled
MoE experts with the same figures.
"""
from __future__ import annotations

from .cuda_linear import WGP_SCRATCH_BYTES

KV_BYTES_PER_VALUE = {"bf16": 2.0, "q8_0": 34 / 32, "fp8": 1.0, "f32": 4.0}
# activation buffers, workspaces, prefill scratch (the wgmma GEMM's dequantized weight planes
# included), CUDA context slack
RESERVE_BYTES = (3 << 29) + WGP_SCRATCH_BYTES


def kv_token_bytes(n_layers: int, n_kv: int, head_dim: int, kv_type: str) -> float:
    """Bytes of K and V per position over every layer (an fp8 row adds its f32 scale)."""
    return 2 * n_layers * n_kv * (head_dim * KV_BYTES_PER_VALUE[kv_type] + (4 if kv_type == "fp8" else 0))


def fit_context(max_ctx: int, requested: int, budget_bytes: int, weight_bytes: int, n_layers: int, n_kv: int,
                head_dim: int, kv_type: str) -> int:
    """The context the KV cache can hold: the request (or the model's maximum) capped by what is
    left of the VRAM budget after the weights and a reserve, in multiples of 256 (at least 256).
    The context comes first: batched decoding's pool takes what is left after it (pool_room)."""
    want = min(requested or max_ctx, max_ctx)
    fits = int((budget_bytes - weight_bytes - RESERVE_BYTES) // kv_token_bytes(n_layers, n_kv, head_dim, kv_type))
    return max(256, min(want, fits) // 256 * 256) if fits < want else want


def pool_room(free: int, budget_left: int | None, step_bytes: int, n_ctx: int) -> tuple[int, str]:
    """Bytes batched decoding's pool blocks may take, and where the figure comes from: ``free``
    bytes of VRAM now (after the weights, the context's cache and the warm-up), of which the engine
    keeps RESERVE_BYTES free as fit_context keeps them of the budget, capped by ``budget_left`` (a
    --vram-budget less the weights, the cache and the reserve; None: no budget), less
    ``step_bytes`` for the batched step's own buffers."""
    gib = 2**30
    room = free - RESERVE_BYTES
    why = (f"{free / gib:.2f} GiB of VRAM free after the model and its {n_ctx}-token cache, less the engine's "
           f"{RESERVE_BYTES / gib:.2f} GiB reserve")
    if budget_left is not None and budget_left < room:
        room = budget_left
        why = f"the VRAM budget leaves {budget_left / gib:.2f} GiB after the model, its {n_ctx}-token cache and the reserve"
    return room - step_bytes, f"{why} and {step_bytes / gib:.2f} GiB for the batched step's buffers"


def check_fits(name: str, weight_bytes: int, budget_bytes: int) -> None:
    """Refuse, before anything is uploaded, a model whose resident weights the VRAM budget cannot
    hold (MoE experts beyond it were already planned into slots by expert_tiers, or refused
    there), with the numbers and what would run."""
    from .expert_tiers import DoesNotFit

    gib = 2**30
    if weight_bytes + RESERVE_BYTES > budget_bytes:
        raise DoesNotFit(f"{name}: the weights take {weight_bytes / gib:.1f} GiB and the engine {RESERVE_BYTES / gib:.1f} "
                         f"GiB more, but the VRAM budget is {budget_bytes / gib:.1f} GiB: choose a smaller format "
                         "(--quantize nvfp4 or q8_0), a smaller model, or --device cpu")


def resident_weight_bytes(checkpoint, tiers=None) -> int:
    """The bytes of weights the runner keeps in VRAM: all of them, or with spilled experts the
    other weights plus the expert slots."""
    if tiers is None:
        return checkpoint.nbytes
    lay, plan = tiers.layout, tiers.plan
    return lay.other_bytes + sum(s * b for s, b in zip(plan.vram_slots, lay.expert_bytes))

