"""Command line: ``bw24chat`` (the app), ``bw24chat --headless``, ``bw24chat serve``,
``bw24chat bench``, ``bw24chat check``, ``bw24chat quality``, ``bw24chat info``, ``bw24chat train-draft``."""
from __future__ import annotations

import argparse
import importlib
import sys

from .options import add_engine_args, options_from_args, parser

# subcommand -> module with build_parser() and main(argv)
SUBCOMMANDS = {
    "serve": "bw24chat.server.app",
    "bench": "bw24chat.bench",
    "check": "bw24chat.check",
    "quality": "bw24chat.quality",
    "info": "bw24chat.info",
    "train-draft": "bw24chat.train_draft",
}


def build_parser() -> argparse.ArgumentParser:
    p = parser("bw24chat", "Chat with a local LLM in the terminal. Subcommands: "
                           + ", ".join(SUBCOMMANDS) + " (bw24chat SUBCOMMAND -h).")
    p.add_argument("prompt", nargs="?", help="headless: the prompt (default: read stdin, one trailing newline dropped)")
    p.add_argument("--headless", action="store_true", help="no TUI: answer the prompt on stdout")
    p.add_argument("--system", help="system prompt (default: none)")
    p.add_argument("--json", action="store_true",
                   help="headless: JSON lines (text deltas, then a done record with the stats and the sampling values used)")
    p.add_argument("--multi-turn", action="store_true", help="headless: JSON lines in, JSON lines out")
    p.add_argument("--raw", action="store_true", help="headless: no chat template, continue the prompt as is")
    add_engine_args(p)
    return p


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser ("" is the main command): the README is checked against these."""
    return {"": build_parser(), **{name: importlib.import_module(mod).build_parser() for name, mod in SUBCOMMANDS.items()}}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from .loaders.errors import ModelFileError
    from .model_store import ModelNotFound
    from .options import OptionError

    try:
        return _dispatch(argv)
    except (ModelFileError, ModelNotFound, OptionError) as exc:  # a bad model or flag: one line, whatever the command
        sys.stderr.write(f"bw24chat: {exc}\n")
        return 2
    except KeyboardInterrupt:  # Ctrl-C while a model loads (a reply in progress is handled by headless)
        sys.stderr.write("bw24chat: interrupted\n")
        return 130


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] in SUBCOMMANDS:
        return importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:])

    a = build_parser().parse_args(argv)
    options = options_from_args(a)
    from .backends import check_gpus

    check_gpus(options.gpus, options.device)  # before the TUI opens: a --gpus the host lacks is exit code 2
    if a.headless or a.multi_turn or a.json:
        from .console import load_reporter
        from .engine import open_engine

        try:
            engine = open_engine(options, load_reporter())
        except Exception as exc:  # noqa: BLE001 - one line for the user, non-zero exit
            sys.stderr.write(f"bw24chat: {exc}\n")
            return 2
        try:
            from .headless import run_headless

            return run_headless(engine, a, options)
        finally:
            engine.close()
    from .tui.app import run_app

    return run_app(options)
