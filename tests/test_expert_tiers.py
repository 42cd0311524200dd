"""Expert residency without a GPU: the tier plan at made-up card sizes,
the slot-cache policies' invariants, the stats, the NumPy engine's simulated tiers, info's plan."""
import numpy as np
import pytest

from bw24chat.backends import expert_tiers as et
from bw24chat.backends.expert_cache import POLICIES, ExpertCache, hit_rate, synthetic_trace
from bw24chat.synthetic import SHAPES, synthetic_checkpoint

GiB = et.GiB
CARDS = {"24GB": 22 * GiB, "80GB": 78 * GiB, "141GB": 139 * GiB}  # free memory of each
# Qwen3-235B-A22B (Qwen/Qwen3-235B-A22B config.json)
SHAPE_235B = {**SHAPES["qwen3-30b-a3b"], "hidden_size": 4096, "num_hidden_layers": 94, "num_attention_heads": 64,
              "num_key_value_heads": 4, "moe_intermediate_size": 1536, "intermediate_size": 12288}


def _plan(shape, fmt, card, **kw):
    lay = et.layout_from_config(shape, fmt)
    kv = et.kv_cache_bytes(4096, shape["num_hidden_layers"], shape["num_key_value_heads"], shape["head_dim"])
    return lay, et.plan_tiers(lay, kv, CARDS[card], **kw)


def test_layout_from_config_equals_the_checkpoints():
    ck = synthetic_checkpoint("tiny-moe", "Q8_0")
    assert et.layout_from_config(SHAPES["tiny-moe"], "Q8_0") == et.layout_of(ck)
    assert et.layout_of(synthetic_checkpoint("tiny", "Q8_0")) is None


@pytest.mark.parametrize("fmt,card,resident", [("Q8_0", "24GB", False), ("Q8_0", "80GB", True), ("Q8_0", "141GB", True),
                                               ("NVFP4", "24GB", True), ("BF16", "24GB", False), ("BF16", "80GB", True)])
def test_qwen3_30b_a3b_plans(fmt, card, resident):
    lay, plan = _plan(SHAPES["qwen3-30b-a3b"], fmt, card, host_budget=64 * GiB)
    assert plan.all_resident == resident
    vram = sum(s * b for s, b in zip(plan.vram_slots, lay.expert_bytes))
    assert plan.fixed_bytes + vram <= CARDS[card]  # never over the budget
    if not resident:
        assert lay.top_k <= min(plan.vram_slots) < 128
        assert plan.host_experts == (128,) * 48 and not any(plan.disk_experts)  # 64 GiB holds them all


def test_vram_budget_forces_the_tiers_on_a_large_card():
    lay, plan = _plan(SHAPES["qwen3-30b-a3b"], "Q8_0", "141GB", vram_budget=12 * GiB, host_budget=8 * GiB)
    assert plan.vram_budget == 12 * GiB and 8 <= plan.vram_slots[0] < 128
    assert 0 < plan.host_experts[0] < 128 and plan.disk_experts[0] == 128 - plan.host_experts[0]
    _, none = _plan(SHAPES["qwen3-30b-a3b"], "Q8_0", "141GB", vram_budget=12 * GiB, host_budget=0)
    assert none.host_experts[0] == 0 and none.disk_experts[0] == 128


def test_235b_spills_to_disk_and_refuses_a_24gb_card_with_the_numbers():
    lay, plan = _plan(SHAPE_235B, "Q8_0", "141GB", host_budget=64 * GiB)
    assert not plan.all_resident and plan.disk_experts[0] > 0 and len(plan.vram_slots) == 94
    with pytest.raises(et.DoesNotFit, match=r"does not fit: VRAM budget 22.0 GiB < .* GiB needed .*other weights"):
        _plan(SHAPE_235B, "Q8_0", "24GB", host_budget=64 * GiB)


def test_speed_estimate_falls_with_the_tier_that_serves_misses():
    shape = SHAPES["qwen3-30b-a3b"]
    lay, resident = _plan(shape, "Q8_0", "80GB")
    _, host = _plan(shape, "Q8_0", "80GB", vram_budget=12 * GiB, host_budget=64 * GiB)
    _, disk = _plan(shape, "Q8_0", "80GB", vram_budget=12 * GiB, host_budget=0)
    r, h, d = (et.estimate_decode(lay, p) for p in (resident, host, disk))
    assert r.tokens_per_s > h.tokens_per_s > d.tokens_per_s > 0
    assert r.host_bytes == r.disk_bytes == 0 and h.disk_bytes == 0 and d.host_bytes == 0
    assert r.vram_bytes == pytest.approx(lay.other_read_bytes + lay.active_expert_bytes)
    assert any("tok/s" in line for line in et.describe_plan(lay, host))


@pytest.mark.parametrize("policy", POLICIES)
def test_policy_invariants(policy):
    trace = synthetic_trace(3, 32, 4, 300, seed=3)
    for slots in (4, 9, 31):
        cache, again = ExpertCache(3, 32, slots, policy), ExpertCache(3, 32, slots, policy)
        for step in trace:
            for li, ids in enumerate(step):
                h, m, ev = cache.on_route(li, ids)
                assert (h, m, ev) == again.on_route(li, ids)  # deterministic
                assert h + m == len(set(ids)) and ev <= m
                res = cache.resident(li)
                assert len(res) <= slots and len(set(res.values())) == len(res)  # capacity, one expert a slot
                assert set(ids) <= set(res)  # the step's experts are all in VRAM for its launch
                assert all(0 <= s < slots for s in res.values())
        assert cache.occupancy() == (3 * slots, 3 * slots)


def test_full_slots_never_miss_and_rates_are_fractions():
    trace = synthetic_trace(2, 16, 4, 100, seed=4)
    assert hit_rate(trace, 16, 16, "lru") == 1.0
    for p in POLICIES:
        assert 0 < hit_rate(trace, 16, 4, p) < 1
    with pytest.raises(ValueError):
        ExpertCache(2, 16, 4, "fifo")


def test_tiers_account_hits_bytes_and_occupancy():
    lay = et.MoELayout((8, 8), (1000, 1000), 2, 0, 0)
    plan = et.TierPlan((4, 4), (2, 2), (6, 6), 0, 0, 0)
    t = et.ExpertTiers(lay, plan, "lru")
    t.route(0, np.array([[0, 1]]), 1)  # warm: slots hold 0..3
    loads = t.route(1, np.array([[5, 6]]), 1)
    assert [e for e, _, _ in loads] == [5, 6]
    d = t.stats.as_dict()
    assert d["expert_hit_vram"] == 0.5 and d["expert_hit_host"] == 0 and d["expert_hit_disk"] == 0.5
    assert d["expert_bytes_per_token"] == 2000 and d["expert_cache_occupancy"] == 1.0


def test_numpy_engine_simulates_the_tiers_with_the_same_tokens(monkeypatch):
    from bw24chat.api import SamplingParams
    from bw24chat.backends.numpy_backend import NumpyBackend, numpy_runner
    from bw24chat.options import EngineOptions

    ck = synthetic_checkpoint("tiny-moe", "Q8_0")
    lay = et.layout_of(ck)
    # a card whose room past the fixed part holds 6 of the 16 experts per layer
    free = lay.other_bytes + et.HEADROOM_BYTES + et.kv_cache_bytes(64, 3, 2, 64) + 6 * sum(lay.expert_bytes)
    tiers = et.tiers_for(ck, EngineOptions(n_ctx=64, host_budget_gb=0.0), free)
    assert tiers is not None and tiers.plan.vram_slots == (6, 6, 6)
    greedy = SamplingParams(temperature=0.0)
    out = []
    for backend in (NumpyBackend(), NumpyBackend(tiers=tiers)):
        r = numpy_runner(ck, 64, backend)
        tok = r.prefill([5, 9, 33, 7], 0, greedy, 0, [])
        out.append([tok] + r.step([tok], 4, greedy, 0, [5, 9, 33, 7, tok]))
    assert out[0] == out[1]  # accounting only: the tokens do not change
    s = r.expert_stats()
    assert 0 < s["expert_hit_vram"] < 1 and s["expert_hit_host"] == 0 and s["expert_bytes_per_token"] > 0


def test_info_plans_the_tiers_at_a_budget():
    from bw24chat.info import describe, moe_tiers

    ck = synthetic_checkpoint("tiny-moe", "Q8_0")
    tiers = moe_tiers(ck, vram_budget_gb=2.05, host_budget_gb=0.0, n_ctx=256)
    assert tiers["fits"] and "decode" in tiers and tiers["lines"][0].startswith("experts:")
    assert describe(ck, tiers)["moe"]["tiers"] is tiers
    assert moe_tiers(ck, vram_budget_gb=1.0)["fits"] is False


@pytest.mark.parametrize("fmt,card,resident", [("Q8_0", "24GB", False), ("Q8_0", "80GB", True), ("Q4_K", "24GB", True)])
def test_hybrid_moe_35b_a3b_plans(fmt, card, resident):
    """The Qwen3.5 / 3.6 hybrid MoE shape: its DeltaNet layers count as other weights and their KV
    cache is only the attention layers' (one in four), 256 experts of 3 x 2048 x 512 per layer."""
    shape = SHAPES["qwen3.5-35b-a3b"]
    lay = et.layout_from_config(shape, fmt)
    assert lay.n_layers == 40 and max(lay.n_experts) == 256 and lay.top_k == 8
    experts = sum(lay.expert_bytes[i] * lay.n_experts[i] for i in range(lay.n_layers))
    per_value = {"Q8_0": 34 / 32, "Q4_K": 144 / 256}[fmt]
    assert experts == pytest.approx(40 * 256 * 3 * 2048 * 512 * per_value, rel=1e-6)  # 32.2 G values
    from bw24chat.models import get_family

    kv = et.model_kv_bytes(get_family("qwen3_5_moe").ModelArgs.from_dict(shape), 4096)
    assert kv == et.kv_cache_bytes(4096, 10, 2, 256)  # the 10 attention layers of 40
    plan = et.plan_tiers(lay, kv, CARDS[card], host_budget=64 * GiB)
    assert plan.all_resident == resident
    if not resident:
        assert lay.top_k <= min(plan.vram_slots) < 256
