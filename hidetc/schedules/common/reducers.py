"""The reduction tables, for both targets: the Reduce* ops' identity, combine and
finalize (`REDUCERS`), their accumulation dtypes (`HALF_ACC`), the identity as a
constant of a dtype (`identity_const`) and the axes a Reduce* task reduces
(`reduced_axes`). The CPU rules (`hidetc.schedules.cpu.reduce`) and the CUDA reduction
template (`hidetc.schedules.cuda.reduce_template`, `reduce_rows`) build on them.
"""
from __future__ import annotations

import numpy as np

from hidetc.compute.task import Task
from hidetc.tir.ir import FLOATS, Const, as_expr, call, maximum, minimum

INF = float("inf")
# float16/bfloat16 sums accumulate in float32 and round once, as numpy's do
HALF_ACC = {"float16": "float32", "bfloat16": "float32"}
# op -> (initial value, combine, finalize(acc, count))
REDUCERS = {
    "ReduceSum": (0.0, lambda a, x: a + x, lambda a, n: a),
    "ReduceMean": (0.0, lambda a, x: a + x, lambda a, n: a / as_expr(float(n), a)),
    "ReduceMax": (-INF, maximum, lambda a, n: a),
    "ReduceMin": (INF, minimum, lambda a, n: a),
    "ReduceProd": (1.0, lambda a, x: a * x, lambda a, n: a),
    "ReduceSumSquare": (0.0, lambda a, x: a + x * x, lambda a, n: a),
    "ReduceL1": (0.0, lambda a, x: a + call("abs", x), lambda a, n: a),
    "ReduceL2": (0.0, lambda a, x: a + x * x, lambda a, n: call("sqrt", a)),
    "ReduceLogSumExp": (0.0, lambda a, x: a + call("exp", x), lambda a, n: call("log", a)),
    "ReduceLogSum": (0.0, lambda a, x: a + x, lambda a, n: call("log", a)),
}


def identity_const(value: float, dtype: str) -> Const:
    """A reduction's identity in `dtype`: +-inf become the integer limits for ints."""
    if dtype in FLOATS:
        return Const(float(value), dtype)
    if dtype == "bool":
        return Const(value > 0, dtype)   # max from False, min from True, sum 0, prod 1
    info = np.iinfo(dtype)
    return Const(int(min(max(value, info.min), info.max)), dtype)


def reduced_axes(task: Task) -> list[int]:
    """The sorted axes a Reduce* task reduces: its `axes` input (negative ones counted
    from the end); all of them when that is absent or empty, none with
    noop_with_empty_axes."""
    rank = len(task.inputs[0].shape)
    axes = task.param(1)
    if axes is None or len(axes) == 0:
        if task.attr("noop_with_empty_axes", 0):
            return []
        return list(range(rank))
    return sorted(a % rank for a in axes)
