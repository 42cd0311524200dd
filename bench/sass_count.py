"""Instruction counts of the decode matvec's window loop, without a GPU: each production build
(cuda_linear's geometry for the Qwen3-8B shapes, m = 1) compiled for sm_90a through NVRTC,
disassembled with nvdisasm (pip nvidia-cuda-nvdisasm), and its innermost loop holding the dot
products found (a backward branch's body): instructions per loop, per dp4a, per row-chunk, and
the op mix; registers and spills from ptxas.  A variant adds defines to every build:

    python3 bench/sass_count.py [--formats nvfp4,q4_k,q8_0] [--variants "rows:MV_ROWPTR=1;..."]

Counts are not times: they predict only where a kernel is issue-bound (NVFP4: ~6 bytes per warp
instruction against ~13 per cycle per SM needed at an H100's copy rate; bench/NOTES.md, twenty-
third session).  The loop found contains the steady window and, where the build has both, the
guarded one (their sum): compare builds of one geometry only.
"""
from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bw24chat.backends import cuda_linear as cl  # noqa: E402
from bw24chat.backends import kernel_build as kb  # noqa: E402
from bw24chat.backends.cuda_weights import DeviceWeight  # noqa: E402

FORMATS = {"nvfp4": ("NVFP4", 11, 32), "q4_k": ("Q4_K", 8, 32), "q8_0": ("Q8_0", 3, 16)}
# role: (rows, inputs, prologue, swiglu epilogue) — Qwen3-8B with bench's 49152-entry vocabulary
ROLES = {"qkv": (6144, 4096, "rmsnorm", False), "o": (4096, 4096, "qx", False),
         "gate|up": (24576, 4096, "rmsnorm", True), "down": (4096, 12288, "qx", False),
         "LM head": (49152, 4096, "rmsnorm", False)}
SMS = 132  # an H100 SXM / H200: the fill of 3-row tiles depends on it


def nvdisasm() -> str:
    found = shutil.which("nvdisasm")
    if found:
        return found
    try:
        import nvidia
    except ImportError:
        nvidia = None
    for root in getattr(nvidia, "__path__", []):
        for p in Path(root).glob("*/bin/nvdisasm"):
            return str(p)
    raise SystemExit("nvdisasm not found: pip install nvidia-cuda-nvdisasm")


def production_defines(fmt: str, code: int, vpc: int, role: str) -> dict:
    rows, inputs, pro, swiglu = ROLES[role]
    W = DeviceWeight(fmt=fmt, out=rows, in_=inputs, q=None, fmt_id=code, vpc=vpc)
    defs, rows_per_warp, _ = cl._simt_geometry(W, 1, True, cl.PROLOGUES[pro], swiglu=swiglu)
    if swiglu and cl.qx_handoff():
        defs["QX_HANDOFF"] = cl.qx_handoff()
    return dict(FMT=code, MV_M=1, MV_R=rows_per_warp, ACT_Q8=1, **defs)


def instructions(sass: str, function: str = "matvec") -> tuple[list, dict]:
    """[(address, op, text)] of one function's code and {label: address}."""
    body = sass[sass.index(f".text.{function}:"):]
    nxt = body.find(".section", 1)  # the next function's section: this one ends there
    body = body if nxt < 0 else body[:nxt]
    ins, labels, pending = [], {}, []
    for line in body.splitlines():
        s = line.strip()
        m = re.match(r"^\.(L_x_\d+):", s)
        if m:
            pending.append(m.group(1))
            continue
        m = re.match(r"/\*([0-9a-f]+)\*/\s+(.*?)\s*;", s)
        if m:
            addr = int(m.group(1), 16)
            for p in pending:
                labels[p] = addr
            pending = []
            words = m.group(2).split()
            op = (words[1] if words[0].startswith("@") else words[0]).split(".")[0]
            ins.append((addr, op, m.group(2)))
    return ins, labels


def dot_loop(ins: list, labels: dict) -> collections.Counter | None:
    """The op counts of the smallest loop that holds dp4a (IDP) instructions."""
    best = None
    for addr, op, text in ins:
        m = re.search(r"BRA\s+`?\(\.(L_x_\d+)\)", text)
        if op != "BRA" or not m or labels.get(m.group(1), addr + 1) > addr:
            continue
        start = labels[m.group(1)]
        ops = collections.Counter(o for a, o, _ in ins if start <= a <= addr)
        if ops["IDP"] and (best is None or sum(ops.values()) < sum(best.values())):
            best = ops
    return best


def ptxas_summary(log: str) -> str:
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if "Compiling entry function 'matvec'" in line:
            info = " ".join(lines[i + 1:i + 4])
            regs = re.search(r"Used (\d+) registers", info)
            spill = re.search(r"(\d+) bytes spill stores", info)
            return f"{regs.group(1) if regs else '?'} regs, {spill.group(1) if spill else '?'} B spills"
    return "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--formats", default="nvfp4,q4_k,q8_0")
    ap.add_argument("--roles", default=",".join(ROLES))
    ap.add_argument("--variants", default="default:", help='"label:DEF=V,DEF=V;label:..." added to every build')
    args = ap.parse_args()
    cl._sm_resources = lambda: (SMS, 0)
    tool = nvdisasm()
    variants = []
    for item in args.variants.split(";"):
        label, _, spec = item.partition(":")
        variants.append((label, dict((k, int(v)) for k, v in (p.split("=") for p in spec.split(",") if p))))
    print(f"{'format':6s} {'role':8s} {'variant':10s} {'loop':>5s} {'dp4a':>5s} {'per dp4a':>8s}  registers      top ops")
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.formats.split(","):
            fmt, code, vpc = FORMATS[key]
            for role in args.roles.split(","):
                for label, extra in variants:
                    defs = {**production_defines(fmt, code, vpc, role), **extra}
                    cubin, log = kb.compile_cubin("matvec", "sm_90a", defs, extra=("-Xptxas=-v",))
                    path = Path(tmp) / "k.cubin"
                    path.write_bytes(cubin)
                    sass = subprocess.run([tool, "-c", str(path)], capture_output=True, text=True, check=True).stdout
                    ops = dot_loop(*instructions(sass))
                    if ops is None:
                        print(f"{fmt:6s} {role:8s} {label:10s} no dp4a loop found")
                        continue
                    n, idp = sum(ops.values()), ops["IDP"]
                    top = " ".join(f"{o} {c}" for o, c in ops.most_common(8))
                    print(f"{fmt:6s} {role:8s} {label:10s} {n:5d} {idp:5d} {n / idp:8.3f}  {ptxas_summary(log):14s} {top}")


if __name__ == "__main__":
    main()
