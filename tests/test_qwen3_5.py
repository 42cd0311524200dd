"""What Qwen3.5 / Qwen3.5-MoE add to the Qwen3-Next block (models/qwen3_5.py, qwen3_5_moe.py), on
the NumPy reference: a DeltaNet layer and a gated attention layer against float64 transcriptions
of transformers' Qwen3_5GatedDeltaNet.forward and Qwen3NextAttention.forward (zero-centred norms,
partial rotary), the interleaved MRoPE at text positions, llama.cpp's tiled value-head order
(qwen35 GGUF, with its MTP layer), and the multimodal checkpoint layout."""
import json

import numpy as np
import pytest

from bw24chat.backends.numpy_backend import NumpyBackend, numpy_runner
from bw24chat.loaders import load_checkpoint
from bw24chat.ops import DeltaNetSpec
from tests.hybrid_factory import _tiled, make_hybrid_dir, write_hybrid_gguf
from tests.model_factory import write_safetensors


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_5_moe"])
def tiny(request, tmp_path_factory):
    d, w = make_hybrid_dir(tmp_path_factory.mktemp(request.param), request.param, n_mtp=1)
    return d, w, load_checkpoint(d)


# --- float64 transcriptions of transformers' torch code (torch ops -> NumPy)

def _rms(x, w, eps=1e-6):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _silu(x):
    return x / (1 + np.exp(-x))


def _hf_gated_deltanet(h, W, cfg):
    """Qwen3_5GatedDeltaNet.forward without a cache (one sequence): h (T, D) -> (T, D); ``W`` the
    layer's linear_attn.* weights."""
    T = len(h)
    Hk, Hv, dk, dv, Kc = (cfg[k] for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                           "linear_value_head_dim", "linear_conv_kernel_dim"))
    mixed = h @ W["in_proj_qkv.weight"].T  # (T, C)
    z = (h @ W["in_proj_z.weight"].T).reshape(T, Hv, dv)
    b, a = h @ W["in_proj_b.weight"].T, h @ W["in_proj_a.weight"].T
    w = W["conv1d.weight"][:, 0]  # F.conv1d(padding=kernel - 1)[..., :T], then silu
    xp = np.concatenate([np.zeros((Kc - 1, mixed.shape[1])), mixed])
    mixed = _silu(np.stack([(w * xp[t:t + Kc].T).sum(-1) for t in range(T)]))
    q = mixed[:, :Hk * dk].reshape(T, Hk, dk)
    k = mixed[:, Hk * dk:2 * Hk * dk].reshape(T, Hk, dk)
    v = mixed[:, 2 * Hk * dk:].reshape(T, Hv, dv)
    beta = 1 / (1 + np.exp(-b))
    g = -np.exp(W["A_log"]) * np.log1p(np.exp(a + W["dt_bias"]))
    q, k = np.repeat(q, Hv // Hk, axis=1), np.repeat(k, Hv // Hk, axis=1)  # repeat_interleave
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / np.sqrt(dk)  # l2norm, then the scale
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    S, out = np.zeros((Hv, dk, dv)), np.zeros((T, Hv, dv))
    for t in range(T):  # torch_recurrent_gated_delta_rule
        S = S * np.exp(g[t])[:, None, None]
        delta = (v[t] - (S * k[t][:, :, None]).sum(-2)) * beta[t][:, None]
        S = S + k[t][:, :, None] * delta[:, None, :]
        out[t] = (S * q[t][:, :, None]).sum(-2)
    o = _rms(out, W["norm.weight"], cfg["rms_norm_eps"]) * _silu(z)  # Qwen3NextRMSNormGated
    return o.reshape(T, -1) @ W["out_proj.weight"].T


def _hf_gated_attention(h, W, cfg):
    """Qwen3NextAttention.forward at positions 0..T-1 (eager, causal): q_proj per head [q | gate],
    zero-centred per-head q/k norms, partial rotary (rotate_half over the first rot dims), GQA
    softmax attention, * sigmoid(gate), o_proj."""
    T, H, K, hd = len(h), cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    rp = cfg["rope_parameters"]
    qg = (h @ W["q_proj.weight"].T).reshape(T, H, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:].reshape(T, H * hd)
    q = _rms(q, 1 + W["q_norm.weight"], cfg["rms_norm_eps"])
    k = _rms((h @ W["k_proj.weight"].T).reshape(T, K, hd), 1 + W["k_norm.weight"], cfg["rms_norm_eps"])
    v = (h @ W["v_proj.weight"].T).reshape(T, K, hd)
    rot = int(hd * rp["partial_rotary_factor"])
    inv = 1 / rp["rope_theta"] ** (np.arange(0, rot, 2) / rot)
    ang = np.arange(T)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1))[:, None], np.sin(np.concatenate([ang, ang], -1))[:, None]

    def rope(x):
        xr = x[..., :rot]
        half = np.concatenate([-xr[..., rot // 2:], xr[..., :rot // 2]], -1)  # rotate_half
        return np.concatenate([xr * cos + half * sin, x[..., rot:]], -1)

    q, k = rope(q), rope(k)
    k, v = np.repeat(k, H // K, axis=1), np.repeat(v, H // K, axis=1)  # repeat_kv
    s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
    s[:, np.triu(np.ones((T, T), bool), 1)] = -np.inf
    p = np.exp(s - s.max(-1, keepdims=True))
    o = np.einsum("hts,shd->thd", p / p.sum(-1, keepdims=True), v).reshape(T, H * hd)
    return (o / (1 + np.exp(-gate))) @ W["o_proj.weight"].T


def test_mixers_match_float64_transcriptions(tiny):
    """Layer 0 (gated DeltaNet) and layer 1 (gated attention) of the model: x + mixer(norm(x))."""
    d, w, ck = tiny
    cfg = json.loads((d / "config.json").read_text())
    model = numpy_runner(ck).model
    b = NumpyBackend()
    x = np.random.default_rng(7).standard_normal((9, cfg["hidden_size"])).astype(np.float32)
    for li, ref, prefix in ((0, _hf_gated_deltanet, "linear_attn."), (1, _hf_gated_attention, "self_attn.")):
        W = {k[len(f"model.layers.{li}.{prefix}"):]: v.astype(np.float64) for k, v in w.items()
             if k.startswith(f"model.layers.{li}.{prefix}")}
        ops = b.ops(b.new_kv_cache(model.n_kv_layers, cfg["num_key_value_heads"], cfg["head_dim"], 64), 0, len(x),
                    cfg["rms_norm_eps"], state=b.new_recurrent_state(model.deltanet, model.n_state_layers))
        got = model.attention(ops, li, model.layers[li], x.copy())
        h = _rms(x.astype(np.float64), 1 + w[f"model.layers.{li}.input_layernorm.weight"], cfg["rms_norm_eps"])
        want = x + ref(h, W, cfg)
        mix = np.abs(want - x).max()
        assert mix > 1e-1 and np.abs(got - want).max() < 1e-5 * mix  # float32 vs float64: ~4e-7 of the mixer's output


def test_interleaved_mrope_is_plain_rope_at_text_positions(tiny):
    """Qwen3VLTextRotaryEmbedding.forward + apply_interleaved_mrope, transcribed: with the
    temporal, height and width position rows all equal to the token position (text), the
    interleaved frequencies are the plain ones, so the model's partial neox table is the same."""
    d, _, ck = tiny
    cfg = json.loads((d / "config.json").read_text())
    rp, hd = cfg["rope_parameters"], cfg["head_dim"]
    section = rp.get("mrope_section", [11, 11, 10])  # Qwen3_5TextRotaryEmbedding's default
    rot = int(hd * rp["partial_rotary_factor"])
    inv = (1.0 / (np.float32(rp["rope_theta"]) ** (np.arange(0, rot, 2, dtype=np.float32) / np.float32(rot)))).astype(np.float32)
    pos = np.arange(300, dtype=np.float32)
    freqs = np.stack([pos[:, None] * inv[None, :]] * 3)  # (3, T, rot/2): t, h, w rows equal for text
    freqs_t = freqs[0].copy()
    for dim, offset in ((1, 1), (2, 2)):  # H, W dealt to every third frequency
        idx = slice(offset, section[dim] * 3, 3)
        freqs_t[:, idx] = freqs[dim][:, idx]
    table = numpy_runner(ck, 300).model.attn.rope
    assert table.rot_dim == rot and table.style == "neox"
    np.testing.assert_allclose(table.cos[:300], np.cos(freqs_t.astype(np.float64)), atol=1e-6)
    np.testing.assert_allclose(table.sin[:300], np.sin(freqs_t.astype(np.float64)), atol=1e-6)


def test_tiled_value_heads_are_a_permutation_of_grouped():
    """llama.cpp's qwen35 order: value heads tiled (conversion/qwen.py _reorder_v_heads), each
    reading key head j % Hk (ggml_repeat).  Inputs permuted so, through the "tiled" op, give the
    grouped op's output permuted the same way, bit for bit."""
    Hk, Hv, dk, dv = 2, 6, 8, 5
    grouped = DeltaNetSpec(Hk, Hv, dk, dv, 4, 1e-6)
    tiled = DeltaNetSpec(Hk, Hv, dk, dv, 4, 1e-6, "tiled")
    rng = np.random.default_rng(3)
    T, r = 7, Hv // Hk
    qkv = rng.standard_normal((T, grouped.conv_dim)).astype(np.float32)
    b, a = rng.standard_normal((T, Hv)).astype(np.float32), rng.standard_normal((T, Hv)).astype(np.float32)
    A, dt = -np.exp(rng.standard_normal(Hv)).astype(np.float32), rng.standard_normal(Hv).astype(np.float32)
    tile = lambda x, axis, width: _tiled(x, axis, Hk, r, width)  # noqa: E731

    def run(spec, qkv, b, a, A, dt):
        bk = NumpyBackend()
        ops = bk.ops(bk.new_kv_cache(1, 1, 8, 16), 0, T, 1e-6, state=bk.new_recurrent_state(spec, 1))
        return ops.gated_delta_rule(qkv, b, a, A, dt, spec, 0)

    want = tile(run(grouped, qkv, b, a, A, dt), 1, dv)
    qkv_t = np.concatenate([qkv[:, :2 * Hk * dk], tile(qkv[:, 2 * Hk * dk:], 1, dv)], axis=1)
    got = run(tiled, qkv_t, tile(b, 1, 1), tile(a, 1, 1), tile(A, 0, 1), tile(dt, 0, 1))
    np.testing.assert_array_equal(got, want)
    assert np.abs(run(grouped, qkv_t, tile(b, 1, 1), tile(a, 1, 1), tile(A, 0, 1), tile(dt, 0, 1)) - want).max() > 1e-2


def test_gguf_equals_hf(tmp_path, tiny):
    """llama.cpp's qwen35 / qwen35moe layout (V heads tiled, ssm_beta / ssm_alpha, 1 + w norms) and
    transformers' give the same logits, up to the order of ssm_out's sum over the value heads;
    read in the grouped order the same file gives other logits."""
    d, w, hf = tiny
    gg = load_checkpoint(write_hybrid_gguf(tmp_path / "m.gguf", d, w))
    assert gg.arch == hf.arch and sorted(gg.tensors) == sorted(hf.tensors) and sorted(gg.mtp) == sorted(hf.mtp)
    assert gg.config["linear_v_head_order"] == "tiled" and gg.config["num_nextn_predict_layers"] == 1
    ids = np.arange(3, 20)
    want = numpy_runner(hf).prefill_logits(ids, 0)
    np.testing.assert_allclose(numpy_runner(gg).prefill_logits(ids, 0), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    heads = []  # the MTP head (nextn.* of layer N, 1 + w norms) over the same trunk rows
    for ck in (hf, gg):
        r = numpy_runner(ck)
        r.prefill(ids, 0)
        heads.append(r.mtp_forward(ids[1:], r.last_hidden()[:-1], 0, True))
    for x, y in zip(*heads):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5 * np.abs(y).max())
    gg.config["linear_v_head_order"] = "grouped"
    assert np.abs(numpy_runner(gg).prefill_logits(ids, 0) - want).max() > 1e-2


def test_multimodal_checkpoint_loads_its_text_model(tmp_path, tiny):
    """Qwen3_5ForConditionalGeneration: text_config, model.language_model.*, a vision tower
    (model.visual.*) that is skipped; the same logits as the ForCausalLM folder, bit for bit."""
    d, w, hf = tiny
    root = tmp_path / "vl"
    root.mkdir()
    cfg = json.loads((d / "config.json").read_text())
    arch = cfg["architectures"][0].replace("ForCausalLM", "ForConditionalGeneration")
    (root / "config.json").write_text(json.dumps({"architectures": [arch], "model_type": cfg["model_type"],
                                                  "text_config": cfg, "vision_config": {"depth": 1}}))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (root / f).write_bytes((d / f).read_bytes())
    tensors = {k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k: ("F32", v) for k, v in w.items()}
    tensors["model.visual.blocks.0.attn.qkv.weight"] = ("F32", np.zeros((3, 3), np.float32))
    write_safetensors(root / "model.safetensors", tensors)
    vl = load_checkpoint(root)
    assert vl.arch == hf.arch and sorted(vl.tensors) == sorted(hf.tensors) and sorted(vl.mtp) == sorted(hf.mtp)
    ids = np.arange(3, 20)
    np.testing.assert_array_equal(numpy_runner(vl).prefill_logits(ids, 0), numpy_runner(hf).prefill_logits(ids, 0))
