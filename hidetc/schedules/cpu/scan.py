"""CPU rules for the scans along one axis: ArgMax, ArgMin, Hardmax, CumSum and CumProd.

Schedule: the independent lines along the axis run in parallel (OpenMP), each line is
one serial loop. The line bodies (`emit_arg`, `emit_hardmax`, `emit_cumsum_line`) and
the semantics they implement are target-neutral, in `hidetc.schedules.common.scan_lines`,
shared with the CUDA rules (`hidetc.schedules.cuda.scan`: one thread per line).
Every CumSum/CumProd output element is stored exactly once and never read back, so the
kernel accepts grafted prologues and epilogues.
"""
from __future__ import annotations

import math

from hidetc.compute.task import Task
from hidetc.schedules.common.scan_lines import (
    arg_geometry,
    cumsum_axis,
    cumsum_dtype,
    emit_arg,
    emit_cumsum_line,
    emit_hardmax,
)
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Expr, Function, cast
from hidetc.tir.mapping import spatial


def build_arg(task: Task, name: str) -> Function:
    kept, axis, n = arg_geometry(task)
    x_type, out_type = task.inputs[0], task.outputs[0]
    kb = KernelBuilder(name, "cpu")
    x = kb.buffer("x", x_type.dtype, kept[:axis] + [n] + kept[axis + 1:])
    hard = task.op == "Hardmax"
    out = kb.buffer("out", out_type.dtype, x.shape if hard else (math.prod(kept),))
    with kb.for_range(math.prod(kept), kind="parallel", name="p") as p:
        with kb.for_mapping(spatial(*kept), p) as oidx:
            def at(k: Expr) -> list[Expr]:
                idx = list(oidx)
                idx[axis] = k
                return idx
            pos = emit_arg(kb, task, n, lambda k: x[tuple(at(k))], x_type.dtype)
            if hard:
                emit_hardmax(kb, pos, n, lambda k, v: kb.store(out, tuple(at(k)), v),
                             x_type.dtype)
            else:
                kb.store(out, (p,), pos)
    return kb.finish()


def build_cumsum(task: Task, name: str) -> Function:
    x_type, out_type = task.inputs[0], task.outputs[0]
    shape = tuple(x_type.shape) or (1,)
    size = math.prod(shape)
    kb = KernelBuilder(name, "cpu")
    x = kb.buffer("x", x_type.dtype, (size,))
    axis_buf = kb.buffer("axis", task.inputs[1].dtype, task.inputs[1].shape)
    out = kb.buffer("out", out_type.dtype, (size,))
    if size == 0:
        return kb.finish()
    n, inner = cumsum_axis(kb, axis_buf, shape)
    acc_dtype = cumsum_dtype(x_type.dtype)
    with kb.for_range(size // n, kind="parallel", name="line") as line:
        emit_cumsum_line(kb, task, line, n, inner, lambda i: x[i],
                         lambda i, v: kb.store(out, (i,), cast(v, out.dtype)), acc_dtype)
    return kb.finish()
