"""The CUDA batched step (backends/cuda_batch.py) and the paged KV pool it runs on.

Kernels: the paged attention variants (KV_PAGE: block tables) and rope.cu's cache_rows equal the
contiguous-cache kernels bit for bit on the same keys, scattered through random block tables
(kernel_refs.paged_rows / kv_cache_gather state the mapping), for every KV type and decode kernel.
The runner: every sequence of a batch equals its solo run (prefill, then one-row steps, on a fresh
runner) bit for bit -- tokens and the logits of every token -- at B = 1, 2, 8, 16, 32 (the linears
per 8 rows, and per 16 where matvec_mma runs them all, a 12288-input down projection over K
ranges), greedy and seeded, prefix sharing on and off, mixed lengths, sequences joining and leaving between steps, a
pool small enough to preempt, n-gram speculation in the batch (check.batch_gates), every KV type."""
import math

import numpy as np
import pytest

from bw24chat.backends import cuda_ops as ops
from bw24chat.backends import kernel_refs as kr

PAGE = ops.KV_PAGE

# (kv type, tensor cores, cluster): test_attention.py's decode kernels (cluster None: the GPU's own)
DECODE_KERNELS = [(kv, False, c) for kv in kr.KV_TYPES for c in (None, 0)] + [("bf16", True, c) for c in (None, 0)]


def _set_decode_kernel(monkeypatch, tc: bool, cluster):
    real = ops.decode_on_tensor_cores
    monkeypatch.setattr(ops, "decode_on_tensor_cores", lambda kv, hd: tc and real(kv, hd))
    if cluster is not None:
        monkeypatch.setattr(ops, "attn_decode_cluster", lambda on_tc: cluster)


def _scatter(rng, kv_type, lengths, n_blocks, K, hd):
    """Each row's keys 0..L-1 (random values) in a contiguous cache of its own and scattered into
    one pool through a random block table: (pool K, pool V buffers, [(contiguous K, V buffers)],
    tables (rows x max blocks, int32))."""
    rows_total = n_blocks * PAGE
    fill = [kr.kv_quantize(rng.standard_normal((rows_total, K, hd)).astype(np.float32), kv_type) for _ in range(2)]
    perm = rng.permutation(n_blocks)
    need = [-(-L // PAGE) for L in lengths]
    assert sum(need) <= n_blocks
    tables = np.zeros((len(lengths), max(need)), np.int32)
    contiguous, at = [], 0
    for i, L in enumerate(lengths):
        tables[i, :need[i]] = perm[at:at + need[i]]
        at += need[i]
        rows = kr.paged_rows(tables[i, :need[i]], np.arange(L), PAGE)
        pair = []
        for codes_scales in fill:
            x = rng.standard_normal((L, K, hd)).astype(np.float32) * rng.uniform(0.5, 2.0)
            codes, scales = kr.kv_quantize(x, kv_type)
            codes_scales[0][rows] = codes
            if scales is not None:
                codes_scales[1][rows] = scales
            pair.append(kr.kv_cache_pack(codes, scales, kv_type))
        contiguous.append(pair)
    pool = [kr.kv_cache_pack(c, s, kv_type) for c, s in fill]
    for i, L in enumerate(lengths):  # the pool holds each row's keys (kernel_refs.kv_cache_gather)
        rows = kr.paged_rows(tables[i, :need[i]], np.arange(L), PAGE)
        assert kr.kv_cache_gather(pool[0], kv_type, rows_total, K, hd, rows).tobytes() == contiguous[i][0].tobytes()
    return pool[0], pool[1], contiguous, tables


@pytest.mark.parametrize("kv_type,tc,cluster", DECODE_KERNELS)
@pytest.mark.parametrize("H,K,hd", [(9, 3, 64), (32, 8, 128), (8, 8, 64)])
def test_paged_decode_equals_contiguous(cp, rng, monkeypatch, kv_type, tc, cluster, H, K, hd):
    """attn_decode with block tables = attn_decode on each row's contiguous cache, bit for bit
    (odd lengths: partly filled last blocks; 3000+: the FMA kernel's long rows), and within the
    float64 reference's tolerance."""
    _set_decode_kernel(monkeypatch, tc, cluster)
    scale = 1.0 / math.sqrt(hd)
    lengths = [1, 63, 64, 65, 130, 3001, 7, 200][:8]
    n_blocks = sum(-(-L // PAGE) for L in lengths) + 5
    pk, pv, contiguous, tables = _scatter(rng, kv_type, lengths, n_blocks, K, hd)
    m = len(lengths)
    q = (rng.standard_normal((m, H, hd)) * 2).astype(np.float32)
    ws = cp.zeros(ops.attn_decode_workspace_bytes(H, K, hd), cp.uint8)
    out = cp.full((m, H, hd), np.nan, cp.float32)
    ops.attn_decode(cp.asarray(q), cp.asarray(pk), cp.asarray(pv), kv_type, cp.asarray(np.asarray(lengths, np.int32)), m,
                    scale, out, ws, tables=cp.asarray(tables), table_stride=tables.shape[1])
    got = out.get()
    for i, L in enumerate(lengths):
        ck, cv = (cp.asarray(b) for b in contiguous[i])
        o1 = cp.full((1, H, hd), np.nan, cp.float32)
        ops.attn_decode(cp.asarray(q[i:i + 1]), ck, cv, kv_type, cp.asarray(np.array([L], np.int32)), 1, scale, o1, ws)
        assert np.array_equal(got[i].view(np.uint32), o1.get()[0].view(np.uint32)), (i, L)
        kv = kr.kv_cache_values(contiguous[i][0], kv_type, L, K, hd)
        vv = kr.kv_cache_values(contiguous[i][1], kv_type, L, K, hd)
        ref = kr.attention_ref(q[i:i + 1], kv, vv, np.array([L - 1]), scale)[0]
        assert float(np.max(np.abs(got[i] - ref)) / np.max(np.abs(ref))) <= 2e-3


@pytest.mark.parametrize("kv_type,tc,cluster", DECODE_KERNELS)
def test_decode_rows_below_the_workspace_layout(cp, rng, monkeypatch, kv_type, tc, cluster):
    """attn_decode with max_rows below the rows its workspace is laid out for (ws_rows: the batched
    pass's bucket in a workspace of PASS_ROWS rows), launches of different max_rows taking turns
    on one workspace: every row's bits are those of the default launch (max_rows moves only when
    the newest keys are fetched), so the arrival counters stay where each launch finds them."""
    _set_decode_kernel(monkeypatch, tc, cluster)
    H, K, hd, ws_rows = 32, 8, 128, 64
    scale = 1.0 / math.sqrt(hd)
    lengths = [1, 63, 64, 65, 130, 3001, 7, 200]
    pk, pv, _, tables = _scatter(rng, kv_type, lengths, sum(-(-L // PAGE) for L in lengths) + 5, K, hd)
    pk, pv, tables = cp.asarray(pk), cp.asarray(pv), cp.asarray(tables)
    q = cp.asarray((rng.standard_normal((len(lengths), H, hd)) * 2).astype(np.float32))
    lens = cp.asarray(np.asarray(lengths, np.int32))

    def run(m, max_rows, ws, ws_rows=0):
        out = cp.full((m, H, hd), np.nan, cp.float32)
        ops.attn_decode(q, pk, pv, kv_type, lens, m, scale, out, ws, max_rows, tables=tables,
                        table_stride=tables.shape[1], ws_rows=ws_rows)
        return out.get()

    want = run(8, ops.DECODE_MAX_ROWS, cp.zeros(ops.attn_decode_workspace_bytes(H, K, hd), cp.uint8))
    ws = cp.zeros(ops.attn_decode_workspace_bytes(H, K, hd, ws_rows), cp.uint8)
    for m, max_rows in [(8, 8), (1, 1), (8, 64), (3, 3), (8, 16), (1, 1), (8, 24), (8, 8)]:
        got = run(m, max_rows, ws, ws_rows)
        assert np.array_equal(got.view(np.uint32), want[:m].view(np.uint32)), (m, max_rows)
    with pytest.raises(ValueError):
        run(8, 64, ws, 16)


@pytest.mark.parametrize("kv_type", kr.KV_TYPES)
@pytest.mark.parametrize("H,K,hd", [(9, 3, 64), (32, 8, 128)])
def test_paged_prefill_equals_contiguous(cp, rng, kv_type, H, K, hd):
    """attn_prefill through a block table = on the contiguous cache, bit for bit, for chunks that
    start anywhere (not at block boundaries)."""
    L = 300
    pk, pv, contiguous, tables = _scatter(rng, kv_type, [L], -(-L // PAGE) + 4, K, hd)
    scale = 1.0 / math.sqrt(hd)
    ck, cv = (cp.asarray(b) for b in contiguous[0])
    q = rng.standard_normal((L, H, hd)).astype(np.float32)
    for start, T in [(0, L), (37, 61), (128, 1), (299, 1), (5, 200)]:
        qd = cp.asarray(q[start:start + T])
        a = cp.full((T, H, hd), np.nan, cp.float32)
        b = cp.full((T, H, hd), np.nan, cp.float32)
        ops.attn_prefill(qd, ck, cv, kv_type, start, T, scale, a)
        ops.attn_prefill(qd, cp.asarray(pk), cp.asarray(pv), kv_type, start, T, scale, b, table=cp.asarray(tables[0]))
        assert np.array_equal(a.get().view(np.uint32), b.get().view(np.uint32)), (start, T)


@pytest.mark.parametrize("kv_type", kr.KV_TYPES)
def test_rope_writes_the_given_cache_rows(cp, rng, kv_type):
    """qk_norm_rope_kv_write with cache_rows: the rotated q and k are the plain launch's, and
    each token's K/V land in its cache row, byte for byte what the plain launch writes at its
    position."""
    from bw24chat.rope import build_rope_table

    T, H, K, hd, N = 13, 8, 2, 64, 4 * PAGE
    t = build_rope_table(hd, 1.0, 10000.0, None, N, "neox", N)
    cos, sin = cp.asarray(t.cos), cp.asarray(t.sin)
    pos = rng.permutation(N)[:T].astype(np.int32)
    rows = rng.permutation(N)[:T].astype(np.int32)
    q, k, v = (rng.standard_normal((T, n, hd)).astype(np.float32) for n in (H, K, K))
    outs = []
    for cache_rows in (None, rows):
        ck, cv = (ops.kv_cache_alloc(kv_type, N, K, hd) for _ in range(2))
        qd, kd = cp.asarray(q), cp.asarray(k)
        ops.qk_norm_rope_kv_write(qd, kd, cp.asarray(v), None, None, 1e-6, cos, sin, cp.asarray(pos), "neox", hd,
                                  ck, cv, kv_type, cache_rows=None if cache_rows is None else cp.asarray(cache_rows))
        outs.append((qd.get(), kd.get(), ck.get(), cv.get()))
    (q0, k0, ck0, cv0), (q1, k1, ck1, cv1) = outs
    assert np.array_equal(q0, q1) and np.array_equal(k0, k1)
    for plain, paged in ((ck0, ck1), (cv0, cv1)):
        a = kr.kv_cache_gather(plain, kv_type, N, K, hd, pos)
        b = kr.kv_cache_gather(paged, kv_type, N, K, hd, rows)
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("kv", kr.KV_TYPES)
def test_batched_equals_solo(cp, kv):
    """check.batch_gates on the CUDA runner (the synthetic "tiny" model, Q8_0): B = 1, 2, 8, 32,
    greedy and seeded, sharing on and off (prompts of mixed lengths, two in three behind a shared
    system prompt of three blocks; sequences finish and the next ones join between steps), a
    pool of one context (preemption and recompute), n-gram drafts in the batch."""
    from bw24chat.check import batch_gates, batch_runner

    make_runner, tok, _ = batch_runner("cuda", kv=kv)
    bad = [r for r in batch_gates(make_runner, tok) if not r.ok]
    assert not bad, "\n".join(f"{r.name}: {r.value}" for r in bad)


@pytest.mark.parametrize("fmt", ["Q8_0", "NVFP4", "Q4_K"])
def test_the_wide_pass_equals_solo(cp, fmt):
    """Where matvec_mma runs every linear (cuda_batch.wide_rows: 16), the pass's linears are one
    launch per 16 rows (three and four n-tiles) and the rope / attention per 8: every sequence at
    B = 16 and 32 still equals its solo run bit for bit (check.batch_gates)."""
    from bw24chat.backends.cuda_batch import WIDE_ROWS, wide_rows
    from bw24chat.check import batch_gates, batch_runner

    make_runner, tok, _ = batch_runner("cuda", fmt=fmt, kv="bf16")
    assert wide_rows(make_runner()) == WIDE_ROWS == 16
    bad = [r for r in batch_gates(make_runner, tok, sizes=(16, 32)) if not r.ok]
    assert not bad, "\n".join(f"{r.name}: {r.value}" for r in bad)


@pytest.mark.parametrize("fmt", ["Q8_0", "NVFP4"])
def test_the_wide_pass_over_k_ranges_equals_solo(cp, fmt):
    """An FFN of 12288 (the Qwen3-8B down projection's inputs): in the wide pass's spans the down
    matvec takes its 9..16 rows over K ranges (cuda_linear.mma_plan; 3 at 16 rows on an H100),
    on gate|up's QX codes, the chains carried in the pass's scratch (cuda_batch.step_bytes); every
    sequence at B = 16 still equals its solo run bit for bit (check.batch_gates)."""
    from bw24chat.backends import cuda_linear as cl
    from bw24chat.backends.cuda_batch import WIDE_ROWS, wide_rows
    from bw24chat.backends.cuda_runner import CudaRunner
    from bw24chat.check import batch_gates, word_tokenizer
    from bw24chat.synthetic import SHAPES, synthetic_checkpoint

    ck = synthetic_checkpoint({**SHAPES["tiny"], "intermediate_size": 12288}, fmt)
    make_runner = lambda: CudaRunner(ck, 512, "bf16", prefill_chunk=512)  # noqa: E731
    r = make_runner()
    assert wide_rows(r) == WIDE_ROWS
    down = [W for W in r.loader.linears if W.in_ == 12288]
    assert down and all(cl.mma_plan(W, WIDE_ROWS, "qx").ranges > 1 and cl.takes_qx(W, WIDE_ROWS) for W in down)
    bad = [x for x in batch_gates(make_runner, word_tokenizer(SHAPES["tiny"]["vocab_size"]), sizes=(16,)) if not x.ok]
    assert not bad, "\n".join(f"{x.name}: {x.value}" for x in bad)


def test_batched_graph_equals_eager(cp):
    """A batched step replayed from its bucket's graph = the same step launched eagerly, and the
    pass's padding rows change nothing (13 rows run in the 16-row bucket)."""
    from bw24chat.api import SamplingParams
    from bw24chat.backends.runner import SeqWork
    from bw24chat.check import batch_prompts, batch_runner

    make_runner, _, _ = batch_runner("cuda", kv="q8_0")
    sp = SamplingParams(temperature=0.8, top_k=20, seed=3)
    outs = []
    for graph in (True, False):
        r = make_runner()
        r.use_graph = graph
        r.init_kv_pool(64)
        prompts = batch_prompts(13, r.vocab_size, system_len=3 * r.block_size)
        work = []
        for i, p in enumerate(prompts):
            table = np.arange(4 * i, 4 * i + 4, dtype=np.int32)
            r.batch_step([SeqWork(np.asarray(p), 0, table, True)])
            work.append(SeqWork(np.asarray([p[-1]]), len(p) - 1, table, False, sp, seed=i, history=p[:-1]))
        toks = r.batch_step(work)
        outs.append((toks, r.last_logits()))
    assert outs[0][0] == outs[1][0]
    assert np.array_equal(outs[0][1].view(np.uint32), outs[1][1].view(np.uint32))


@pytest.mark.parametrize("shape,fmt", [("tiny", "Q8_0"), ("tiny", "BF16"), ("tiny-moe", "Q8_0")])
def test_the_gemm_rows_pass_is_close_to_the_invariant_pass(cp, shape, fmt):
    """bench's non-invariant variant of the pass (BatchStep.gemm_rows: every linear one prefill
    GEMM over all 20 rows, bucket 24) against the invariant pass on the same step: rounding only
    (each row's logits within 1e-2 relative L2; greedy tokens agree on most rows, the count
    printed), through its own graph; the invariant pass after it gives its bits again."""
    from bw24chat.api import SamplingParams
    from bw24chat.backends.runner import SeqWork
    from bw24chat.check import batch_prompts, batch_runner

    make_runner, _, _ = batch_runner("cuda", shape, fmt, kv="bf16")
    r = make_runner()
    r.init_kv_pool(64)
    greedy = SamplingParams(temperature=0)
    prompts = batch_prompts(20, r.vocab_size)  # of at most 80 tokens: two blocks
    work = []
    for i, p in enumerate(prompts):
        table = np.arange(3 * i, 3 * i + 3, dtype=np.int32)
        r.batch_step([SeqWork(np.asarray(p), 0, table, True)])
        work.append(SeqWork(np.asarray([p[-1]]), len(p) - 1, table, False, greedy))
    runs = []
    for gemm_rows in (False, True, False):
        r.batch.gemm_rows = gemm_rows
        toks = [t[0] for t in r.batch_step(work)]
        runs.append((toks, r.last_logits()))
    assert (24, True) in r.batch.graphs
    (inv, li), (var, lv), (again, la) = runs
    assert inv == again and np.array_equal(li.view(np.uint32), la.view(np.uint32))
    rel = np.linalg.norm(lv - li, axis=1) / np.linalg.norm(li, axis=1)
    agree = sum(a == b for a, b in zip(inv, var))
    print(f"gemm rows {shape} {fmt}: {agree}/{len(inv)} greedy tokens as the invariant pass's, logits rel L2 max {rel.max():.2e}")
    assert rel.max() < 1e-2, rel
    assert agree > len(inv) // 2, (agree, inv, var)


def test_a_lone_prompt_takes_the_prefill_chunk_and_a_joiner_changes_nothing(cp):
    """A request alone is prefilled as the solo runner prefills it (its 450-token prompt in one
    step: the runner's prefill chunk, not the 256-row step budget); a second request joining while
    it decodes is prefilled in budget-sized chunks beside its decode rows; both equal their solo
    runs bit for bit (tokens and the logits of every token)."""
    from dataclasses import replace

    from bw24chat.check import SPEC_SAMPLING, _same, batch_runner, solo_run
    from bw24chat.generate import Output
    from bw24chat.scheduler import DEFAULT_STEP_TOKENS, Scheduler, Sequence

    make_runner, tok, _ = batch_runner("cuda", kv="bf16")
    r = make_runner()
    rng = np.random.default_rng(5)
    prompts = [[int(t) for t in rng.integers(0, r.vocab_size, n)] for n in (450, 300)]
    sp = [replace(SPEC_SAMPLING["sampled"], seed=7 + i, max_tokens=24) for i in range(2)]
    solo = [solo_run(make_runner, p, sp[i], sp[i].seed, 24) for i, p in enumerate(prompts)]
    sched = Scheduler(r, 64)
    steps, inner = [], r.batch_step

    def batch_step(work):
        steps.append([(w.prefill, len(w.ids)) for w in work])
        return inner(work)

    r.batch_step = batch_step
    seqs, rows = [], []
    for i, p in enumerate(prompts):
        out = Output(tok, sp[i], len(p), r.n_ctx)
        rows.append([])
        out.feed = lambda t, logits, feed=out.feed, got=rows[-1]: got.append(np.array(logits())) or feed(t, logits)
        seqs.append(Sequence(list(p), sp[i], out))
    sched.add(seqs[0])
    while len(seqs[0].out.ids) < 5:
        sched.step()
    sched.add(seqs[1])
    while not sched.idle():
        sched.step()
    assert r.prefill_chunk > DEFAULT_STEP_TOKENS and steps[0] == [(True, 450)]
    joined = [s for s in steps if (True, DEFAULT_STEP_TOKENS - 1) in s]
    assert joined and all((False, 1) in s for s in joined)
    for i, s in enumerate(seqs):
        assert _same((s.out.ids, rows[i]), solo[i]), i


# ----------------------------------------------------------------------------- the pool's memory
def test_step_bytes_bounds_what_the_batched_step_allocates(cp):
    """cuda_batch.step_bytes (what the engine keeps free for the batched step beside the pool's
    blocks) covers every byte a pool and its steps take from CuPy: warm-up, a full pass of
    PASS_ROWS decode rows and a step of more rows than one pass (the logits copies)."""
    from bw24chat.api import SamplingParams
    from bw24chat.backends import cuda_batch
    from bw24chat.backends.runner import SeqWork
    from bw24chat.check import batch_prompts, batch_runner

    make_runner, _, _ = batch_runner("cuda", kv="q8_0")
    r = make_runner()
    r.warmup()
    # the prefill's grow-only scratch at the prompts' length first: it is the reserve's, not the step's
    r.prefill(np.arange(96, dtype=np.int64), 0, SamplingParams(temperature=0))
    pool = cp.get_default_memory_pool()
    rows = cuda_batch.PASS_ROWS + 9
    n_blocks = 2 * rows
    cp.cuda.runtime.deviceSynchronize()
    before, free_before = pool.used_bytes(), cp.cuda.runtime.memGetInfo()[0]
    predicted = cuda_batch.step_bytes(r, rows) + n_blocks * r.kv_block_bytes()
    r.init_kv_pool(n_blocks)
    sp = SamplingParams(temperature=0.7, seed=5)
    prompts = batch_prompts(rows, r.vocab_size)
    work = []
    for i, p in enumerate(prompts[:cuda_batch.MAX_BATCH]):
        table = np.array([2 * i, 2 * i + 1], np.int32)
        r.batch_step([SeqWork(np.asarray(p[:40]), 0, table, True)])
        work.append((table, p[:40]))
    peak = pool.used_bytes()
    step = [SeqWork(np.asarray([p[-1]]), len(p) - 1, t, False, sp, seed=i, history=p[:-1]) for i, (t, p) in enumerate(work)]
    r.batch_step(step)  # one pass of PASS_ROWS rows (MAX_BATCH sequences)
    peak = max(peak, pool.used_bytes())
    t, p = work[0]  # a verify of 9 rows beside them: more than one pass
    step[0] = SeqWork(np.asarray([p[-1]] * 10), len(p) - 1, t, False, sp, history=p[:-1], sample_all=True)
    r.batch_step(step)
    peak = max(peak, pool.used_bytes())
    cp.cuda.runtime.deviceSynchronize()
    used = peak - before
    # (CuPy rounds each allocation up to 512 bytes: some tens of arrays)
    assert used <= predicted + (64 << 10), (used, predicted, free_before - cp.cuda.runtime.memGetInfo()[0])
    assert used >= n_blocks * r.kv_block_bytes()


def _engine_at_budget(extra: int, **kw):
    """An engine over the synthetic tiny model (make_cuda_runner, as open_engine loads one) at a
    --vram-budget of what the fit reserves for the model and a 512-token cache plus ``extra`` bytes."""
    from bw24chat.backends.cuda_budget import RESERVE_BYTES, kv_token_bytes
    from bw24chat.backends.cuda_runner import make_cuda_runner
    from bw24chat.check import word_tokenizer
    from bw24chat.engine import Engine
    from bw24chat.options import EngineOptions
    from bw24chat.synthetic import SHAPES, synthetic_checkpoint

    a, n_ctx = SHAPES["tiny"], 512
    ck = synthetic_checkpoint("tiny", "Q8_0")
    ck.tokenizer = word_tokenizer(a["vocab_size"])
    cache = kv_token_bytes(a["num_hidden_layers"], a["num_key_value_heads"], a["head_dim"], "bf16") * n_ctx
    options = EngineOptions(n_ctx=n_ctx, vram_budget_gb=(ck.nbytes + RESERVE_BYTES + cache + extra) / 2**30)
    runner, name = make_cuda_runner(ck, options, lambda p: None)
    return Engine(ck, runner, "cuda", name, "test", **kw)


def _greedy_reply(engine) -> tuple[str, object]:
    from bw24chat.api import GenerationRequest, SamplingParams

    return engine.submit(GenerationRequest(prompt="w1 w2 w3", sampling=SamplingParams(temperature=0, max_tokens=8))).result()


def test_a_budget_without_room_for_the_pool_serves_one_request_at_a_time(cp):
    """--vram-budget leaving (1 MiB) less than one context's pool and the batched step's buffers:
    the engine loads, says why in its load note and serves requests one at a time, with the
    tokens a batching engine gives; at 512 MiB more it batches, its pool capped by the budget."""
    e = _engine_at_budget(1 << 20)
    try:
        assert not e.batched and "one request at a time" in e.load_note and "VRAM budget" in e.load_note, e.load_note
        solo = _greedy_reply(e)
    finally:
        e.close()
    e = _engine_at_budget(512 << 20)
    try:
        assert e.batched and "not the" in e.load_note, e.load_note  # 1 GiB wanted, less fits
        assert e.scheduler.pages.n_blocks * e.runner.kv_block_bytes() <= 512 << 20
        batched = _greedy_reply(e)
    finally:
        e.close()
    assert type(solo[1]).__name__ == "DoneEvent" and solo[0] == batched[0]


def test_a_pool_the_gpu_cannot_allocate_falls_back_to_one_request_at_a_time(cp, monkeypatch):
    """Were the room misjudged: a pool larger than the GPU (--kv-pool of 2^31 positions on a runner
    that reports room for it) runs out of memory at creation; the engine lets it go, serves one
    request at a time and says so."""
    from bw24chat.backends.cuda_runner import CudaRunner

    monkeypatch.setattr(CudaRunner, "kv_pool_room", lambda self, rows: (1 << 62, "room"))
    e = _engine_at_budget(1 << 30, kv_pool=1 << 31)
    try:
        assert not e.batched and "ran out of memory" in e.load_note, e.load_note
        assert type(_greedy_reply(e)[1]).__name__ == "DoneEvent"
    finally:
        e.close()
