"""Trained draft heads: a NextN / MTP head (models/mtp.py) trained for a model that ships none
(``bw24chat train-draft``), kept in a small safetensors file of its own.

The file holds one NextN layer under the canonical names (names.py: ``blk.{N}.nextn.eh_proj``,
``.enorm``, ``.hnorm``, ``.shared_head_norm`` and the decoder layer's ``blk.{N}.attn_q`` ...,
N = the trunk's layer count; the embedding and LM head are the trunk's), optionally
``blk.{N}.nextn.draft_vocab`` (I32, ascending token ids: the reduced vocabulary the head drafts
over, FR-Spec; at load the trunk's LM head rows of those ids become the head's
``shared_head_head``, in the trunk's own format) and, in the header's
``__metadata__``, ``bw24chat.draft_head``: a JSON object with the format version, the trunk's
architecture and shape, how it was trained and ``trunk_sha256``, the digest of the weights it was
trained on (``trunk_sha256`` below).  A head whose digest is not the model's is refused: a head
only drafts well for the trunk whose hidden states it learned.

Where it lives: beside a GGUF file ``NAME.gguf`` as ``NAME.draft-head.safetensors``; inside a
Hugging Face folder as ``draft-head.safetensors`` (which the folder's weight loader skips).
``load_checkpoint`` attaches the head it finds there (or the one ``--draft-head`` names) as
``Checkpoint.mtp``, unless the model ships its own.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from .errors import ModelFileError
from .tensor import ExpertTensor, QTensor

FORMAT = "bw24chat.draft_head"
VERSION = 1
FOLDER_FILE = "draft-head.safetensors"  # inside a Hugging Face model folder
SUFFIX = ".draft-head.safetensors"  # beside a GGUF file, after its stem


def head_path(model_path: Path) -> Path:
    """Where the trained head of the model at ``model_path`` is kept."""
    p = Path(model_path)
    return p / FOLDER_FILE if p.is_dir() else p.with_name(p.stem + SUFFIX)


def trunk_sha256(ckpt) -> str:
    """The sha256 of the trunk's weights: every trunk tensor in name order, each as its canonical
    name, format and shape (one line of text), then its bytes as stored (NVFP4: and its global
    scale; FP8: and its block scales).  The digest is cached by (file, size, mtime), so a large
    model is read once."""
    key = _cache_key(ckpt.path)
    cached = _digests().get(key) if key else None
    if cached:
        return cached
    h = hashlib.sha256()
    for name in sorted(ckpt.tensors):
        t = ckpt.tensors[name]
        for part in (t.parts if isinstance(t, ExpertTensor) else [t]):
            h.update(f"{name} {part.fmt} {list(part.shape)} {part.global_scale!r}\n".encode())
            h.update(memoryview(np.ascontiguousarray(part.raw)).cast("B"))
            if part.scale is not None:
                h.update(np.ascontiguousarray(part.scale, np.float32).tobytes())
    digest = h.hexdigest()
    if key:
        _save_digest(key, digest)
    return digest


def _cache_key(path: Path) -> str | None:
    try:
        files = sorted(Path(path).glob("*.safetensors")) if Path(path).is_dir() else [Path(path)]
        return "|".join(f"{f.resolve()}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files if f.name != FOLDER_FILE)
    except OSError:
        return None


def _digests_path() -> Path:
    from ..paths import cache_dir

    return cache_dir() / "trunk_sha256.json"


def _digests() -> dict:
    try:
        data = json.loads(_digests_path().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _save_digest(key: str, digest: str) -> None:
    from ..config import atomic_write_text

    data = _digests()
    data[key] = digest
    try:
        atomic_write_text(_digests_path(), json.dumps(data))
    except OSError:  # a read-only cache folder: the digest is computed again next time
        pass


def write_head(path: Path, tensors: dict[str, np.ndarray], info: dict) -> None:
    """Save a head: ``tensors`` by canonical name (float matrices stored as BF16, float vectors as
    F32, integer ones (draft_vocab) as I32) and ``info`` (the trainer's: trunk_sha256, arch,
    shape, training figures)."""
    from ..quants import f32_to_bf16_bits
    from .hf_loader import write_safetensors

    def stored_as(a: np.ndarray):
        if np.issubdtype(a.dtype, np.integer):
            return "I32", np.ascontiguousarray(a, np.int32)
        return ("BF16", f32_to_bf16_bits(a)) if a.ndim >= 2 else ("F32", np.ascontiguousarray(a, np.float32))

    stored = {n: stored_as(np.asarray(a)) for n, a in sorted(tensors.items())}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    write_safetensors(tmp, stored, {FORMAT: json.dumps({"version": VERSION, **info})})
    tmp.replace(path)


def read_head(path: Path) -> tuple[dict, dict[str, QTensor]]:
    """(info, tensors by canonical name) of a head file; a file that is not one is refused."""
    from .hf_loader import SafetensorsFile

    f = SafetensorsFile(Path(path))
    try:
        info = json.loads(f.metadata[FORMAT])
    except KeyError:
        raise ModelFileError(path, "not a bw24chat draft head (no bw24chat.draft_head metadata)", "__metadata__") from None
    except ValueError as exc:
        raise ModelFileError(path, f"its draft-head metadata is not JSON ({exc})", "__metadata__") from None
    if not isinstance(info, dict) or info.get("version") != VERSION or not isinstance(info.get("trunk_sha256"), str):
        raise ModelFileError(path, f"a draft head of an unknown version or without a trunk digest: {str(info)[:200]}",
                             "__metadata__")
    tensors = {}
    for name in f.header:
        arr, kind = f.get(name)
        tensors[name] = QTensor(name, kind, tuple(arr.shape), arr)
    return info, tensors


def attach_head(ckpt, path: Path | None = None) -> None:
    """Attach a trained head to ``ckpt`` (Checkpoint.mtp, one NextN layer): the file ``path`` (a
    wrong or unreadable one raises ModelFileError), else the one beside the model, if any (one
    trained for another trunk is left out, and ``ckpt.draft_head_problem`` says why).  A model
    that ships a head keeps it unless ``path`` is given."""
    explicit = path is not None
    path = Path(path) if explicit else head_path(ckpt.path)
    if (ckpt.mtp and not explicit) or not path.is_file():
        if explicit:
            raise ModelFileError(path, "no such draft head file")
        return
    try:
        info, tensors = read_head(path)
        want = trunk_sha256(ckpt)
        if info["trunk_sha256"] != want:
            raise ModelFileError(path, f"this draft head was trained for another model (its trunk's sha256 is "
                                       f"{info['trunk_sha256'][:16]}…, {ckpt.name}'s is {want[:16]}…); train one for "
                                       f"this model with: bw24chat train-draft -m {ckpt.path}")
        vocab = next((tensors.pop(n) for n in list(tensors) if n.endswith(".nextn.draft_vocab")), None)
        _check_head(ckpt, path, tensors)
        if vocab is not None:
            tensors.update(draft_vocab_tensors(ckpt, path, vocab))
    except ModelFileError as exc:
        if explicit:
            raise
        ckpt.draft_head_problem = str(exc)
        return
    ckpt.mtp = tensors
    ckpt.config["num_nextn_predict_layers"] = 1
    ckpt.draft_head = path


def draft_vocab_tensors(ckpt, path, vocab: QTensor) -> dict:
    """The head's reduced vocabulary and the trunk's LM head rows of those ids (the draft's LM
    head, in the trunk's format: QTensor.take_rows), under the head's canonical names."""
    from .checks import check_config

    a = check_config(ckpt, ckpt.config_fields)
    ids = np.asarray(vocab.raw)
    if vocab.fmt != "I32" or ids.ndim != 1 or not 0 < len(ids) <= a.vocab_size or ids[0] < 0 \
            or ids[-1] >= a.vocab_size or np.any(np.diff(ids) <= 0):
        raise ModelFileError(path, f"its draft vocabulary is not ascending token ids below {a.vocab_size} "
                                   f"({vocab.fmt} {list(vocab.shape)})", f"tensor {vocab.name}")
    p = vocab.name[:-len("draft_vocab")]
    tied = getattr(a, "tie_word_embeddings", False) or "output" not in ckpt.tensors  # as models/dense.py loads it
    trunk_head = ckpt.tensors["tok_embd" if tied else "output"]
    return {vocab.name: vocab, p + "shared_head_head": trunk_head.take_rows(ids, p + "shared_head_head")}


def _check_head(ckpt, path: Path, tensors: dict) -> None:
    """The head's tensors are the NextN layer this trunk's family expects (checks.py's rule)."""
    from ..models import get_family
    from .checks import _check_tensors, check_config

    a = check_config(ckpt, ckpt.config_fields)
    _check_tensors(ckpt, a, get_family(ckpt.arch).Model.mtp_tensor_shapes(a, 1), tensors, str, path)
