"""The TIR verifier: structural rules every Function must satisfy between passes.

`verify_function(fn, lowered)` raises `TirVerifyError` naming the function and the first
broken rule, or returns None. Rules:

- scope: a variable is used only where it is defined (parameters; a For/MapFor
  variable inside its body; a Declare'd variable until the end of its block) and is
  not defined again while in scope (no shadowing: passes substitute by variable);
- Assign targets a Declare'd variable in scope (not a loop variable or parameter);
- a buffer is used (Load/Store) only if it is a parameter or Alloc'ed in scope;
- Load/Store have one index per buffer dimension, or exactly one when the function is
  flattened (attr `flattened`, set by `flatten_buffers`); indices and loop extents are
  integers; a Store's value has the buffer's dtype;
- If/Select conditions are bool;
- MapFor has one variable per mapping dimension, and none remains when `lowered`;
- buffer parameters have scope "global"; Alloc'ed buffers are "local" or "shared";
  a "shared" buffer in a target-"cpu" function is an error.

Assumes the node types of `hidetc.tir.ir`. Guarantees: never modifies `fn`.
Not checked: operand dtype agreement of arithmetic (promotion is implicit) and bounds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hidetc.target import simt
from hidetc.tir.functor import ScopedRewriter
from hidetc.tir.ir import (
    INTS,
    Alloc,
    Assign,
    Buffer,
    Declare,
    Expr,
    For,
    Function,
    If,
    Load,
    MapFor,
    Select,
    Stmt,
    Store,
    Var,
)
from hidetc.tir.printer import format_expr, format_mapping


class TirVerifyError(Exception):
    """A Function breaks an IR rule: a bug in a kernel template or a pass, not the user's."""


@dataclass(frozen=True, slots=True)
class _Declared:
    """Scope marker for a mutable (Declare'd) variable, distinct from the Var itself."""
    var: Var


class _Verifier(ScopedRewriter):
    def __init__(self, fn: Function, lowered: bool):
        super().__init__()
        self.fn = fn
        self.lowered = lowered
        self.flattened = bool(fn.attr("flattened", False))
        self.target = fn.attr("target")

    def fail(self, msg: str) -> None:
        raise TirVerifyError(f"function {self.fn.name}: {msg}")

    # function and buffers ----------------------------------------------------------
    def function(self, fn: Function) -> Function:
        with self.block():
            for p in fn.params:
                self.define(p)
            for p in fn.params:
                if isinstance(p, Buffer):
                    self.check_buffer_decl(p, "parameter")
            self.stmt(fn.body)
        return fn

    def check_buffer_decl(self, b: Buffer, where: str) -> None:
        allowed = ("global",) if where == "parameter" else ("local", "shared")
        if b.scope not in allowed:
            self.fail(f"{where} buffer {b.name} has scope {b.scope!r}, want one of {allowed}")
        if b.scope == "shared" and self.target is not None and not simt(self.target):
            self.fail(f"shared-scope buffer {b.name} in a cpu function")
        for d in b.shape:
            if isinstance(d, Expr):
                self.expr(d)
                self.check_int(d, f"a dimension of buffer {b.name}")
            elif not isinstance(d, int) or d < 0:
                self.fail(f"buffer {b.name} has a bad dimension {d!r}")

    def check_access(self, b: Buffer, indices: tuple[Expr, ...], what: str) -> None:
        if not self.in_scope(b):
            self.fail(f"{what} of buffer {b.name}, which is neither a parameter nor "
                      "allocated in scope")
        want = 1 if self.flattened else len(b.shape)
        if len(indices) != want:
            state = "flattened " if self.flattened else ""
            self.fail(f"{what} of {state}buffer {b.name} (rank {len(b.shape)}) has "
                      f"{len(indices)} indices, want {want}")
        for i in indices:
            self.check_int(i, f"an index of {b.name}")

    def check_int(self, e: Expr, what: str) -> None:
        if e.dtype not in INTS:
            self.fail(f"{what} has dtype {e.dtype}, want an integer: {format_expr(e)}")

    def check_bool(self, e: Expr, what: str) -> None:
        if e.dtype != "bool":
            self.fail(f"{what} condition has dtype {e.dtype}, want bool: {format_expr(e)}")

    # variables ---------------------------------------------------------------------
    def visit_Var(self, e: Var) -> Expr:
        if not self.in_scope(e):
            self.fail(f"variable {e.name}: {e.dtype} used outside the scope defining it")
        return e

    def def_var(self, v: Var) -> Var:
        if self.in_scope(v):
            self.fail(f"variable {v.name} defined again while in scope")
        return v

    def visit_Declare(self, s: Declare) -> Stmt:
        super().visit_Declare(s)
        self.define(_Declared(s.var))
        return s

    def visit_Assign(self, s: Assign) -> Stmt:
        self.expr(s.value)
        if not self.in_scope(_Declared(s.var)):
            self.fail(f"assignment to {s.var.name}, which is not a declared variable in "
                      "scope")
        return s

    # expressions and statements ----------------------------------------------------
    def visit_Load(self, e: Load) -> Expr:
        super().visit_Load(e)
        self.check_access(e.buffer, e.indices, "load")
        return e

    def visit_Select(self, e: Select) -> Expr:
        super().visit_Select(e)
        self.check_bool(e.cond, "select")
        return e

    def visit_Store(self, s: Store) -> Stmt:
        super().visit_Store(s)
        self.check_access(s.buffer, s.indices, "store")
        if s.value.dtype != s.buffer.dtype:
            self.fail(f"store of a {s.value.dtype} value into {s.buffer.dtype} buffer "
                      f"{s.buffer.name}: {format_expr(s.value)}")
        return s

    def visit_If(self, s: If) -> Stmt:
        self.check_bool(s.cond, "if")
        return super().visit_If(s)

    def visit_For(self, s: For) -> Stmt:
        if s.kind not in ("serial", "parallel", "unroll", "rolled"):
            self.fail(f"loop {s.var.name} has unknown kind {s.kind!r}")
        self.check_int(s.var, f"loop variable {s.var.name}")
        self.check_int(s.extent, f"the extent of loop {s.var.name}")
        return super().visit_For(s)

    def visit_MapFor(self, s: MapFor) -> Stmt:
        text = format_mapping(s.mapping)
        if self.lowered:
            self.fail(f"a MapFor over {text} remains after lowering")
        if len(s.vars) != _rank(s.mapping):
            self.fail(f"MapFor over {text} binds {len(s.vars)} variables, want "
                      f"{_rank(s.mapping)}")
        self.check_int(s.worker, f"the worker of MapFor over {text}")
        return super().visit_MapFor(s)

    def visit_Alloc(self, s: Alloc) -> Stmt:
        if self.in_scope(s.buffer):
            self.fail(f"buffer {s.buffer.name} allocated again while in scope")
        self.check_buffer_decl(s.buffer, "allocated")
        return super().visit_Alloc(s)


def _rank(mapping: Any) -> int:
    return len(mapping.task_shape)


def verify_function(fn: Function, lowered: bool = False) -> None:
    """Raise TirVerifyError at the first rule `fn` breaks (see the module docstring)."""
    if not isinstance(fn, Function):
        raise TirVerifyError(f"not a Function: {type(fn).__name__}")
    _Verifier(fn, lowered).function(fn)
