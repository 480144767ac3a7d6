"""The CUDA rule for injective and elementwise ops: one thread per output element.

Schedule: 256-thread blocks, the global thread index `w = blockIdx.x * 256 +
threadIdx.x` is the worker of `spatial(*out_shape)`, whose lowering guards
`w < size`: the tail is predicated, so any shape works.
"""
from __future__ import annotations

from hidetc.compute.injective import COMPUTE
from hidetc.schedules.cuda.common import ceil_div
from hidetc.schedules.task import Task
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Function, Load, as_expr, block_idx, thread_idx
from hidetc.tir.mapping import spatial

THREADS = 256


def build(task: Task, name: str) -> Function:
    kb = KernelBuilder(name, "cuda")
    buffers = {i: kb.buffer(f"in{i}", task.inputs[i].dtype, task.inputs[i].shape)
               for i in task.buffer_inputs}
    out_type = task.outputs[0]
    out = kb.buffer("out", out_type.dtype, out_type.shape)
    compute = COMPUTE[task.op]

    def load(i: int, idx) -> Load:
        return buffers[i][tuple(as_expr(x) for x in idx)]

    shape = out_type.shape or (1,)
    worker = block_idx() * THREADS + thread_idx()
    with kb.for_mapping(spatial(*shape), worker) as idx:
        idx = list(idx) if out_type.shape else []
        kb.store(out, tuple(idx), compute(task, idx, load))
    blocks = max(ceil_div(out_type.size, THREADS), 1)
    return kb.finish(grid=(blocks, 1, 1), block=(THREADS, 1, 1))
