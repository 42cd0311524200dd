"""MoE experts spilled from VRAM (backends/cuda_tiers.py): the same bits as the all-resident run,
whatever tier served each expert.  Tiny MoE models with a few VRAM slots per layer, part of the
experts in pinned host RAM and the rest built from the checkpoint's tensors (the file tier):
prefill logits (experts streamed through the staging slots), greedy and seeded decode in graph
and eager mode, multi-row steps (passes of slots // top_k rows), and the tiers' accounting."""
import numpy as np
import pytest

from bw24chat.api import SamplingParams


def _runs(cp, ck, tiers, prompt, use_graph=True):
    from bw24chat.backends.cuda_runner import CudaRunner

    r = CudaRunner(ck, 1024, "bf16", prefill_chunk=256, use_graph=use_graph, tiers=tiers)
    out = {"prefill": r.prefill_logits(prompt, 0)}
    for name, sp, seed in (("greedy", SamplingParams(temperature=0), 0),
                           ("seeded", SamplingParams(temperature=0.9, top_p=0.95, top_k=40), 5)):
        hist = [int(t) for t in prompt[:40]]
        tok = r.prefill(prompt[:40], 0, sp, seed)
        toks = [tok]
        for _ in range(24):
            tok = r.step([tok], len(hist), sp, seed, hist)[0]
            hist.append(toks[-1])
            toks.append(tok)
        out[name] = toks
    r.prefill(prompt[:50], 0)
    r.step([int(t) for t in prompt[50:59]], 50, SamplingParams(temperature=0), 0, [])  # 9 rows
    out["rows"] = r.last_logits()
    out["stats"] = r.expert_stats()
    out["max_rows"] = r.max_rows
    return out


@pytest.mark.parametrize("shape,fmt", [("tiny-moe", "BF16"), ("tiny-moe", "Q8_0"), ("tiny-moe", "NVFP4"), ("tiny-moe", "Q4_K"),
                                       ("tiny-moe", "MXFP4")])
@pytest.mark.parametrize("use_graph", [True, False])
def test_spilled_experts_give_the_resident_bits(cp, shape, fmt, use_graph):
    from bw24chat.backends.expert_tiers import ExpertTiers, fixed_plan, layout_of
    from bw24chat.synthetic import synthetic_checkpoint

    ck = synthetic_checkpoint(shape, fmt)
    lay = layout_of(ck)
    E, k = max(lay.n_experts), lay.top_k
    prompt = np.random.default_rng(3).integers(0, ck.config["vocab_size"], 300)
    want = _runs(cp, ck, None, prompt, use_graph)
    tiers = ExpertTiers(lay, fixed_plan(lay, 2 * k, E // 2))  # 8 slots of 16, experts 0..7 on the host
    got = _runs(cp, ck, tiers, prompt, use_graph)
    assert got["max_rows"] == 2 and want["max_rows"] == 8
    assert np.array_equal(got["prefill"].view(np.uint32), want["prefill"].view(np.uint32))
    assert got["greedy"] == want["greedy"]
    assert got["seeded"] == want["seeded"]
    assert np.array_equal(got["rows"].view(np.uint32), want["rows"].view(np.uint32))
    st = got["stats"]
    assert st["expert_hit_disk"] > 0 and st["expert_bytes_per_token"] > 0  # the file tier (kernels/repack.cu) served
    if fmt in ("BF16", "Q8_0", "NVFP4"):  # these models' routing brings evicted host-tier experts back
        assert st["expert_hit_host"] > 0
    assert st["expert_prefill_bytes"] > 0
    assert abs(st["expert_hit_vram"] + st["expert_hit_host"] + st["expert_hit_disk"] - 1) < 1e-3


def test_tier_lookups_match_the_router(cp):
    """Every decode lookup the tiers count is a distinct expert the router chose in that pass."""
    from bw24chat.backends.cuda_runner import CudaRunner
    from bw24chat.backends.expert_tiers import ExpertTiers, fixed_plan, layout_of
    from bw24chat.synthetic import synthetic_checkpoint

    ck = synthetic_checkpoint("tiny-moe", "BF16")
    lay = layout_of(ck)
    k = lay.top_k
    tiers = ExpertTiers(lay, fixed_plan(lay, k, 0))  # one token's experts: every miss from the file tier
    r = CudaRunner(ck, 512, "bf16", tiers=tiers)
    r.prefill(np.arange(8), 0)
    s0 = tiers.stats.vram_hits + tiers.stats.disk_hits
    for i in range(10):
        r.step([i + 1], 8 + i, SamplingParams(temperature=0), 0, [])
    n_moe = lay.n_layers
    assert tiers.stats.vram_hits + tiers.stats.disk_hits - s0 == 10 * n_moe * k
    assert tiers.stats.host_hits == 0 and tiers.stats.disk_hits > 0
    assert tiers.stats.tokens == 10
