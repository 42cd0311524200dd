"""One loader interface, two formats: ``load_checkpoint(path)`` takes a GGUF file or a Hugging
Face model directory and returns a :class:`Checkpoint` (config dict, canonical-named tensors,
tokenizer, chat template)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..tokenizer import TokenizerInfo
from .tensor import QTensor


@dataclass
class Checkpoint:
    path: Path
    source: str  # "gguf" | "hf"
    name: str
    config: dict
    tensors: dict[str, QTensor]
    tokenizer: TokenizerInfo
    generation_config: dict = field(default_factory=dict)
    _keepalive: Any = None  # the reader / memory maps the tensors point into

    @property
    def arch(self) -> str:
        return self.config["model_type"]

    @property
    def n_params(self) -> int:
        return sum(t.numel for t in self.tensors.values())

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def formats(self) -> dict[str, str]:
        """Canonical tensor name -> storage format (what `bw24chat` reports per layer)."""
        return {n: t.fmt for n, t in self.tensors.items()}


def load_checkpoint(path: str | Path) -> Checkpoint:
    p = Path(path)
    if p.is_dir():
        from .hf_loader import load_hf_dir

        return load_hf_dir(p)
    if not p.exists():
        raise FileNotFoundError(f"no such model file or directory: {p}")
    with open(p, "rb") as fh:
        magic = fh.read(4)
    if magic == b"GGUF":
        from .gguf_loader import load_gguf

        return load_gguf(p)
    raise ValueError(f"{p}: not a GGUF file (bad magic {magic!r}) and not a model directory")


__all__ = ["Checkpoint", "QTensor", "load_checkpoint"]
