"""The SIMT GEMM core of the CUDA MatMul (`matmul_simt`) and Conv (`conv_gemm`)
templates: per batch entry, C[M, N] = A[M, K] x B[K, N] with fma on the SIMT cores. A
subclass of `SimtGemm` says where an element of A, B and C lives (so A or B may be a
gather, e.g. im2col, never materialized); the schedule below is shared.

Schedule, for one BM x BN output tile per block:
- blocks: one 1-D grid over (batch entry, tile); inside a matrix the tiles are ordered
  in groups of `swizzle` tile-rows, column by column within a group, so the blocks
  running at once share a few A row-panels and B column-panels in L2; `swizzle = 1` is
  plain row-major order. The entry (`pid // tiles`) goes to the `batch_origin` hook.
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
- loads are predicated (`if ok: load else 0`; the hooks `a_element` / `b_element`
  give the address and the predicate, and no address is formed when it is false), so
  M, N, K need not be multiples of the tile (1 and primes work). A chunk is a float4
  (`hidetc_ld_f4`) when the subclass sets `va` / `vb` to 4, which it may only do when
  the operand's rows are contiguous with a length that is a multiple of 4 and 16-byte
  aligned (then every chunk, at a column multiple of 4, is aligned and wholly inside
  or wholly outside the row), else one element; decided per task at build time.
  Stores are predicated per element, or per float4 (`hidetc_copy16` from the
  accumulators, which stay in registers) when `vc` = 4 (same rule for C's rows); the
  `c_element` hook places C[row, col] and the `bias` hook may add a per-element term.
- repeat loops of <= 16 iterations are unrolled by lowering, so fragment and
  accumulator indices are constants and nvcc keeps them in registers.
- precision: float32, float16 and bfloat16 storage accumulate in float32 (a half: the
  staged registers hold halves, converted once when stored into the float32 shared tiles;
  fragments, accumulators and fma are float32; the result, bias added, is rounded to
  half once). float64 computes in float64. Vectors are float32 only.

Split-K (`SimtConfig.splits` = S > 1, grid y = the split): each block runs its split's
range of k tiles, then `split_k.reduce_splits` (which documents the protocol): the
block that arrives last at a tile adds the S partial sums in split order -- the same
bits whatever order the blocks ran in -- and runs the epilogue. The
default splits where the tiles leave SMs idle (`split_for`).

Space (independent of the shape): block tiles BM, BN in {32, 64, 128} (BM * BN >=
2048) with thread tiles tm, tn in {4, 8} and 64..256 threads, the warp arrangement
derived (the squarest warp tile), x BK in {8, 16} x vector in {True, False} x swizzle in
{1, 8}: 200 configs, pruned by the hardware limits (threads <= 1024, static shared
memory <= 48 KiB, estimated registers <= REGISTER_BUDGET); a task's space is those
configs each at its split-K (`split_for`). `default_config` looks at the GEMM's shape
and the target's SM count (see there).

Assumes: buffers 16-byte aligned (hidetc's arena and weights are 64-byte aligned); the
hooks keep to the rules above. Guarantees: correct for every config on every shape; no
memory access outside the operands.
"""
from __future__ import annotations

import itertools
import math
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import Iterator, Optional, Sequence

from hidetc.schedules.cuda import split_k
from hidetc.schedules.cuda.common import (
    SHARED_LIMIT,
    WARP,
    at_least_one,
    ceil_div,
    may_exceed_one,
)
from hidetc.tir import cuda as tc
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import (
    Buffer,
    Const,
    Expr,
    ExprLike,
    Function,
    as_expr,
    block_idx,
    call,
    cast,
    logical_and,
    maximum,
    minimum,
    syncthreads,
    thread_idx,
)
from hidetc.tir.mapping import Repeat, TaskMapping, repeat, spatial

MAX_THREADS = 1024             # threads per block on every GPU of sm_80 and newer
REGISTER_BUDGET = 200          # estimated registers per thread (ptxas max 255: margin)
REGISTER_OVERHEAD = 40         # addresses, indices, predicates, loop counters
TILES = (32, 64, 128)
THREAD_TILES = (4, 8)
THREAD_COUNTS = (64, 128, 256)
MIN_TILE_OUTPUTS = 2048
LANES = ((4, 8), (8, 4))
MAX_SPLITS = 16                # split-K factors the default considers
MIN_SPLIT_TILES = 4            # k tiles per split, at least
F32 = "float32"
FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")


@dataclass(frozen=True)
class SimtConfig:
    """warps (wm, wn) x lanes (lm, ln) x thread tile (tm, tn) = block tile (BM, BN)."""
    warps: tuple[int, int]
    lanes: tuple[int, int]
    thread: tuple[int, int]
    bk: int
    vector: bool
    swizzle: int
    splits: int = 1      # K split over this many blocks per output tile (split-K)

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


def default_config(m: int, n: int, k: int, nbatch: int, sms: int) -> SimtConfig:
    """128 x 128 (8 x 8 per thread, 256 threads) shrunk, the larger side first, until
    the grid has a block per SM (`sms`) or 32-wide tiles; 128 threads for smaller tiles;
    BK 8 for 128 x 128, else 16; float4 loads; swizzle 8 when both sides have > 8 tiles;
    then split-K (`split_for`) where the tiles still leave SMs idle."""
    bm = 128 if m > 64 else (64 if m > 32 else 32)
    bn = 128 if n > 64 else (64 if n > 32 else 32)
    while ceil_div(m, bm) * ceil_div(n, bn) * nbatch < sms and bm * bn > 2048:
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
    cfg = SimtConfig(warps, lanes, thread, 8 if bm * bn >= 128 * 128 else 16, True, swizzle)
    return split_for(cfg, m, n, k, nbatch, sms)


def split_for(cfg: SimtConfig, m: int, n: int, k: int, nbatch: int, sms: int) -> SimtConfig:
    """`cfg` with the fewest splits of K (at most MAX_SPLITS) that give every SM a block,
    each split keeping at least MIN_SPLIT_TILES k tiles; unsplit when the tiles alone
    fill the SMs or K is too short to share."""
    tiles = max(1, ceil_div(m, cfg.bm) * ceil_div(n, cfg.bn) * nbatch)
    k_tiles = ceil_div(k, cfg.bk)
    splits = 1
    while (tiles * splits < sms and splits < MAX_SPLITS
           and k_tiles >= (splits + 1) * MIN_SPLIT_TILES):
        splits += 1
    return replace(cfg, splits=splits)


# mappings -------------------------------------------------------------------------------
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


def _slots(grid: Sequence[TaskMapping]) -> int:
    return math.prod(grid[0].task_shape)


def _slot(grid: Sequence[TaskMapping], p: Expr, q: Expr) -> Expr:
    return p * grid[0].task_shape[1] + q


# the kernel -------------------------------------------------------------------------------
Element = tuple[Buffer, tuple[Expr, ...], Expr]   # buffer, indices, in-bounds predicate


class SimtGemm:
    """Builds one kernel; each method emits one part of the schedule. A subclass
    declares its buffers (in ABI order) after `__init__`, sets `va`, `vb`, `vc` and
    implements the hooks `batch_origin`, `a_element`, `b_element`, `c_element`
    (optionally `bias`)."""

    def __init__(self, cfg: SimtConfig, name: str, dtype: str, m: int, n: int, k: int,
                 nbatch: int, what: str = "GEMM"):
        problem = check_config(cfg)
        if problem:
            raise ValueError(f"{what} SIMT config {cfg}: {problem}")
        self.cfg = cfg
        self.dt = dtype
        self.acc_dt = "float64" if dtype == "float64" else F32
        self.m, self.n, self.k, self.nbatch = m, n, k, nbatch
        self.va = self.vb = self.vc = 1
        self.kb = KernelBuilder(name, "cuda")
        self.tiles_m = at_least_one(ceil_div(m, cfg.bm))
        self.tiles_n = at_least_one(ceil_div(n, cfg.bn))
        self.zero = Const(0.0, dtype)

    # hooks ------------------------------------------------------------------------------
    def batch_origin(self, entry: Expr) -> None:
        """Per block: whatever the element hooks need from the batch entry `entry`."""
        raise NotImplementedError

    def a_element(self, row: Expr, col: Expr) -> Element:
        raise NotImplementedError

    def b_element(self, row: Expr, col: Expr) -> Element:
        raise NotImplementedError

    def c_element(self, row: Expr, col: Expr) -> tuple[Buffer, tuple[Expr, ...]]:
        raise NotImplementedError

    def bias(self, row: Expr, col: Expr) -> Optional[Expr]:
        """A term (accumulator dtype) added to C[row, col] before the store, or None."""
        return None

    # the schedule -------------------------------------------------------------------------
    def build(self) -> Function:
        cfg, kb = self.cfg, self.kb
        self.blocks = self.tiles_m * self.tiles_n * at_least_one(self.nbatch)
        if cfg.splits > 1:      # after the subclass's buffers: the scratch buffers
            self.ws, self.counters = split_k.declare(kb, self.blocks, cfg.splits,
                                                     cfg.bm * cfg.bn, self.acc_dt)
        if self.m * self.n * self.nbatch > 0:
            self.origin()
            self.alloc()
            self.main_loop()
            if cfg.splits > 1:
                self.reduce_splits()
            else:
                self.epilogue()
        return self.finish()

    def finish(self) -> Function:
        attrs = {}
        if self.cfg.splits > 1:
            attrs["scratch"] = split_k.scratch_attr(self.ws, self.counters)
        return self.kb.finish(grid=(self.blocks, self.cfg.splits, 1),
                              block=(self.cfg.threads, 1, 1), **attrs)

    def origin(self) -> None:
        """The block's tile origin (m0, n0), then the batch hook."""
        kb = self.kb
        tiles = self.tiles_m * self.tiles_n
        pid = block_idx()
        t = pid % tiles if may_exceed_one(self.nbatch) else pid
        tile_m, tile_n = _swizzle(t, self.tiles_m, self.tiles_n, self.cfg.swizzle)
        self.m0 = kb.declare("m0", "int32", tile_m * self.cfg.bm)
        self.n0 = kb.declare("n0", "int32", tile_n * self.cfg.bn)
        self.batch_origin(pid // tiles)

    def alloc(self) -> None:
        cfg, kb, dt, acc = self.cfg, self.kb, self.dt, self.acc_dt
        self.sa = kb.alloc("sa", acc, (2, cfg.bk, cfg.bm), scope="shared")
        self.sb = kb.alloc("sb", acc, (2, cfg.bk, cfg.bn), scope="shared")
        self.a_grid = load_factors(cfg.bm, cfg.bk // self.va, cfg.threads)
        self.b_grid = load_factors(cfg.bk, cfg.bn // self.vb, cfg.threads)
        self.ra = kb.alloc("ra", dt, (_slots(self.a_grid), self.va))
        self.rb = kb.alloc("rb", dt, (_slots(self.b_grid), self.vb))
        self.fa = kb.alloc("fa", acc, (cfg.thread[0],))
        self.fb = kb.alloc("fb", acc, (cfg.thread[1],))
        self.acc = kb.alloc("acc", acc, cfg.thread)
        with self.kb.for_mapping(repeat(*cfg.thread), 0, names=["u", "v"]) as (u, v):
            self.kb.store(self.acc, (u, v), Const(0.0, acc))

    def fetch(self, dst: Buffer, slot: Expr, element: Element, width: int) -> None:
        """dst[slot, :width] = src[idx : idx + width] if ok else 0 (no access when not ok)."""
        kb, (src, idx, ok) = self.kb, element
        with kb.if_then(ok):
            if width == 4:
                kb.emit(tc.load_f4(dst[slot, 0], src[idx]))
            else:
                kb.store(dst, (slot, 0), src[idx])
        with kb.otherwise():
            for e in range(width):
                kb.store(dst, (slot, e), self.zero)

    def load(self, k0: Expr) -> None:
        """Tile k0 of A and B, global memory -> staging registers."""
        tid = thread_idx()
        with for_tiles(self.kb, self.a_grid, tid, "la") as ((i, c), (p, q)):
            self.fetch(self.ra, _slot(self.a_grid, p, q),
                       self.a_element(self.m0 + i, k0 + c * self.va), self.va)
        with for_tiles(self.kb, self.b_grid, tid, "lb") as ((r, c), (p, q)):
            self.fetch(self.rb, _slot(self.b_grid, p, q),
                       self.b_element(k0 + r, self.n0 + c * self.vb), self.vb)

    def store(self, stage: ExprLike) -> None:
        """Staging registers -> shared stage `stage` (A transposed to k-major)."""
        kb, tid, acc = self.kb, thread_idx(), self.acc_dt
        with for_tiles(kb, self.a_grid, tid, "sa") as ((i, c), (p, q)):
            slot = _slot(self.a_grid, p, q)
            for e in range(self.va):
                kb.store(self.sa, (stage, c * self.va + e, i), cast(self.ra[slot, e], acc))
        with for_tiles(kb, self.b_grid, tid, "sb") as ((r, c), (p, q)):
            slot = _slot(self.b_grid, p, q)
            for e in range(self.vb):
                kb.store(self.sb, (stage, r, c * self.vb + e), cast(self.rb[slot, e], acc))

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
        """Predicated stores of the accumulators (+ bias, rounded once to the storage
        dtype; float4 when `vc` is 4)."""
        kb, vc = self.kb, self.vc
        with for_tiles(kb, block_factors(self.cfg, vc), thread_idx(), "o") as ((i, j), (u, v)):
            row, col = self.m0 + i, self.n0 + j * vc
            with kb.if_then(logical_and(row < self.m, col < self.n)):
                buf, idx = self.c_element(row, col)
                bias = self.bias(row, col)
                if vc == 4:
                    if bias is not None:
                        for e in range(4):
                            kb.store(self.acc, (u, v * 4 + e), self.acc[u, v * 4 + e] + bias)
                    kb.emit(tc.copy(buf[idx], self.acc[u, v * 4], 16))
                else:
                    value = self.acc[u, v] if bias is None else self.acc[u, v] + bias
                    kb.store(buf, idx, cast(value, self.dt))

    def main_loop(self) -> None:
        """The double-buffered loop over this block's k tiles: all of them, or (split-K)
        split blockIdx.y's range [s P, min((s + 1) P, KT)), P = ceil(KT / S)."""
        kb, nk, bk, splits = self.kb, ceil_div(self.k, self.cfg.bk), self.cfg.bk, self.cfg.splits
        if splits == 1:
            first, count = 0, nk
            if nk > 0:
                self.load(Const(0, "int32"))
                self.store(0)
                kb.emit(syncthreads())
        else:
            per = ceil_div(nk, splits)
            first = kb.declare("kt0", "int32", block_idx("y") * per)
            count = kb.declare("kts", "int32", minimum(maximum(nk - first, 0), per))
            with kb.if_then(count > 0):       # uniform over the block: its barrier is too
                self.load(first * bk)
                self.store(0)
                kb.emit(syncthreads())
        with kb.for_range(count, name="kt") as kt:
            with kb.if_then(kt + 1 < count):
                self.load((first + kt + 1) * bk if splits > 1 else (kt + 1) * bk)
            self.compute(kt % 2)
            with kb.if_then(kt + 1 < count):
                self.store((kt + 1) % 2)
            kb.emit(syncthreads())

    def reduce_splits(self) -> None:
        """`split_k.reduce_splits` over the (tm x tn) accumulators, the flag in the A
        tile's first element (the main loop ended at a barrier), the epilogue
        `epilogue`."""
        tn = self.cfg.thread[1]
        split_k.reduce_splits(self.kb, self.acc, self.cfg.thread[0] * tn,
                              lambda a: (a // tn, a % tn), self.ws, self.counters,
                              block_idx(), block_idx("y"), self.cfg.splits, self.cfg.threads,
                              self.sa[0, 0, 0], self.epilogue)
