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
import math
import re
import struct
from pathlib import Path

import numpy as np

from ..tokenizer import load_hf_tokenizer
from .errors import PICKLE_SUFFIXES, ModelFileError, refuse_pickle
from .names import HF_MAP, qwen_mtp_name
from .checks import split_nextn
from .layouts import HF_LAYOUTS
from .tensor import ExpertTensor, QTensor

ARCH_FAMILY = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Qwen3NextForCausalLM": "qwen3_next",
    "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",  # the text model of the multimodal checkpoints
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe",
    "Glm4MoeForCausalLM": "glm4_moe",
    "MiniMaxM2ForCausalLM": "minimax_m2",
}

_ST_DTYPES = {"F32": (np.float32, "F32"), "F16": (np.float16, "F16"), "BF16": (np.uint16, "BF16"),
              "U8": (np.uint8, "U8"), "I8": (np.int8, "I8"), "I32": (np.int32, "I32"), "F8_E4M3": (np.uint8, "F8_E4M3")}
# bytes per element of every safetensors dtype (safetensors/src/tensor.rs Dtype), to check the
# offsets of tensors bw24chat does not read as well as of those it does
_ST_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
                "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8}
MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit on the JSON header


def read_json(path: Path, what: str = "") -> dict:
    """A JSON object from a model folder's file, or a ModelFileError naming it."""
    try:
        data = json.loads(path.read_bytes())
    except OSError as exc:
        raise ModelFileError(path, f"cannot be read: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ModelFileError(path, f"not valid JSON ({exc})", what) from None
    if not isinstance(data, dict):
        raise ModelFileError(path, f"expected a JSON object, found {type(data).__name__}", what)
    return data


class SafetensorsFile:
    """Memory-mapped safetensors file: ``header[name] = {dtype, shape, data_offsets}``, checked
    against the file size on open; ``get(name)`` returns a read-only NumPy view into the map
    (BF16 as uint16, F8 as uint8)."""

    def __init__(self, path: Path):
        self.path = path
        try:
            size = path.stat().st_size
            with open(path, "rb") as fh:
                prefix = fh.read(8)
                if len(prefix) < 8:
                    raise ModelFileError(path, f"the file is {size} bytes, too short for a safetensors header")
                (n,) = struct.unpack("<Q", prefix)
                if n > min(size - 8, MAX_HEADER_BYTES):
                    raise ModelFileError(path, f"declares a {n}-byte header, but the file is {size} bytes"
                                               f"{' (limit 100 MB)' if n > MAX_HEADER_BYTES else ''}: it is truncated or not safetensors",
                                         "header length")
                raw = fh.read(n)
        except OSError as exc:
            raise ModelFileError(path, f"cannot be read: {exc.strerror or exc}") from None
        try:
            header = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise ModelFileError(path, f"not valid JSON ({exc})", "header") from None
        if not isinstance(header, dict):
            raise ModelFileError(path, f"expected a JSON object, found {type(header).__name__}", "header")
        meta = header.pop("__metadata__", {})
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise ModelFileError(path, "must map names to strings", "__metadata__")
        self.metadata = meta
        self.header = header
        self._base = 8 + n
        self._check_entries(size - self._base)
        self._map = np.memmap(path, dtype=np.uint8, mode="r")

    def _check_entries(self, data_bytes: int) -> None:
        """Each entry's dtype, shape and offsets agree with each other and with the data's length
        (safetensors format: offsets relative to the byte after the header, [begin, end))."""
        spans = []
        for name, h in self.header.items():
            where = f"tensor {name}"
            if not isinstance(h, dict):
                raise ModelFileError(self.path, "its header entry is not an object", where)
            dtype, shape, offsets = h.get("dtype"), h.get("shape"), h.get("data_offsets")
            if dtype not in _ST_ITEMSIZE:
                raise ModelFileError(self.path, f"unknown dtype {dtype!r}", where)
            if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
                raise ModelFileError(self.path, f"shape {shape!r} is not a list of sizes", where)
            if not (isinstance(offsets, list) and len(offsets) == 2
                    and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
                raise ModelFileError(self.path, f"data_offsets {offsets!r} is not [begin, end]", where)
            a, b = offsets
            need = math.prod(shape) * _ST_ITEMSIZE[dtype]
            if not 0 <= a <= b or b - a != need:
                raise ModelFileError(self.path, f"data_offsets [{a}, {b}] do not hold {dtype} {shape} ({need} bytes)", where)
            if b > data_bytes:
                raise ModelFileError(self.path, f"the data ends at byte {data_bytes} of the data section, but the tensor "
                                                f"needs bytes {a}-{b}: the file is truncated (an incomplete download?)", where)
            spans.append((a, b, name))
        spans.sort()
        for (a0, b0, n0), (a1, b1, n1) in zip(spans, spans[1:]):
            if a1 < b0:
                raise ModelFileError(self.path, f"its data (bytes {a1}-{b1}) overlaps tensor {n0} (bytes {a0}-{b0})", f"tensor {n1}")

    def get(self, name: str) -> tuple[np.ndarray, str]:
        h = self.header[name]
        if h["dtype"] not in _ST_DTYPES:
            raise ModelFileError(self.path, f"dtype {h['dtype']}, which bw24chat does not read", f"tensor {name}")
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
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ModelFileError(index, "must map tensor names to file names", "weight_map")
        for f in set(weight_map.values()):
            # a shard is a file of this folder: no separators, no "..", nothing absolute
            if Path(f).name != f or f in (".", "..") or "\\" in f:
                raise ModelFileError(index, f"names {f!r}, which is not a file of the model folder", "weight_map")
            if not (model_dir / f).is_file():
                raise ModelFileError(index, f"names {f!r}, which is missing from the folder", "weight_map")
        files = {f: SafetensorsFile(model_dir / f) for f in sorted(set(weight_map.values()))}
        for name, f in weight_map.items():
            if name not in files[f].header:
                raise ModelFileError(model_dir / f, "the index says it is here, but it is not", f"tensor {name}")
        return {name: files[f] for name, f in weight_map.items()}
    from .draft_head import FOLDER_FILE  # a trained draft head kept in the folder, not a weight shard

    shards = sorted(p for p in model_dir.glob("*.safetensors") if p.name != FOLDER_FILE)
    if not shards:
        pickles = sorted(p.name for p in model_dir.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
        if pickles:
            raise refuse_pickle(model_dir / pickles[0])
        raise ModelFileError(model_dir, "no *.safetensors files")
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


def stack_experts(tensors: dict[str, QTensor], model_dir: Path) -> dict[str, QTensor | ExpertTensor]:
    """Per-expert tensors (blk.N.ffn_gate_exps.{j}) -> one ExpertTensor per projection, and
    transformers' fused (E, 2F, D) gate|up -> gate and up ExpertTensors of views (no copies)."""
    out, parts = {}, {}
    for name, t in tensors.items():
        m = _EXPERT_PART.match(name)
        if m:
            parts.setdefault(m.group(1), {})[int(m.group(2))] = t
        elif name.endswith(("ffn_gate_up_exps", "ffn_down_exps")) and len(t.shape) == 3:
            if t.fmt not in ("F32", "F16", "BF16"):
                raise ModelFileError(model_dir, f"fused expert tensors in {t.fmt} are not supported", f"tensor {name}")
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
            raise ModelFileError(model_dir, f"experts {sorted(set(range(max(by_id) + 1)) - set(by_id))[:5]} are missing", name)
        out[name] = ExpertTensor(name, [by_id[j] for j in range(len(by_id))])
    return out


def _scale_tensor(where: dict, weight: str, name: str, shape: tuple[int, ...] | None) -> np.ndarray:
    """The scale tensor ``name`` (FP8 block scales, NVFP4 group scales) of quantized tensor
    ``weight``, of ``shape`` (None: any)."""
    if name not in where:
        raise ModelFileError(where[weight].path, f"missing: the quantized {weight} needs it", f"tensor {name}")
    arr, _ = where[name].get(name)
    if shape is not None and tuple(arr.shape) != shape:
        raise ModelFileError(where[name].path, f"shape {list(arr.shape)}, but its weight implies {list(shape)}", f"tensor {name}")
    return arr


def _tokenizer(model_dir: Path, gen_cfg: dict):
    tk_path, cfg_path = model_dir / "tokenizer.json", model_dir / "tokenizer_config.json"
    if not tk_path.is_file():
        raise ModelFileError(model_dir, "no tokenizer.json (bw24chat reads the fast-tokenizer format)")
    cfg = read_json(cfg_path) if cfg_path.exists() else {}
    template = cfg.get("chat_template")
    if not (template is None or isinstance(template, str) or (
            isinstance(template, list) and template and all(isinstance(t, dict) and isinstance(t.get("template"), str) for t in template))):
        raise ModelFileError(cfg_path, "neither a template nor a list of named templates", "chat_template")
    try:
        return load_hf_tokenizer(model_dir, gen_cfg, cfg)
    except Exception as exc:  # noqa: BLE001 - the tokenizers library reports bad files in many ways
        read_json(tk_path)  # broken JSON: named by line and column rather than by the library's message
        raise ModelFileError(tk_path, f"the tokenizer cannot be built: {exc}") from None


def _text_name(name: str) -> str | None:
    """A multimodal checkpoint's tensor name as its text model's (transformers
    Qwen3_5ForConditionalGeneration: the language model under model.language_model.*, its MTP
    head under mtp.* or model.mtp.*), or None for the vision tower (model.visual.*), which
    bw24chat does not run."""
    if name.startswith("model.visual."):
        return None
    for old, new in (("model.language_model.", "model."), ("model.mtp.", "mtp.")):
        if name.startswith(old):
            return new + name[len(old):]
    return name


def load_hf_dir(model_dir: Path):
    from . import Checkpoint

    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ModelFileError(model_dir, "a model folder without config.json")
    cfg = read_json(config_path)
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list):
        raise ModelFileError(config_path, f"{archs!r} is not a list of class names", "architectures")
    fam = next((ARCH_FAMILY[a] for a in archs if isinstance(a, str) and a in ARCH_FAMILY), None)
    if fam is None:
        raise ModelFileError(config_path, f"{archs} is not supported (supported: {sorted(ARCH_FAMILY)})", "architectures")
    multimodal = any(isinstance(a, str) and a.endswith("ForConditionalGeneration") for a in archs)
    if multimodal:
        text_cfg = cfg.get("text_config")
        if not isinstance(text_cfg, dict):
            raise ModelFileError(config_path, "a multimodal model's config needs its text model's settings", "text_config")
        cfg = {**cfg, **text_cfg}
    cfg = dict(cfg, model_type=fam, rope_style="neox")
    gen_cfg = {}
    if (model_dir / "generation_config.json").exists():
        gen_cfg = read_json(model_dir / "generation_config.json")

    where = _open_shards(model_dir)
    tensors: dict[str, QTensor] = {}
    consumed, mtp_layers = set(), set()
    for name in sorted(where):
        if name in consumed:
            continue
        text = _text_name(name) if multimodal else name
        if text is None:  # the vision tower
            continue
        if text.startswith("mtp.") and isinstance(cfg.get("num_hidden_layers"), int):  # Qwen3-Next / Qwen3.5 MTP head
            text = qwen_mtp_name(text, cfg["num_hidden_layers"]) or text
            mtp_layers.add(int(text.split(".")[2]) if text.startswith("model.layers.") else -1)
        canon = HF_MAP.canonical(text)
        if canon is None:
            if name.endswith(("weight_scale", "weight_scale_2", "input_scale", "weight_scale_inv")) or "rotary_emb" in name:
                continue
            raise ModelFileError(where[name].path, "bw24chat has no use for it (not a tensor of the supported families)", f"tensor {name}")
        arr, kind = where[name].get(name)
        base = name[: -len("weight")] if name.endswith("weight") else None
        if kind in ("U8", "F8_E4M3") and arr.ndim != 2:
            raise ModelFileError(where[name].path, f"a quantized weight of shape {list(arr.shape)} (expected 2 dimensions)", f"tensor {name}")
        if kind == "U8" and base and (base + "weight_scale") in where:  # ModelOpt NVFP4
            rows, n = arr.shape[0], arr.shape[1] * 2
            if n % 64:
                raise ModelFileError(where[name].path, f"NVFP4 rows of {n} values, not a multiple of 64", f"tensor {name}")
            sc = _scale_tensor(where, name, base + "weight_scale", (rows, n // 16))
            g2 = _scale_tensor(where, name, base + "weight_scale_2", None)
            if g2.size != 1:
                raise ModelFileError(where[base + "weight_scale_2"].path, f"shape {list(g2.shape)}, but a global scale "
                                     "is one number", f"tensor {base}weight_scale_2")
            raw = _nvfp4_modelopt_to_ggml(arr, sc)
            tensors[canon] = QTensor(canon, "NVFP4", (rows, n), raw, global_scale=float(np.asarray(g2, np.float32).reshape(-1)[0]))
            consumed |= {base + "weight_scale", base + "weight_scale_2", base + "input_scale"}
        elif kind == "F8_E4M3" and base and (base + "weight_scale_inv") in where:
            blocks = tuple(-(-d // 128) for d in arr.shape)
            s = _scale_tensor(where, name, base + "weight_scale_inv", blocks)
            tensors[canon] = QTensor(canon, "FP8_E4M3", tuple(arr.shape), arr, scale=np.asarray(s, np.float32))
            consumed.add(base + "weight_scale_inv")
        elif kind in ("F32", "F16", "BF16"):
            tensors[canon] = QTensor(canon, kind, tuple(arr.shape), arr)
        else:
            raise ModelFileError(where[name].path, f"{kind} without the scales that would say how to read it", f"tensor {name}")
    tensors = stack_experts(tensors, model_dir)
    if mtp_layers:  # the MTP head's layers follow the trunk's, as NextN layers (loaders.checks.split_nextn)
        cfg["num_nextn_predict_layers"] = max(mtp_layers) + 1 - cfg["num_hidden_layers"]
    if fam in HF_LAYOUTS:  # a family's checkpoint layout -> the canonical one
        tensors = HF_LAYOUTS[fam](tensors, cfg, model_dir)
    tensors, mtp = split_nextn(tensors, cfg)
    if "output" not in tensors:
        cfg["tie_word_embeddings"] = True
    elif "tie_word_embeddings" not in cfg:
        cfg["tie_word_embeddings"] = False
    tok = _tokenizer(model_dir, gen_cfg)
    return Checkpoint(
        path=model_dir,
        source="hf",
        name=model_dir.name,
        config=cfg,
        tensors=tensors,
        tokenizer=tok,
        generation_config=gen_cfg,
        mtp=mtp,
        config_fields={k: f"config.json: {k}" for k in cfg},
        _keepalive=where,
    )
