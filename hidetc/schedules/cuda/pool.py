"""CUDA rules for 2-D pooling: MaxPool and AveragePool (NCHW), one thread per output
element (`spatial(N*C, OH, OW)` over the global thread index, tail predicated by the
mapping guard), each window predicated against the padding; MaxPoolNHWC and
AveragePoolNHWC (channels-last, from `choose_layout` on cuda f16/bf16) the same with the
channel fastest (`spatial(N, OH, OW, C)`: a warp reads and writes consecutive channels
of a pixel, coalesced).

float16 and bfloat16 storage: the window body (`emit_pool_output`, shared with the CPU)
is built on float32 views of the buffers, then `widen_storage` makes each view load
read the half buffer converted to float32 and each view store round once: the window
is accumulated in float32."""
from __future__ import annotations

from typing import Mapping

from hidetc.compute.task import Task
from hidetc.schedules.cuda.common import ceil_div
from hidetc.schedules.cuda.injective import COMPUTE_DTYPE
from hidetc.schedules.window import emit_pool_output, pool_geometry
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.functor import Rewriter
from hidetc.tir.ir import (
    Buffer,
    Cast,
    Expr,
    Function,
    Load,
    Stmt,
    Store,
    block_idx,
    cast,
    thread_idx,
)
from hidetc.tir.mapping import spatial

THREADS = 256


def build_pool(task: Task, name: str) -> Function:
    g = pool_geometry(task)
    nhwc = task.op.endswith("NHWC")
    dt = task.outputs[0].dtype
    kb = KernelBuilder(name, "cuda")
    if nhwc:
        x = kb.buffer("x", dt, (g.n, g.h, g.w, g.c))
        out = kb.buffer("out", dt, (g.n, g.oh, g.ow, g.c))
        mapping, names = spatial(g.n, g.oh, g.ow, g.c), ["p", "y", "xo", "ch"]
    else:
        x = kb.buffer("x", dt, (g.n * g.c, g.h, g.w))
        out = kb.buffer("out", dt, (g.n * g.c, g.oh, g.ow))
        mapping, names = spatial(g.n * g.c, g.oh, g.ow), ["p", "y", "xo"]
    wide = COMPUTE_DTYPE.get(dt, dt)
    views = {} if wide == dt else {Buffer(b.name, wide, b.shape, b.scope): b for b in (x, out)}
    xv, outv = list(views) or [x, out]
    worker = block_idx() * THREADS + thread_idx()
    with kb.for_mapping(mapping, worker, names=names) as idx:
        emit_pool_output(kb, task, g, xv, outv, *idx)
    blocks = max(ceil_div(g.n * g.c * g.oh * g.ow, THREADS), 1)
    fn = kb.finish(grid=(blocks, 1, 1), block=(THREADS, 1, 1))
    return widen_storage(fn, views) if views else fn


def widen_storage(fn: Function, views: Mapping[Buffer, Buffer]) -> Function:
    """`fn` with its accesses to the wide `views` (view -> storage buffer) turned into
    accesses to the storage buffers: loads converted up, stores rounded once."""
    return _WidenStorage(views)(fn)


class _WidenStorage(Rewriter):
    def __init__(self, views: Mapping[Buffer, Buffer]):
        self.views = dict(views)

    def visit_Load(self, e: Load) -> Expr:
        e = super().visit_Load(e)
        storage = self.views.get(e.buffer)
        return e if storage is None else Cast(Load(storage, e.indices), e.buffer.dtype)

    def visit_Store(self, s: Store) -> Stmt:
        s = super().visit_Store(s)
        storage = self.views.get(s.buffer)
        return s if storage is None else Store(storage, s.indices, cast(s.value, storage.dtype))
