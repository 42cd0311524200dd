"""Tiny-config tests of every architecture family: the registry builds it from an HF directory,
prefill of a whole prompt equals token-by-token decode, and family switches (biases, QK-norm,
tied embeddings, rope styles and scalings) change what they should."""
import numpy as np
import pytest

from bw24chat.backends.numpy_backend import NumpyBackend, NumpyRunner, numpy_runner
from bw24chat.loaders import load_checkpoint
from bw24chat.models import REGISTRY, build_model, get_family
from tests.model_factory import make_hf_dir


def _logits_prefill_vs_decode(model, ids):
    full = NumpyRunner(model).prefill_logits(np.array(ids), 0)
    r = NumpyRunner(model)
    steps = [r.forward([t], i)[0] for i, t in enumerate(ids)]
    return full, np.stack(steps)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_family_prefill_equals_decode(tmp_path, family):
    d, _ = make_hf_dir(tmp_path / family, family, "F32", tied=family == "llama")
    ck = load_checkpoint(d)
    model = build_model(ck, NumpyBackend())
    assert type(model).__module__ == REGISTRY[family]
    ids = list(np.random.default_rng().integers(0, ck.config["vocab_size"], 23))
    full, steps = _logits_prefill_vs_decode(model, ids)
    assert full.shape == (23, ck.config["vocab_size"])
    np.testing.assert_allclose(full, steps, rtol=2e-5, atol=2e-5)


def test_model_args_ignore_unknown_keys():
    fam = get_family("qwen3")
    a = fam.ModelArgs.from_dict({"hidden_size": 64, "num_attention_heads": 4, "not_a_field": 1, "head_dim": 32})
    assert a.head_dim == 32 and a.qk_norm and a.num_key_value_heads == 4


def test_qk_norm_and_bias_matter(tmp_path):
    """Zeroing the Qwen3 q_norm weights or Qwen2 biases changes the logits: the switches are live."""
    for fam, key in (("qwen3", "blk.0.attn_q_norm"), ("qwen2", "blk.0.attn_q_bias")):
        d, _ = make_hf_dir(tmp_path / fam, fam, "F32")
        ck = load_checkpoint(d)
        base = numpy_runner(ck).forward(np.array([5, 6, 7]), 0)
        t = ck.tensors[key]
        t.raw = np.zeros_like(np.asarray(t.raw)) + (1.0 if "norm" in key else 0.0) * 3
        assert not np.allclose(base, numpy_runner(ck).forward(np.array([5, 6, 7]), 0))


@pytest.mark.parametrize("scaling", [None, {"rope_type": "linear", "factor": 2.0},
                                     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                                     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}])
def test_rope_scalings_run_and_differ(tmp_path, scaling):
    kw = {"rope_scaling": scaling} if scaling else {}
    d, _ = make_hf_dir(tmp_path / "m", "llama", "F32", **kw)
    ck = load_checkpoint(d)
    m = build_model(ck, NumpyBackend())
    ids = list(range(3, 40))
    full, steps = _logits_prefill_vs_decode(m, ids)
    np.testing.assert_allclose(full, steps, rtol=2e-5, atol=2e-5)
    if scaling:
        d0, _ = make_hf_dir(tmp_path / "m0", "llama", "F32")
        assert not np.allclose(numpy_runner(load_checkpoint(d0)).forward(np.array(ids), 0), full[-1:])


def test_rope_styles_are_equivalent_under_permutation():
    """llama.cpp permutes llama Q/K rows so that 'normal' (adjacent pairs) RoPE on permuted
    weights equals 'neox' (half split) RoPE on the HF weights: check on random data."""
    from bw24chat.rope import apply_rope, build_rope_table

    rng = np.random.default_rng()
    hd, T = 16, 9
    x = rng.standard_normal((T, 3, hd)).astype(np.float32)
    perm = np.concatenate([[i, i + hd // 2] for i in range(hd // 2)])  # neox order -> interleaved
    pos = np.arange(T) + 5
    neox = apply_rope(x, pos, build_rope_table(hd, 1.0, 10000.0, None, 64, "neox", 64))
    normal = apply_rope(x[..., perm], pos, build_rope_table(hd, 1.0, 10000.0, None, 64, "normal", 64))
    np.testing.assert_allclose(normal, neox[..., perm], rtol=1e-6, atol=1e-6)
