"""The TopK line body, for both targets: `topk_geometry` (X viewed as [outer, n, inner],
the outputs as [outer, k, inner]), the order `better` and `emit_topk_line`, one line's
serial pass. The CPU rule (`hidetc.schedules.cpu.topk`: lines in parallel, OpenMP) and
the CUDA rule (`hidetc.schedules.cuda.topk`: one thread per line) only map the lines
onto workers, so both targets keep the same order.

Algorithm: the outputs themselves hold the line's best-so-far, sorted: element j
(j = 0..n-1 in order) enters when fewer than k are kept or it is better than the last
kept one; it then sinks from the last free (or the last) slot towards the front past
every kept element it is better than (insertion). "Better" is the total order of the op
definition (`hidetc.graph.ops.topk`): strictly greater value for largest (smaller for
smallest), NaN above every number; an equal value never passes a kept one, which came
earlier, so ties keep the lower index first. Cost O(n) comparisons plus O(k) per
element that enters. The kernel reads back its own outputs, so it takes no grafted
epilogue (TopK is OTHER: a group of its own).
"""
from __future__ import annotations

import math
from typing import Callable

from hidetc.compute.task import Task
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import (
    FLOATS,
    Buffer,
    Const,
    Expr,
    cast,
    eq,
    logical_and,
    logical_or,
    minimum,
    ne,
)

At = Callable[[Expr], Expr]


def topk_geometry(task: Task) -> tuple[int, int, int, int]:
    """(outer, n, inner, k) of a TopK task."""
    shape = list(task.inputs[0].shape)
    axis = int(task.attr("axis", -1)) % len(shape)
    k = task.outputs[0].shape[axis]
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:]), k


def better(v: Expr, b: Expr, largest: bool) -> Expr:
    """Whether value v goes before value b (NaN above every number)."""
    cmp = v > b if largest else v < b
    if v.dtype not in FLOATS:
        return cmp
    if largest:
        return logical_or(cmp, logical_and(ne(v, v), eq(b, b)))
    return logical_or(cmp, logical_and(eq(v, v), ne(b, b)))


def emit_topk_line(kb: KernelBuilder, task: Task, n: int, k: int, x_at: At,
                   values: Buffer, indices: Buffer, slot_at: Callable[[Expr], tuple],
                   widen: At = lambda e: e) -> None:
    """Fill values/indices at `slot_at(r)` (r = 0..k-1) with the line's k best elements
    in order; `x_at(j)` is the line's j-th element, `widen` maps a loaded element to its
    comparison dtype (float16 -> float32 on CUDA)."""
    largest = bool(task.attr("largest", 1))
    dtype = widen(values[slot_at(Const(0, "int32"))]).dtype
    count = kb.declare("count", "int32", Const(0, "int32"))
    with kb.for_range(n, name="j") as j:
        v = kb.declare("v", dtype, widen(x_at(j)))
        last = widen(values[slot_at(Const(k - 1, "int32"))])
        with kb.if_then(logical_or(count < k, better(v, last, largest))):
            start = kb.declare("start", "int32", minimum(count, Const(k - 1, "int32")))
            slot = kb.declare("slot", "int32", start)
            with kb.for_range(start, name="r") as r:
                q = start - r
                above = slot_at(q - 1)
                with kb.if_then(logical_and(eq(q, slot), better(v, widen(values[above]), largest))):
                    kb.store(values, slot_at(q), values[above])
                    kb.store(indices, slot_at(q), indices[above])
                    kb.assign(slot, q - 1)
            kb.store(values, slot_at(slot), cast(v, values.dtype))
            kb.store(indices, slot_at(slot), cast(j, "int64"))
            kb.assign(count, minimum(count + 1, Const(k, "int32")))
