"""The pieces of the engine over several GPUs that one GPU can check (docs/engine.md, Several
GPUs): an NCCL communicator of one rank from cupy.cuda.nccl (its all-reduce and all-gather give
back the input, bit for bit), and the partition plan's per-GPU bytes against what CudaLoader
actually uploads of each GPU's pieces (all uploaded to this one GPU here)."""
import numpy as np
import pytest

from bw24chat.backends.cuda_opset import CudaLoader
from bw24chat.backends.numpy_sharded import ShardedBackend
from bw24chat.models import build_model
from bw24chat.parallel import plan_for
from bw24chat.synthetic import synthetic_checkpoint


def test_nccl_world_of_one(cp, monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")  # as the engine sets it before any communicator
    try:
        from cupy.cuda import nccl

        comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    except Exception as exc:  # noqa: BLE001 - a CuPy without NCCL (pip install nvidia-nccl-cu12 / -cu13)
        pytest.skip(f"NCCL is not usable from CuPy: {type(exc).__name__}: {exc}")
    x = cp.asarray(np.random.default_rng(0).standard_normal(4099).astype(np.float32))
    out, gathered = cp.empty_like(x), cp.empty_like(x)
    stream = cp.cuda.Stream(non_blocking=True)
    comm.allReduce(x.data.ptr, out.data.ptr, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
    comm.allGather(x.data.ptr, gathered.data.ptr, x.size, nccl.NCCL_FLOAT32, stream.ptr)
    stream.synchronize()
    assert cp.array_equal(out, x) and cp.array_equal(gathered, x)
    comm.destroy()


def _uploaded(loader) -> int:
    """Bytes of the matrices a CudaLoader uploaded (its linears and expert images)."""
    return sum(w.nbytes for w in loader.linears) + sum(ex.nbytes for ex in loader.experts)


@pytest.mark.parametrize("shape,fmt,world", [("qwen3-8b-151k", "BF16", 2), ("qwen3-8b-151k", "Q4_K", 2),
                                             ("qwen3-30b-a3b", "Q4_K", 4), ("qwen3.5-9b", "BF16", 2)])
def test_plan_bytes_match_uploads(cp, shape, fmt, world):
    """Each GPU's pieces, uploaded: their bytes stand to the plan's count of them as the whole
    model's upload stands to its file bytes (the resident layouts' overhead, the same per byte)."""
    ck = synthetic_checkpoint(shape, fmt)
    matrices = {n: t for n, t in ck.tensors.items()  # what load_linear / load_experts take
                if len(t.shape) >= 2 and n != "tok_embd" and not n.endswith("ssm_conv1d")}
    whole = CudaLoader()
    build_model(ck, whole, 256)
    ratio = _uploaded(whole) / sum(t.nbytes for t in matrices.values())
    del whole
    plan = plan_for(ck, world)
    ranks = [CudaLoader() for _ in range(world)]
    build_model(ck, ShardedBackend(plan, ranks=ranks), 256)
    want = plan.weight_bytes(matrices)
    got = [_uploaded(r) for r in ranks]
    print(f"{shape} {fmt} x{world}: uploaded per GPU {[round(g / 2**30, 3) for g in got]} GiB, "
          f"plan {[round(w / 2**30, 3) for w in want]} GiB, whole-model ratio {ratio:.4f}")
    for g, w in zip(got, want):
        assert abs(g / w - ratio) < 2e-3 * ratio
    del ranks
    cp.get_default_memory_pool().free_all_blocks()
