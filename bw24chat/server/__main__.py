"""``python -m bw24chat.server``: the server alone (the same flags as ``bw24chat serve``)."""
from __future__ import annotations

import sys

from .app import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:], "python -m bw24chat.server"))
