"""Pass: algebraic simplification of integer/boolean expressions and trivial statements.

Expression rules are data: `_RULES[op]` lists functions `rule(e, ctx) -> Expr | None`,
tried in order on each node after its children are simplified; when one fires, its
result is simplified again (every rule shrinks the tree or moves a constant right, so
this terminates). Rules:

- constant folding of integer and bool operators with C semantics (`/`, `//`, `%`
  truncate; folding is skipped when the result overflows the dtype or divides by 0);
  casts and negation of integer constants; integer `min`/`max`;
- constants to the right of commutative operators; `(x + c1) + c2 -> x + (c1 + c2)`,
  `(x * c1) * c2 -> x * (c1 * c2)`, `(x // a) // b -> x // (a * b)` (a, b > 0);
- identities: `x + 0`, `x - 0`, `x * 1`, `x * 0` (integers only), `x // 1`, `x % 1`,
  `(x * k*c) // c -> x * k`, `(x * k*c) % c -> 0`, `(x / c) * c + x % c -> x`; for
  floats only the exact ones `x * 1.0`, `x / 1.0` (never `x + 0.0` or `x * 0.0`: -0.0, inf and NaN);
- with value ranges (loop variables range over [0, extent); MapFor variables over the
  task grid; everything else is unknown): `x // c -> 0` and `x % c -> x` when
  0 <= x < c; `(a * k*c + b) // c -> a * k + b // c` and `(a * k*c + b) % c -> b % c`
  when a, b >= 0; integer comparisons decided by the ranges; `min`/`max` decided likewise;
- `&&`/`||`/`not` with a constant operand, `not not x`, Select with a constant
  condition, `cast` to the same dtype.

CUDA built-ins (target "cuda"; the launch attrs ARE the launch shape): `threadIdx.d` in
[0, block[d]), `blockIdx.d` in [0, grid[d]), `blockDim.d`/`gridDim.d` = block[d]/grid[d].

Side effects: Calls that `tir.intrinsics.impure` names (warp collectives, barriers, fences,
atomics, `hidetc_` helpers writing through pointers) are impure; a rule fires only if
the result keeps exactly the input's impure calls (`shfl(x) * 0` stays); an empty If
with an impure condition becomes `Evaluate(cond)`; a loop with an impure extent stays.

Statement rules: If with a constant condition becomes its branch; an If with nothing to
do disappears (an empty then with an else negates the condition); loops with extent <= 0
or an empty body disappear; extent-1 loops become their body with the variable = 0;
nested Seqs are flattened and empty ones removed -- except a Seq holding a Declare or
Alloc at its top level, which stays a block (its names stay scoped).

Assumes a verified Function. Guarantees: the same result on every input; idempotent; an
unchanged Function is returned as is; replacements keep the node's dtype (via a cast).
"""
from __future__ import annotations

from collections import Counter
from typing import Callable, Optional

import numpy as np

from hidetc.target import simt
from hidetc.tir.evaluate import c_div, c_mod
from hidetc.tir.functor import Rewriter, substitute
from hidetc.tir.intrinsics import impure
from hidetc.tir.ir import (
    FLOATS,
    INDEX_DTYPE,
    INTS,
    Alloc,
    BinOp,
    Call,
    Cast,
    Const,
    Declare,
    Evaluate,
    Expr,
    For,
    Function,
    If,
    MapFor,
    Select,
    Seq,
    Stmt,
    UnOp,
    Var,
    cast,
)

Range = tuple[Optional[int], Optional[int]]
_UNKNOWN: Range = (None, None)
_DIV = ("/", "//")
_BUILTINS = (("threadIdx", "block", 0), ("blockIdx", "grid", 0), ("blockDim", "block", 1),
             ("gridDim", "grid", 1))  # (name, launch attr, exact: the range is [n, n])


class _Effects(Rewriter):
    def __init__(self) -> None:
        self.calls: Counter[Call] = Counter()

    def visit_Call(self, e: Call) -> Expr:
        if impure(e.func):
            self.calls[e] += 1
        return super().visit_Call(e)


def effects(e: Expr) -> Counter[Call]:
    """The impure calls in `e`, with their multiplicity."""
    (found := _Effects()).expr(e)
    return found.calls


def builtin_ranges(fn: Function) -> dict[Call, Range]:
    """Ranges of the CUDA index built-ins from a cuda function's launch attrs."""
    out: dict[Call, Range] = {}
    for name, attr, exact in _BUILTINS if simt(fn.attr("target")) else ():
        dims = fn.attr(attr)
        if isinstance(dims, tuple) and all(isinstance(d, int) and d > 0 for d in dims):
            for axis, n in zip("xyz", dims):
                out[Call(f"{name}.{axis}", (), INDEX_DTYPE)] = (n, n) if exact else (0, n - 1)
    return out


# value ranges ------------------------------------------------------------------------
class _Ctx:
    """Known ranges of integer variables (and built-in Calls) in the current scope."""

    def __init__(self) -> None:
        self.ranges: dict[Expr, Range] = {}

    def range_of(self, e: Expr) -> Range:
        if isinstance(e, Const) and e.dtype in INTS:
            return (int(e.value), int(e.value))
        if isinstance(e, Var) or (isinstance(e, Call) and not e.args):
            return self.ranges.get(e, _UNKNOWN)
        if isinstance(e, BinOp) and e.dtype in INTS and e.op in _RANGE_RULES:
            return _RANGE_RULES[e.op](self.range_of(e.a), self.range_of(e.b), e.b)
        if isinstance(e, Cast) and e.dtype in INTS and e.value.dtype in INTS:
            return self.range_of(e.value)
        return _UNKNOWN


def _add(a: Range, b: Range, _e) -> Range:
    lo = None if a[0] is None or b[0] is None else a[0] + b[0]
    hi = None if a[1] is None or b[1] is None else a[1] + b[1]
    return lo, hi


def _sub(a: Range, b: Range, _e) -> Range:
    return _add(a, (None if b[1] is None else -b[1], None if b[0] is None else -b[0]), _e)


def _mul(a: Range, b: Range, _e) -> Range:
    if None in a or None in b:
        if a[0] is not None and b[0] is not None and a[0] >= 0 and b[0] >= 0:
            return a[0] * b[0], None
        return _UNKNOWN
    prods = [x * y for x in a for y in b]
    return min(prods), max(prods)


def _div(a: Range, _b: Range, e: Expr) -> Range:
    c = _pos_const(e)
    if c is None or a[0] is None or a[0] < 0:
        return _UNKNOWN
    return a[0] // c, None if a[1] is None else a[1] // c


def _mod(a: Range, _b: Range, e: Expr) -> Range:
    c = _pos_const(e)
    if c is None or a[0] is None or a[0] < 0:
        return _UNKNOWN
    return 0, c - 1 if a[1] is None else min(c - 1, a[1])


def _min_max(pick: Callable) -> Callable:
    def rule(a: Range, b: Range, _e) -> Range:
        return tuple(None if x is None or y is None else pick(x, y) for x, y in zip(a, b))
    return rule


_RANGE_RULES = {"+": _add, "-": _sub, "*": _mul, "/": _div, "//": _div, "%": _mod,
                "min": _min_max(min), "max": _min_max(max)}


def _pos_const(e: Expr) -> Optional[int]:
    if isinstance(e, Const) and e.dtype in INTS and int(e.value) > 0:
        return int(e.value)
    return None


def _nonneg(ctx: _Ctx, e: Expr) -> bool:
    lo = ctx.range_of(e)[0]
    return lo is not None and lo >= 0


# constant folding --------------------------------------------------------------------
def _int_const(value: int, dtype: str) -> Optional[Const]:
    """`value` as a Const of `dtype`, or None when it does not fit."""
    info = np.iinfo(dtype)
    return Const(int(value), dtype) if info.min <= value <= info.max else None


_INT_FOLD: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "/": c_div, "//": c_div, "%": c_mod, "min": min, "max": max,
}
_CMP_FOLD: dict[str, Callable[[int, int], bool]] = {
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
}


def _is_int_const(e: Expr, value: Optional[int] = None) -> bool:
    if not (isinstance(e, Const) and (e.dtype in INTS or e.dtype == "bool")):
        return False
    return value is None or int(e.value) == value


def _fold(e: BinOp, ctx: _Ctx) -> Optional[Expr]:
    a, b = e.a, e.b
    if not (_is_int_const(a) and _is_int_const(b)):
        return None
    x, y = int(a.value), int(b.value)
    if e.op in _CMP_FOLD:
        return Const(_CMP_FOLD[e.op](x, y), "bool")
    if e.op in ("&&", "||"):
        return Const(bool(x and y) if e.op == "&&" else bool(x or y), "bool")
    if e.dtype not in INTS or (e.op in ("/", "//", "%") and y == 0):
        return None
    return _int_const(_INT_FOLD[e.op](x, y), e.dtype)


def _keep(x: Expr, e: Expr) -> Expr:
    """`x` in place of `e`, with e's dtype."""
    return cast(x, e.dtype)


def _zero(e: Expr) -> Const:
    return Const(0, e.dtype)


# rules ---------------------------------------------------------------------------------
def _commute(e: BinOp, ctx: _Ctx) -> Optional[Expr]:
    if isinstance(e.a, Const) and not isinstance(e.b, Const):
        return BinOp(e.op, e.b, e.a)
    return None


def _reassociate(e: BinOp, ctx: _Ctx) -> Optional[Expr]:
    a, c2 = e.a, e.b
    if e.dtype not in INTS or not isinstance(a, BinOp) or a.op != e.op:
        return None
    if not (_is_int_const(a.b) and _is_int_const(c2)) or a.dtype != e.dtype:
        return None
    if e.op in _DIV:
        c1 = _pos_const(a.b)
        if c1 is None or _pos_const(c2) is None:
            return None
    folded = _int_const((int(a.b.value) * int(c2.value)) if e.op != "+"
                        else int(a.b.value) + int(c2.value), e.dtype)
    return None if folded is None else BinOp(e.op, a.a, folded)


def _identity(e: BinOp, ctx: _Ctx) -> Optional[Expr]:
    a, b, op = e.a, e.b, e.op
    if e.dtype in FLOATS:
        one = isinstance(b, Const) and b.dtype in FLOATS and b.value == 1
        return _keep(a, e) if one and op in ("*", "/") and a.dtype == e.dtype else None
    if e.dtype not in INTS:
        return None
    if _is_int_const(b, 0) and op in ("+", "-"):
        return _keep(a, e)
    if _is_int_const(b, 1) and op in ("*",) + _DIV:
        return _keep(a, e)
    if (_is_int_const(b, 0) and op == "*") or (_is_int_const(b, 1) and op == "%"):
        return _zero(e)
    return None


def _scaled_by(x: Expr, c: int) -> Optional[Expr]:
    """`a * (m // c)` if x is `a * m` (or `m * a`) with m a multiple of c, else None."""
    if not (isinstance(x, BinOp) and x.op == "*"):
        return None
    for a, m in ((x.a, x.b), (x.b, x.a)):
        if _is_int_const(m) and x.dtype in INTS and int(m.value) % c == 0:
            k = int(m.value) // c
            return a if k == 1 else BinOp("*", a, Const(k, m.dtype))
    return None


def _div_mod(e: BinOp, ctx: _Ctx) -> Optional[Expr]:
    c = _pos_const(e.b)
    if c is None or e.dtype not in INTS:
        return None
    is_div = e.op in _DIV
    lo, hi = ctx.range_of(e.a)
    if lo is not None and lo >= 0 and hi is not None and hi < c:
        return _zero(e) if is_div else _keep(e.a, e)
    inner = _scaled_by(e.a, c)
    if inner is not None:
        return _keep(inner, e) if is_div else _zero(e)
    return _split_sum(e, c, ctx)


def _split_sum(e: BinOp, c: int, ctx: _Ctx) -> Optional[Expr]:
    """(a*k*c + b) // c -> a*k + b // c and (a*k*c + b) % c -> b % c, for a, b >= 0."""
    s = e.a
    if not (isinstance(s, BinOp) and s.op == "+"):
        return None
    for scaled, rest in ((s.a, s.b), (s.b, s.a)):
        a = _scaled_by(scaled, c)
        if a is None or not (_nonneg(ctx, a) and _nonneg(ctx, rest)):
            continue
        if e.op in _DIV:
            return _keep(BinOp("+", a, BinOp("//", rest, e.b)), e)
        return _keep(BinOp("%", rest, e.b), e)
    return None


def _by_range(e: BinOp, ctx: _Ctx) -> Optional[Expr]:
    if e.a.dtype not in INTS or e.b.dtype not in INTS:
        return None
    (alo, ahi), (blo, bhi) = ctx.range_of(e.a), ctx.range_of(e.b)
    if e.op in ("min", "max"):
        if ahi is not None and blo is not None and ahi <= blo:
            return _keep(e.a if e.op == "min" else e.b, e)
        if bhi is not None and alo is not None and bhi <= alo:
            return _keep(e.b if e.op == "min" else e.a, e)
        return None
    return _decide_cmp(e.op, (alo, ahi), (blo, bhi))


def _decide_cmp(op: str, a: Range, b: Range) -> Optional[Expr]:
    lt = a[1] is not None and b[0] is not None and a[1] < b[0]   # a < b always
    ge = a[0] is not None and b[1] is not None and a[0] >= b[1]  # a >= b always
    le = a[1] is not None and b[0] is not None and a[1] <= b[0]
    gt = a[0] is not None and b[1] is not None and a[0] > b[1]
    eq = a[0] is not None and a[0] == a[1] == b[0] == b[1]
    table = {"<": (lt, ge), ">=": (ge, lt), "<=": (le, gt), ">": (gt, le),
             "==": (eq, lt or gt), "!=": (lt or gt, eq)}
    if op not in table:
        return None
    true, false = table[op]
    return Const(True, "bool") if true else (Const(False, "bool") if false else None)


def _logic(e: BinOp, ctx: _Ctx) -> Optional[Expr]:
    if not isinstance(e.b, Const) or e.b.dtype != "bool":
        return None
    absorbing = e.op == "||"  # x || True -> True; x && False -> False
    if bool(e.b.value) == absorbing:
        return Const(absorbing, "bool")
    return _keep(e.a, e) if e.a.dtype == "bool" else None


def _recombine(e: BinOp, ctx: _Ctx) -> Optional[Expr]:
    """(x / c) * c + x % c -> x (either order): C's division and remainder guarantee it
    for any integer x and c != 0 -- an index split into (row, column) and joined again."""
    if e.dtype not in INTS:
        return None
    for left, right in ((e.a, e.b), (e.b, e.a)):
        if not (isinstance(left, BinOp) and left.op == "*" and isinstance(left.a, BinOp)
                and left.a.op in _DIV and isinstance(right, BinOp) and right.op == "%"):
            continue
        x, c = left.a.a, left.a.b
        if _pos_const(c) is not None and left.b == c and right.a == x and right.b == c \
                and x.dtype == e.dtype:
            return x
    return None


_RULES: dict[str, list[Callable[[BinOp, _Ctx], Optional[Expr]]]] = {
    "+": [_fold, _commute, _reassociate, _identity, _recombine],
    "-": [_fold, _identity],
    "*": [_fold, _commute, _reassociate, _identity],
    "/": [_fold, _reassociate, _identity, _div_mod],
    "//": [_fold, _reassociate, _identity, _div_mod],
    "%": [_fold, _identity, _div_mod],
    "min": [_fold, _commute, _by_range], "max": [_fold, _commute, _by_range],
    "<": [_fold, _by_range], "<=": [_fold, _by_range], ">": [_fold, _by_range],
    ">=": [_fold, _by_range], "==": [_fold, _commute, _by_range],
    "!=": [_fold, _commute, _by_range],
    "&&": [_fold, _commute, _logic], "||": [_fold, _commute, _logic],
}


def _unop(e: UnOp) -> Optional[Expr]:
    a = e.a
    if e.op == "not":
        if isinstance(a, Const):
            return Const(not a.value, "bool")
        return a.a if isinstance(a, UnOp) and a.op == "not" else None
    if _is_int_const(a) and a.dtype in INTS:
        return _int_const(-int(a.value), a.dtype)
    return None


def _cast(e: Cast) -> Optional[Expr]:
    v = e.value
    if v.dtype == e.dtype:
        return v
    if _is_int_const(v) and v.dtype in INTS and e.dtype in INTS:
        return _int_const(int(v.value), e.dtype)
    return None


# the pass ------------------------------------------------------------------------------
def _is_empty(s: Optional[Stmt]) -> bool:
    return s is None or (isinstance(s, Seq) and not s.stmts)


def _is_block(s: Stmt) -> bool:
    """A Seq whose top level declares names: it must stay a scope of its own."""
    return isinstance(s, Seq) and any(isinstance(x, (Declare, Alloc)) for x in s.stmts)


def _as_block(s: Stmt) -> Stmt:
    """A statement that replaces a loop or branch in its parent, keeping its scope."""
    return Seq((s,)) if isinstance(s, (Declare, Alloc)) else s


_EMPTY = Seq(())


class _Simplify(Rewriter):
    def __init__(self) -> None:
        self.ctx = _Ctx()

    # expressions -------------------------------------------------------------------
    def visit_BinOp(self, e: BinOp) -> Expr:
        e = super().visit_BinOp(e)
        for rule in _RULES.get(e.op, ()):
            out = rule(e, self.ctx)
            if out is not None and effects(e) == effects(out):
                return self.expr(out)
        return e

    def visit_UnOp(self, e: UnOp) -> Expr:
        e = super().visit_UnOp(e)
        out = _unop(e)
        return e if out is None else self.expr(out)

    def visit_Cast(self, e: Cast) -> Expr:
        e = super().visit_Cast(e)
        out = _cast(e)
        return e if out is None else self.expr(out)

    def visit_Select(self, e: Select) -> Expr:
        e = super().visit_Select(e)
        if isinstance(e.cond, Const):
            return _keep(e.a if e.cond.value else e.b, e)
        return e

    # statements --------------------------------------------------------------------
    def visit_Seq(self, s: Seq) -> Stmt:
        new: list[Stmt] = []
        for x in s.stmts:
            y = self.stmt(x)
            if isinstance(y, Seq) and not _is_block(y):
                new.extend(y.stmts)
            elif not _is_empty(y):
                new.append(y)
        if len(new) == 1 and not isinstance(new[0], (Declare, Alloc)):
            return new[0]
        if len(new) == len(s.stmts) and all(a is b for a, b in zip(new, s.stmts)):
            return s
        return Seq(tuple(new))

    def visit_For(self, s: For) -> Stmt:
        extent = self.expr(s.extent)
        if isinstance(extent, Const) and int(extent.value) <= 0:
            return _EMPTY
        if isinstance(extent, Const) and int(extent.value) == 1:
            body = substitute(s.body, {s.var: Const(0, s.var.dtype)})
            return _as_block(self.stmt(body))
        hi = self.ctx.range_of(extent)[1]
        body = self._with_ranges({s.var: (0, None if hi is None else hi - 1)}, s.body)
        if _is_empty(body) and not effects(extent):
            return _EMPTY
        if extent is s.extent and body is s.body:
            return s
        return For(s.var, extent, body, s.kind)

    def _with_ranges(self, ranges: dict[Var, Range], body: Stmt) -> Stmt:
        saved = dict(self.ctx.ranges)
        self.ctx.ranges.update(ranges)
        try:
            return self.stmt(body)
        finally:
            self.ctx.ranges = saved

    def visit_MapFor(self, s: MapFor) -> Stmt:
        worker = self.expr(s.worker)
        body = self._with_ranges({v: (0, extent - 1) for v, extent in
                                  zip(s.vars, s.mapping.task_shape)}, s.body)
        if worker is s.worker and body is s.body:
            return s
        return MapFor(s.vars, s.mapping, worker, body)

    def visit_If(self, s: If) -> Stmt:
        cond = self.expr(s.cond)
        if isinstance(cond, Const):
            chosen = s.then if cond.value else s.else_
            return _EMPTY if chosen is None else _as_block(self.stmt(chosen))
        then = self.stmt(s.then)
        else_ = None if s.else_ is None else self.stmt(s.else_)
        else_ = None if _is_empty(else_) else else_
        if _is_empty(then) and else_ is None:
            return Evaluate(cond) if effects(cond) else _EMPTY
        if _is_empty(then):
            return self.stmt(If(UnOp("not", cond), else_))
        if cond is s.cond and then is s.then and else_ is s.else_:
            return s
        return If(cond, then, else_)


def simplify(fn: Function) -> Function:
    """Simplify `fn` (see the module docstring); returns `fn` itself when nothing changes."""
    rw = _Simplify()
    rw.ctx.ranges.update(builtin_ranges(fn))
    return rw.function(fn)


def simplify_expr(e: Expr, ranges: Optional[dict[Var, Range]] = None) -> Expr:
    """Simplify one expression, with optional known [lo, hi] ranges of variables."""
    rw = _Simplify()
    rw.ctx.ranges.update(ranges or {})
    return rw.expr(e)
