"""The CUDA steps' host step image, laid out on the CPU (the passes themselves stubbed): every row
of a batched step (cuda_batch.BatchStep) and of a solo step (cuda_runner._write_io) holds its
token, position, length, cache row, sampler image, ring and block table as the kernels read them
(sampling_rows and paged_row per row: the contract); padding rows hold position 0 of the scratch
block whatever ran in their rows before; the tokens a step returns are its sampled rows'."""
from types import SimpleNamespace

import numpy as np
import pytest

from bw24chat.api import SamplingParams
from bw24chat.backends import cuda_batch as cb
from bw24chat.backends import cuda_runner as cr
from bw24chat.backends.kernel_refs import paged_row
from bw24chat.backends.plan import GPUS, planning
from bw24chat.backends.runner import SeqWork

GREEDY = SamplingParams(temperature=0)
PENALTY = SamplingParams(temperature=0.8, top_k=40, repeat_penalty=1.1, repeat_last_n=6)
N_BLOCKS = 40


class _Stream:
    ptr = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self):
        pass


@pytest.fixture
def batch():
    """A BatchStep over symbolic device arrays whose pass records the image it would copy and
    samples 1000 + the row's position."""
    args = SimpleNamespace(num_key_value_heads=2, head_dim=64, vocab_size=300, num_attention_heads=4, hidden_size=128)
    runner = SimpleNamespace(args=args, kv_type="bf16", model=SimpleNamespace(n_kv_layers=1), n_ctx=4096,
                             prefill_chunk=64, dn_state=None, tiers=None, stream=_Stream())
    with planning(GPUS["H100"]):
        b = cb.BatchStep(runner, N_BLOCKS, zeros=lambda name, shape, dtype: np.zeros(shape, dtype))
    b.images = []

    def run_pass(rows):
        b.images.append((rows, b.h_i32.copy()))
        h = b.h_i32
        h[cb._OUT // 4:cb._OUT // 4 + rows] = 1000 + h[cb._POS // 4:cb._POS // 4 + rows]

    b._run_pass = run_pass
    return b


def _rows(w):
    """The reference image rows of a decode item: (token, position, cache row, params, ring, table)."""
    params = w.params or GREEDY
    return [(int(t), w.start + i, paged_row(w.table, w.start + i, cb.ops.KV_PAGE), packed.view(np.int32), ring,
             list(w.table)) for i, (t, (packed, ring)) in enumerate(zip(w.ids, cr.sampling_rows(w.ids, params, w.seed, w.history)))]


def _check(b, image, rows, expected):
    """Pass image ``image`` of ``rows`` (its bucket) rows holds ``expected`` then padding rows."""
    h = image
    words = cb._PARAMS // 4
    for i in range(rows):
        block = h[(cb._HDR + i * b.row_bytes) // 4:(cb._HDR + (i + 1) * b.row_bytes) // 4]
        got = (h[cb._TOK // 4 + i], h[cb._POS // 4 + i], h[cb._LEN // 4 + i], h[cb._CROW // 4 + i])
        if i < len(expected):
            tok, pos, crow, params, ring, table = expected[i]
            assert got == (tok, pos, pos + 1, crow)
            assert np.array_equal(block[:words], params)
            assert list(block[words:words + len(ring)]) == ring
            assert list(block[cb._TABLE // 4:cb._TABLE // 4 + len(table)]) == table
        else:  # padding: position 0 of the scratch block, greedy
            assert got == (0, 0, 1, b.scratch_row)
            assert np.array_equal(block[:words], b.pad_params.view(np.int32))
            assert block[cb._TABLE // 4] == N_BLOCKS


def _table(rng, n):
    return rng.permutation(N_BLOCKS)[:n].astype(np.int32)


def test_a_steps_rows_are_each_rows_image(batch):
    """Plain, verify (with a repetition window) and replay rows of three sequences, one across a
    block boundary; the tokens returned are the sampled rows', in order."""
    rng = np.random.default_rng(1)
    page = cb.ops.KV_PAGE
    work = [SeqWork(np.array([5]), 70, _table(rng, 2), False, GREEDY, 3),
            SeqWork(np.array([7, 8, 9, 10]), page - 2, _table(rng, 2), False, PENALTY, 11,
                    history=[1, 2, 3, 4, 5, 6, 7, 8], sample_all=True),
            SeqWork(np.array([20, 21]), 3, _table(rng, 1), False, None, 4)]
    out = batch.step(work)
    assert out == [[1070], [1000 + page - 2 + i for i in range(4)], []]
    (rows, image), = batch.images
    assert rows == 7
    _check(batch, image, rows, [r for w in work for r in _rows(w)])


def test_padding_rows_stay_padding(batch):
    """17 rows (bucket 24), then 20 over the same image rows, then 17 again: rows 17..19 must be
    padding again; the bucket's other rows stay padding."""
    rng = np.random.default_rng(2)
    for n in (17, 20, 17, 3, 17):
        w = SeqWork(np.arange(n) + 40, 100 + n, _table(rng, 3), False, GREEDY, n, sample_all=True)
        assert batch.step([w]) == [[1000 + 100 + n + i for i in range(n)]]
        rows, image = batch.images[-1]
        assert rows == cb.bucket(n)
        _check(batch, image, rows, _rows(w))


def test_rows_past_one_pass(batch):
    """90 decode rows: a pass of 64, then 26; the sequence cut by the boundary keeps its
    repetition window across it, and its tokens come back in order."""
    rng = np.random.default_rng(3)
    work = [SeqWork(rng.integers(0, 300, n), 100 * i + 50, _table(rng, 5), False, PENALTY, i,
                    history=list(rng.integers(0, 300, 9)), sample_all=True) for i, n in enumerate((30, 40, 20))]
    out = batch.step(work)
    assert out == [[1000 + w.start + i for i in range(len(w.ids))] for w in work]
    expected = [r for w in work for r in _rows(w)]
    (r1, im1), (r2, im2) = batch.images
    assert (r1, r2) == (64, cb.bucket(26))
    _check(batch, im1, 64, expected[:64])
    _check(batch, im2, r2, expected[64:])


@pytest.mark.parametrize("sp", [GREEDY, PENALTY])
def test_solo_step_image(sp):
    """CudaRunner._write_io: a verify's rows (positions, lengths, images, rings) as sampling_rows says."""
    r = SimpleNamespace(h_io=bytearray(cr._IO_BYTES))
    r.h_i32 = np.frombuffer(r.h_io, np.int32)
    toks, hist = [9, 8, 7, 6, 5], [1, 2, 3, 4]
    cr.CudaRunner._write_io(r, toks, 30, sp, 77, hist)
    h, words = r.h_i32, cr._ROW_PARAMS // 4
    for i, (packed, ring) in enumerate(cr.sampling_rows(toks, sp, 77, hist)):
        assert (h[cr._HDR_TOKEN // 4 + i], h[cr._HDR_POS // 4 + i], h[cr._HDR_LEN // 4 + i]) == (toks[i], 30 + i, 31 + i)
        block = h[(cr._HDR_BYTES + i * cr._ROW_BYTES) // 4:(cr._HDR_BYTES + (i + 1) * cr._ROW_BYTES) // 4]
        assert np.array_equal(block[:words], packed.view(np.int32))
        assert list(block[words:words + len(ring)]) == ring
        assert len(ring) == (min(i + 1 + len(hist), 6) if sp is PENALTY else 0)


def test_step_passes_split_a_long_step():
    """cuda_runner.step_passes (CudaRunner.step and the runner over several GPUs): passes of
    max_rows rows at their positions with the history so far, the logits kept wherever another
    pass goes before or after, each pass's sampled tokens in order."""
    from bw24chat.backends.cuda_runner import step_passes

    class Fake:
        max_rows = 4

        def __init__(self):
            self.calls, self.last = [], []

        def _pass(self, rows, start, params, seed, history, keep=False):
            self.calls.append((list(rows), start, list(history), keep))
            self.last = rows
            return f"logits@{start}" if keep else None

        def _tokens(self, n):
            return [t + 100 for t in self.last[:n]]

    for n, keeps in ((3, [False]), (4, [False]), (9, [True, True, True])):
        r, seen = Fake(), []
        toks = list(range(n))
        out, kept = step_passes(r, toks, 50, None, 0, [7, 8], lambda rows, more: seen.append((rows, more)))
        assert out == [t + 100 for t in toks]
        assert [c[3] for c in r.calls] == keeps and len(kept) == sum(keeps)
        assert [(c[0], c[1]) for c in r.calls] == [(toks[s:s + 4], 50 + s) for s in range(0, n, 4)]
        assert [c[2] for c in r.calls] == [[7, 8] + toks[:s] for s in range(0, n, 4)]
        assert seen == [(len(toks[s:s + 4]), s + 4 < n) for s in range(0, n, 4)]
