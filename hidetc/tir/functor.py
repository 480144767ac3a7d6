"""Generic traversal of the tensor-program IR: rewriting, substitution, collection.

`Rewriter` walks expressions and statements with dict dispatch on the node's exact type
(`visit_<ClassName>` methods, looked up once per subclass). The default behaviour
rebuilds a node from its rewritten children and returns the *same object* when no child
changed, so `rewritten is original` is a cheap "nothing to do" test and idempotent
passes return their input unchanged.

Definition sites (`For.var`, `MapFor.vars`, `Declare.var`, `Assign.var`) go through
`def_var`, not `expr`, so rewriting uses never turns a definition into a non-variable.
Buffers go through `buffer` (identity by default).

`ScopedRewriter` additionally tracks which variables and buffers are in scope: function
parameters; a For/MapFor variable inside its body; a Declare'd variable or Alloc'ed
buffer until the end of the enclosing block. Blocks are: a Seq, a For/MapFor body and
each If branch. Names are assumed unique per function (the builder and the passes
make them so); structural equality identifies variables.

Assumes: nodes from `hidetc.tir.ir`. Guarantees: no input node is mutated.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Union

from hidetc.tir.ir import (
    Alloc,
    Assign,
    BinOp,
    Buffer,
    Call,
    Cast,
    Const,
    Declare,
    Evaluate,
    Expr,
    For,
    Function,
    If,
    Load,
    MapFor,
    Select,
    Seq,
    Stmt,
    Store,
    UnOp,
    Var,
)

Node = Union[Expr, Stmt, Function]

EXPR_NODES = (Var, Const, BinOp, UnOp, Call, Cast, Select, Load)
STMT_NODES = (Store, Seq, For, MapFor, If, Declare, Assign, Alloc, Evaluate)


def _same(new: tuple, old: tuple) -> bool:
    return len(new) == len(old) and all(a is b for a, b in zip(new, old))


class Rewriter:
    """Identity rewriter; subclasses override `visit_<Node>` for the nodes they change."""

    _expr_table: dict[type, Callable]
    _stmt_table: dict[type, Callable]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._build_tables()

    @classmethod
    def _build_tables(cls) -> None:
        cls._expr_table = {t: getattr(cls, f"visit_{t.__name__}") for t in EXPR_NODES}
        cls._stmt_table = {t: getattr(cls, f"visit_{t.__name__}") for t in STMT_NODES}

    # entry points -------------------------------------------------------------------
    def __call__(self, node: Node) -> Node:
        if isinstance(node, Function):
            return self.function(node)
        if isinstance(node, Stmt):
            return self.stmt(node)
        return self.expr(node)

    def expr(self, e: Expr) -> Expr:
        fn = self._expr_table.get(type(e))
        if fn is None:
            raise TypeError(f"not a TIR expression: {type(e).__name__}: {e!r}")
        return fn(self, e)

    def stmt(self, s: Stmt) -> Stmt:
        fn = self._stmt_table.get(type(s))
        if fn is None:
            raise TypeError(f"not a TIR statement: {type(s).__name__}: {s!r}")
        return fn(self, s)

    def function(self, fn: Function) -> Function:
        params = tuple(self.buffer(p) if isinstance(p, Buffer) else p for p in fn.params)
        params = fn.params if _same(params, fn.params) else params
        body = self.stmt(fn.body)
        if body is fn.body and params is fn.params:
            return fn
        return Function(fn.name, params, body, fn.attrs)

    def exprs(self, es: tuple[Expr, ...]) -> tuple[Expr, ...]:
        new = tuple(self.expr(e) for e in es)
        return es if _same(new, es) else new

    def buffer(self, b: Buffer) -> Buffer:
        return b

    def def_var(self, v: Var) -> Var:
        return v

    # expressions --------------------------------------------------------------------
    def visit_Var(self, e: Var) -> Expr:
        return e

    def visit_Const(self, e: Const) -> Expr:
        return e

    def visit_BinOp(self, e: BinOp) -> Expr:
        a, b = self.expr(e.a), self.expr(e.b)
        return e if a is e.a and b is e.b else BinOp(e.op, a, b)

    def visit_UnOp(self, e: UnOp) -> Expr:
        a = self.expr(e.a)
        return e if a is e.a else UnOp(e.op, a)

    def visit_Call(self, e: Call) -> Expr:
        args = self.exprs(e.args)
        return e if args is e.args else Call(e.func, args, e.dtype)

    def visit_Cast(self, e: Cast) -> Expr:
        v = self.expr(e.value)
        return e if v is e.value else Cast(v, e.dtype)

    def visit_Select(self, e: Select) -> Expr:
        c, a, b = self.expr(e.cond), self.expr(e.a), self.expr(e.b)
        return e if (c is e.cond and a is e.a and b is e.b) else Select(c, a, b)

    def visit_Load(self, e: Load) -> Expr:
        buf, idx = self.buffer(e.buffer), self.exprs(e.indices)
        return e if buf is e.buffer and idx is e.indices else Load(buf, idx)

    # statements ---------------------------------------------------------------------
    def visit_Store(self, s: Store) -> Stmt:
        buf, idx, v = self.buffer(s.buffer), self.exprs(s.indices), self.expr(s.value)
        if buf is s.buffer and idx is s.indices and v is s.value:
            return s
        return Store(buf, idx, v)

    def visit_Seq(self, s: Seq) -> Stmt:
        new = tuple(self.stmt(x) for x in s.stmts)
        return s if _same(new, s.stmts) else Seq(new)

    def visit_For(self, s: For) -> Stmt:
        ext = self.expr(s.extent)
        var = self.def_var(s.var)
        body = self.stmt(s.body)
        if ext is s.extent and var is s.var and body is s.body:
            return s
        return For(var, ext, body, s.kind)

    def visit_MapFor(self, s: MapFor) -> Stmt:
        worker = self.expr(s.worker)
        vars_ = tuple(self.def_var(v) for v in s.vars)
        body = self.stmt(s.body)
        if worker is s.worker and _same(vars_, s.vars) and body is s.body:
            return s
        return MapFor(vars_, s.mapping, worker, body)

    def visit_If(self, s: If) -> Stmt:
        cond, then = self.expr(s.cond), self.stmt(s.then)
        else_ = None if s.else_ is None else self.stmt(s.else_)
        if cond is s.cond and then is s.then and else_ is s.else_:
            return s
        return If(cond, then, else_)

    def visit_Declare(self, s: Declare) -> Stmt:
        init = None if s.init is None else self.expr(s.init)
        var = self.def_var(s.var)
        return s if init is s.init and var is s.var else Declare(var, init)

    def visit_Assign(self, s: Assign) -> Stmt:
        v, var = self.expr(s.value), self.def_var(s.var)
        return s if v is s.value and var is s.var else Assign(var, v)

    def visit_Alloc(self, s: Alloc) -> Stmt:
        buf = self.buffer(s.buffer)
        return s if buf is s.buffer else Alloc(buf)

    def visit_Evaluate(self, s: Evaluate) -> Stmt:
        e = self.expr(s.expr)
        return s if e is s.expr else Evaluate(e)


Rewriter._build_tables()


class ScopedRewriter(Rewriter):
    """A Rewriter that knows the variables and buffers in scope (see module docstring).
    Subclasses that define `__init__` must call `super().__init__()`."""

    def __init__(self) -> None:
        self._scopes: list[set] = [set()]

    @contextmanager
    def block(self) -> Iterator[None]:
        self._scopes.append(set())
        try:
            yield
        finally:
            self._scopes.pop()

    def define(self, item: Union[Var, Buffer]) -> None:
        self._scopes[-1].add(item)

    def in_scope(self, item: Union[Var, Buffer]) -> bool:
        return any(item in scope for scope in self._scopes)

    def function(self, fn: Function) -> Function:
        with self.block():
            for p in fn.params:
                self.define(p)
            return super().function(fn)

    def visit_Seq(self, s: Seq) -> Stmt:
        with self.block():
            return super().visit_Seq(s)

    def visit_For(self, s: For) -> Stmt:
        ext = self.expr(s.extent)
        with self.block():
            var = self.def_var(s.var)
            self.define(s.var)
            body = self.stmt(s.body)
        if ext is s.extent and var is s.var and body is s.body:
            return s
        return For(var, ext, body, s.kind)

    def visit_MapFor(self, s: MapFor) -> Stmt:
        worker = self.expr(s.worker)
        with self.block():
            vars_ = tuple(self.def_var(v) for v in s.vars)
            for v in s.vars:
                self.define(v)
            body = self.stmt(s.body)
        if worker is s.worker and _same(vars_, s.vars) and body is s.body:
            return s
        return MapFor(vars_, s.mapping, worker, body)

    def visit_If(self, s: If) -> Stmt:
        cond = self.expr(s.cond)
        with self.block():
            then = self.stmt(s.then)
        with self.block():
            else_ = None if s.else_ is None else self.stmt(s.else_)
        if cond is s.cond and then is s.then and else_ is s.else_:
            return s
        return If(cond, then, else_)

    def visit_Declare(self, s: Declare) -> Stmt:
        out = super().visit_Declare(s)
        self.define(s.var)
        return out

    def visit_Alloc(self, s: Alloc) -> Stmt:
        out = super().visit_Alloc(s)
        self.define(s.buffer)
        return out


# substitution -----------------------------------------------------------------------
class _Substituter(Rewriter):
    def __init__(self, mapping: Mapping[Var, Expr]):
        self.mapping = mapping

    def visit_Var(self, e: Var) -> Expr:
        return self.mapping.get(e, e)

    def def_var(self, v: Var) -> Var:
        new = self.mapping.get(v, v)
        return new if isinstance(new, Var) else v


def substitute(node: Node, mapping: Mapping[Var, Expr]) -> Node:
    """Replace every use of the variables in `mapping`. A definition site is renamed when
    its variable maps to another Var, and kept otherwise. Returns `node` itself when no
    variable of `mapping` occurs."""
    if not mapping:
        return node
    return _Substituter(mapping)(node)


# collection -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Usage:
    """What a node uses, in first-occurrence order: variables used but not defined inside
    it, variables defined inside it, buffers loaded from and stored to."""
    free_vars: tuple[Var, ...]
    defined_vars: tuple[Var, ...]
    loads: tuple[Buffer, ...]
    stores: tuple[Buffer, ...]
    allocs: tuple[Buffer, ...]


class _Collector(ScopedRewriter):
    def __init__(self) -> None:
        super().__init__()
        self.free: dict[Var, None] = {}
        self.defined: dict[Var, None] = {}
        self.loads: dict[Buffer, None] = {}
        self.stores: dict[Buffer, None] = {}
        self.allocs: dict[Buffer, None] = {}

    def visit_Var(self, e: Var) -> Expr:
        if not self.in_scope(e):
            self.free[e] = None
        return e

    def def_var(self, v: Var) -> Var:
        self.defined[v] = None
        return v

    def visit_Assign(self, s: Assign) -> Stmt:
        self.expr(s.value)
        self.visit_Var(s.var)
        return s

    def visit_Load(self, e: Load) -> Expr:
        self.loads[e.buffer] = None
        return super().visit_Load(e)

    def visit_Store(self, s: Store) -> Stmt:
        self.stores[s.buffer] = None
        return super().visit_Store(s)

    def visit_Alloc(self, s: Alloc) -> Stmt:
        self.allocs[s.buffer] = None
        return super().visit_Alloc(s)


def collect(node: Node) -> Usage:
    """Free and defined variables and the loaded/stored buffers of `node`. For a Function,
    parameters count as defined in scope (so free_vars are the truly undefined ones)."""
    c = _Collector()
    c(node)
    return Usage(tuple(c.free), tuple(c.defined), tuple(c.loads), tuple(c.stores),
                 tuple(c.allocs))


def all_names(node: Node) -> set[str]:
    """Every variable and buffer name used or defined in `node` (and its parameters, if a
    Function): the names a fresh name must avoid."""
    usage = collect(node)
    names = {v.name for v in usage.free_vars + usage.defined_vars}
    names |= {b.name for b in usage.loads + usage.stores + usage.allocs}
    if isinstance(node, Function):
        names |= {p.name for p in node.params}
    return names
