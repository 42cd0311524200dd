"""``bw24chat info -m MODEL [--quantize FMT] [--json]``: what a checkpoint is and which storage format
each tensor role is in, per layer range (mixed checkpoints, e.g. NVFP4 projections with a BF16
embedding and a Q8_0 LM head, show one row per format).  Reads the file's metadata and tensor
table only (GGUF and safetensors are memory-mapped); --quantize shows the formats after
quantize-at-load, which does convert the weights (slow for large models)."""
from __future__ import annotations

import argparse
import json
import sys

from .loaders import load_checkpoint, summarize_formats


def describe(ck) -> dict:
    return {
        "name": ck.name,
        "path": str(ck.path),
        "arch": ck.arch,
        "parameters": ck.n_params,
        "bytes": ck.nbytes,
        "formats": [dict(role=r, format=f, layers=l) for r, f, l in summarize_formats(ck.formats())],
    }


def format_table(rows: list[tuple[str, str, str]]) -> str:
    w = max([len(r[0]) for r in rows] + [4])
    lines = [f"{'tensor':{w}}  {'format':8}  layers"]
    lines += [f"{role:{w}}  {fmt:8}  {layers}" for role, fmt, layers in rows]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bw24chat info", description=__doc__)
    p.add_argument("-m", "--model", required=True, help="GGUF file or Hugging Face model directory")
    p.add_argument("--quantize", choices=["nvfp4", "q8_0"], default=None)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    try:
        ck = load_checkpoint(a.model)
        if a.quantize:
            from .quantize import requantize_checkpoint

            requantize_checkpoint(ck, a.quantize)
    except Exception as exc:  # noqa: BLE001 - one line for the user
        sys.stderr.write(f"bw24chat info: {exc}\n")
        return 2
    d = describe(ck)
    if a.json:
        print(json.dumps(d, indent=1))
        return 0
    print(f"{d['name']}  ({d['arch']}, {d['parameters'] / 1e6:.1f} M parameters, {d['bytes'] / 2**20:.1f} MiB)")
    print(format_table([(r["role"], r["format"], r["layers"]) for r in d["formats"]]))
    return 0
