"""bench --profile on tiny random-weight models.  The prefill chunk (bench.profile_prefill): the table
lists every item of the chunk's plan once, every group took time, and the groups' sum lies within the
instrumented walk (each launch's event pair, each host step's synchronized interval, all disjoint
inside the walk's first and last event); for spilled MoE experts the host steps are one row.  The
decode step of 1 and of m rows (bench.profile_decode): every launch of that step's plan in one
group, each group timed."""
import pytest


def _check(p, plan):
    rows = p["profile"]
    body = [r for r in rows if not r["kernel"].startswith("(")]
    assert sum(r["launches"] for r in body) == len(plan)
    assert all(r["us_per_chunk"] > 0 for r in body)
    assert sum(r["us_per_chunk"] for r in body) == pytest.approx(p["sum_us"])
    assert 0 < p["sum_us"] <= p["walk_us"]
    assert p["chunk_us"] > 0 and p["trace_us"] > 0
    total = next(r for r in rows if r["kernel"] == "(sum of groups)")
    assert total["us_per_chunk"] == p["sum_us"] and total["launches"] == len(plan)


@pytest.mark.parametrize("shape,fmt", [("tiny", "BF16"), ("tiny", "Q8_0"), ("tiny-qwen3.5", "Q8_0"), ("tiny-moe", "NVFP4")])
def test_the_prefill_profile_adds_up(cp, shape, fmt):
    from bw24chat import bench
    from bw24chat.backends.cuda_runner import CudaRunner
    from bw24chat.synthetic import synthetic_checkpoint

    r = CudaRunner(synthetic_checkpoint(shape, fmt), 1024, "bf16")
    p = bench.profile_prefill(r, cp, runs=5)
    plan, _ = r.prefill_plan(r.prefill_chunk, 0)
    assert p["tokens"] == r.prefill_chunk and p["host_steps"] == 0
    _check(p, plan)


def test_spilled_experts_are_host_rows(cp):
    from bw24chat import bench
    from bw24chat.backends.cuda_runner import CudaRunner
    from bw24chat.backends.expert_tiers import ExpertTiers, fixed_plan, layout_of
    from bw24chat.synthetic import synthetic_checkpoint

    ck = synthetic_checkpoint("tiny-moe", "Q8_0")
    lay = layout_of(ck)
    tiers = ExpertTiers(lay, fixed_plan(lay, 2 * lay.top_k, max(lay.n_experts) // 2))
    r = CudaRunner(ck, 1024, "bf16", tiers=tiers)
    p = bench.profile_prefill(r, cp, runs=5)
    plan, _ = r.prefill_plan(r.prefill_chunk, 0)
    _check(p, plan)
    host = [row for row in p["profile"] if row["kernel"].startswith("host: ")]
    assert len(host) == 1 and host[0]["launches"] == p["host_steps"] == ck.config["num_hidden_layers"]


@pytest.mark.parametrize("rows", [1, 5])
def test_the_decode_profile_covers_the_step_of_its_rows(cp, rows):
    from bw24chat import bench
    from bw24chat.backends.cuda_runner import CudaRunner
    from bw24chat.synthetic import synthetic_checkpoint

    r = CudaRunner(synthetic_checkpoint("tiny", "Q8_0"), 1024, "bf16")
    table = bench.profile_decode(r, cp, 64, reps=3, inner=2, rows=rows)
    body = [t for t in table if not t["kernel"].startswith("(")]
    assert sum(t["launches"] for t in body) == len(r.plan(rows))
    assert all(t["us_per_step"] > 0 for t in body)
    whole = next(t for t in table if t["kernel"] == "(whole step graph)")
    assert whole["us_per_step"] > 0
    with pytest.raises(ValueError, match="one pass"):
        bench.profile_decode(r, cp, 64, rows=r.max_rows + 1)
