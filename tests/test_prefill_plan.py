"""The prefill plan and the attention geometry (backends/plan.py) without a GPU, against golden files:
the launches of one prefill chunk (prefill_plan: the activations' preparation, the GEMMs on the
kernels each GPU runs, their tiles and rings, the attention over the cache, the LM head) for the
Qwen3-8B shape per format, GPU and activation contract, for the Qwen3-30B-A3B MoE shape
(the grouped expert GEMMs) and for the tiny shapes at a chunk off the tiles (dense, MoE, the
gated-DeltaNet hybrid); and one attention
launch (attention_plan: decode split-K, its merge and tensor-core ring; the prefill's stages) per
GPU, cache type and head shape.  A change to a launch decision shows here as a diff to review;
regenerate every file with

    python -m tests.test_prefill_plan
"""
from pathlib import Path

import pytest

from bw24chat.backends.plan import GPUS, attention_plan, format_plan, layer_period, prefill_plan
from bw24chat.synthetic import SHAPES

DATA = Path(__file__).parent / "data"

pytestmark = pytest.mark.kernels  # the plan reads register counts from ptxas (NVRTC: the [kernels] extra)

_F32, _BF16 = "f32", "bf16"
# file -> (shape, format, GPU, tokens, kv cache, activations) per section
PREFILL_CASES = {
    "prefill_plan_qwen3-8b.txt": (
        [("qwen3-8b", f, "H100", 512, "bf16", _F32) for f in ("BF16", "Q8_0", "Q4_K", "NVFP4")]
        + [("qwen3-8b", f, "H100", 512, "bf16", _BF16) for f in ("Q8_0", "Q4_K", "NVFP4")]
        + [("qwen3-8b", f, "RTX5090", 512, "q8_0", _F32) for f in ("BF16", "Q8_0", "Q4_K", "NVFP4")]),
    "prefill_plan_qwen3-30b-a3b.txt": [("qwen3-30b-a3b", f, g, 512, "bf16", _F32)
                                       for g in ("H100", "RTX5090") for f in ("Q8_0", "NVFP4")],
    "prefill_plan_tiny.txt": (
        [("tiny", f, "H100", 200, "bf16", _F32) for f in ("BF16", "F16", "Q8_0", "Q6_K")]
        + [("tiny", f, "RTX4090", 200, "fp8", _F32) for f in ("Q8_0", "Q4_K")]
        + [("tiny-moe", "Q4_K", g, 200, "bf16", _F32) for g in ("H100", "RTX5090")]
        + [("tiny-qwen3.5", "Q8_0", "H100", 200, "bf16", _F32)]),
}

# (query heads, kv heads, head dim): Qwen3-8B, the tiny shape, 3 and 16 heads per kv head, head dims 32
# and 256 (Qwen3.5: the FMA decode on every cache)
ATTENTION_HEADS = [(32, 8, 128), (8, 2, 64), (9, 3, 64), (64, 4, 128), (16, 2, 32), (16, 4, 256)]
ATTENTION_GPUS = ("H100", "RTX5090", "RTX4090")
KV_TYPES = ("bf16", "q8_0", "fp8", "f32")


def render_prefill(cases) -> str:
    out = []
    for shape, fmt, gpu, T, kv, act in cases:
        cfg = SHAPES[shape]
        plan = prefill_plan(cfg, {"default": fmt}, GPUS[gpu], T, kv_type=kv, activations=act)
        out.append(f"# {shape} {fmt} on {gpu}: a chunk of {T} tokens, kv cache {kv}, activations {act}\n"
                   + format_plan(plan, cfg["num_hidden_layers"], layer_period(cfg)))
    return "\n".join(out)


def render_attention() -> str:
    out = []
    for gpu in ATTENTION_GPUS:
        for H, K, hd in ATTENTION_HEADS:
            for kv in KV_TYPES:
                for what, kw in (("decode m=1", dict(m=1)), ("decode m=4", dict(m=4)), ("prefill T=200", dict(T=200))):
                    try:
                        line = attention_plan(GPUS[gpu], H, K, hd, kv, **kw)[0].line()
                    except ValueError as e:  # a launch this GPU's shared memory cannot hold
                        line = f"refused: {e}"
                    out.append(f"{gpu} H={H} K={K} hd={hd} kv={kv} {what}: {line}")
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("name", sorted(PREFILL_CASES))
def test_prefill_plan_matches_the_golden_file(name):
    assert render_prefill(PREFILL_CASES[name]) == (DATA / name).read_text()


def test_attention_geometry_matches_the_golden_file():
    assert render_attention() == (DATA / "attention_plans.txt").read_text()


def test_a_prefill_chunk_is_the_runners_walk():
    """What the prefill plan holds: per dense layer the norm, the qkv GEMM, rope + KV write, the
    attention, the o GEMM (+x), the norm, gate|up, swiglu, down (+x), each GEMM after the kernel
    that prepares its x; the LM head is the decode matvec on the chunk's last row."""
    plan = prefill_plan(SHAPES["tiny"], {"default": "BF16"}, GPUS["H100"], 200)
    names = [L.name for L in plan]
    layer = ["rmsnorm", "split_bf16", "gemm_wgp", "qk_norm_rope_kv_write", "attn_prefill", "split_bf16", "gemm_wgp",
             "rmsnorm", "split_bf16", "gemm_wgp", "swiglu_rows", "split_bf16", "gemm_wgp"]
    assert names == ["dequant_rows"] + layer * SHAPES["tiny"]["num_hidden_layers"] + ["matvec"]
    assert plan[-1].grid[0] > 0 and "MV_M=1" in plan[-1].line()


def test_a_chunk_with_all_logits_ends_in_an_lm_head_gemm():
    """prefill_logits' chunks (all_logits): the same layers, then the final norm and the LM head as
    a GEMM over every row of the chunk, into logits the pass allocates (kernel_build.device_empty)."""
    cfg, T = SHAPES["tiny"], 200
    last = prefill_plan(cfg, {"default": "BF16"}, GPUS["H100"], T)
    every = prefill_plan(cfg, {"default": "BF16"}, GPUS["H100"], T, all_logits=True)
    assert [L.line() for L in every[:len(last) - 1]] == [L.line() for L in last[:-1]]
    assert [L.name for L in every[len(last) - 1:]] == ["rmsnorm", "split_bf16", "gemm_wgp"]
    head = every[-1]
    assert head.args[0] == "output.q" and head.args[5] == "all_logits" and head.args[6:8] == (str(T), str(cfg["vocab_size"]))


if __name__ == "__main__":
    for name, cases in PREFILL_CASES.items():
        (DATA / name).write_text(render_prefill(cases))
    (DATA / "attention_plans.txt").write_text(render_attention())
