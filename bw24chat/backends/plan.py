"""The decode plan: the launches of one decode step, as data, without a GPU.

``decode_plan(config, formats, props, m)`` runs the model file's forward pass on ``CudaOps``
exactly as the CUDA runner does, but with symbolic buffers and weights (``SymArray``: shapes,
no memory) and with the launch wrappers' device queries answered by ``props``: every kernel
handle is a description (file, name, defines), every launch a record (grid, block, shared
memory, arguments by buffer name).  Occupancy-dependent grids take the kernel's register count
from ptxas (NVRTC, no GPU).  So the plan is a function of (model dims, weight formats per role,
GPU properties, the tuning tables in backends/tuning.py): tests/test_decode_plan.py prints it
for the Qwen3-8B shape per format and compares it with tests/data/decode_plan_*.txt.
``prefill_plan`` does the same for a prefill chunk (CudaRunner.prefill_plan: the GEMMs, the
attention over the cache) and ``attention_plan`` for one attention launch alone
(tests/test_prefill_plan.py, tests/data/prefill_plan_*.txt and attention_plans.txt).

    python -m bw24chat.backends.plan qwen3-8b nvfp4 [--gpu H100] [--rows 1]
    python -m bw24chat.backends.plan qwen3-8b nvfp4 --prefill 512     (a prefill chunk's launches)
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
from dataclasses import dataclass, field

import numpy as np

from . import kernel_build


@dataclass(frozen=True)
class GpuProps:
    """What the launch decisions read of a GPU (CUDA device attributes)."""

    name: str
    cc: int  # compute capability, 90 for sm_90
    arch: str  # the NVRTC target the engine builds for it
    sm_count: int
    smem_block_optin: int  # bytes of dynamic shared memory a block may opt in to
    smem_per_sm: int
    l2_bytes: int

    def attribute(self, name: str) -> int:
        return {"MultiProcessorCount": self.sm_count, "MaxSharedMemoryPerBlockOptin": self.smem_block_optin,
                "MaxSharedMemoryPerMultiprocessor": self.smem_per_sm, "L2CacheSize": self.l2_bytes}[name]

    @classmethod
    def from_device(cls) -> "GpuProps":
        import cupy

        dev = cupy.cuda.Device()
        a = kernel_build.device_attributes(dev.id)
        name = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"].decode()
        return cls(name, int(dev.compute_capability), kernel_build.active_arch(), a["MultiProcessorCount"],
                   a["MaxSharedMemoryPerBlockOptin"], a["MaxSharedMemoryPerMultiprocessor"], a["L2CacheSize"])


# the CUDA C++ Programming Guide's figures for the GPUs the engine is tuned on, and one of the
# sm_89 GPUs (no thread-block clusters: the decode attention's workspace merge)
GPUS = {
    "H100": GpuProps("H100 SXM", 90, "sm_90a", 132, 227 * 1024, 228 * 1024, 50 << 20),
    "H200": GpuProps("H200", 90, "sm_90a", 132, 227 * 1024, 228 * 1024, 60 << 20),
    "RTX5090": GpuProps("RTX 5090", 120, "sm_120a", 170, 99 * 1024, 100 * 1024, 96 << 20),
    "RTX4090": GpuProps("RTX 4090", 89, "sm_89", 128, 99 * 1024, 100 * 1024, 72 << 20),
}


# ----------------------------------------------------------------------------- symbolic arrays
class _Ptr:
    def __init__(self, ptr: int):
        self.ptr = ptr


class SymArray:
    """A device array's shape, dtype and place (buffer name + byte offset), no memory.  Supports
    what the launch wrappers do with arrays: slicing, reshape, view, strides, addresses."""

    _bases: dict = {}  # base id -> name
    _next = itertools.count(1)

    def __init__(self, name: str, shape, dtype, base: int | None = None, offset: int = 0, strides=None):
        self.dtype = np.dtype(dtype)
        self.shape = tuple(int(d) for d in shape)
        self.strides = tuple(strides) if strides is not None else _c_strides(self.shape, self.dtype.itemsize)
        if base is None:
            base = next(SymArray._next)
            SymArray._bases[base] = name
        self.base, self.offset, self.name = base, offset, name

    itemsize = property(lambda self: self.dtype.itemsize)
    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: int(np.prod(self.shape, dtype=np.int64)))
    nbytes = property(lambda self: self.size * self.itemsize)
    data = property(lambda self: _Ptr((self.base << 40) + self.offset))

    def _like(self, shape, strides, offset):
        return SymArray(self.name, shape, self.dtype, self.base, offset, strides)

    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        shape, strides, off = [], [], self.offset
        for i, (n, st) in enumerate(zip(self.shape, self.strides)):
            k = key[i] if i < len(key) else slice(None)
            if isinstance(k, slice):
                a, b, step = k.indices(n)
                shape.append(max(0, -(-(b - a) // step)))
                strides.append(st * step)
                off += a * st
            else:
                off += (int(k) % n) * st
        return self._like(shape, strides, off)

    def reshape(self, *shape):
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple) else tuple(shape)
        if -1 in shape:
            known = int(np.prod([d for d in shape if d != -1]))
            shape = tuple(self.size // known if d == -1 else d for d in shape)
        if self.strides == _c_strides(self.shape, self.itemsize):
            return self._like(shape, None, self.offset)
        # a row slice of contiguous rows: the leading axes keep their strides, the last splits
        lead = len(self.shape) - 1
        if shape[:lead] == self.shape[:lead] and self.strides[-1] == self.itemsize:
            tail = _c_strides(shape[lead:], self.itemsize)
            return self._like(shape, self.strides[:lead] + tail, self.offset)
        raise ValueError(f"SymArray {self.name}: reshape {self.shape} -> {shape} of a strided view")

    def view(self, dtype):
        dtype = np.dtype(dtype)
        shape = self.shape[:-1] + (self.shape[-1] * self.itemsize // dtype.itemsize,)
        return SymArray(self.name, shape, dtype, self.base, self.offset)

    def label(self) -> str:
        return self.name + (f"+{self.offset}" if self.offset else "")


def _c_strides(shape, itemsize) -> tuple:
    out, acc = [], itemsize
    for d in reversed(shape):
        out.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(out))


def sym_name(ptr: int) -> str:
    base, off = ptr >> 40, ptr & ((1 << 40) - 1)
    return SymArray._bases.get(base, "?") + (f"+{off}" if off else "")


# ----------------------------------------------------------------------------- planned kernels
@dataclass
class Launch:
    family: str
    name: str
    defines: tuple
    grid: tuple
    block: tuple
    smem: int
    args: tuple

    def key(self) -> tuple:
        """What the plan decides (kernel_build.KernelLaunch.key: the runner's launches)."""
        return self.family, self.name, self.defines, self.grid, self.block, self.smem

    def line(self) -> str:
        d = " ".join(f"{k}={v}" for k, v in self.defines)
        return (f"{self.family}:{self.name} [{d}] grid={self.grid} block={self.block} smem={self.smem} "
                f"args=({', '.join(self.args)})")


class PlannedKernel:
    """A kernel described, not loaded: ``num_regs`` from ptxas, calls recorded."""

    def __init__(self, planner: "Planner", family: str, name: str, defines: tuple):
        self.__dict__.update(planner=planner, family=family, name=name, defines=defines, label=name)

    @property
    def num_regs(self) -> int:
        return kernel_build.ptxas_registers(self.family, self.name, self.planner.props.arch, self.defines)

    def __setattr__(self, key, value):  # max_dynamic_shared_size_bytes: a launch property, recorded with it
        pass

    def __call__(self, grid, block, args, shared_mem: int = 0, **kw):
        self.planner.launches.append(Launch(self.family, self.name, self.defines, tuple(grid), tuple(block),
                                            int(shared_mem), tuple(_arg_label(a) for a in args)))


def _arg_label(a) -> str:
    if isinstance(a, SymArray):
        return a.label()
    if isinstance(a, np.uint64) and int(a) >= (1 << 40):
        return sym_name(int(a))
    if isinstance(a, (np.floating, float)):
        return f"{float(a):.6g}"
    return str(a.item() if hasattr(a, "item") else a)


@dataclass
class Planner:
    props: GpuProps
    launches: list = field(default_factory=list)
    _kernels: dict = field(default_factory=dict)

    def kernel(self, family: str, name: str, defines: tuple) -> PlannedKernel:
        key = (family, name, defines)
        if key not in self._kernels:
            self._kernels[key] = PlannedKernel(self, family, name, defines)
        return self._kernels[key]

    def empty(self, name: str, shape, dtype) -> SymArray:
        """A device array the traced code allocates (kernel_build.device_empty), symbolic."""
        return SymArray(name, shape if isinstance(shape, tuple) else (shape,), dtype)


@contextlib.contextmanager
def planning(props: GpuProps):
    """Inside: device queries answer from ``props``, kernels are PlannedKernels (the planner)."""
    planner = Planner(props)
    kernel_build.set_planning(planner)
    try:
        yield planner
    finally:
        kernel_build.set_planning(None)


# ----------------------------------------------------------------------------- the plan
class PlanLoader:
    """CudaLoader's contract with symbolic weights (names say which tensors)."""

    def __init__(self):
        self.linears: list = []
        self.experts: list = []

    def _weight(self, tensors, role: str):
        from .cuda_weights import DeviceWeight, fmt_id, plane_shapes, vpc

        fmt, in_ = tensors[0].fmt, tensors[0].shape[1]
        out = sum(t.shape[0] for t in tensors)
        name = "|".join(t.name for t in tensors)
        planes = {p: SymArray(f"{name}.{p}", shape, dt) for p, (shape, dt) in plane_shapes(fmt, out, in_).items()}
        w = DeviceWeight(fmt, out, in_, planes["q"], planes.get("h"), planes.get("s"), planes.get("d"),
                         planes.get("gscale"), 1.0, sum(a.nbytes for a in planes.values()), fmt_id(fmt), vpc(fmt))
        w.role = role
        return w

    def load_linear(self, tensors, interleave: bool = False, role: str = ""):
        from .cuda_weights import PartedWeight, format_runs

        runs = format_runs(tensors, interleave)
        if len(runs) > 1:
            return PartedWeight([self.load_linear(r, role=role) for r in runs], role)
        w = self._weight(tensors, role)
        self.linears.append(w)
        return w

    def load_vector(self, tensors):
        return SymArray("|".join(t.name for t in tensors), (sum(int(np.prod(t.shape)) for t in tensors),), np.float32)

    def load_embedding(self, tensor):
        return self._weight([tensor], "embed")

    def load_conv(self, tensor):
        return SymArray(tensor.name, (tensor.shape[0], int(np.prod(tensor.shape[1:]))), np.float32)

    def load_experts(self, gate, up, down, role: str = "experts"):
        """A layer's routed experts as the kernels see them: each projection's pointer table
        (cuda_moe.ExpertStore: the images themselves are read through it), all resident."""
        from types import SimpleNamespace

        from .cuda_moe import PLANES, check_format

        E, F, D = gate.shape
        for t in (gate, up, down):
            check_format(t.fmt, F, D)
        name = gate.name.rsplit(".", 1)[0]
        store = lambda proj, out, in_: SimpleNamespace(  # noqa: E731
            fmt=gate.fmt, n_experts=E, out=out, in_=in_, table=SymArray(f"{name}.{proj}_table", (E, len(PLANES)), np.uint64))
        ex = SimpleNamespace(gu=store("gu", 2 * F, D), down=store("down", D, F), tiers=None, layer=0, n_experts=E, held=(0, E), partial=False)
        self.experts.append(ex)
        return ex


@dataclass
class _Tensor:
    name: str
    fmt: str
    shape: tuple


class PlanRunner:
    """What CudaOps reads of a CudaRunner, with symbolic buffers."""

    def __init__(self, args, model_cls, tensors: dict, kv_type: str, n_ctx: int, activations: str,
                 prefill_chunk: int = 512):
        from . import cuda_ops as ops
        from .cuda_deltanet import state_shapes
        from .cuda_runner import _IO_BYTES
        from .runner import MAX_ROWS

        self.args, self.kv_type, self.n_ctx = args, kv_type, n_ctx
        self.act_bf16 = activations == "bf16"
        self.attn_qx = True
        self.loader = PlanLoader()
        self.model = model_cls(args, self.loader, tensors, n_ctx)
        H, K, hd = args.num_attention_heads, args.num_key_value_heads, args.head_dim
        shape, dtype = ops.kv_cache_shape(kv_type, n_ctx, K, hd)
        self.cache_k = [SymArray(f"cache_k[{i}]", shape, dtype) for i in range(self.model.n_kv_layers)]
        self.cache_v = [SymArray(f"cache_v[{i}]", shape, dtype) for i in range(self.model.n_kv_layers)]
        spec = self.model.deltanet  # a hybrid model's recurrent state (cuda_deltanet)
        self.dn_state = None if spec is None else \
            {k: SymArray(k, s, np.float32) for k, s in state_shapes(spec, self.model.n_state_layers).items()}
        self.d_logits = SymArray("logits", (MAX_ROWS, args.vocab_size), np.float32)
        self.attn_ws = SymArray("attn_ws", (ops.attn_decode_workspace_bytes(H, K, hd, MAX_ROWS),), np.uint8)
        self.sample_ws = SymArray("sample_ws", (ops.sample_workspace_bytes(args.vocab_size, MAX_ROWS),), np.uint8)
        self.d_io = SymArray("io", (_IO_BYTES,), np.uint8)  # the step image (cuda_runner)
        io = self.d_io.view(np.int32)
        self.d_tokens, self.d_pos, self.d_len, self.d_next = (io[i * MAX_ROWS:(i + 1) * MAX_ROWS] for i in range(4))
        self.prefill_chunk, self.max_rows = prefill_chunk, MAX_ROWS
        self.p_ids, self.p_pos = (SymArray(n, (prefill_chunk,), np.int32) for n in ("p_ids", "p_pos"))
        self._bufs: dict = {}

    def buffer(self, name: str, rows: int, *cols: int, dtype: str = "f4"):
        key = (name, cols, dtype)
        if key not in self._bufs:
            cap = self.max_rows if name.startswith("d:") else self.prefill_chunk
            self._bufs[key] = SymArray(name.split(":")[-1], (cap, *cols), dtype)
        return self._bufs[key][:rows]

    def rope_tables(self, table):
        half = table.cos.shape
        return SymArray("rope_cos", half, np.float32), SymArray("rope_sin", half, np.float32)


def _tensors(config: dict, formats: dict, model_cls, args) -> dict:
    """Tensor descriptions of a checkpoint: the family's shapes, each role in its format (a
    "default" that names a K-quant mix: synthetic.MIXES's rule)."""
    from ..synthetic import MIXES, use_more_bits

    mix = MIXES.get(formats["default"])
    if mix:
        formats = {**formats, "default": mix[0]}
    out = {}
    for name, (shape, required) in model_cls.tensor_shapes(args).items():
        role = name.split(".")[-1]
        if not required and role not in ("attn_q_norm", "attn_k_norm") + (("output",) if not args.tie_word_embeddings else ()):
            continue
        if role in ("attn_q_norm", "attn_k_norm") and not args.qk_norm:
            continue
        # vectors and the MoE router's matrix stay F32, as in the files (GGUF ffn_gate_inp is F32)
        fmt = "F32" if len(shape) == 1 or role in ("ffn_gate_inp", "ssm_conv1d") else formats.get(role, formats["default"])
        if mix and fmt == mix[0] and (role == "output" or role in ("attn_v", "ffn_down") and
                                      use_more_bits(int(name.split(".")[1]), args.num_hidden_layers)):
            fmt = mix[1]
        out[name] = _Tensor(name, fmt, shape)
    return out


def decode_plan(config: dict, formats: dict, props: GpuProps, m: int = 1, kv_type: str = "bf16",
                activations: str = "f32", n_ctx: int = 4096) -> list[Launch]:
    """The launches of one decode step of ``m`` rows (the sampler included) for a model of
    ``config`` (HF-style) whose matrices are in ``formats`` (role -> format, "default" for the
    rest), on a GPU of ``props``."""
    from ..models import get_family
    from .cuda_opset import CudaOps
    from .cuda_runner import sample_step_rows

    fam = get_family(config["model_type"])
    args = fam.ModelArgs.from_dict(config)
    with planning(props) as planner:
        r = PlanRunner(args, fam.Model, _tensors(config, formats, fam.Model, args), kv_type, n_ctx, activations)
        r.model.forward(CudaOps(r, m, decode=True), r.d_tokens[:m])
        sample_step_rows(r, m)
    return planner.launches


def prefill_plan(config: dict, formats: dict, props: GpuProps, T: int = 512, start: int = 0, kv_type: str = "bf16",
                 activations: str = "f32", n_ctx: int = 4096, all_logits: bool = False) -> list[Launch]:
    """The launches of one prefill chunk of ``T`` tokens at position ``start`` (CudaRunner.prefill_plan:
    the GEMMs, their activation and weight preparation, the attention over the cache, the LM
    head on the chunk's last row, or with ``all_logits`` (prefill_logits) a GEMM over every row),
    as decode_plan plans a decode step."""
    from ..models import get_family
    from .cuda_opset import CudaOps

    fam = get_family(config["model_type"])
    args = fam.ModelArgs.from_dict(config)
    with planning(props) as planner:
        r = PlanRunner(args, fam.Model, _tensors(config, formats, fam.Model, args), kv_type, n_ctx, activations,
                       prefill_chunk=T)
        r.model.forward(CudaOps(r, T, decode=False, start=start, all_logits=all_logits), r.p_ids[:T])
    return planner.launches


def attention_plan(props: GpuProps, n_heads: int, n_kv_heads: int, head_dim: int, kv_type: str, m: int = 1,
                   T: int = 0, n_ctx: int = 4096) -> list[Launch]:
    """The attention launch alone: a decode of ``m`` rows (attn_decode; T = 0) or a prefill chunk
    of ``T`` queries at position 0 (attn_prefill) for these heads over a ``kv_type`` cache, on a GPU
    of ``props`` (the attention geometry across GPUs, caches and head shapes, without a model)."""
    from . import cuda_ops as ops

    with planning(props) as planner:
        shape, dtype = ops.kv_cache_shape(kv_type, n_ctx, n_kv_heads, head_dim)
        ck, cv = SymArray("cache_k", shape, dtype), SymArray("cache_v", shape, dtype)
        rows = T or m
        q = SymArray("q", (rows, n_heads, head_dim), np.float32)
        out = SymArray("attn", (rows, n_heads, head_dim), np.float32)
        if T:
            ops.attn_prefill(q, ck, cv, kv_type, 0, T, head_dim ** -0.5, out)
        else:
            ws = SymArray("attn_ws", (ops.attn_decode_workspace_bytes(n_heads, n_kv_heads, head_dim),), np.uint8)
            ops.attn_decode(q, ck, cv, kv_type, SymArray("lengths", (m,), np.int32), m, head_dim ** -0.5, out, ws)
    return planner.launches


def format_plan(launches: list[Launch], layers: int, period: int = 1) -> str:
    """One line a launch; a run of launches that repeats for every layer (every ``period`` layers:
    a hybrid model's cycle of DeltaNet and attention layers, layer_period) is printed once with
    its count (each layer's launches differ only in the weights, cache and state they read)."""
    lines = [L.line() for L in launches]
    # the layer block: the lines between the embedding and the LM head, in layers equal runs
    body = lines[1:]
    per, units = None, layers // period
    for n in range(1, len(body) // units + 1):
        if len(body) >= n * units and all(_strip(body[i]) == _strip(body[i % n]) for i in range(n * units)):
            per = n
    out = [f"0 {lines[0]}"]
    if per:
        out += [f"L {line}" for line in body[:per]]
        out.append(f"(the {per} launches marked L repeat for each of the {layers} layers)" if period == 1 else
                   f"(the {per} launches marked L repeat for each of the {units} runs of {period} layers)")
        rest = body[per * units:]
    else:
        rest = body
    out += [f"{i} {line}" for i, line in enumerate(rest, start=len(lines) - len(rest))]
    return "\n".join(out) + "\n"


def _strip(line: str) -> str:
    """A launch line without the per-layer weight / cache names (blk.N., [N])."""
    import re

    return re.sub(r"blk\.\d+\.|\[\d+\]|\b(conv|ssm|conv_ckpt|ssm_ckpt)\+\d+", r"\1", line)


def batch_plan(config: dict, formats: dict, props: GpuProps, rows: int, kv_type: str = "bf16",
               activations: str = "f32", n_ctx: int = 4096, n_blocks: int = 64, gemm_rows: bool = False) -> list[Launch]:
    """The launches of one pass of the batched step (cuda_batch.BatchStep.forward) over ``rows``
    decode rows (a bucket) on the paged pool: what the pass's graph replays (gemm_rows: bench's
    non-invariant variant of it)."""
    from ..models import get_family
    from .cuda_batch import BatchStep

    fam = get_family(config["model_type"])
    args = fam.ModelArgs.from_dict(config)
    with planning(props) as planner:
        r = PlanRunner(args, fam.Model, _tensors(config, formats, fam.Model, args), kv_type, n_ctx, activations)
        r.prefill_chunk = 512
        bat = BatchStep(r, n_blocks, zeros=lambda name, shape, dtype: SymArray(name, shape, dtype))
        bat.gemm_rows = gemm_rows
        bat.forward(rows)
    return planner.launches


def layer_period(config: dict) -> int:
    """The layers after which a model's launches repeat: 1, or a hybrid model's cycle of DeltaNet
    and attention layers (Qwen3.5: 3 + 1)."""
    from ..models import get_family

    a = get_family(config["model_type"]).ModelArgs.from_dict(config)
    if not hasattr(a, "is_linear"):
        return 1
    kinds = [a.is_linear(i) for i in range(a.num_hidden_layers)]
    return next(p for p in range(1, len(kinds) + 1) if len(kinds) % p == 0 and kinds == kinds[:p] * (len(kinds) // p))


def main(argv: list[str] | None = None) -> int:
    from ..synthetic import SHAPES

    p = argparse.ArgumentParser(prog="python -m bw24chat.backends.plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shape", choices=sorted(SHAPES))
    p.add_argument("format", help="weight format of every matrix (bf16, q8_0, q4_k, nvfp4, ...)")
    p.add_argument("--gpu", choices=sorted(GPUS), default="H100")
    p.add_argument("--rows", type=int, default=1, help="decode rows m (1..8)")
    p.add_argument("--prefill", type=int, metavar="T", help="the plan of a prefill chunk of T tokens instead")
    p.add_argument("--kv-cache", default="bf16")
    p.add_argument("--activations", choices=("f32", "bf16"), default="f32")
    a = p.parse_args(argv)
    cfg, formats, gpu = SHAPES[a.shape], {"default": a.format.upper()}, GPUS[a.gpu]
    if a.prefill:
        plan = prefill_plan(cfg, formats, gpu, a.prefill, kv_type=a.kv_cache, activations=a.activations)
    else:
        plan = decode_plan(cfg, formats, gpu, a.rows, a.kv_cache, a.activations)
    print(format_plan(plan, cfg["num_hidden_layers"], layer_period(cfg)), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
