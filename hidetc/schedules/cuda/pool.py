"""CUDA rule for 2-D pooling (NCHW): MaxPool and AveragePool, one thread per output
element (`spatial(N*C, OH, OW)` over the global thread index, tail predicated by the
mapping guard), each window predicated against the padding."""
from __future__ import annotations

from hidetc.schedules.cuda.common import ceil_div
from hidetc.schedules.task import Task
from hidetc.schedules.window import pool_geometry
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Function, block_idx, cast, logical_and, maximum, minimum, thread_idx
from hidetc.tir.mapping import spatial

THREADS = 256


def build_pool(task: Task, name: str) -> Function:
    g = pool_geometry(task)
    n, c, h, w, oh, ow = g.n, g.c, g.h, g.w, g.oh, g.ow
    kernel, strides, dil, pb, pads = g.kernel, g.strides, g.dilations, g.begin, g.pads
    out_type = task.outputs[0]
    is_max = task.op == "MaxPool"
    dt = out_type.dtype
    kb = KernelBuilder(name, "cuda")
    x = kb.buffer("x", dt, (n * c, h, w))
    out = kb.buffer("out", dt, (n * c, oh, ow))
    worker = block_idx() * THREADS + thread_idx()
    with kb.for_mapping(spatial(n * c, oh, ow), worker, names=["p", "y", "xo"]) as (p, y, xo):
        acc = kb.declare("acc", dt, float("-inf") if is_max else 0.0)
        cnt = kb.declare("cnt", "int32", 0)
        with kb.for_range(kernel[0], name="kh") as kh, kb.for_range(kernel[1], name="kw") as kw:
            ih = y * strides[0] - pb[0] + kh * dil[0]
            iw = xo * strides[1] - pb[1] + kw * dil[1]
            with kb.if_then(logical_and(ih >= 0, ih < h, iw >= 0, iw < w)):
                v = x[p, ih, iw]
                kb.assign(acc, maximum(acc, v) if is_max else acc + v)
                kb.assign(cnt, cnt + 1)
        if is_max:
            kb.store(out, (p, y, xo), acc)
        elif task.attr("count_include_pad", 0):
            hs, ws = y * strides[0] - pb[0], xo * strides[1] - pb[1]
            rows = minimum(hs + kernel[0], h + pads[2]) - hs
            cols = minimum(ws + kernel[1], w + pads[3]) - ws
            kb.store(out, (p, y, xo), acc / cast(rows * cols, dt))
        else:
            kb.store(out, (p, y, xo), acc / cast(maximum(cnt, 1), dt))
    blocks = max(ceil_div(n * c * oh * ow, THREADS), 1)
    return kb.finish(grid=(blocks, 1, 1), block=(THREADS, 1, 1))
