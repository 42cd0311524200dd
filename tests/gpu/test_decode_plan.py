"""The plan is what the runner launches: a CudaRunner's decode plan (runner.plan: the launches
its steps walk) equals decode_plan() for the same model on this GPU (kernel, defines, grid,
block, shared memory), for m = 1 and 4 rows, and its prefill chunk's plan (runner.prefill_plan)
equals prefill_plan(); and the eager walk launches exactly the plan."""
import numpy as np
import pytest


@pytest.mark.parametrize("fmt", ["BF16", "Q8_0", "NVFP4"])
@pytest.mark.parametrize("m", [1, 4])
def test_runner_plan_equals_the_plan(cp, fmt, m):
    from bw24chat.api import SamplingParams
    from bw24chat.backends.cuda_runner import CudaRunner
    from bw24chat.backends.kernel_build import LaunchCounter
    from bw24chat.backends.plan import GpuProps, decode_plan
    from bw24chat.synthetic import SHAPES, synthetic_checkpoint

    ck = synthetic_checkpoint("tiny", fmt)
    r = CudaRunner(ck, 1024, "bf16", use_graph=False)
    r.prefill(np.arange(16), 0)
    before = LaunchCounter.count
    r.step(list(range(m)), 16, SamplingParams(temperature=0), 0, [])
    got = [L.key() for L in r.plan(m)]
    assert LaunchCounter.count - before == len(got)  # the eager step launched the plan, nothing else
    plan = decode_plan(SHAPES["tiny"], {"default": fmt}, GpuProps.from_device(), m, n_ctx=1024)
    assert got == [L.key() for L in plan]


@pytest.mark.parametrize("shape,fmt", [("tiny", "BF16"), ("tiny", "Q8_0"), ("tiny", "Q4_K"), ("tiny", "NVFP4"),
                                       ("tiny-moe", "Q8_0"), ("tiny-moe", "BF16")])
def test_runner_prefill_plan_equals_the_plan(cp, shape, fmt):
    """A chunk off the GEMM tiles (200 tokens) after an earlier one: the runner's traced prefill
    equals prefill_plan() for this GPU, the grouped MoE GEMMs included."""
    from bw24chat.backends.cuda_runner import CudaRunner
    from bw24chat.backends.plan import GpuProps, prefill_plan
    from bw24chat.synthetic import SHAPES, synthetic_checkpoint

    r = CudaRunner(synthetic_checkpoint(shape, fmt), 1024, "bf16", prefill_chunk=256)
    r.prefill(np.arange(16), 0)
    got, _ = r.prefill_plan(200, 16)
    plan = prefill_plan(SHAPES[shape], {"default": fmt}, GpuProps.from_device(), 200, 16, n_ctx=1024)
    assert [L.key() for L in got] == [L.key() for L in plan]


@pytest.mark.parametrize("shape,fmt", [("tiny", "Q8_0"), ("tiny", "NVFP4"), ("tiny-moe", "BF16")])
def test_prefill_chunk_walks_its_plan(cp, shape, fmt):
    """A prefill chunk is a walk over its traced plan: the chunk launches the plan's kernels and
    nothing else (resident MoE experts too: grouped on the device), and two chunks of the same
    ids give the same logits bit for bit.  (A spilled layer's experts are a host step of the
    plan: tests/gpu/test_moe_tiers.py checks their prefill bits.)"""
    from bw24chat.backends.cuda_runner import CudaRunner
    from bw24chat.backends.kernel_build import HostStep, KernelLaunch, LaunchCounter
    from bw24chat.synthetic import synthetic_checkpoint

    r = CudaRunner(synthetic_checkpoint(shape, fmt), 1024, "bf16", prefill_chunk=256)
    ids = np.random.default_rng(0).integers(0, r.vocab_size, 200)
    a = r.prefill_logits(ids, 0)
    plan, _ = r.prefill_plan(200, 0, True)
    kernels = sum(isinstance(x, KernelLaunch) for x in plan)
    hosts = sum(isinstance(x, HostStep) for x in plan)
    assert hosts == 0 and kernels > 0
    before = LaunchCounter.count
    b = r.prefill_logits(ids, 0)
    assert LaunchCounter.count - before == kernels
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
