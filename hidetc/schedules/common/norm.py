"""Rules for GroupNormalization, InstanceNormalization and MeanVarianceNormalization,
for both targets (`build_norm(task, name, target)`: the CPU rules take it as it is,
the CUDA rules in `hidetc.schedules.cuda.norm` call it with "cuda").

Schedule: one row per worker -- cpu: rows in parallel (OpenMP); cuda: one thread per
row (256-thread blocks, tail guarded) -- each row three serial passes: a shifted mean,
the mean of squared deviations, then each output stored once (never read back, so
epilogues can be grafted). Rows: GroupNormalization's (n, group) pairs over the group's
C / num_groups channels x spatial elements, then `* scale[c] + bias[c]` per channel
(or per group for the opset-18 [num_groups] form); InstanceNormalization is
GroupNormalization with one group per channel; MeanVarianceNormalization's kept
positions over the `axes` elements (default [0, 2, 3]).

Numerics: statistics in the arithmetic dtype (float32 for float32 and half storage,
float64 for float64) with the first element of the row as shift: d = mean(x - s),
var = mean(((x - s) - d)^2) (no cancellation when |mean| >> std, unlike E[x^2] -
E[x]^2). Group/InstanceNormalization: y = (x - mean) / sqrt(var + epsilon); MVN follows ONNX's
function body, y = (x - mean) / (sqrt(var) + 1e-9), with var computed as above
(mathematically E[x^2] - E[x]^2, never negative here).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Callable, Iterator

from hidetc.compute.indexing import unravel
from hidetc.compute.task import Task
from hidetc.graph.ops.norm import mvn_axes
from hidetc.target import simt
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Const, Expr, Function, as_expr, block_idx, call, cast, thread_idx
from hidetc.tir.mapping import spatial

THREADS = 256
WIDE = {"float16": "float32", "bfloat16": "float32"}


def emit_row_norm(kb: KernelBuilder, n: int, x_at: Callable[[Expr], Expr],
                  store: Callable[[Expr, Expr], None], scale: Callable[[Expr], Expr],
                  dtype: str) -> None:
    """Normalize one row of n elements: store(k, (x_k - mean) * scale(var))."""
    shift = kb.declare("shift", dtype, x_at(Const(0, "int32")))
    mean = kb.declare("mean", dtype, as_expr(0.0, shift))
    with kb.for_range(n, name="k") as k:
        kb.assign(mean, mean + (x_at(k) - shift))
    kb.assign(mean, mean / as_expr(float(n), mean))
    var = kb.declare("var", dtype, as_expr(0.0, shift))
    with kb.for_range(n, name="k") as k:
        d = kb.declare("d", dtype, x_at(k) - shift - mean)
        kb.assign(var, var + d * d)
    kb.assign(var, var / as_expr(float(n), var))
    factor = kb.declare("factor", dtype, scale(var))
    with kb.for_range(n, name="k") as k:
        store(k, (x_at(k) - shift - mean) * factor)


@contextmanager
def _rows(kb: KernelBuilder, rows: int, target: str) -> Iterator[Expr]:
    """The row loop of `target`, giving the row index."""
    if not simt(target):
        with kb.for_range(rows, kind="parallel", name="r") as r:
            yield r
    else:
        worker = block_idx() * THREADS + thread_idx()
        with kb.for_mapping(spatial(rows), worker, names=["r"]) as (r,):
            yield r


def _finish(kb: KernelBuilder, target: str, rows: int) -> Function:
    if not simt(target):
        return kb.finish()
    return kb.finish(grid=(max(-(-rows // THREADS), 1), 1, 1), block=(THREADS, 1, 1))


def build_norm(task: Task, name: str, target: str = "cpu") -> Function:
    x_type = task.inputs[0]
    dt = x_type.dtype
    wide = WIDE.get(dt, dt) if simt(target) else dt   # the C printer widens each op itself
    kb = KernelBuilder(name, target)
    if task.op in ("GroupNormalization", "InstanceNormalization"):
        return _groupnorm(kb, task, target, wide)
    shape = tuple(x_type.shape)
    axes = mvn_axes(len(shape), dict(task.attrs))
    kept = [1 if d in axes else s for d, s in enumerate(shape)]
    reduced = [shape[a] for a in axes] or [1]
    n = math.prod(reduced)
    x = kb.buffer("x", dt, shape)
    out = kb.buffer("out", dt, shape)
    rows = math.prod(kept)
    if rows and n:
        with _rows(kb, rows, target) as r:
            oidx = unravel(r, kept)

            def at(k: Expr) -> tuple[Expr, ...]:
                idx = list(oidx)
                for d, i in zip(axes, unravel(k, reduced)):
                    idx[d] = i
                return tuple(idx)

            eps = 1e-9
            emit_row_norm(kb, n, lambda k: cast(x[at(k)], wide),
                          lambda k, y: kb.store(out, at(k), cast(y, dt)),
                          lambda var: as_expr(1.0, var) / (call("sqrt", var)
                                                           + as_expr(eps, var)), wide)
    return _finish(kb, target, rows)


def _groupnorm(kb: KernelBuilder, task: Task, target: str, wide: str) -> Function:
    x_type = task.inputs[0]
    dt = x_type.dtype
    n, c = x_type.shape[:2]
    spatial_size = math.prod(x_type.shape[2:])
    groups = c if task.op == "InstanceNormalization" else int(task.attr("num_groups"))
    per_channel = c // groups
    m = per_channel * spatial_size
    per_group = task.inputs[1].shape == (groups,) and groups != c
    x = kb.buffer("x", dt, (n * groups, m))
    scale = kb.buffer("scale", task.inputs[1].dtype, task.inputs[1].shape)
    bias = kb.buffer("bias", task.inputs[2].dtype, task.inputs[2].shape)
    out = kb.buffer("out", dt, (n * groups, m))
    eps = float(task.attr("epsilon", 1e-5))
    rows = n * groups
    if rows and m:
        with _rows(kb, rows, target) as r:
            def store(k: Expr, y: Expr) -> None:
                where = r % groups if per_group else \
                    r % groups * per_channel + k // spatial_size
                y = y * cast(scale[where], wide) + cast(bias[where], wide)
                kb.store(out, (r, k), cast(y, dt))

            emit_row_norm(kb, m, lambda k: cast(x[r, k], wide), store,
                          lambda var: as_expr(1.0, var) / call("sqrt", var + as_expr(eps, var)),
                          wide)
    return _finish(kb, target, rows)
