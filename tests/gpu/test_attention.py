"""kernels/attention_*.cu (split-K decode on FMAs and on tensor cores, tensor-core prefill) against
the float64 reference on the stored cache values (kernel_refs.attention_ref), plus the
bit-identity contracts: decode row results independent of m and of the other rows and of the
split merge; prefill rows independent of the chunking.  The paths production picks by GPU or
cache type are forced here by monkeypatching cuda_ops' planning functions."""
import math

import numpy as np
import pytest

from bw24chat.backends import cuda_ops as ops
from bw24chat.backends import kernel_refs as kr
from bw24chat.rope import build_rope_table


def _make_cache(cp, rng, kv_type, N, K, hd):
    """Random K and V, stored in kv_type -> (device K, device V, float32 values K, V)."""
    out = []
    for _ in range(2):
        x = (rng.standard_normal((N, K, hd)) * rng.uniform(0.5, 2.0)).astype(np.float32)
        buf = kr.kv_cache_pack(*kr.kv_quantize(x, kv_type), kv_type)
        out.append((cp.asarray(buf), kr.kv_cache_values(buf, kv_type, N, K, hd)))
    return out[0][0], out[1][0], out[0][1], out[1][1]


def _decode_case(cp, rng, kv_type, L, m, H, K, hd):
    """A cache of L + m + 3 positions, m query rows (x2 normals) at lengths L, L+1, ... ->
    (device K, device V, float32 K, V values, q, lengths)."""
    ck, cv, kv, vv = _make_cache(cp, rng, kv_type, L + m + 3, K, hd)
    q = (rng.standard_normal((m, H, hd)) * 2).astype(np.float32)
    return ck, cv, kv, vv, q, [L + r for r in range(m)]


def _rel_err(got, ref):
    return float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))


def _decode(cp, q, ck, cv, kv_type, lengths, scale, H, K, hd):
    m = len(lengths)
    ws = cp.zeros(ops.attn_decode_workspace_bytes(H, K, hd), cp.uint8)
    out = cp.full((m, H, hd), np.nan, cp.float32)
    ops.attn_decode(cp.asarray(q), ck, cv, kv_type, cp.asarray(np.asarray(lengths, np.int32)), m, scale, out, ws)
    return out.get(), ws


SHAPES = [(9, 3, 64), (32, 8, 128), (16, 2, 128), (8, 8, 64), (64, 4, 128)]


_PLAN = {name: getattr(ops, name) for name in ("decode_on_tensor_cores", "decode_tc_config")}


def _set_decode_kernel(monkeypatch, tc: bool, cluster: int | None = None, halves: int | None = None,
                       splits: int | None = None, hybrid: int | None = None) -> None:
    """Force the decode path: tc False takes the FMA kernel for every cache; cluster (0: the
    workspace merge), halves (attn_decode_tc's 1 or 2: the 99 KB GPUs take 1), splits
    (max_splits) and hybrid (the FMA kernel's P) replace the planning functions' choices."""
    monkeypatch.setattr(ops, "decode_on_tensor_cores", lambda kv, hd: tc and _PLAN["decode_on_tensor_cores"](kv, hd))
    if cluster is not None:
        monkeypatch.setattr(ops, "attn_decode_cluster", lambda on_tc: cluster)
    if halves is not None:
        monkeypatch.setattr(ops, "decode_tc_config", lambda hd: (1, 3) if halves == 1 else _PLAN["decode_tc_config"](hd))
    if splits is not None:
        monkeypatch.setattr(ops, "attn_decode_max_splits", lambda *a, **k: splits)
    if hybrid is not None:
        monkeypatch.setattr(ops, "attn_decode_hybrid", lambda c: hybrid)


# (cache type, tensor cores, cluster, halves): every cache type on the FMA kernel, and bf16 (head
# dims <= 128, all of SHAPES) on the tensor-core kernel as well, each with its default split merge
# (None: cuda_ops.attn_decode_cluster) and the other one (workspace 0 / cluster 8); the
# tensor-core kernel with one and two four-warp halves per block
DECODE_KERNELS = ([(kv, False, c, None) for kv in kr.KV_TYPES for c in (None, 8)]
                  + [("bf16", True, c, h) for c in (None, 0) for h in (1, 2)])


@pytest.mark.parametrize("kv_type,tc,cluster,halves", DECODE_KERNELS)
@pytest.mark.parametrize("H,K,hd", SHAPES)
def test_decode_matches_reference(cp, rng, monkeypatch, kv_type, H, K, hd, tc, cluster, halves):
    _set_decode_kernel(monkeypatch, tc, cluster, halves)
    on_tc = ops.decode_on_tensor_cores(kv_type, hd)
    scale = 1.0 / math.sqrt(hd)
    for L, m in [(1, 1), (63, 3), (65, 8), (1000, 2), (8193, 1), (8193, 8)]:
        ck, cv, kv, vv, q, lengths = _decode_case(cp, rng, kv_type, L, m, H, K, hd)
        got, ws = _decode(cp, q, ck, cv, kv_type, lengths, scale, H, K, hd)
        ref = kr.attention_ref(q, kv, vv, np.array(lengths) - 1, scale)
        assert not np.isnan(got).any()
        assert _rel_err(got, ref) <= 2e-3, (L, m)
        if on_tc:  # Q and P as bf16 hi + lo, K and V exact: ~1e-5, as the prefill
            assert _rel_err(got, ref) <= 1e-4, (L, m, _rel_err(got, ref))
        cnt = ws.get()[: ops._decode_ws_layout(H, K, hd, ops.DECODE_MAX_ROWS)[1]].view(np.int32)
        assert not cnt.any(), "arrival counters must be left at zero"


@pytest.mark.parametrize("cluster", [4, 8, 16])
@pytest.mark.parametrize("kv_type,tc,halves", [("bf16", True, 1), ("bf16", True, 2), ("bf16", False, None),
                                               ("q8_0", False, None), ("f32", False, None)])
@pytest.mark.parametrize("H,K,hd", [(32, 8, 128), (9, 3, 64), (64, 4, 128)])
def test_decode_cluster_merge_gives_the_same_bits(cp, rng, monkeypatch, cluster, kv_type, tc, halves, H, K, hd):
    """attention_merge.cuh ATTN_CLUSTER (both decode kernels): the C splits of a (row, kv head,
    head group) merge through distributed shared memory in a thread-block cluster, with the
    workspace merge's operations in its order, so every row equals the workspace merge's with
    max_splits = C bit for bit — one split (no barrier), a few (idle blocks in the cluster) and
    all C; m = 1, 3, 8; within the float64 reference's tolerance."""
    scale = 1.0 / math.sqrt(hd)
    for L, m in [(1, 1), (64, 3), (300, 3), (700, 8), (2047, 2), (9000, 1)]:
        ck, cv, kv, vv, q, lengths = _decode_case(cp, rng, kv_type, L, m, H, K, hd)
        with monkeypatch.context() as mp:
            _set_decode_kernel(mp, tc, cluster=0, halves=halves, splits=cluster)
            ws_merge, _ = _decode(cp, q, ck, cv, kv_type, lengths, scale, H, K, hd)
        with monkeypatch.context() as mp:
            _set_decode_kernel(mp, tc, cluster=cluster, halves=halves, hybrid=1 << 20)  # the cluster at every length
            got, _ = _decode(cp, q, ck, cv, kv_type, lengths, scale, H, K, hd)
        assert np.array_equal(got.view(np.uint32), ws_merge.view(np.uint32)), (L, m)
        tol = 1e-4 if tc else 2e-3
        assert _rel_err(got, kr.attention_ref(q, kv, vv, np.array(lengths) - 1, scale)) <= tol, (L, m)


@pytest.mark.parametrize("cluster,hybrid", [(8, 8), (16, 4), (8, 1), (8, 4)])
@pytest.mark.parametrize("kv_type", ["q8_0", "f32"])
@pytest.mark.parametrize("H,K,hd", [(32, 8, 128), (9, 3, 64)])
def test_decode_hybrid_merge_gives_the_same_bits(cp, rng, monkeypatch, cluster, hybrid, kv_type, H, K, hd):
    """ATTN_HYBRID = P under a cluster of C (the FMA decode): a row of up to C * P tiles equals the
    workspace merge over C splits bit for bit, a longer one the workspace merge over
    attn_decode_long_splits (max_splits rounded up to clusters); rows on both sides of the
    threshold in one launch (m = 2, lengths L and L + 1), and each row alone."""
    C, P = cluster, hybrid
    ms_long = ops.attn_decode_long_splits(H, K, C)
    edge = C * P * ops.DECODE_TILE
    scale = 1.0 / math.sqrt(hd)
    for L in (1, 100, edge - 1, edge, 3 * edge + 5):
        m = 2
        ck, cv, kv, vv, q, lengths = _decode_case(cp, rng, kv_type, L, m, H, K, hd)
        want = {}
        for splits in {C, ms_long}:
            with monkeypatch.context() as mp:
                _set_decode_kernel(mp, False, cluster=0, splits=splits)
                want[splits], _ = _decode(cp, q, ck, cv, kv_type, lengths, scale, H, K, hd)
        with monkeypatch.context() as mp:
            _set_decode_kernel(mp, False, cluster=C, hybrid=P)
            got, _ = _decode(cp, q, ck, cv, kv_type, lengths, scale, H, K, hd)
            for r, n in enumerate(lengths):
                ref = want[C if -(-n // ops.DECODE_TILE) <= C * P else ms_long][r]
                assert np.array_equal(got[r].view(np.uint32), ref.view(np.uint32)), (L, r)
                alone, _ = _decode(cp, q[r:r + 1], ck, cv, kv_type, [n], scale, H, K, hd)
                assert np.array_equal(alone[0].view(np.uint32), got[r].view(np.uint32)), (L, r)
        assert _rel_err(got, kr.attention_ref(q, kv, vv, np.array(lengths) - 1, scale)) <= 2e-3, L


@pytest.mark.parametrize("kv_type,tc,halves", [("bf16", True, 1), ("bf16", True, 2), ("bf16", False, None),
                                               ("q8_0", False, None), ("f32", False, None)])
@pytest.mark.parametrize("H,K,hd", [(32, 8, 128), (9, 3, 64), (16, 2, 128), (8, 8, 64)])
def test_decode_rows_bit_identical_for_any_m(cp, rng, monkeypatch, kv_type, H, K, hd, tc, halves):
    """A row's bits do not depend on m nor on the other rows.  On the tensor-core kernel over a
    contiguous cache the rows share blocks (attn_decode_rows: 4 rows x 4 heads, 2 x 8, 8 x 1 per
    block, both MMA row halves; 3 KV heads' few blocks take 1-2 rows a block), so this is where a
    verify's rows meet: consecutive lengths
    across a key tile's end and across a change of the split plan (511 -> 512 keys: one tile a
    split -> two; 4090 -> 4097), and lengths far apart in one block (their tiles' union)."""
    _set_decode_kernel(monkeypatch, tc, halves=halves)
    scale = 1.0 / math.sqrt(hd)
    for lengths in ([40 + r for r in range(8)], [509 + r for r in range(8)], [4090 + r for r in range(8)],
                    [5, 900, 64, 3000, 65, 1, 511, 2049]):
        N = max(lengths) + 8
        ck, cv, _, _ = _make_cache(cp, rng, kv_type, N, K, hd)
        q = rng.standard_normal((8, H, hd)).astype(np.float32)
        batch, _ = _decode(cp, q, ck, cv, kv_type, lengths, scale, H, K, hd)
        again, _ = _decode(cp, q, ck, cv, kv_type, lengths, scale, H, K, hd)
        assert np.array_equal(batch, again), "run to run"
        for r in range(8):
            single, _ = _decode(cp, q[r:r + 1], ck, cv, kv_type, [lengths[r]], scale, H, K, hd)
            assert np.array_equal(single[0].view(np.uint32), batch[r].view(np.uint32)), (lengths, r)
        for m in (2, 3, 5):  # the first m rows alone: other block fillings
            part, _ = _decode(cp, q[:m], ck, cv, kv_type, lengths[:m], scale, H, K, hd)
            assert np.array_equal(part.view(np.uint32), batch[:m].view(np.uint32)), (lengths, m)
        q2 = q.copy()
        q2[[0, 1, 2, 4, 5, 6, 7]] = rng.standard_normal((7, H, hd))
        other, _ = _decode(cp, q2, ck, cv, kv_type, lengths, scale, H, K, hd)
        assert np.array_equal(other[3], batch[3]), "a row must not depend on the other rows"


def _prefill(cp, q, ck, cv, kv_type, start, scale, chunk=None):
    T, H, hd = q.shape
    qd = cp.asarray(q)
    out = cp.full((T, H, hd), np.nan, cp.float32)
    chunk = chunk or T
    for c0 in range(0, T, chunk):
        c1 = min(T, c0 + chunk)
        ops.attn_prefill(qd[c0:c1], ck, cv, kv_type, start + c0, c1 - c0, scale, out[c0:c1])
    return out.get()


# (relative L2 error, max error / max |ref|) limits against the float64 reference on the stored
# values: split-bf16 Q and P (bf16x2), K/V exact bf16 or (q8_0, fp8, f32) split into hi + lo ->
# ~3e-6..1e-5 (f32 accumulation, exp2).
PREFILL_TOL = (1e-4, 1e-4)


@pytest.mark.parametrize("kv_type", kr.KV_TYPES)
@pytest.mark.parametrize("H,K,hd", [(9, 3, 64), (32, 8, 128), (16, 16, 128), (28, 4, 128)])
def test_prefill_matches_reference(cp, rng, kv_type, H, K, hd):
    scale = 1.0 / math.sqrt(hd)
    tol_l2, tol_max = PREFILL_TOL
    for T, start in [(1, 0), (3, 0), (17, 5), (100, 0), (100, 1000), (64, 63)]:
        N = start + T + 7
        ck, cv, kv, vv = _make_cache(cp, rng, kv_type, N, K, hd)
        q = rng.standard_normal((T, H, hd)).astype(np.float32)
        got = _prefill(cp, q, ck, cv, kv_type, start, scale)
        ref = kr.attention_ref(q, kv, vv, np.arange(start, start + T), scale)
        assert not np.isnan(got).any()
        err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
        assert err <= tol_l2, (T, start, err)
        assert _rel_err(got, ref) <= tol_max, (T, start, _rel_err(got, ref))


@pytest.mark.parametrize("kv_type", kr.KV_TYPES)
@pytest.mark.parametrize("H,K,hd", [(32, 8, 128), (9, 3, 64)])
def test_prefill_one_stage_gives_the_same_bits(cp, rng, monkeypatch, kv_type, H, K, hd):
    """attn_prefill with one K/V stage (attention_prefill.cu PREFILL_STAGES = 1, what the 99 KB GPUs run for
    a prefill over a q8_0 / fp8 / f32 cache at head dim 128: cuda_ops.prefill_stages)
    equals the two-stage kernel bit for bit, for a chunk after earlier ones (start > 0)."""
    T, start = 150, 77
    ck, cv, _, _ = _make_cache(cp, rng, kv_type, start + T + 5, K, hd)
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    scale = 1.0 / math.sqrt(hd)
    base = _prefill(cp, q, ck, cv, kv_type, start, scale)
    monkeypatch.setattr(ops, "prefill_stages", lambda *a: 1)
    got = _prefill(cp, q, ck, cv, kv_type, start, scale)
    assert not np.isnan(base).any()
    assert np.array_equal(base.view(np.uint32), got.view(np.uint32))


@pytest.mark.parametrize("kv_type", kr.KV_TYPES)
@pytest.mark.parametrize("H,K,hd", [(32, 8, 128), (9, 3, 64)])
def test_prefill_chunking_bit_identical(cp, rng, kv_type, H, K, hd):
    T, start = 1024, 37
    N = start + T
    ck, cv, _, _ = _make_cache(cp, rng, kv_type, N, K, hd)
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    scale = 1.0 / math.sqrt(hd)
    a = _prefill(cp, q, ck, cv, kv_type, start, scale, chunk=256)
    b = _prefill(cp, q, ck, cv, kv_type, start, scale, chunk=512)
    c = _prefill(cp, q, ck, cv, kv_type, start, scale, chunk=100)
    assert np.array_equal(a, b)
    assert np.array_equal(a, c)


def _rand_kv(rng, n, K, hd):
    return (rng.standard_normal((n, K, hd)) * rng.uniform(0.5, 2.0)).astype(np.float32)


@pytest.mark.parametrize("kv_type", kr.KV_TYPES)
@pytest.mark.parametrize("H,K,hd", [(9, 3, 64), (32, 8, 128)])
def test_prefill_chunking_large_cache(cp, rng, kv_type, H, K, hd):
    """The model's situation (SmolLM2: H=9, K=3, hd=64, an n_ctx=2048 cache): the cache is
    filled chunk by chunk through qk_norm_rope_kv_write (the scale plane of q8_0 / fp8 sits
    at n_ctx, far beyond start+T), stale data from an earlier run lies beyond the written
    positions, and two chunks of 256 must give the bits of one chunk of 512.  Then the result
    against the float64 reference on the stored values."""
    N, T = 2048, 512
    scale = 1.0 / math.sqrt(hd)
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    k = _rand_kv(rng, T, K, hd) * np.float32(3.0)
    v = _rand_kv(rng, T, K, hd)
    t = build_rope_table(hd, 1.0, 1e4, None, N, "neox", N)
    cos, sin = cp.asarray(t.cos), cp.asarray(t.sin)
    ck, cv = ops.kv_cache_alloc(kv_type, N, K, hd), ops.kv_cache_alloc(kv_type, N, K, hd)

    def write(c0, c1):  # the cache rows of positions c0..c1-1 (k, v unrotated: rot_dim 0)
        qq = cp.asarray(q[c0:c1])
        ops.qk_norm_rope_kv_write(qq, cp.asarray(k[c0:c1]), cp.asarray(v[c0:c1]), None, None, 1e-6, cos, sin,
                                  cp.arange(c0, c1, dtype=cp.int32), "neox", 0, ck, cv, kv_type)

    def run(chunk, poison):
        for c in (ck, cv):  # stale, different bytes everywhere beyond what this run writes
            c.view(cp.uint8).fill(poison)
        out = cp.full((T, H, hd), np.nan, cp.float32)
        qd = cp.asarray(q)
        for c0 in range(0, T, chunk):
            write(c0, c0 + chunk)
            ops.attn_prefill(qd[c0:c0 + chunk], ck, cv, kv_type, c0, chunk, scale, out[c0:c0 + chunk])
        cp.cuda.runtime.deviceSynchronize()
        return out.get()

    a = run(512, 0x00)
    b = run(256, 0x3C)  # f16 1.0 / bf16 pattern / f32 finite: stale but finite
    c = run(256, 0x00)
    assert not np.isnan(a).any()
    nbad = int(np.count_nonzero(a.view(np.uint32) != b.view(np.uint32)))
    assert nbad == 0, f"{nbad} bits differ between chunks of 512 and 256"
    assert np.array_equal(b, c)
    kv = kr.kv_cache_values(ck.get(), kv_type, N, K, hd)[:T]
    vv = kr.kv_cache_values(cv.get(), kv_type, N, K, hd)[:T]
    if kv_type == "f32":
        assert np.array_equal(kv, k) and np.array_equal(vv, v)
    ref = kr.attention_ref(q, kv, vv, np.arange(T), scale)
    tol_l2, tol_max = PREFILL_TOL
    err = float(np.linalg.norm(a - ref) / np.linalg.norm(ref))
    assert err <= tol_l2, err
    assert _rel_err(a, ref) <= tol_max


@pytest.mark.parametrize("kv_type", kr.KV_TYPES)
def test_prefill_matches_decode_large_cache(cp, rng, kv_type):
    """Prefill rows agree with the decode kernel on the same n_ctx=2048 cache (the model's check
    compares prefill with decode logits): both ~1e-5 from the float64 reference."""
    H, K, hd, N, T = 9, 3, 64, 2048, 300
    scale = 1.0 / math.sqrt(hd)
    x = [_rand_kv(rng, N, K, hd) for _ in range(2)]
    ck, cv = (cp.asarray(kr.kv_cache_pack(*kr.kv_quantize(a, kv_type), kv_type)) for a in x)
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    pre = _prefill(cp, q, ck, cv, kv_type, 0, scale, chunk=128)
    rows = [0, 1, 63, 64, 200, 299]
    dec, _ = _decode(cp, q[rows[:6]], ck, cv, kv_type, [r + 1 for r in rows[:6]], scale, H, K, hd)
    assert float(np.linalg.norm(pre[rows] - dec) / np.linalg.norm(dec)) <= 3e-5


@pytest.mark.parametrize("kv_type,tc,cluster,halves", DECODE_KERNELS)
@pytest.mark.parametrize("H,K,hd", [(32, 8, 128), (9, 3, 64), (8, 8, 64)])
@pytest.mark.parametrize("b16", [False, True])
def test_decode_qx_codes_are_the_outputs_codes(cp, rng, monkeypatch, kv_type, tc, cluster, halves, H, K, hd, b16):
    """attention_merge.cuh ATTN_QX: the block finishing a (row, kv head, head group) also writes
    the o projection's QX codes of its outputs — word for word kernel_refs.qx_ref of the outputs
    (of their bf16 roundings with act_bf16) — every split merge (one split, a few, many; cluster
    and workspace), and the outputs are bit-identical to the launch without codes."""
    from bw24chat.backends.kernel_refs import bf16_round, qx_ref, qx_row_words

    _set_decode_kernel(monkeypatch, tc, cluster, halves)
    scale = 1.0 / math.sqrt(hd)
    for L, m in [(1, 1), (63, 3), (700, 8), (8193, 2)]:
        ck, cv, kv, vv, q, lengths = _decode_case(cp, rng, kv_type, L, m, H, K, hd)
        plain, _ = _decode(cp, q, ck, cv, kv_type, lengths, scale, H, K, hd)
        ws = cp.zeros(ops.attn_decode_workspace_bytes(H, K, hd), cp.uint8)
        out = cp.full((m, H, hd), np.nan, cp.float32)
        qx = cp.zeros((m, qx_row_words(H * hd)), cp.uint32)
        ops.attn_decode(cp.asarray(q), ck, cv, kv_type, cp.asarray(np.asarray(lengths, np.int32)), m, scale, out, ws,
                        qx_out=qx, act_bf16=b16)
        got = out.get()
        assert np.array_equal(got.view(np.uint32), plain.view(np.uint32)), (L, m)
        flat = got.reshape(m, H * hd)
        assert np.array_equal(qx.get(), qx_ref(bf16_round(flat) if b16 else flat)), (L, m)
