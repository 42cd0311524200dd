"""The hybrid families (gated DeltaNet + gated attention: Qwen3-Next, Qwen3.5, Qwen3.5-MoE) on the
NumPy reference: the DeltaNet ops against float64 transcriptions of transformers'
modeling_qwen3_next.py (torch_recurrent_gated_delta_rule, the conv1d, Qwen3NextRMSNormGated), and
tiny models of each family: prefill = token-by-token decode = chunked prefill, exact state
rollback; Qwen3-Next's GGUF layout.  tests/test_qwen3_5.py: what Qwen3.5 adds."""
import json

import numpy as np
import pytest

from bw24chat.backends.numpy_backend import NumpyBackend, numpy_runner
from bw24chat.loaders import load_checkpoint
from bw24chat.ops import DeltaNetSpec
from tests.hybrid_factory import make_hybrid_dir, write_hybrid_gguf

SPEC = DeltaNetSpec(n_k_heads=2, n_v_heads=4, k_head_dim=8, v_head_dim=6, conv_kernel=4, eps=1e-6)


def _ops(T, state, start=0):
    b = NumpyBackend()
    return b.ops(b.new_kv_cache(1, 1, 8, 64), start, T, 1e-6, state=state)


# --- float64 transcriptions of transformers' torch code (torch ops -> NumPy)

def _l2norm(x, eps=1e-6):  # modeling_qwen3_next.l2norm
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + eps)


def _hf_recurrent_gated_delta_rule(q, k, v, g, beta, S):
    """torch_recurrent_gated_delta_rule(use_qk_l2norm_in_kernel=True), one sequence: q, k (T, H,
    dk) already repeated to H value heads, v (T, H, dv), g, beta (T, H), S (H, dk, dv)."""
    q, k = _l2norm(q), _l2norm(k)
    q = q * (1 / q.shape[-1] ** 0.5)
    out = np.zeros(v.shape)
    for i in range(len(q)):
        S = S * np.exp(g[i])[:, None, None]
        kv_mem = (S * k[i][:, :, None]).sum(-2)
        delta = (v[i] - kv_mem) * beta[i][:, None]
        S = S + k[i][:, :, None] * delta[:, None, :]
        out[i] = (S * q[i][:, :, None]).sum(-2)
    return out, S


def _deltanet_inputs(T, seed=0):
    rng = np.random.default_rng(seed)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    return (f(T, SPEC.conv_dim), f(T, SPEC.n_v_heads), f(T, SPEC.n_v_heads) * 3,
            -np.exp(f(SPEC.n_v_heads)), f(SPEC.n_v_heads))


def test_gated_delta_rule_matches_float64_in_two_passes():
    T = 9
    qkv, b, a, A, dt = _deltanet_inputs(T)
    state = NumpyBackend().new_recurrent_state(SPEC, 2)
    got = np.concatenate([_ops(5, state).gated_delta_rule(qkv[:5], b[:5], a[:5], A, dt, SPEC, 1),
                          _ops(4, state, 5).gated_delta_rule(qkv[5:], b[5:], a[5:], A, dt, SPEC, 1)])
    Hk, Hv, dk, dv = SPEC.n_k_heads, SPEC.n_v_heads, SPEC.k_head_dim, SPEC.v_head_dim
    x = qkv.astype(np.float64)
    q = np.repeat(x[:, :Hk * dk].reshape(T, Hk, dk), Hv // Hk, axis=1)  # repeat_interleave
    k = np.repeat(x[:, Hk * dk:2 * Hk * dk].reshape(T, Hk, dk), Hv // Hk, axis=1)
    v = x[:, 2 * Hk * dk:].reshape(T, Hv, dv)
    g = A.astype(np.float64) * np.log1p(np.exp(a.astype(np.float64) + dt))  # -exp(A_log) * softplus(a + dt_bias)
    beta = 1 / (1 + np.exp(-b.astype(np.float64)))
    want, S = _hf_recurrent_gated_delta_rule(q, k, v, g, beta, np.zeros((Hv, dk, dv)))
    np.testing.assert_allclose(got, want.reshape(T, -1), rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(state.ssm[1], S, rtol=1e-4, atol=2e-5)
    assert not state.ssm[0].any()  # other layers' states untouched


def test_causal_conv1d_matches_float64_in_two_passes():
    T, C, K = 7, SPEC.conv_dim, SPEC.conv_kernel
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((T, C)).astype(np.float32), rng.standard_normal((C, K)).astype(np.float32)
    state = NumpyBackend().new_recurrent_state(SPEC, 1)
    got = np.concatenate([_ops(3, state).causal_conv1d(x[:3], w, SPEC, 0), _ops(4, state, 3).causal_conv1d(x[3:], w, SPEC, 0)])
    # F.silu(self.conv1d(mixed_qkv)[:, :, :seq_len]): padding kernel - 1 on both sides, first T outputs
    xp = np.concatenate([np.zeros((K - 1, C)), x.astype(np.float64)])
    conv = np.stack([(w * xp[t:t + K].T).sum(-1) for t in range(T)])
    np.testing.assert_allclose(got, conv / (1 + np.exp(-conv)), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(state.conv[0], x[-(K - 1):])


def test_gated_rmsnorm_matches_float64():
    rng = np.random.default_rng(2)
    x, z = (rng.standard_normal((3, SPEC.n_v_heads * SPEC.v_head_dim)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(SPEC.v_head_dim).astype(np.float32)
    got = _ops(3, None).gated_rmsnorm(x, z, w, SPEC)
    h, zz = x.astype(np.float64).reshape(3, -1, SPEC.v_head_dim), z.astype(np.float64).reshape(3, -1, SPEC.v_head_dim)
    want = h / np.sqrt((h * h).mean(-1, keepdims=True) + 1e-6) * w * (zz / (1 + np.exp(-zz)))  # Qwen3NextRMSNormGated
    np.testing.assert_allclose(got, want.reshape(3, -1), rtol=1e-5, atol=1e-6)


# --- tiny hybrid models: layers linear, full, linear, full (tests/hybrid_factory.py); Qwen3-Next: MoE with
# a shared expert, layer 2 dense; Qwen3.5: dense MLPs; Qwen3.5-MoE: MoE everywhere

FAMILIES = ("qwen3_next", "qwen3_5", "qwen3_5_moe")


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request, tmp_path_factory):
    return load_checkpoint(make_hybrid_dir(tmp_path_factory.mktemp(request.param), request.param)[0])


def test_layer_kinds_and_state(tiny):
    r = numpy_runner(tiny)
    assert [L.deltanet is not None for L in r.model.layers] == [True, False, True, False]
    moe = {"qwen3_next": [True, True, False, True], "qwen3_5": [False] * 4, "qwen3_5_moe": [True] * 4}[tiny.arch]
    assert [L.moe is not None for L in r.model.layers] == moe
    assert r.model.n_kv_layers == 2 and r.state.ssm.shape == (2, 4, 8, 6) and r.state.conv.shape == (2, 3, 56)
    assert r.model.attn.rope.rot_dim == 4 and r.model.attn.output_gate


def test_prefill_equals_token_by_token_decode(tiny):
    ids = np.random.default_rng(3).integers(0, 250, 20)
    r = numpy_runner(tiny)
    full = r.prefill_logits(ids, 0)
    r2 = numpy_runner(tiny)
    steps = np.concatenate([r2.forward([t], i) for i, t in enumerate(ids)])
    np.testing.assert_allclose(full, steps, rtol=1e-4, atol=1e-4)
    assert np.abs(full).max() > 1e-2 and np.std(full[:, :250], axis=0).mean() > 1e-3  # not a degenerate model
    chunked = numpy_runner(tiny).prefill_logits(ids, 0, chunk=7)  # the state carries across passes
    np.testing.assert_allclose(chunked, full, rtol=1e-4, atol=1e-4)


def test_rollback_restores_the_states_exactly(tiny):
    from bw24chat.api import SamplingParams

    sp = SamplingParams(temperature=0)
    ids = list(np.random.default_rng(4).integers(0, 250, 8))
    r = numpy_runner(tiny)
    r.prefill(ids, 0)
    r.step([5, 6], 8, sp, 0, ids)
    conv, ssm = r.state.conv.copy(), r.state.ssm.copy()
    want = r.forward([7], 10).copy()
    r.rollback(8)  # drop 5, 6, 7 entirely: recomputed from the prefix
    r.step([5, 6, 9, 9], 8, sp, 0, ids)  # a verify of 4 rows, then keep 2
    r.rollback(10)
    np.testing.assert_array_equal(r.state.conv, conv)
    np.testing.assert_array_equal(r.state.ssm, ssm)
    np.testing.assert_array_equal(r.forward([7], 10), want)
    r.step([7, 1], 10, sp, 0, ids)
    r.step([2, 3, 4], 12, sp, 0, ids)
    r.rollback(9)  # inside an older step: recomputed by replaying the passes (prefill, then rows 8)
    fresh = numpy_runner(tiny)
    fresh.prefill(ids, 0)
    fresh.step([5], 8, sp, 0, ids)
    np.testing.assert_array_equal(r.state.ssm, fresh.state.ssm)
    np.testing.assert_array_equal(r.step([6], 9, sp, 0, ids), fresh.step([6], 9, sp, 0, ids))
    np.testing.assert_array_equal(r.last_logits(), fresh.last_logits())


@pytest.mark.parametrize("legacy", [False, True])
def test_gguf_equals_hf(tmp_path, legacy):
    """The same float32 weights through llama.cpp's qwen3next layout (attn_qkv / attn_gate, or the
    grouped ssm_in of older converters; the grouped ssm_ba; ssm_a = -exp(A_log); 1 + w norms;
    post_attention_norm) and transformers' give bit-identical logits."""
    d, w = make_hybrid_dir(tmp_path / "hf", "qwen3_next", mlp_only_layers=[])  # llama.cpp's qwen3next: MoE everywhere
    hf, gg = load_checkpoint(d), load_checkpoint(write_hybrid_gguf(tmp_path / "m.gguf", d, w, legacy))
    assert gg.arch == "qwen3_next" and sorted(gg.tensors) == sorted(hf.tensors)
    assert gg.config["linear_value_head_dim"] == 6 and gg.config["shared_expert_intermediate_size"] == 24
    ids = np.arange(3, 20)
    np.testing.assert_array_equal(numpy_runner(gg).prefill_logits(ids, 0), numpy_runner(hf).prefill_logits(ids, 0))


@pytest.mark.parametrize("family, edit, message", [
    ("qwen3_next", {"linear_num_key_heads": 3}, "4 value heads cannot be shared by 3 key heads"),
    ("qwen3_5", {"linear_num_key_heads": 0}, "linear_num_key_heads: 0 is not a positive integer"),
    ("qwen3_5_moe", {"layer_types": ["linear_attention"]}, "layer_types: expected 'linear_attention' or 'full_attention'"),
])
def test_lying_linear_attention_settings_are_refused(tmp_path, family, edit, message):
    from bw24chat.loaders import ModelFileError

    d, _ = make_hybrid_dir(tmp_path, family)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, **edit}))
    with pytest.raises(ModelFileError, match=message):
        load_checkpoint(d)


def test_speculation_needs_state_checkpoints(tiny):
    """The NumPy runner checkpoints the recurrent state at every verify row (exact rollback), so
    drafters run on hybrid models (tests/test_speculative.py gates them); a runner that does not
    is refused with the reason."""
    from bw24chat.backends.numpy_backend import NumpyRunner
    from bw24chat.speculative import NgramDrafter, make_drafter

    runner = numpy_runner(tiny)
    assert isinstance(make_drafter("ngram", runner), NgramDrafter)

    class NoCheckpoints(NumpyRunner):
        state_checkpoints = False

    with pytest.raises(ValueError, match="gated DeltaNet layers .* checkpoints their recurrent state"):
        make_drafter("ngram", NoCheckpoints(runner.model, runner.backend))


def test_a_backend_without_deltanet_ops_refuses_at_load(tiny):
    from bw24chat.backends.cuda_opset import CudaLoader
    from bw24chat.backends.plan import PlanLoader
    from bw24chat.models import build_model
    from bw24chat.ops import Loader

    class NoDeltaNet(NumpyBackend):
        load_conv = Loader.load_conv  # the base class's

    with pytest.raises(NotImplementedError, match="gated DeltaNet"):
        build_model(tiny, NoDeltaNet())
    assert CudaLoader.load_conv is not Loader.load_conv and PlanLoader.load_conv is not Loader.load_conv
