"""CUDA reductions, the rules-facing API: Reduce* over any axes (the ops of
`hidetc.schedules.cpu.reduce.REDUCERS`), Softmax/LogSoftmax along one axis,
LayerNormalization over the trailing axes, GlobalAveragePool/GlobalMaxPool.

One schedule template serves them all (`TEMPLATE`, in `reduce_template`: threads per
row, rows per block, vector width and a register row cache; see its docstring for the
schedule, the numerics and the space). The builders here are the `RULES` entries: each
builds the template's default config for the task.

Assumes: the task's op is one of `reduce_template.OPS`. Guarantees: the kernel of the
default config (correct on every shape, as every config of the template is).
"""
from __future__ import annotations

from hidetc.schedules.cuda.reduce_template import OPS, TEMPLATE, ReduceConfig
from hidetc.schedules.task import Task
from hidetc.schedules.template import Target
from hidetc.tir.ir import Function

__all__ = ["OPS", "TEMPLATE", "ReduceConfig", "build_global_pool", "build_layernorm",
           "build_reduce", "build_softmax"]

CUDA = Target(kind="cuda")


def _build_default(task: Task, name: str) -> Function:
    return TEMPLATE.build(task, TEMPLATE.default(task, CUDA), name)


build_reduce = _build_default
build_softmax = _build_default
build_layernorm = _build_default
build_global_pool = _build_default
