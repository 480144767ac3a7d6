"""CUDA template: float16 or bfloat16 batched MatMul on tensor cores (mma.sync m16n8k16
of that type, f32 accumulation), numpy semantics (broadcast batch dims, 1-D operands).
sm_80 and newer.

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
  16-deep k step (registers: ptxas's counts per config and arch are `tc_registers`'
  table; no config of the space spills at the reference shape).
- epilogue: the C fragment mapping `C_FRAGMENT = repeat(2, 1) * spatial(8, 4) *
  repeat(1, 2)` (lane -> groupID, threadID_in_group = spatial(8, 4); each lane rows
  g, g + 8 and columns 2t, 2t + 1; register (row // 8) * 2 + col % 2) converts each
  accumulator to the half type once and stores it, predicated on row < M and col < N; when N is
  even the column pair is one 4-byte store.

Space (`space`): BM, BN in {32..256}, BK in {16, 32, 64}, warp tiles WM, WN in {32, 64},
stages 2..4, pruned by the target's limits (`tc_common.fits`: threads <= 1024, shared
memory up to the per-block opt-in maximum -- dynamic shared memory past 48 KiB --,
registers <= 255 per thread (ptxas's count, `tc_registers`; no spills) and <= 64K
per block, every thread copying at least one 16-byte chunk of each tile) and by
`tc_common.worth_trying` (32..192 halves of K in flight; dynamic shared memory only
for deep pipelines of big tiles). For a task each tile config comes at the split-K the
cost model picks for it, cheapest estimate first (`cost.task_space`); the default is the
model's best of DEFAULTS; over a range of sizes that leaves the tile count open, every
config builds unsplit (`TensorCoreMatmul.over_range`).

The space, the swizzled tiles, the copy mappings and the block GEMM skeleton (pipeline,
fragments, epilogue) live in `tc_common`, shared with the implicit-GEMM convolution
(`conv_tc`); this module adds the MatMul geometry (batch, broadcast, 1-D operands), its
tile loads and its output indexing.

Assumes: A, B and the output of one half type (float16 or bfloat16), buffers 16-byte
aligned (hidetc's arena and
weights are 64-byte aligned). Guarantees: correct for every config on every shape.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from hidetc.compute.injective import broadcast_index, unravel
from hidetc.compute.task import Task
from hidetc.schedules.cuda import cost, split_k
from hidetc.schedules.cuda.common import at_least_one, ceil_div
from hidetc.schedules.cuda.tc_common import (  # noqa: F401  (re-exported)
    C_FRAGMENT,
    C_PAIRS,
    CHUNK,
    F16,
    HALVES,
    LDMATRIX_X4,
    MMA_K,
    MMA_M,
    MMA_N,
    CudaTarget,
    SwizzledTile,
    TcConfig,
    TcKernel,
    chunk_mapping,
    copy_width,
    cuda_target,
    fits,
    half_operands,
    spatial_index,
    tc_space,
    xor_bits,
)
from hidetc.schedules.template import Target
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Buffer, Expr, Function, block_idx, logical_and, minimum

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


# ------------------------------------------------------------------ the kernel

class _Kernel(TcKernel):
    """The MatMul buffers, tile loads and output indexing on the shared skeleton."""

    def __init__(self, task: Task, cfg: TcConfig, name: str):
        self.geo = geo = geometry(task)
        dt = check_task(task)
        kb = KernelBuilder(name, "cuda")
        self.a = kb.buffer("a", dt, geo.a_shape)
        self.b = kb.buffer("b", dt, geo.b_shape)
        self.out = kb.buffer("out", dt, geo.batch + (geo.m, geo.n))
        grid = (at_least_one(ceil_div(geo.n, cfg.bn)), at_least_one(ceil_div(geo.m, cfg.bm)),
                at_least_one(math.prod(geo.batch)))
        super().__init__(kb, cfg, geo.m, geo.n, geo.k, grid, dt)
        self.bidx = unravel(self.outer, geo.batch) if geo.batch else []
        self.a_pre = tuple(broadcast_index(self.bidx, geo.a_shape[:-2]))
        self.b_pre = tuple(broadcast_index(self.bidx, geo.b_shape[:-2]))
        self.m0, self.n0 = block_idx("y") * cfg.bm, block_idx("x") * cfg.bn
        self.pairs = geo.n % 2 == 0

    # global -> shared -------------------------------------------------------------
    def copy_chunk(self, dst: Buffer, dst_off: Expr, src: Buffer, pre: tuple,
                   row: Expr, col: Expr, bounds: tuple[int, int]) -> None:
        """Copy halves [col, col + 8) of `src` row `row` (predicated on `bounds`) to
        dst[dst_off...], in pieces of the widest size the row length keeps aligned."""
        rows, cols = bounds
        width = copy_width(cols)
        pieces = []
        for p in range(CHUNK // width):
            c = col + p * width if p else col
            ok = logical_and(row < rows, c < cols)
            pieces.append((ok, src[pre + (minimum(row, rows - 1), minimum(c, cols - width))]))
        self.copy_pieces(dst, dst_off, width, pieces)

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

    # registers -> global ------------------------------------------------------------
    def out_element(self, row: Expr, col: Expr) -> Expr:
        return self.out[tuple(self.bidx) + (row, col)]

    def launch(self) -> Function:
        return self.finish(operand_bytes(self.geo))


def build_tc_matmul(task: Task, cfg: TcConfig, name: str) -> Function:
    check_task(task)
    kernel = _Kernel(task, cfg, name)
    if task.outputs[0].size > 0:    # else nothing to compute (and no row to clamp loads to)
        kernel.run()
    return kernel.launch()


def check_task(task: Task) -> str:
    """The half type of a MatMul the tensor cores take (A, B and the output all float16
    or all bfloat16); a ValueError for another task."""
    dtype = half_operands({t.dtype for t in (*task.inputs[:2], task.outputs[0])})
    if task.op != "MatMul" or dtype is None:
        raise ValueError(f"the tensor-core matmul takes a MatMul in one of "
                         f"{', '.join(HALVES)}, got {task.signature()}")
    return dtype


# ------------------------------------------------------------------ template

# The cost model picks among these (each at its best split-K); the 64x32 tile gives
# latency-bound launches of a few k tiles twice the blocks of 64x64 (more SMs streaming);
# the 32-row tiles (one warp along M) serve M <= 32 (BERT-sized sequences, decoding)
# without a warp whose rows are all past M
DEFAULTS = (TcConfig(128, 128, 32, 2, 2, 3), TcConfig(128, 64, 32, 2, 2, 4),
            TcConfig(64, 64, 32, 2, 2, 4), TcConfig(64, 32, 32, 2, 1, 4),
            TcConfig(32, 64, 32, 1, 2, 4), TcConfig(32, 32, 32, 1, 1, 4))


def operand_bytes(geo: Geometry) -> int:
    return 2 * (math.prod(geo.a_shape) + math.prod(geo.b_shape))


def cost_gemm(task: Task) -> cost.Gemm:
    """The GEMM the cost model sees: per batch entry M x N x K."""
    geo = geometry(task)
    return cost.Gemm(geo.m, geo.n, geo.k, max(1, math.prod(geo.batch)), operand_bytes(geo))


def default_config(task: Task, target: Target) -> TcConfig:
    """The cost model's cheapest of DEFAULTS, each at its cheapest split-K."""
    return cost.gemm_choice(cost_gemm(task), DEFAULTS, cuda_target(target))


class TensorCoreMatmul:
    name = "cuda.matmul_tc"
    precisions = ("f16", "bf16")

    def space(self, task: Task, target: Target) -> Sequence[TcConfig]:
        return cost.task_space(cost_gemm(task) if task is not None else None,
                               tc_space(target), cuda_target(target))

    def default(self, task: Task, target: Target) -> TcConfig:
        return default_config(task, target)

    def over_range(self, task: Task, config: TcConfig) -> TcConfig:
        """`config` over `task`'s ranges: unsplit unless the tile count is a number
        (M, N and the batch: split-K's workspace and counters are sized by it)."""
        geo = geometry(task)
        tiles_static = all(isinstance(d, int) for d in (geo.m, geo.n, *geo.batch))
        return config if tiles_static else split_k.unsplit(task, config)

    def build(self, task: Task, config: TcConfig, name: str, target: Target) -> Function:
        return build_tc_matmul(task, config, name)


TEMPLATE = TensorCoreMatmul()
