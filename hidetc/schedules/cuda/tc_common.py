"""Shared pieces of the half-precision tensor-core templates (`matmul_tc`: MatMul,
`conv_tc`: ConvNHWC as implicit GEMM): the schedule space, the swizzled shared-memory
tiles, the copy mappings, and `TcKernel`, the block-level GEMM skeleton both build on.

The operands are 16-bit floats of one type, float16 or bfloat16 (`HALVES`; the
kernel's `dtype`): the tiles, ldmatrix and cp.async move their bits whatever the type,
the mma is `mma.m16n8k16` of that type (same fragment layouts, f32 accumulation), and
the epilogue rounds to that type.

`TcKernel` computes one (BM x BN) tile of C[M, N] = A[M, K] @ B[K, N] per block:
- the `stages`-deep cp.async pipeline over K (prologue of stages-1 tiles; iteration kt
  waits for tile kt with `wait_group(stages - 2)`, syncs the block, refills stage
  (kt - 1) % stages with tile kt + stages - 1, commits, computes on stage kt % stages);
- `compute_stage`: A fragments by `ldmatrix.x4` from the swizzled BM x BK tile; B
  fragments from either a BK x BN tile ([k][n], `ldmatrix.x4.trans`, the MatMul
  layout) or a BN x BK tile ([n][k] = B^T, plain `ldmatrix.x4`, the conv layout: see
  `B_NK_X4`); MT x NT `mma.m16n8k16` per 16-deep k step into f32 accumulators; where
  the tiles can overhang M (M not a multiple of BM, or symbolic) each 16-row sub-tile's
  A fragments and mma run only when it starts before M (a warp-uniform branch:
  `row_guard`), so no tensor-core work is spent on rows that are all past M;
- the epilogue: the C fragment (`C_FRAGMENT`), rounded to the half type once through
  the subclass's `out_value` (bias goes there), stored predicated on row < M, col < N
  (column pairs as one 4-byte store when the subclass allows it).
- split-K (`TcConfig.splits` = S > 1): grid z is (outer index) * S + split; split s
  runs k tiles [s * P, min((s + 1) * P, KT)) with P = ceil(KT / S) (none when that is
  empty: its partial sums are zeros); then `split_k.reduce_splits` (which documents
  the protocol) adds the splits' partial sums in the block that arrives last, which
  runs the epilogue; its "arrived last" flag is the A tile's first element (free once
  every warp has passed the main loop's last barrier: no shared memory beyond the
  tiles').
Subclasses provide the global buffers, `load_tile(stage, kt)` (16-byte chunks, with
`copy_pieces` for predicated cp.async), `out_element(row, col)`, and pass the unsplit
grid (x, y, outer) to `TcKernel.__init__`; they read the outer index (batch or group)
from `self.outer`, never from block_idx("z").

Space, layouts and fragment facts are documented in `matmul_tc` (their first user) and
checked by tests/schedules/test_cuda_matmul_tc.py.
"""
from __future__ import annotations

import contextlib
import itertools
import math
from dataclasses import dataclass

from hidetc.schedules.cuda import split_k, tc_registers
from hidetc.schedules.cuda.common import ceil_div
from hidetc.schedules.template import CudaTarget, Target
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
    maximum,
    minimum,
    select,
    syncthreads,
    thread_idx,
)
from hidetc.tir.mapping import TaskMapping, repeat, spatial

F16, BF16, F32 = "float16", "bfloat16", "float32"
HALVES = (F16, BF16)           # the operand types of the tensor-core templates
MMA_M, MMA_N, MMA_K = 16, 8, 16
CHUNK = 8                      # halves per 16-byte chunk
C_FRAGMENT = repeat(2, 1) * spatial(8, 4) * repeat(1, 2)
C_PAIRS = repeat(2, 1) * spatial(8, 4)   # the same, one task per column pair
LDMATRIX_X4 = spatial(2, 16)   # lane -> (chunk, row) of the row address it gives ldmatrix.x4
# B^T tile ([n][k]), plain ldmatrix.x4 over 16 n x 16 k: lane l gives the row address of
# row l % 8 of matrix q = l // 8; matrix q covers n rows (q // 2) * 8.., k chunk q % 2, so
# the registers are (b0, b1) of n tile j, then (b0, b1) of n tile j + 1: lane -> (n half,
# k chunk, row). An 8x8 [n][k] matrix without .trans gives lane l elements (n = l // 4,
# k = 2 (l % 4) + {0, 1}): exactly the mma "col" B fragment.
B_NK_X4 = spatial(2, 2, 8)


def half_operands(dtypes: set[str]) -> str | None:
    """The one half type (float16 or bfloat16) `dtypes` consists of, else None."""
    return next(iter(dtypes)) if len(dtypes) == 1 and set(dtypes) <= set(HALVES) else None


def cuda_target(target: Target) -> CudaTarget:
    """`target` itself: the tensor-core templates need the CUDA limits it carries."""
    if not isinstance(target, CudaTarget):
        raise TypeError(f"a CUDA template needs a CudaTarget, got {target!r}")
    return target


@dataclass(frozen=True)
class TcConfig:
    bm: int
    bn: int
    bk: int
    wm: int          # warps along M
    wn: int          # warps along N
    stages: int
    splits: int = 1  # K split over this many blocks per output tile (split-K)

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
    def key(self) -> tc_registers.Key:
        return (self.bm, self.bn, self.bk, self.wm, self.wn, self.stages)

    def registers_on(self, arch: str) -> int:
        """Registers per thread of this config's kernel on `arch`: ptxas's count for the
        reference task (`tc_registers`; the split-K kernel when splits > 1)."""
        counted = tc_registers.count("half", self.key, self.splits > 1, arch)
        return counted if counted is not None else tc_registers.estimate(self.key)

    def spills_on(self, arch: str) -> bool:
        """Whether ptxas spilled this config's reference kernel on `arch`."""
        return tc_registers.spills("half", self.key, self.splits > 1, arch) > 0


def within_limits(cfg: TcConfig, target: CudaTarget) -> bool:
    """The target's limits but registers: warp tiles of 32 or 64, threads, every thread
    copying a chunk of each tile, and shared memory up to the per-block opt-in maximum
    (past the 48 KiB of static shared memory the kernel's arrays are dynamic shared
    memory, `codegen.cuda.shared_layout`)."""
    ok_warp_tile = cfg.bm // cfg.wm in (32, 64) and cfg.bn // cfg.wn in (32, 64)
    copies = min(cfg.bm * cfg.bk, cfg.bk * cfg.bn) // CHUNK
    return (ok_warp_tile and cfg.threads <= target.max_threads
            and cfg.shared_bytes <= max(target.shared_bytes, target.shared_optin_bytes)
            and copies >= cfg.threads)


def fits(cfg: TcConfig, target: CudaTarget) -> bool:
    """Within the target's limits (`within_limits`) and its registers per thread and
    per block, by ptxas's count on the target's arch (`TcConfig.registers_on`), without
    spilling (a block of 512 threads held to 128 registers spills where its tile needs
    more)."""
    registers = cfg.registers_on(target.arch)
    return (within_limits(cfg, target) and registers <= target.max_registers
            and registers * cfg.threads <= target.registers_per_block
            and not cfg.spills_on(target.arch))


def _shape_worth_trying(cfg: TcConfig, target: CudaTarget) -> bool:
    if not 32 <= (cfg.stages - 1) * cfg.bk <= 192:
        return False
    if cfg.shared_bytes > target.shared_bytes:
        return (cfg.stages >= 3 and cfg.bk >= 32 and min(cfg.bm, cfg.bn) >= 64
                and cfg.threads <= 256)
    return True


def worth_trying(cfg: TcConfig, target: CudaTarget) -> bool:
    """The space's pruning beyond the limits: 32 to 192 halves of K in flight per block
    ((stages - 1) x BK: less hides no load latency, more only costs shared memory), and
    configs that need dynamic shared memory (past static memory's 48 KiB) only as deep
    pipelines (3+ stages) of 64x64 tiles or larger, BK >= 32, at most 256 threads and
    registers to spare (<= 192 by ptxas's count: what dynamic shared memory is for)."""
    if not _shape_worth_trying(cfg, target):
        return False
    return (cfg.shared_bytes <= target.shared_bytes
            or cfg.registers_on(target.arch) <= 192)


def tc_candidates(target: Target) -> list[TcConfig]:
    """Every tile, BK, warp layout and pipeline depth within `target`'s limits and worth
    trying, registers aside: the configs `tc_registers`' table counts."""
    limits = cuda_target(target)
    tiles, warps = (32, 64, 128, 256), (1, 2, 4)
    grid = itertools.product(tiles, tiles, (16, 32, 64), warps, warps, (2, 3, 4))
    return [c for c in itertools.starmap(TcConfig, grid)
            if within_limits(c, limits) and _shape_worth_trying(c, limits)]


def tc_space(target: Target) -> list[TcConfig]:
    """The shape-free space: the candidates that fit `target`'s registers and are worth
    trying (`fits`, `worth_trying`)."""
    limits = cuda_target(target)
    return [c for c in tc_candidates(limits)
            if fits(c, limits) and worth_trying(c, limits)]


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
    """A rows x cols tile of 16-bit elements in shared memory: row-major, 16-byte chunks
    XOR-swizzled per row (see matmul_tc's docstring). Works on ints and on index Exprs
    alike."""
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


def copy_pieces(kb: KernelBuilder, dst: Buffer, dst_off: Expr, width: int,
                pieces: list[tuple[Expr, Expr]]) -> None:
    """Fill the 16-byte chunk at dst[dst_off] from `pieces`, each (pred, source element)
    of `width` halves: cp.async (zero-filling when pred is false) or, for width 1, a
    predicated scalar load and shared store."""
    for p, (ok, element) in enumerate(pieces):
        target = dst[dst_off + p * width if p else dst_off]
        if width > 1:
            kb.emit(cp_async(target, element, 2 * width, ok))
        else:
            kb.store(dst, (dst_off + p,), select(ok, element, Const(0.0, dst.dtype)))


# ------------------------------------------------------------------ the block GEMM

class TcKernel:
    """The block GEMM skeleton (see the module docstring). `b_nk`: the B tile is stored
    [n][k] (B^T rows, conv weights) instead of [k][n]."""

    b_nk = False

    def __init__(self, kb: KernelBuilder, cfg: TcConfig, m: int, n: int, k: int,
                 grid: tuple[int, int, int], dtype: str = F16):
        """`grid`: the unsplit grid (x tiles, y tiles, outer count); `dtype`: the
        operands' half type (`HALVES`); the subclass's buffers are declared already (the
        scratch buffers come after them)."""
        if cfg.splits < 1:
            raise ValueError(f"split-K needs splits >= 1, got {cfg.splits}")
        if dtype not in HALVES:
            raise ValueError(f"the tensor-core GEMM takes {' or '.join(HALVES)}, got {dtype}")
        self.kb, self.cfg, self.m, self.n, self.k = kb, cfg, m, n, k
        self.dtype = dtype
        self.grid = grid
        splits = cfg.splits
        self.outer = block_idx("z") // splits if splits > 1 else block_idx("z")
        self.split = block_idx("z") % splits if splits > 1 else None
        tiles = math.prod(grid)
        if splits > 1:
            self.ws, self.counters = split_k.declare(kb, tiles, splits, cfg.bm * cfg.bn, F32)
        self.tile_a = SwizzledTile(cfg.bm, cfg.bk)
        self.tile_b = SwizzledTile(cfg.bn, cfg.bk) if self.b_nk else SwizzledTile(cfg.bk, cfg.bn)
        self.sa = kb.alloc("sa", dtype, (cfg.stages * self.tile_a.size,), "shared")
        self.sb = kb.alloc("sb", dtype, (cfg.stages * self.tile_b.size,), "shared")
        self.acc = kb.alloc("acc", F32, (cfg.mt * cfg.nt * 4,))
        self.fa = kb.alloc("fa", "uint32", (cfg.mt * 4,))
        self.fb = kb.alloc("fb", "uint32", (cfg.nt * 2,))
        self.tid = thread_idx()
        self.lane = self.tid % WARP_SIZE
        self.wi, self.wj = spatial_index(spatial(cfg.wm, cfg.wn), self.tid // WARP_SIZE)
        self.pairs = False          # subclasses: column pairs may be one 4-byte store

    # to provide ---------------------------------------------------------------------
    m0: Expr
    n0: Expr

    def load_tile(self, stage: int | Expr, kt: int | Expr) -> None:
        raise NotImplementedError

    def out_element(self, row: Expr, col: Expr) -> Expr:
        """The output element (a Load) of GEMM position (row, col)."""
        raise NotImplementedError

    def out_value(self, acc: Expr, col: Expr) -> Expr:
        """The half value stored for accumulator `acc` at GEMM column `col`."""
        return cast(acc, self.dtype)

    # global -> shared ---------------------------------------------------------------
    def copy_pieces(self, dst: Buffer, dst_off: Expr, width: int,
                    pieces: list[tuple[Expr, Expr]]) -> None:
        copy_pieces(self.kb, dst, dst_off, width, pieces)

    # shared -> registers -> tensor cores --------------------------------------------
    def compute_stage(self, stage: Expr) -> None:
        cfg, kb, lane = self.cfg, self.kb, self.lane
        ta, tb = self.tile_a, self.tile_b
        half, row16 = spatial_index(LDMATRIX_X4, lane)
        if self.b_nk:
            nhalf, kchunk, row8 = spatial_index(B_NK_X4, lane)
        with kb.for_range(cfg.bk // MMA_K, kind="unroll", name="kk") as kk:
            with kb.for_range(cfg.mt, kind="unroll", name="i") as i:
                with self.live_rows(i):
                    row = self.wi * (cfg.bm // cfg.wm) + i * MMA_M + row16
                    off = stage * ta.size + ta.offset(row, kk * 2 + half, key_row=row16)
                    kb.emit(ldmatrix(self.fa[i * 4], self.sa[off], 4))
            with kb.for_range(cfg.nt // 2, kind="unroll", name="j") as j:
                if self.b_nk:
                    row = self.wj * (cfg.bn // cfg.wn) + j * 16 + nhalf * 8 + row8
                    off = stage * tb.size + tb.offset(row, kk * 2 + kchunk, key_row=row8)
                    kb.emit(ldmatrix(self.fb[j * 4], self.sb[off], 4))
                else:
                    chunk = self.wj * (cfg.bn // cfg.wn // CHUNK) + j * 2 + half
                    off = stage * tb.size + tb.offset(kk * MMA_K + row16, chunk,
                                                      key_row=row16)
                    kb.emit(ldmatrix(self.fb[j * 4], self.sb[off], 4, trans=True))
            with kb.for_range(cfg.mt, kind="unroll", name="i") as i:
                with self.live_rows(i):
                    with kb.for_range(cfg.nt, kind="unroll", name="j") as j:
                        kb.emit(mma_m16n8k16(self.acc[(i * cfg.nt + j) * 4],
                                             self.fa[i * 4], self.fb[j * 2],
                                             dtype=self.dtype))

    @property
    def row_guard(self) -> bool:
        """Whether a block's tile can overhang M (then `live_rows` tests each 16-row
        sub-tile): M symbolic, or not a multiple of BM."""
        return not (isinstance(self.m, int) and self.m % self.cfg.bm == 0)

    def live_rows(self, i: Expr):
        """The scope of sub-tile i's work: under `row_guard`, a branch on its first row
        being before M -- the same for the whole warp (block, warp and i), so the
        warp-collective ldmatrix and mma see every lane or none."""
        if not self.row_guard:
            return contextlib.nullcontext()
        first = self.m0 + self.wi * (self.cfg.bm // self.cfg.wm) + i * MMA_M
        return self.kb.if_then(first < self.m)

    def main_loop(self) -> None:
        """The pipeline over this block's k tiles: all of them, or its split's range."""
        cfg, kb = self.cfg, self.kb
        k_tiles = ceil_div(self.k, cfg.bk)
        if self.split is None:
            first, count = 0, k_tiles
        else:
            per = ceil_div(k_tiles, cfg.splits)
            first = kb.declare("kt0", "int32", self.split * per)
            count = kb.declare("kts", "int32", minimum(maximum(k_tiles - first, 0), per))
        for s in range(cfg.stages - 1):
            if isinstance(count, int):
                if s < count:
                    self.load_tile(s, s)
            else:
                with kb.if_then(s < count):
                    self.load_tile(s, first + s)
            kb.emit(cp_async_commit())
        with kb.for_range(count, name="kt") as kt:
            kb.emit(cp_async_wait(cfg.stages - 2))
            kb.emit(syncthreads())
            nxt = kt + (cfg.stages - 1)
            with kb.if_then(nxt < count):
                self.load_tile(nxt % cfg.stages, nxt + first if self.split is not None
                               else nxt)
            kb.emit(cp_async_commit())
            self.compute_stage(kt % cfg.stages)

    # registers -> global ------------------------------------------------------------
    def zero_accumulators(self) -> None:
        with self.kb.for_range(self.acc.shape[0], kind="unroll", name="z") as z:
            self.kb.store(self.acc, (z,), Const(0.0, F32))

    def store_output(self) -> None:
        cfg, kb = self.cfg, self.kb
        pair = kb.alloc("pair", self.dtype, (2,)) if self.pairs else None
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
        kb = self.kb
        with kb.for_mapping(C_FRAGMENT, self.lane, names=("r", "c")) as (r, c):
            row, col = row0 + r, col0 + c
            with kb.if_then(logical_and(row < self.m, col < self.n)):
                value = self.out_value(self.acc[base + r // 8 * 2 + c % 2], col)
                element = self.out_element(row, col)
                kb.store(element.buffer, element.indices, value)

    def store_pairs(self, pair: Buffer, base: Expr, row0: Expr, col0: Expr) -> None:
        """Needs N even (then col < N implies col + 1 < N) and even element offsets."""
        kb = self.kb
        with kb.for_mapping(C_PAIRS, self.lane, names=("r", "c")) as (r, c):
            row, col = row0 + r, col0 + c * 2
            for e in range(2):
                value = self.out_value(self.acc[base + r // 8 * 2 + e], col + e if e else col)
                kb.store(pair, (e,), value)
            with kb.if_then(logical_and(row < self.m, col < self.n)):
                kb.emit(copy(self.out_element(row, col), pair[0], 4))

    # split-K: partial sums, the last block's reduction ----------------------------
    def reduce_splits(self) -> None:
        """`split_k.reduce_splits` over this block's accumulators, the flag in the A
        tile's first element, the epilogue `store_output`."""
        gx, gy, _ = self.grid
        tile = self.kb.declare("tile", "int32",
                               (self.outer * gy + block_idx("y")) * gx + block_idx("x"))
        split_k.reduce_splits(self.kb, self.acc, self.acc.shape[0], lambda a: (a,), self.ws,
                              self.counters, tile, self.split, self.cfg.splits,
                              self.cfg.threads, self.sa[0], self.store_output)

    def run(self) -> None:
        self.zero_accumulators()
        self.main_loop()
        if self.split is None:
            self.store_output()
        else:
            self.reduce_splits()

    def finish(self, operand_bytes: int) -> Function:
        """The Function, with its launch shape, its scratch buffers and the `gemm` attr
        (M, N, K, outer count, the operands' bytes, config: what the cost model reads)."""
        gx, gy, outer = self.grid
        attrs = {"gemm": (self.m, self.n, self.k, outer, operand_bytes, self.cfg),
                 "row_guard": self.row_guard}
        if self.split is not None:
            attrs["scratch"] = split_k.scratch_attr(self.ws, self.counters)
        return self.kb.finish(grid=(gx, gy, outer * self.cfg.splits),
                              block=(self.cfg.threads, 1, 1), **attrs)
