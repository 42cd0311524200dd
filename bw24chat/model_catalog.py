"""Models on this machine: the Hugging Face cache, bw24chat's own models folder, recent paths.

Each model is described from its metadata without loading weights: the GGUF header (read
with ``loaders.gguf_reader.GGUFFile``, which memory-maps the file and touches only the header pages) or a
Hugging Face folder's ``config.json``.  The VRAM figure is an estimate to tell at a glance
whether a model fits, not a promise: weights as stored, plus the KV cache of
``ESTIMATE_CTX`` tokens in bf16, plus a fixed allowance for activations and workspace.
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .config import atomic_write_text
from .loaders import draft_head
from .hub import quant_of, split_gguf_name
from .paths import cache_dir, models_dir

ESTIMATE_CTX = 4096
_WORKSPACE_BYTES = 256 * 2**20
_KV_BYTES_PER_VALUE = 2  # bf16
SOURCES = ("models", "hf-cache", "recent", "manual")


@dataclass
class ModelShape:
    """What the KV-cache estimate needs."""

    n_layers: int
    n_kv_heads: int
    head_dim: int


@dataclass
class LocalModel:
    name: str
    path: Path
    source: str  # one of SOURCES
    location: str  # a short form of the path for display ("models/...", a repo id, "~/...")
    fmt: str  # "gguf" | "safetensors"
    arch: str | None = None
    quant: str | None = None
    size: int = 0  # bytes on disk
    n_ctx_train: int | None = None
    vram_needed: int | None = None  # bytes (estimate)
    moe: dict | None = None  # expert_tiers.MoELayout's fields, for an MoE model's tier plan (moe_fit)
    error: str | None = None  # metadata that could not be read
    # a multi-token-prediction head for --spec mtp: "shipped" (NextN layers in the model's own
    # files), "trained" (a bw24chat train-draft head beside it: loaders/draft_head.py), or None
    draft_head: str | None = None

    @property
    def spec(self) -> str:
        """What to hand to the engine as ``options.model``."""
        return str(self.path)


@dataclass
class GpuMemory:
    name: str
    free: int
    total: int


# ----------------------------------------------------------------------------- GPU
def gpu_memory() -> GpuMemory | None:
    """Free and total memory of GPU 0, through pynvml or else CuPy; None without a GPU."""
    for probe in (_nvml_memory, _cupy_memory):
        try:
            found = probe()
        except Exception:  # noqa: BLE001 - a missing driver or library just means "no GPU"
            found = None
        if found is not None:
            return found
    return None


def _nvml_memory() -> GpuMemory | None:
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        name = pynvml.nvmlDeviceGetName(handle)
        return GpuMemory(name.decode() if isinstance(name, bytes) else name, int(info.free), int(info.total))
    finally:
        pynvml.nvmlShutdown()


def _cupy_memory() -> GpuMemory | None:
    import cupy

    free, total = cupy.cuda.runtime.memGetInfo()
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    return GpuMemory(name.decode() if isinstance(name, bytes) else name, int(free), int(total))


# ----------------------------------------------------------------------------- estimate
def estimate_vram(weights_bytes: int, shape: ModelShape | None, n_ctx_train: int | None) -> int:
    ctx = min(n_ctx_train or ESTIMATE_CTX, ESTIMATE_CTX)
    return weights_bytes + kv_per_token(shape) * ctx + _WORKSPACE_BYTES


# ----------------------------------------------------------------------------- describe
class _DescriptionCache:
    """Descriptions by (path, size, mtime), kept in ``cache_dir()/model_catalog.json``:
    reading every header field (a 100k-entry vocabulary included) takes a noticeable time per
    file, so a model is read once, not at every visit of the model manager."""

    def __init__(self) -> None:
        self._entries: dict[str, dict] | None = None
        self._dirty = False

    @staticmethod
    def _path() -> Path:
        return cache_dir() / "model_catalog.json"

    VERSION = 2  # of what describe_model reads: a description by an earlier one is read again (2: MoE layouts)

    @classmethod
    def key(cls, path: Path) -> str:
        stat = path.stat()
        return f"v{cls.VERSION}|{path}|{stat.st_size}|{stat.st_mtime_ns}"

    def _load(self) -> dict[str, dict]:
        if self._entries is None:
            try:
                self._entries = json.loads(self._path().read_text())
            except (OSError, ValueError):
                self._entries = {}
        return self._entries

    def get(self, key: str) -> LocalModel | None:
        entry = self._load().get(key)
        if entry is None:
            return None
        try:
            return LocalModel(**{**entry, "path": Path(entry["path"])})
        except TypeError:  # written by another version of LocalModel
            return None

    def put(self, key: str, model: LocalModel) -> None:
        entries = self._load()
        for old in [k for k in entries if not k.startswith(f"v{self.VERSION}|")]:  # an earlier version's
            del entries[old]
        entries[key] = {**dataclasses.asdict(model), "path": str(model.path)}
        self._dirty = True

    def save(self) -> None:
        if self._dirty:
            atomic_write_text(self._path(), json.dumps(self._entries))
            self._dirty = False


_described = _DescriptionCache()


def describe_model(path: Path, source: str = "manual", location: str | None = None) -> LocalModel:
    """A GGUF file (first shard for a split one) or a Hugging Face folder, described."""
    path = Path(path)
    location = location or _short_path(path)
    key = _described.key(path)
    cached = _described.get(key)
    if cached is not None:
        return dataclasses.replace(cached, source=source, location=location)
    model = LocalModel(name=path.name, path=path, source=source, location=location, fmt="gguf" if path.is_file() else "safetensors")
    try:
        if path.is_file():
            _describe_gguf(model)
        else:
            _describe_hf_folder(model)
    except Exception as exc:  # noqa: BLE001 - a broken file is listed with its error, not hidden
        model.error = f"{type(exc).__name__}: {exc}"
    _described.put(key, model)
    return model


def _describe_gguf(model: LocalModel) -> None:
    from gguf import LlamaFileType

    from .loaders.gguf_reader import GGUFFile  # bounds-checked: a hostile file in a folder cannot hang the listing

    shards = _gguf_shards(model.path)
    model.size = sum(p.stat().st_size for p in shards)
    gf = GGUFFile(model.path)
    value = gf.fields.get
    arch = value("general.architecture")
    model.arch = arch
    model.name = value("general.name") or model.path.name
    file_type = value("general.file_type")
    if file_type is not None:
        model.quant = LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    elif gf.tensors:  # the tensor type holding the most bytes
        by_bytes = Counter()
        for t in gf.tensors:
            by_bytes[t.ggml_type.name] += t.nbytes
        model.quant = by_bytes.most_common(1)[0][0]
    else:
        model.quant = quant_of(model.path.name)
    model.n_ctx_train = value(f"{arch}.context_length")
    if value(f"{arch}.nextn_predict_layers"):
        model.draft_head = "shipped"
    n_layers = value(f"{arch}.block_count")
    n_heads = value(f"{arch}.attention.head_count")
    n_kv = value(f"{arch}.attention.head_count_kv") or n_heads
    head_dim = value(f"{arch}.attention.key_length")
    if head_dim is None and n_heads:
        embd = value(f"{arch}.embedding_length")
        head_dim = embd // n_heads if embd else None
    shape = ModelShape(int(n_layers), int(n_kv), int(head_dim)) if n_layers and n_kv and head_dim else None
    model.vram_needed = estimate_vram(model.size, shape, model.n_ctx_train)
    _describe_moe(model, gf, value(f"{arch}.expert_used_count"), value(f"{arch}.vocab_size"), shape)


def _describe_moe(model: LocalModel, gf, top_k, vocab, shape: ModelShape | None) -> None:
    """An MoE GGUF's expert layout from its tensor table (split files get none: only the first
    shard's table is read here)."""
    from .backends.expert_tiers import layout_from_tensors

    experts = [(t.name, t.shape[0], t.nbytes) for t in gf.tensors if t.name.removesuffix(".weight").endswith("_exps")]
    if not experts or not top_k or split_gguf_name(model.path.name):
        return
    emb = next((t for t in gf.tensors if t.name == "token_embd.weight"), None)
    tied = not any(t.name == "output.weight" for t in gf.tensors)
    layout = layout_from_tensors(experts, sum(t.nbytes for t in gf.tensors), int(top_k), emb.nbytes if emb else 0,
                                 int(vocab or (emb.shape[0] if emb else 1)), tied)
    model.moe = {**dataclasses.asdict(layout), "kv_per_token": kv_per_token(shape)}


def kv_per_token(shape: ModelShape | None) -> int:
    return 2 * shape.n_layers * shape.n_kv_heads * shape.head_dim * _KV_BYTES_PER_VALUE if shape else 0


def moe_fit(model: LocalModel, free_vram: int, vram_budget_gb: float = 0.0, host_budget_gb: float | None = None) -> list[str]:
    """For an MoE model: where its experts land at the budgets and the decode speed to expect
    (expert_tiers.describe_plan), or why it does not fit; [] for a dense one."""
    from .backends import expert_tiers as et

    if not model.moe:
        return []
    m = dict(model.moe)
    kv = m.pop("kv_per_token") * min(model.n_ctx_train or ESTIMATE_CTX, ESTIMATE_CTX)
    layout = et.MoELayout(**{k: tuple(v) if isinstance(v, list) else v for k, v in m.items()})
    try:
        return et.describe_plan(layout, et.plan_for(layout, free_vram, vram_budget_gb, host_budget_gb, kv))
    except et.DoesNotFit as exc:
        return [str(exc)]


def _gguf_shards(first: Path) -> list[Path]:
    """All parts of a split GGUF ("x-00001-of-00003.gguf") found next to the first, or the file."""
    shard = split_gguf_name(first.name)
    if shard is None:
        return [first]
    stem, _, count = shard
    parts = [first.with_name(f"{stem}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    return [p for p in parts if p.exists()]


def _describe_hf_folder(model: LocalModel) -> None:
    config = json.loads((model.path / "config.json").read_text())
    text = config.get("text_config", config)  # multimodal configs nest the language model's
    model.arch = config.get("model_type") or (config.get("architectures") or [None])[0]
    model.size = sum(p.stat().st_size for p in model.path.glob("*.safetensors") if p.name != draft_head.FOLDER_FILE)
    if text.get("num_nextn_predict_layers"):
        model.draft_head = "shipped"
    quant = (config.get("quantization_config") or {}).get("quant_method")
    dtype = config.get("torch_dtype") or config.get("dtype") or text.get("torch_dtype")
    model.quant = (quant or {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}.get(str(dtype), dtype)) or None
    model.n_ctx_train = text.get("max_position_embeddings")
    n_heads = text.get("num_attention_heads")
    n_kv = text.get("num_key_value_heads") or n_heads
    head_dim = text.get("head_dim") or (text["hidden_size"] // n_heads if n_heads and text.get("hidden_size") else None)
    n_layers = text.get("num_hidden_layers")
    shape = ModelShape(n_layers, n_kv, head_dim) if n_layers and n_kv and head_dim else None
    model.vram_needed = estimate_vram(model.size, shape, model.n_ctx_train)


def is_hf_folder(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def _is_first_gguf(path: Path) -> bool:
    shard = split_gguf_name(path.name)
    return path.suffix == ".gguf" and (shard is None or shard[1] == 1)


def _short_path(path: Path) -> str:
    home = str(Path.home())
    text = str(path)
    return "~" + text[len(home):] if text.startswith(home + os.sep) else text


# ----------------------------------------------------------------------------- listing
def _models_folder(root: Path) -> list[LocalModel]:
    found = []
    for path in sorted(root.rglob("*")):
        if (path.is_file() and _is_first_gguf(path)) or (path.is_dir() and is_hf_folder(path)):
            found.append(describe_model(path, "models", "models/" + path.relative_to(root).as_posix()))
    return found


def _hf_cache(cache_dir: Path | None) -> list[LocalModel]:
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    cache_dir = cache_dir or Path(os.environ.get("HF_HUB_CACHE") or _default_hf_cache())
    try:
        info = scan_cache_dir(cache_dir)
    except CacheNotFound:
        return []
    found = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        revision = max(repo.revisions, key=lambda r: r.last_modified)  # the newest snapshot
        snapshot = revision.snapshot_path
        for file in sorted(revision.files, key=lambda f: f.file_name):
            if _is_first_gguf(file.file_path):
                rel = file.file_path.relative_to(snapshot).as_posix()
                found.append(describe_model(file.file_path, "hf-cache", f"{repo.repo_id}/{rel}"))
        if is_hf_folder(snapshot):
            found.append(describe_model(snapshot, "hf-cache", repo.repo_id))
    return found


def _default_hf_cache() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def list_local_models(recent: list[str] | tuple[str, ...] = (), hf_cache: Path | None = None) -> list[LocalModel]:
    """Every model found, without duplicates (the first place a file is found wins)."""
    models = _models_folder(models_dir()) + _hf_cache(hf_cache)
    for spec in recent:
        path = Path(spec).expanduser()
        if path.is_file() or (path.is_dir() and is_hf_folder(path)):
            models.append(describe_model(path, "recent"))
    _described.save()
    seen: set[Path] = set()
    unique = []
    for model in models:
        key = model.path.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(model)
            if model.draft_head is None and draft_head.head_path(model.path).is_file():  # looked up at each listing
                model.draft_head = "trained"
    return unique
