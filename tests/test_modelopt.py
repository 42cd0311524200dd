"""A ModelOpt-layout NVFP4 checkpoint (written by bw24chat.modelopt_export after the published
layout) loads through the safetensors loader, keeps lm_head/embeddings/norms unquantized, reports
per-layer formats, and gives the same logits as its dequantized float32 twin."""
import json

import numpy as np

from bw24chat.backends.numpy_backend import numpy_runner
from bw24chat.loaders import load_checkpoint
from bw24chat.loaders.hf_loader import SafetensorsFile
from bw24chat.modelopt_export import dequantized_twin, export_modelopt_nvfp4
from tests.model_factory import make_hf_dir


def test_modelopt_nvfp4_checkpoint_matches_its_dequantized_twin(tmp_path):
    src, _ = make_hf_dir(tmp_path / "bf16", "qwen3", "BF16", hidden_size=128, intermediate_size=192, head_dim=32)
    q = export_modelopt_nvfp4(src, tmp_path / "nvfp4")
    # the published layout: names, dtypes, shapes
    f = SafetensorsFile(q / "model.safetensors")
    h = f.header
    w = "model.layers.0.mlp.down_proj."
    assert h[w + "weight"]["dtype"] == "U8" and h[w + "weight"]["shape"] == [128, 96]
    assert h[w + "weight_scale"]["dtype"] == "F8_E4M3" and h[w + "weight_scale"]["shape"] == [128, 12]
    assert h[w + "weight_scale_2"]["dtype"] == "F32" and h[w + "weight_scale_2"]["shape"] == []
    assert h[w + "input_scale"]["dtype"] == "F32"
    assert h["lm_head.weight"]["dtype"] == "BF16" and h["model.embed_tokens.weight"]["dtype"] == "BF16"
    assert json.loads((q / "hf_quant_config.json").read_text())["quantization"]["quant_algo"] == "NVFP4"
    del f
    ck = load_checkpoint(q)
    fm = ck.formats()
    assert fm["blk.0.ffn_down"] == "NVFP4" and fm["blk.1.attn_q"] == "NVFP4"
    assert fm["output"] == "BF16" and fm["tok_embd"] == "BF16" and fm["blk.0.attn_norm"] == "F32"
    assert all(ck.tensors[n].global_scale != 1.0 for n in ck.tensors if fm[n] == "NVFP4")
    twin = load_checkpoint(dequantized_twin(q, tmp_path / "twin"))
    ids = np.random.default_rng().integers(0, ck.config["vocab_size"], 19)
    la = numpy_runner(ck).prefill_logits(ids, 0)
    lb = numpy_runner(twin).prefill_logits(ids, 0)
    np.testing.assert_array_equal(la, lb)  # the same float32 weights: the same float32 logits
    # and the NVFP4 model stays close to the BF16 original it was quantized from
    base = load_checkpoint(src)
    lc = numpy_runner(base).prefill_logits(ids, 0)
    assert np.linalg.norm(la - lc) / np.linalg.norm(lc) < 0.5  # 4-bit weights: ~10 % weight error


def test_forgetting_the_global_scale_would_be_caught(tmp_path):
    """Dropping weight_scale_2 does not blow up (RMSNorm renormalizes every block, which is why
    the mistake "still works"), but the logits move far more than NVFP4 rounding does: the
    end-to-end comparison catches it (the engine notes' pitfall)."""
    src, _ = make_hf_dir(tmp_path / "bf16", "llama", "BF16", hidden_size=128, intermediate_size=128, head_dim=32)
    q = export_modelopt_nvfp4(src, tmp_path / "nvfp4")
    ck = load_checkpoint(q)
    ids = np.arange(5)
    good = numpy_runner(ck).forward(ids, 0)
    for t in ck.tensors.values():
        if t.fmt == "NVFP4":
            t.global_scale = 1.0
    with np.errstate(all="ignore"):
        bad = numpy_runner(ck).forward(ids, 0)
    with np.errstate(all="ignore"):
        assert not np.isfinite(bad).all() or np.linalg.norm(bad - good) / np.linalg.norm(good) > 0.5
