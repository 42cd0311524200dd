"""bench --profile's grouping (bench.profile_groups / profile_rows) over a prefill chunk's plan traced
without a GPU (backends/plan.py): every launch of the plan lands in exactly one group and one row of
the table, a group holds launches of one role only, and host steps (spilled experts) are rows of
their own, one for all layers."""
import pytest

from bw24chat import bench
from bw24chat.backends.kernel_build import HostStep
from bw24chat.backends.plan import GPUS, prefill_plan
from bw24chat.synthetic import SHAPES

pytestmark = pytest.mark.kernels  # the plan reads register counts from ptxas (NVRTC: the [kernels] extra)


def _table(groups: dict) -> list[dict]:
    # each group's time: its launch count (microseconds), so the sums are checkable
    return bench.profile_rows(groups, {k: float(len(v)) for k, v in groups.items()}, "chunk", [("(chunk)", 1e9)])


@pytest.mark.parametrize("shape,fmt", [("qwen3.5-9b", "Q8_0"), ("qwen3-30b-a3b", "Q8_0"), ("tiny-qwen3.5", "BF16"),
                                       ("tiny-moe", "Q4_K"), ("tiny", "NVFP4")])
def test_the_profile_lists_every_launch_of_a_prefill_chunk_once(shape, fmt):
    plan = prefill_plan(SHAPES[shape], {"default": fmt}, GPUS["H100"], 512)
    groups = bench.profile_groups(plan)
    listed = [id(L) for ls in groups.values() for L in ls]
    assert len(listed) == len(plan) and set(listed) == {id(L) for L in plan}
    assert all(L.key() == key for key, ls in groups.items() for L in ls)
    assert len(groups) < len(plan)  # the layers' launches share their roles
    rows = _table(groups)
    body, total = rows[:len(groups)], rows[len(groups)]
    assert sum(r["launches"] for r in body) == len(plan) == total["launches"]
    assert total["kernel"] == "(sum of groups)" and total["us_per_chunk"] == len(plan)
    assert [r["us_per_chunk"] for r in body] == sorted((r["us_per_chunk"] for r in body), reverse=True)
    assert all(r["us_per_launch"] == 1.0 for r in body)
    names = {L.name for L in plan}
    assert all(r["kernel"].split()[0] in names and r["grid"] for r in body)


def test_host_steps_are_one_row_for_all_layers():
    cfg = SHAPES["tiny-moe"]
    plan = list(prefill_plan(cfg, {"default": "Q8_0"}, GPUS["H100"], 200))
    combine = [i for i, L in enumerate(plan) if L.name == "moe_combine"]
    for layer, i in reversed(list(enumerate(combine))):  # where a spilled layer's experts run: the host
        plan.insert(i, HostStep(lambda stream: None, f"experts of MoE layer {layer}"))
    groups = bench.profile_groups(plan)
    host = [k for k in groups if k[0] == "host"]
    assert host == [("host", "experts of MoE layer N")]
    assert len(groups[host[0]]) == len(combine) == cfg["num_hidden_layers"]
    rows = _table(groups)
    row = next(r for r in rows if r["kernel"] == "host: experts of MoE layer N")
    assert row["launches"] == len(combine) and row["grid"] == []
    assert sum(r["launches"] for r in rows[:len(groups)]) == len(plan)
