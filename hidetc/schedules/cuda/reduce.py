"""CUDA reductions, the rules-facing API: Reduce* over any axes (the ops of
`hidetc.schedules.common.reducers.REDUCERS`), Softmax/LogSoftmax along one axis,
LayerNormalization over the trailing axes, GlobalAveragePool/GlobalMaxPool.

One schedule template serves them all (`TEMPLATE`, in `reduce_template`: threads per
row, rows per block, vector width and a register row cache; see its docstring for the
schedule, the numerics and the space); `schedules.cuda.build_kernel` builds its default
config for the target, so there are no rule builders here.

Assumes: the task's op is one of `reduce_template.OPS`.
"""
from __future__ import annotations

from hidetc.schedules.cuda.reduce_template import OPS, TEMPLATE, ReduceConfig

__all__ = ["OPS", "TEMPLATE", "ReduceConfig"]
