"""One loader interface, two formats: ``load_checkpoint(path)`` takes a GGUF file or a Hugging
Face model directory and returns a :class:`Checkpoint` (config dict, canonical-named tensors,
tokenizer, chat template)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..tokenizer import TokenizerInfo
from .errors import PICKLE_SUFFIXES, ModelFileError, refuse_pickle
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
    config_fields: dict[str, str] = field(default_factory=dict)  # config key -> the file's field name
    # the NextN / MTP layers after the trunk (canonical names blk.{N}.*, N >= num_hidden_layers;
    # loaders.checks.split_nextn), kept apart so the trunk loads as without them; models/mtp.py
    mtp: dict[str, QTensor] = field(default_factory=dict)
    # a trained draft head attached as ``mtp`` (loaders/draft_head.py): its file; else why the
    # one beside the model was left out (trained for another trunk, unreadable), or None
    draft_head: Path | None = None
    draft_head_problem: str | None = None
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


def _ranges(ids: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8"."""
    out, start = [], None
    for i, n in enumerate(ids):
        if start is None:
            start = n
        if i + 1 == len(ids) or ids[i + 1] != n + 1:
            out.append(str(start) if start == n else f"{start}-{n}")
            start = None
    return ",".join(out)


def summarize_formats(formats: dict[str, str]) -> list[tuple[str, str, str]]:
    """Per-role storage formats of a checkpoint, for people: (role, format, layers).

    Layer tensors ("blk.N.<role>") are grouped by role and format with their layer ranges, so a
    mixed checkpoint reads at a glance ("ffn_down  Q6_K  0-3,32-35" / "ffn_down  Q4_K  4-31");
    other tensors (embedding, LM head, final norm) keep their names with layers "-"."""
    layered: dict[tuple[str, str], list[int]] = {}
    rows = []
    for name, fmt in formats.items():
        parts = name.split(".", 2)
        if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit():
            layered.setdefault((parts[2], fmt), []).append(int(parts[1]))
        else:
            rows.append((name, fmt, "-"))
    for (role, fmt), ids in sorted(layered.items(), key=lambda kv: (kv[0][0], min(kv[1]))):
        rows.append((role, fmt, _ranges(sorted(ids))))
    return rows


def load_checkpoint(path: str | Path, draft_head: str | Path | None = None) -> Checkpoint:
    """Load a GGUF file or a Hugging Face folder, with the trained draft head beside it (or the
    file ``draft_head``: loaders/draft_head.py).  Anything wrong with the files (but their
    absence, FileNotFoundError) is a :class:`ModelFileError` naming the file and the problem."""
    p = Path(path)
    if p.is_dir():
        from .hf_loader import load_hf_dir

        ckpt = load_hf_dir(p)
    elif not p.exists():
        raise FileNotFoundError(f"no such model file or directory: {p}")
    else:
        try:
            with open(p, "rb") as fh:
                magic = fh.read(4)
        except OSError as exc:
            raise ModelFileError(p, f"cannot be read: {exc.strerror or exc}") from None
        if not magic:
            raise ModelFileError(p, "the file is empty (an interrupted download?)")
        if magic == b"GGUF":
            from .gguf_loader import load_gguf

            ckpt = load_gguf(p)
        elif p.suffix.lower() in PICKLE_SUFFIXES or magic[:1] == b"\x80":  # 0x80: pickle's PROTO opcode
            raise refuse_pickle(p)
        else:
            raise ModelFileError(p, f"not a GGUF file (it starts with {magic!r}) and not a model folder")
    from .checks import check_checkpoint

    check_checkpoint(ckpt)
    from .draft_head import attach_head

    attach_head(ckpt, Path(draft_head) if draft_head is not None else None)
    return ckpt


__all__ = ["Checkpoint", "ModelFileError", "QTensor", "load_checkpoint", "summarize_formats"]
