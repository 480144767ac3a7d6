"""Row views for the CUDA reduction template (`reduce_template`): how each op family
sees its input as independent rows of n elements, and what a row computes in.

`row_view(shape, axes)`: the input's dims of extent 1 are dropped and neighbouring dims
that are both reduced or both kept are merged; a row is one combination of the kept
dims, its n elements the reduced ones. `view_of(task)` picks the axes: Reduce* their
`axes` (all, or none with noop_with_empty_axes), Softmax/LogSoftmax the axis,
LayerNormalization the dims from `axis` on, global pools the spatial dims. A row is
contiguous when only the last merged dim is reduced (LayerNorm, pools, last-axis Softmax,
trailing-axes Reduce*): the input is then a (rows, n) matrix. Otherwise (any other axes
subset, a middle-axis Softmax) the elements are strided and `index(row, k)` unravels row
and k over the merged shape.

Assumes: static shapes (dims of extent 0 allowed: rows or n is then 0). Guarantees:
rows * n == the input's size; `index` enumerates every element exactly once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from hidetc.compute.injective import unravel
from hidetc.compute.task import Task
from hidetc.errors import UnsupportedOpError
from hidetc.schedules.common.reducers import REDUCERS, reduced_axes
from hidetc.tir.ir import Expr

GLOBAL_POOLS = {"GlobalAveragePool": "ReduceMean", "GlobalMaxPool": "ReduceMax"}
F32 = "float32"


@dataclass(frozen=True)
class RowView:
    """The input as merged dims, each reduced or kept (see the module docstring)."""
    dims: tuple[int, ...]
    reduced: tuple[bool, ...]

    @property
    def kept_dims(self) -> tuple[int, ...]:
        return tuple(e for e, r in zip(self.dims, self.reduced) if not r)

    @property
    def reduced_dims(self) -> tuple[int, ...]:
        return tuple(e for e, r in zip(self.dims, self.reduced) if r)

    @property
    def rows(self) -> int:
        return math.prod(self.kept_dims)

    @property
    def n(self) -> int:
        return math.prod(self.reduced_dims)

    @property
    def contiguous(self) -> bool:
        return not any(self.reduced[:-1])

    def buffer_shape(self) -> tuple[int, ...]:
        return (self.rows, self.n) if self.contiguous else self.dims

    def index(self, row: Expr, k: Expr) -> tuple[Expr, ...]:
        """The buffer index of element k of row `row`."""
        if self.contiguous:
            return (row, k)
        kept, red = iter(unravel(row, self.kept_dims)), iter(unravel(k, self.reduced_dims))
        return tuple(next(red) if r else next(kept) for r in self.reduced)


def row_view(shape: Sequence[int], axes: Sequence[int]) -> RowView:
    dims: list[int] = []
    flags: list[bool] = []
    for d, extent in enumerate(shape):
        if extent == 1:
            continue
        red = d in axes
        if flags and flags[-1] == red:
            dims[-1] *= extent
        else:
            dims.append(extent)
            flags.append(red)
    return RowView(tuple(dims), tuple(flags))


def view_of(task: Task) -> RowView:
    shape = task.inputs[0].shape
    rank = len(shape)
    if task.op in REDUCERS:
        return row_view(shape, reduced_axes(task))
    if task.op in GLOBAL_POOLS:
        return row_view(shape, range(2, rank))
    if task.op in ("Softmax", "LogSoftmax"):
        return row_view(shape or (1,), [task.attr("axis", -1) % max(rank, 1)])
    if task.op == "LayerNormalization":
        return row_view(shape, range(task.attr("axis", -1) % rank, rank))
    raise UnsupportedOpError(f"{task.op}: not a row reduction")


def compute_dtype(dtype: str) -> str:
    """What a row accumulates and computes in (see Numerics in the module docstring)."""
    if dtype in ("float16", "bfloat16"):
        return F32
    if dtype in ("bool", "int8", "int16", "uint8", "uint16"):
        return "int32"
    return dtype


def effective_vector(vector: int, view: RowView) -> int:
    """The widest vector width up to `vector` that divides every row (contiguous rows
    only); a symbolic row length counts as divisible only where its expression is (`2*seq`
    by 2), never by a guard on the sizes."""
    if not view.contiguous:
        return 1
    while vector > 1 and (view.n % vector) != 0:
        vector //= 2
    return vector
