"""The CPU rule for injective and elementwise ops: rows of the output in parallel
(OpenMP), the last dimension as the inner loop so gcc can vectorize it.

Schedule: `for r in parallel(rows): for lead in spatial(*shape[:-1]).on(r): for j in
repeat(shape[-1]).on(0): out[lead, j] = compute(lead, j)`, with the value given by the
op's definition in `hidetc.compute.injective`.
"""
from __future__ import annotations

import math

from hidetc.compute.injective import COMPUTE
from hidetc.schedules.task import Task
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Function, Load, as_expr
from hidetc.tir.mapping import repeat, spatial


def build(task: Task, name: str) -> Function:
    kb = KernelBuilder(name, "cpu")
    buffers = {i: kb.buffer(f"in{i}", task.inputs[i].dtype, task.inputs[i].shape)
               for i in task.buffer_inputs}
    out_type = task.outputs[0]
    out = kb.buffer("out", out_type.dtype, out_type.shape)
    compute = COMPUTE[task.op]

    def load(i: int, idx) -> Load:
        return buffers[i][tuple(as_expr(x) for x in idx)]

    shape = out_type.shape
    if not shape:
        kb.store(out, (), compute(task, [], load))
        return kb.finish()
    lead, last = shape[:-1] or (1,), shape[-1]
    with kb.for_range(math.prod(lead), kind="parallel", name="r") as r:
        with kb.for_mapping(spatial(*lead), r, names=[f"i{d}" for d in range(len(lead))]) as li:
            with kb.for_mapping(repeat(last), 0, names=["j"]) as (j,):
                idx = list(li[:len(shape) - 1]) + [j]
                kb.store(out, tuple(idx), compute(task, idx, load))
    return kb.finish()
