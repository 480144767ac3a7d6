"""CUDA rules for ScatterND and ScatterElements: one block copies, then scatters.

Schedule: a single block of 256 threads. The threads copy `out = data` (block-strided),
`__syncthreads()`, then each thread takes the scatter owners t, t + 256, ... and
applies each owner's updates serially in the order of the indices tensor (the owners
and their updates are the CPU rule's, `hidetc.schedules.common.scatter_plan.ScatterPlan`: no
two owners touch one output element, so the result is the reference's sequential one,
duplicates included, without atomics). One block keeps the copy -> scatter order with a
block barrier; it is a correct, simple schedule (these ops are rare and small in
models), not a fast one for large tensors. float16 values are combined in float32 and
rounded once per update.
"""
from __future__ import annotations

from hidetc.compute.task import Task
from hidetc.schedules.common.scatter_plan import declare_buffers, scatter_plan
from hidetc.schedules.cuda.common import ceil_div
from hidetc.schedules.cuda.injective import widen
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Function, syncthreads, thread_idx

THREADS = 256


def build_scatter(task: Task, name: str) -> Function:
    kb = KernelBuilder(name, "cuda")
    bufs = declare_buffers(kb, task)
    size = bufs["data"].shape[0]
    out = bufs["out"]
    tid = thread_idx()
    if size:
        with kb.for_range(ceil_div(size, THREADS), name="it") as it:
            e = it * THREADS + tid
            with kb.if_then(e < size):
                kb.store(out, (e,), bufs["data"][e])
    kb.emit(syncthreads())
    plan = scatter_plan(task)
    if plan.owners and plan.steps:
        with kb.for_range(ceil_div(plan.owners, THREADS), name="round") as r:
            owner = r * THREADS + tid
            with kb.if_then(owner < plan.owners):
                plan.emit_owner(kb, bufs, owner, widen)
    return kb.finish(grid=(1, 1, 1), block=(THREADS, 1, 1))
