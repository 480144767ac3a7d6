"""CUDA rules for reductions: Reduce* over any axes, Softmax/LogSoftmax along one axis,
LayerNormalization over the trailing axes, global pooling.

Schedule: one 256-thread block per output row; each thread folds a strided slice of
the row (`repeat(steps) * spatial(256)` over the row, the tail predicated by the
mapping's guard), then `block_reduce` combines the threads. Softmax subtracts the row
maximum; LayerNormalization uses two passes (mean, then mean squared deviation).
"""
from __future__ import annotations

import math

from hidetc.schedules.cpu.reduce import (
    INF,
    REDUCERS,
    _axis_view,
    _reduced_axes,
    identity_const,
    layernorm_buffers,
)
from hidetc.schedules.cuda.common import block_reduce, ceil_div
from hidetc.schedules.task import Task
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Expr, Function, as_expr, block_idx, call, cast, maximum, thread_idx
from hidetc.tir.mapping import repeat, spatial

THREADS = 256


def _row_loop(kb: KernelBuilder, n: int, name: str = "k"):
    """`for k in (this thread's share of range(n))`, predicated."""
    steps = max(ceil_div(n, THREADS), 1)
    return kb.for_mapping(repeat(steps) * spatial(THREADS), thread_idx(), names=[name])


def _fold(kb: KernelBuilder, n: int, term, combine, identity: float, dtype: str, name: str):
    acc = kb.declare(name, dtype, identity)
    with _row_loop(kb, n) as (k,):
        with kb.if_then(k < n):
            kb.assign(acc, combine(acc, term(k)))
    return block_reduce(kb, acc, combine, identity, THREADS, name)


def _finish(kb: KernelBuilder, rows: int) -> Function:
    return kb.finish(grid=(max(rows, 1), 1, 1), block=(THREADS, 1, 1))


def build_reduce(task: Task, name: str) -> Function:
    init, combine, finalize = REDUCERS[task.op]
    x_type, out_type = task.inputs[0], task.outputs[0]
    shape = x_type.shape
    axes = _reduced_axes(task)
    kept = [1 if d in axes else n for d, n in enumerate(shape)]
    reduced = [shape[d] for d in axes] or [1]
    total = math.prod(reduced)
    dt = out_type.dtype
    kb = KernelBuilder(name, "cuda")
    x = kb.buffer("x", x_type.dtype, shape)
    out = kb.buffer("out", dt, (math.prod(kept),))
    row = block_idx()
    with kb.for_mapping(spatial(*kept), row) as oidx:
        acc = kb.declare("acc", dt, identity_const(init, dt))
        with _row_loop(kb, total) as (f,):
            with kb.for_mapping(spatial(*reduced), f) as ridx:
                idx = list(oidx)
                for d, r in zip(axes, ridx):
                    idx[d] = r
                kb.assign(acc, combine(acc, cast(x[tuple(idx)], dt)))
        result = block_reduce(kb, acc, combine, identity_const(init, dt), THREADS, "acc")
        with kb.if_then(thread_idx() < 1):
            kb.store(out, (row,), finalize(result, total))
    return _finish(kb, math.prod(kept))


def build_softmax(task: Task, name: str) -> Function:
    x_type = task.inputs[0]
    outer, n, inner = _axis_view(x_type.shape, task.attr("axis", -1))
    dt = x_type.dtype
    kb = KernelBuilder(name, "cuda")
    x = kb.buffer("x", dt, (outer, n, inner))
    out = kb.buffer("out", dt, (outer, n, inner))
    with kb.for_mapping(spatial(outer, inner), block_idx(), names=["o", "i"]) as (o, i):
        top = _fold(kb, n, lambda k: x[o, k, i], maximum, -INF, dt, "top")
        total = _fold(kb, n, lambda k: call("exp", x[o, k, i] - top), lambda a, b: a + b,
                      0.0, dt, "total")
        with _row_loop(kb, n) as (k,):
            with kb.if_then(k < n):
                if task.op == "Softmax":
                    kb.store(out, (o, k, i), call("exp", x[o, k, i] - top) / total)
                else:
                    kb.store(out, (o, k, i), x[o, k, i] - top - call("log", total))
    return _finish(kb, outer * inner)


def build_layernorm(task: Task, name: str) -> Function:
    kb = KernelBuilder(name, "cuda")
    rows, n, eps, (x, scale, bias, out) = layernorm_buffers(kb, task)
    dt = x.dtype
    r = block_idx()
    add = lambda a, b: a + b  # noqa: E731
    mean = _fold(kb, n, lambda k: x[r, k], add, 0.0, dt, "mean")
    kb.assign(mean, mean / float(n))
    var = _fold(kb, n, lambda k: (x[r, k] - mean) * (x[r, k] - mean), add, 0.0, dt, "var")
    inv = kb.declare("inv", dt, as_expr(1.0, mean) / call("sqrt", var / float(n) + eps))
    with _row_loop(kb, n) as (k,):
        with kb.if_then(k < n):
            y: Expr = (x[r, k] - mean) * inv * scale[k]
            kb.store(out, (r, k), y + bias[k] if bias is not None else y)
    return _finish(kb, rows)


def build_global_pool(task: Task, name: str) -> Function:
    x_type = task.inputs[0]
    nc = x_type.shape[0] * x_type.shape[1]
    n = x_type.size // max(nc, 1)
    is_max = task.op == "GlobalMaxPool"
    dt = x_type.dtype
    kb = KernelBuilder(name, "cuda")
    x = kb.buffer("x", dt, (nc, n))
    out = kb.buffer("out", dt, (nc,))
    p = block_idx()
    if is_max:
        acc = _fold(kb, n, lambda k: x[p, k], maximum, -INF, dt, "acc")
    else:
        acc = _fold(kb, n, lambda k: x[p, k], lambda a, b: a + b, 0.0, dt, "acc")
    with kb.if_then(thread_idx() < 1):
        kb.store(out, (p,), acc if is_max else acc / as_expr(float(n), acc))
    return _finish(kb, nc)
