"""The NumPy reference of the tensor-parallel pass (backends/numpy_sharded.py) on tiny models of
every family: one GPU's plan is the NumPy backend bit for bit; 2 and 4 GPUs give the same bits
run to run and the one-GPU logits to float32 rounding, and their greedy tokens part from one
GPU's only at a near-tie (the first divergent position is printed per prompt, not demanded
equal: the GPUs' partial sums round differently)."""
import numpy as np
import pytest

from bw24chat.api import SamplingParams
from bw24chat.backends.numpy_backend import numpy_runner
from bw24chat.backends.numpy_sharded import reduce_ranks, sharded_runner
from bw24chat.loaders import load_checkpoint
from bw24chat.parallel import PartitionError
from tests.hybrid_factory import make_hybrid_dir
from tests.model_factory import make_hf_dir

PROMPTS = [[5, 17, 200, 33, 9, 101, 64, 2, 250, 77, 12], [1, 2, 3, 4, 5, 6], [240, 13, 99, 180, 42, 7, 7, 7, 150]]
GREEDY = SamplingParams(temperature=0)

# (family, overrides): every family, with the switches that change the split: biases, tied
# embeddings, KV heads fewer than GPUs, the full-width QK-norm, shared experts, DeltaNet head orders
MODELS = {
    "llama-tied": ("llama", dict(tied=True)),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", dict(num_key_value_heads=4)),
    "qwen3_moe": ("qwen3_moe", {}),
    "glm4_moe": ("glm4_moe", {}),
    "minimax_m2": ("minimax_m2", {}),
    "qwen3_5": ("qwen3_5", dict(linear_num_key_heads=4, linear_num_value_heads=8)),
    "qwen3_5_moe": ("qwen3_5_moe", {}),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    for key, (fam, kw) in MODELS.items():
        root = tmp_path_factory.mktemp(key)
        kw = dict(kw)
        if fam.startswith("qwen3_5"):
            d, _ = make_hybrid_dir(root, fam, **kw)
        else:
            d, _ = make_hf_dir(root, fam, "F32", tied=kw.pop("tied", False), **kw)
        out[key] = load_checkpoint(d)
    return out


def _logits(runner, ids):
    """Prefill logits of every position, then three decode steps' logits."""
    pre = runner.prefill_logits(np.asarray(ids), 0, chunk=5)
    steps = [runner.forward([t], len(ids) + i)[0] for i, t in enumerate([3, 141, 59])]
    return np.concatenate([pre, np.stack(steps)])


def _greedy(runner, ids, n=10):
    """n greedy tokens after the prompt, and the logits each was drawn from."""
    tok = runner.prefill(np.asarray(ids), 0, GREEDY)
    toks, logits = [tok], [runner.last_logits()[-1].copy()]
    for i in range(n - 1):
        tok = runner.step([tok], len(ids) + i, GREEDY, 0, [*ids, *toks])[0]
        toks.append(tok)
        logits.append(runner.last_logits()[-1].copy())
    return toks, logits


def test_reduce_ranks_order():
    """Rank order, each addition rounded: ((a + b) + c), not a + (b + c)."""
    a, b, c = np.float32([1e8]), np.float32([-1e8]), np.float32([1.0])
    assert reduce_ranks([a, b, c])[0] == 1.0 and (a + (b + c))[0] == 0.0
    assert reduce_ranks([c]) is c


@pytest.mark.parametrize("key", sorted(MODELS))
def test_one_gpu_is_the_numpy_backend(checkpoints, key):
    ck = checkpoints[key]
    for ids in PROMPTS[:2]:
        np.testing.assert_array_equal(_logits(sharded_runner(ck, 1), ids), _logits(numpy_runner(ck), ids))


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("key", sorted(MODELS))
def test_several_gpus(checkpoints, key, world):
    ck = checkpoints[key]
    try:
        runner = sharded_runner(ck, world)
    except PartitionError as exc:  # minimax_m2: 2 KV heads and a QK-norm over all of them; the hybrids' 2 key heads
        assert key in ("minimax_m2", "qwen3_5_moe") and world == 4, exc
        return
    ref = numpy_runner(ck)
    for ids in PROMPTS[:2]:
        got = _logits(runner, ids)
        np.testing.assert_array_equal(got, _logits(sharded_runner(ck, world), ids))  # run to run: the same bits
        want = _logits(ref, ids)
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        print(f"{key} x{world}: logits rel L2 vs one GPU {rel:.2e}")
        assert rel < 1e-5
    for p, ids in enumerate(PROMPTS):
        toks, _ = _greedy(sharded_runner(ck, world), ids)
        ref_toks, ref_logits = _greedy(numpy_runner(ck), ids)
        first = next((i for i, (a, b) in enumerate(zip(toks, ref_toks)) if a != b), None)
        print(f"{key} x{world} prompt {p}: first divergent position "
              f"{'none' if first is None else len(ids) + first} of {len(ids) + len(toks)}")
        if first is not None:  # only at a near-tie of the one-GPU logits
            top2 = np.sort(ref_logits[first])[-2:]
            assert top2[1] - top2[0] < 1e-4 * np.abs(ref_logits[first]).max(), (key, world, p, first)


def test_rollback_restores_every_gpu(checkpoints):
    """A hybrid model's rollback (the recurrent state of every GPU) replays to the same logits."""
    ck = checkpoints["qwen3_5"]
    r = sharded_runner(ck, 2)
    ids = PROMPTS[0]
    r.prefill(np.asarray(ids), 0)
    r.step([7, 8, 9], len(ids), GREEDY, 0, list(ids))
    after7, after8 = r.last_logits()[0].copy(), r.last_logits()[1].copy()
    r.rollback(len(ids) + 1)  # into the step: each GPU's snapshot
    r.step([8], len(ids) + 1, GREEDY, 0, [*ids, 7])
    np.testing.assert_array_equal(r.last_logits()[0], after8)
    r.prefill(np.asarray([4, 4]), len(ids) + 2)
    r.rollback(len(ids))  # before the step: each GPU's state recomputed from the ids
    r.step([7], len(ids), GREEDY, 0, list(ids))
    np.testing.assert_array_equal(r.last_logits()[0], after7)
