"""CUDA rules for the scans along one axis: ArgMax, ArgMin, Hardmax, CumSum and CumProd.

Schedule: one thread per line (256-thread blocks over the global thread index, the tail
guarded), each line one serial loop: the line bodies are the CPU rules' own
(`hidetc.schedules.common.scan_lines`), so both targets share semantics: first/last extreme
with NaN winning, Hardmax's one-hot of the first maximum, CumSum's run-time axis,
exclusive/reverse, float64 accumulation for floats. float16 elements are compared and
summed after conversion to float32/float64 (exact), results rounded once at the store.
CumSum launches enough threads for the axis with the most lines (its axis is only known
at run time); threads past `size / n` lines do nothing.
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
from hidetc.schedules.cuda.common import ceil_div
from hidetc.schedules.cuda.injective import COMPUTE_DTYPE, widen
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Expr, Function, block_idx, cast, thread_idx
from hidetc.tir.mapping import spatial

THREADS = 256


def _launch(kb: KernelBuilder, workers: int) -> Function:
    blocks = max(ceil_div(workers, THREADS), 1)
    return kb.finish(grid=(blocks, 1, 1), block=(THREADS, 1, 1))


def build_arg(task: Task, name: str) -> Function:
    kept, axis, n = arg_geometry(task)
    x_type, out_type = task.inputs[0], task.outputs[0]
    kb = KernelBuilder(name, "cuda")
    x = kb.buffer("x", x_type.dtype, kept[:axis] + [n] + kept[axis + 1:])
    hard = task.op == "Hardmax"
    out = kb.buffer("out", out_type.dtype, x.shape if hard else (math.prod(kept),))
    worker = block_idx() * THREADS + thread_idx()
    with kb.for_mapping(spatial(*kept), worker) as oidx:
        def at(k: Expr) -> tuple[Expr, ...]:
            idx = list(oidx)
            idx[axis] = k
            return tuple(idx)
        wide = COMPUTE_DTYPE.get(x_type.dtype, x_type.dtype)
        pos = emit_arg(kb, task, n, lambda k: widen(x[at(k)]), wide)
        if hard:
            emit_hardmax(kb, pos, n, lambda k, v: kb.store(out, at(k), cast(v, out.dtype)),
                         wide)
        else:
            kb.store(out, (worker,), pos)
    return _launch(kb, math.prod(kept))


def build_cumsum(task: Task, name: str) -> Function:
    x_type, out_type = task.inputs[0], task.outputs[0]
    shape = tuple(x_type.shape) or (1,)
    size = math.prod(shape)
    kb = KernelBuilder(name, "cuda")
    x = kb.buffer("x", x_type.dtype, (size,))
    axis_buf = kb.buffer("axis", task.inputs[1].dtype, task.inputs[1].shape)
    out = kb.buffer("out", out_type.dtype, (size,))
    lines = max((size // d for d in shape if d), default=0)
    if size == 0:
        return _launch(kb, 1)
    n, inner = cumsum_axis(kb, axis_buf, shape)
    line = block_idx() * THREADS + thread_idx()
    with kb.if_then(line < size // n):
        emit_cumsum_line(kb, task, line, n, inner, lambda i: x[i],
                         lambda i, v: kb.store(out, (i,), cast(v, out.dtype)),
                         cumsum_dtype(x_type.dtype))
    return _launch(kb, lines)
