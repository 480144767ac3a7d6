"""Task mappings: which tasks of a task grid each worker performs, and in what order.

`spatial(16, 8)` gives each of 128 workers one task of a 16x8 grid (worker w does task
(w // 8, w % 8)); `repeat(4, 1)` gives one worker all 4x1 tasks in row-major order;
`outer * inner` composes them: the task grid is the elementwise product of the two,
worker w is outer worker `w // inner.num_workers` and inner worker
`w % inner.num_workers`, and each outer task `a` expands into the inner tasks `b` as
`a * inner.task_shape + b`. So `repeat(4, 1) * spatial(16, 8)` is 128 workers, each
doing 4 tasks of a 64x8 grid, rows `w // 8 + 16 * r`.

A mapping is an immutable value: `num_workers`, `task_shape`, `tasks_of(w)` (Python,
for tests and reasoning) and `emit(worker)` (symbolic: the loops and index expressions
that `lower_mappings` puts in place of `for ... in m.on(worker)`). `tasks_of` and
`emit` agree by construction and by test. A task shape may hold symbolic sizes
(`hidetc.graph.symbolic.SymDim`): `emit`'s loops and indices then compute with the
run-time sizes, and `tasks_of` needs the shape's numbers.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from hidetc.graph.symbolic import SymDim
from hidetc.tir.ir import Const, Expr, Var, as_expr


@dataclass(frozen=True, slots=True)
class Loop:
    """One loop `emit` asks for: the variable and its extent (a constant, or a symbolic
    size computed at run time)."""
    var: Var
    extent: int


class TaskMapping:
    """Base class; see the module docstring for the semantics."""
    __slots__ = ()
    task_shape: tuple[int, ...]
    num_workers: int

    def __mul__(self, inner: "TaskMapping") -> "TaskMapping":
        if len(self.task_shape) != len(inner.task_shape):
            raise ValueError(f"cannot compose mappings of rank {len(self.task_shape)} "
                             f"and {len(inner.task_shape)}")
        return Composed(self, inner)

    @property
    def rank(self) -> int:
        return len(self.task_shape)

    def tasks_of(self, worker: int) -> list[tuple[int, ...]]:
        raise NotImplementedError

    def emit(self, worker: Expr, prefix: str) -> tuple[list[Loop], list[Expr]]:
        """Loops (outermost first) and one index expression per task dimension."""
        raise NotImplementedError

    def on(self, worker):
        """Marker used by the kernel builder: `with kb.for_mapping(m.on(w)) as (i, j)`."""
        return _On(self, as_expr(worker))


@dataclass(frozen=True, slots=True)
class _On:
    mapping: TaskMapping
    worker: Expr


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for extent in reversed(shape):
        out.append(flat % extent)
        flat //= extent
    return tuple(reversed(out))


def _unravel_expr(flat: Expr, shape: tuple[int, ...]) -> list[Expr]:
    """Row-major unravel of `flat` (< prod(shape)) into `shape`; extent-1 dims are 0 and
    the outermost non-trivial dim needs no modulo."""
    out: list[Expr] = []
    first = next((d for d, e in enumerate(shape) if e != 1), len(shape))
    for d, extent in enumerate(shape):
        inner = math.prod(shape[d + 1:])
        if extent == 1:
            out.append(Const(0, flat.dtype))
            continue
        q = flat if inner == 1 else flat // inner
        out.append(q if d == first else q % extent)
    return out


@dataclass(frozen=True, slots=True)
class Spatial(TaskMapping):
    task_shape: tuple[int, ...]

    @property
    def num_workers(self) -> int:
        return math.prod(self.task_shape)

    def tasks_of(self, worker: int) -> list[tuple[int, ...]]:
        if not 0 <= worker < self.num_workers:
            return []
        return [_unravel(worker, self.task_shape)]

    def emit(self, worker: Expr, prefix: str) -> tuple[list[Loop], list[Expr]]:
        return [], _unravel_expr(worker, self.task_shape)


@dataclass(frozen=True, slots=True)
class Repeat(TaskMapping):
    task_shape: tuple[int, ...]

    @property
    def num_workers(self) -> int:
        return 1

    def tasks_of(self, worker: int) -> list[tuple[int, ...]]:
        if worker != 0:
            return []
        return list(itertools.product(*(range(e) for e in self.task_shape)))

    def emit(self, worker: Expr, prefix: str) -> tuple[list[Loop], list[Expr]]:
        loops, idx = [], []
        for d, extent in enumerate(self.task_shape):
            if extent == 1:
                idx.append(Const(0, worker.dtype))
            else:
                var = Var(f"{prefix}{d}", worker.dtype)
                loops.append(Loop(var, extent))
                idx.append(var)
        return loops, idx


@dataclass(frozen=True, slots=True)
class Composed(TaskMapping):
    outer: TaskMapping
    inner: TaskMapping

    @property
    def task_shape(self) -> tuple[int, ...]:
        return tuple(a * b for a, b in zip(self.outer.task_shape, self.inner.task_shape))

    @property
    def num_workers(self) -> int:
        return self.outer.num_workers * self.inner.num_workers

    def tasks_of(self, worker: int) -> list[tuple[int, ...]]:
        if not 0 <= worker < self.num_workers:
            return []
        n_in = self.inner.num_workers
        outer_tasks = self.outer.tasks_of(worker // n_in)
        inner_tasks = self.inner.tasks_of(worker % n_in)
        shape = self.inner.task_shape
        return [tuple(a * s + b for a, s, b in zip(ta, shape, tb))
                for ta in outer_tasks for tb in inner_tasks]

    def emit(self, worker: Expr, prefix: str) -> tuple[list[Loop], list[Expr]]:
        n_in = self.inner.num_workers
        w_out = Const(0, worker.dtype) if self.outer.num_workers == 1 else (
            worker if n_in == 1 else worker // n_in)
        w_in = Const(0, worker.dtype) if n_in == 1 else (
            worker if self.outer.num_workers == 1 else worker % n_in)
        loops_o, idx_o = self.outer.emit(w_out, prefix + "o")
        loops_i, idx_i = self.inner.emit(w_in, prefix + "i")
        idx = [_combine(o, s, i) for o, s, i in zip(idx_o, self.inner.task_shape, idx_i)]
        return loops_o + loops_i, idx


def _is_zero(e: Expr) -> bool:
    return isinstance(e, Const) and e.value == 0


def _combine(outer: Expr, inner_extent: int, inner: Expr) -> Expr:
    if _is_zero(outer):
        return inner
    scaled = outer if inner_extent == 1 else outer * inner_extent
    return scaled if _is_zero(inner) else scaled + inner


def spatial(*shape: int) -> Spatial:
    _check_shape(shape)
    return Spatial(tuple(shape))


def repeat(*shape: int) -> Repeat:
    _check_shape(shape)
    return Repeat(tuple(shape))


def _check_shape(shape: tuple[int, ...]) -> None:
    if not shape or any(not isinstance(e, SymDim) and (not isinstance(e, int) or e < 1)
                        for e in shape):   # (a symbolic extent may be 0 at some size)
        raise ValueError(f"a task shape needs positive ints or symbolic sizes, got {shape}")
