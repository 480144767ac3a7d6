"""CUDA template: MatMulInteger (`hidetc.graph.ops.integer`) on tensor cores, sm_80 and
newer: mma.sync m16n8k32 on the 8-bit operands as they are (A and B each uint8 or int8:
`.u8`/`.s8`, all four pairs exist in PTX), int32 accumulation, numpy semantics (broadcast
batch dims, 1-D operands), the zero points applied in the store.

    C = (A - za)(B - zb) = A B  -  za colsum_j(B)  -  zb_j rowsum_i(A)  +  K za zb_j

with za per tensor, zb per tensor or per column, all in int32 arithmetic modulo 2^32 (the
hardware's and the reference's: exact where the result fits int32, the same wrapped bits
where not). The block GEMM is `tc_common`'s skeleton (a BM x BN tile per block, the
cp.async pipeline of `TcKernel.main_loop`, `spatial(wm, wn)` warps of MT x NT mma tiles):

- tiles: BK is in bytes (= k elements); the A tile BM x BK and the B tile BK x BN are
  `SwizzledTile`s of 16-byte chunks (their offsets are in 16-bit units, doubled here), so
  ldmatrix rows are conflict-free as in `matmul_tc`. Copies are 16-byte cp.async chunks
  with zero fill past M, N or K; rows whose length (K for A, N for B) is not a multiple of
  16 bytes copy 8- or 4-byte pieces, or predicated single bytes.
- A fragments: the int8 one (row g, k 4t..4t+3 per register; rows g / g + 8, k halves
  0 / 16) is byte for byte the f16 one: `ldmatrix.x4` of 16 rows x 32 bytes gives it.
- B fragments: mma wants each register to hold 4 consecutive k of ONE column; B is
  row-major [k][n], and ldmatrix moves 16-bit pairs (two n at one k). So the B tile's rows
  are stored permuted within each 16 (`b_row`: smem rows 0-7 hold k {0,1,4,5,8,9,12,13},
  rows 8-15 the others, the same for k 16..31) and one `ldmatrix.x4.trans` per 32 k x 16
  columns (lane i: the smem row i) gives lane (g, t) r0 = {(4t, 2g), (4t, 2g+1), (4t+1, 2g),
  (4t+1, 2g+1)}, r1 the same at k 4t+2, 4t+3, r2 / r3 at k + 16 ((k, n) bytes, low first);
  `byte_perm` 0x6420 / 0x7531 of (r0, r1) and (r2, r3) gives the two registers of column
  2g ("even" n tile) and 2g+1 ("odd" n tile). An n tile's slot s is thus column 2s (+1):
  a 16-column window holds n tiles 2w (even columns) and 2w + 1 (odd columns).
- sums (only those a zero point needs: rowsum_i(A) for a zb, colsum_j(B) for a za): each
  lane adds the bytes of its A and B registers (`bytesum`: dp4a with ones, on the integer
  pipe beside the tensor cores); after the loop two xor shuffles combine a group's 4
  lanes, and a lane fetches the column sums of its slots 2t, 2t + 1 from lanes 8t, 8t + 4.
- epilogue: lane (g, t) holds, per row and 16-column window, the columns 4t .. 4t + 3
  (even slot 2t, odd slot 2t, even 2t + 1, odd 2t + 1): the corrected values stored as one
  16-byte store when N % 4 == 0, else four predicated int32 stores; every store
  predicated on row < M and column < N. No split-K.

Space (`space`): BM, BN in {32..256}, BK in {32, 64, 128} bytes, warp tiles 32 or 64,
stages 2..4, pruned like `tc_common` (limits; registers and spills by ptxas's count per
arch, `tc_registers`' int8 family; dynamic shared memory only for deep pipelines of big
tiles, 64..384 bytes of K in flight). The cost model sees each config as its f16
equivalent (`Int8TcConfig.half_equivalent`: the same bytes per tile, half the k steps:
int8's double mma rate) at this kernel's own registers; it orders the space and picks
the default among DEFAULTS.

Assumes: A, B uint8 / int8, zero points of their operand's type, the output int32,
buffers 16-byte aligned (hidetc's arena and weights are 64-byte aligned). Guarantees:
the reference's int32 bits for every config on every shape (M, N, K >= 0, batched and
broadcast, symbolic sizes), each output element stored once.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Optional, Sequence

from hidetc.compute.injective import broadcast_index, unravel
from hidetc.compute.task import Task
from hidetc.schedules.cuda import cost, tc_registers
from hidetc.schedules.cuda.common import at_least_one, ceil_div
from hidetc.schedules.cuda.matmul_tc import Geometry, geometry
from hidetc.schedules.cuda.tc_common import (
    LDMATRIX_X4,
    SwizzledTile,
    TcConfig,
    TcKernel,
    chunk_mapping,
    cuda_target,
    spatial_index,
)
from hidetc.schedules.template import CudaTarget, Target
from hidetc.tir import cuda as tc
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import (
    Buffer,
    Const,
    Expr,
    Function,
    as_expr,
    block_idx,
    cast,
    logical_and,
    minimum,
    select,
    thread_idx,
)
from hidetc.tir.mapping import spatial

INT8 = ("uint8", "int8")
MMA_M, MMA_N, MMA_K = 16, 8, 32
CHUNK = 16                      # bytes per cp.async chunk / ldmatrix row
EVEN, ODD = 0x6420, 0x7531      # byte_perm selectors: bytes 0, 2 / 1, 3 of (r0, r1)
U32 = "uint32"


@dataclass(frozen=True)
class Int8TcConfig:
    bm: int
    bn: int
    bk: int          # bytes (k elements) per k tile, a multiple of 32
    wm: int          # warps along M
    wn: int          # warps along N
    stages: int
    splits: int = 1  # split-K: not supported (the pipeline of `TcKernel` reads it)

    @property
    def threads(self) -> int:
        return self.wm * self.wn * tc.WARP_SIZE

    @property
    def mt(self) -> int:
        return self.bm // self.wm // MMA_M

    @property
    def nt(self) -> int:
        return self.bn // self.wn // MMA_N

    @property
    def shared_bytes(self) -> int:
        return self.stages * (self.bm + self.bn) * self.bk

    @property
    def key(self) -> tc_registers.Key:
        return (self.bm, self.bn, self.bk, self.wm, self.wn, self.stages)

    @property
    def estimated_registers(self) -> int:
        """Accumulators, fragments, the ldmatrix.trans registers, row and column sums,
        ~48 for addresses and loop state: where `tc_registers` has no count."""
        mt, nt = self.mt, self.nt
        return mt * nt * 4 + mt * 4 + nt * 2 + 4 + mt * 2 + nt + 48

    def registers_on(self, arch: str) -> int:
        """ptxas's registers for this config's reference kernel on `arch`
        (`tc_registers`, family "int8"), else the estimate."""
        counted = tc_registers.count("int8", self.key, False, arch)
        return counted if counted is not None else self.estimated_registers

    def spills_on(self, arch: str) -> bool:
        return tc_registers.spills("int8", self.key, False, arch) > 0

    def half_equivalent(self) -> TcConfig:
        """The f16 tile the cost model weighs for this one: the same bytes per k tile and
        k steps of half the elements (int8 mma runs at twice the f16 rate)."""
        return TcConfig(self.bm, self.bn, self.bk // 2, self.wm, self.wn, self.stages)


def within_limits(cfg: Int8TcConfig, target: CudaTarget) -> bool:
    """Warp tiles of 32 or 64, the target's thread and shared memory limits, every
    thread copying at least one chunk of each tile (registers aside)."""
    copies = min(cfg.bm * cfg.bk, cfg.bk * cfg.bn) // CHUNK
    return (cfg.bm // cfg.wm in (32, 64) and cfg.bn // cfg.wn in (32, 64)
            and cfg.threads <= min(target.max_threads, copies)
            and cfg.shared_bytes <= max(target.shared_bytes, target.shared_optin_bytes))


def fits(cfg: Int8TcConfig, target: CudaTarget) -> bool:
    """`within_limits` and the target's registers per thread and per block by ptxas's
    count on its arch, without spilling."""
    registers = cfg.registers_on(target.arch)
    return (within_limits(cfg, target) and registers <= target.max_registers
            and registers * cfg.threads <= target.registers_per_block
            and not cfg.spills_on(target.arch))


def _shape_worth_trying(cfg: Int8TcConfig, target: CudaTarget) -> bool:
    dynamic_ok = (cfg.stages >= 3 and cfg.bk >= 64 and min(cfg.bm, cfg.bn) >= 64
                  and cfg.threads <= 256)
    return (64 <= (cfg.stages - 1) * cfg.bk <= 384
            and (cfg.shared_bytes <= target.shared_bytes or dynamic_ok))


def worth_trying(cfg: Int8TcConfig, target: CudaTarget) -> bool:
    """`tc_common.worth_trying` in bytes: 64..384 bytes of K in flight; dynamic shared
    memory only for 3+ stages of 64x64 tiles or larger, BK >= 64, <= 256 threads and
    registers to spare (<= 192 by ptxas's count)."""
    return _shape_worth_trying(cfg, target) and (
        cfg.shared_bytes <= target.shared_bytes or cfg.registers_on(target.arch) <= 192)


def int8_candidates(target: Target) -> list[Int8TcConfig]:
    """The grid within `target`'s limits and worth trying, registers aside (what
    `tc_registers`' int8 table counts)."""
    limits, tiles, warps = cuda_target(target), (32, 64, 128, 256), (1, 2, 4)
    grid = itertools.product(tiles, tiles, (32, 64, 128), warps, warps, (2, 3, 4))
    return [c for c in itertools.starmap(Int8TcConfig, grid)
            if within_limits(c, limits) and _shape_worth_trying(c, limits)]


def int8_space(target: Target) -> list[Int8TcConfig]:
    limits = cuda_target(target)
    return [c for c in int8_candidates(limits) if fits(c, limits) and worth_trying(c, limits)]


# ------------------------------------------------------------------ the kernel

def b_row(s: Expr) -> Expr:
    """The k (within the tile) that B-tile smem row `s` holds: within each 16 rows, smem
    row 8q + r holds k 4 (r // 2) + 2q + r % 2 (see the module docstring)."""
    return (s // 16) * 16 + (s % 8) // 2 * 4 + (s % 16) // 8 * 2 + s % 2


def byte_width(row_length) -> int:
    """Bytes per aligned piece of a 16-byte chunk for rows of `row_length` bytes."""
    if not isinstance(row_length, int):
        return 1               # a symbolic row length: no alignment is known
    return next(w for w in (16, 8, 4, 1) if row_length % w == 0)


def _u32(x: Expr) -> Expr:
    return cast(x, U32)


class _Kernel(TcKernel):
    """The MatMulInteger buffers, byte tiles, int8 fragments, sums and corrected stores
    on `TcKernel`'s pipeline (`main_loop`). Its `__init__` sets the state the pipeline
    reads itself: the base one allocates half-precision tiles and f32 accumulators."""

    def __init__(self, task: Task, cfg: Int8TcConfig, name: str):
        check_task(task)
        if cfg.splits != 1 or cfg.bk % MMA_K:
            raise ValueError(f"the int8 tensor-core GEMM takes BK % 32 == 0, no split-K: {cfg}")
        self.geo = geo = geometry(task)
        self.cfg, self.kb = cfg, KernelBuilder(name, "cuda")
        self.m, self.n, self.k = geo.m, geo.n, geo.k
        self.a_dtype, self.b_dtype = task.inputs[0].dtype, task.inputs[1].dtype
        kb = self.kb
        self.a = kb.buffer("a", self.a_dtype, geo.a_shape)
        self.b = kb.buffer("b", self.b_dtype, geo.b_shape)
        zeros = [task.inputs[i] if len(task.inputs) > i else None for i in (2, 3)]
        self.a_zero = kb.buffer("a_zero", self.a_dtype, (1,)) if zeros[0] else None
        self.b_zero = (kb.buffer("b_zero", self.b_dtype, (max(zeros[1].size, 1),))
                       if zeros[1] else None)
        self.per_column = zeros[1] is not None and zeros[1].size != 1
        self.out = kb.buffer("out", "int32", geo.batch + (geo.m, geo.n))
        self.grid = (at_least_one(ceil_div(geo.n, cfg.bn)), at_least_one(ceil_div(geo.m, cfg.bm)),
                     at_least_one(math.prod(geo.batch)))
        self.outer, self.split = block_idx("z"), None
        self.bidx = unravel(self.outer, geo.batch) if geo.batch else []
        self.a_pre = tuple(broadcast_index(self.bidx, geo.a_shape[:-2]))
        self.b_pre = tuple(broadcast_index(self.bidx, geo.b_shape[:-2]))
        self.m0, self.n0 = block_idx("y") * cfg.bm, block_idx("x") * cfg.bn
        self.tile_a = SwizzledTile(cfg.bm, cfg.bk // 2)     # 16-bit units: 8 per chunk
        self.tile_b = SwizzledTile(cfg.bk, cfg.bn // 2)
        self.sa = kb.alloc("sa", self.a_dtype, (cfg.stages * cfg.bm * cfg.bk,), "shared")
        self.sb = kb.alloc("sb", self.b_dtype, (cfg.stages * cfg.bk * cfg.bn,), "shared")
        self.acc = kb.alloc("acc", "int32", (cfg.mt * cfg.nt * 4,))
        self.fa = kb.alloc("fa", U32, (cfg.mt * 4,))
        self.fb = kb.alloc("fb", U32, (cfg.nt * 2,))
        self.fr = kb.alloc("fr", U32, (4,))
        # rowsum_i(A) for a zb (rows g, g + 8 per m tile), colsum_j(B) for a za
        self.rs = kb.alloc("rs", "int32", (cfg.mt * 2,)) if self.b_zero else None
        self.cs = kb.alloc("cs", "int32", (cfg.nt,)) if self.a_zero else None
        self.tid = thread_idx()
        self.lane = self.tid % tc.WARP_SIZE
        self.wi, self.wj = spatial_index(spatial(cfg.wm, cfg.wn), self.tid // tc.WARP_SIZE)

    # global -> shared ---------------------------------------------------------------
    def copy_chunk(self, dst: Buffer, dst_off: Expr, src: Buffer, pre: tuple,
                   row: Expr, col: Expr, bounds: tuple) -> None:
        """Bytes [col, col + 16) of `src` row `row` (predicated on `bounds`; zeros
        outside) to dst[dst_off...], in the widest pieces the row length keeps aligned."""
        rows, cols = bounds
        width = byte_width(cols)
        for p in range(CHUNK // width):
            c = col + p * width if p else col
            ok = logical_and(row < rows, c < cols)
            element = src[pre + (minimum(row, rows - 1), minimum(c, cols - width))]
            target = dst[dst_off + p * width if p else dst_off]
            if width > 1:
                self.kb.emit(tc.cp_async(target, element, width, ok))
            else:
                self.kb.store(dst, (dst_off + p,), select(ok, element, Const(0, dst.dtype)))

    def load_tile(self, stage: int | Expr, kt: int | Expr) -> None:
        cfg, geo, kb = self.cfg, self.geo, self.kb
        k0 = kt * cfg.bk
        ta, tb = self.tile_a, self.tile_b
        with kb.for_mapping(chunk_mapping(cfg.bm, ta.chunks, cfg.threads), self.tid,
                            names=("r", "c")) as (r, c):
            off = stage * (cfg.bm * cfg.bk) + ta.offset(r, c) * 2
            self.copy_chunk(self.sa, off, self.a, self.a_pre, self.m0 + r,
                            k0 + c * CHUNK, (geo.m, geo.k))
        with kb.for_mapping(chunk_mapping(cfg.bk, tb.chunks, cfg.threads), self.tid,
                            names=("s", "c")) as (s, c):
            off = stage * (cfg.bk * cfg.bn) + tb.offset(s, c) * 2
            self.copy_chunk(self.sb, off, self.b, self.b_pre, k0 + b_row(s),
                            self.n0 + c * CHUNK, (geo.k, geo.n))

    # shared -> registers -> tensor cores --------------------------------------------
    def compute_stage(self, stage: Expr) -> None:
        cfg, kb, lane = self.cfg, self.kb, self.lane
        ta, tb, fa, fb, fr = self.tile_a, self.tile_b, self.fa, self.fb, self.fr
        half, row16 = spatial_index(LDMATRIX_X4, lane)
        with kb.for_range(cfg.bk // MMA_K, kind="unroll", name="kk") as kk:
            with kb.for_range(cfg.mt, kind="unroll", name="i") as i:
                row = self.wi * (cfg.bm // cfg.wm) + i * MMA_M + row16
                off = stage * (cfg.bm * cfg.bk) + ta.offset(row, kk * 2 + half, key_row=row16) * 2
                kb.emit(tc.ldmatrix(fa[i * 4], self.sa[off], 4))
                if self.rs is not None:
                    for r in range(4):      # registers 0, 2: row g; 1, 3: row g + 8
                        at = i * 2 + r % 2
                        kb.store(self.rs, (at,),
                                 tc.bytesum(fa[i * 4 + r], self.rs[at], self.a_dtype))
            with kb.for_range(cfg.nt // 2, kind="unroll", name="w") as w:
                chunk = self.wj * (cfg.bn // cfg.wn // CHUNK) + w
                off = stage * (cfg.bk * cfg.bn) + tb.offset(kk * MMA_K + lane, chunk,
                                                           key_row=lane % 8) * 2
                kb.emit(tc.ldmatrix(fr[0], self.sb[off], 4, trans=True))
                for parity, sel in enumerate((EVEN, ODD)):
                    for r in range(2):
                        kb.store(fb, (w * 4 + parity * 2 + r,),
                                 tc.byte_perm(fr[r * 2], fr[r * 2 + 1], sel))
                if self.cs is not None:
                    for j in range(2):
                        for r in range(2):
                            at = w * 2 + j
                            kb.store(self.cs, (at,),
                                     tc.bytesum(fb[at * 2 + r], self.cs[at], self.b_dtype))
            with kb.for_range(cfg.mt, kind="unroll", name="i") as i:
                with kb.for_range(cfg.nt, kind="unroll", name="j") as j:
                    kb.emit(tc.mma_m16n8k32(self.acc[(i * cfg.nt + j) * 4], fa[i * 4], fb[j * 2],
                                         a_dtype=self.a_dtype, b_dtype=self.b_dtype))

    # registers -> global ------------------------------------------------------------
    def zero_accumulators(self) -> None:
        for buf in (self.acc, self.rs, self.cs):
            if buf is not None:
                with self.kb.for_range(buf.shape[0], kind="unroll", name="z") as z:
                    self.kb.store(buf, (z,), Const(0, "int32"))

    def group_sums(self) -> Optional[Buffer]:
        """Combine the sums over the 4 lanes of each group; the column sums of this lane's
        slots 2t, 2t + 1 (per n tile, `cs2`), fetched from lanes 8t and 8t + 4."""
        kb = self.kb
        for buf in (self.rs, self.cs):
            if buf is not None:
                with kb.for_range(buf.shape[0], kind="unroll", name="x") as x:
                    for d in (1, 2):
                        kb.store(buf, (x,), buf[x] + tc.shfl_xor(buf[x], d))
        if self.cs is None:
            return None
        cs2 = kb.alloc("cs2", "int32", (self.cfg.nt * 2,))
        t = self.lane % 4
        with kb.for_range(self.cfg.nt, kind="unroll", name="j") as j:
            for e in range(2):
                kb.store(cs2, (j * 2 + e,), tc.shfl(self.cs[j], (t * 2 + e) * 4))
        return cs2

    def corrected(self, acc: Expr, rowsum: Optional[Expr], colsum: Optional[Expr],
                  col: Expr) -> Expr:
        """acc - za colsum - zb rowsum + K za zb, in uint32 (wrapping), as int32."""
        if self.a_zero is None and self.b_zero is None:
            return acc
        value = _u32(acc)
        za = _u32(self.a_zero[0]) if self.a_zero is not None else None
        zb = _u32(self.b_zero[col if self.per_column else 0]) if self.b_zero is not None else None
        if za is not None:
            value = value - za * _u32(colsum)
        if zb is not None:
            value = value - zb * _u32(rowsum)
        if za is not None and zb is not None:
            value = value + _u32(as_expr(self.k)) * za * zb
        return cast(value, "int32")

    def store_output(self) -> None:
        cfg, kb, lane = self.cfg, self.kb, self.lane
        cs2 = self.group_sums()
        quad = kb.alloc("quad", "int32", (4,)) if isinstance(self.n, int) and self.n % 4 == 0 \
            else None
        with kb.for_range(cfg.mt, kind="unroll", name="i") as i:
            with kb.for_range(cfg.nt // 2, kind="unroll", name="w") as w:
                for h in range(2):
                    row = self.m0 + self.wi * (cfg.bm // cfg.wm) + i * MMA_M + h * 8 + lane // 4
                    col0 = self.n0 + self.wj * (cfg.bn // cfg.wn) + w * 16 + lane % 4 * 4
                    values = [self.quad_value(cs2, i, w, h, q, col0) for q in range(4)]
                    self.store_quad(quad, values, row, col0)

    def quad_value(self, cs2: Optional[Buffer], i: Expr, w: Expr, h: int, q: int,
                   col0: Expr):
        """A function of the corrected value of column col0 + q of the lane's row in m
        tile i, window w, half h: q = 2e + parity is n tile 2w + parity, slot 2t + e,
        register h * 2 + e (built where it is stored: it loads b_zero[col])."""
        e, parity = divmod(q, 2)
        j = w * 2 + parity
        acc = self.acc[(i * self.cfg.nt + j) * 4 + h * 2 + e]
        rowsum = self.rs[i * 2 + h] if self.rs is not None else None
        colsum = cs2[j * 2 + e] if cs2 is not None else None
        return lambda: self.corrected(acc, rowsum, colsum, col0 + q if q else col0)

    def store_quad(self, quad: Optional[Buffer], values: list, row: Expr, col0: Expr) -> None:
        """Columns col0 .. col0 + 3 of `row`, each stored where row < M and col < N: one
        16-byte store when N % 4 == 0 (col0 < N then covers all four, aligned)."""
        kb = self.kb
        if quad is not None:
            with kb.if_then(logical_and(row < self.m, col0 < self.n)):
                for q, value in enumerate(values):
                    kb.store(quad, (q,), value())
                kb.emit(tc.copy(self.out_element(row, col0), quad[0], 16))
            return
        for q, value in enumerate(values):
            col = col0 + q if q else col0
            with kb.if_then(logical_and(row < self.m, col < self.n)):
                element = self.out_element(row, col)
                kb.store(element.buffer, element.indices, value())

    def out_element(self, row: Expr, col: Expr) -> Expr:
        return self.out[tuple(self.bidx) + (row, col)]

    def launch(self) -> Function:
        """The Function, its launch shape and the `gemm` attr the cost model reads (the
        f16-equivalent GEMM: K halved, `Int8TcConfig.half_equivalent`)."""
        geo, cfg = self.geo, self.cfg
        gx, gy, outer = self.grid
        attrs = {"gemm": (geo.m, geo.n, (geo.k + 1) // 2, outer, operand_bytes(geo),
                          cfg.half_equivalent())}
        return self.kb.finish(grid=(gx, gy, outer), block=(cfg.threads, 1, 1), **attrs)


def build_int8_tc_matmul(task: Task, cfg: Int8TcConfig, name: str) -> Function:
    kernel = _Kernel(task, cfg, name)
    if task.outputs[0].size > 0:    # else nothing to compute (and no row to clamp loads to)
        kernel.run()
    return kernel.launch()


def check_task(task: Task) -> None:
    """A MatMulInteger of uint8 / int8 operands into int32; a ValueError otherwise."""
    ok = (task.op == "MatMulInteger" and task.inputs[0].dtype in INT8
          and task.inputs[1].dtype in INT8 and task.outputs[0].dtype == "int32")
    if not ok:
        raise ValueError(f"the int8 tensor-core matmul takes a MatMulInteger of uint8 / "
                         f"int8 operands, got {task.signature()}")


# ------------------------------------------------------------------ template

# The cost model picks among these (the tiles `matmul_tc.DEFAULTS` uses, BK doubled; the
# 128x128 tile with 2x4 warps: with 2x2 warps, 64x64 warp tiles, ptxas needs all 255
# registers for it, `tc_registers`' int8 family)
DEFAULTS = (Int8TcConfig(128, 128, 64, 2, 4, 3), Int8TcConfig(128, 64, 64, 2, 2, 4),
            Int8TcConfig(64, 64, 64, 2, 2, 4), Int8TcConfig(64, 32, 64, 2, 1, 4))


def operand_bytes(geo: Geometry) -> int:
    return math.prod(geo.a_shape) + math.prod(geo.b_shape)


def cost_gemm(task: Task) -> cost.Gemm:
    """The f16-equivalent GEMM (K halved) the cost model weighs per batch entry."""
    geo = geometry(task)
    return cost.Gemm(geo.m, geo.n, (geo.k + 1) // 2, max(1, math.prod(geo.batch)),
                     operand_bytes(geo))


def estimate_us(gemm: cost.Gemm, cfg: Int8TcConfig, target: CudaTarget) -> float:
    """The half-equivalent tile's estimate at this kernel's own registers."""
    return cost.gemm_estimate(gemm, cfg.half_equivalent(), target,
                              cfg.registers_on(target.arch)).estimate_us


class TensorCoreMatmulInt8:
    name = "cuda.matmul_int8_tc"
    precisions = ("int8",)

    def space(self, task: Task, target: Target) -> Sequence[Int8TcConfig]:
        """The shape-free space; for a task, cheapest estimate first."""
        configs = int8_space(target)
        if task is None:
            return configs
        gemm, limits = cost_gemm(task.hinted()), cuda_target(target)
        return sorted(configs, key=lambda c: estimate_us(gemm, c, limits))

    def default(self, task: Task, target: Target) -> Int8TcConfig:
        """The cost model's cheapest of DEFAULTS (the first on a tie)."""
        gemm, limits = cost_gemm(task.hinted()), cuda_target(target)
        fitting = [c for c in DEFAULTS if fits(c, limits)]
        return min(fitting, key=lambda c: estimate_us(gemm, c, limits))

    def build(self, task: Task, config: Int8TcConfig, name: str, target: Target) -> Function:
        return build_int8_tc_matmul(task, config, name)


TEMPLATE = TensorCoreMatmulInt8()
