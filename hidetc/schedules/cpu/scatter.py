"""CPU rules for ScatterND and ScatterElements: copy the data, then scatter the updates.

Schedule: the copy `out = data` runs in parallel (rows, OpenMP); then the scatter runs
in parallel over the OWNERS of disjoint sets of output elements, each owner applying its
updates serially in the order of the indices tensor. The owners, their updates and the
handling of duplicated and out-of-range indices are target-neutral, in
`hidetc.schedules.common.scatter_plan` (`ScatterPlan`), shared with the CUDA rules.
The kernel reads its output back (reductions), so it is never fused.
"""
from __future__ import annotations

from hidetc.compute.task import Task
from hidetc.schedules.common.scatter_plan import declare_buffers, scatter_plan
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Function


def build_scatter(task: Task, name: str) -> Function:
    kb = KernelBuilder(name, "cpu")
    bufs = declare_buffers(kb, task)
    size = bufs["data"].shape[0]
    out = bufs["out"]
    if size:
        with kb.for_range(size, kind="parallel", name="e") as e:
            kb.store(out, (e,), bufs["data"][e])
    plan = scatter_plan(task)
    if plan.owners and plan.steps:
        with kb.for_range(plan.owners, kind="parallel", name="owner") as owner:
            plan.emit_owner(kb, bufs, owner)
    return kb.finish()
