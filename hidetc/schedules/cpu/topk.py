"""CPU rule for TopK: the k best elements of every line along the axis, in order.

Schedule: X is viewed as [outer, n, inner] and the outputs as [outer, k, inner]; the
outer*inner independent lines run in parallel (OpenMP), each line one serial pass over
its n elements. The line body (`emit_topk_line`, with the algorithm and the order) is
target-neutral, in `hidetc.schedules.common.topk_line`, shared with the CUDA rule
(`hidetc.schedules.cuda.topk`: one thread per line). The kernel reads back its own
outputs, so it takes no grafted epilogue (TopK is OTHER: a group of its own).
"""
from __future__ import annotations

from hidetc.compute.task import Task
from hidetc.schedules.common.topk_line import emit_topk_line, topk_geometry
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Function


def build_topk(task: Task, name: str) -> Function:
    outer, n, inner, k = topk_geometry(task)
    x_type = task.inputs[0]
    kb = KernelBuilder(name, "cpu")
    x = kb.buffer("x", x_type.dtype, (outer, n, inner))
    values = kb.buffer("values", task.outputs[0].dtype, (outer, k, inner))
    indices = kb.buffer("indices", "int64", (outer, k, inner))
    with kb.for_range(outer * inner, kind="parallel", name="line") as line:
        o, i = line // inner, line % inner
        emit_topk_line(kb, task, n, k, lambda j: x[o, j, i], values, indices,
                       lambda r: (o, r, i))
    return kb.finish()
