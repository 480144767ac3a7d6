"""CUDA rule: FusedAttention (`hidetc.graph.ops.fused_attention`) on tensor cores, float16
or bfloat16 in and out (the "half type" below; the mma of that type) with float32
accumulation, flash-attention style: the scores never leave the SM.

One block per (batch entry, BM = 64 query rows), 4 warps of 16 rows each (grid: query
tiles on x, the batch on y). The block's Q tile is copied to shared memory once and
each warp keeps its A fragments (ldmatrix.x4) in registers; then for each tile of
BN = 64 keys:
- Kt's [D x 64] and V's [64 x Dv] tiles are copied to shared memory (cp.async, zero
  fill past the ends; the swizzled layouts of `tc_common.SwizzledTile`); where two
  stages of them fit the 48 KiB of static shared memory (heads up to 64) they are
  double-buffered: the next tile's copies are issued (into the other stage, after the
  barrier that says it is consumed) before this tile is computed, which waits with
  `wait_group(1)` for its own copies only; larger heads copy and wait for each tile;
- S = Q Kt for the warp's 16 rows by mma.m16n8k16 (B fragments by ldmatrix.x4.trans,
  as `matmul_tc`'s B operand), each score rounded to the half type as the unfused
  MatMul stores it, then the score steps in order (each computed in f32 and rounded to
  the half type, as the unfused elementwise ops), keys past Sk set to -inf;
- online softmax per row (each lane holds 2 rows x 16 scores of the C fragment; a row's
  max and sum over its 4 lanes by shfl_xor 1, 2): m' = max(m, tile max), the running
  sum and the output rescaled by exp(m - m'), p = exp(s - m') rounded to the half type
  -- stored
  straight into the A-fragment order of the next MMA (a C fragment's (row, key pair) is
  an A fragment's (row, k pair));
- O += P V by mma (V's B fragments by ldmatrix.x4.trans).
At the end each row is divided by its sum and stored (rounded once) with the
ordinary predicated stores, so grafted epilogues (the heads' Transpose back) ride on
them; grafted prologues (the heads' Transposes in) become the tile copies' loads.

Numerics: the scores and every score step round as the unfused ops do; the softmax is
the online one (exp(s - running max), rescaled), so its rounding differs from the
unfused Softmax's in the last bits: within the half type's tolerance, checked against
the reference in tests/schedules/test_cuda_attention.py. Assumes Q, Kt, V and output
of one half type, 16-byte aligned buffers, D and Dv at most `fuse_attention.MAX_HEAD`
(shared memory: 64 x D + S x (D x 64 + 64 x Dv) halves <= 48 KiB, S the K/V stages).
Correct for every shape (any Sq, Sk, D, Dv, broadcast batch and score operands,
including Sq or the batch 0).
"""
from __future__ import annotations

import math

import numpy as np

from hidetc.compute.injective import broadcast_index, unravel
from hidetc.compute.task import Task
from hidetc.schedules.cuda.common import SHARED_LIMIT, at_least_one, ceil_div
from hidetc.schedules.cuda.tc_common import (
    CHUNK,
    HALVES,
    LDMATRIX_X4,
    SwizzledTile,
    chunk_mapping,
    copy_pieces,
    copy_width,
    half_operands,
    spatial_index,
)
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.cuda import (
    WARP_SIZE,
    cp_async_commit,
    cp_async_wait,
    cp_async_wait_all,
    ldmatrix,
    mma_m16n8k16,
    shfl_xor,
)
from hidetc.tir.ir import (
    Buffer,
    Const,
    Expr,
    Function,
    block_idx,
    call,
    cast,
    eq,
    logical_and,
    maximum,
    minimum,
    select,
    syncthreads,
    thread_idx,
)

F32 = "float32"
BM, BN, WARPS = 64, 64, 4
THREADS = WARPS * WARP_SIZE
INF = float("inf")


def _round(value: Expr, dtype: str) -> Expr:
    """An f32 value rounded to the half `dtype` and widened back (what an unfused op
    stores)."""
    return cast(cast(value, dtype), F32)


def _load_tile(kb: KernelBuilder, smem: Buffer, tile: SwizzledTile, src, row0: Expr,
               rows: int, col0: Expr, cols: int, base: Expr | int = 0) -> None:
    """smem (swizzled `tile`, at element `base`) <- src(row, col) for rows row0 + [0,
    tile.rows) and columns col0 + [0, tile.cols), zero past `rows` / `cols`: 16-byte
    cp.async pieces where the row length keeps them aligned, else narrower ones (or
    predicated half stores)."""
    width = copy_width(cols)
    with kb.for_mapping(chunk_mapping(tile.rows, tile.chunks, THREADS), thread_idx(),
                        names=("r", "c")) as (r, c):
        row = row0 + r
        pieces = []
        for p in range(CHUNK // width):
            col = col0 + c * CHUNK + p * width
            pieces.append((logical_and(row < rows, col < cols),
                           src(minimum(row, rows - 1), minimum(col, cols - width))))
        copy_pieces(kb, smem, base + tile.offset(r, c), width, pieces)


class _Attention:
    def __init__(self, task: Task, name: str):
        q_t, kt_t, v_t = task.inputs[0], task.inputs[1], task.inputs[2]
        self.task = task
        self.batch = tuple(np.broadcast_shapes(q_t.shape[:-2], kt_t.shape[:-2],
                                               v_t.shape[:-2]))
        self.sq, self.d = q_t.shape[-2], q_t.shape[-1]
        self.sk, self.dv = kt_t.shape[-1], v_t.shape[-1]
        # head sizes padded to a power of two >= 16 (the swizzled tiles' chunks per row)
        self.dk_pad = max(16, 1 << max(0, self.d - 1).bit_length())
        self.dv_pad = max(16, 1 << max(0, self.dv - 1).bit_length())
        kb = self.kb = KernelBuilder(name, "cuda")
        self.dt = dt = q_t.dtype
        self.q = kb.buffer("q", dt, q_t.shape)
        self.kt = kb.buffer("kt", dt, kt_t.shape)
        self.v = kb.buffer("v", dt, v_t.shape)
        self.extras = [kb.buffer(f"e{i}", t.dtype, t.shape)
                       for i, t in enumerate(task.inputs[3:])]
        self.out = kb.buffer("out", dt, self.batch + (self.sq, self.dv))
        self.steps = task.attr("score", ())

    def build(self) -> Function:
        grid = (at_least_one(ceil_div(self.sq, BM)), at_least_one(math.prod(self.batch)), 1)
        if self.task.outputs[0].size > 0:
            self.body()
        return self.kb.finish(grid=grid, block=(THREADS, 1, 1))

    # ---------------------------------------------------------------------------------
    def body(self) -> None:
        kb = self.kb
        tid = thread_idx()
        lane, warp = tid % WARP_SIZE, tid // WARP_SIZE
        g, t = lane // 4, lane % 4                    # the C fragment's row and pair
        half, row16 = spatial_index(LDMATRIX_X4, lane)
        self.bidx = unravel(block_idx("y"), self.batch) if self.batch else []
        pre = [tuple(broadcast_index(self.bidx, b.shape[:-2])) for b in (self.q, self.kt,
                                                                        self.v)]
        q0 = kb.declare("q0", "int32", block_idx("x") * BM)
        tq = SwizzledTile(BM, self.dk_pad)
        tk = SwizzledTile(self.dk_pad, BN)
        tv = SwizzledTile(BN, self.dv_pad)
        # K/V tiles double-buffered where both stages fit static shared memory (heads
        # up to 64): the next tile's copies run while this one computes
        stages = 2 if (tq.size + 2 * (tk.size + tv.size)) * 2 <= SHARED_LIMIT else 1
        sq = kb.alloc("sq", self.dt, (tq.size,), "shared")
        sk = kb.alloc("sk", self.dt, (stages * tk.size,), "shared")
        sv = kb.alloc("sv", self.dt, (stages * tv.size,), "shared")
        k_steps, d_tiles = self.dk_pad // 16, self.dv_pad // 8
        fq = kb.alloc("fq", "uint32", (k_steps * 4,))
        fb = kb.alloc("fb", "uint32", (4,))
        s_acc = kb.alloc("s", F32, (BN // 8 * 4,))
        o_acc = kb.alloc("o", F32, (d_tiles * 4,))
        pf = kb.alloc("pf", self.dt, (BN // 16 * 8,))
        m_i = kb.alloc("m", F32, (2,))
        l_i = kb.alloc("l", F32, (2,))

        # Q tile once, its A fragments in registers
        zero = Const(0, "int32")
        _load_tile(kb, sq, tq, lambda r, c: self.q[pre[0] + (r, c)], q0, self.sq, zero,
                   self.d)
        kb.emit(cp_async_commit())
        kb.emit(cp_async_wait_all())
        kb.emit(syncthreads())
        for kk in range(k_steps):
            row = warp * 16 + row16
            kb.emit(ldmatrix(fq[kk * 4], sq[tq.offset(row, kk * 2 + half, key_row=row16)], 4))
        for i in range(d_tiles * 4):
            kb.store(o_acc, (i,), Const(0.0, F32))
        for h in range(2):
            kb.store(m_i, (h,), Const(-INF, F32))
            kb.store(l_i, (h,), Const(0.0, F32))

        def load_kv(k_first: Expr, stage: Expr | int) -> None:
            _load_tile(kb, sk, tk, lambda r, c: self.kt[pre[1] + (r, c)], zero, self.d,
                       k_first, self.sk, stage * tk.size)
            _load_tile(kb, sv, tv, lambda r, c: self.v[pre[2] + (r, c)], k_first, self.sk,
                       zero, self.dv, stage * tv.size)

        tiles = ceil_div(self.sk, BN)
        if stages == 2 and tiles > 0:
            load_kv(zero, 0)                          # the first tile, ahead
            kb.emit(cp_async_commit())
        with kb.for_range(tiles, name="kt") as kt:
            k0 = kb.declare("k0", "int32", kt * BN)
            stage = kt % stages if stages > 1 else 0
            kb.emit(syncthreads())                    # the stage to refill is consumed
            if stages == 2:
                with kb.if_then(kt + 1 < tiles):
                    load_kv(k0 + BN, (kt + 1) % 2)
                kb.emit(cp_async_commit())            # (empty on the last tile)
                kb.emit(cp_async_wait(1))             # this tile's copies have landed
            else:
                load_kv(k0, 0)
                kb.emit(cp_async_commit())
                kb.emit(cp_async_wait_all())
            kb.emit(syncthreads())
            self.scores(s_acc, fq, fb, sk, tk, half, row16, stage * tk.size)
            self.score_steps(s_acc, q0 + warp * 16 + g, k0 + t * 2)
            self.softmax_step(s_acc, o_acc, pf, m_i, l_i, d_tiles)
            self.pv(o_acc, pf, fb, sv, tv, half, row16, stage * tv.size)
        self.store(o_acc, l_i, q0 + warp * 16 + g, t, d_tiles)

    # ---------------------------------------------------------------------------------
    def scores(self, s_acc, fq, fb, sk, tk: SwizzledTile, half, row16, base) -> None:
        """s_acc = this warp's 16 rows of Q x the Kt tile at `base` (8 n tiles of 8
        keys)."""
        kb = self.kb
        for i in range(BN // 8 * 4):
            kb.store(s_acc, (i,), Const(0.0, F32))
        for kk in range(self.dk_pad // 16):
            for j in range(BN // 16):
                off = base + tk.offset(kk * 16 + row16, j * 2 + half, key_row=row16)
                kb.emit(ldmatrix(fb[0], sk[off], 4, trans=True))
                kb.emit(mma_m16n8k16(s_acc[(2 * j) * 4], fq[kk * 4], fb[0], dtype=self.dt))
                kb.emit(mma_m16n8k16(s_acc[(2 * j + 1) * 4], fq[kk * 4], fb[2],
                                     dtype=self.dt))

    def score_steps(self, s_acc, row_g: Expr, key_t: Expr) -> None:
        """Each score: rounded as the unfused MatMul stores it, the score steps in order
        (f32, rounded to the half type each), -inf past the keys."""
        kb = self.kb
        for nt in range(BN // 8):
            for e in range(4):
                i = nt * 4 + e
                row = row_g + (e // 2) * 8
                key = key_t + nt * 8 + e % 2
                at = list(self.bidx) + [minimum(row, self.sq - 1), minimum(key, self.sk - 1)]
                value = _round(s_acc[i], self.dt)
                for step in self.steps:
                    if step[0] == "div":
                        value = _round(value / Const(float(step[1]), F32), self.dt)
                    elif step[0] == "mul":
                        value = _round(value * Const(float(step[1]), F32), self.dt)
                    elif step[0] == "add":
                        e_buf = self.extras[step[1]]
                        term = e_buf[tuple(broadcast_index(at, e_buf.shape))]
                        value = _round(value + cast(term, F32), self.dt)
                    else:
                        c_buf = self.extras[step[1]]
                        cond = c_buf[tuple(broadcast_index(at, c_buf.shape))]
                        value = _round(select(cond, value, Const(float(step[2]), F32)),
                                       self.dt)
                kb.store(s_acc, (i,), select(key < self.sk, value, Const(-INF, F32)))

    def softmax_step(self, s_acc, o_acc, pf, m_i, l_i, d_tiles: int) -> None:
        """The online softmax over this key tile, P (the half type) into A-fragment
        order."""
        kb = self.kb
        for h in range(2):                  # the lane's rows g (h = 0) and g + 8 (h = 1)
            mine = [s_acc[nt * 4 + 2 * h + c] for nt in range(BN // 8) for c in range(2)]
            mx = kb.declare("mx", F32, mine[0])
            for value in mine[1:]:
                kb.assign(mx, maximum(mx, value))
            for lanes in (1, 2):
                kb.assign(mx, maximum(mx, shfl_xor(mx, lanes)))
            m_new = kb.declare("mnew", F32, maximum(m_i[h], mx))
            # a row whose every key so far is masked out: nothing to rescale or add
            m_use = kb.declare("muse", F32, select(eq(m_new, Const(-INF, F32)),
                                                   Const(0.0, F32), m_new))
            alpha = kb.declare("alpha", F32, call("exp", m_i[h] - m_use))
            total = kb.declare("rowsum", F32, Const(0.0, F32))
            for nt in range(BN // 8):
                for c in range(2):
                    p = kb.declare("p", self.dt,
                                   cast(call("exp", s_acc[nt * 4 + 2 * h + c] - m_use), self.dt))
                    kb.store(pf, ((nt // 2) * 8 + (nt % 2) * 4 + 2 * h + c,), p)
                    kb.assign(total, total + cast(p, F32))
            for lanes in (1, 2):
                kb.assign(total, total + shfl_xor(total, lanes))
            kb.store(l_i, (h,), l_i[h] * alpha + total)
            kb.store(m_i, (h,), m_new)
            for dt in range(d_tiles):
                for c in range(2):
                    i = dt * 4 + 2 * h + c
                    kb.store(o_acc, (i,), o_acc[i] * alpha)

    def pv(self, o_acc, pf, fb, sv, tv: SwizzledTile, half, row16, base) -> None:
        """o_acc += P (this warp's 16 rows x 64 keys) x the V tile at `base`."""
        kb = self.kb
        for kk in range(BN // 16):
            for j in range(self.dv_pad // 16):
                off = base + tv.offset(kk * 16 + row16, j * 2 + half, key_row=row16)
                kb.emit(ldmatrix(fb[0], sv[off], 4, trans=True))
                kb.emit(mma_m16n8k16(o_acc[(2 * j) * 4], pf[kk * 8], fb[0], dtype=self.dt))
                kb.emit(mma_m16n8k16(o_acc[(2 * j + 1) * 4], pf[kk * 8], fb[2],
                                     dtype=self.dt))

    def store(self, o_acc, l_i, row_g: Expr, t: Expr, d_tiles: int) -> None:
        """O = o / l, rounded once, stored where row < Sq and column < Dv."""
        kb = self.kb
        for dt in range(d_tiles):
            for e in range(4):
                row = row_g + (e // 2) * 8
                col = t * 2 + dt * 8 + e % 2
                with kb.if_then(logical_and(row < self.sq, col < self.dv)):
                    value = o_acc[dt * 4 + e] / l_i[e // 2]
                    kb.store(self.out, tuple(self.bidx) + (row, col), cast(value, self.dt))


def build_attention(task: Task, name: str) -> Function:
    """The kernel of a FusedAttention task (see the module docstring)."""
    types = task.inputs[:3] + task.outputs
    if half_operands({t.dtype for t in types}) is None:
        raise ValueError(f"the fused attention kernel takes one of {', '.join(HALVES)}, "
                         f"got {task.signature()}")
    return _Attention(task, name).build()
