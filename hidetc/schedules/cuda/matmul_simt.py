"""CUDA template: float32 batched MatMul on the SIMT cores (fma), numpy semantics
(broadcast batch dims; a 1-D A is a 1 x K matrix, a 1-D B a K x 1 one).

Schedule, for one BM x BN output tile per block:
- blocks: one 1-D grid over (batch, tile); inside a matrix the tiles are ordered in
  groups of `swizzle` tile-rows, column by column within a group, so the blocks running
  at once share a few A row-panels and B column-panels in L2; `swizzle = 1` is plain
  row-major order.
- threads: the block tile is the composed task mapping
  `spatial(wm, wn) * repeat(tm/4, tn/4) * spatial(lm, ln) * repeat(4, 4)`: warps are
  `spatial(wm, wn)` over the tile, the 32 lanes of a warp are `spatial(lm, ln)` with
  (lm, ln) = (4, 8) or (8, 4), and each thread owns a tm x tn register tile made of
  (tm/4) x (tn/4) sub-tiles of 4 x 4, one per warp footprint, so a thread reads 4
  consecutive floats of a shared row and a warp's reads spread over the banks.
- pipeline over K in steps of BK, double buffered: shared memory holds two stages of
  the A tile (stored k-major, BK x BM) and the B tile (BK x BN). Iteration kt loads
  tile kt + 1 from global memory into registers (the mapping
  `repeat(p, q) * spatial(r, c)` over the tile's (rows, chunks) grid, c chunks of a row
  side by side), computes tile kt from stage kt % 2 (per k: the thread's tm A values
  and tn B values into register fragments, then tm * tn fma), stores the registers
  into the other stage and synchronizes once: that barrier both publishes the next
  stage and proves every warp is done with the one the next iteration overwrites.
- loads are predicated (`if inside: load else 0`, no address is formed outside the
  matrices), so M, N, K need not be multiples of the tile (1 and primes work). A chunk
  is a float4 (`hidetc_ld_f4`) when the config asks for vectors and the row length is
  a multiple of 4 (then every chunk is 16-byte aligned: buffers are 64-byte aligned
  and chunk columns are multiples of 4), else one float; decided per task at build
  time. Stores are predicated per element, or per float4 (`hidetc_copy16` from the
  accumulators, which stay in registers) on the same condition for N.
- repeat loops of <= 16 iterations are unrolled by lowering, so fragment and
  accumulator indices are constants and nvcc keeps them in registers.

Split-K is not implemented: combining partial sums needs either a zeroed output
(a memset launch) or a workspace with zeroed counters, neither of which one Function
can provide race-free; tall-skinny problems use the smallest tiles instead.

Space (independent of the shape): block tiles BM, BN in {32, 64, 128} (BM * BN >=
2048) with thread tiles tm, tn in {4, 8} and 64..256 threads, the warp arrangement
derived (the squarest warp tile), x BK in {8, 16} x vector in {True, False} x swizzle in
{1, 8}: 200 configs, pruned by the hardware limits (threads <= 1024, static shared
memory <= 48 KiB, estimated registers <= REGISTER_BUDGET). `default_config` may look at
the shape (see there).

Assumes: buffers 16-byte aligned (hidetc's arena and weights are 64-byte aligned).
float16/float64 build too (scalar loads, fma in the dtype). Guarantees: correct for
every config on every shape; no memory access outside the operands.
"""
from __future__ import annotations

import itertools
import math
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import numpy as np

from hidetc.compute.injective import broadcast_index, unravel
from hidetc.errors import UnsupportedOpError
from hidetc.schedules.cuda.common import WARP, ceil_div
from hidetc.schedules.task import Task
from hidetc.schedules.template import Target
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import (
    Call,
    Const,
    Expr,
    ExprLike,
    Function,
    as_expr,
    block_idx,
    call,
    logical_and,
    minimum,
    syncthreads,
    thread_idx,
)
from hidetc.tir.mapping import Repeat, TaskMapping, repeat, spatial

MAX_THREADS = 1024
SHARED_LIMIT = 48 * 1024       # bytes of static shared memory
REGISTER_BUDGET = 200          # estimated registers per thread (ptxas max 255: margin)
REGISTER_OVERHEAD = 40         # addresses, indices, predicates, loop counters
TILES = (32, 64, 128)
THREAD_TILES = (4, 8)
THREAD_COUNTS = (64, 128, 256)
MIN_TILE_OUTPUTS = 2048
LANES = ((4, 8), (8, 4))
TARGET_BLOCKS = 100            # the default shrinks tiles until the grid has this many
F32 = "float32"


@dataclass(frozen=True)
class SimtConfig:
    """warps (wm, wn) x lanes (lm, ln) x thread tile (tm, tn) = block tile (BM, BN)."""
    warps: tuple[int, int]
    lanes: tuple[int, int]
    thread: tuple[int, int]
    bk: int
    vector: bool
    swizzle: int

    @property
    def bm(self) -> int:
        return self.warps[0] * self.lanes[0] * self.thread[0]

    @property
    def bn(self) -> int:
        return self.warps[1] * self.lanes[1] * self.thread[1]

    @property
    def threads(self) -> int:
        return self.warps[0] * self.warps[1] * WARP

    def shared_bytes(self) -> int:
        return 2 * self.bk * (self.bm + self.bn) * 4

    def registers(self) -> int:
        """An estimate: accumulators, fragments, staged loads and the overhead."""
        tm, tn = self.thread
        staged = ceil_div(self.bk * (self.bm + self.bn), self.threads)
        return tm * tn + tm + tn + staged + REGISTER_OVERHEAD


def check_config(cfg: SimtConfig) -> Optional[str]:
    """Why `cfg` breaks a hardware or layout limit, or None when it fits."""
    if cfg.lanes[0] * cfg.lanes[1] != WARP or any(t % 4 for t in cfg.thread):
        return "lanes must be 32 and thread tiles multiples of 4"
    if cfg.threads > MAX_THREADS:
        return f"{cfg.threads} threads > {MAX_THREADS}"
    if cfg.shared_bytes() > SHARED_LIMIT:
        return f"{cfg.shared_bytes()} bytes of shared memory > {SHARED_LIMIT}"
    if cfg.registers() > REGISTER_BUDGET:
        return f"about {cfg.registers()} registers per thread > {REGISTER_BUDGET}"
    return None


def _arrangement(bm: int, bn: int, tm: int, tn: int):
    """(warps, lanes) tiling a (bm/tm) x (bn/tn) thread grid, squarest warp tile first."""
    rows, cols = bm // tm, bn // tn
    options = [((rows // lm, cols // ln), (lm, ln)) for lm, ln in LANES
               if rows % lm == 0 and cols % ln == 0]
    return min(options, key=lambda o: (abs(o[1][0] * tm - o[1][1] * tn),
                                       abs(o[0][0] - o[0][1])), default=None)


def layouts() -> list[tuple[tuple[int, int], tuple[int, int], tuple[int, int]]]:
    """Every (warps, lanes, thread tile) of the space (see the module docstring)."""
    out = []
    for bm, bn, tm, tn in itertools.product(TILES, TILES, THREAD_TILES, THREAD_TILES):
        threads = (bm // tm) * (bn // tn)
        arrangement = _arrangement(bm, bn, tm, tn)
        if threads in THREAD_COUNTS and bm * bn >= MIN_TILE_OUTPUTS and arrangement:
            out.append((*arrangement, (tm, tn)))
    return out


def config_space() -> list[SimtConfig]:
    configs = [SimtConfig(w, ln, t, bk, vec, sw) for (w, ln, t) in layouts()
               for bk in (8, 16) for vec in (True, False) for sw in (1, 8)]
    return [c for c in configs if check_config(c) is None]


def default_config(m: int, n: int, nbatch: int) -> SimtConfig:
    """128 x 128 (8 x 8 per thread, 256 threads) shrunk, the larger side first, until
    the grid has TARGET_BLOCKS blocks or 32-wide tiles; 128 threads for smaller tiles;
    BK 8 for 128 x 128, else 16; float4 loads; swizzle 8 when both sides have > 8 tiles."""
    bm = 128 if m > 64 else (64 if m > 32 else 32)
    bn = 128 if n > 64 else (64 if n > 32 else 32)
    while ceil_div(m, bm) * ceil_div(n, bn) * nbatch < TARGET_BLOCKS and bm * bn > 2048:
        if bm >= bn:
            bm //= 2
        else:
            bn //= 2
    if bm * bn < MIN_TILE_OUTPUTS:
        bn = 2 * bn
    choices = [(w, ln, t) for w, ln, t in layouts()
               if w[0] * ln[0] * t[0] == bm and w[1] * ln[1] * t[1] == bn]
    warps, lanes, thread = min(choices, key=lambda c: (abs(c[0][0] * c[0][1] - 4), -c[2][0]))
    swizzle = 8 if ceil_div(m, bm) > 8 and ceil_div(n, bn) > 8 else 1
    return SimtConfig(warps, lanes, thread, 8 if bm * bn >= 128 * 128 else 16, True, swizzle)


class MatMulSimtTemplate:
    name = "cuda.matmul_simt"

    def space(self, task: Task, target: Target) -> Sequence[SimtConfig]:
        return config_space()

    def default(self, task: Task, target: Target) -> SimtConfig:
        dims = matmul_dims(task)
        return default_config(dims.m, dims.n, dims.nbatch)

    def build(self, task: Task, config: SimtConfig, name: str) -> Function:
        return build_matmul_simt(task, config, name)


TEMPLATE = MatMulSimtTemplate()


def build_matmul(task: Task, name: str) -> Function:
    """The rule entry: the template's default config."""
    return TEMPLATE.build(task, TEMPLATE.default(task, Target(kind="cuda")), name)


# shapes and mappings --------------------------------------------------------------------
@dataclass(frozen=True)
class MatMulDims:
    a_shape: tuple[int, ...]
    b_shape: tuple[int, ...]
    batch: tuple[int, ...]
    m: int
    n: int
    k: int

    @property
    def nbatch(self) -> int:
        return math.prod(self.batch)


def matmul_dims(task: Task) -> MatMulDims:
    a_type, b_type = task.inputs[0], task.inputs[1]
    a_shape = a_type.shape if len(a_type.shape) > 1 else (1,) + a_type.shape
    b_shape = b_type.shape if len(b_type.shape) > 1 else b_type.shape + (1,)
    batch = tuple(np.broadcast_shapes(a_shape[:-2], b_shape[:-2]))
    return MatMulDims(a_shape, b_shape, batch, a_shape[-2], b_shape[-1], a_shape[-1])


def _mix(outer: ExprLike, extent: int, inner: Expr) -> Expr:
    """outer * extent + inner, without the trivial terms."""
    if isinstance(outer, int) and outer == 0:
        return inner
    return as_expr(outer) * extent + inner if extent > 1 else as_expr(outer) + inner


@contextmanager
def for_tiles(kb: KernelBuilder, factors: Sequence[TaskMapping], worker: ExprLike,
              name: str = "t") -> Iterator[tuple[tuple[Expr, ...], tuple[Expr, ...]]]:
    """`for idx in (f0 * f1 * ...).on(worker)` (the composed mapping's tasks, same
    worker split), also yielding `local`: the index of the task among the worker's own,
    mixed from the `repeat` factors only -- the register-tile coordinates, constants
    once the repeat loops are unrolled."""
    worker = as_expr(worker)
    rank = factors[0].rank
    idx: list[ExprLike] = [0] * rank
    local: list[ExprLike] = [0] * rank
    with ExitStack() as stack:
        for f_no, f in enumerate(factors):
            inner = math.prod(g.num_workers for g in factors[f_no + 1:])
            w = worker if inner == 1 else worker // inner
            w = w if f_no == 0 or f.num_workers == 1 else w % f.num_workers
            w = 0 if f.num_workers == 1 else w
            names = [f"{name}{f_no}{'ij'[d] if rank == 2 else ''}" for d in range(rank)]
            vars_ = stack.enter_context(kb.for_mapping(f, w, names=names))
            idx = [_mix(o, s, v) for o, s, v in zip(idx, f.task_shape, vars_)]
            if isinstance(f, Repeat):
                local = [_mix(o, s, v) for o, s, v in zip(local, f.task_shape, vars_)]
        yield tuple(as_expr(i) for i in idx), tuple(as_expr(u) for u in local)


def load_factors(rows: int, cols: int, threads: int) -> list[TaskMapping]:
    """`repeat(p, q) * spatial(r, c)` over a rows x cols grid (powers of two): c threads
    side by side along a row, every thread busy when the grid has enough cells."""
    c = min(cols, threads)
    r = min(rows, threads // c)
    return [repeat(rows // r, cols // c), spatial(r, c)]


def block_factors(cfg: SimtConfig, vec_cols: int = 1) -> list[TaskMapping]:
    """The block tile mapping; with vec_cols = 4 each task is 4 consecutive columns."""
    (wm, wn), (lm, ln), (tm, tn) = cfg.warps, cfg.lanes, cfg.thread
    return [spatial(wm, wn), repeat(tm // 4, tn // 4), spatial(lm, ln),
            repeat(4, 4 // vec_cols)]


def axis_factors(cfg: SimtConfig, d: int) -> list[TaskMapping]:
    """The block mapping's factors along one axis (0: rows, 1: columns)."""
    return [spatial(cfg.warps[d]), repeat(cfg.thread[d] // 4), spatial(cfg.lanes[d]),
            repeat(4)]


def _swizzle(t: Expr, tiles_m: int, tiles_n: int, group: int) -> tuple[Expr, Expr]:
    """(tile row, tile column) of the t-th block of a matrix (see the module docstring)."""
    if group == 1 or tiles_m == 1:
        return t // tiles_n, t % tiles_n
    width = group * tiles_n
    first = t // width * group
    rows = as_expr(group) if tiles_m % group == 0 else minimum(tiles_m - first, group)
    in_group = t % width
    return first + in_group % rows, in_group // rows


# the kernel -------------------------------------------------------------------------------
class _MatMulKernel:
    """Builds one kernel; each method emits one part of the schedule."""

    def __init__(self, task: Task, cfg: SimtConfig, name: str):
        problem = check_config(cfg)
        if problem:
            raise ValueError(f"MatMul SIMT config {cfg}: {problem}")
        self.d = d = matmul_dims(task)
        self.cfg = cfg
        self.dt = dt = task.outputs[0].dtype
        self.va = 4 if cfg.vector and dt == F32 and d.k % 4 == 0 else 1
        self.vb = 4 if cfg.vector and dt == F32 and d.n % 4 == 0 else 1
        self.kb = kb = KernelBuilder(name, "cuda")
        self.a = kb.buffer("a", dt, d.a_shape)
        self.b = kb.buffer("b", dt, d.b_shape)
        self.out = kb.buffer("out", dt, d.batch + (d.m, d.n))
        self.tiles_m, self.tiles_n = max(1, ceil_div(d.m, cfg.bm)), max(1, ceil_div(d.n, cfg.bn))
        self.zero = Const(0.0, dt)

    def finish(self) -> Function:
        grid = (self.tiles_m * self.tiles_n * max(1, self.d.nbatch), 1, 1)
        return self.kb.finish(grid=grid, block=(self.cfg.threads, 1, 1))

    def origin(self) -> None:
        """The block's batch entry and tile origin (m0, n0)."""
        d, kb = self.d, self.kb
        tiles = self.tiles_m * self.tiles_n
        pid = block_idx()
        t = pid % tiles if d.nbatch > 1 else pid
        tile_m, tile_n = _swizzle(t, self.tiles_m, self.tiles_n, self.cfg.swizzle)
        self.m0 = kb.declare("m0", "int32", tile_m * self.cfg.bm)
        self.n0 = kb.declare("n0", "int32", tile_n * self.cfg.bn)
        bidx = unravel(pid // tiles, d.batch) if d.batch else []
        self.a_pre = tuple(broadcast_index(bidx, d.a_shape[:-2]))
        self.b_pre = tuple(broadcast_index(bidx, d.b_shape[:-2]))
        self.out_pre = tuple(bidx)

    def alloc(self) -> None:
        cfg, kb, dt = self.cfg, self.kb, self.dt
        self.sa = kb.alloc("sa", dt, (2, cfg.bk, cfg.bm), scope="shared")
        self.sb = kb.alloc("sb", dt, (2, cfg.bk, cfg.bn), scope="shared")
        self.a_grid = load_factors(cfg.bm, cfg.bk // self.va, cfg.threads)
        self.b_grid = load_factors(cfg.bk, cfg.bn // self.vb, cfg.threads)
        self.ra = kb.alloc("ra", dt, (_slots(self.a_grid), self.va))
        self.rb = kb.alloc("rb", dt, (_slots(self.b_grid), self.vb))
        self.fa = kb.alloc("fa", dt, (cfg.thread[0],))
        self.fb = kb.alloc("fb", dt, (cfg.thread[1],))
        self.acc = kb.alloc("acc", dt, cfg.thread)
        with self.kb.for_mapping(repeat(*cfg.thread), 0, names=["u", "v"]) as (u, v):
            self.kb.store(self.acc, (u, v), self.zero)

    def fetch(self, dst, slot: Expr, src, idx: tuple, ok: Expr, width: int) -> None:
        """dst[slot, :width] = src[idx : idx + width] if ok else 0 (no access when not ok)."""
        kb = self.kb
        with kb.if_then(ok):
            if width == 4:
                kb.evaluate(Call("hidetc_ld_f4", (dst[slot, 0], src[idx]), "void"))
            else:
                kb.store(dst, (slot, 0), src[idx])
        with kb.otherwise():
            for e in range(width):
                kb.store(dst, (slot, e), self.zero)

    def load(self, k0: Expr) -> None:
        """Tile k0 of A and B, global memory -> staging registers."""
        d, tid = self.d, thread_idx()
        with for_tiles(self.kb, self.a_grid, tid, "la") as ((i, c), (p, q)):
            row, col = self.m0 + i, k0 + c * self.va
            self.fetch(self.ra, _slot(self.a_grid, p, q), self.a, self.a_pre + (row, col),
                       logical_and(row < d.m, col < d.k), self.va)
        with for_tiles(self.kb, self.b_grid, tid, "lb") as ((r, c), (p, q)):
            row, col = k0 + r, self.n0 + c * self.vb
            self.fetch(self.rb, _slot(self.b_grid, p, q), self.b, self.b_pre + (row, col),
                       logical_and(row < d.k, col < d.n), self.vb)

    def store(self, stage: ExprLike) -> None:
        """Staging registers -> shared stage `stage` (A transposed to k-major)."""
        kb, tid = self.kb, thread_idx()
        with for_tiles(kb, self.a_grid, tid, "sa") as ((i, c), (p, q)):
            slot = _slot(self.a_grid, p, q)
            for e in range(self.va):
                kb.store(self.sa, (stage, c * self.va + e, i), self.ra[slot, e])
        with for_tiles(kb, self.b_grid, tid, "sb") as ((r, c), (p, q)):
            slot = _slot(self.b_grid, p, q)
            for e in range(self.vb):
                kb.store(self.sb, (stage, r, c * self.vb + e), self.rb[slot, e])

    def compute(self, stage: ExprLike) -> None:
        """acc += A tile (stage) x B tile (stage), one k at a time through fragments."""
        cfg, kb = self.cfg, self.kb
        warp, lane = thread_idx() // WARP, thread_idx() % WARP
        row_worker = warp // cfg.warps[1] * cfg.lanes[0] + lane // cfg.lanes[1]
        col_worker = warp % cfg.warps[1] * cfg.lanes[1] + lane % cfg.lanes[1]
        with kb.for_range(cfg.bk, kind="unroll", name="kk") as kk:
            with for_tiles(kb, axis_factors(cfg, 0), row_worker, "fa") as ((i,), (u,)):
                kb.store(self.fa, (u,), self.sa[stage, kk, i])
            with for_tiles(kb, axis_factors(cfg, 1), col_worker, "fb") as ((j,), (v,)):
                kb.store(self.fb, (v,), self.sb[stage, kk, j])
            with kb.for_mapping(repeat(*cfg.thread), 0, names=["u", "v"]) as (u, v):
                kb.store(self.acc, (u, v),
                         call("fma", self.fa[u], self.fb[v], self.acc[u, v]))

    def epilogue(self) -> None:
        """Predicated stores of the accumulators (float4 when N allows)."""
        d, kb, vc = self.d, self.kb, self.vb
        with for_tiles(kb, block_factors(self.cfg, vc), thread_idx(), "o") as ((i, j), (u, v)):
            row, col = self.m0 + i, self.n0 + j * vc
            with kb.if_then(logical_and(row < d.m, col < d.n)):
                if vc == 4:
                    kb.evaluate(Call("hidetc_copy16", (self.out[self.out_pre + (row, col)],
                                                       self.acc[u, v * 4]), "void"))
                else:
                    kb.store(self.out, self.out_pre + (row, col), self.acc[u, v])

    def main_loop(self) -> None:
        kb, nk, bk = self.kb, ceil_div(self.d.k, self.cfg.bk), self.cfg.bk
        if nk > 0:
            self.load(Const(0, "int32"))
            self.store(0)
            kb.emit(syncthreads())
        with kb.for_range(nk, name="kt") as kt:
            with kb.if_then(kt + 1 < nk):
                self.load((kt + 1) * bk)
            self.compute(kt % 2)
            with kb.if_then(kt + 1 < nk):
                self.store((kt + 1) % 2)
            kb.emit(syncthreads())


def _slots(grid: Sequence[TaskMapping]) -> int:
    return math.prod(grid[0].task_shape)


def _slot(grid: Sequence[TaskMapping], p: Expr, q: Expr) -> Expr:
    return p * grid[0].task_shape[1] + q


def build_matmul_simt(task: Task, cfg: SimtConfig, name: str) -> Function:
    """The kernel of `cfg` for `task` (see the module docstring)."""
    if len(task.inputs) != 2 or task.outputs[0].dtype not in ("float32", "float64", "float16"):
        raise UnsupportedOpError(f"MatMul: SIMT template for float matrices, got "
                                 f"{task.signature()}")
    kernel = _MatMulKernel(task, cfg, name)
    if task.outputs[0].size == 0:
        return kernel.finish()
    kernel.origin()
    kernel.alloc()
    kernel.main_loop()
    kernel.epilogue()
    return kernel.finish()
