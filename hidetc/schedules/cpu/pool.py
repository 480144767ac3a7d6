"""CPU rules for 2-D pooling (NCHW): MaxPool, AveragePool, GlobalAveragePool and
GlobalMaxPool. Channels run in parallel; windows are predicated against the padding,
so any kernel, stride, padding, dilation and ceil_mode work.
"""
from __future__ import annotations

from hidetc.schedules.task import Task
from hidetc.schedules.window import emit_pool_output, pool_geometry
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Function, as_expr, maximum


def build_pool(task: Task, name: str) -> Function:
    g = pool_geometry(task)
    n, c, h, w, oh, ow = g.n, g.c, g.h, g.w, g.oh, g.ow
    out_type = task.outputs[0]
    dt = out_type.dtype
    kb = KernelBuilder(name, "cpu")
    x = kb.buffer("x", dt, (n * c, h, w))
    out = kb.buffer("out", dt, (n * c, oh, ow))
    with kb.for_range(n * c, kind="parallel", name="p") as p:
        with kb.for_range(oh, name="oh") as y, kb.for_range(ow, name="ow") as xo:
            emit_pool_output(kb, task, g, x, out, p, y, xo)
    return kb.finish()


def build_global_pool(task: Task, name: str) -> Function:
    x_type = task.inputs[0]
    nc = x_type.shape[0] * x_type.shape[1]
    spatial_size = x_type.size // max(nc, 1)
    is_max = task.op == "GlobalMaxPool"
    dt = x_type.dtype
    kb = KernelBuilder(name, "cpu")
    x = kb.buffer("x", dt, (nc, spatial_size))
    out = kb.buffer("out", dt, (nc,))
    with kb.for_range(nc, kind="parallel", name="p") as p:
        acc = kb.declare("acc", dt, float("-inf") if is_max else 0.0)
        with kb.for_range(spatial_size, name="k") as k:
            kb.assign(acc, maximum(acc, x[p, k]) if is_max else acc + x[p, k])
        kb.store(out, (p,), acc if is_max else acc / as_expr(float(spatial_size), acc))
    return kb.finish()

