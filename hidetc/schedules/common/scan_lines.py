"""The line bodies of the scans along one axis, for both targets: ArgMax/ArgMin/Hardmax
(`arg_geometry`, `emit_arg`, `emit_hardmax`) and CumSum/CumProd (`cumsum_axis`,
`cumsum_dtype`, `emit_cumsum_line`). Each emits one line's serial loop into a
KernelBuilder; the CPU rules (`hidetc.schedules.cpu.scan`: lines in parallel, OpenMP)
and the CUDA rules (`hidetc.schedules.cuda.scan`: one thread per line) only map the
lines onto workers, so both targets share the semantics below.

Semantics (the numpy references of `hidetc.graph.ops.reduce` / `norm`):
- ArgMax/ArgMin give the int64 position of the first extreme along `axis` (the last one
  with select_last_index=1); NaN counts as the extreme, as numpy's argmax/argmin do:
  the first NaN (the last NaN with select_last_index) wins. keepdims only changes the
  output view (the kernel stores a flat buffer of the kept positions).
- Hardmax stores 1 at ArgMax's position (first extreme) and 0 elsewhere on the line.
- CumSum/CumProd read the axis from input 1 AT RUN TIME (a graph input in ONNX's tests, a
  constant in models): the kernel derives the line length n and stride from it with a
  select chain over the (static) rank, walks `size / n` lines, and within a line
  accumulates (sum, or product from 1) forward or backward (reverse) and stores the
  running value before (exclusive) or after combining each element. Floats accumulate
  in float64 and round once per element (the reference's float64 cumsum/cumprod);
  integers in their dtype (wrapping like numpy).
"""
from __future__ import annotations

import math
from typing import Callable

from hidetc.compute.task import Task
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import (
    FLOATS,
    Const,
    Expr,
    Var,
    as_expr,
    cast,
    eq,
    index_const,
    logical_and,
    logical_not,
    logical_or,
    ne,
    select,
)

ARG_OPS = ("ArgMax", "ArgMin", "Hardmax")
At = Callable[[Expr], Expr]


def arg_geometry(task: Task) -> tuple[list[int], int, int]:
    """(kept shape with the axis set to 1, axis, its extent) of an arg/hardmax task."""
    shape = list(task.inputs[0].shape) or [1]
    default = -1 if task.op == "Hardmax" else 0
    axis = task.attr("axis", default) % len(shape)
    kept = list(shape)
    kept[axis] = 1
    return kept, axis, shape[axis]


def _better(op: str, v: Expr, best: Expr, last: bool) -> Expr:
    """Whether v replaces best: strictly (first extreme) or not (last); NaN wins."""
    greater = op != "ArgMin"
    if last:
        cmp = v >= best if greater else v <= best
    else:
        cmp = v > best if greater else v < best
    if v.dtype not in FLOATS:
        return cmp
    nan_v = ne(v, v)
    if last:
        return logical_or(cmp, nan_v)
    return logical_or(cmp, logical_and(nan_v, logical_not(ne(best, best))))


def emit_arg(kb: KernelBuilder, task: Task, n: int, x_at: At, dtype: str) -> Var:
    """Declare and compute the int64 position of the line's extreme; `x_at(k)` is the
    k-th element of the line in the arithmetic `dtype`."""
    op = "ArgMax" if task.op == "Hardmax" else task.op
    last = bool(task.attr("select_last_index", 0)) and task.op != "Hardmax"
    best = kb.declare("best", dtype, x_at(Const(0, "int32")))
    pos = kb.declare("pos", "int64", Const(0, "int64"))
    if n > 1:
        with kb.for_range(n - 1, name="k") as k0:
            k = k0 + 1
            v = kb.declare("v", dtype, x_at(k))
            with kb.if_then(_better(op, v, best, last)):
                kb.assign(best, v)
                kb.assign(pos, cast(k, "int64"))
    return pos


def emit_hardmax(kb: KernelBuilder, pos: Var, n: int, store: Callable[[Expr, Expr], None],
                 dtype: str) -> None:
    """Store 1 at `pos` and 0 elsewhere along the line (`store(k, value)`)."""
    with kb.for_range(n, name="k") as k:
        store(k, select(eq(cast(k, "int64"), pos), as_expr(1.0, Const(0.0, dtype)),
                        as_expr(0.0, Const(0.0, dtype))))


# CumSum ---------------------------------------------------------------------------------
def cumsum_dtype(dtype: str) -> str:
    return "float64" if dtype in FLOATS else dtype


def cumsum_axis(kb: KernelBuilder, axis_buf, shape: tuple[int, ...]) -> tuple[Var, Var]:
    """(n, inner) of the run-time axis: the line length and the stride along it."""
    rank = len(shape)
    a = kb.declare("axis", "int32", cast(axis_buf[tuple(0 for _ in axis_buf.shape)], "int32"))
    kb.assign(a, select(a < 0, a + rank, a))
    n_expr: Expr = index_const(shape[-1], "int32")
    inner_expr: Expr = Const(1, "int32")
    for d in range(rank - 2, -1, -1):
        n_expr = select(eq(a, d), index_const(shape[d], "int32"), n_expr)
        inner_expr = select(eq(a, d), index_const(math.prod(shape[d + 1:]), "int32"), inner_expr)
    return kb.declare("n", "int32", n_expr), kb.declare("inner", "int32", inner_expr)


def emit_cumsum_line(kb: KernelBuilder, task: Task, line: Expr, n: Var, inner: Var,
                     x_at: At, store: Callable[[Expr, Expr], None], dtype: str) -> None:
    """Scan line `line` (of size/n lines); x_at/store take flat element offsets."""
    base = kb.declare("base", "int32", line // inner * (n * inner) + line % inner)
    product = task.op == "CumProd"
    acc = kb.declare("acc", dtype, as_expr(int(product), Const(0, dtype)))
    reverse, exclusive = task.attr("reverse", 0), task.attr("exclusive", 0)
    with kb.for_range(n, name="k") as k:
        step = (n - 1 - k) if reverse else k
        offset = kb.declare("off", "int32", base + step * inner)
        value = cast(x_at(offset), dtype)
        combined = acc * value if product else acc + value
        if exclusive:
            store(offset, acc)
            kb.assign(acc, combined)
        else:
            kb.assign(acc, combined)
            store(offset, acc)
