"""Pass: rewrite n-d Load/Store indices to one row-major flat index.

`a[i, j, k]` on a buffer of shape (A, B, C) becomes `a[(i * B + j) * C + k]` (Horner
form: one multiply per dimension). A rank-1 access is unchanged; a rank-0 access gets
the index 0. Buffers keep their n-d shape (the C printer sizes declarations from it);
the function gains the attribute `("flattened", True)` so the verifier expects one
index per access and the pass is idempotent (a flattened function is returned as is).

Index dtype: when a buffer may hold 2**31 or more elements (a constant shape that large,
or a symbolic one, whose size is unknown), each index is cast to int64 before the
arithmetic so the flat offset cannot overflow int32.

Assumes: a verified, lowered Function. Guarantees: every Load/Store has one index.
"""
from __future__ import annotations

import math

from hidetc.tir.functor import Rewriter
from hidetc.tir.ir import Buffer, Const, Expr, Function, Load, Stmt, Store, as_expr, cast

_INT32_LIMIT = 2 ** 31


def _needs_int64(buf: Buffer) -> bool:
    if any(isinstance(d, Expr) for d in buf.shape):
        return len(buf.shape) > 1
    return math.prod(buf.shape) >= _INT32_LIMIT


def flat_index(buf: Buffer, indices: tuple[Expr, ...]) -> Expr:
    """The row-major offset of `indices` in `buf` (Horner form)."""
    if not indices:
        return Const(0, "int32")
    if _needs_int64(buf):
        indices = tuple(cast(i, "int64") for i in indices)
    out = indices[0]
    for extent, idx in zip(buf.shape[1:], indices[1:]):
        out = out * as_expr(extent, out) + idx
    return out


class _Flatten(Rewriter):
    def visit_Load(self, e: Load) -> Expr:
        e = super().visit_Load(e)
        if len(e.indices) == 1:
            return e
        return Load(e.buffer, (flat_index(e.buffer, e.indices),))

    def visit_Store(self, s: Store) -> Stmt:
        s = super().visit_Store(s)
        if len(s.indices) == 1:
            return s
        return Store(s.buffer, (flat_index(s.buffer, s.indices),), s.value)


def flatten_buffers(fn: Function) -> Function:
    """Flatten every buffer access of `fn` (see the module docstring)."""
    if fn.attr("flattened", False):
        return fn
    out = _Flatten().function(fn)
    attrs = tuple(kv for kv in out.attrs if kv[0] != "flattened") + (("flattened", True),)
    return Function(out.name, out.params, out.body, tuple(sorted(attrs)))
