"""Loaders: GGUF metadata -> config, HF directories in every supported weight encoding, the
explicit name maps."""
import json

import numpy as np
import pytest

from bw24chat.loaders import load_checkpoint
from bw24chat.loaders.hf_loader import _nvfp4_modelopt_to_ggml
from bw24chat.loaders.names import GGUF_MAP, HF_MAP
from bw24chat.loaders.tensor import FP8_E4M3, QTensor
from tests.model_factory import make_hf_dir, write_safetensors


def test_gguf_config_and_tensors(smollm2):
    c = smollm2.config
    assert c["model_type"] == "llama" and c["rope_style"] == "normal"
    assert (c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"]) == (576, 30, 9, 3)
    assert c["tie_word_embeddings"] is True and c["vocab_size"] == 49152
    assert smollm2.tensors["blk.0.attn_q"].shape == (576, 576)
    assert smollm2.tensors["blk.0.ffn_down"].shape == (576, 1536)
    assert smollm2.tensors["tok_embd"].fmt == "Q8_0"
    assert 130e6 < smollm2.n_params < 140e6
    # memory-mapped, not copied
    assert not smollm2.tensors["blk.3.ffn_up"].raw.flags.owndata


def test_name_maps_are_explicit_and_total():
    assert GGUF_MAP.canonical("blk.12.attn_output.weight") == "blk.12.attn_o"
    assert HF_MAP.canonical("model.layers.7.mlp.down_proj.weight") == "blk.7.ffn_down"
    assert HF_MAP.canonical("model.layers.7.self_attn.rotary_emb.inv_freq") is None


@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_hf_dir_roundtrip(tmp_path, family, dtype):
    d, weights = make_hf_dir(tmp_path / "m", family, dtype, tied=(family == "llama"))
    ck = load_checkpoint(d)
    assert ck.arch == family and ck.source == "hf"
    assert ck.config["tie_word_embeddings"] == (family == "llama")
    np.testing.assert_array_equal(ck.tensors["blk.1.attn_q"].dequantize(), weights["model.layers.1.self_attn.q_proj.weight"])
    np.testing.assert_array_equal(ck.tensors["tok_embd"].dequantize(), weights["model.embed_tokens.weight"])
    if family == "qwen3":
        assert "blk.0.attn_q_norm" in ck.tensors
    if family == "qwen2":
        assert "blk.0.attn_k_bias" in ck.tensors
    assert ck.tokenizer.chat_template and ck.tokenizer.eos_id is not None


def test_hf_sharded_index(tmp_path):
    d, weights = make_hf_dir(tmp_path / "m", "llama", "F32")
    # split into two shards with an index, as save_pretrained does for large models
    from bw24chat.loaders.hf_loader import SafetensorsFile

    f = SafetensorsFile(d / "model.safetensors")
    names = sorted(f.header)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    wm = {}
    for fname, ns in shards.items():
        write_safetensors(d / fname, {n: ("F32", f.get(n)[0]) for n in ns})
        wm.update({n: fname for n in ns})
    del f
    (d / "model.safetensors").unlink()
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    ck = load_checkpoint(d)
    np.testing.assert_array_equal(ck.tensors["blk.0.ffn_gate"].dequantize(), weights["model.layers.0.mlp.gate_proj.weight"])


def _e4m3_encode_positive(x):
    """Nearest E4M3 code for positive x (test helper, by table search)."""
    table = FP8_E4M3[:0x7F]
    return np.abs(table[None, :] - x.reshape(-1, 1)).argmin(axis=1).astype(np.uint8).reshape(x.shape)


def test_modelopt_nvfp4_repack_matches_direct_decode():
    rng = np.random.default_rng()
    rows, n = 5, 128
    packed = rng.integers(0, 256, size=(rows, n // 2), dtype=np.uint8)
    scales = _e4m3_encode_positive(rng.uniform(0.01, 4.0, size=(rows, n // 16)).astype(np.float32))
    g2 = np.float32(0.37)
    # independent decode straight from the ModelOpt layout (element 2i low nibble, 2i+1 high)
    e2m1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
    codes = np.empty((rows, n), np.uint8)
    codes[:, 0::2], codes[:, 1::2] = packed & 15, packed >> 4
    direct = e2m1[codes] * np.repeat(FP8_E4M3[scales], 16, axis=1) * g2
    t = QTensor("w", "NVFP4", (rows, n), _nvfp4_modelopt_to_ggml(packed, scales), global_scale=float(g2))
    np.testing.assert_array_equal(t.dequantize(), direct.astype(np.float32))


def test_hf_modelopt_nvfp4_and_fp8_checkpoint(tmp_path):
    """A checkpoint with ModelOpt NVFP4 projections, FP8-block projections and BF16 the rest loads,
    and every layer reports its own format (mixed checkpoints)."""
    d, _ = make_hf_dir(tmp_path / "m", "llama", "BF16", hidden_size=128, intermediate_size=128, head_dim=32)
    from bw24chat.loaders.hf_loader import SafetensorsFile

    f = SafetensorsFile(d / "model.safetensors")
    tensors = {n: (f.header[n]["dtype"], f.get(n)[0]) for n in f.header}
    del f
    rng = np.random.default_rng(1)
    q = "model.layers.0.self_attn.q_proj."
    out_f, in_f = 128, 128
    tensors[q + "weight"] = ("U8", rng.integers(0, 256, (out_f, in_f // 2), dtype=np.uint8))
    tensors[q + "weight_scale"] = ("F8_E4M3", _e4m3_encode_positive(rng.uniform(0.1, 2, (out_f, in_f // 16)).astype(np.float32)))
    tensors[q + "weight_scale_2"] = ("F32", np.array([0.02], np.float32))
    tensors[q + "input_scale"] = ("F32", np.array([1.0], np.float32))
    k = "model.layers.0.self_attn.k_proj."
    tensors[k + "weight"] = ("F8_E4M3", rng.integers(0, 0x7E, (64, 128), dtype=np.uint8))
    tensors[k + "weight_scale_inv"] = ("F32", np.array([[0.5]], np.float32))
    write_safetensors(d / "model.safetensors", tensors)
    ck = load_checkpoint(d)
    fm = ck.formats()
    assert fm["blk.0.attn_q"] == "NVFP4" and fm["blk.0.attn_k"] == "FP8_E4M3" and fm["blk.0.attn_v"] == "BF16"
    assert ck.tensors["blk.0.attn_q"].global_scale == pytest.approx(0.02)
    kq = ck.tensors["blk.0.attn_k"].dequantize()
    np.testing.assert_array_equal(kq, FP8_E4M3[tensors[k + "weight"][1]] * np.float32(0.5))


def test_missing_or_bad_model(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "nope.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + b"\0" * 100)
    with pytest.raises(ValueError):
        load_checkpoint(bad)


def test_summarize_formats_groups_layers_by_role_and_format():
    from bw24chat.loaders import summarize_formats

    formats = {"tok_embd": "BF16", "output": "Q8_0", "output_norm": "F32"}
    for i in range(6):
        formats[f"blk.{i}.attn_q"] = "NVFP4"
        formats[f"blk.{i}.ffn_down"] = "Q6_K" if i in (0, 1, 5) else "NVFP4"
    rows = summarize_formats(formats)
    assert ("tok_embd", "BF16", "-") in rows and ("output", "Q8_0", "-") in rows
    assert ("attn_q", "NVFP4", "0-5") in rows
    assert ("ffn_down", "Q6_K", "0-1,5") in rows and ("ffn_down", "NVFP4", "2-4") in rows
    assert len(rows) == 6


def test_info_command_on_the_real_model(smollm2_path, capsys):
    """`bw24chat info` on SmolLM2 Q4_1: every layer role listed with its ggml type."""
    import json

    from bw24chat.cli import main

    assert main(["info", "-m", str(smollm2_path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["arch"] == "llama" and d["parameters"] > 100e6
    rows = {(r["role"], r["format"]): r["layers"] for r in d["formats"]}
    assert rows[("attn_q", "Q4_1")] == "0-29"
    assert main(["info", "-m", str(smollm2_path)]) == 0
    assert "attn_q" in capsys.readouterr().out
