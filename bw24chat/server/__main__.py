"""``python -m bw24chat.server``: the server alone (the same flags as ``bw24chat serve``)."""
from __future__ import annotations

import argparse

from ..options import add_engine_args
from .app import add_serve_args, serve_from_args


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bw24chat.server", description="bw24chat's OpenAI-compatible server")
    add_engine_args(p)
    add_serve_args(p)
    return serve_from_args(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
