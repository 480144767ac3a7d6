"""A readable printer for the tensor-program IR (Python-like pseudo-code).

    def add(a: float32[n], out: float32[n], n: int32):  # target=cpu
        for w in parallel(4):
            for t0 in repeat(8)*spatial(1).on(w):
                out[t0] = a[t0] + 1.0

Expressions print with the fewest parentheses that keep the tree unambiguous (an equal-
precedence right operand is parenthesized, so `a - (b - c)` keeps its shape). Constants
of the default dtypes (int32, float32, bool) print bare; others as `int64(3)`. Task
mappings print as the expression that built them: `repeat(4, 1)*spatial(16, 8)`.
This module is for humans and dumps; it is never parsed back.

Assumes: nodes from `hidetc.tir.ir` and mappings from `hidetc.tir.mapping` (matched by
class name; this module imports only ir.py).
"""
from __future__ import annotations

from typing import Any, Callable, Union

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

INDENT = "    "
# precedence: larger binds tighter
_PREC = {"||": 1, "&&": 2, "<": 3, "<=": 3, ">": 3, ">=": 3, "==": 3, "!=": 3,
         "+": 4, "-": 4, "*": 5, "/": 5, "//": 5, "%": 5}
_UNARY_PREC = 6
_ATOM_PREC = 7
_DEFAULT_DTYPES = ("int32", "float32", "bool")


# task mappings -------------------------------------------------------------------------
def _shape_args(shape: tuple[int, ...]) -> str:
    return ", ".join(str(e) for e in shape)


# keyed by class name so this module need not import mapping.py (which may then use
# format_mapping for its own __str__ without an import cycle)
_MAPPING_FORMATTERS: dict[str, Callable[[Any], str]] = {
    "Spatial": lambda m: f"spatial({_shape_args(m.task_shape)})",
    "Repeat": lambda m: f"repeat({_shape_args(m.task_shape)})",
    "Composed": lambda m: f"{format_mapping(m.outer)}*{format_mapping(m.inner)}",
}


def format_mapping(m: Any) -> str:
    """A task mapping as the expression that builds it: `repeat(4, 1)*spatial(16, 8)`."""
    fmt = _MAPPING_FORMATTERS.get(type(m).__name__)
    return fmt(m) if fmt is not None else repr(m)


# expressions ---------------------------------------------------------------------------
def _const(e: Const) -> tuple[str, int]:
    text = repr(e.value)
    if e.dtype == "bool":
        text = "True" if e.value else "False"
    elif e.dtype in _DEFAULT_DTYPES:
        text = repr(float(e.value)) if e.dtype == "float32" else repr(int(e.value))
    else:
        return f"{e.dtype}({text})", _ATOM_PREC
    return text, (_UNARY_PREC if text.startswith("-") else _ATOM_PREC)


def _binop(e: BinOp) -> tuple[str, int]:
    if e.op in ("min", "max"):
        return f"{e.op}({format_expr(e.a)}, {format_expr(e.b)})", _ATOM_PREC
    prec = _PREC[e.op]
    return f"{_wrap(e.a, prec)} {e.op} {_wrap(e.b, prec + 1)}", prec


def _unop(e: UnOp) -> tuple[str, int]:
    sym = "-" if e.op == "neg" else "not "
    return f"{sym}{_wrap(e.a, _UNARY_PREC)}", _UNARY_PREC


def _args(es) -> str:
    return ", ".join(format_expr(x) for x in es)


_EXPR_FORMATTERS: dict[type, Callable[[Any], tuple[str, int]]] = {
    Var: lambda e: (e.name, _ATOM_PREC),
    Const: _const,
    BinOp: _binop,
    UnOp: _unop,
    Call: lambda e: (f"{e.func}({_args(e.args)})", _ATOM_PREC),
    Cast: lambda e: (f"{e.dtype}({format_expr(e.value)})", _ATOM_PREC),
    Select: lambda e: (f"select({_args((e.cond, e.a, e.b))})", _ATOM_PREC),
    Load: lambda e: (f"{e.buffer.name}[{_args(e.indices)}]", _ATOM_PREC),
}


def _format(e: Expr) -> tuple[str, int]:
    fmt = _EXPR_FORMATTERS.get(type(e))
    if fmt is None:
        raise TypeError(f"not a TIR expression: {e!r}")
    return fmt(e)


def _wrap(e: Expr, min_prec: int) -> str:
    text, prec = _format(e)
    return text if prec >= min_prec else f"({text})"


def format_expr(e: Expr) -> str:
    return _format(e)[0]


# statements ----------------------------------------------------------------------------
def _dim(d: Any) -> str:
    return format_expr(d) if isinstance(d, Expr) else str(d)


def format_buffer_type(b: Buffer) -> str:
    dims = ", ".join(_dim(d) for d in b.shape)
    return f"{b.dtype}[{dims}]"


def _lines_store(s: Store, ind: str) -> list[str]:
    return [f"{ind}{s.buffer.name}[{_args(s.indices)}] = {format_expr(s.value)}"]


def _lines_seq(s: Seq, ind: str) -> list[str]:
    if not s.stmts:
        return [f"{ind}pass"]
    out: list[str] = []
    for x in s.stmts:
        if isinstance(x, Seq):  # a nested block: its declarations end with it
            out.append(f"{ind}with block:")
            out.extend(_lines(x, ind + INDENT))
        else:
            out.extend(_lines(x, ind))
    return out


def _lines_for(s: For, ind: str) -> list[str]:
    rng = "range" if s.kind == "serial" else s.kind
    head = f"{ind}for {s.var.name} in {rng}({format_expr(s.extent)}):"
    return [head] + _lines(s.body, ind + INDENT)


def _lines_mapfor(s: MapFor, ind: str) -> list[str]:
    names = ", ".join(v.name for v in s.vars)
    head = f"{ind}for {names} in {format_mapping(s.mapping)}.on({format_expr(s.worker)}):"
    return [head] + _lines(s.body, ind + INDENT)


def _lines_if(s: If, ind: str) -> list[str]:
    out = [f"{ind}if {format_expr(s.cond)}:"] + _lines(s.then, ind + INDENT)
    if s.else_ is not None:
        out += [f"{ind}else:"] + _lines(s.else_, ind + INDENT)
    return out


def _lines_declare(s: Declare, ind: str) -> list[str]:
    init = "" if s.init is None else f" = {format_expr(s.init)}"
    return [f"{ind}{s.var.name}: {s.var.dtype}{init}"]


_STMT_FORMATTERS: dict[type, Callable[[Any, str], list[str]]] = {
    Store: _lines_store,
    Seq: _lines_seq,
    For: _lines_for,
    MapFor: _lines_mapfor,
    If: _lines_if,
    Declare: _lines_declare,
    Assign: lambda s, ind: [f"{ind}{s.var.name} = {format_expr(s.value)}"],
    Alloc: lambda s, ind: [f"{ind}{s.buffer.name} = alloc_{s.buffer.scope}"
                           f"({format_buffer_type(s.buffer)})"],
    Evaluate: lambda s, ind: [f"{ind}{format_expr(s.expr)}"],
}


def _lines(s: Stmt, ind: str) -> list[str]:
    fmt = _STMT_FORMATTERS.get(type(s))
    if fmt is None:
        raise TypeError(f"not a TIR statement: {s!r}")
    return fmt(s, ind)


def format_stmt(s: Stmt, indent: int = 0) -> str:
    return "\n".join(_lines(s, INDENT * indent))


# functions -----------------------------------------------------------------------------
def _param(p: Union[Buffer, Var]) -> str:
    if isinstance(p, Buffer):
        scope = "" if p.scope == "global" else f" @{p.scope}"
        return f"{p.name}: {format_buffer_type(p)}{scope}"
    return f"{p.name}: {p.dtype}"


def format_function(fn: Function) -> str:
    params = ", ".join(_param(p) for p in fn.params)
    attrs = ", ".join(f"{k}={v}" for k, v in fn.attrs)
    head = f"def {fn.name}({params}):" + (f"  # {attrs}" if attrs else "")
    return "\n".join([head] + _lines(fn.body, INDENT)) + "\n"


def format_node(node: Union[Function, Stmt, Expr]) -> str:
    """Any IR node: a Function, a statement or an expression."""
    if isinstance(node, Function):
        return format_function(node)
    if isinstance(node, Stmt):
        return format_stmt(node)
    return format_expr(node)
