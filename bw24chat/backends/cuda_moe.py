"""Mixture-of-experts on the CUDA backend: resident expert storage, the router kernel, the decode
expert kernels and the prefill's grouped GEMMs.  Contracts: kernels/moe_router.cu,
kernels/moe_experts.cu, kernels/moe_group.cu; references: numpy_backend.route_logits,
NumpyOps.experts, kernel_refs.moe_group_ref.

Expert storage (``CudaExperts``, one per layer): VRAM *slots*, each one expert's image (its
gate|up and down planes in the dense resident layout, cuda_weights.repack_host's bytes, at fixed
offsets, repacked on the GPU from the checkpoint's blocks: kernels/repack.cu), and per projection (``ExpertStore``) a device table u64 [E, 5] of each expert's plane
pointers {q, h, s, d, gscale}.  The kernels read experts only through the tables, so the tiers
(cuda_tiers) move an expert by one copy of its image into a slot and a rewrite of its table rows:
no kernel changes, no recapture (the graph reads the tables' contents, not their values at
capture time), the same bits wherever the expert came from.

Decode (graph-captured, no host access): router matvec (rmsnorm prologue) -> moe_router ->
moe_gu (rmsnorm staged in the block, SwiGLU epilogue) -> [shared expert: two dense matvecs] ->
moe_down (k dot products per output, combined in ranking order, + shared, + residual);
the quantized formats on the dense matvec's integer dot (dot_a8.cuh).
Prefill (eager; kernels/moe_group.cu): moe_group sorts the chunk's (token, slot) assignments by
expert on the device (counts, offsets, the permutation and its inverse), then one grouped GEMM per
projection runs every expert's gathered rows (gate|up with the SwiGLU epilogue, then down into the
grouped Y), and moe_combine adds each row's k outputs through the inverse permutation in ranking
order.  Resident layers: no host access.  Spilled layers (cuda_tiers): the ids come to the host,
the resident experts run in one pass, each other expert is streamed into a staging slot and runs
by itself through the same kernels; every output row is the same bits either way.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import cuda_linear as lin, kernel_build
from .cuda_weights import FORMATS, PLANES, DeviceWeight, fmt_id, fused_shape, plane_shapes, repack_host, repack_on_device, vpc
from .kernel_build import get_kernel
from .kernel_refs import act_q8
from .tuning import GROUPED_GEMM_TILES, MOE_TUNING

ALIGN = 256  # each plane of an expert image starts on a 256-byte boundary (the kernels' 16-byte loads)


@dataclass(frozen=True)
class ImageLayout:
    """Where one projection's planes sit inside an expert's image: (name, offset, shape, dtype)
    of each plane the format has; ``end`` the first byte after them."""
    planes: tuple
    end: int


def _place(shapes: dict, start: int) -> ImageLayout:
    """The planes of cuda_weights.plane_shapes, each ALIGN-aligned from ``start`` on."""
    off, out = start, []
    for name, (shape, dt) in shapes.items():
        off = -(-off // ALIGN) * ALIGN
        out.append((name, off, tuple(shape), np.dtype(dt).str))
        off += int(np.prod(shape)) * np.dtype(dt).itemsize
    return ImageLayout(tuple(out), off)


def expert_layouts(gate, up, down) -> tuple[ImageLayout, ImageLayout, int]:
    """(gate|up layout, down layout, image bytes) of one expert image of these ExpertTensors."""
    E, F, D = gate.shape
    gu = _place(plane_shapes(gate.fmt, 2 * F, D), 0)
    dn = _place(plane_shapes(down.fmt, D, F), gu.end)
    return gu, dn, -(-dn.end // ALIGN) * ALIGN


def _pinned(shape, dtype) -> np.ndarray:
    import cupy as cp

    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.frombuffer(cp.cuda.alloc_pinned_memory(max(n, 1)), dtype, int(np.prod(shape))).reshape(shape)


@dataclass
class ExpertStore:
    """One projection of a layer's routed experts: its planes' places inside an expert image and
    the per-expert pointer table the kernels read (u64 [E, 5], a pinned host mirror beside it)."""
    fmt: str
    n_experts: int
    out: int
    in_: int
    layout: ImageLayout
    table: object  # CuPy uint64 [E, 5]
    host_table: np.ndarray  # pinned: the copy to the device is asynchronous
    global_scales: list = field(default_factory=list)  # per expert (NVFP4)
    nbytes: int = 0  # all experts' planes
    role: str = ""

    @property
    def expert_nbytes(self) -> int:
        return sum(int(np.prod(sh)) * np.dtype(dt).itemsize for _, _, sh, dt in self.layout.planes)

    def row(self, base: int) -> np.ndarray:
        """The table row (u64 [5]) of an expert whose image sits at device address ``base``."""
        out = np.zeros(len(PLANES), np.uint64)
        for name, off, _shape, _dt in self.layout.planes:
            out[PLANES.index(name)] = base + off
        return out

    def point(self, e: int, base: int) -> None:
        """Expert e's table row at the image at device address ``base`` (0: not resident; the
        host mirror only: CudaExperts.sync_tables sends it)."""
        self.host_table[e] = self.row(base) if base else 0

    def weight(self, e: int, image) -> DeviceWeight:
        """Expert e as a dense DeviceWeight over ``image`` (the u8 device bytes of its slot): the
        prefill's lin.gemm."""
        pl = dict.fromkeys(PLANES)
        for name, off, shape, dt in self.layout.planes:
            n = int(np.prod(shape)) * np.dtype(dt).itemsize
            pl[name] = image[off:off + n].view(np.dtype(dt)).reshape(shape)
        gs = self.global_scales[e] if self.global_scales else 1.0
        return DeviceWeight(self.fmt, self.out, self.in_, pl["q"], pl["h"], pl["s"], pl["d"], pl["gscale"], gs,
                            self.expert_nbytes, fmt_id(self.fmt), vpc(self.fmt), role=self.role)


@dataclass
class CudaExperts:
    """A layer's routed experts (ops.Loader.load_experts on CUDA): VRAM slots of expert images
    (gate|up and down planes of one expert together, one copy moves an expert), the two
    projections' pointer tables, and where each expert's image comes from.  All experts resident:
    slot e holds expert e.  Spilled (cuda_tiers): fewer slots, filled as the router asks.  One GPU
    of a model split over several (cuda_sharded.py) holds experts first .. first + count - 1 of
    the layer's E (its tables still have E rows, the others null; the kernels skip them)."""
    gu: ExpertStore  # (E, 2F, D), rows gate_0, up_0, ...
    down: ExpertStore  # (E, D, F)
    slab: object  # CuPy uint8 (slots, image_bytes)
    image_bytes: int
    source: "ExpertSource"
    slot_of: dict = field(default_factory=dict)  # resident expert -> slot
    layer: int = 0  # among the model's MoE layers
    tiers: object = None  # cuda_tiers.CudaTiers when the experts are spilled
    first: int = 0  # the experts this GPU holds: first .. first + count - 1 (None: every one)
    count: int | None = None

    @property
    def held(self) -> tuple[int, int]:
        """[lo, hi) of the expert indices this GPU computes (the kernels' lo, hi)."""
        return self.first, self.first + (self.n_experts if self.count is None else self.count)

    @property
    def partial(self) -> bool:
        """This GPU holds a range of the layer's experts only (the kernels' MOE_HELD build)."""
        lo, hi = self.held
        return hi - lo < self.n_experts

    @property
    def nbytes(self) -> int:
        return self.gu.nbytes + self.down.nbytes

    @property
    def n_experts(self) -> int:
        return self.gu.n_experts

    def slot_ptr(self, slot: int) -> int:
        return int(self.slab.data.ptr) + slot * self.slab.shape[1]

    def place(self, e: int, slot: int) -> None:
        self.slot_of[e] = slot
        for st in (self.gu, self.down):
            st.point(e, self.slot_ptr(slot))

    def evict(self, e: int) -> None:
        self.slot_of.pop(e, None)
        for st in (self.gu, self.down):
            st.point(e, 0)

    def sync_tables(self, stream) -> None:
        """Send both tables' host mirrors to the device, on ``stream``."""
        import cupy as cp

        rt = cp.cuda.runtime
        for st in (self.gu, self.down):
            rt.memcpyAsync(st.table.data.ptr, st.host_table.ctypes.data, st.host_table.nbytes,
                           rt.memcpyHostToDevice, stream.ptr)

    def weights(self, e: int, image=None) -> tuple[DeviceWeight, DeviceWeight]:
        """(gate|up, down) of expert e over ``image`` (default: its resident slot) as dense
        weights (tests: the grouped prefill against the per-expert GEMMs)."""
        if image is None:
            image = self.slab[self.slot_of[e]]
        return self.gu.weight(e, image), self.down.weight(e, image)


class ExpertSource:
    """Expert images from the checkpoint's expert tensors (views into the model file, or arrays):
    their bytes as the checkpoint holds them (``raw_into``), repacked into the resident planes at
    their ImageLayout places on the GPU (``repack_on_device``) or, as its NumPy mirror, on the
    host (``image``)."""

    def __init__(self, gate, up, down, gu_layout: ImageLayout, down_layout: ImageLayout, image_bytes: int):
        self.gate, self.up, self.down = gate.parts, up.parts, down.parts
        self.layouts, self.image_bytes = (gu_layout, down_layout), image_bytes

    def _projections(self, e: int):
        """(tensors, interleaved, layout) of expert e's gate|up and down projections."""
        return (([self.gate[e], self.up[e]], True, self.layouts[0]), ([self.down[e]], False, self.layouts[1]))

    def image(self, e: int, out: np.ndarray | None = None) -> np.ndarray:
        """Expert e's image (u8 [image_bytes]) built on the host into ``out``
        (cuda_weights.repack_host's planes at their places): repack_on_device's reference."""
        if out is None:
            out = np.zeros(self.image_bytes, np.uint8)
        for src, inter, lay in self._projections(e):
            hp = repack_host(src, interleave=inter)
            for name, off, _shape, _dt in lay.planes:
                a = getattr(hp, name)
                out[off:off + a.nbytes] = a.reshape(-1).view(np.uint8)
        return out

    def parts(self, e: int) -> list:
        """Expert e's tensors (gate, up, down): raw_into's order."""
        return [self.gate[e], self.up[e], self.down[e]]

    @property
    def raw_bytes(self) -> int:
        """Bytes of one expert's tensors as the checkpoint holds them."""
        return sum(t.raw.nbytes for t in self.parts(0))

    def raw_into(self, e: int, out: np.ndarray) -> None:
        """Expert e's tensors' bytes as the checkpoint holds them (gate, up, down), into ``out``
        (a pinned staging buffer): from a memory-mapped file, the read itself."""
        off = 0
        for t in self.parts(e):
            a = np.ascontiguousarray(t.raw).reshape(-1).view(np.uint8)
            out[off:off + a.size] = a
            off += a.size

    def repack_on_device(self, e: int, raw: int, image: int) -> None:
        """Expert e's image at device address ``image`` from its raw_into bytes at device address
        ``raw``, on the current stream (cuda_weights.repack_on_device: the bytes of ``image(e)``)."""
        off = 0
        for ts, inter, lay in self._projections(e):
            planes = {name: image + o for name, o, _shape, _dt in lay.planes}
            r0 = 0
            for j, t in enumerate(ts):
                repack_on_device(t, raw + off, planes, len(ts) if inter else 1, j if inter else r0)
                off += t.raw.nbytes
                r0 += int(t.shape[0])


def check_format(fmt: str, F: int, D: int) -> None:
    """Refuse what the expert kernels do not handle, by name."""
    if fmt not in FORMATS:
        raise NotImplementedError(f"MoE experts in {fmt}: no CUDA expert kernel for this format "
                                  f"(supported: {', '.join(FORMATS)})")
    unit = 32 if act_q8(fmt) else max(4, vpc(fmt))
    for name, n in (("hidden size", D), ("expert width", F)):
        if n % unit or n % vpc(fmt):
            raise NotImplementedError(f"MoE experts in {fmt}: {name} {n} is not a multiple of {unit}")


def load_experts(gate, up, down, slots: int | None = None, first: int = 0, n_table: int | None = None) -> CudaExperts:
    """ops.Loader.load_experts: gate, up (E, F, D) and down (E, D, F) ExpertTensors, into
    ``slots`` VRAM slots (default all E: every expert resident) holding experts 0 .. slots-1,
    each copied as the checkpoint holds it and repacked on the GPU.  A GPU of a split model
    (cuda_sharded.py): the tensors are its experts first .. first + E - 1 of the layer's
    ``n_table``; the tables have a row for each of those, null outside the range."""
    count, F, D = gate.shape
    E = count if n_table is None else n_table
    if first < 0 or first + count > E:
        raise ValueError(f"experts {first}..{first + count - 1} outside the layer's {E}")
    for t in (gate, up, down):
        check_format(t.fmt, F, D)
    fused_shape([gate.parts[0], up.parts[0]], interleave=True)  # gate and up: one format (one interleaved matrix)
    fused_shape([down.parts[0]])
    import cupy as cp

    gu_lay, dn_lay, image_bytes = expert_layouts(gate, up, down)
    src = ExpertSource(gate, up, down, gu_lay, dn_lay, image_bytes)
    S = count if slots is None else slots
    slab = cp.empty((S, image_bytes), cp.uint8)
    stores = []
    for lay, role, parts, rows, in_ in ((gu_lay, "experts_gu", (gate.parts, up.parts), 2 * F, D),
                                        (dn_lay, "experts_down", (down.parts,), D, F)):
        host_table = _pinned((E, len(PLANES)), np.uint64)
        host_table[:] = 0
        gs = []
        if parts[0][0].fmt == "NVFP4":  # each expert's per-tensor scales (the prefill GEMM's), by table row
            gs = [1.0] * E
            for e in range(count):
                scales = [float(p[e].global_scale) for p in parts]
                gs[first + e] = scales[0] if len(set(scales)) == 1 else tuple(scales)
        nbytes = count * sum(int(np.prod(sh)) * np.dtype(dt).itemsize for _, _, sh, dt in lay.planes)
        stores.append(ExpertStore(parts[0][0].fmt, E, rows, in_, lay, cp.zeros((E, len(PLANES)), cp.uint64), host_table,
                                  gs, nbytes, role))
    ex = CudaExperts(stores[0], stores[1], slab, image_bytes, src, first=first, count=count)
    raw = cp.empty(src.raw_bytes, cp.uint8)
    stage = np.empty(src.raw_bytes, np.uint8)
    for e in range(S):
        src.raw_into(e, stage)
        raw.set(stage, stream=cp.cuda.get_current_stream())  # after the last repack; stage is free when it returns
        src.repack_on_device(e, int(raw.data.ptr), int(slab[e].data.ptr))
        ex.place(first + e, e)
    ex.sync_tables(cp.cuda.get_current_stream())
    cp.cuda.get_current_stream().synchronize()  # the host tables are reused
    return ex


# ----------------------------------------------------------------------------- router
def router_threads(E: int) -> int:
    """moe_router's block: a thread per expert (whole warps, at most 1024)."""
    return min(1024, 32 * -(-E // 32))


def router(logits, bias, ids, w, T: int, spec) -> None:
    """moe_router over T rows of logits (T, E) f32 -> ids (T, k) int32, w (T, k) f32."""
    E, k = spec.n_experts, spec.top_k
    if E > 1024 or k > 32 or spec.n_group > 32 or E % spec.n_group or (spec.n_group > 1 and E // spec.n_group < 2):
        raise NotImplementedError(f"moe_router: E {E} <= 1024, k {k} <= 32, n_group {spec.n_group} <= 32 dividing E")
    if T <= 0:
        return
    kern = get_kernel("moe_router", "moe_router")
    kern((T,), (router_threads(E),), (logits, lin._ptr(bias), ids, w, np.int32(T), np.int32(E), np.int32(k),
                       np.int32(0 if spec.scoring == "softmax" else 1), np.int32(bool(spec.norm_topk_prob)),
                       np.int32(spec.n_group), np.int32(spec.topk_group), np.float32(spec.scale)))


# ----------------------------------------------------------------------------- decode
MOE_R = 1  # moe_experts.cu MOE_R's default: outputs per unit of moe_down
MAX_K = 32  # moe_experts.cu MOE_MAX_K
STATIC_SMEM = 3 * 4 * MAX_K  # the kernels' static shared memory (ids, w, the rmsnorm statistic)


def geometry(kern: str, fmt: str, partial: bool = False) -> dict:
    """MOE_TUNING's defines for moe_{kern} on ``fmt`` (a copy).  A GPU of a split model (``partial``:
    the MOE_HELD build) keeps its row's held-slot mask live beside moe_down's window, which then
    takes one item fewer (the Q4_K integer-dot build would spill a register on sm_120a)."""
    geo = dict(MOE_TUNING.get((kern, fmt), MOE_TUNING[(kern, "*")]))
    if partial and kern == "down":
        geo["MOE_U"] = max(1, geo.get("MOE_U", 4) - 1)
    return geo


def _defines(fmt: str) -> dict:
    return {"FMT": fmt_id(fmt), **({"ACT_Q8": 1} if act_q8(fmt) else {})}


def _padded(n: int, fmt: str) -> int:
    wt = 32 * vpc(fmt)
    return -(-n // wt) * wt


def gu_blocks(F: int, k: int, m: int, nw: int, resident: int, sms: int) -> int:
    """Blocks per row of moe_gu: the blocks the GPU holds at once (sms x resident) spread over
    the m rows, each taking an even share of the row's k*F gate / up pairs, at least one a warp."""
    return max(1, min(-(-k * F // nw), -(-sms * resident // m)))


def down_rows(D: int, m: int, r: int, resident: int, sms: int) -> int:
    """Outputs per block of moe_down (a multiple of r, the outputs of a unit): the blocks the GPU
    holds at once spread over the m rows' D outputs."""
    rb = -(-D // max(1, -(-sms * resident // m)))
    return -(-rb // r) * r


def _table_smem(E: int) -> int:
    """The expert table in shared memory (moe_experts.cu: 5 pointers per expert, whole 16 bytes)."""
    return 8 * ((5 * E + 1) & ~1)


def x_smem(fmt: str, n: int) -> int:
    """One staged x segment of n inputs (moe_experts.cu XSeg): the integer-dot contract's two
    code planes and two 16-byte records per 32 inputs (dot_a8.cuh), else the swizzled floats."""
    return 3 * n if act_q8(fmt) else 4 * _padded(n, fmt)


def down_smem(fmt: str, F: int, k: int, rb: int, E: int) -> int:
    """moe_down's dynamic shared memory: the expert table, the residual and shared rows and the k
    expert outputs y_j of its rb outputs (whole 16 bytes), and the k staged inputs."""
    return _table_smem(E) + 4 * (2 + k) * (-(-rb // 4) * 4) + k * x_smem(fmt, F)


def gu_smem(fmt: str, D: int, E: int) -> int:
    """moe_gu's dynamic shared memory: the expert table and the staged input."""
    return _table_smem(E) + x_smem(fmt, D)


def _sms() -> int:
    return lin._sm_resources()[0]


def _expert_kernel(name: str, fmt: str, k: int, geo: dict, partial: bool = False):
    if k > MAX_K:
        raise NotImplementedError(f"{name}: {k} experts per row (at most {MAX_K})")
    return get_kernel("moe_experts", name, **_defines(fmt), **geo, **({"MOE_HELD": 1} if partial else {}))


def experts_gu(ex: CudaExperts, x, ids, act, m: int, k: int, norm_w=None, eps: float = 1e-6, xb16: bool = False,
               geo: dict | None = None) -> None:
    """act (m, k, F) = swiglu(gu_{ids[t, j]} @ xin[t]), xin = rmsnorm(x) * norm_w when norm_w is
    given (the deferred rmsnorm), else x.  geo: moe_experts.cu defines instead of MOE_TUNING's
    (tests: the outputs do not depend on them)."""
    g = ex.gu
    D, F = g.in_, g.out // 2
    geo = geometry("gu", g.fmt) if geo is None else geo
    kern = _expert_kernel("moe_gu", g.fmt, k, geo, ex.partial)
    smem, nt = gu_smem(g.fmt, D, g.n_experts), 32 * geo.get("MOE_NW", 8)
    lin._ensure_smem(kern, smem)
    gx = gu_blocks(F, k, m, nt // 32, lin.resident_blocks(kern, nt, smem + STATIC_SMEM), _sms())
    kern((gx, m), (nt,), (g.table, x, lin._ptr(norm_w), ids, act, np.int32(D), np.int32(F), np.int32(k),
                          np.int32(g.n_experts), np.int32(1 if norm_w is not None else 0), np.int32(bool(xb16)),
                          np.float32(eps), *map(np.int32, ex.held)), shared_mem=smem)


def experts_down(ex: CudaExperts, act, ids, w, shared, res, m: int, k: int, xb16: bool = False,
                 geo: dict | None = None, add: bool = True) -> None:
    """res (m, D) += sum_j w[t, j] * (down_{ids[t, j]} @ act[t, j]) (ranking order) + shared
    (add False: res = that sum, a GPU's partial of a split model).  geo: as experts_gu's."""
    d = ex.down
    D, F = d.out, d.in_
    geo = geometry("down", d.fmt, ex.partial) if geo is None else geo
    r, nt, E = geo.get("MOE_R", MOE_R), 32 * geo.get("MOE_NW", 8), d.n_experts
    limit = kernel_build.smem_block_limit()
    if down_smem(d.fmt, F, k, r, E) > limit:
        raise NotImplementedError(f"moe_down stages k x F = {k} x {F} inputs and {E} experts' pointers: "
                                  f"{down_smem(d.fmt, F, k, r, E)} bytes of shared memory")
    kern = _expert_kernel("moe_down", d.fmt, k, geo, ex.partial)
    # resident blocks at r outputs a block (the outputs' rows are a small share of the block's memory)
    rb = down_rows(D, m, r, lin.resident_blocks(kern, nt, down_smem(d.fmt, F, k, r, E) + STATIC_SMEM), _sms())
    room = (limit - down_smem(d.fmt, F, k, 0, E)) // (16 * (2 + k)) * 4  # outputs whose rows fit, whole 16 bytes
    rb = min(rb, room // r * r)
    smem = down_smem(d.fmt, F, k, rb, E)
    lin._ensure_smem(kern, smem)
    kern((-(-D // rb), m), (nt,), (d.table, act, ids, w, lin._ptr(shared), res, np.int32(D), np.int32(F), np.int32(k),
                                   np.int32(E), np.int32(rb), np.int32(bool(xb16)), *map(np.int32, ex.held),
                                   np.int32(add)), shared_mem=smem)


# ----------------------------------------------------------------------------- prefill
MG_NT = 256  # moe_group.cu: threads of moe_group


def group_tile(n: int, E: int) -> int:
    """Tokens per tile of the grouped GEMMs (moe_group.cu GG_BM) for n assignments over E
    experts: the first of GROUPED_GEMM_TILES that the mean rows per expert fill to at most two
    thirds (else the last).  The rows' values do not depend on it."""
    return next((t for t in GROUPED_GEMM_TILES if 3 * n <= 2 * t * E), GROUPED_GEMM_TILES[-1])


@dataclass
class Groups:
    """A chunk's assignments grouped by expert (moe_group.cu moe_group; reference
    kernel_refs.moe_group_ref), on the device: offs, toff int32 [E + 1], tok, pos int32 [n]."""
    offs: object
    toff: object
    tok: object
    pos: object
    n: int
    E: int
    bm: int

    @property
    def max_tiles(self) -> int:
        """The grouped GEMMs' grid rows without reading toff back: a bound on its last entry."""
        return min(self.n, (self.n + min(self.E, self.n) * (self.bm - 1)) // self.bm)


def group(ids, T: int, k: int, E: int, bm: int) -> Groups:
    """moe_group over the T rows of ids (T, k) int32 (the router's): no host access."""
    n = T * k
    if E > 1024:
        raise NotImplementedError(f"moe_group: E {E} <= 1024")
    g = Groups(*(kernel_build.device_empty(name, size, np.int32) for name, size in
                 (("moe_offs", E + 1), ("moe_toff", E + 1), ("moe_tok", n), ("moe_pos", n))), n, E, bm)
    get_kernel("moe_group", "moe_group")((E,), (MG_NT,), (ids, np.int32(n), np.int32(k), np.int32(E), np.int32(bm), g.offs,
                                                         g.toff, g.tok, g.pos))
    return g


def grouped_gemm(st: ExpertStore, tab, g: Groups, x, out, epilogue: str = "store", gather: bool = False, rows=None,
                 act_bf16: bool = False, tag: str = "x", e0: int = 0, tiles: int | None = None) -> None:
    """out[r] = W_e x[src(r)] for the grouped rows r of every expert e the table ``tab`` of the
    projection ``st`` has (moe_group.cu gemm_grouped / gemm_i8_grouped): src(r) = g.tok[r] with
    gather (x: the chunk's rows), else r (x: grouped rows).  epilogue "swiglu": gate|up rows
    interleaved, out[r, i] = silu(y[2i]) y[2i + 1].  The GEMM contract is lin.gemm's on the
    portable kernels (impl "mma": gemm_i8_mma for Q8_0's prefill, else gemm_mma), so each
    row equals lin.gemm(W_e, ..., impl="mma") bit for bit.  x is prepared (planes / QX rows,
    scratch ``tag``) for x rows [rows[0], rows[1]) (default all: g.n grouped rows, or the chunk's
    x.shape[0]).  e0, tiles: only the tiles of experts e0.. (default all: the bound g.max_tiles;
    a spilled layer's streamed expert: its own ceil(count / bm))."""
    c = lin.gemm_contract(st, act_bf16, impl="mma")
    r0, r1 = rows if rows is not None else (0, x.shape[0] if gather else g.n)
    xop, xl = lin.mma_operands(c, x, r1, st.in_, tag, r0)
    fid = fmt_id(st.fmt)
    if c.i8:
        kern, smem, bn = get_kernel("moe_group", "gemm_i8_grouped", FMT=fid, GG_BM=g.bm), lin.gemm_i8_mma_smem(g.bm), 8192 // g.bm
        lin._ensure_smem(kern, smem)
        xargs = (xop,)
    else:
        kern, smem = lin._gemm_kernel(fid, c.x_split, c.w_split, "moe_group", "gemm_grouped", g.bm, GG_BM=g.bm,
                                      **({"GEMM_XPLANES": 1} if c.a8 else {}))
        bn, xargs = lin.GM_TILE, (xop, lin._ptr(xl))
    grid = (-(-st.out // bn), g.max_tiles if tiles is None else tiles)
    if grid[1] <= 0:
        return
    kern(grid, (256,), (tab, g.offs, g.toff, np.int32(g.E), np.int32(e0), g.tok if gather else lin._NULL, *xargs, out,
                        np.int32(st.out), np.int32(st.in_), np.int32(lin.EPILOGUES[epilogue])), shared_mem=smem)


def prefill_experts(ex: CudaExperts, h, ids, w, shared, res, T: int, k: int, act_bf16: bool = False,
                    add: bool = True) -> None:
    """res (T, D) += sum_j w[t, j] * expert_{ids[t, j]}(h[t]) (ranking order) + shared (add False:
    res = that sum; a GPU of a split model computes the experts it holds, ex.held): the
    chunk's assignments grouped by expert (moe_group), the grouped gate|up (SwiGLU epilogue) and
    down GEMMs, moe_combine through the inverse permutation.  Spilled layers (ex.tiers): the
    resident experts in one pass, then each other one streamed into a staging slot
    (cuda_tiers.CudaTiers.stream, the next copy overlapping this one's GEMMs) and run by itself
    through the same kernels: the resident run's bits."""
    from .kernel_refs import moe_group_ref

    if T <= 0:
        return
    E, F, D = ex.gu.n_experts, ex.gu.out // 2, ex.gu.in_
    n = T * k
    g = group(ids, T, k, E, group_tile(n, E))
    act = kernel_build.device_empty("moe_act", (n, F), np.float32)
    Y = kernel_build.device_empty("moe_y", (n, D), np.float32)
    streamed = ()
    if ex.tiers is not None:
        import cupy as cp

        ids_h = cp.asnumpy(ids[:T])  # synchronizes (the router's ids): before the resident pass is queued
        offs = moe_group_ref(ids_h, E, g.bm)[0]
        streamed = ex.tiers.stream(ex, [int(e) for e in np.unique(ids_h)])
    opts = dict(act_bf16=act_bf16)
    grouped_gemm(ex.gu, ex.gu.table, g, h, act, "swiglu", gather=True, rows=(0, T), tag="moe_x", **opts)
    grouped_gemm(ex.down, ex.down.table, g, act, Y, **opts)
    for e, tab_gu, tab_down in streamed:  # x's planes (tag moe_x) stay as the resident pass made them
        r0, r1 = int(offs[e]), int(offs[e + 1])
        tiles = -(-(r1 - r0) // g.bm)
        grouped_gemm(ex.gu, tab_gu, g, h, act, "swiglu", gather=True, rows=(T, T), tag="moe_x", e0=e, tiles=tiles, **opts)
        grouped_gemm(ex.down, tab_down, g, act, Y, rows=(r0, r1), e0=e, tiles=tiles, **opts)
    combine(Y, w, shared, res, T, k, ids, g.pos, ex.held, add)


def combine(Y, w, shared, res, T: int, k: int, ids, pos=None, held: tuple[int, int] | None = None,
            add: bool = True) -> None:
    """res (T, D) += sum_j w[t, j] * Y[pos[t k + j]] (ranking order; pos None: row t k + j) +
    shared: moe_combine.  ``held``: [lo, hi) of the experts computed here (default every one);
    the others' y count as 0.  add False: res = the sum (a GPU's partial of a split model)."""
    D = res.shape[-1]
    if T <= 0:
        return
    lo, hi = (0, np.iinfo(np.int32).max) if held is None else held
    get_kernel("moe_experts", "moe_combine")((-(-D // 256), T), (256,),
                                             (Y, w, lin._ptr(shared), res, np.int32(T), np.int32(D), np.int32(k), lin._ptr(pos),
                                              ids, np.int32(lo), np.int32(hi), np.int32(add)))
