"""Index helpers shared by the compute definitions (and by schedules that view tensors
differently from their logical shape).

`Load` is the signature of the loader a definition receives: `load(i, index)` reads
input `i` of the task at `index` (one Expr per input dimension); `Compute` is a
definition's signature. Guarantees: `linearize` and `unravel` are inverse row-major
maps for in-range indices; `broadcast_index` is numpy's broadcasting rule;
`normalize` maps an index read from a tensor in [-extent, extent) to [0, extent).
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

from hidetc.compute.task import Task
from hidetc.tir.ir import Const, Expr, cast, select

Load = Callable[[int, Sequence[Expr]], Expr]
Compute = Callable[[Task, list[Expr], Load], Expr]
ZERO = Const(0, "int32")


def broadcast_index(idx: Sequence[Expr], shape: Sequence[int]) -> list[Expr]:
    """numpy broadcasting: the index into an input of `shape` for output index `idx`."""
    tail = list(idx[len(idx) - len(shape):]) if shape else []
    return [ZERO if extent == 1 else i for i, extent in zip(tail, shape)]


def linearize(idx: Sequence[Expr], shape: Sequence[int]) -> Expr:
    flat: Expr = ZERO
    for i, extent in zip(idx, shape):
        flat = i if is_zero(flat) else flat * extent + i
    return flat


def unravel(flat: Expr, shape: Sequence[int]) -> list[Expr]:
    out = []
    for d, extent in enumerate(shape):
        inner = math.prod(shape[d + 1:])
        q = flat if inner == 1 else flat // inner
        out.append(ZERO if extent == 1 else (q if d == 0 else q % extent))
    return out


def is_zero(e: Expr) -> bool:
    return isinstance(e, Const) and e.value == 0


def load_broadcast(task: Task, i: int, idx: list[Expr], load: Load) -> Expr:
    """Input `i` at output index `idx` under numpy broadcasting."""
    return load(i, broadcast_index(idx, task.inputs[i].shape))


def normalize(index: Expr, extent: int) -> Expr:
    """An index read from a tensor (possibly negative, counted from the end), as int32."""
    index = cast(index, "int32")
    return select(index < 0, index + extent, index)


def load_scalar(task: Task, i: int, load: Load) -> Expr:
    """The one element of input `i`, a scalar given as a 0-d or a one-element tensor."""
    return load(i, [ZERO] * len(task.inputs[i].shape))


def present(task: Task, i: int) -> bool:
    return i < len(task.inputs) and task.inputs[i] is not None
