"""Write an NVIDIA ModelOpt NVFP4 checkpoint (HF layout) from a Hugging Face model directory.

The layout follows what ModelOpt's HF export writes, as published NVFP4 checkpoints show it
(nvidia/DeepSeek-R1-NVFP4 hf_quant_config.json: producer "modelopt", quant_algo "NVFP4",
group_size 16, exclude_modules; the packing as NVIDIA NeMo AutoModel's nvfp4 module documents
it: two E2M1 codes per uint8, the even column in the low nibble, one float8_e4m3fn scale per 16
columns in ``weight_scale``, one float32 per tensor in ``weight_scale_2``):

    <proj>.weight          U8       [out, in/2]
    <proj>.weight_scale    F8_E4M3  [out, in/16]
    <proj>.weight_scale_2  F32      []            value = e2m1 * e4m3 * weight_scale_2
    <proj>.input_scale     F32      []            (FP4-activation scale; 1.0 here, weight-only)

Linear projections of every decoder layer are quantized; embeddings, norms and ``lm_head``
(listed in exclude_modules) stay as they were.  Used to test the loader end to end without the
nvidia-modelopt package (which needs a GPU and PyTorch).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from .loaders.hf_loader import SafetensorsFile, _open_shards, write_safetensors
from .loaders.tensor import QTensor
from .quantize import nvfp4_encode

_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_ST = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def export_modelopt_nvfp4(src: Path, dst: Path) -> Path:
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    where = _open_shards(src)
    out: dict[str, tuple[str, np.ndarray]] = {}
    for name in sorted(where):
        arr, kind = where[name].get(name)
        is_proj = name.endswith(".weight") and any(f".{p}." in name for p in _PROJ) and name.startswith("model.layers.")
        if not is_proj:
            out[name] = (kind, np.asarray(arr))
            continue
        w = QTensor(name, kind, tuple(arr.shape), arr).dequantize()
        packed, sc, g = nvfp4_encode(w, name)
        base = name[: -len("weight")]
        out[name] = ("U8", packed)
        out[base + "weight_scale"] = ("F8_E4M3", sc)
        out[base + "weight_scale_2"] = ("F32", np.asarray(g, np.float32).reshape(()))
        out[base + "input_scale"] = ("F32", np.asarray(1.0, np.float32).reshape(()))
    write_safetensors(dst / "model.safetensors", out, {"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    qcfg = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}
    cfg["quantization_config"] = qcfg
    (dst / "config.json").write_text(json.dumps(cfg, indent=1))
    (dst / "hf_quant_config.json").write_text(json.dumps(
        {"producer": {"name": "modelopt", "version": "bw24chat-export"},
         "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16, "exclude_modules": ["lm_head"]}},
        indent=1))
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
        if (src / f).exists():
            shutil.copyfile(src / f, dst / f)
    return dst


def dequantized_twin(src: Path, dst: Path) -> Path:
    """The same model with every tensor stored as the float32 values our loader decodes from
    ``src`` (the "dequantized twin" an NVFP4 checkpoint must match)."""
    from .loaders import load_checkpoint
    from .loaders.names import HF_NAMES

    ck = load_checkpoint(src)
    inverse = {}
    for hf, canon in HF_NAMES.items():
        inverse[canon] = hf
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    out = {}
    for canon, t in ck.tensors.items():
        layer = None
        key = canon
        if canon.startswith("blk."):
            layer, rest = canon[4:].split(".", 1)
            key = "blk.{i}." + rest
        hf = inverse[key].format(i=layer) if layer is not None else inverse[key]
        out[hf] = ("F32", t.dequantize())
    write_safetensors(dst / "model.safetensors", out)
    cfg = json.loads((Path(src) / "config.json").read_text())
    cfg.pop("quantization_config", None)
    (dst / "config.json").write_text(json.dumps(cfg))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if (Path(src) / f).exists():
            shutil.copyfile(Path(src) / f, dst / f)
    return dst


__all__ = ["export_modelopt_nvfp4", "dequantized_twin", "SafetensorsFile"]
