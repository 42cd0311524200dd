"""Progress on stderr for the command-line modes (headless, serve, info, check, bench)."""
from __future__ import annotations

import sys
from typing import Callable

from .api import LoadProgress


def load_reporter(prefix: str = "bw24chat", stream=None) -> Callable[[LoadProgress], None]:
    """A LoadProgress callback: one line per step; a download redraws its line in place on a
    terminal and prints every 10 % elsewhere (logs, pipes); the notes of reading, uploading (a
    context capped to fit the VRAM budget) and ready print once."""
    out = stream or sys.stderr
    tty = out.isatty()
    last = {"detail": None, "tenth": -1}

    def report(p: LoadProgress) -> None:
        if p.stage == "downloading":
            tenth = int(p.fraction * 10)
            line = f"{prefix}: downloading {p.detail} ({100 * p.fraction:.0f} %)"
            if tty:
                out.write(f"\r{line}\x1b[K" + ("\n" if p.fraction >= 1 else ""))
            elif tenth != last["tenth"]:
                out.write(line + "\n")
            last["tenth"] = tenth
        elif p.detail and p.detail != last["detail"] and p.stage in ("reading", "uploading", "ready"):
            out.write(f"{prefix}: {p.detail}\n")
            last["detail"] = p.detail
        out.flush()

    return report


def download_reporter(report: Callable[[LoadProgress], None]):
    """model_store's progress(text, done, total) as LoadProgress: "downloading" while bytes
    flow, "reading" for the other steps."""

    def progress(text: str, done: int | None, total: int | None) -> None:
        if total:
            report(LoadProgress("downloading", done / total, f"{text}: {done / 2**20:.1f} / {total / 2**20:.1f} MiB"))
        else:
            report(LoadProgress("reading", 0.0, text))

    return progress


def print_downloads(prefix: str):
    """model_store progress printed on stderr (for commands that read a model themselves)."""
    return download_reporter(load_reporter(prefix))
