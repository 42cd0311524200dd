"""The one error a model file that cannot be used ends in.

Model files come from strangers: every problem found while reading one (truncation, a lying
header, an unknown type, a tensor that does not match the config) is a :class:`ModelFileError`
naming the file, the field or tensor, and what is wrong, so the CLI prints one line (exit 2),
the TUI shows it in a dialog and the server refuses to start with it."""
from __future__ import annotations

import unicodedata
from pathlib import Path


class ModelFileError(ValueError):
    """``path``: the file (or model folder); ``where``: the field or tensor ("" for the file as a
    whole); ``detail``: what is wrong, in words."""

    def __init__(self, path: str | Path, detail: str, where: str = ""):
        self.path = Path(path)
        self.where = printable(where)
        self.detail = printable(detail)
        super().__init__(f"{printable(str(self.path))}: {self.where + ': ' if self.where else ''}{self.detail}")


def printable(text: str) -> str:
    """``text`` with control and other invisible characters escaped: names read from a hostile
    file must not move the terminal's cursor or recolour it when the message is printed."""
    return "".join(c if c == " " or unicodedata.category(c)[0] not in "CZ" else ascii(c)[1:-1] for c in text)


# Pickle runs code while it loads; these checkpoints are refused whatever their contents.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def refuse_pickle(path: Path) -> ModelFileError:
    return ModelFileError(
        path,
        "a PyTorch pickle checkpoint; bw24chat never loads pickles (unpickling can run any code in the file). "
        "Use the model's .safetensors or .gguf version",
    )
