"""CPU mirror of kernels/matvec_mma.cu's data movement, lane by lane: the ring stage as the copies
lay it out (q rows at a 528-byte pitch, the k-tile's scale bytes), x's code planes as the staging
writes them (a8_word positions, planes n_in + 16 bytes apart) and its scale records, the ldmatrix
row addresses each lane supplies and the registers each lane receives, the MMA fragment layouts of
the PTX ISA (m16n8k16 / m16n8k32, s8), the NVFP4 byte trick (PRMT with sign replication), the chain
steps of each lane (float32, FMAs by fma32), the warp's own tree levels, the pass buffer's
indices and the combine's tree — replayed in NumPy with the kernel's own index formulas, for every
warp of every pass of every block.  The rows must equal the contract's bits
(kernel_refs.matvec_a8_exact).  A wrong address, fragment, byte or buffer index fails here without
a GPU; tests/gpu/test_matvec_mma.py then checks the kernel itself."""
import numpy as np
import pytest

from bw24chat import quants
from bw24chat.backends import cuda_weights as cw
from bw24chat.backends.kernel_refs import act_quant_codes, fma32, matvec_a8_exact
from tests.test_repack import random_qtensor

F32 = np.float32
LANES = np.arange(32)
G, T = LANES >> 2, LANES & 3


def pow2(e) -> np.ndarray:
    return ((127 + np.asarray(e, np.int64)).astype(np.uint32) << np.uint32(23)).view(F32)


def ldmatrix(mem: np.ndarray, addr: np.ndarray, n: int) -> np.ndarray:
    """ldmatrix .x{n} (.b16 m8n8): matrix q's row r at the 16 bytes from addr[8 q + r]; lane l
    receives, per matrix, row l / 4's bytes 4 (l % 4) .. + 3 as a little-endian u32.  [32, n]."""
    out = np.zeros((32, n), np.uint32)
    for q in range(n):
        for lane in range(32):
            a = int(addr[8 * q + (lane >> 2)]) + 4 * (lane & 3)
            out[lane, q] = mem[a:a + 4].view("<u4")[0]
    return out


def s8(w: np.ndarray) -> np.ndarray:
    """u32 words [...] -> their 4 bytes as signed ints [..., 4] (byte i = k-slot 4t + i)."""
    return np.ascontiguousarray(w.astype("<u4")).view(np.int8).reshape(w.shape + (4,)).astype(np.int64)


def mma(a_regs: list, b_regs: list, c: int) -> np.ndarray:
    """mma.sync.m16n8k{16 len(b_regs)}.row.col.s32.s8.s8.s32 over per-lane registers ([32] u32
    each): A a0 / a1 rows g / g + 8 at k 4t + i, a2 / a3 the same at k + 16; B b0 (b1) column g at k
    4t + i (+16); D d0, d1 = row g, columns 2t, 2t + 1; d2, d3 row g + 8.  Returns [32, 4] int64
    (int32 wrap-around: none occurs here)."""
    K = 16 * len(b_regs)
    A, B = np.zeros((16, K), np.int64), np.zeros((K, 8), np.int64)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for h in range(len(b_regs)):
            A[g, 16 * h + 4 * t:16 * h + 4 * t + 4] = s8(a_regs[2 * h][lane])
            A[g + 8, 16 * h + 4 * t:16 * h + 4 * t + 4] = s8(a_regs[2 * h + 1][lane])
            B[16 * h + 4 * t:16 * h + 4 * t + 4, g] = s8(b_regs[h][lane])
    D = A @ B + c
    return np.stack([D[G, 2 * T], D[G, 2 * T + 1], D[G + 8, 2 * T], D[G + 8, 2 * T + 1]], -1)


def prmt(a: int, b: int, sel: int) -> int:
    """PTX prmt.b32, default mode: result byte j from selector nibble j: byte (nibble & 7) of {b, a}
    (a: bytes 0-3), or with the nibble's bit 3 that byte's sign replicated."""
    src = (a & 0xFFFFFFFF) | ((b & 0xFFFFFFFF) << 32)
    r = 0
    for j in range(4):
        nib = (sel >> (4 * j)) & 0xF
        byte = (src >> (8 * (nib & 7))) & 0xFF
        if nib & 8:
            byte = 0xFF if byte & 0x80 else 0
        r |= byte << (8 * j)
    return r


def nvfp4_weight_bytes(w: int) -> tuple[int, int]:
    """dot_a8.cuh nvfp4_weight_bytes (t0 = 0x03020100)."""
    t0, t1, n = 0x03020100, 0x0C080604, w ^ 0x88888888
    lo = (prmt(t0, t1, w) + 0x80808080 - prmt(t0, t1, n)) & 0xFFFFFFFF
    hi = (prmt(t0, t1, w >> 16) + 0x80808080 - prmt(t0, t1, n >> 16)) & 0xFFFFFFFF
    return lo, hi


def f16_of(bits: int) -> F32:
    return F32(np.array([bits & 0xFFFF], np.uint16).view(np.float16)[0])


def emulate(hp, x: np.ndarray, nw: int, kw: int) -> np.ndarray:
    """y [m, out] of matvec_mma (prologue none, store epilogue) with MV_NW = nw, MQ_KW = kw and a
    grid of one block per tile (a row's value does not depend on the block that computes it)."""
    fmt, n_out, n_in = hp.fmt, hp.out, hp.in_
    M = x.shape[0]
    vpc = cw.vpc(fmt)
    nck, nb = n_in // vpc, n_in // 32
    rb, npairs, nt = 16 * (nw // kw), 16 // kw, (M + 3) // 4
    QP, SB = 32 * 16 + 16, 2 * vpc
    SP = SB + 16
    xps = n_in // 4 + 4
    # x's staged planes and scale records (stage_a8 through MmaPlanes)
    h, l, e = act_quant_codes(x)
    xmem = np.zeros(2 * M * xps * 4, np.uint8)
    for m in range(M):
        for p, codes in enumerate((h, l)):
            for i in range(n_in):  # a8_word: Q8_0 natural; 32-value chunks in halves
                kc, j = i // vpc, i % vpc
                off = i if vpc == 16 else 16 * ((j >> 4) * nck + kc) + (j & 15)
                xmem[(2 * m + p) * xps * 4 + off] = codes[m, i].view(np.uint8)
    sh = h.astype(np.int64).reshape(M, nb, 2, 16).sum(-1)
    sl = l.astype(np.int64).reshape(M, nb, 2, 16).sum(-1)
    sc = np.zeros((nb, M, 2), F32)
    for b in range(nb):
        for m in range(M):
            if fmt == "Q8_0":
                sc[b, m] = pow2(e[m, b]), pow2(e[m, b] - 8)
            elif fmt == "NVFP4":
                sc[b, m, 0] = pow2(e[m, b] - 1)
            else:
                sc[b, m] = pow2(e[m, b] - 8), F32(256 * (sh[m, b].sum()) + sl[m, b].sum()) * pow2(e[m, b] - 8)
    qplane = hp.q.reshape(n_out, nck * 16)
    splane = hp.s.reshape(n_out, n_in // 16)
    y = np.full((M, n_out), np.nan, F32)
    nkt = -(-nck // 32)
    for row0 in range(0, n_out, rb):  # one pass per block (grid = tiles)
        red = np.zeros((2 * kw, rb, M), F32)
        for warp in range(nw):
            st, kwi = warp // kw, warp % kw
            acc = np.zeros((npairs, 2, 2, nt, 32), F32)  # [pair][c][rr][j][lane]
            for kt in range(nkt):
                # the stage: q rows at pitch QP, scale bytes after the q tile (issue())
                stage = np.zeros(rb * (QP + SP), np.uint8)
                for r in range(rb):
                    row = min(row0 + r, n_out - 1)
                    for c in range(32):
                        if kt * 32 + c < nck:
                            stage[r * QP + 16 * c:r * QP + 16 * c + 16] = qplane[row, 16 * (kt * 32 + c):16 * (kt * 32 + c) + 16]
                    for hh in range(SB // 16):
                        off = kt * SB + 16 * hh
                        if off < n_in // 16:
                            stage[rb * QP + r * SP + 16 * hh:rb * QP + r * SP + 16 * hh + 16] = splane[row, off:off + 16]
                q_lane = (st * 16 + (LANES & 15)) * QP + (LANES >> 4) * 16
                x_lane = [np.minimum(8 * j + (LANES & 7), 2 * M - 1) * 4 * xps for j in range(nt)]
                tok = [np.minimum(4 * j + T, M - 1) for j in range(nt)]
                srow0 = rb * QP + (st * 16 + G) * SP
                srow1 = srow0 + 8 * SP
                for ip in range(npairs):
                    c0 = 2 * kwi + 2 * kw * ip
                    kc0 = kt * 32 + c0
                    if kc0 >= nck:
                        continue
                    w = ldmatrix(stage, q_lane + c0 * 16, 4)  # [lane, 4]
                    if fmt == "Q8_0":
                        b = []
                        for j in range(nt):
                            if nt == 1:
                                r2 = ldmatrix(xmem, x_lane[0] + 16 * (kc0 + ((LANES >> 3) & 1)), 2)
                                b.append([r2[:, 0], r2[:, 1]])
                            else:
                                r4 = ldmatrix(xmem, np.where(LANES >> 4, x_lane[1], x_lane[0]) + 16 * (kc0 + ((LANES >> 3) & 1)), 4)
                                b = [[r4[:, 0], r4[:, 1]], [r4[:, 2], r4[:, 3]]]
                                break
                        d = [[mma([w[:, 2 * c], w[:, 2 * c + 1]], [b[j][c]], 0x4B400000) for j in range(nt)] for c in range(2)]
                        blk = kc0 >> 1
                        a0 = [np.array([f16_of(int(stage[s + c0]) | int(stage[s + c0 + 1]) << 8) for s in srows], F32)
                              for srows in (srow0, srow1)]
                        for j in range(nt):
                            dx = sc[blk, tok[j]]  # [lane, 2]
                            ph = [a0[rr] * dx[:, 0] for rr in range(2)]
                            pl = [a0[rr] * dx[:, 1] for rr in range(2)]
                            for c in range(2):
                                for rr in range(2):
                                    fh = (d[c][j][:, 2 * rr].astype(np.uint32).view(F32) - F32(12582912.0)).astype(F32)
                                    fl = (d[c][j][:, 2 * rr + 1].astype(np.uint32).view(F32) - F32(12582912.0)).astype(F32)
                                    v = fma32(fh, ph[rr], acc[ip, c, rr, j])
                                    acc[ip, c, rr, j] = fma32(fl, pl[rr], v)
                    else:
                        b = []
                        for j in range(nt):
                            q4 = LANES >> 3
                            r4 = ldmatrix(xmem, x_lane[j] + 16 * ((q4 & 1) * nck + kc0 + (q4 >> 1)), 4)
                            b.append([[r4[:, 0], r4[:, 1]], [r4[:, 2], r4[:, 3]]])
                        lo, hi = np.zeros((32, 4), np.uint32), np.zeros((32, 4), np.uint32)
                        for lane in range(32):
                            for k in range(4):
                                if fmt == "NVFP4":
                                    a, bb = nvfp4_weight_bytes(int(w[lane, k]))
                                    lo[lane, k], hi[lane, k] = a ^ 0x80808080, bb ^ 0x80808080
                                else:
                                    lo[lane, k], hi[lane, k] = w[lane, k] & 0x0F0F0F0F, (w[lane, k] >> 4) & 0x0F0F0F0F
                        if fmt == "NVFP4":
                            sw = [np.array([stage[s + 2 * c0:s + 2 * c0 + 4].view("<u4")[0] for s in srows], np.uint32)
                                  for srows in (srow0, srow1)]
                            for c in range(2):
                                d = [[mma([lo[:, 2 * c], lo[:, 2 * c + 1]], [b[j][c][0]], 0),
                                      mma([hi[:, 2 * c], hi[:, 2 * c + 1]], [b[j][c][1]], 0)] for j in range(nt)]
                                s = [[np.array([f16_of(prmt(int(v), 0, 0x4342 if c else 0x4140) >> (16 * hh) << 7) for v in sw[rr]], F32)
                                      for hh in range(2)] for rr in range(2)]
                                for j in range(nt):
                                    dx = sc[kc0 + c, tok[j], 0]
                                    for rr in range(2):
                                        for hh in range(2):
                                            dd = d[j][hh]
                                            v = (dd[:, 2 * rr] * 256 + dd[:, 2 * rr + 1]).astype(F32)  # exact: |v| < 2^24
                                            acc[ip, c, rr, j] = fma32(v, s[rr][hh] * dx, acc[ip, c, rr, j])
                        else:  # Q4_K: the superblock record (d, dmin, packed 6-bit scales / mins)
                            # lane t decodes (row g + 8 (t >> 1), chunk c0 + (t & 1)); the group's lanes exchange
                            own = np.where(T >> 1, srow1, srow0) + 16 * (c0 >> 3)
                            recs = np.stack([stage[o:o + 16] for o in own])
                            dd, dm = recs[:, 0:2].copy().view("<f2")[:, 0].astype(F32), recs[:, 2:4].copy().view("<f2")[:, 0].astype(F32)
                            scs, mns = quants.k_scale_min(recs[:, 4:16])
                            sub = (kc0 + (T & 1)) & 7
                            a_own = dd * scs[LANES, sub].astype(F32)
                            b_own = -(dm * mns[LANES, sub].astype(F32))
                            for c in range(2):
                                d = [mma([lo[:, 2 * c], lo[:, 2 * c + 1], hi[:, 2 * c], hi[:, 2 * c + 1]], [b[j][c][0], b[j][c][1]], 0)
                                     for j in range(nt)]
                                a = [a_own[(LANES & ~3) | (rr << 1) | c] for rr in range(2)]
                                bm = [b_own[(LANES & ~3) | (rr << 1) | c] for rr in range(2)]
                                for j in range(nt):
                                    dx = sc[kc0 + c, tok[j]]
                                    for rr in range(2):
                                        v = (d[j][:, 2 * rr] * 256 + d[j][:, 2 * rr + 1]).astype(F32)
                                        v = fma32(v, a[rr] * dx[:, 0], acc[ip, c, rr, j])
                                        acc[ip, c, rr, j] = fma32(bm[rr], dx[:, 1], v)
            hlev = npairs // 2  # the warp's own tree levels, then its partials into the pass buffer
            while hlev >= 1:
                for ip in range(hlev):
                    acc[ip] = acc[ip] + acc[ip + hlev]
                hlev //= 2
            for c in range(2):
                for rr in range(2):
                    for j in range(nt):
                        ok = 4 * j + T < M
                        red[2 * kwi + c, (st * 16 + G + 8 * rr)[ok], (4 * j + T)[ok]] = acc[0, c, rr, j][ok]
        for rl in range(rb):  # combine: mq_tree over the residues
            o = row0 + rl
            if o >= n_out:
                continue
            v = red[:, rl, :].copy()
            s = kw
            while s >= 1:
                v[:s] = v[:s] + v[s:2 * s]
                s //= 2
            y[:, o] = v[0] * hp.gscale[o] if hp.gscale is not None else v[0]
    return y


@pytest.mark.parametrize("fmt", ["Q8_0", "NVFP4", "Q4_K"])
@pytest.mark.parametrize("nw,kw", [(8, 8), (8, 4), (16, 8), (16, 4)])
@pytest.mark.parametrize("m", [1, 3, 6])
def test_lane_by_lane_replay_gives_the_contract_bits(rng, fmt, nw, kw, m):
    in_ = 768 if fmt == "Q8_0" else 1280  # 48 / 40 chunks: a whole and a partial k-tile
    out = int(rng.integers(9, 26)) | 1
    t = random_qtensor(rng, fmt, out, in_, global_scale=0.37 if fmt == "NVFP4" else 1.0)
    hp = cw.repack_host([t])
    x = (rng.standard_normal((m, in_)) * rng.uniform(0.1, 10.0, (m, 1))).astype(F32)
    got = emulate(hp, x, nw, kw)
    want = matvec_a8_exact(hp, x)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
