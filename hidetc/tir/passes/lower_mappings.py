"""Pass: replace every `MapFor` by the loops and index arithmetic of its task mapping.

`for i, j in m.on(w): body` becomes the `For` loops of `m.emit(w, prefix)` (outermost
first) around `body` with `i` and `j` replaced by the emitted index expressions. Loop
variables get fresh names, unique in the function, made of the first MapFor variable
and the mapping's own loop name (e.g. `t0_ro0`, then `t0_ro0_1`).

Decision: the MapFor variables are *substituted*, never bound with a Declare. The index
expressions are a few integer operations on the worker and the loop variables; keeping
them inline lets `simplify` prove bounds through them (dropping `% extent` when a loop
range makes it redundant) and lets `flatten_buffers` see affine indices; gcc's CSE
removes the repetition. A worker expression is substituted as is, so it must be pure:
one holding an impure call (`simplify.effects`, e.g. a shuffle) is a ValueError.

Decision: in a cuda function, a loop (every loop comes from a `repeat` dimension) with
extent <= UNROLL_MAX_EXTENT (16) gets kind "unroll", so nvcc unrolls it fully and a
register fragment indexed by its variable (`acc[u, v]` in `repeat(4, 4)`) gets constant
indices: nvcc keeps such arrays in registers, and spills them to local memory when an
index stays dynamic. 16 bounds the code size of one loop (nested repeats multiply:
`repeat(8, 8)` is 64 copies of the body, the usual thread tile); longer repeats stay
"serial" (nvcc may still unroll them partially). Other targets keep "serial" loops
(gcc decides for itself).

Decision: the loops are guarded by `if worker < num_workers`, because `tasks_of` gives a
worker outside the mapping no task while `emit` alone would compute out-of-grid
indices for it. `simplify` removes the guard whenever the worker's range proves it
(the usual case: the worker is a loop variable over exactly num_workers, or a constant).
A negative worker is undefined.

Assumes: a verified Function (unique names). Guarantees: no MapFor remains; the result
verifies with lowered=True; a function without MapFor is returned unchanged (same object).
"""
from __future__ import annotations

import math

from hidetc.graph.symbolic import SymDim, upper_bound
from hidetc.target import simt
from hidetc.tir.functor import Rewriter, all_names, substitute
from hidetc.tir.ir import Const, For, Function, If, MapFor, Stmt, Var, as_expr, cast
from hidetc.tir.passes.simplify import effects

UNROLL_MAX_EXTENT = 16


class _NameSupply:
    def __init__(self, taken: set[str]):
        self.taken = set(taken)

    def fresh(self, hint: str) -> str:
        name, k = hint, 0
        while name in self.taken:
            k += 1
            name = f"{hint}_{k}"
        self.taken.add(name)
        return name


class _LowerMappings(Rewriter):
    def __init__(self, names: _NameSupply, unroll: bool):
        self.names = names
        self.unroll = unroll

    def visit_MapFor(self, s: MapFor) -> Stmt:
        if effects(s.worker):
            raise ValueError("the worker of a task mapping must be pure; bind the impure "
                             "call to a variable first")
        body = self.stmt(s.body)
        hint = s.vars[0].name if s.vars else "m"
        worker = s.worker
        if upper_bound(math.prod(s.mapping.task_shape)) >= 2 ** 31 and \
                worker.dtype != "int64":
            worker = cast(worker, "int64")      # task indices past int32: index in int64
        loops, indices = s.mapping.emit(worker, "r")
        renames = {lp.var: Var(self.names.fresh(f"{hint}_{lp.var.name}"), lp.var.dtype)
                   for lp in loops}
        indices = [substitute(ix, renames) for ix in indices]
        if len(indices) != len(s.vars):
            raise ValueError(f"mapping of rank {len(indices)} bound to {len(s.vars)} vars")
        out = substitute(body, dict(zip(s.vars, indices)))
        for lp in reversed(loops):
            var = renames[lp.var]
            if isinstance(lp.extent, SymDim):    # a run-time extent: never unrolled
                out = For(var, as_expr(lp.extent), out, "serial")
                continue
            kind = "unroll" if self.unroll and lp.extent <= UNROLL_MAX_EXTENT else "serial"
            out = For(var, Const(lp.extent, var.dtype), out, kind)
        count = s.mapping.num_workers
        return If(s.worker < (as_expr(count) if isinstance(count, SymDim) else
                              Const(count, s.worker.dtype)), out)


def lower_mappings(fn: Function) -> Function:
    """Replace each MapFor of `fn` by loops and index expressions (see module docstring)."""
    unroll = simt(fn.attr("target"))
    return _LowerMappings(_NameSupply(all_names(fn)), unroll).function(fn)
