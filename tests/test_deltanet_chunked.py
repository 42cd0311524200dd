"""The chunked (WY / UT-transform) form of the gated delta rule (numpy_backend.
gated_delta_rule_chunked_ref, the specification of kernels/deltanet_chunk.cu) against the
token-by-token recurrence (gated_delta_rule_ref): the same function to float64 rounding, on fresh
random inputs, odd T (T < 64, multiples of 64 and not), several heads (Qwen3.5-9B's 16 key / 32
value heads of 128, llama.cpp's tiled order, odd dims), a nonzero state, strong and weak decay;
in float32, within the accuracy the CUDA prefill is held to."""
import numpy as np
import pytest

from bw24chat.backends.numpy_backend import DELTA_CHUNK, gated_delta_rule_chunked_ref, gated_delta_rule_ref
from bw24chat.ops import DeltaNetSpec


def _inputs(rng, spec: DeltaNetSpec, T: int, decay: float = 3.0, dtype=np.float64):
    f = lambda *s: rng.standard_normal(s)  # noqa: E731
    Hv = spec.n_v_heads
    S0 = 0.3 * f(Hv, spec.k_head_dim, spec.v_head_dim)
    qkv, b, a, A, dt = (np.asarray(x, dtype) for x in (f(T, spec.conv_dim), f(T, Hv), decay * f(T, Hv),
                                                         -np.exp(f(Hv)), f(Hv)))
    return qkv, b, a, A, dt, spec, np.asarray(S0, dtype)  # gated_delta_rule_ref's arguments


def _rel(got, ref) -> float:
    return float(np.linalg.norm(np.asarray(got, np.float64) - ref) / np.linalg.norm(ref))


SPECS = [  # (Hk, Hv, dk, dv, order)
    (16, 32, 128, 128, "grouped"), (2, 6, 128, 128, "tiled"), (3, 3, 40, 17, "grouped"), (1, 5, 8, 6, "grouped"),
    (2, 4, 256, 33, "tiled"),
]


# every length for the small heads; the 9B heads (Hv = 32) at two lengths, which suffice
CASES = [(*spec, T) for spec in SPECS for T in ((77, 200) if spec[1] == 32 else (1, 7, 64, 77, 129, 200))]


@pytest.mark.parametrize("Hk,Hv,dk,dv,order,T", CASES)
def test_chunked_equals_recurrence_float64(Hk, Hv, dk, dv, order, T):
    rng = np.random.default_rng()
    spec = DeltaNetSpec(Hk, Hv, dk, dv, 4, 1e-6, order)
    args = _inputs(rng, spec, T)
    o_ref, S_ref = gated_delta_rule_ref(*args)
    o, S = gated_delta_rule_chunked_ref(*args)
    assert o.dtype == np.float64 and S.shape == S_ref.shape
    assert _rel(o, o_ref) < 1e-11, _rel(o, o_ref)
    assert _rel(S, S_ref) < 1e-11, _rel(S, S_ref)


@pytest.mark.parametrize("decay", [0.01, 30.0])
def test_chunked_decay_extremes(decay):
    """No decay and a decay that underflows exp over a chunk (g ~ -100 per row): the exponents are
    differences gam_t - gam_s <= 0, so nothing overflows and the result stays the recurrence's."""
    rng = np.random.default_rng()
    spec = DeltaNetSpec(2, 4, 32, 24, 4, 1e-6)
    qkv, b, a, A, dt, _, S0 = _inputs(rng, spec, 150, decay)
    if decay > 1:
        a = np.abs(a) + 20  # softplus(a + dt) ~ a: g = A * a, |A| ~ 1
    o_ref, S_ref = gated_delta_rule_ref(qkv, b, a, A, dt, spec, S0)
    with np.errstate(over="raise", invalid="raise"):
        o, S = gated_delta_rule_chunked_ref(qkv, b, a, A, dt, spec, S0)
    assert _rel(o, o_ref) < 1e-11 and _rel(S, S_ref) < 1e-11


def test_chunked_passes_at_chunk_multiples():
    """Passes that split at multiples of the chunk (the runner's prefill passes) compute the same
    chunks as one pass, bit for bit, also in float32."""
    rng = np.random.default_rng()
    spec = DeltaNetSpec(2, 4, 16, 8, 4, 1e-6)
    qkv, b, a, A, dt, _, S0 = _inputs(rng, spec, 3 * DELTA_CHUNK + 5, dtype=np.float32)
    o, S = gated_delta_rule_chunked_ref(qkv, b, a, A, dt, spec, S0)
    c = 2 * DELTA_CHUNK
    o1, S1 = gated_delta_rule_chunked_ref(qkv[:c], b[:c], a[:c], A, dt, spec, S0)
    o2, S2 = gated_delta_rule_chunked_ref(qkv[c:], b[c:], a[c:], A, dt, spec, S1)
    assert np.array_equal(np.concatenate([o1, o2]), o) and np.array_equal(S2, S)


def test_chunked_float32_accuracy():
    """In float32 the chunked form stays within ~1e-5 of the float64 recurrence over 512 rows at
    the 9B heads' dims (the bound the GPU tests hold kernels/deltanet_chunk.cu to is 1e-4)."""
    rng = np.random.default_rng()
    spec = DeltaNetSpec(2, 4, 128, 128, 4, 1e-6)
    args = _inputs(rng, spec, 512)
    o_ref, S_ref = gated_delta_rule_ref(*args)
    o, S = gated_delta_rule_chunked_ref(*(x if x is spec else np.asarray(x, np.float32) for x in args))
    assert o.dtype == np.float32
    assert _rel(o, o_ref) < 2e-5, _rel(o, o_ref)
    assert _rel(S, S_ref) < 2e-5, _rel(S, S_ref)


def test_prefill_rows_run_chunked():
    """cuda_deltanet.chunked_rows: a pass's whole chunks run chunked, its partial last chunk too from
    DELTANET_CHUNK_MIN_TAIL rows (tuning.py), else row by row; the chunked kernels' shared memory decides the GPUs
    (DK = 128 fits sm_120's 99 KB; DK = 256 needs sm_90's 227 KB)."""
    from bw24chat.backends import cuda_deltanet as dn
    from bw24chat.backends import kernel_build as kb

    m = dn.DELTANET_CHUNK_MIN_TAIL
    assert DELTA_CHUNK == dn.GDN_CHUNK
    for T, want in ((1, 0), (m - 1, 0), (m, m), (64, 64), (64 + m - 1, 64), (64 + m, 64 + m), (512, 512), (530, 512)):
        assert dn.chunked_rows(T, 128) == want, T
    assert max(dn.chunk_smem(128)) <= 99 * 1024 < max(dn.chunk_smem(256)) <= kb.SMEM_BLOCK_SM90
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kb, "smem_block_limit", lambda: 99 * 1024)
        assert dn.chunked_rows(512, 128) == 512 and dn.chunked_rows(512, 256) == 0


def test_chunk_workspace_shapes():
    """The records deltanet_chunk.cu writes, per 64-row chunk: W | U~ | M | two gate rows per value
    head, q | k per key head (dims padded to 32)."""
    from bw24chat.backends import cuda_deltanet as dn

    spec = DeltaNetSpec(16, 32, 128, 128, 4, 1e-6)
    shapes = dn.chunk_workspace_shapes(spec, 8)
    assert shapes == {"ws": (8, 32 * 64 * (128 + 128 + 64 + 2)), "qk": (8, 16 * 64 * 256)}
    assert dn.chunk_workspace_shapes(DeltaNetSpec(3, 3, 40, 17, 4, 1e-6), 1)["ws"] == (1, 3 * 64 * (64 + 32 + 66))
