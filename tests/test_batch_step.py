"""The NumPy runner's batched step (backends/runner.py: batch_step) and the row independence it
rests on: a prefill row's products do not depend on the rows beside it (PREFILL_TILE), so prefill
is chunk-invariant; every item of a batched step equals its solo run bit for bit (the prompt
prefilled whole, then one-row steps), whatever chunks and other sequences share the step; verify
rows sampled after every row equal a multi-row ``step``."""
import numpy as np
import pytest

from bw24chat.api import SamplingParams
from bw24chat.backends.numpy_backend import NumpyKVPool, PREFILL_TILE, numpy_runner, tiled_products
from bw24chat.backends.runner import SeqWork
from bw24chat.check import SPEC_SHAPE
from bw24chat.synthetic import synthetic_checkpoint

SAMPLED = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, repeat_penalty=1.1)


def _bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("shape", [(384, 128), (1536, 512), (64, 1000)])
def test_tiled_product_rows_do_not_depend_on_their_companions(shape):
    """Shapes on both sides of OpenBLAS's small-matrix threshold: a row's value is the same alone,
    among 2, 37 or 200 rows, in a chunk starting anywhere, beside any other values and beside
    another sequence's rows at the same positions."""
    rng = np.random.default_rng(shape[0])
    w = rng.standard_normal(shape).astype(np.float32)
    x = rng.standard_normal((200, shape[1])).astype(np.float32)
    pos = np.arange(200)
    ref = tiled_products(x, w, pos)
    for lo, hi in ((0, 1), (5, 7), (3, 40), (64, 200), (63, 130)):
        assert np.array_equal(_bits(tiled_products(x[lo:hi], w, pos[lo:hi])), _bits(ref[lo:hi]))
    noisy = x.copy()
    noisy[1::2] = rng.standard_normal(noisy[1::2].shape)
    assert np.array_equal(_bits(tiled_products(noisy, w, pos)[0::2]), _bits(ref[0::2]))
    other = rng.standard_normal((50, shape[1])).astype(np.float32)  # a second sequence's positions 10..59
    mixed = tiled_products(np.concatenate([other, x[3:40]]), w, np.concatenate([np.arange(10, 60), pos[3:40]]))
    assert np.array_equal(_bits(mixed[50:]), _bits(ref[3:40]))
    assert PREFILL_TILE == 64


@pytest.fixture(scope="module")
def ck():
    return synthetic_checkpoint(SPEC_SHAPE, "Q8_0")


def test_prefill_is_chunk_invariant(ck):
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 512, 150)
    whole = numpy_runner(ck, 256).prefill_logits(ids, 0)
    for chunk in (1, 7, 64, 100):
        assert np.array_equal(_bits(numpy_runner(ck, 256).prefill_logits(ids, 0, chunk=chunk)), _bits(whole))


def test_paged_kv_round_trip():
    pool = NumpyKVPool(2, 3, 4, 10, 4)
    view = pool.view(np.array([7, 2, 5], np.int32))
    k = np.arange(9 * 12, dtype=np.float32).reshape(9, 3, 4)
    view.write(1, 0, k, -k)
    keys, vals = view.read(1, 9)
    assert np.array_equal(keys, k) and np.array_equal(vals, -k) and keys.flags.c_contiguous
    assert np.array_equal(pool.k[1, 7 * 4:8 * 4], k[:4]) and np.array_equal(pool.k[1, 5 * 4], k[8])
    assert not pool.k[0].any()
    with pytest.raises(ValueError):
        view.write(0, 10, k[:3], k[:3])  # past the table's three blocks


def _solo(ck, prompt, sp, seed, n):
    r = numpy_runner(ck, 256)
    tok = r.prefill(np.asarray(prompt), 0, sp, seed, [])
    out, logits, hist = [tok], [r.last_logits()[-1].copy()], list(prompt)
    while len(out) < n:
        tok = r.step([out[-1]], len(hist), sp, seed, hist)[0]
        hist.append(out[-1])
        out.append(tok)
        logits.append(r.last_logits()[0].copy())
    return out, logits


@pytest.mark.parametrize("sp", [SamplingParams(temperature=0), SAMPLED], ids=["greedy", "sampled"])
def test_batched_items_equal_their_solo_runs(ck, sp):
    """Eight sequences, prompts of 1..70 tokens prefilled in random chunks beside the others'
    decode rows, each with its own block table (blocks interleaved across the pool)."""
    rng = np.random.default_rng(3)
    B, n_gen, bs = 8, 10, 16
    prompts = [[int(t) for t in rng.integers(0, 512, int(rng.integers(1, 71)))] for _ in range(B)]
    solo = [_solo(ck, p, sp, 100 + i, n_gen) for i, p in enumerate(prompts)]
    r = numpy_runner(ck, 256)
    r.init_kv_pool(B * 6)
    tables = [np.arange(i, B * 6, B, dtype=np.int32) for i in range(B)]  # block j of sequence i: i + j * B
    assert r.block_size == bs
    toks = [list(p) for p in prompts]
    done = [0] * B
    outs = [[] for _ in range(B)]
    logits = [[] for _ in range(B)]
    while any(len(o) < n_gen for o in outs):
        work, who = [], []
        for i in range(B):
            if len(outs[i]) >= n_gen or rng.random() < 0.2:  # sometimes a sequence sits a step out
                continue
            n = len(prompts[i])
            if done[i] < n:
                T = min(int(rng.integers(1, 20)), n - done[i])
                work.append(SeqWork(np.array(toks[i][done[i]:done[i] + T]), done[i], tables[i], True,
                                    sp if done[i] + T == n else None, 100 + i, toks[i][:done[i]]))
            else:
                work.append(SeqWork(np.array([toks[i][done[i]]]), done[i], tables[i], False, sp, 100 + i, toks[i][:done[i]]))
            who.append(i)
        if not work:
            continue
        got = r.batch_step(work)
        rows = iter(r.last_logits())
        for i, w, t in zip(who, work, got):
            done[i] += len(w.ids)
            for tok in t:
                outs[i].append(tok)
                toks[i].append(tok)
                logits[i].append(next(rows).copy())
    for i in range(B):
        assert outs[i] == solo[i][0], i
        assert all(np.array_equal(_bits(a), _bits(b)) for a, b in zip(logits[i], solo[i][1])), i


def test_verify_rows_equal_a_multi_row_step(ck):
    """sample_all (a speculative verify inside a batch): the token after each row and its logits
    equal ``step`` over the same rows."""
    rng = np.random.default_rng(4)
    prompt = [int(t) for t in rng.integers(0, 512, 30)]
    rows = [int(t) for t in rng.integers(0, 512, 5)]
    a = numpy_runner(ck, 256)
    a.prefill(prompt, 0)
    want = a.step(rows, len(prompt), SAMPLED, 9, prompt)
    want_logits = a.last_logits().copy()
    b = numpy_runner(ck, 256)
    b.init_kv_pool(8)
    table = np.array([3, 1, 6], np.int32)
    b.batch_step([SeqWork(np.array(prompt), 0, table, True)])
    other = SeqWork(np.array(prompt[:9]), 0, np.array([0], np.int32), True, SAMPLED, 1)
    got = b.batch_step([other, SeqWork(np.array(rows), len(prompt), table, False, SAMPLED, 9, prompt, sample_all=True)])
    assert got[1] == want and len(got[0]) == 1
    assert np.array_equal(_bits(b.last_logits()[1:]), _bits(want_logits))
