"""CUDA template: float16 or bfloat16 MatMul with few rows (M <= SMALL_M: classifier
heads, decoding), GEMV-style -- numpy semantics (broadcast batch dims, 1-D operands),
f32 accumulation.

A 64x64 tensor-core tile wastes most of its rows when M is 1; here every lane streams
the weights B [K, N] once, in 16-byte vectors, and multiplies them by all M rows of A.

Schedule, for CN = 8 x `lanes_n` output columns per block (grid: N / CN blocks on x,
the batch on z), `warps` warps per block:
- lane -> (k lane, n lane) = spatial(32 / lanes_n, lanes_n): n lane j holds columns
  [8 j, 8 j + 8) of the block's CN, so the lanes_n lanes of one k row read one
  contiguous 16 x lanes_n-byte piece of a B row (one `hidetc_copy16` each when N is a
  multiple of 8; else predicated half loads);
- the block's warps x (32 / lanes_n) k lanes take consecutive rows of K, `unroll` rows
  ahead per lane (all loads of a step issued before the FMAs that use them: memory
  parallelism, since a GEMV is bound by the weights' stream);
- per lane M x 8 f32 accumulators; A[m, k] is a scalar load (the lanes of one k row
  read the same address);
- reduction: the k lanes of a warp by `shfl_xor` over the k-lane bits, then the warps
  through shared memory (warps x M x CN floats), summed in warp order by the block's
  threads, each storing its (m, column) with the ordinary epilogue (grafted epilogues
  ride on it), predicated on column < N.

Space: lanes_n in {1, 2, 4, 8} x warps in {2, 4, 8} x unroll in {1, 2, 4}, shared memory
within the target's static limit; the default and the tuner's order come from the cost
model (`cost.gemv_estimate`). `hidetc.schedules.cuda.kernel_choice` takes this template
over the tensor-core one for a half MatMul of M <= SMALL_M when the cost model's
estimate of its default is the lower.

Assumes A, B and output of one half type (`matmul_tc.check_task`), buffers 16-byte
aligned (arena and weights are
64-byte aligned). Guarantees: correct for every config on every shape (any M <= SMALL_M,
N, K, including K = 0 and N not a multiple of 8).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

from hidetc.compute.injective import broadcast_index, unravel
from hidetc.compute.task import Task
from hidetc.schedules.cuda import cost
from hidetc.schedules.cuda.common import at_least_one, ceil_div
from hidetc.schedules.cuda.matmul_tc import Geometry, check_task, geometry, operand_bytes
from hidetc.schedules.cuda.tc_common import cuda_target, spatial_index
from hidetc.schedules.template import CudaTarget, Target
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.cuda import WARP_SIZE, copy, shfl_xor
from hidetc.tir.ir import (
    Const,
    Function,
    block_idx,
    cast,
    eq,
    logical_and,
    minimum,
    select,
    syncthreads,
    thread_idx,
)
from hidetc.tir.mapping import spatial

F32 = "float32"
SMALL_M = 16
VEC = 8                  # halves per 16-byte vector


@dataclass(frozen=True)
class GemvConfig:
    lanes_n: int         # lanes along N (each 8 columns)
    warps: int
    unroll: int          # k rows loaded ahead per lane

    @property
    def threads(self) -> int:
        return self.warps * WARP_SIZE

    @property
    def columns(self) -> int:
        return VEC * self.lanes_n

    @property
    def k_lanes(self) -> int:
        return WARP_SIZE // self.lanes_n

    def shared_bytes(self, m: int) -> int:
        return self.warps * m * self.columns * 4


def fits(cfg: GemvConfig, m: int, target: CudaTarget) -> bool:
    return (cfg.threads <= target.max_threads
            and cfg.shared_bytes(max(m, 1)) <= target.shared_bytes)


def gemv_space(m: int, target: CudaTarget) -> list[GemvConfig]:
    grid = itertools.product((1, 2, 4, 8), (2, 4, 8), (1, 2, 4))
    return [c for c in itertools.starmap(GemvConfig, grid) if fits(c, m, target)]


def _build(task: Task, cfg: GemvConfig, name: str) -> Function:
    dt = check_task(task)
    geo = geometry(task)
    if geo.m > SMALL_M:
        raise ValueError(f"the GEMV template takes M <= {SMALL_M}, got M = {geo.m}")
    kb = KernelBuilder(name, "cuda")
    a = kb.buffer("a", dt, geo.a_shape)
    b = kb.buffer("b", dt, geo.b_shape)
    out = kb.buffer("out", dt, geo.batch + (geo.m, geo.n))
    grid = (at_least_one(ceil_div(geo.n, cfg.columns)), 1, at_least_one(math.prod(geo.batch)))
    if task.outputs[0].size > 0:
        _body(kb, geo, cfg, a, b, out)
    gemm = (geo.m, geo.n, geo.k, grid[2], operand_bytes(geo), cfg)
    return kb.finish(grid=grid, block=(cfg.threads, 1, 1), gemv=gemm)


def _body(kb: KernelBuilder, geo: Geometry, cfg: GemvConfig, a, b, out) -> None:
    m_rows, tid = geo.m, thread_idx()
    bidx = unravel(block_idx("z"), geo.batch) if geo.batch else []
    a_pre = tuple(broadcast_index(bidx, geo.a_shape[:-2]))
    b_pre = tuple(broadcast_index(bidx, geo.b_shape[:-2]))
    lane, warp = tid % WARP_SIZE, tid // WARP_SIZE
    kl, nl = spatial_index(spatial(cfg.k_lanes, cfg.lanes_n), lane)
    col0 = kb.declare("col0", "int32", block_idx("x") * cfg.columns + nl * VEC)
    acc = kb.alloc("acc", F32, (m_rows * VEC,))
    bv = kb.alloc("bv", b.dtype, (cfg.unroll * VEC,))
    with kb.for_range(m_rows * VEC, kind="unroll", name="z") as z:
        kb.store(acc, (z,), Const(0.0, F32))
    rows_per_step = cfg.warps * cfg.k_lanes * cfg.unroll
    vector = geo.n % VEC == 0
    with kb.for_range(ceil_div(geo.k, rows_per_step), name="step") as step:
        base = (step * cfg.warps + warp) * (cfg.k_lanes * cfg.unroll)
        for u in range(cfg.unroll):       # every load of the step first
            k = base + u * cfg.k_lanes + kl
            if vector:
                with kb.if_then(logical_and(k < geo.k, col0 < geo.n)):
                    kb.emit(copy(bv[u * VEC], b[b_pre + (k, col0)], 16))
            else:
                for j in range(VEC):
                    ok = logical_and(k < geo.k, col0 + j < geo.n)
                    element = b[b_pre + (minimum(k, geo.k - 1), minimum(col0 + j, geo.n - 1))]
                    kb.store(bv, (u * VEC + j,), select(ok, element, Const(0.0, bv.dtype)))
        for u in range(cfg.unroll):       # then the FMAs
            k = base + u * cfg.k_lanes + kl
            with kb.if_then(logical_and(k < geo.k, col0 < geo.n) if vector else k < geo.k):
                for m in range(m_rows):
                    av = kb.declare("av", F32, cast(a[a_pre + (m, k)], F32))
                    for j in range(VEC):
                        i = m * VEC + j
                        kb.store(acc, (i,), acc[i] + av * cast(bv[u * VEC + j], F32))
    # the k lanes of each warp: butterfly over the k-lane bits of the lane index
    offset = cfg.lanes_n
    while offset < WARP_SIZE:
        with kb.for_range(m_rows * VEC, kind="unroll", name="r") as r:
            kb.store(acc, (r,), acc[r] + shfl_xor(acc[r], offset))
        offset *= 2
    # the warps: through shared memory, summed in warp order
    red = kb.alloc("red", F32, (cfg.warps * m_rows * cfg.columns,), "shared")
    with kb.if_then(eq(kl, 0)):
        for m in range(m_rows):
            for j in range(VEC):
                kb.store(red, ((warp * m_rows + m) * cfg.columns + nl * VEC + j,),
                         acc[m * VEC + j])
    kb.emit(syncthreads())
    per_block = m_rows * cfg.columns
    with kb.for_range(ceil_div(per_block, cfg.threads), name="o") as o:
        t = kb.declare("t", "int32", o * cfg.threads + tid)
        m, c = t // cfg.columns, t % cfg.columns
        col = block_idx("x") * cfg.columns + c
        with kb.if_then(logical_and(t < per_block, col < geo.n)):
            total = kb.declare("total", F32, red[m * cfg.columns + c])
            for w in range(1, cfg.warps):
                kb.assign(total, total + red[(w * m_rows + m) * cfg.columns + c])
            kb.store(out, tuple(bidx) + (m, col), cast(total, out.dtype))


def cost_gemv(task: Task) -> cost.Gemm:
    geo = geometry(task)
    return cost.Gemm(geo.m, geo.n, geo.k, max(1, math.prod(geo.batch)), operand_bytes(geo))


def default_config(task: Task, target: Target) -> GemvConfig:
    """The cost model's cheapest of the space."""
    return TEMPLATE.space(task, target)[0]


class GemvMatmul:
    name = "cuda.matmul_gemv"
    precisions = ("f16", "bf16")

    def space(self, task: Task, target: Target) -> Sequence[GemvConfig]:
        limits = cuda_target(target)
        if task is None or not applies(task):
            return gemv_space(SMALL_M, limits)
        gemm = cost_gemv(task)
        configs = gemv_space(gemm.m, limits)
        return sorted(configs, key=lambda c: cost.gemv_estimate(gemm, c, limits).estimate_us)

    def default(self, task: Task, target: Target) -> GemvConfig:
        return default_config(task, target)

    def build(self, task: Task, config: GemvConfig, name: str, target: Target) -> Function:
        return _build(task, config, name)


TEMPLATE = GemvMatmul()


def applies(task: Task) -> bool:
    """A half MatMul the GEMV template can take (M <= SMALL_M)."""
    try:
        check_task(task)
    except ValueError:
        return False
    return geometry(task).m <= SMALL_M
