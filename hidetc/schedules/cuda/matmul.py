"""CUDA rule for MatMul (numpy semantics: batched, broadcast, 1-D operands), f32 SIMT.

Schedule (one 256-thread block per 64 x 64 output tile, blockIdx.z the batch):
- per 16-wide K step, the block loads the A tile (64 x 16) with the task mapping
  `repeat(4, 1) * spatial(16, 16)` and the B tile (16 x 64) with
  `repeat(4, 1) * spatial(4, 64)` into shared memory (A stored k-major); loads outside
  the matrices read a clamped address and contribute 0, so any M, N, K works;
- each thread owns a 4 x 4 register tile: threads are `spatial(16, 16)`, their tasks
  `repeat(4, 4)` (together `spatial(16, 16) * repeat(4, 4)` over the 64 x 64 tile), and
  accumulates with fma from shared memory;
- stores are predicated. Double buffering, block swizzle and tensor cores belong to the
  matmul template (the templates issue).
"""
from __future__ import annotations

import math

import numpy as np

from hidetc.compute.injective import broadcast_index, unravel
from hidetc.schedules.cuda.common import ceil_div
from hidetc.schedules.task import Task
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import (
    Const,
    Function,
    block_idx,
    call,
    logical_and,
    minimum,
    select,
    syncthreads,
    thread_idx,
)
from hidetc.tir.mapping import repeat, spatial

BM, BN, BK, TM, TN = 64, 64, 16, 4, 4
THREADS = (BM // TM) * (BN // TN)


def build_matmul(task: Task, name: str) -> Function:
    a_type, b_type, out_type = task.inputs[0], task.inputs[1], task.outputs[0]
    a_shape = a_type.shape if len(a_type.shape) > 1 else (1,) + a_type.shape
    b_shape = b_type.shape if len(b_type.shape) > 1 else b_type.shape + (1,)
    m, k_dim, n = a_shape[-2], a_shape[-1], b_shape[-1]
    batch = tuple(np.broadcast_shapes(a_shape[:-2], b_shape[:-2]))
    dt = out_type.dtype
    kb = KernelBuilder(name, "cuda")
    a = kb.buffer("a", dt, a_shape)
    b = kb.buffer("b", dt, b_shape)
    out = kb.buffer("out", dt, batch + (m, n))
    bidx = unravel(block_idx("z"), batch) if batch else []
    a_pre = tuple(broadcast_index(bidx, a_shape[:-2]))
    b_pre = tuple(broadcast_index(bidx, b_shape[:-2]))
    m0, n0 = block_idx("y") * BM, block_idx("x") * BN
    sa = kb.alloc("sa", dt, (BK, BM), scope="shared")
    sb = kb.alloc("sb", dt, (BK, BN), scope="shared")
    acc = kb.alloc("acc", dt, (TM, TN))
    tid = thread_idx()
    ti, tj = tid // (BN // TN), tid % (BN // TN)
    with kb.for_mapping(repeat(TM, TN), 0, names=["u", "v"]) as (u, v):
        kb.store(acc, (u, v), Const(0.0, dt))
    with kb.for_range(ceil_div(k_dim, BK), name="kt") as kt:
        k0 = kt * BK
        with kb.for_mapping(repeat(4, 1) * spatial(16, 16), tid, names=["i", "k"]) as (i, k):
            ok = logical_and(m0 + i < m, k0 + k < k_dim)
            src = a[a_pre + (minimum(m0 + i, m - 1), minimum(k0 + k, k_dim - 1))]
            kb.store(sa, (k, i), select(ok, src, Const(0.0, dt)))
        with kb.for_mapping(repeat(4, 1) * spatial(4, 64), tid, names=["k", "j"]) as (k, j):
            ok = logical_and(k0 + k < k_dim, n0 + j < n)
            src = b[b_pre + (minimum(k0 + k, k_dim - 1), minimum(n0 + j, n - 1))]
            kb.store(sb, (k, j), select(ok, src, Const(0.0, dt)))
        kb.emit(syncthreads())
        with kb.for_range(BK, kind="unroll", name="kk") as kk:
            with kb.for_mapping(repeat(TM, TN), 0, names=["u", "v"]) as (u, v):
                prod = call("fma", sa[kk, ti * TM + u], sb[kk, tj * TN + v], acc[u, v])
                kb.store(acc, (u, v), prod)
        kb.emit(syncthreads())
    with kb.for_mapping(repeat(TM, TN), 0, names=["u", "v"]) as (u, v):
        i, j = m0 + ti * TM + u, n0 + tj * TN + v
        with kb.if_then(logical_and(i < m, j < n)):
            kb.store(out, tuple(bidx) + (i, j), acc[u, v])
    grid = (ceil_div(n, BN), ceil_div(m, BM), max(math.prod(batch), 1))
    return kb.finish(grid=grid, block=(THREADS, 1, 1))
