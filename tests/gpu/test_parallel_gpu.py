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
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")  # as the engine sets them before any communicator (cuda_sharded.Comm;
    monkeypatch.setenv("NCCL_RUNTIME_CONNECT", "0")  # NCCL reads each once a process)
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


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_collective_kernels_equal_their_references(cp, rng, world):
    """collective.cu on one GPU (the kernels see only the gathered buffer): reduce_ranks is
    numpy_sharded.reduce_ranks (plus the residual, one rounding) bit for bit; vocab_gather puts
    each GPU's logits at its vocabulary range, an odd vocabulary included."""
    from bw24chat.backends.kernel_build import get_kernel
    from bw24chat.backends.kernel_refs import vocab_gather_ref
    from bw24chat.backends.numpy_sharded import reduce_ranks

    for rows, D in ((1, 4096), (3, 1031)):
        parts = [(rng.standard_normal((rows, D)) * 10.0 ** rng.integers(-3, 4)).astype(np.float32) for _ in range(world)]
        res = rng.standard_normal((rows, D)).astype(np.float32)
        g, n = cp.asarray(np.stack(parts)), rows * D
        for add in (0, 1):
            out = cp.asarray(res)
            get_kernel("collective", "reduce_ranks")((-(-n // 256),), (256,), (g, out, np.int32(world), np.int64(n),
                                                                              np.int32(add)))
            want = (res + reduce_ranks(parts)) if add else reduce_ranks(parts)
            assert np.array_equal(cp.asnumpy(out).view(np.uint32), want.view(np.uint32))
    for rows, V in ((1, 151936), (3, 49157), (2, 7)):
        vc = -(-V // world)
        g = rng.standard_normal(world * rows * vc).astype(np.float32)
        out = cp.full((rows, V + 5), cp.nan, cp.float32)  # rows V + 5 apart: the logits buffer's stride
        get_kernel("collective", "vocab_gather")((-(-(world * vc) // 256), rows), (256,),
                                                 (cp.asarray(g), out, np.int32(world), np.int32(rows), np.int32(vc),
                                                  np.int32(V), np.int64(V + 5)))
        assert np.array_equal(cp.asnumpy(out[:, :V]), vocab_gather_ref(g, world, rows, V))


def _bits(a, b) -> int:
    return int(np.count_nonzero(np.asarray(a, np.float32).view(np.uint32) != np.asarray(b, np.float32).view(np.uint32)))


@pytest.mark.parametrize("shape,fmt", [("tiny", "BF16"), ("tiny", "Q8_0"), ("tiny-qwen3.5", "BF16")])
def test_one_gpu_split_is_the_single_gpu_runner(cp, shape, fmt):
    """The runner over a world of one GPU (NCCL communicator of one rank, every exchange made:
    the embedding's, each layer's two, the logits' gather) gives the single-GPU runner's bits:
    prefill logits, greedy and seeded decode through the graphs, an 8-row step's logits, and a
    hybrid's rollback."""
    from bw24chat.api import SamplingParams
    from bw24chat.backends.cuda_runner import CudaRunner
    from bw24chat.backends.cuda_sharded import ShardedCudaRunner

    ck = synthetic_checkpoint(shape, fmt)
    prompt = np.random.default_rng(1).integers(0, ck.config["vocab_size"], 150)
    sp = SamplingParams(temperature=0.9, top_p=0.95, top_k=50)
    out = {}
    for name, make in (("one", lambda: CudaRunner(ck, 1024, "bf16", prefill_chunk=128)),
                       ("split", lambda: ShardedCudaRunner(ck, (0,), 1024, "bf16", prefill_chunk=128))):
        r = make()
        logits = r.prefill_logits(prompt, 0)
        toks = []
        for params, seed in ((SamplingParams(temperature=0), 0), (sp, 7)):
            t = r.prefill(prompt[:64], 0, params, seed)
            seq = [t]
            for i in range(24):
                seq += r.step([seq[-1]], 64 + i, params, seed, list(prompt[:64]) + seq[:-1])
            toks.append(seq)
        r.prefill(prompt[:100], 0)
        r.step([int(x) for x in prompt[100:108]], 100, SamplingParams(temperature=0), 0, [])
        step8 = r.last_logits()
        r.rollback(103)  # a verify that kept 3 of 8 rows; the next step continues from there
        r.step([int(x) for x in prompt[103:105]], 103, SamplingParams(temperature=0), 0, [])
        out[name] = (logits, toks, step8, r.last_logits())
        if hasattr(r, "close"):
            r.close()
        del r
        cp.get_default_memory_pool().free_all_blocks()
    (a, ta, sa, ra), (b, tb, sb, rb) = out["one"], out["split"]
    assert _bits(a, b) == 0 and ta == tb and _bits(sa, sb) == 0 and _bits(ra, rb) == 0


@pytest.mark.parametrize("shape", ["tiny", "tiny-qwen3.5"])
def test_two_gpus(cp, shape):
    """Over two GPUs (skipped on a host with one): deterministic run to run (the same bits twice),
    and against one GPU the reduction order differs, so the first divergent greedy position over
    8 prompts is reported, and the logits stay close to the one-GPU ones."""
    from bw24chat.api import SamplingParams
    from bw24chat.backends.cuda_runner import CudaRunner
    from bw24chat.backends.cuda_sharded import ShardedCudaRunner

    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("one GPU on this host")
    ck = synthetic_checkpoint(shape, "BF16")
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, ck.config["vocab_size"], int(rng.integers(20, 300))) for _ in range(8)]
    greedy = SamplingParams(temperature=0)

    def run(r):
        res = []
        for p in prompts:
            seq = [r.prefill(p, 0, greedy)]
            for i in range(32):
                seq += r.step([seq[-1]], len(p) + i, greedy, 0, [])
            res.append((seq, r.prefill_logits(p, 0)))
        return res

    two = ShardedCudaRunner(ck, (0, 1), 1024, "bf16", prefill_chunk=128)
    first, again = run(two), run(two)
    two.close()
    one = run(CudaRunner(ck, 1024, "bf16", prefill_chunk=128))
    assert all(s1 == s2 and _bits(l1, l2) == 0 for (s1, l1), (s2, l2) in zip(first, again))
    diverge = [next((i for i, (x, y) in enumerate(zip(s1, s2)) if x != y), None) for (s1, _), (s2, _) in zip(first, one)]
    rel = max(float(np.linalg.norm(l1 - l2) / np.linalg.norm(l2)) for (_, l1), (_, l2) in zip(first, one))
    print(f"{shape}: first divergent greedy position against one GPU per prompt {diverge}; prefill logits rel-L2 {rel:.2e}")
    assert rel < 1e-3
