"""Facts read off a kernel's IR, for the manifest and `hidetc inspect --json`.

- `parallel_tasks(fn)`: the tasks a cpu kernel's main OpenMP loop shares out: the
  extent of its biggest parallel loop (by IR size: the compute loop, not a packing loop
  before it), 1 when it has none, None when that extent is not a constant.
- `launch_blocks(fn)`: a cuda kernel's block count (the product of its grid).
- `at_sizes(fn, sizes)`: a kernel whose launch attrs hold symbolic sizes (a grid over a
  range) with those at `sizes`: what the facts and the cost model read.

Assumes: a Function from the builder or the lowering passes (`For.kind` "parallel" marks
the parallel loop; cuda kernels carry `grid` and `block` attrs).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Mapping, Optional

from hidetc.graph.symbolic import SymDim
from hidetc.tir.functor import Rewriter
from hidetc.tir.ir import Const, For, Function


class _Size(Rewriter):
    """Counts the statements and expressions under a node."""
    def __init__(self):
        self.count = 0

    def expr(self, e):
        self.count += 1
        return super().expr(e)

    def stmt(self, s):
        self.count += 1
        return super().stmt(s)


class _ParallelLoops(Rewriter):
    def __init__(self):
        self.loops: list[For] = []

    def visit_For(self, s: For):
        if s.kind == "parallel":
            self.loops.append(s)
            return s
        return super().visit_For(s)


def _size(node) -> int:
    counter = _Size()
    counter.stmt(node)
    return counter.count


def parallel_tasks(fn: Function) -> Optional[int]:
    finder = _ParallelLoops()
    finder.stmt(fn.body)
    if not finder.loops:
        return 1
    loop = max(finder.loops, key=lambda s: _size(s.body))
    return int(loop.extent.value) if isinstance(loop.extent, Const) else None


def launch_blocks(fn: Function) -> Optional[int]:
    grid = fn.attr("grid")
    return int(math.prod(grid)) if grid else None


def at_sizes(fn: Function, sizes: Optional[Mapping[str, int]]) -> Function:
    """`fn` with the symbolic sizes in its attrs (grid, the gemm facts) at `sizes`
    (unchanged without sizes); the body keeps its size parameters."""
    if not sizes:
        return fn

    def at(value: Any) -> Any:
        if isinstance(value, SymDim):
            return value.evaluate(sizes)
        if isinstance(value, tuple):
            return tuple(at(v) for v in value)
        return value
    return replace(fn, attrs=tuple((k, at(v)) for k, v in fn.attrs))
