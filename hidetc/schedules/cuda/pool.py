"""CUDA rule for 2-D pooling (NCHW): MaxPool and AveragePool, one thread per output
element (`spatial(N*C, OH, OW)` over the global thread index, tail predicated by the
mapping guard), each window predicated against the padding."""
from __future__ import annotations

from hidetc.schedules.cuda.common import ceil_div
from hidetc.schedules.task import Task
from hidetc.schedules.window import emit_pool_output, pool_geometry
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Function, block_idx, thread_idx
from hidetc.tir.mapping import spatial

THREADS = 256


def build_pool(task: Task, name: str) -> Function:
    g = pool_geometry(task)
    n, c, h, w, oh, ow = g.n, g.c, g.h, g.w, g.oh, g.ow
    out_type = task.outputs[0]
    dt = out_type.dtype
    kb = KernelBuilder(name, "cuda")
    x = kb.buffer("x", dt, (n * c, h, w))
    out = kb.buffer("out", dt, (n * c, oh, ow))
    worker = block_idx() * THREADS + thread_idx()
    with kb.for_mapping(spatial(n * c, oh, ow), worker, names=["p", "y", "xo"]) as (p, y, xo):
        emit_pool_output(kb, task, g, x, out, p, y, xo)
    blocks = max(ceil_div(n * c * oh * ow, THREADS), 1)
    return kb.finish(grid=(blocks, 1, 1), block=(THREADS, 1, 1))
