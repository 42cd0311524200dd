"""kernels/deltanet.cu and deltanet_chunk.cu (cuda_deltanet.py) against float64 references
(numpy_backend's DeltaNet functions on float64 inputs): the conv1d and its state, the gated delta
rule's recurrence (decode rows and short passes: the same bits row for row; the checkpoint slots),
its chunked prefill (against the recurrence in float64, passes at chunk multiples bit for bit,
decode continuing from its state), the gated RMSNorm;
the gated attention's output gate and gated q layout (elementwise.cu, rope.cu Q_GATED), the gated
shared expert; and the hybrid models (synthetic "tiny-qwen3.5", "tiny-qwen3.5-moe") on the CUDA
runner: against the NumPy runner, m-row steps = one-row steps, exact rollback, chunk invariance,
the speculative gate.  Fresh random inputs, odd sizes (head counts, dims, T across the tiles and
the chunks)."""
import numpy as np
import pytest

from bw24chat.api import SamplingParams
from bw24chat.backends import cuda_deltanet as dn
from bw24chat.backends.numpy_backend import (causal_conv1d_ref, gated_delta_rule_chunked_ref, gated_delta_rule_ref,
                                             gated_rmsnorm_ref, sigmoid)
from bw24chat.ops import DeltaNetSpec


def _rel(got, ref) -> float:
    ref = np.asarray(ref, np.float64)
    return float(np.linalg.norm(np.asarray(got, np.float64) - ref) / np.linalg.norm(ref))


def _bits_equal(a, b) -> bool:
    return np.array_equal(np.asarray(a, np.float32).view(np.uint32), np.asarray(b, np.float32).view(np.uint32))


# ============================================================================ conv1d
@pytest.mark.parametrize("C,Kc", [(1000, 4), (8192, 4), (72, 2), (300, 3)])
@pytest.mark.parametrize("T", [1, 3, 8, 64, 200])
def test_conv1d_matches_float64(cp, rng, C, Kc, T):
    """out against causal_conv1d_ref in float64; the new state is the last KC - 1 rows of
    (state | x), bit for bit; T = 200 runs blocks of rows beside the one that owns the state."""
    x = rng.standard_normal((T, C)).astype(np.float32)
    w = (0.5 * rng.standard_normal((C, Kc))).astype(np.float32)
    state = rng.standard_normal((Kc - 1, C)).astype(np.float32)
    ref, ref_state = causal_conv1d_ref(x.astype(np.float64), w.astype(np.float64), state.astype(np.float64))
    st, out = cp.asarray(state), cp.full((T, C), np.nan, cp.float32)
    dn.conv1d(cp.asarray(x), cp.asarray(w), st, out, T)
    np.testing.assert_allclose(out.get(), ref, rtol=1e-5, atol=1e-6)
    assert _bits_equal(st.get(), ref_state)


def test_conv1d_passes_and_checkpoints(cp, rng):
    """Passes of 5, 1 and 70 rows = one pass of 76, bit for bit (outputs and state); a decode pass
    writes the state before each row to slot position % STATE_SLOTS of its layer, and nothing else."""
    C, Kc, n_layers, layer = 777, 4, 3, 1
    x = rng.standard_normal((76, C)).astype(np.float32)
    w = cp.asarray((0.5 * rng.standard_normal((C, Kc))).astype(np.float32))
    s0 = rng.standard_normal((Kc - 1, C)).astype(np.float32)
    one, out = cp.asarray(s0), cp.empty((76, C), cp.float32)
    dn.conv1d(cp.asarray(x), w, one, out, 76)
    st, parts = cp.asarray(s0), []
    for a, b in ((0, 5), (5, 6), (6, 76)):
        o = cp.empty((b - a, C), cp.float32)
        dn.conv1d(cp.asarray(x[a:b]), w, st, o, b - a)
        parts.append(o.get())
    assert _bits_equal(np.concatenate(parts), out.get()) and _bits_equal(st.get(), one.get())
    # decode: 6 rows at positions 40..45 (slots 4..8, 0)
    ckpt = cp.full((dn.STATE_SLOTS, n_layers, Kc - 1, C), np.nan, cp.float32)
    st, o = cp.asarray(s0), cp.empty((6, C), cp.float32)
    pos = cp.arange(40, 46, dtype=cp.int32)
    dn.conv1d(cp.asarray(x[:6]), w, st, o, 6, pos, ckpt[:, layer])
    xs = np.concatenate([s0, x[:6]])
    got = ckpt.get()
    for i in range(6):
        assert _bits_equal(got[(40 + i) % dn.STATE_SLOTS, layer], xs[i:i + Kc - 1])
    assert np.isnan(got[[1, 2, 3], layer]).all() and np.isnan(got[:, [0, 2]]).all()


# ============================================================================ the delta rule
def _deltanet_inputs(rng, spec: DeltaNetSpec, T: int):
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    Hv = spec.n_v_heads
    S0 = (0.3 * rng.standard_normal((Hv, spec.k_head_dim, spec.v_head_dim))).astype(np.float32)
    return f(T, spec.conv_dim), f(T, Hv), 3 * f(T, Hv), -np.exp(f(Hv)), f(Hv), S0


def _run_recurrent(cp, spec, qkv, b, a, A, dt, S0, positions=None, ckpt=None):
    """(o, S in the reference's (Hv, dk, dv) layout) of one launch over all rows."""
    T = len(qkv)
    S = cp.asarray(np.ascontiguousarray(S0.transpose(0, 2, 1)))  # the device layout: (Hv, dv, dk)
    o = cp.full((T, spec.n_v_heads * spec.v_head_dim), np.nan, cp.float32)
    dn.recurrent(cp.asarray(qkv), cp.asarray(b), cp.asarray(a), cp.asarray(A), cp.asarray(dt), spec, S, o, T,
                 positions, ckpt)
    return o.get(), S.get().transpose(0, 2, 1)


SPECS = [  # (Hk, Hv, dk, dv, order): Qwen3.5-9B's heads; odd head counts and dims; llama.cpp's tiled order
    (16, 32, 128, 128, "grouped"), (2, 6, 128, 128, "tiled"), (3, 3, 40, 17, "grouped"), (1, 5, 8, 6, "grouped"),
    (2, 4, 256, 33, "tiled"), (4, 8, 32, 32, "grouped"),
]


@pytest.mark.parametrize("Hk,Hv,dk,dv,order", SPECS)
@pytest.mark.parametrize("T", [1, 8, 45])
def test_recurrent_matches_float64(cp, rng, Hk, Hv, dk, dv, order, T):
    """o and the state against gated_delta_rule_ref in float64 (the same recurrence, transformers'
    torch_recurrent_gated_delta_rule: tests/test_qwen3_next.py)."""
    spec = DeltaNetSpec(Hk, Hv, dk, dv, 4, 1e-6, order)
    qkv, b, a, A, dt, S0 = _deltanet_inputs(rng, spec, T)
    f64 = lambda v: np.asarray(v, np.float64)  # noqa: E731
    ref, ref_S = gated_delta_rule_ref(f64(qkv), f64(b), f64(a), f64(A), f64(dt), spec, f64(S0))
    o, S = _run_recurrent(cp, spec, qkv, b, a, A, dt, S0)
    assert np.isfinite(o).all()
    assert _rel(o, ref) < 1e-4, _rel(o, ref)
    assert _rel(S, ref_S) < 1e-4, _rel(S, ref_S)
    np.testing.assert_allclose(o, ref, rtol=1e-3, atol=1e-4 * np.abs(ref).max())


@pytest.mark.parametrize("Hk,Hv,dk,dv,order", SPECS[:3])
def test_recurrent_rows_are_single_steps(cp, rng, Hk, Hv, dk, dv, order):
    """One launch over T rows (a decode step of 8, a prefill pass of 77: three tiles) equals T
    launches of one row, bit for bit (o and the state); a decode launch's checkpoint slots hold
    the one-row steps' states before each row."""
    spec = DeltaNetSpec(Hk, Hv, dk, dv, 4, 1e-6, order)
    qkv, b, a, A, dt, S0 = _deltanet_inputs(rng, spec, 77)
    states, outs, S = [], [], S0
    for t in range(77):
        states.append(S)
        o, S = _run_recurrent(cp, spec, qkv[t:t + 1], b[t:t + 1], a[t:t + 1], A, dt, S)
        outs.append(o)
    for T in (8, 77):
        o, S_T = _run_recurrent(cp, spec, qkv[:T], b[:T], a[:T], A, dt, S0)
        assert _bits_equal(o, np.concatenate(outs[:T])), T
        assert _bits_equal(S_T, states[T] if T < 77 else S), T
    n_layers, layer = 2, 1
    ckpt = cp.full((dn.STATE_SLOTS, n_layers, Hv, dv, dk), np.nan, cp.float32)
    pos = cp.arange(100, 108, dtype=cp.int32)
    _run_recurrent(cp, spec, qkv[:8], b[:8], a[:8], A, dt, S0, pos, ckpt[:, layer])
    got = ckpt.get()
    for i in range(8):
        assert _bits_equal(got[(100 + i) % dn.STATE_SLOTS, layer].transpose(0, 2, 1), states[i]), i
    assert np.isnan(got[(108 % dn.STATE_SLOTS), layer]).all() and np.isnan(got[:, 0]).all()


# ============================================================================ the chunked prefill
def _workspace(cp, spec, T):
    return [cp.full(s, np.nan, cp.float32) for s in dn.chunk_workspace_shapes(spec, -(-T // dn.GDN_CHUNK)).values()]


def _run_chunked(cp, spec, qkv, b, a, A, dt, S0, fn=None):
    """(o, S in the reference's layout) of dn.chunked (or dn.prefill) over all rows from S0."""
    T = len(qkv)
    S = cp.asarray(np.ascontiguousarray(S0.transpose(0, 2, 1)))
    o = cp.full((T, spec.n_v_heads * spec.v_head_dim), np.nan, cp.float32)
    (fn or dn.chunked)(cp.asarray(qkv), cp.asarray(b), cp.asarray(a), cp.asarray(A), cp.asarray(dt), spec, S, o, T,
                       *_workspace(cp, spec, T))
    return o.get(), S.get().transpose(0, 2, 1)


def _f64(*xs):
    return [np.asarray(x, np.float64) for x in xs]


@pytest.mark.parametrize("Hk,Hv,dk,dv,order", SPECS)
@pytest.mark.parametrize("T", [1, 45, 64, 77, 200, 512])
def test_chunked_matches_float64(cp, rng, Hk, Hv, dk, dv, order, T):
    """o and the state of deltanet_chunk.cu against the recurrence in float64 (and its chunked form:
    the same function); rows past a partial chunk leave nothing behind (NaN-filled workspace)."""
    spec = DeltaNetSpec(Hk, Hv, dk, dv, 4, 1e-6, order)
    qkv, b, a, A, dt, S0 = _deltanet_inputs(rng, spec, T)
    ref, ref_S = gated_delta_rule_ref(*_f64(qkv, b, a, A, dt), spec, np.asarray(S0, np.float64))
    ref_c, ref_cS = gated_delta_rule_chunked_ref(*_f64(qkv, b, a, A, dt), spec, np.asarray(S0, np.float64))
    assert _rel(ref_c, ref) < 1e-10 and _rel(ref_cS, ref_S) < 1e-10
    o, S = _run_chunked(cp, spec, qkv, b, a, A, dt, S0)
    assert np.isfinite(o).all() and np.isfinite(S).all()
    assert _rel(o, ref) < 5e-5, _rel(o, ref)
    assert _rel(S, ref_S) < 5e-5, _rel(S, ref_S)
    np.testing.assert_allclose(o, ref, rtol=1e-2, atol=2e-4 * np.abs(ref).max())


def test_chunked_strong_decay(cp, rng):
    """A decay that underflows over a chunk (g ~ -30 a row) and none at all: still the recurrence's."""
    spec = DeltaNetSpec(2, 4, 128, 128, 4, 1e-6)
    qkv, b, a, A, dt, S0 = _deltanet_inputs(rng, spec, 150)
    for a_ in (np.abs(a) + 30, np.full_like(a, -40)):  # softplus(a + dt) ~ a / ~ 0
        ref, ref_S = gated_delta_rule_ref(*_f64(qkv, b, a_, A, dt), spec, np.asarray(S0, np.float64))
        o, S = _run_chunked(cp, spec, qkv, b, a_, A, dt, S0)
        assert _rel(o, ref) < 5e-5 and _rel(S, ref_S) < 5e-5, (_rel(o, ref), _rel(S, ref_S))


@pytest.mark.parametrize("Hk,Hv,dk,dv,order", SPECS[:3])
def test_chunked_passes_and_determinism(cp, rng, Hk, Hv, dk, dv, order):
    """Passes split at multiples of 64 rows (128 + 72, 64 + 64 + 72) equal one pass of 200 bit for
    bit (outputs and state), and two runs of a pass give the same bits."""
    spec = DeltaNetSpec(Hk, Hv, dk, dv, 4, 1e-6, order)
    qkv, b, a, A, dt, S0 = _deltanet_inputs(rng, spec, 200)
    one, S_one = _run_chunked(cp, spec, qkv, b, a, A, dt, S0)
    again, S_again = _run_chunked(cp, spec, qkv, b, a, A, dt, S0)
    assert _bits_equal(one, again) and _bits_equal(S_one, S_again)
    for cuts in ((0, 128, 200), (0, 64, 128, 200)):
        S, parts = S0, []
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            o, S = _run_chunked(cp, spec, qkv[lo:hi], b[lo:hi], a[lo:hi], A, dt, S)
            parts.append(o)
        assert _bits_equal(np.concatenate(parts), one) and _bits_equal(S, S_one), cuts


@pytest.mark.parametrize("T", [20, 40, 64, 70, 100, 130])
def test_prefill_pass_then_decode(cp, rng, T):
    """dn.prefill (whole chunks chunked; a tail chunked from DELTANET_CHUNK_MIN_TAIL rows, else row by row)
    then decode steps (the recurrence, from the state the prefill left) against the recurrence in
    float64 over all rows: the decode rows carry the prefill state's error, no more."""
    spec = DeltaNetSpec(16, 32, 128, 128, 4, 1e-6)
    n_dec = 8
    qkv, b, a, A, dt, S0 = _deltanet_inputs(rng, spec, T + n_dec)
    ref, ref_S = gated_delta_rule_ref(*_f64(qkv, b, a, A, dt), spec, np.asarray(S0, np.float64))
    o, S = _run_chunked(cp, spec, qkv[:T], b[:T], a[:T], A, dt, S0, fn=dn.prefill)
    assert dn.chunked_rows(T, spec.k_head_dim) == (T if T % 64 >= dn.DELTANET_CHUNK_MIN_TAIL else T - T % 64)
    outs = [o]
    for t in range(T, T + n_dec):
        o, S = _run_recurrent(cp, spec, qkv[t:t + 1], b[t:t + 1], a[t:t + 1], A, dt, S)
        outs.append(o)
    got = np.concatenate(outs)
    assert _rel(got[:T], ref[:T]) < 5e-5, _rel(got[:T], ref[:T])
    assert _rel(got[T:], ref[T:]) < 5e-5, _rel(got[T:], ref[T:])
    assert _rel(S, ref_S) < 5e-5, _rel(S, ref_S)


@pytest.mark.parametrize("T,Hv,dv", [(1, 32, 128), (7, 6, 128), (5, 3, 17), (9, 5, 6), (3, 4, 100)])
def test_gated_norm_matches_float64(cp, rng, T, Hv, dv):
    spec = DeltaNetSpec(1, Hv, 8, dv, 4, 1e-6)
    x = (rng.standard_normal((T, Hv * dv)) * rng.uniform(0.1, 10)).astype(np.float32)
    z = rng.standard_normal((T, Hv * dv)).astype(np.float32)
    w = rng.standard_normal(dv).astype(np.float32)
    out = cp.full((T, Hv * dv), np.nan, cp.float32)
    dn.gated_norm(cp.asarray(x), cp.asarray(z), cp.asarray(w), spec.eps, out, spec, T)
    ref = gated_rmsnorm_ref(x.astype(np.float64), z.astype(np.float64), w.astype(np.float64), spec)
    np.testing.assert_allclose(out.get(), ref, rtol=1e-5, atol=1e-6)
    # z as a column block of a wider row (the fused input projection's): the same bits
    wide = rng.standard_normal((T, Hv * dv + 37)).astype(np.float32)
    wide[:, 21:21 + Hv * dv] = z
    out2 = cp.full((T, Hv * dv), np.nan, cp.float32)
    dn.gated_norm(cp.asarray(x), cp.asarray(wide)[:, 21:21 + Hv * dv], cp.asarray(w), spec.eps, out2, spec, T)
    assert np.array_equal(out2.get().view(np.uint32), out.get().view(np.uint32))


# ============================================================================ gated attention
@pytest.mark.parametrize("T,H,K,hd", [(1, 16, 4, 256), (5, 8, 2, 64), (3, 6, 3, 128)])
def test_output_gate(cp, rng, T, H, K, hd):
    from bw24chat.backends import cuda_ops as ops

    o = rng.standard_normal((T, H * hd)).astype(np.float32)
    qkv = rng.standard_normal((T, (2 * H + 2 * K) * hd)).astype(np.float32)
    od = cp.asarray(o)
    ops.output_gate(od, cp.asarray(qkv)[:, :2 * H * hd], H, hd)
    gate = qkv[:, :2 * H * hd].reshape(T, H, 2, hd)[:, :, 1].reshape(T, H * hd)  # NumpyOps.output_gate
    np.testing.assert_allclose(od.get(), o * sigmoid(gate), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("hd,partial", [(64, 0.25), (256, 0.25), (128, 1.0)])
def test_rope_reads_a_gated_q(cp, rng, hd, partial):
    """rope.cu Q_GATED on the gated layout (per head [q | gate]) = the plain kernel on q alone, bit
    for bit (q_out and the cache); the gate halves are left as they were."""
    from bw24chat.backends import cuda_ops as ops
    from bw24chat.rope import build_rope_table

    T, H, K = 5, 8, 2
    t = build_rope_table(hd, partial, 1e7, None, 1024, "neox", 1024)
    cos, sin = cp.asarray(t.cos), cp.asarray(t.sin)
    pos = cp.asarray(rng.integers(0, 1024, T).astype(np.int32))
    qkv = rng.standard_normal((T, (2 * H + 2 * K) * hd)).astype(np.float32)
    qn, kn = (cp.asarray(rng.standard_normal(hd).astype(np.float32)) for _ in range(2))
    outs = []
    for gated in (True, False):
        buf = cp.asarray(qkv)
        q = buf[:, :2 * H * hd].reshape(T, H, 2 * hd)[:, :, :hd] if gated else \
            cp.ascontiguousarray(buf[:, :2 * H * hd].reshape(T, H, 2 * hd)[:, :, :hd])
        k = buf[:, 2 * H * hd:(2 * H + K) * hd].reshape(T, K, hd)
        v = buf[:, (2 * H + K) * hd:].reshape(T, K, hd)
        ck, cv = (ops.kv_cache_alloc("bf16", 1024, K, hd) for _ in range(2))
        q_out = cp.full((T, H, hd), np.nan, cp.float32)
        ops.qk_norm_rope_kv_write(q, k, v, qn, kn, 1e-6, cos, sin, pos, "neox", t.rot_dim, ck, cv, "bf16",
                                  q_out=q_out, q_gated=gated)
        outs.append((q_out.get(), ck.get(), cv.get(), buf.get()))
    (q1, k1, v1, b1), (q2, k2, v2, _) = outs
    assert _bits_equal(q1, q2) and np.array_equal(k1, k2) and np.array_equal(v1, v2)
    gates = lambda x: x[:, :2 * H * hd].reshape(T, H, 2, hd)[:, :, 1]  # noqa: E731
    assert _bits_equal(gates(b1), gates(qkv))


@pytest.mark.parametrize("T,D", [(1, 4096), (7, 512), (3, 2052)])
def test_shared_gate(cp, rng, T, D):
    """elementwise.cu shared_gate_rows: a gated shared expert's output times sigmoid(x . gate) (NumpyOps.experts)."""
    from bw24chat.backends import cuda_ops as ops

    s, x = (rng.standard_normal((T, D)).astype(np.float32) for _ in range(2))
    g = (0.05 * rng.standard_normal(D)).astype(np.float32)
    sd = cp.asarray(s)
    ops.shared_gate(sd, cp.asarray(x), cp.asarray(g))
    want = s.astype(np.float64) * sigmoid(x.astype(np.float64) @ g.astype(np.float64))[:, None]
    np.testing.assert_allclose(sd.get(), want, rtol=1e-5, atol=1e-6)


# ============================================================================ the hybrid model on the runner
@pytest.fixture(scope="module")
def hybrid():
    from bw24chat.synthetic import synthetic_checkpoint

    return synthetic_checkpoint("tiny-qwen3.5", "BF16")


def _runner(ck, kv="f32", **kw):
    from bw24chat.backends.cuda_runner import CudaRunner

    return CudaRunner(ck, 1024, kv, prefill_chunk=256, **kw)


def _state(r) -> dict:
    """Host copies of the runner's conv and delta-rule states (after its stream's work)."""
    r.stream.synchronize()
    return {k: r.dn_state[k].get() for k in ("conv", "ssm")}


def test_hybrid_runner_matches_numpy(cp, hybrid):
    """Prefill (tensor cores) and token-by-token decode logits against the NumPy runner (f32 KV
    cache), and greedy tokens equal."""
    from bw24chat.backends.numpy_backend import numpy_runner

    ids = np.random.default_rng().integers(0, 4096, 300)
    nr = numpy_runner(hybrid, 1024)
    ref = nr.prefill_logits(ids, 0, chunk=256)
    r = _runner(hybrid)
    pre = r.prefill_logits(ids, 0)  # passes of 256 + 44 rows: the delta rule chunked
    # the state the chunked prefill leaves, against the NumPy runner's (the recurrence)
    ssm, ref_ssm = _state(r)["ssm"], nr.state.ssm.transpose(0, 1, 3, 2)
    assert _rel(ssm, ref_ssm) < 1e-4, _rel(ssm, ref_ssm)
    dec = np.stack([r.decode_logits(int(t), i) for i, t in enumerate(ids)])
    assert _rel(pre, ref) < 1e-3, _rel(pre, ref)
    assert _rel(dec, ref) < 1e-3, _rel(dec, ref)
    from tests.gpu.test_runner_rows import greedy_tokens_cuda_and_numpy

    out = greedy_tokens_cuda_and_numpy(hybrid)
    assert out["cuda"] == out["numpy"]


def test_hybrid_moe_runner_matches_numpy(cp):
    """Qwen3.5-MoE's block (routed experts + the gated shared expert) on the CUDA runner against the
    NumPy runner: prefill and decode logits."""
    from bw24chat.backends.numpy_backend import numpy_runner
    from bw24chat.synthetic import synthetic_checkpoint

    ck = synthetic_checkpoint("tiny-qwen3.5-moe", "BF16")
    ids = np.random.default_rng().integers(0, 4096, 120)
    ref = numpy_runner(ck, 1024).prefill_logits(ids, 0)
    r = _runner(ck)
    pre = r.prefill_logits(ids, 0)
    dec = np.stack([r.decode_logits(int(t), i) for i, t in enumerate(ids)])
    assert _rel(pre, ref) < 1e-3, _rel(pre, ref)
    assert _rel(dec, ref) < 1e-3, _rel(dec, ref)


@pytest.mark.parametrize("graph", [True, False])
def test_hybrid_rows_equal_single_steps(cp, hybrid, graph):
    """m = 1..9 rows of a step (9: two passes) give the one-row steps' logits and tokens bit for bit."""
    rng = np.random.default_rng()
    prompt = [int(t) for t in rng.integers(0, 4096, 45)]
    rows = [int(t) for t in rng.integers(0, 4096, 9)]
    sp = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, repeat_penalty=1.1)
    r = _runner(hybrid, "bf16", use_graph=graph)
    r.prefill(prompt, 0)
    single, logits = [], []
    for i, t in enumerate(rows):
        single += r.step([t], len(prompt) + i, sp, 5, prompt + rows[:i])
        logits.append(r.last_logits()[0])
    for m in range(1, 10):
        r.prefill(prompt, 0)
        assert r.step(rows[:m], len(prompt), sp, 5, prompt) == single[:m], m
        assert _bits_equal(r.last_logits(), np.stack(logits[:m])), m


def test_hybrid_rollback(cp, hybrid):
    """Rollback inside the latest step restores the state bit for bit (then the same logits as
    plain decoding); rollback elsewhere recomputes the prefix as a fresh prefill of it would;
    a pass past the state's end is refused."""
    rng = np.random.default_rng()
    prompt = [int(t) for t in rng.integers(0, 4096, 30)]
    rows = [int(t) for t in rng.integers(0, 4096, 8)]
    greedy = SamplingParams(temperature=0)
    r = _runner(hybrid, "bf16")
    r.prefill(prompt, 0)
    plain = []
    for i, t in enumerate(rows):
        r.step([t], 30 + i, greedy, 0, [])
        plain.append((r.last_logits()[0], _state(r)))
    for keep in (0, 3, 7):  # a verify of 8 rows, of which keep + 1 stand
        r.prefill(prompt, 0)
        r.step(rows, 30, greedy, 0, [])
        r.rollback(31 + keep)
        assert r.state_pos == 31 + keep
        got = _state(r)
        for k in ("conv", "ssm"):
            assert _bits_equal(got[k], plain[keep][1][k]), (keep, k)
        if keep + 1 < len(rows):
            r.step([rows[keep + 1]], 31 + keep, greedy, 0, [])
            assert _bits_equal(r.last_logits()[0], plain[keep + 1][0]), keep
    # a position before the latest step: recomputed through the prefill path
    r.rollback(20)
    fresh = _runner(hybrid, "bf16")
    fresh.prefill(prompt[:20], 0)
    got, want = _state(r), _state(fresh)
    for k in ("conv", "ssm"):
        assert _bits_equal(got[k], want[k]), k
    with pytest.raises(ValueError, match="recurrent state holds 20 positions"):
        r.step([1], 21, greedy, 0, [])
    assert r.step([prompt[20]], 20, greedy, 0, []) == fresh.step([prompt[20]], 20, greedy, 0, [])


@pytest.mark.parametrize("n", [300, 270])
def test_hybrid_chunk_invariance(cp, hybrid, n):
    """Prefill logits do not depend on the passes (of 256, 128 or 64 rows: multiples of the delta
    rule's chunk), with a last chunk of 44 rows (chunked) or 14 (row by row); passes of other sizes
    are refused."""
    ids = np.random.default_rng().integers(0, 4096, n)
    r = _runner(hybrid, "bf16")
    a = r.prefill_logits(ids, 0, chunk=256)
    for chunk in (128, 64):
        assert _bits_equal(a, r.prefill_logits(ids, 0, chunk=chunk)), chunk
    with pytest.raises(ValueError, match="a multiple of 64"):
        r.prefill_logits(ids, 0, chunk=100)


def test_hybrid_speculative_gate(cp):
    """bw24chat check --spec's gate on the CUDA hybrid model (gated DeltaNet + gated attention + a
    random MTP head): every K, drafter and sampling mode gives plain decoding's output, and the
    cache and state it leaves give the same probe logits."""
    from bw24chat import check
    from bw24chat.speculative import MAX_K, make_drafter

    runner, tok, _ = check.spec_runner("cuda", hybrid=True)
    assert make_drafter("ngram", runner) is not None
    results = check.spec_gates(runner, tok, ks=(1, 2, 5, MAX_K), label="spec/hybrid")
    results.append(check.spec_fixed_gate(runner, tok, "spec/hybrid"))
    bad = [f"{r.name}: {r.value}" for r in results if not r.ok]
    assert not bad, bad
