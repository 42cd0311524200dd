"""Hugging Face model directories: config.json, *.safetensors (sharded or not),
tokenizer.json / tokenizer_config.json, generation_config.json.

Weights: BF16 / F16 / F32; FP8 E4M3 with 128x128 block scales (``weight_scale_inv``,
DeepSeek-V3 / Qwen3-FP8 style); NVIDIA ModelOpt NVFP4 (``weight`` U8 [out, in/2] with element
2i in the low nibble, ``weight_scale`` F8_E4M3 [out, in/16], ``weight_scale_2`` F32 per-tensor
scale, ``input_scale`` F32 for FP4 activations, unused by weight-only paths), repacked into
ggml's NVFP4 block layout with the global scale kept beside it.

Safetensors are memory-mapped with a tiny reader of our own (format: 8-byte little-endian header
length, JSON header {name: {dtype, shape, data_offsets}}, raw data; huggingface/safetensors
README) because ``safetensors``' NumPy frontend has no bfloat16 or float8 dtype.
"""
from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import numpy as np

from ..tokenizer import load_hf_tokenizer
from .names import HF_MAP
from .tensor import ExpertTensor, QTensor

ARCH_FAMILY = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Glm4MoeForCausalLM": "glm4_moe",
    "MiniMaxM2ForCausalLM": "minimax_m2",
}

_ST_DTYPES = {"F32": (np.float32, "F32"), "F16": (np.float16, "F16"), "BF16": (np.uint16, "BF16"),
              "U8": (np.uint8, "U8"), "I8": (np.int8, "I8"), "F8_E4M3": (np.uint8, "F8_E4M3")}


class SafetensorsFile:
    """Memory-mapped safetensors file: ``header[name] = (dtype, shape)``, ``get(name)`` returns
    a read-only NumPy view into the map (BF16 as uint16, F8 as uint8)."""

    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        self.metadata = header.pop("__metadata__", {})
        self.header = header
        self._base = 8 + n
        self._map = np.memmap(path, dtype=np.uint8, mode="r")

    def get(self, name: str) -> tuple[np.ndarray, str]:
        h = self.header[name]
        if h["dtype"] not in _ST_DTYPES:
            raise ValueError(f"{self.path.name}: {name} has dtype {h['dtype']}, which bw24chat does not read")
        np_dtype, kind = _ST_DTYPES[h["dtype"]]
        a, b = h["data_offsets"]
        arr = self._map[self._base + a : self._base + b].view(np_dtype).reshape(h["shape"])
        return arr, kind


def write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]], metadata: dict | None = None) -> None:
    """Write a safetensors file: name -> (safetensors dtype, array whose bytes are stored as is)."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, (dtype, arr) in tensors.items():
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(h)))
        fh.write(h)
        for b in blobs:
            fh.write(b)


def _open_shards(model_dir: Path) -> dict[str, SafetensorsFile]:
    """tensor name -> the file holding it."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = {f: SafetensorsFile(model_dir / f) for f in sorted(set(weight_map.values()))}
        return {name: files[f] for name, f in weight_map.items()}
    shards = sorted(model_dir.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors files")
    out = {}
    for p in shards:
        f = SafetensorsFile(p)
        for name in f.header:
            out[name] = f
    return out


def _nvfp4_modelopt_to_ggml(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """ModelOpt NVFP4 -> ggml NVFP4 blocks.

    ModelOpt: packed[r, i] holds element 2i (low nibble) and 2i+1 (high); scales[r, g] is the
    E4M3 scale of elements 16g..16g+15.  ggml block_nvfp4 (64 values): 4 scale bytes, then per
    16-value group 8 bytes where byte j holds element j (low) and j+8 (high).  The scale bytes
    carry over unchanged: both are E4M3 with bias 7 (ggml halves them only to pair with its
    doubled E2M1 table)."""
    rows, half = packed.shape
    n = half * 2
    if n % 64:
        raise ValueError(f"NVFP4 rows of {n} values are not a multiple of 64 (ggml block size)")
    lo, hi = packed & 0x0F, packed >> 4
    codes = np.empty((rows, n), dtype=np.uint8)
    codes[:, 0::2], codes[:, 1::2] = lo, hi
    g = codes.reshape(rows, n // 16, 16)
    qs = (g[:, :, :8] | (g[:, :, 8:] << 4)).reshape(rows, n // 64, 32)
    sc = np.ascontiguousarray(scales).view(np.uint8).reshape(rows, n // 64, 4)
    return np.concatenate([sc, qs], axis=-1).reshape(rows, n // 64 * 36)


_EXPERT_PART = re.compile(r"^(blk\.\d+\.ffn_(?:gate|up|down)_exps)\.(\d+)$")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def stack_experts(tensors: dict[str, QTensor]) -> dict[str, QTensor | ExpertTensor]:
    """Per-expert tensors (blk.N.ffn_gate_exps.{j}) -> one ExpertTensor per projection, and
    transformers' fused (E, 2F, D) gate|up -> gate and up ExpertTensors of views (no copies)."""
    out, parts = {}, {}
    for name, t in tensors.items():
        m = _EXPERT_PART.match(name)
        if m:
            parts.setdefault(m.group(1), {})[int(m.group(2))] = t
        elif name.endswith(("ffn_gate_up_exps", "ffn_down_exps")) and len(t.shape) == 3:
            if t.fmt not in ("F32", "F16", "BF16"):
                raise ValueError(f"{name}: fused expert tensors in {t.fmt} are not supported")
            E, rows, _ = t.shape
            if name.endswith("ffn_down_exps"):
                out[name] = ExpertTensor.from_array(name, t.fmt, t.shape, t.raw)
                continue
            base = name[: -len("gate_up_exps")]
            for half, proj in enumerate(("gate", "up")):
                sub = t.raw[:, half * rows // 2:(half + 1) * rows // 2]
                out[f"{base}{proj}_exps"] = ExpertTensor.from_array(f"{base}{proj}_exps", t.fmt, sub.shape, sub)
        else:
            out[name] = t
    for name, by_id in parts.items():
        if sorted(by_id) != list(range(len(by_id))):
            raise ValueError(f"{name}: experts {sorted(set(range(max(by_id) + 1)) - set(by_id))[:5]} are missing")
        out[name] = ExpertTensor(name, [by_id[j] for j in range(len(by_id))])
    return out


def load_hf_dir(model_dir: Path):
    from . import Checkpoint

    cfg = json.loads((model_dir / "config.json").read_text())
    archs = cfg.get("architectures") or []
    fam = next((ARCH_FAMILY[a] for a in archs if a in ARCH_FAMILY), None)
    if fam is None:
        raise ValueError(f"{model_dir}: unsupported architecture {archs} (supported: {sorted(ARCH_FAMILY)})")
    cfg = dict(cfg, model_type=fam, rope_style="neox")
    gen_cfg = {}
    if (model_dir / "generation_config.json").exists():
        gen_cfg = json.loads((model_dir / "generation_config.json").read_text())

    where = _open_shards(model_dir)
    tensors: dict[str, QTensor] = {}
    consumed = set()
    for name in sorted(where):
        if name in consumed:
            continue
        m = _LAYER.match(name)
        if m and int(m.group(1)) >= cfg.get("num_hidden_layers", 1 << 30):
            continue  # the NextN / MTP layers appended after the trunk (GLM-4.5); not used yet
        canon = HF_MAP.canonical(name)
        if canon is None:
            if name.endswith(("weight_scale", "weight_scale_2", "input_scale", "weight_scale_inv")) or "rotary_emb" in name:
                continue
            raise ValueError(f"{model_dir.name}: tensor with no mapping: {name}")
        arr, kind = where[name].get(name)
        base = name[: -len("weight")] if name.endswith("weight") else None
        if kind == "U8" and base and (base + "weight_scale") in where:  # ModelOpt NVFP4
            sc, sc_kind = where[base + "weight_scale"].get(base + "weight_scale")
            g2, _ = where[base + "weight_scale_2"].get(base + "weight_scale_2")
            raw = _nvfp4_modelopt_to_ggml(arr, sc)
            tensors[canon] = QTensor(canon, "NVFP4", (arr.shape[0], arr.shape[1] * 2), raw, global_scale=float(np.asarray(g2, np.float32).reshape(-1)[0]))
            consumed |= {base + "weight_scale", base + "weight_scale_2", base + "input_scale"}
        elif kind == "F8_E4M3" and base and (base + "weight_scale_inv") in where:
            s, _ = where[base + "weight_scale_inv"].get(base + "weight_scale_inv")
            tensors[canon] = QTensor(canon, "FP8_E4M3", tuple(arr.shape), arr, scale=np.asarray(s, np.float32))
            consumed.add(base + "weight_scale_inv")
        elif kind in ("F32", "F16", "BF16"):
            tensors[canon] = QTensor(canon, kind, tuple(arr.shape), arr)
        else:
            raise ValueError(f"{model_dir.name}: {name}: unsupported dtype/layout {kind}")
    tensors = stack_experts(tensors)
    if "output" not in tensors:
        cfg["tie_word_embeddings"] = True
    elif "tie_word_embeddings" not in cfg:
        cfg["tie_word_embeddings"] = False
    tok = load_hf_tokenizer(model_dir, gen_cfg)
    return Checkpoint(
        path=model_dir,
        source="hf",
        name=model_dir.name,
        config=cfg,
        tensors=tensors,
        tokenizer=tok,
        generation_config=gen_cfg,
        _keepalive=where,
    )
