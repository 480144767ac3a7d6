"""The kernel-writing DSL: build a `Function` with Python `with` blocks.

    kb = KernelBuilder("add", target="cpu")
    a = kb.buffer("a", "float32", (n,))
    out = kb.buffer("out", "float32", (n,))
    with kb.for_range(workers, kind="parallel") as w:
        with kb.for_mapping(repeat(n // workers) * spatial(1), w) as (i,):
            kb.store(out, (i,), a[i] + 1.0)
    fn = kb.finish()

Names given to variables and buffers are hints: the builder makes them unique.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from hidetc.tir.functor import collect
from hidetc.tir.ir import (
    INDEX_DTYPE,
    Alloc,
    Assign,
    Buffer,
    Declare,
    Evaluate,
    Expr,
    ExprLike,
    For,
    Function,
    If,
    MapFor,
    Stmt,
    Store,
    Var,
    as_expr,
    is_size_var,
    seq,
)
from hidetc.tir.mapping import TaskMapping


class KernelBuilder:
    def __init__(self, name: str, target: str = "cpu"):
        self.name = name
        self.target = target
        self.params: list[Buffer | Var] = []
        self._stack: list[list[Stmt]] = [[]]
        self._names: dict[str, int] = {}

    def fresh(self, hint: str) -> str:
        n = self._names.get(hint, 0)
        self._names[hint] = n + 1
        return hint if n == 0 else f"{hint}_{n}"

    # parameters and declarations -------------------------------------------------
    def buffer(self, name: str, dtype: str, shape: Sequence[Any]) -> Buffer:
        buf = Buffer(self.fresh(name), dtype, tuple(shape), "global")
        self.params.append(buf)
        return buf

    def scalar(self, name: str, dtype: str = INDEX_DTYPE) -> Var:
        var = Var(self.fresh(name), dtype)
        self.params.append(var)
        return var

    def alloc(self, name: str, dtype: str, shape: Sequence[Any], scope: str = "local") -> Buffer:
        buf = Buffer(self.fresh(name), dtype, tuple(shape), scope)
        self.emit(Alloc(buf))
        return buf

    def declare(self, name: str, dtype: str, init: ExprLike | None = None) -> Var:
        var = Var(self.fresh(name), dtype)
        self.emit(Declare(var, None if init is None else as_expr(init, var)))
        return var

    # statements -------------------------------------------------------------------
    def emit(self, stmt: Stmt) -> None:
        self._stack[-1].append(stmt)

    def assign(self, var: Var, value: ExprLike) -> None:
        self.emit(Assign(var, as_expr(value, var)))

    def store(self, buf: Buffer, indices: Sequence[ExprLike] | ExprLike, value: ExprLike) -> None:
        idx = indices if isinstance(indices, (tuple, list)) else (indices,)
        value = as_expr(value)
        self.emit(Store(buf, tuple(as_expr(i) for i in idx), value))

    def evaluate(self, expr: Expr) -> None:
        self.emit(Evaluate(expr))

    @contextmanager
    def _block(self) -> Iterator[list[Stmt]]:
        self._stack.append([])
        body = self._stack[-1]
        try:
            yield body
        finally:
            self._stack.pop()

    @contextmanager
    def for_range(self, extent: ExprLike, kind: str = "serial", name: str = "i") -> Iterator[Var]:
        extent = as_expr(extent)
        var = Var(self.fresh(name), "int64" if extent.dtype == "int64" else INDEX_DTYPE)
        with self._block() as body:
            yield var
        self.emit(For(var, extent, seq(*body) if body else seq(), kind))

    @contextmanager
    def for_mapping(self, mapping: TaskMapping, worker: ExprLike,
                    names: Sequence[str] | None = None) -> Iterator[tuple[Var, ...]]:
        hints = names or [f"t{d}" for d in range(mapping.rank)]
        vars_ = tuple(Var(self.fresh(h), INDEX_DTYPE) for h in hints)
        with self._block() as body:
            yield vars_
        self.emit(MapFor(vars_, mapping, as_expr(worker), seq(*body)))

    @contextmanager
    def if_then(self, cond: ExprLike) -> Iterator[None]:
        with self._block() as body:
            yield
        self.emit(If(as_expr(cond), seq(*body)))

    @contextmanager
    def otherwise(self) -> Iterator[None]:
        """Attach an else branch to the `If` emitted just before."""
        last = self._stack[-1][-1] if self._stack[-1] else None
        if not isinstance(last, If) or last.else_ is not None:
            raise ValueError("otherwise() must directly follow an if_then() block")
        with self._block() as body:
            yield
        self._stack[-1][-1] = If(last.cond, last.then, seq(*body))

    def finish(self, **attrs: Any) -> Function:
        if len(self._stack) != 1:
            raise ValueError("finish() inside an open block")
        attrs.setdefault("target", self.target)
        return Function(self.name, tuple(self.params), seq(*self._stack[0]),
                        tuple(sorted(attrs.items())))


def size_params(fn: Function) -> tuple[Var, ...]:
    """The symbolic sizes `fn` uses (in its body or its buffers' shapes) and does not
    take yet, sorted by name: the scalar parameters a kernel with run-time extents
    takes (the plan adds them: `driver.plan.with_size_params`)."""
    usage = collect(fn)
    found = {v for v in usage.free_vars if is_size_var(v)}
    buffers = [p for p in fn.params if isinstance(p, Buffer)]
    buffers += list(usage.allocs + usage.loads + usage.stores)
    for buf in buffers:
        for d in buf.shape:
            if isinstance(d, Expr):     # (a Buffer holds a symbolic size as its Expr)
                found |= {v for v in collect(Evaluate(d)).free_vars
                          if is_size_var(v)}
    taken = {p for p in fn.params if isinstance(p, Var)}
    return tuple(sorted(found - taken, key=lambda v: v.name))
