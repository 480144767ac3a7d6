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
from hidetc.graph.symbolic import SymDim, evaluate, symbols_of
from hidetc.tir.ir import Const, Expr, cast, select, size_dim

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


def reshape_groups(src: Sequence, dst: Sequence) -> list[tuple[range, range]]:
    """The dims of two row-major shapes of one size matched in groups of equal product:
    (src dims, dst dims) per group, in order, covering both shapes. A group closes only
    where the two products are equal as expressions (`SymDim` equality is structural), so
    the grouping holds at every size; where none closes before the end, the rest is one
    group. Size-1 dims left over at an end join the last group."""
    groups: list[tuple[range, range]] = []
    i = j = 0
    while i < len(src) and j < len(dst):
        si, dj, ps, pd = i + 1, j + 1, src[i], dst[j]
        while not ps == pd:
            grow_src = si < len(src) and (dj == len(dst) or _below(ps, pd))
            if grow_src:
                ps, si = ps * src[si], si + 1
            elif dj < len(dst):
                pd, dj = pd * dst[dj], dj + 1
            else:
                si, dj = len(src), len(dst)
                break
        groups.append((range(i, si), range(j, dj)))
        i, j = si, dj
    if i < len(src) or j < len(dst):
        if not groups:
            return [(range(len(src)), range(len(dst)))]
        (s0, d0) = groups.pop()
        groups.append((range(s0.start, len(src)), range(d0.start, len(dst))))
    return groups


def _as_dim(d):
    return size_dim(d) if isinstance(d, Expr) else d


def _below(a, b) -> bool:
    """Whether product `a` is the smaller: exact for ints, else compared at one large
    size per symbol (it only steers which side grows; equality decides the groups). A
    kernel's extent that is no expression of sizes counts as larger than any int."""
    if isinstance(a, int) and isinstance(b, int):
        return a < b
    if isinstance(a, (int, SymDim)) and isinstance(b, (int, SymDim)):
        sizes = {name: 1009 for name in symbols_of(a) | symbols_of(b)}
        return evaluate(a, sizes) < evaluate(b, sizes)
    return isinstance(a, int)


def regroup(idx: Sequence[Expr], src: Sequence, dst: Sequence) -> list[Expr]:
    """The index into row-major `dst` of element `idx` of row-major `src` (one size; a
    Reshape's index map), group by group (`reshape_groups`): a dim passing through
    unchanged costs nothing and a merge or split costs div/mod only inside its group, so
    `[1, seq, 12, 64] -> [1, seq, 768]` divides by 64 only, never by a run-time size."""
    if tuple(src) == tuple(dst):
        return list(idx)
    src = [_as_dim(d) for d in src]
    dst = [_as_dim(d) for d in dst]
    out: list[Expr] = []
    for gs, gd in reshape_groups(src, dst):
        sub = [src[d] for d in gs]
        flat = linearize([idx[d] for d in gs], sub)
        out.extend(unravel(flat, [dst[d] for d in gd]))
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
