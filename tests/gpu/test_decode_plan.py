"""The plan is what the runner launches: one decode step of a CudaRunner, recorded launch by
launch (kernel_build.LaunchCounter.record), equals decode_plan() for the same model on this GPU
(kernel, defines, grid, block, shared memory), for m = 1 and 4 rows."""
import numpy as np
import pytest


@pytest.mark.parametrize("fmt", ["BF16", "Q8_0", "NVFP4"])
@pytest.mark.parametrize("m", [1, 4])
def test_runner_launches_equal_the_plan(cp, fmt, m):
    from bw24chat.backends.cuda_runner import CudaRunner
    from bw24chat.backends.kernel_build import LaunchCounter
    from bw24chat.backends.plan import GpuProps, decode_plan
    from bw24chat.synthetic import SHAPES, synthetic_checkpoint

    ck = synthetic_checkpoint("tiny", fmt)
    r = CudaRunner(ck, 1024, "bf16")
    r.prefill(np.arange(16), 0)
    r.step(list(range(m)), 16, __import__("bw24chat.api", fromlist=["SamplingParams"]).SamplingParams(temperature=0), 0, [])
    LaunchCounter.record = []
    try:
        with r.stream:
            r._step_body(m)
        r.stream.synchronize()
        got = [(k.name, tuple(g), tuple(b), kw.get("shared_mem", 0)) for k, g, b, _, kw in LaunchCounter.record]
    finally:
        LaunchCounter.record = None
    plan = decode_plan(SHAPES["tiny"], {"default": fmt}, GpuProps.from_device(), m, n_ctx=1024)
    assert got == [(L.name, L.grid, L.block, L.smem) for L in plan]
