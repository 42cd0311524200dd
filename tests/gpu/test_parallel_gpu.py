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


@pytest.mark.parametrize("shape,fmt", [("tiny", "BF16"), ("tiny", "Q8_0"), ("tiny-qwen3.5", "BF16"), ("tiny-moe", "Q8_0"),
                                       ("tiny-glm4-moe", "BF16"), ("tiny-qwen3.5-moe", "NVFP4"), ("tiny-minimax-m2", "BF16")])
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


@pytest.mark.parametrize("shape", ["tiny", "tiny-qwen3.5", "tiny-moe", "tiny-glm4-moe", "tiny-minimax-m2"])
def test_two_gpus(cp, shape):
    """Over two GPUs (skipped on a host with one): check.split_gates, deterministic run to run (the
    same bits twice), and against one GPU the first divergent greedy position over 8 prompts
    reported, the prefill logits within split_gates' bound of the one-GPU ones."""
    from bw24chat.check import split_gates

    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("one GPU on this host")
    res = split_gates(synthetic_checkpoint(shape, "BF16"), (0, 1), shape)
    print("\n".join(f"{r.name}: {r.value}" for r in res))
    assert all(r.ok for r in res)


@pytest.mark.parametrize("shape", ["tiny-moe", "tiny-minimax-m2"])
def test_split_gates_on_a_world_of_one(cp, shape):
    """check.split_gates over a world of one GPU: the same bits run to run and no divergence from
    the single-GPU runner in 8 prompts x 32 greedy tokens."""
    from bw24chat.check import split_gates

    res = split_gates(synthetic_checkpoint(shape, "Q8_0"), (0,), shape)
    assert all(r.ok for r in res), [(r.name, r.value) for r in res]


class CopyComm:
    """A stand-in for cuda_sharded.Comm with every rank on one GPU (NCCL takes one rank a device):
    each group's all-gathers done as copies once the group closes, the device synchronized around
    them (eager passes only: nothing here is captured)."""

    def __init__(self, world: int):
        from types import SimpleNamespace

        self.nccl = SimpleNamespace(NCCL_FLOAT32=None)
        self.comms = [SimpleNamespace(allGather=lambda send, recv, n, dt, stream, r=r: self._calls.append((r, send, recv, n)))
                      for r in range(world)]
        self._calls: list = []

    def group(self):
        import contextlib

        import cupy as cp

        @contextlib.contextmanager
        def run():
            self._calls = []
            yield
            rt = cp.cuda.runtime
            rt.deviceSynchronize()
            for _, _, recv, n in self._calls:
                for q, send, _, _ in self._calls:
                    rt.memcpy(recv + 4 * n * q, send, 4 * n, rt.memcpyDeviceToDevice)
            rt.deviceSynchronize()

        return run()

    def close(self) -> None:
        pass


@pytest.mark.parametrize("shape,fmt", [("tiny", "BF16"), ("tiny-moe", "BF16"), ("tiny-moe", "Q8_0"),
                                       ("tiny-glm4-moe", "BF16"), ("tiny-qwen3.5-moe", "BF16"), ("tiny-minimax-m2", "BF16")])
def test_two_ranks_on_one_gpu(cp, monkeypatch, shape, fmt):
    """A model split in two, both halves on this GPU (CopyComm in place of NCCL, eager passes):
    each rank's heads, MLP columns and expert range (the experts of the other rank skipped, the
    partial sums all-reduced) against the NumPy reference split the same way (numpy_sharded.py):
    the same greedy tokens, prefill logits within 1e-3; and an 8-row step = 8 one-row steps, bit
    for bit."""
    from bw24chat.api import SamplingParams
    from bw24chat.backends import cuda_linear
    from bw24chat.backends.cuda_sharded import ShardedCudaRunner
    from bw24chat.backends.kernel_refs import act_q8
    from bw24chat.backends.numpy_sharded import sharded_runner

    scratch = cuda_linear._scratch_u16  # keyed per device: the two ranks' streams would share it in flight
    monkeypatch.setattr(cuda_linear, "_scratch_u16",
                        lambda name, n: scratch(f"{name}@{cp.cuda.get_current_stream().ptr}", n))
    ck = synthetic_checkpoint(shape, fmt)
    ref = sharded_runner(ck, 2, 512, act_quant=act_q8(fmt))
    r = ShardedCudaRunner(ck, (0, 0), 512, "f32", prefill_chunk=128, use_graph=False, comm=CopyComm(2))
    prompt = list(range(100, 140))
    greedy = SamplingParams(temperature=0)
    toks = {}
    for name, run in (("cuda", r), ("numpy", ref)):
        tok, seq = run.prefill(prompt, 0, greedy), []
        for i in range(16):
            seq.append(tok)
            tok = run.step([tok], len(prompt) + i, greedy, 0, [])[0]
        toks[name] = seq
    assert toks["cuda"] == toks["numpy"]
    got, want = r.prefill_logits(np.array(prompt), 0), ref.prefill_logits(np.array(prompt), 0)
    assert float(np.linalg.norm(got - want) / np.linalg.norm(want)) <= 1e-3
    rows = list(range(200, 208))
    r.prefill(prompt, 0)
    single = []
    for i, t in enumerate(rows):
        r.step([t], len(prompt) + i, greedy, 0, [])
        single.append(r.last_logits()[0])
    r.prefill(prompt, 0)
    r.step(rows, len(prompt), greedy, 0, [])
    assert _bits(r.last_logits(), np.stack(single)) == 0
    r.close()
