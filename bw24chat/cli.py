"""Command line: ``bw24chat`` (the app), ``bw24chat --headless``, ``bw24chat serve``,
``bw24chat bench``, ``bw24chat check``, ``bw24chat quality``, ``bw24chat info``."""
from __future__ import annotations

import argparse
import sys

from .options import add_engine_args, options_from_args


def _main_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bw24chat",
        description="Chat with a local LLM in the terminal. Subcommands: serve, bench, check, quality, info (bw24chat SUBCOMMAND -h).",
    )
    p.add_argument("prompt", nargs="?", help="headless: the prompt (default: read stdin)")
    p.add_argument("--headless", action="store_true", help="no TUI: answer the prompt on stdout")
    p.add_argument("--system", help="system prompt")
    p.add_argument("--json", action="store_true", help="headless: JSON lines (text deltas, then a stats record)")
    p.add_argument("--multi-turn", action="store_true", help="headless: JSON lines in, JSON lines out")
    p.add_argument("--raw", action="store_true", help="headless: no chat template, continue the prompt as is")
    add_engine_args(p)
    return p


def _open(options, quiet: bool):
    from .engine import open_engine

    def progress(ev):
        if not quiet and ev.detail and ev.stage in ("reading", "ready"):
            sys.stderr.write(f"[{ev.stage}] {ev.detail}\n")

    return open_engine(options, progress)


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
    if argv and argv[0] == "serve":
        from .server.app import add_serve_args, serve_from_args

        p = argparse.ArgumentParser(prog="bw24chat serve", description="OpenAI-compatible HTTP server")
        add_engine_args(p)
        add_serve_args(p)
        return serve_from_args(p.parse_args(argv[1:]))
    if argv and argv[0] == "bench":
        from .bench import main as bench_main

        return bench_main(argv[1:])
    if argv and argv[0] == "quality":
        from .quality import main as quality_main

        return quality_main(argv[1:])
    if argv and argv[0] == "info":
        from .info import main as info_main

        return info_main(argv[1:])
    if argv and argv[0] == "check":
        from .check import main as check_main

        return check_main(argv[1:])

    a = _main_parser().parse_args(argv)
    options = options_from_args(a)
    if a.headless or a.multi_turn or a.json:
        try:
            engine = _open(options, quiet=a.json)
        except Exception as exc:  # noqa: BLE001 - one line for the user, non-zero exit
            sys.stderr.write(f"bw24chat: {exc}\n")
            return 2
        try:
            from .headless import run_headless

            return run_headless(engine, a, options.sampling)
        finally:
            engine.close()
    from .tui.app import run_app

    return run_app(options)
