"""Run-time compilation of ``kernels/*.cu`` (one op family per file) with NVRTC through CuPy.

* Source: ``kernels/<family>.cu`` with local ``#include "x.cuh"`` lines inlined, so the exact
  text compiled is the cache key (CuPy keys its on-disk cache by source, options, arch and
  NVRTC version; an included header that changed would otherwise hit a stale entry).
* Target: the GPU present: ``sm_90a`` on Hopper (wgmma/TMA allowed), ``sm_120a`` on consumer
  Blackwell, plain ``sm_XY`` elsewhere.  ``BW24CHAT_PORTABLE=1`` compiles Hopper for plain
  ``sm_90`` so that the portable path (mma.sync, no wgmma/TMA) runs and is tested there;
  kernels select with ``#if defined(__CUDA_ARCH_FEAT_SM90_ALL)``.
* Specialization: ``defines`` become ``-D`` options (head dim, group size, tiles...).
* Cache: CuPy's kernel cache, placed in the platformdirs cache dir (paths.kernel_cache_dir),
  so a second start compiles nothing.
* Failure raises :class:`KernelCompileError` carrying the NVRTC log.

``compile_cubin`` compiles to a cubin for any arch *without a GPU* (NVRTC through ctypes, so
ptxas runs): the CI compile check of every kernel for sm_90a and sm_120a uses it.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import hashlib
import os
import re
import struct
import sys
import time
from pathlib import Path

import numpy as np

from ..paths import kernel_cache_dir

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.M)


class KernelCompileError(RuntimeError):
    def __init__(self, family: str, options: tuple, log: str):
        self.family, self.options, self.log = family, options, log
        super().__init__(f"NVRTC failed to compile kernels/{family}.cu with {' '.join(options)}:\n{log}")


def kernel_dir() -> Path:
    src = Path(__file__).resolve().parents[2] / "kernels"  # a source checkout: the kernels beside this package
    if (src / "__init__.py").exists():  # (before the installed package: an editable install may map another tree)
        return src
    try:
        from importlib.resources import files

        p = Path(str(files("bw24chat.kernels")))
        if (p / "__init__.py").exists():
            return p
    except (ModuleNotFoundError, TypeError):
        pass
    return src


def families() -> list[str]:
    return sorted(p.stem for p in kernel_dir().glob("*.cu"))


def load_source(family: str) -> str:
    root = kernel_dir()
    seen: set[str] = set()

    def inline(text: str) -> str:
        def sub(m):
            name = m.group(1)
            if name in seen:  # headers use #pragma once semantics
                return ""
            seen.add(name)
            return inline((root / name).read_text(encoding="utf-8"))

        return _INCLUDE.sub(sub, text)

    return inline((root / f"{family}.cu").read_text(encoding="utf-8"))


def arch_for(major: int, minor: int, portable: bool = False) -> str:
    cc = f"{major}{minor}"
    if portable:
        return f"sm_{cc}"
    if cc in ("90", "100", "120"):
        return f"sm_{cc}a"
    return f"sm_{cc}"


def _cuda_include_dirs() -> list[str]:
    dirs = []
    for env in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(env):
            dirs.append(os.path.join(os.environ[env], "include"))
    dirs += ["/usr/local/cuda/include"]
    for sp in sys.path:
        dirs += glob.glob(os.path.join(sp, "nvidia", "cu1*", "include"))
        dirs += glob.glob(os.path.join(sp, "nvidia", "cuda_runtime", "include"))
    return [d for d in dirs if os.path.exists(os.path.join(d, "cuda_fp16.h"))]


def _options(arch: str, defines: dict | None) -> tuple[str, ...]:
    # no --use_fast_math: exactness contracts rely on IEEE division, sqrt and expf/logf
    # -ftz=false: subnormals are values (NVFP4/E4M3 decoders, tiny probabilities), never zeros
    opts = [f"-arch={arch}", "-std=c++17", "-ftz=false", "-prec-div=true", "-prec-sqrt=true", "-DBW24_KERNEL=1"]
    for k, v in sorted((defines or {}).items()):
        opts.append(f"-D{k}={v}")
    inc = _cuda_include_dirs()
    if inc:
        opts.append(f"-I{inc[0]}")
    return tuple(opts)


# ----------------------------------------------------------------------------- CuPy path
def _device_arch() -> str:
    if _planning is not None:
        return _planning.props.arch
    import cupy

    return _real_arch(cupy.cuda.Device().id, os.environ.get("BW24CHAT_PORTABLE") == "1")


@functools.lru_cache(maxsize=None)
def _real_arch(device_id: int, portable: bool) -> str:
    import cupy

    cc = cupy.cuda.Device(device_id).compute_capability
    return arch_for(int(cc[:-1]), int(cc[-1]), portable=portable)


@functools.lru_cache(maxsize=None)
def get_module(family: str, defines: tuple = (), device: int = 0):
    """The compiled module for ``family`` with ``defines`` (a sorted tuple of (name, value)),
    loaded on CUDA device ``device`` (the current one when called: a module's functions launch
    only in the context it was loaded into, so each GPU of ``--gpus`` loads its own).
    Compiled by compile_cubin and loaded as a cubin, not through cupy.RawModule(code=...): CuPy
    appends -ftz=true to every compile, which would flush the subnormals the exactness contracts
    keep (_options); and so the kernels that run are the ones the NVRTC checks build.  Cubins are
    cached on disk by source, options and NVRTC version."""
    import cupy

    os.environ.setdefault("CUPY_CACHE_DIR", str(kernel_cache_dir()))  # CuPy's own kernels
    arch = _device_arch()
    src = load_source(family)
    key = hashlib.sha256(repr((src, _options(arch, dict(defines)), nvrtc_version())).encode()).hexdigest()[:32]
    path = kernel_cache_dir() / f"{family}-{arch}-{key}.cubin"
    try:
        os.utime(path)  # a hit: its mtime is its last use, which prune_kernel_cache keeps by
    except FileNotFoundError:
        cubin, _ = compile_cubin(family, arch, dict(defines))
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(cubin)
        os.replace(tmp, path)  # atomic: concurrent processes compile the same bytes
        prune_kernel_cache(path.parent)
    return cupy.RawModule(path=str(path))


KERNEL_CACHE_BYTES = 1 << 30  # the cubins kept on disk: every build of two versions and GPUs fits


def prune_kernel_cache(directory, limit: int = KERNEL_CACHE_BYTES) -> int:
    """Keep the kernel cache under ``limit`` bytes: past it, delete the least recently used
    cubins (get_module touches a cubin at each load) down to 3/4 of it, and temporary files
    a crashed compile left over an hour ago.  Every new source, option set or NVRTC version
    compiles new files; without this the cache grows with each update.  Only our own files
    (FAMILY-ARCH-KEY.cubin) are touched: CuPy keeps its cache in the same folder.  Returns the
    bytes deleted; files another process deletes first are skipped."""
    entries, now, freed = [], time.time(), 0
    for p in Path(directory).iterdir():
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        if p.suffix == ".tmp" and now - st.st_mtime > 3600:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        elif _CUBIN_NAME.fullmatch(p.name):
            entries.append((st.st_mtime, st.st_size, p))
    total = sum(size for _, size, _ in entries)
    if total <= limit:
        return 0
    for _, size, p in sorted(entries, key=lambda e: e[0]):
        if total - freed <= limit * 3 // 4:
            break
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
            freed += size
    return freed


_CUBIN_NAME = re.compile(r"[a-z0-9_]+-sm_\d+a?-[0-9a-f]{32}\.cubin")


class LaunchCounter:
    """Counts kernel launches made from Python (every launch goes through a Kernel wrapper).
    ``bw24chat check`` uses it to prove that graph decode launches nothing outside the graph."""

    count = 0


class Kernel:
    """A cupy.RawKernel that counts its launches; attribute access (e.g.
    ``max_dynamic_shared_size_bytes``) passes through to the RawKernel.  Inside ``tracing()`` a
    call is recorded as a KernelLaunch instead of made."""

    __slots__ = ("_raw", "family", "name", "defines", "label")

    def __init__(self, raw, family: str, name: str, defines: tuple = ()):
        object.__setattr__(self, "_raw", raw)
        object.__setattr__(self, "family", family)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "defines", defines)
        object.__setattr__(self, "label", name + "".join(f" {k}={v}" for k, v in defines))

    def __call__(self, grid, block, args, **kw):
        if _traced is not None:
            _traced.append(KernelLaunch(self, tuple(grid), tuple(block), tuple(args), int(kw.get("shared_mem", 0))))
            return None
        LaunchCounter.count += 1
        if pdl_enabled(self.name):
            return launch_pdl(self._raw, grid, block, args, kw.get("shared_mem", 0))
        return self._raw(grid, block, args, **kw)

    def __getattr__(self, item):
        return getattr(self._raw, item)

    def __setattr__(self, key, value):
        setattr(self._raw, key, value)


# ----------------------------------------------------------------- launch plans
class KernelLaunch:
    """One entry of a runner's decode plan: a kernel bound to its grid, block, arguments (device
    buffers at fixed addresses, scalars) and shared memory.  Calling it launches it."""

    __slots__ = ("kernel", "grid", "block", "args", "smem")

    def __init__(self, kernel: Kernel, grid: tuple, block: tuple, args: tuple, smem: int):
        self.kernel, self.grid, self.block, self.args, self.smem = kernel, grid, block, args, smem

    def __call__(self) -> None:
        self.kernel(self.grid, self.block, self.args, shared_mem=self.smem)

    def key(self) -> tuple:
        """What the plan decides: kernel, defines, grid, block, shared memory (plan.Launch.key)."""
        return self.kernel.family, self.kernel.name, self.kernel.defines, self.grid, self.block, self.smem


class HostStep:
    """A point of a plan where the host acts between launches (the MoE expert tiers: wait for the
    router's ids, copy the missed experts in): a graph of the plan ends before it and the next
    begins after it.  ``fn(stream)`` synchronizes with what it reads."""

    __slots__ = ("fn", "label")

    def __init__(self, fn, label: str):
        self.fn, self.label = fn, label

    def __call__(self) -> None:
        import cupy

        self.fn(cupy.cuda.get_current_stream())


_traced: list | None = None  # the plan being recorded (tracing)


@contextlib.contextmanager
def tracing():
    """Inside: kernel launches and host steps are recorded in order (the yielded list), not made;
    buffers the traced code allocates are real.  What a runner walks for each decode step."""
    global _traced
    prev, _traced = _traced, []
    try:
        yield _traced
    finally:
        _traced = prev


def plan_item(item) -> None:
    """Record a callable plan item (a collective of backends/cuda_sharded.py) in the plan being
    traced, or run it now."""
    if _traced is not None:
        _traced.append(item)
    else:
        item()


def host_step(fn, label: str) -> None:
    """Run ``fn(stream)`` now, or record it as a HostStep of the plan being traced."""
    if _traced is not None:
        _traced.append(HostStep(fn, label))
    else:
        HostStep(fn, label)()


# ----------------------------------------------------------------- programmatic dependent launch
# CuPy's RawKernel cannot pass launch attributes, so with PDL on (sm_90+) a kernel goes out
# through the driver's cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_
# SERIALIZATION: it may start while the one before it drains (its blocks run up to their
# pdl_wait, common.cuh), which CUDA graphs capture as programmatic edges.  Structures as in
# cuda.h (CUDA 12/13).  Every kernel but matvec_tc (the tensor-core decode matvec, whose early
# start measured slower: docs/performance.md).
PDL_OFF = ("matvec_tc",)


class _LaunchAttrValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("as_int", ctypes.c_int)]


class _LaunchAttr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _LaunchAttrValue)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttr)), ("numAttrs", ctypes.c_uint)]


_PROGRAMMATIC_STREAM_SERIALIZATION = 6
_ARG_TYPES = {np.int32: ctypes.c_int32, np.uint32: ctypes.c_uint32, np.int64: ctypes.c_int64,
              np.uint64: ctypes.c_uint64, np.float32: ctypes.c_float, np.float64: ctypes.c_double}


@functools.lru_cache(maxsize=None)
def _libcuda():
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    lib.cuLaunchKernelEx.restype = ctypes.c_int
    return lib


def pdl_supported() -> bool:
    """Programmatic dependent launch exists on this GPU (sm_90+)."""
    if _planning is not None:
        return _planning.props.cc >= 90
    return _device_pdl()


@functools.lru_cache(maxsize=None)
def _device_pdl() -> bool:
    import cupy

    return int(cupy.cuda.Device().compute_capability) >= 90  # "120" >= "90" is False as strings


_pdl_suspended = 0


@contextlib.contextmanager
def eager_launches():
    """Launch through CuPy (no PDL attribute) inside this block.  The prefill runs eagerly from
    Python, where a ctypes cuLaunchKernelEx costs ~30 us of host time per kernel against CuPy's
    ~6, and PDL measured no gain on the long prefill kernels; the decode graphs keep PDL."""
    global _pdl_suspended
    _pdl_suspended += 1
    try:
        yield
    finally:
        _pdl_suspended -= 1


def pdl_enabled(kernel_name: str = "") -> bool:
    return not _pdl_suspended and kernel_name not in PDL_OFF and pdl_supported()


def _arg(a):
    data = getattr(a, "data", None)
    if data is not None and hasattr(data, "ptr"):  # a CuPy array: its device address
        return ctypes.c_void_p(data.ptr)
    t = _ARG_TYPES.get(type(a))
    if t is None:
        raise TypeError(f"kernel argument of type {type(a).__name__}: pass CuPy arrays or NumPy scalars")
    return t(a.item())


def launch_pdl(raw, grid, block, args, shared_mem: int = 0) -> None:
    import cupy

    grid, block = tuple(grid) + (1,) * (3 - len(grid)), tuple(block) + (1,) * (3 - len(block))
    holders = [_arg(a) for a in args]
    params = (ctypes.c_void_p * max(1, len(holders)))(*[ctypes.cast(ctypes.pointer(h), ctypes.c_void_p) for h in holders])
    attr = _LaunchAttr()
    attr.id = _PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.as_int = 1
    cfg = _LaunchConfig(*grid, *block, int(shared_mem), ctypes.c_void_p(cupy.cuda.get_current_stream().ptr or None),
                        ctypes.pointer(attr), 1)
    rc = _libcuda().cuLaunchKernelEx(ctypes.byref(cfg), ctypes.c_void_p(raw.kernel.ptr), params, None)
    if rc != 0:
        raise RuntimeError(f"cuLaunchKernelEx failed with CUresult {rc} ({getattr(raw, 'name', '?')})")


_CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14  # cuda.h CUfunction_attribute
_nonportable_set: set = set()


def allow_nonportable_clusters(kernel: Kernel) -> None:
    """Let ``kernel`` run in thread-block clusters larger than the portable 8 (Hopper: up to 16),
    through the driver (CuPy's RawKernel has no such attribute).  Once per kernel."""
    if _planning is not None:  # a planned kernel: the launch record says the cluster size
        return
    ptr = int(kernel._raw.kernel.ptr)
    if ptr in _nonportable_set:
        return
    lib = _libcuda()
    rc = lib.cuFuncSetAttribute(ctypes.c_void_p(ptr), ctypes.c_int(_CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED),
                                ctypes.c_int(1))
    if rc != 0:
        raise RuntimeError(f"cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED) failed with CUresult {rc} ({kernel.name})")
    _nonportable_set.add(ptr)


@functools.lru_cache(maxsize=None)
def _kernel(family: str, name: str, defines: tuple, device: int) -> Kernel:
    return Kernel(get_module(family, defines, device).get_function(name), family, name, defines)


def get_kernel(family: str, name: str, **defines) -> Kernel:
    """A launchable kernel: ``k(grid, block, args, shared_mem=...)`` (memoized); while planning
    (backends/plan.py), its description, whose launches are recorded instead."""
    key = tuple(sorted(defines.items()))
    if _planning is not None:
        return _planning.kernel(family, name, key)
    import cupy

    return _kernel(family, name, key, cupy.cuda.runtime.getDevice())


# ----------------------------------------------------------------------------- planning
_planning = None  # a plan.Planner while a plan is traced (plan.planning)


def planning_active() -> bool:
    """Whether a plan is being traced without a GPU (plan.planning)."""
    return _planning is not None


def device_empty(name: str, shape, dtype):
    """cupy.empty(shape, dtype), or while planning a symbolic array labelled ``name`` (a buffer the
    traced code allocates: prefill scratch, the MoE prefill's groups)."""
    if _planning is not None:
        return _planning.empty(name, shape, dtype)
    import cupy

    return cupy.empty(shape, dtype)


def set_planning(planner) -> None:
    """Route device queries, kernel handles and launches to ``planner`` (None: the GPU)."""
    global _planning
    _planning = planner


def ptxas_registers(family: str, name: str, arch: str, defines: tuple) -> int:
    """Registers per thread of kernel ``name`` built with ``defines`` for ``arch``, as ptxas
    assigned them (NVRTC, no GPU): what the occupancy of a persistent grid depends on.  Read from
    the cubin, not from ptxas' -v report, which some NVRTC builds leave out of the program log."""
    key = (family, name, arch, defines)
    if key not in _registers:
        cubin, _ = compile_cubin(family, arch, dict(defines))
        regs = cubin_registers(cubin)
        if name not in regs:
            raise KernelCompileError(family, (), f"no register count for {name} in the cubin (kernels: {sorted(regs)})")
        _registers[key] = regs[name]
    return _registers[key]


def cubin_registers(cubin: bytes) -> dict[str, int]:
    """{kernel: registers per thread} of a cubin: the EIATTR_REGCOUNT (0x2f) records of its
    .nv.info section, each (symbol index, count), named through .symtab / .strtab (ELF64)."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    # (name offset, type, flags, addr, offset, size, link, info, addralign, entsize)
    sh = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]

    def cstr(base: int, off: int) -> str:
        return cubin[base + off:cubin.index(b"\0", base + off)].decode()

    by_name = {cstr(sh[shstrndx][4], h[0]): h for h in sh}
    symtab, info = by_name[".symtab"], by_name.get(".nv.info")
    strtab = sh[symtab[6]][4]
    names = [cstr(strtab, struct.unpack_from("<I", cubin, symtab[4] + 24 * i)[0]) for i in range(symtab[5] // 24)]
    out, p, end = {}, info[4] if info else 0, info[4] + info[5] if info else 0
    while p < end:
        fmt, attr = cubin[p], cubin[p + 1]
        size = struct.unpack_from("<H", cubin, p + 2)[0] if fmt == 0x04 else 0  # EIFMT_SVAL: sized payload
        if attr == 0x2F and size == 8:
            sym, n = struct.unpack_from("<II", cubin, p + 4)
            out[names[sym]] = n
        p += 4 + size
    return out


_registers: dict = {}


def active_arch() -> str:
    return _device_arch()


SMEM_BLOCK_SM90 = 227 * 1024


def smem_block_limit() -> int:
    """Dynamic shared memory one block may opt in to on this GPU: 227 KB on sm_90 / sm_100,
    99 KB on sm_86 / sm_89 / sm_120 (CUDA C++ Programming Guide, compute capability table).
    Wrappers whose kernels come in a smaller-footprint variant (fewer pipeline stages or
    buffers: the same arithmetic, the same bits) pick it from this, on every launch: so the
    device is asked once per device.  Without a GPU (compile-only paths, CI) the sm_90 figure."""
    try:
        return current_device_attribute("MaxSharedMemoryPerBlockOptin")
    except Exception:  # noqa: BLE001
        return SMEM_BLOCK_SM90


@functools.lru_cache(maxsize=None)
def device_attributes(device_id: int) -> dict:
    """The CUDA attributes of device ``device_id``, read once: they do not change, and CuPy's
    Device.attributes queries every one of them (~100 driver calls) each time it is read — the
    decode attention's split count (cuda_ops._n_sm) asked for the SM count on every eager launch.
    One cache per device for every reader (cuda_linear._sm_resources, cuda_ops._n_sm, the
    shared-memory limit)."""
    import cupy

    return dict(cupy.cuda.Device(device_id).attributes)


def current_device_attribute(name: str) -> int:
    """One attribute of the current device (device_attributes), or of the planned one."""
    if _planning is not None:
        return _planning.props.attribute(name)
    import cupy

    return int(device_attributes(cupy.cuda.Device().id)[name])


# ----------------------------------------------------------------------------- GPU-less path
def _find_nvrtc() -> str:
    cands = [os.environ.get("BW24CHAT_NVRTC", "")]
    for sp in sys.path:
        cands += sorted(glob.glob(os.path.join(sp, "nvidia", "cu1*", "lib", "libnvrtc.so*")), reverse=True)
        cands += sorted(glob.glob(os.path.join(sp, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so*")), reverse=True)
    cands += sorted(glob.glob("/usr/local/cuda/lib64/libnvrtc.so*"), reverse=True)
    for c in cands:
        if c and os.path.exists(c) and "builtins" not in c and "alt" not in c:
            return c
    raise FileNotFoundError("libnvrtc not found: pip install nvidia-cuda-nvrtc (or set BW24CHAT_NVRTC)")


@functools.lru_cache(maxsize=1)
def _nvrtc():
    lib = ctypes.CDLL(_find_nvrtc())
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


def nvrtc_version() -> tuple[int, int]:
    lib = _nvrtc()
    a, b = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(a), ctypes.byref(b))
    return a.value, b.value


def compile_cubin(family: str, arch: str, defines: dict | None = None, extra: tuple = (),
                  append: str = "") -> tuple[bytes, str]:
    """Compile kernels/<family>.cu to a cubin for ``arch`` (e.g. "sm_90a", "sm_120a") without a
    GPU.  Returns (cubin, log); raises KernelCompileError with the log on failure.  ``append``:
    source text compiled after the family's (tests: static_asserts on the kernels' macros)."""
    lib = _nvrtc()
    src = (load_source(family) + ("\n" + append if append else "")).encode()
    prog = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), src, f"{family}.cu".encode(), 0, None, None)
    if rc:
        raise RuntimeError(f"nvrtcCreateProgram: {lib.nvrtcGetErrorString(rc).decode()}")
    opts = [o.replace("-arch=", "--gpu-architecture=") for o in _options(arch, defines)] + list(extra)
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    try:
        rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
        n = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace")
        if rc:
            raise KernelCompileError(family, tuple(opts), log)
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
        out = ctypes.create_string_buffer(n.value)
        if lib.nvrtcGetCUBIN(prog, out):
            raise KernelCompileError(family, tuple(opts), "nvrtcGetCUBIN failed (is the arch a real sm_XY?)\n" + log)
        return out.raw, log
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
