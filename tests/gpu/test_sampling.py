"""sampling.cu against bw24chat/sampling.py: raw Philox outputs, argmax, and the same token as
sample_token over many random logits / params / seeds / positions / histories."""
import numpy as np
import pytest

from bw24chat.api import SamplingParams
from bw24chat.backends import cuda_ops as ops
from bw24chat.sampling import sample_token


def test_philox_raw_matches_numpy(cp, rng):
    n = 257
    keys = rng.integers(0, 2**64, (n, 2), dtype=np.uint64)
    keys[:5, 1] = 0
    pos = rng.integers(0, 2**62, n, dtype=np.uint64)
    pos[:3] = np.array([0, 1, 2**64 - 1], np.uint64)  # 2^64-1: the counter increment carries
    out = cp.zeros(n, cp.uint64)
    ops.philox_raw(cp.asarray(keys), cp.asarray(pos), out)
    ref = [int(np.random.Philox(key=keys[i], counter=np.array([pos[i], 0, 0, 0], np.uint64)).random_raw()) for i in range(n)]
    assert [int(x) for x in out.get()] == ref


@pytest.mark.parametrize("V", [1, 1000, 49152, 151936])
def test_argmax_first_index(cp, rng, V):
    x = rng.standard_normal(V).astype(np.float32)
    if V > 10:
        x[[V // 3, V // 2, V - 1]] = x.max() + 1.0  # ties: the first wins
    out = cp.full(1, -7, cp.int32)
    ops.argmax(cp.asarray(x), out)
    assert int(out.get()[0]) == int(np.argmax(x))


def _random_params(rng):
    return SamplingParams(
        temperature=float(rng.choice([0.0, 0.3, 0.7, 1.0, 1.5])),
        top_k=int(rng.choice([0, 0, 1, 5, 40, 1000])),
        top_p=float(rng.choice([1.0, 1.0, 0.95, 0.9, 0.5, 1e-6])),
        min_p=float(rng.choice([0.0, 0.0, 0.05, 0.2])),
        repeat_penalty=float(rng.choice([1.0, 1.1, 1.5])),
        repeat_last_n=int(rng.choice([0, 16, 64])),
    )


def _logits(rng, V):
    kind = rng.integers(0, 3)
    x = rng.standard_normal(V) * rng.uniform(0.5, 8.0)
    if kind == 1:
        x = np.round(x, 1)  # many ties: order by id
    elif kind == 2:
        x[rng.integers(0, V, 5)] += 15.0  # a peaked distribution
    return x.astype(np.float32)


@pytest.mark.parametrize("V", [1000, 49152, 151936])
def test_sample_matches_reference(cp, rng, V):
    ring_cap = 128
    ws = cp.zeros(ops.sample_workspace_bytes(V), cp.uint8)
    out = cp.full(1, -1, cp.int32)
    ring = cp.full(ring_cap, -1, cp.int32)
    n_cases = 120 if V < 100000 else 60
    mismatches = []
    for case in range(n_cases):
        p = _random_params(rng)
        logits = _logits(rng, V)
        hist = rng.integers(0, V, int(rng.integers(0, 100))).tolist()
        if hist and case % 3 == 0:
            hist[-5:] = [int(np.argmax(logits))] * min(5, len(hist))  # penalize the top token
        seed = int(rng.integers(0, 2**63))
        pos = int(rng.integers(0, 2**31 - 1))
        ring_host = np.full(ring_cap, -1, np.int32)
        for n, t in enumerate(hist):
            ring_host[n % ring_cap] = t
        ring.set(ring_host)
        params = cp.asarray(ops.pack_sampling_params(p, seed, hist_len=len(hist)))
        out.fill(-1)
        ops.sample(cp.asarray(logits), params, out, ring, cp.asarray(np.array([pos], np.int32)), ws)
        want = sample_token(logits, p, seed, pos, hist)
        got = int(out.get()[0])
        if got != want:
            mismatches.append((case, p, seed, pos, got, want))
    assert not mismatches, mismatches[:3]


def test_sample_pushes_to_ring(cp, rng):
    V, cap = 5000, 16
    logits = _logits(rng, V)
    p = SamplingParams(temperature=0.8, top_k=50, repeat_penalty=1.2, repeat_last_n=8)
    hist = rng.integers(0, V, 20).tolist()
    ring_host = np.full(cap, -1, np.int32)
    for n, t in enumerate(hist):
        ring_host[n % cap] = t
    ring = cp.asarray(ring_host)
    params = cp.asarray(ops.pack_sampling_params(p, 99, hist_len=len(hist), push=True))
    out = cp.full(1, -1, cp.int32)
    ws = cp.zeros(ops.sample_workspace_bytes(V), cp.uint8)
    ops.sample(cp.asarray(logits), params, out, ring, cp.asarray(np.array([7], np.int32)), ws)
    tok = int(out.get()[0])
    assert tok == sample_token(logits, p, 99, 7, hist)
    assert int(params.get()[8]) == len(hist) + 1
    assert int(ring.get()[len(hist) % cap]) == tok
