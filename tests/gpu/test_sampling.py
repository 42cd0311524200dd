"""sampling.cu against bw24chat/sampling.py: raw Philox outputs, argmax, and the same token as
sample_token over many random logits / params / seeds / positions / histories, one row per
launch and many rows in one launch."""
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


@pytest.mark.parametrize("R", [1, 2, 3, 8, 9, 32])
@pytest.mark.parametrize("V", [1000, 49152, 151936])
def test_rows_in_one_launch_equal_one_row_launches(cp, rng, V, R):
    """R rows in one launch (rows strided in a step image as the decode step and the batched pass
    lay them out: cuda_runner.sampler_rows), each with its own params, seed, position, ring and
    push flag: every row's token equals a launch of that row alone and sample_token, every pushing
    row's ring and fill advance; three rounds over the same workspace (its states left zeroed,
    a slot's rows alternating between its two)."""
    from bw24chat.backends.cuda_runner import _ROW_BYTES, RING, sampler_rows

    img = cp.zeros(R * _ROW_BYTES, cp.uint8)
    params, rings = sampler_rows(img, R, _ROW_BYTES)
    ws = cp.zeros(ops.sample_workspace_bytes(V, R), cp.uint8)
    ws1 = cp.zeros(ops.sample_workspace_bytes(V), cp.uint8)
    out, out1 = cp.full(R, -1, cp.int32), cp.full(1, -1, cp.int32)
    for _ in range(3):
        logits = np.stack([_logits(rng, V) for _ in range(R)])
        cases = []
        for r in range(R):
            p = _random_params(rng)
            hist = rng.integers(0, V, int(rng.integers(0, 300))).tolist()
            if hist and r % 3 == 0:
                hist[-5:] = [int(np.argmax(logits[r]))] * min(5, len(hist))  # penalize the top token
            ring_host = np.full(RING, -1, np.int32)
            for n, t in enumerate(hist):
                ring_host[n % RING] = t
            seed, push = int(rng.integers(0, 2**63)), bool(rng.integers(0, 2))
            cases.append((p, seed, int(rng.integers(0, 2**31 - 1)), hist, ring_host, push))
            params[r] = cp.asarray(ops.pack_sampling_params(p, seed, hist_len=len(hist), push=push))
            rings[r] = cp.asarray(ring_host)
        pos = np.array([c[2] for c in cases], np.int32)
        d_logits = cp.asarray(logits)
        # each row alone first (its own params / ring copies: a push rewrites them)
        alone = []
        for r, (p, seed, position, hist, ring_host, push) in enumerate(cases):
            pr = params[r].copy()
            ops.sample(d_logits[r], pr, out1, cp.asarray(ring_host), cp.asarray(pos[r:r + 1]), ws1)
            alone.append(int(out1.get()[0]))
        out.fill(-1)
        ops.sample(d_logits, params, out, rings, cp.asarray(pos), ws)
        got = out.get().tolist()
        want = [sample_token(logits[r], c[0], c[1], c[2], c[3]) for r, c in enumerate(cases)]
        assert got == alone, [(r, g, a) for r, (g, a) in enumerate(zip(got, alone)) if g != a][:5]
        assert got == want, [(r, g, w) for r, (g, w) in enumerate(zip(got, want)) if g != w][:5]
        fills, ring_now = params[:, 8].get(), rings.get()
        for r, (p, seed, position, hist, ring_host, push) in enumerate(cases):
            assert int(fills[r]) == len(hist) + push
            expect = ring_host.copy()
            if push:
                expect[len(hist) % RING] = got[r]
            assert np.array_equal(ring_now[r], expect)
    _, _, st_off, slot = ops._sample_layout(V)
    states = ws.get().reshape(-1, slot)[:, st_off:]
    assert not states.any()  # every launch leaves its slots' states zeroed
