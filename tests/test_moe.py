"""Mixture-of-experts on the NumPy reference: the router against float64 transcriptions of
transformers' routing code, the experts op against its contract, and each MoE family tiny
(prefill = token-by-token decode; GGUF = HF safetensors, per-expert and fused layouts)."""
import numpy as np
import pytest

from bw24chat.backends.numpy_backend import NumpyBackend, NumpyExperts, NumpyRunner, numpy_runner
from bw24chat.loaders import load_checkpoint
from bw24chat.loaders.tensor import ExpertTensor
from bw24chat.models import REGISTRY, build_model, get_family
from bw24chat.ops import RouterSpec
from bw24chat.rope import build_rope_table
from tests.model_factory import make_hf_dir, write_gguf

FAMILIES = ["qwen3_moe", "glm4_moe", "minimax_m2"]


def _ops(T: int = 1):
    b = NumpyBackend()
    return b.ops(b.new_kv_cache(1, 2, 16, 64), 0, T, 1e-6)


def _route(x, gate, spec, bias=None):
    return _ops(len(x)).router(x, gate, spec, bias)


# --- float64 transcriptions of transformers' routers (torch ops -> NumPy; topk(sorted=False)
# order is unspecified there, so results are compared as {expert: weight} per row)

def _hf_qwen3_moe(x, gate, k, norm):  # modeling_qwen3_moe.py Qwen3MoeSparseMoeBlock.forward
    logits = x @ gate.T
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ids = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(p, ids, -1)
    if norm:
        w /= w.sum(-1, keepdims=True)
    return ids, w


def _hf_glm4_moe(x, gate, bias, k, n_group, topk_group, norm, scale):  # Glm4MoeMoE.route_tokens_to_experts
    p = 1 / (1 + np.exp(-(x @ gate.T)))
    choice = p + bias
    T, E = choice.shape
    group_scores = np.sort(choice.reshape(T, n_group, E // n_group), -1)[..., -2:].sum(-1)
    group_idx = np.argsort(-group_scores, -1, kind="stable")[:, :topk_group]
    group_mask = np.zeros_like(group_scores)
    np.put_along_axis(group_mask, group_idx, 1, -1)
    score_mask = np.repeat(group_mask, E // n_group, axis=-1)
    scores_for_choice = np.where(score_mask.astype(bool), choice, 0.0)
    ids = np.argsort(-scores_for_choice, -1, kind="stable")[:, :k]
    w = np.take_along_axis(p, ids, -1)
    if norm:
        w = w / (w.sum(-1, keepdims=True) + 1e-20)
    return ids, w * scale


def _hf_minimax_m2(x, gate, bias, k):  # MiniMaxM2TopKRouter.forward
    p = 1 / (1 + np.exp(-(x @ gate.T)))
    ids = np.argsort(-(p + bias), -1, kind="stable")[:, :k]
    w = np.take_along_axis(p, ids, -1)
    return ids, w / w.sum(-1, keepdims=True)


def _as_sets(ids, w):
    return [dict(zip(map(int, i), map(float, v))) for i, v in zip(ids, w)]


def _assert_same_routing(got, want):
    g, h = _as_sets(*got), _as_sets(*want)
    for a, b in zip(g, h):
        assert a.keys() == b.keys()
        np.testing.assert_allclose([a[e] for e in sorted(a)], [b[e] for e in sorted(b)], rtol=2e-6, atol=1e-7)


def _inputs(T=64, D=32, E=16, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((T, D)).astype(np.float32), (0.3 * rng.standard_normal((E, D))).astype(np.float32),
            (0.1 * rng.uniform(0, 1, E)).astype(np.float32))


@pytest.mark.parametrize("norm", [True, False])
def test_softmax_router_matches_transformers(norm):
    x, gate, _ = _inputs()
    spec = RouterSpec(16, 4, "softmax", norm)
    got = _route(x, gate, spec)
    _assert_same_routing(got, _hf_qwen3_moe(x.astype(np.float64), gate.astype(np.float64), 4, norm))
    assert got[0].dtype == np.int32 and got[1].dtype == np.float32 and got[0].shape == (64, 4)


@pytest.mark.parametrize("n_group,topk_group", [(1, 1), (4, 2), (8, 3)])
def test_sigmoid_group_router_matches_transformers(n_group, topk_group):
    x, gate, bias = _inputs()
    spec = RouterSpec(16, 4, "sigmoid", True, n_group, topk_group, 2.5)
    want = _hf_glm4_moe(*(a.astype(np.float64) for a in (x, gate, bias)), 4, n_group, topk_group, True, 2.5)
    _assert_same_routing(_route(x, gate, spec, bias), want)


def test_minimax_router_matches_transformers():
    x, gate, bias = _inputs(seed=1)
    _assert_same_routing(_route(x, gate, RouterSpec(16, 4, "sigmoid", True), bias),
                         _hf_minimax_m2(*(a.astype(np.float64) for a in (x, gate, bias)), 4))


def test_router_ranking_order_and_ties_by_index():
    """ids come best first; equal scores go to the lower expert index (groups too)."""
    D, E = 4, 8
    gate = np.zeros((E, D), np.float32)
    gate[[1, 2, 5, 6], 0] = [1.0, 3.0, 3.0, 1.0]  # experts 2 and 5 tie, 1 and 6 tie; the rest are 0
    x = np.array([[1.0, 0, 0, 0]], np.float32)
    ids, w = _route(x, gate, RouterSpec(E, 5, "softmax", False))
    assert ids.tolist() == [[2, 5, 1, 6, 0]]
    assert w[0, 0] == w[0, 1] and w[0, 2] == w[0, 3] and np.all(np.diff(w[0]) <= 0)
    # two groups of 4 with equal group scores: the lower group wins
    g2 = np.zeros((E, D), np.float32)
    g2[[0, 1, 4, 5], 0] = 2.0
    ids, _ = _route(x, g2, RouterSpec(E, 2, "sigmoid", True, n_group=2, topk_group=1))
    assert ids.tolist() == [[0, 1]]


def test_selection_bias_picks_experts_but_not_weights():
    """The bias moves which experts are chosen; the weights stay the unbiased sigmoid scores of
    the chosen experts, renormalized and scaled."""
    x, gate, _ = _inputs(T=32)
    spec = RouterSpec(16, 4, "sigmoid", True, scale=2.0)
    ids0, w0 = _route(x, gate, spec)
    bias = np.zeros(16, np.float32)
    bias[[3, 11]] = 10.0  # always chosen, ranked first
    ids1, w1 = _route(x, gate, spec, bias)
    assert (np.sort(ids1[:, :2], axis=1) == [3, 11]).all() and (ids1 != ids0).any()
    p = 1 / (1 + np.exp(-(x.astype(np.float64) @ gate.T.astype(np.float64))))
    for ids, w in ((ids0, w0), (ids1, w1)):
        pw = np.take_along_axis(p, ids, -1)
        np.testing.assert_allclose(w, 2.0 * pw / pw.sum(-1, keepdims=True), rtol=2e-6)


def test_dropped_groups_never_win():
    """Experts of groups outside the topk_group are out even when every biased score is
    negative (-inf, DeepSeek-V3's reference code; transformers' 0.0 fill would let them in)."""
    x, gate, _ = _inputs(T=16)
    bias = np.full(16, -5.0, np.float32)
    ids, _ = _route(x, gate, RouterSpec(16, 4, "sigmoid", True, n_group=4, topk_group=1), bias)
    assert all(len({int(e) // 4 for e in row}) == 1 for row in ids)


def test_experts_op_contract():
    """experts = residual + (sum_j w_j * expert_j(x), in ranking order) + gated shared expert."""
    rng = np.random.default_rng(3)
    T, D, F, E, k = 5, 16, 8, 6, 3
    r = lambda *s: rng.standard_normal(s).astype(np.float32) * 0.3  # noqa: E731
    gu, down = [r(2 * F, D) for _ in range(E)], [r(D, F) for _ in range(E)]
    x, res = r(T, D), r(T, D)
    ids = np.array([rng.permutation(E)[:k] for _ in range(T)], np.int32)
    w = rng.uniform(0.1, 1, (T, k)).astype(np.float32)
    shared = (r(2 * F, D), r(D, F), r(D))
    got = _ops(T).experts(x, ids, w, NumpyExperts(gu, down), res.copy(), shared)

    def f(a, g_u, d):  # the dense SwiGLU MLP in float64, gate|up interleaved
        h = g_u.astype(np.float64) @ a
        g, u = h[0::2], h[1::2]
        return d.astype(np.float64) @ (g / (1 + np.exp(-g)) * u)

    want = res.astype(np.float64).copy()
    for t in range(T):
        for j in range(k):
            want[t] += w[t, j] * f(x[t].astype(np.float64), gu[ids[t, j]], down[ids[t, j]])
        want[t] += f(x[t].astype(np.float64), shared[0], shared[1]) / (1 + np.exp(-(x[t].astype(np.float64) @ shared[2])))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # one row at a time gives the same numbers (decode reads only its own experts)
    rows = np.concatenate([_ops(1).experts(x[t:t + 1], ids[t:t + 1], w[t:t + 1], NumpyExperts(gu, down), res[t:t + 1].copy(), shared) for t in range(T)])
    np.testing.assert_allclose(rows, got, rtol=1e-6, atol=1e-6)


def test_full_width_qk_norm():
    """MiniMax-M2's QK-norm: one RMSNorm over all of q (H*hd) and of k (K*hd), then RoPE."""
    from bw24chat.ops import AttentionSpec

    rng = np.random.default_rng(4)
    H, K, hd, T = 4, 2, 16, 3
    rope = build_rope_table(hd, 0.5, 10000.0, None, 64, "neox", 64)
    spec = AttentionSpec(H, K, hd, 1e-6, rope, 0.25, "full")
    qkv = rng.standard_normal((T, (H + 2 * K) * hd)).astype(np.float32)
    qn, kn = rng.uniform(0.5, 1.5, H * hd).astype(np.float32), rng.uniform(0.5, 1.5, K * hd).astype(np.float32)
    b = NumpyBackend()
    ops = b.ops(b.new_kv_cache(1, K, hd, 64), 0, T, 1e-6)
    q = ops.rope_kv(qkv, spec, 0, None, qn, kn)
    rms = lambda a, w: a / np.sqrt((a.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * w  # noqa: E731
    from bw24chat.rope import apply_rope

    want_q = apply_rope(rms(qkv[:, :H * hd], qn).astype(np.float32).reshape(T, H, hd), np.arange(T), rope)
    np.testing.assert_allclose(q, want_q, rtol=1e-5, atol=1e-6)
    want_k = apply_rope(rms(qkv[:, H * hd:(H + K) * hd], kn).astype(np.float32).reshape(T, K, hd), np.arange(T), rope)
    np.testing.assert_allclose(ops.cache.k[0, :T], want_k, rtol=1e-5, atol=1e-6)


# --- the families, tiny

def _prefill_vs_decode(model, ids):
    full = NumpyRunner(model).prefill_logits(np.array(ids), 0)
    r = NumpyRunner(model)
    return full, np.stack([r.forward([t], i)[0] for i, t in enumerate(ids)])


@pytest.mark.parametrize("family", FAMILIES)
def test_moe_family_prefill_equals_decode(tmp_path, family):
    d, _ = make_hf_dir(tmp_path / family, family, "F32")
    ck = load_checkpoint(d)
    model = build_model(ck, NumpyBackend())
    assert type(model).__module__ == REGISTRY[family]
    kinds = ["moe" if L.moe is not None else "dense" for L in model.layers]
    assert kinds == {"qwen3_moe": ["moe", "dense", "moe"], "glm4_moe": ["dense", "moe", "moe"], "minimax_m2": ["moe", "moe"]}[family]
    ids = list(np.random.default_rng(5).integers(0, ck.config["vocab_size"], 19))
    full, steps = _prefill_vs_decode(model, ids)
    np.testing.assert_allclose(full, steps, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_moe_gguf_equals_hf(tmp_path, family):
    """The same float32 weights through the GGUF reader (3-D ffn_*_exps, MoE metadata keys) and
    the safetensors reader (per-expert tensors stacked at load) give the same logits."""
    kw = {"mlp_only_layers": []} if family == "qwen3_moe" else {}  # llama.cpp's qwen3moe has no dense layers
    d, w = make_hf_dir(tmp_path / "hf", family, "F32", **kw)
    hf, gg = load_checkpoint(d), load_checkpoint(write_gguf(tmp_path / "m.gguf", d, w))
    assert gg.arch == family and isinstance(gg.tensors["blk.1.ffn_up_exps"], ExpertTensor)
    ids = np.arange(3, 20)
    np.testing.assert_array_equal(numpy_runner(gg).prefill_logits(ids, 0), numpy_runner(hf).prefill_logits(ids, 0))


@pytest.mark.parametrize("family", FAMILIES)
def test_fused_expert_layout_equals_per_expert(tmp_path, family):
    """transformers >= 5's fused gate_up_proj / down_proj checkpoints load as the same model."""
    d1, _ = make_hf_dir(tmp_path / "a", family, "BF16")
    d2, _ = make_hf_dir(tmp_path / "b", family, "BF16", fused_experts=True)
    a, b = load_checkpoint(d1), load_checkpoint(d2)
    last = f"blk.{a.config['num_hidden_layers'] - 1}.ffn_gate_exps"  # a sparse layer in every family
    t = b.tensors[last]
    assert t.shape == a.tensors[last].shape and not t.expert(3).raw.flags.owndata
    ids = np.arange(3, 12)
    np.testing.assert_array_equal(numpy_runner(a).prefill_logits(ids, 0), numpy_runner(b).prefill_logits(ids, 0))


def test_routing_switches_are_live(tmp_path):
    """The selection bias and the shared expert change GLM's logits; the HF experts stay
    memory-mapped views, one per expert."""
    d, _ = make_hf_dir(tmp_path / "g", "glm4_moe", "F32")
    ck = load_checkpoint(d)
    ids = np.arange(3, 12)
    base = numpy_runner(ck).prefill_logits(ids, 0)
    assert not ck.tensors["blk.2.ffn_down_exps"].expert(0).raw.flags.owndata
    E = ck.config["n_routed_experts"]
    changes = {"blk.1.exp_probs_b": np.arange(E, dtype=np.float32),  # a strong preference for high ids
               "blk.1.ffn_down_shexp": np.zeros(ck.tensors["blk.1.ffn_down_shexp"].shape, np.float32)}
    for name, new in changes.items():
        t = ck.tensors[name]
        saved, t.raw = t.raw, new
        assert not np.allclose(base, numpy_runner(ck).prefill_logits(ids, 0))
        t.raw = saved


def test_expert_count_under_either_config_name():
    """Qwen3-MoE: the released config.json says num_experts, transformers >= 5's save_pretrained
    num_local_experts (Qwen3MoeConfig.attribute_map); GLM-4.5 n_routed_experts."""
    for family, key in (("qwen3_moe", "num_experts"), ("qwen3_moe", "num_local_experts"), ("glm4_moe", "n_routed_experts"),
                        ("minimax_m2", "num_local_experts")):
        assert get_family(family).ModelArgs.from_dict({"hidden_size": 64, "num_attention_heads": 4, key: 24}).num_experts == 24


def test_info_moe_facts(tmp_path):
    from bw24chat.info import describe

    d, _ = make_hf_dir(tmp_path / "g", "glm4_moe", "F32")
    m = describe(load_checkpoint(d))["moe"]
    per_expert = 3 * 64 * 32  # D * F per projection
    assert (m["experts"], m["experts_per_token"], m["shared_experts"]) == (8, 3, 1)
    assert load_checkpoint(d).n_params - m["active_parameters"] == 2 * (8 - 3) * per_expert  # 2 sparse layers


def test_synthetic_moe_shape_runs():
    """The random-weight MoE shape for GPU checks: quantized experts as views, prefill = decode."""
    from bw24chat.synthetic import synthetic_checkpoint

    ck = synthetic_checkpoint("tiny-moe", "Q8_0")
    t = ck.tensors["blk.2.ffn_up_exps"]
    assert t.shape == (16, 256, 512) and t.fmt == "Q8_0"
    model = build_model(ck, NumpyBackend(), n_ctx=64)
    full, steps = _prefill_vs_decode(model, [1, 7, 300, 42, 9])
    np.testing.assert_allclose(full, steps, rtol=1e-4, atol=1e-4)
