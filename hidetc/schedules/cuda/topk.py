"""CUDA rule for TopK: one thread per line (256-thread blocks over the global thread
index, the tail guarded), each line the CPU rule's serial insertion pass
(`hidetc.schedules.common.topk_line.emit_topk_line`), so both targets keep the same order
(value, then lower index; NaN above every number). float16 elements are compared after
conversion to float32 (exact) and stored back unchanged.
"""
from __future__ import annotations

from hidetc.compute.task import Task
from hidetc.schedules.common.topk_line import emit_topk_line, topk_geometry
from hidetc.schedules.cuda.common import ceil_div
from hidetc.schedules.cuda.injective import widen
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Function, block_idx, thread_idx

THREADS = 256


def build_topk(task: Task, name: str) -> Function:
    outer, n, inner, k = topk_geometry(task)
    kb = KernelBuilder(name, "cuda")
    x = kb.buffer("x", task.inputs[0].dtype, (outer, n, inner))
    values = kb.buffer("values", task.outputs[0].dtype, (outer, k, inner))
    indices = kb.buffer("indices", "int64", (outer, k, inner))
    line = block_idx() * THREADS + thread_idx()
    with kb.if_then(line < outer * inner):
        o, i = line // inner, line % inner
        emit_topk_line(kb, task, n, k, lambda j: x[o, j, i], values, indices,
                       lambda r: (o, r, i), widen)
    blocks = max(ceil_div(outer * inner, THREADS), 1)
    return kb.finish(grid=(blocks, 1, 1), block=(THREADS, 1, 1))
