"""The owners of a scatter, for both targets: ScatterND and ScatterElements split into
OWNERS of disjoint sets of output elements, each applying its updates serially in the
order of the indices tensor (`ScatterPlan`, `scatter_plan`), and the kernel's buffers
(`declare_buffers`). The CPU rules (`hidetc.schedules.cpu.scatter`: owners in
parallel, OpenMP) and the CUDA rules (`hidetc.schedules.cuda.scatter`: owners over one
block's threads) only map the owners onto workers.

- ScatterND: index row r writes the slice `out[indices[r]] (slice of prod(data.shape[q:])
  elements)`; two rows can only write the same element at the same position j inside
  their slices, so owner j (one per slice position) loops over the rows in order;
- ScatterElements: update u (a position of indices) writes `out` at u with its `axis`
  coordinate replaced by indices[u]; two updates can only collide when all their other
  coordinates agree, so owner = those coordinates (a line of indices along `axis`),
  looping along the axis in order.
Duplicated indices therefore resolve exactly as the reference's sequential order does:
the last write wins for reduction "none"; "add"/"mul"/"max"/"min" combine in the
indices' order (so float sums round in the reference's order). No two owners touch
one element: no race, no atomics.

Indices may be negative (counted from the end); an index outside [-dim, dim) is skipped
(ONNX leaves it undefined, the reference raises), so a kernel never writes out of
bounds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from hidetc.compute.indexing import linearize, unravel
from hidetc.compute.task import Task
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Buffer, Const, Expr, cast, logical_and, maximum, minimum, select

COMBINE: dict[str, Callable[[Expr, Expr], Expr]] = {
    "none": lambda old, new: new,
    "add": lambda old, new: old + new,
    "mul": lambda old, new: old * new,
    "max": maximum,
    "min": minimum,
}
Widen = Callable[[Expr], Expr]


@dataclass(frozen=True)
class ScatterPlan:
    """The owners of a scatter and what each one does (`emit_owner`)."""
    task: Task
    owners: int   # independent serial update loops
    steps: int    # updates per owner, applied in order

    def emit_owner(self, kb: KernelBuilder, bufs: dict[str, Buffer], owner: Expr,
                   widen: Widen = lambda e: e) -> None:
        combine = COMBINE[self.task.attr("reduction", "none")]
        out = bufs["out"]
        with kb.for_range(self.steps, name="s") as step:
            target, update, valid = self._update(bufs, owner, step)
            new = combine(widen(out[target]), widen(update))
            with kb.if_then(valid):
                kb.store(out, (target,), cast(new, out.dtype))

    def _update(self, bufs, owner: Expr, step: Expr):
        """(flat target offset into out, update value, whether the index is in range)."""
        data = self.task.inputs[0].shape
        if self.task.op == "ScatterND":
            q = self.task.inputs[1].shape[-1]
            coords = [_normalize(bufs["indices"][step, Const(c, "int32")], data[c])
                      for c in range(q)]
            valid = logical_and(*[logical_and(c >= 0, c < data[i]) for i, c in enumerate(coords)])
            row = linearize([select(valid, c, Const(0, "int32")) for c in coords], data[:q])
            return row * math.prod(data[q:]) + owner, bufs["updates"][step, owner], valid
        shape = self.task.inputs[1].shape
        axis = self.task.attr("axis", 0) % len(data)
        others = [d for i, d in enumerate(shape) if i != axis]
        pos = unravel(owner, others)
        pos.insert(axis, step)
        where = _normalize(bufs["indices"][tuple(pos)], data[axis])
        valid = logical_and(where >= 0, where < data[axis])
        target = list(pos)
        target[axis] = select(valid, where, Const(0, "int32"))
        return linearize(target, data), bufs["updates"][tuple(pos)], valid


def _normalize(index: Expr, extent: int) -> Expr:
    index = cast(index, "int32")
    return select(index < 0, index + extent, index)


def scatter_plan(task: Task) -> ScatterPlan:
    data, indices = task.inputs[0].shape, task.inputs[1].shape
    if task.op == "ScatterND":
        return ScatterPlan(task, math.prod(data[indices[-1]:]), math.prod(indices[:-1]))
    axis = task.attr("axis", 0) % len(data)
    lines = math.prod(d for i, d in enumerate(indices) if i != axis)
    return ScatterPlan(task, lines, indices[axis])


def declare_buffers(kb: KernelBuilder, task: Task) -> dict[str, Buffer]:
    """data and out (flat), indices, updates: ScatterND's as (rows, q) and (rows, slice)
    views, ScatterElements' in their own shapes."""
    data_t, idx_t, upd_t = task.inputs[:3]
    size = math.prod(data_t.shape)
    bufs = {"data": kb.buffer("data", data_t.dtype, (size,))}
    flat_out = (size,)
    if task.op == "ScatterND":
        q = idx_t.shape[-1]
        rows, piece = math.prod(idx_t.shape[:-1]), math.prod(data_t.shape[q:])
        bufs["indices"] = kb.buffer("indices", idx_t.dtype, (rows, q))
        bufs["updates"] = kb.buffer("updates", upd_t.dtype, (rows, piece))
    else:
        bufs["indices"] = kb.buffer("indices", idx_t.dtype, idx_t.shape)
        bufs["updates"] = kb.buffer("updates", upd_t.dtype, upd_t.shape)
    bufs["out"] = kb.buffer("out", data_t.dtype, flat_out)
    return bufs
