"""CUDA template: float16 batched MatMul on tensor cores (mma.sync m16n8k16, f32
accumulation), numpy semantics (broadcast batch dims, 1-D operands). sm_80 and newer.

Schedule, for one (BM x BN) output tile per block (grid: N tiles, M tiles, batch):
- warps: the block's `wm * wn` warps are `spatial(wm, wn)` over the tile; each warp owns
  a (WM = BM/wm) x (WN = BN/wn) warp tile = MT x NT mma tiles of 16 x 8, accumulated in
  MT*NT*4 f32 registers per lane.
- global -> shared: a `stages`-deep cp.async pipeline over K in steps of BK. A tile is
  BM x BK halves, B's is BK x BN (B stays row-major K x N). Each thread copies 16-byte
  chunks with the mapping `repeat(R, 1) * spatial(T // C, C)` over (rows, C chunks per
  row), so a warp's copies cover whole consecutive rows. Copies past M, N or K are
  predicated off: cp.async zero-fills them, so tiles need not divide the problem. When
  a row length (K for A, N for B) is not a multiple of 8 halves, a 16-byte source would
  be misaligned: each chunk is then copied in pieces of the largest aligned size (8 or 4
  bytes of cp.async, or predicated scalar half loads and shared stores), chosen at build
  time.
- pipeline: the prologue issues tiles 0..stages-2 (one commit group each); iteration kt
  waits until tile kt has landed (`wait_group(stages - 2)`), synchronizes the block
  (which also proves every warp finished computing on the stage about to be refilled),
  issues tile kt + stages - 1 into stage (kt - 1) % stages, commits, and computes on
  stage kt % stages.
- shared layouts (`SwizzledTile`): row-major with the 16-byte chunks of each row
  permuted by an XOR, chunk' = chunk ^ key(row), key(row) = (row // L) % min(C, 8) with L =
  max(1, 8 // C) rows per 128-byte bank line. The 8 row addresses of one ldmatrix
  matrix (8 consecutive rows, one logical chunk) then hit 8 distinct 16-byte bank
  groups (no bank conflicts), and a warp's cp.async stores cover whole rows (also
  conflict-free). The IR has no bitwise operators, so the XOR is spelled with integer
  arithmetic over the key's bits (`xor_bits`); nvcc hoists it out of the K loop.
- fragments: A by `ldmatrix.x4` (16 x 16: lane l gives row l % 16, chunk l // 16, so
  matrices 0..3 are the mma A registers a0..a3); B by `ldmatrix.x4.trans` over 16 k x 16
  n (two n tiles: registers b0, b1 of n tile j and j + 1), which turns the row-major
  [k][n] smem into the "col" B fragment. Both address patterns are the mapping
  `LDMATRIX_X4 = spatial(2, 16)`: lane -> (chunk, row). Then MT x NT `mma.m16n8k16` per
  16-deep k step (registers: ptxas reports 214 for the default config at 1024^3 on
  sm_90, no spills; `registers` below is only the pruning estimate).
- epilogue: the C fragment mapping `C_FRAGMENT = repeat(2, 1) * spatial(8, 4) *
  repeat(1, 2)` (lane -> groupID, threadID_in_group = spatial(8, 4); each lane rows
  g, g + 8 and columns 2t, 2t + 1; register (row // 8) * 2 + col % 2) converts each
  accumulator to f16 once and stores it, predicated on row < M and col < N; when N is
  even the column pair is one 4-byte store.

Space (`space`): BM, BN in {32..256}, BK in {16, 32, 64}, warp tiles WM, WN in {32, 64},
stages 2..4, pruned by hardware limits only: threads <= 1024, static shared memory
<= 48 KiB, estimated registers <= 255 per thread and <= 64K per block, and every thread
copying at least one 16-byte chunk of each tile: 186 configs.

Assumes: float16 A and B (and output), buffers 16-byte aligned (hidetc's arena and
weights are 64-byte aligned). Guarantees: correct for every config on every shape.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from hidetc.compute.injective import broadcast_index, unravel
from hidetc.schedules.cuda.common import ceil_div
from hidetc.schedules.task import Task
from hidetc.schedules.template import Target
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.cuda import (
    WARP_SIZE,
    copy,
    cp_async,
    cp_async_commit,
    cp_async_wait,
    ldmatrix,
    mma_m16n8k16,
)
from hidetc.tir.ir import (
    Buffer,
    Const,
    Expr,
    Function,
    block_idx,
    cast,
    logical_and,
    minimum,
    select,
    syncthreads,
    thread_idx,
)
from hidetc.tir.mapping import TaskMapping, repeat, spatial

F16, F32 = "float16", "float32"
MMA_M, MMA_N, MMA_K = 16, 8, 16
CHUNK = 8                      # halves per 16-byte chunk
C_FRAGMENT = repeat(2, 1) * spatial(8, 4) * repeat(1, 2)
C_PAIRS = repeat(2, 1) * spatial(8, 4)   # the same, one task per column pair
LDMATRIX_X4 = spatial(2, 16)   # lane -> (chunk, row) of the row address it gives ldmatrix.x4


@dataclass(frozen=True)
class CudaTarget(Target):
    """The CUDA limits this template relies on (a Target with `arch`; see the report)."""
    kind: str = "cuda"
    arch: str = "sm_90"
    sms: int = 132
    max_threads: int = 1024
    shared_bytes: int = 48 * 1024      # static shared memory per block
    max_registers: int = 255           # per thread
    registers_per_block: int = 64 * 1024


def cuda_target(target: Target) -> CudaTarget:
    return target if isinstance(target, CudaTarget) else CudaTarget()


@dataclass(frozen=True)
class TcConfig:
    bm: int
    bn: int
    bk: int
    wm: int          # warps along M
    wn: int          # warps along N
    stages: int

    @property
    def threads(self) -> int:
        return self.wm * self.wn * WARP_SIZE

    @property
    def mt(self) -> int:
        return self.bm // self.wm // MMA_M

    @property
    def nt(self) -> int:
        return self.bn // self.wn // MMA_N

    @property
    def shared_bytes(self) -> int:
        return self.stages * (self.bm * self.bk + self.bk * self.bn) * 2

    @property
    def registers(self) -> int:
        """Estimate: accumulators, A and B fragments, ~48 for addresses and loop state."""
        return self.mt * self.nt * 4 + self.mt * 4 + self.nt * 2 + 48


def fits(cfg: TcConfig, target: CudaTarget) -> bool:
    ok_warp_tile = cfg.bm // cfg.wm in (32, 64) and cfg.bn // cfg.wn in (32, 64)
    copies = min(cfg.bm * cfg.bk, cfg.bk * cfg.bn) // CHUNK
    return (ok_warp_tile and cfg.threads <= target.max_threads
            and cfg.shared_bytes <= target.shared_bytes
            and cfg.registers <= target.max_registers
            and cfg.registers * cfg.threads <= target.registers_per_block
            and copies >= cfg.threads)


def tc_space(target: Target) -> list[TcConfig]:
    limits = cuda_target(target)
    tiles, warps = (32, 64, 128, 256), (1, 2, 4)
    grid = itertools.product(tiles, tiles, (16, 32, 64), warps, warps, (2, 3, 4))
    return [c for c in itertools.starmap(TcConfig, grid) if fits(c, limits)]


# ------------------------------------------------------------------ shared layout

def xor_bits(x, key, bits: int):
    """`x ^ key` for 0 <= key < 2**bits and x >= 0, in integer arithmetic (the IR has
    no bitwise operators): the high bits of x are kept, each low bit is a parity."""
    if bits == 0:
        return x
    top = 1 << bits
    out = (x // top) * top
    for b in range(bits):
        p = 1 << b
        out = out + ((x // p + key // p) % 2) * p
    return out


@dataclass(frozen=True)
class SwizzledTile:
    """A rows x cols f16 tile in shared memory: row-major, 16-byte chunks XOR-swizzled
    per row (see the module docstring). Works on ints and on index Exprs alike."""
    rows: int
    cols: int

    @property
    def chunks(self) -> int:
        return self.cols // CHUNK

    @property
    def size(self) -> int:
        return self.rows * self.cols

    def key(self, row):
        lanes = min(self.chunks, 8)
        line_rows = max(1, 8 // self.chunks)
        return (row // line_rows) % lanes

    def offset(self, row, chunk, key_row=None):
        """Element offset of (row, first half of logical `chunk`); `key_row` (default
        `row`) is any value congruent to `row` modulo 8, cheaper when it is."""
        bits = int(math.log2(min(self.chunks, 8)))
        key = self.key(row if key_row is None else key_row)
        return row * self.cols + xor_bits(chunk, key, bits) * CHUNK


# ------------------------------------------------------------------ task geometry

@dataclass(frozen=True)
class Geometry:
    a_shape: tuple[int, ...]
    b_shape: tuple[int, ...]
    batch: tuple[int, ...]
    m: int
    n: int
    k: int


def geometry(task: Task) -> Geometry:
    """1-D operands made 2-D (A: 1 x K, B: K x 1); the broadcast batch shape."""
    a, b = task.inputs[0].shape, task.inputs[1].shape
    a_shape = a if len(a) > 1 else (1,) + tuple(a)
    b_shape = b if len(b) > 1 else tuple(b) + (1,)
    batch = tuple(np.broadcast_shapes(a_shape[:-2], b_shape[:-2]))
    return Geometry(tuple(a_shape), tuple(b_shape), batch, a_shape[-2], b_shape[-1],
                    a_shape[-1])


def copy_width(row_length: int) -> int:
    """Halves per aligned piece of a 16-byte chunk for rows of `row_length` halves."""
    return next(w for w in (8, 4, 2, 1) if row_length % w == 0)


def chunk_mapping(rows: int, chunks: int, threads: int) -> TaskMapping:
    """(rows x chunks) 16-byte chunks over `threads`: whole rows per round."""
    if threads < chunks:
        raise ValueError(f"{threads} threads cannot copy rows of {chunks} chunks")
    per_round = min(threads // chunks, rows)
    return repeat(rows // per_round, 1) * spatial(per_round, chunks)


def spatial_index(mapping: TaskMapping, worker: Expr) -> list[Expr]:
    """The task of `worker` in a one-task-per-worker mapping (no loops)."""
    loops, idx = mapping.emit(worker, "w")
    assert not loops, "spatial_index needs a purely spatial mapping"
    return idx


# ------------------------------------------------------------------ the kernel

class _Kernel:
    """The state `build` threads through the emitters below."""

    def __init__(self, task: Task, cfg: TcConfig, name: str):
        self.cfg, self.geo = cfg, geometry(task)
        geo = self.geo
        self.kb = kb = KernelBuilder(name, "cuda")
        self.a = kb.buffer("a", F16, geo.a_shape)
        self.b = kb.buffer("b", F16, geo.b_shape)
        self.out = kb.buffer("out", F16, geo.batch + (geo.m, geo.n))
        self.bidx = unravel(block_idx("z"), geo.batch) if geo.batch else []
        self.a_pre = tuple(broadcast_index(self.bidx, geo.a_shape[:-2]))
        self.b_pre = tuple(broadcast_index(self.bidx, geo.b_shape[:-2]))
        self.m0, self.n0 = block_idx("y") * cfg.bm, block_idx("x") * cfg.bn
        self.tile_a, self.tile_b = SwizzledTile(cfg.bm, cfg.bk), SwizzledTile(cfg.bk, cfg.bn)
        self.sa = kb.alloc("sa", F16, (cfg.stages * self.tile_a.size,), "shared")
        self.sb = kb.alloc("sb", F16, (cfg.stages * self.tile_b.size,), "shared")
        self.acc = kb.alloc("acc", F32, (cfg.mt * cfg.nt * 4,))
        self.fa = kb.alloc("fa", "uint32", (cfg.mt * 4,))
        self.fb = kb.alloc("fb", "uint32", (cfg.nt * 2,))
        self.tid = thread_idx()
        self.lane = self.tid % WARP_SIZE
        self.wi, self.wj = spatial_index(spatial(cfg.wm, cfg.wn), self.tid // WARP_SIZE)

    # global -> shared -------------------------------------------------------------
    def copy_chunk(self, dst: Buffer, dst_off: Expr, src: Buffer, pre: tuple,
                   row: Expr, col: Expr, bounds: tuple[int, int]) -> None:
        """Copy halves [col, col + 8) of `src` row `row` (predicated on `bounds`) to
        dst[dst_off...], in pieces of the widest size the row length keeps aligned."""
        rows, cols = bounds
        width = copy_width(cols)
        for p in range(CHUNK // width):
            c = col + p * width if p else col
            ok = logical_and(row < rows, c < cols)
            element = src[pre + (minimum(row, rows - 1), minimum(c, cols - width))]
            target = dst[dst_off + p * width if p else dst_off]
            if width > 1:
                self.kb.emit(cp_async(target, element, 2 * width, ok))
            else:
                self.kb.store(dst, (dst_off + p,), select(ok, element, Const(0.0, F16)))

    def load_tile(self, stage: int | Expr, kt: int | Expr) -> None:
        cfg, geo, kb = self.cfg, self.geo, self.kb
        k0 = kt * cfg.bk
        ta, tb = self.tile_a, self.tile_b
        with kb.for_mapping(chunk_mapping(cfg.bm, ta.chunks, cfg.threads), self.tid,
                            names=("r", "c")) as (r, c):
            off = stage * ta.size + ta.offset(r, c)
            self.copy_chunk(self.sa, off, self.a, self.a_pre, self.m0 + r,
                            k0 + c * CHUNK, (geo.m, geo.k))
        with kb.for_mapping(chunk_mapping(cfg.bk, tb.chunks, cfg.threads), self.tid,
                            names=("r", "c")) as (r, c):
            off = stage * tb.size + tb.offset(r, c)
            self.copy_chunk(self.sb, off, self.b, self.b_pre, k0 + r,
                            self.n0 + c * CHUNK, (geo.k, geo.n))

    # shared -> registers -> tensor cores ------------------------------------------
    def compute_stage(self, stage: Expr) -> None:
        cfg, kb, lane = self.cfg, self.kb, self.lane
        ta, tb = self.tile_a, self.tile_b
        half, row16 = spatial_index(LDMATRIX_X4, lane)
        with kb.for_range(cfg.bk // MMA_K, kind="unroll", name="kk") as kk:
            with kb.for_range(cfg.mt, kind="unroll", name="i") as i:
                row = self.wi * (cfg.bm // cfg.wm) + i * MMA_M + row16
                off = stage * ta.size + ta.offset(row, kk * 2 + half, key_row=row16)
                kb.emit(ldmatrix(self.fa[i * 4], self.sa[off], 4))
            with kb.for_range(cfg.nt // 2, kind="unroll", name="j") as j:
                chunk = self.wj * (cfg.bn // cfg.wn // CHUNK) + j * 2 + half
                off = stage * tb.size + tb.offset(kk * MMA_K + row16, chunk, key_row=row16)
                kb.emit(ldmatrix(self.fb[j * 4], self.sb[off], 4, trans=True))
            with kb.for_range(cfg.mt, kind="unroll", name="i") as i:
                with kb.for_range(cfg.nt, kind="unroll", name="j") as j:
                    kb.emit(mma_m16n8k16(self.acc[(i * cfg.nt + j) * 4], self.fa[i * 4],
                                         self.fb[j * 2]))

    def main_loop(self) -> None:
        cfg, kb = self.cfg, self.kb
        k_tiles = ceil_div(self.geo.k, cfg.bk)
        for s in range(cfg.stages - 1):
            if s < k_tiles:
                self.load_tile(s, s)
            kb.emit(cp_async_commit())
        with kb.for_range(k_tiles, name="kt") as kt:
            kb.emit(cp_async_wait(cfg.stages - 2))
            kb.emit(syncthreads())
            nxt = kt + (cfg.stages - 1)
            with kb.if_then(nxt < k_tiles):
                self.load_tile(nxt % cfg.stages, nxt)
            kb.emit(cp_async_commit())
            self.compute_stage(kt % cfg.stages)

    # registers -> global ------------------------------------------------------------
    def zero_accumulators(self) -> None:
        with self.kb.for_range(self.acc.shape[0], kind="unroll", name="z") as z:
            self.kb.store(self.acc, (z,), Const(0.0, F32))

    def store_output(self) -> None:
        cfg, geo, kb = self.cfg, self.geo, self.kb
        pair = kb.alloc("pair", F16, (2,)) if geo.n % 2 == 0 else None
        with kb.for_range(cfg.mt, kind="unroll", name="i") as i:
            with kb.for_range(cfg.nt, kind="unroll", name="j") as j:
                base = (i * cfg.nt + j) * 4
                row0 = self.m0 + self.wi * (cfg.bm // cfg.wm) + i * MMA_M
                col0 = self.n0 + self.wj * (cfg.bn // cfg.wn) + j * MMA_N
                if pair is None:
                    self.store_scalars(base, row0, col0)
                else:
                    self.store_pairs(pair, base, row0, col0)

    def store_scalars(self, base: Expr, row0: Expr, col0: Expr) -> None:
        kb, geo = self.kb, self.geo
        with kb.for_mapping(C_FRAGMENT, self.lane, names=("r", "c")) as (r, c):
            row, col = row0 + r, col0 + c
            with kb.if_then(logical_and(row < geo.m, col < geo.n)):
                value = cast(self.acc[base + r // 8 * 2 + c % 2], F16)
                kb.store(self.out, tuple(self.bidx) + (row, col), value)

    def store_pairs(self, pair: Buffer, base: Expr, row0: Expr, col0: Expr) -> None:
        kb, geo = self.kb, self.geo
        with kb.for_mapping(C_PAIRS, self.lane, names=("r", "c")) as (r, c):
            row, col = row0 + r, col0 + c * 2
            for e in range(2):
                kb.store(pair, (e,), cast(self.acc[base + r // 8 * 2 + e], F16))
            with kb.if_then(logical_and(row < geo.m, col < geo.n)):
                kb.emit(copy(self.out[tuple(self.bidx) + (row, col)], pair[0], 4))

    def finish(self) -> Function:
        cfg, geo = self.cfg, self.geo
        grid = (max(1, ceil_div(geo.n, cfg.bn)), max(1, ceil_div(geo.m, cfg.bm)),
                max(1, math.prod(geo.batch)))
        return self.kb.finish(grid=grid, block=(cfg.threads, 1, 1))


def build_tc_matmul(task: Task, cfg: TcConfig, name: str) -> Function:
    check_task(task)
    kernel = _Kernel(task, cfg, name)
    if task.outputs[0].size == 0:
        return kernel.finish()      # nothing to compute (and no row to clamp loads to)
    kernel.zero_accumulators()
    kernel.main_loop()
    kernel.store_output()
    return kernel.finish()


def check_task(task: Task) -> None:
    dtypes = {t.dtype for t in (*task.inputs[:2], task.outputs[0])}
    if task.op != "MatMul" or dtypes != {F16}:
        raise ValueError(f"the tensor-core matmul takes float16 MatMul, got "
                         f"{task.signature()}")


# ------------------------------------------------------------------ template

DEFAULTS = (TcConfig(128, 128, 32, 2, 2, 3), TcConfig(128, 64, 32, 2, 2, 4),
            TcConfig(64, 64, 32, 2, 2, 4))


def default_config(task: Task, target: Target) -> TcConfig:
    """The largest of DEFAULTS that still gives every SM a block (else the smallest)."""
    geo, limits = geometry(task), cuda_target(target)
    batch = max(1, math.prod(geo.batch))
    for cfg in DEFAULTS:
        blocks = ceil_div(geo.m, cfg.bm) * ceil_div(geo.n, cfg.bn) * batch
        if blocks >= limits.sms and fits(cfg, limits):
            return cfg
    return DEFAULTS[-1]


class TensorCoreMatmul:
    name = "cuda.matmul_tc"

    def space(self, task: Task, target: Target) -> Sequence[TcConfig]:
        return tc_space(target)

    def default(self, task: Task, target: Target) -> TcConfig:
        return default_config(task, target)

    def build(self, task: Task, config: TcConfig, name: str) -> Function:
        return build_tc_matmul(task, config, name)


TEMPLATE = TensorCoreMatmul()
