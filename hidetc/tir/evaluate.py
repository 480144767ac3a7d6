"""A slow reference interpreter of the tensor-program IR, for tests and reasoning.

`run_function(fn, args)` executes a Function on numpy arrays (Buffer params, mutated in
place) and Python scalars (Var params). Semantics are those the C printer implements:

- integers are Python ints; `/`, `//` and `%` on integers truncate toward zero (C); a
  Cast between integer types wraps modulo 2^W (C's conversion, two's complement);
- `Call("bitcast", (x,), dst)` is the numpy view of x's bits (`compute.bitcast`);
- floats are numpy scalars of their dtype, so float32 arithmetic rounds like C's float
  (without contraction; we build with -ffp-contract=off); `%` on floats is C's fmod and
  `//` on floats is rejected (use `call("floor", a / b)` or `call("trunc", ...)`);
- `min`/`max` propagate NaN like numpy.minimum/maximum;
- a `MapFor` runs the tasks `mapping.tasks_of(worker)` in order -- the *definition* of
  a task mapping, independent of `mapping.emit`, so running a function before and after
  `lower_mappings` checks the lowering;
- a Load/Store with one index on an n-d buffer indexes the flattened (row-major) array,
  which is what `flatten_buffers` produces; local/shared Allocs are zero-filled arrays.

Assumes a function that passes `verify_function`. Guarantees nothing about speed.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from hidetc.graph.dtypes import reference_bitcast
from hidetc.tir.ir import (
    FLOATS,
    INTS,
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


def c_div(a: int, b: int) -> int:
    """Integer division truncating toward zero, as in C."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def c_mod(a: int, b: int) -> int:
    """Integer remainder with the sign of the dividend, as in C (a == b*c_div(a,b) + r)."""
    return a - b * c_div(a, b)


def convert(value: Any, dtype: str) -> Any:
    """A Python/numpy value as the interpreter represents `dtype`."""
    if dtype == "bool":
        return bool(value)
    if dtype in INTS:
        return int(value)
    if dtype in FLOATS:
        return np.dtype(dtype).type(value)
    raise TypeError(f"no value of dtype {dtype}")


def _wrap(v: int, dtype: str) -> int:
    """An integer converted to `dtype` as C does: modulo 2^W (two's complement for the
    signed types, as gcc and nvcc define it)."""
    bits = np.iinfo(dtype).bits
    v &= (1 << bits) - 1
    return v - (1 << bits) if dtype.startswith("int") and v >> (bits - 1) else v


def _float_binop(op: str, a, b):
    if op == "//":
        raise TypeError("'//' on floats is not defined in the IR; use floor/trunc calls")
    if op == "%":
        return np.fmod(a, b)
    if op == "/":
        with np.errstate(divide="ignore", invalid="ignore"):
            return a / b
    return _ARITH[op](a, b)


_ARITH: dict[str, Callable[[Any, Any], Any]] = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "min": lambda a, b: np.minimum(a, b) if isinstance(a, np.generic) else min(a, b),
    "max": lambda a, b: np.maximum(a, b) if isinstance(a, np.generic) else max(a, b),
}
_INT_ONLY: dict[str, Callable[[int, int], int]] = {"/": c_div, "//": c_div, "%": c_mod}
_CMP: dict[str, Callable[[Any, Any], bool]] = {
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
}


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-x))


def _erf(x):
    return math.erf(float(x))


# name -> function on one numpy scalar (or two); the result is converted to the dtype.
MATH_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1, "log": np.log, "log2": np.log2,
    "log10": np.log10, "log1p": np.log1p, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
    "erf": _erf, "tanh": np.tanh, "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh,
    "acosh": np.arccosh, "atanh": np.arctanh, "pow": np.power, "abs": np.abs,
    "floor": np.floor, "ceil": np.ceil, "round": np.rint, "trunc": np.trunc, "sin": np.sin,
    "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "atan2": np.arctan2, "fmod": np.fmod, "sigmoid": _sigmoid, "isnan": np.isnan,
    "isinf": np.isinf, "fma": lambda a, b, c: np.float64(a) * np.float64(b) + np.float64(c),
}


def _checked(buf: Buffer, idx: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    if len(idx) != len(shape) or any(i < 0 or i >= n for i, n in zip(idx, shape)):
        raise IndexError(f"{buf.name}{list(idx)} is out of bounds of shape {list(shape)}")
    return idx


class Interpreter:
    """Holds variable values and buffer arrays while running one Function."""

    def __init__(self) -> None:
        self.env: dict[Var, Any] = {}
        self.arrays: dict[Buffer, np.ndarray] = {}

    # expressions -------------------------------------------------------------------
    def expr(self, e: Expr) -> Any:
        return _EXPR_EVAL[type(e)](self, e)

    def _var(self, e: Var) -> Any:
        if e not in self.env:
            raise NameError(f"variable {e.name} has no value")
        return self.env[e]

    def _binop(self, e: BinOp) -> Any:
        if e.op == "&&":
            return bool(self.expr(e.a)) and bool(self.expr(e.b))
        if e.op == "||":
            return bool(self.expr(e.a)) or bool(self.expr(e.b))
        a, b = self.expr(e.a), self.expr(e.b)
        if e.op in _CMP:
            return bool(_CMP[e.op](a, b))
        dtype = e.dtype
        a, b = convert(a, dtype), convert(b, dtype)
        if dtype in FLOATS:
            with np.errstate(all="ignore"):
                return convert(_float_binop(e.op, a, b), dtype)
        fn = _INT_ONLY.get(e.op) or _ARITH[e.op]
        return convert(fn(a, b), dtype)

    def _unop(self, e: UnOp) -> Any:
        a = self.expr(e.a)
        return (not a) if e.op == "not" else convert(-a, e.dtype)

    def _call(self, e: Call) -> Any:
        if e.func == "bitcast":
            src = e.args[0].dtype
            value = np.array(convert(self.expr(e.args[0]), src), dtype=np.dtype(src))
            return convert(reference_bitcast(value, e.dtype)[()], e.dtype)
        fn = MATH_FUNCTIONS.get(e.func)
        if fn is None:
            raise NotImplementedError(f"the interpreter has no function {e.func!r}")
        args = [self.expr(a) for a in e.args]
        if e.dtype in FLOATS:
            args = [convert(a, e.dtype) for a in args]
        with np.errstate(all="ignore"):
            return convert(fn(*args), e.dtype)

    def _cast(self, e: Cast) -> Any:
        v = self.expr(e.value)
        if e.dtype in INTS and isinstance(v, np.floating):
            v = math.trunc(float(v))
        elif e.dtype in INTS and e.value.dtype in INTS:
            v = _wrap(int(v), e.dtype)
        return convert(v, e.dtype)

    def _select(self, e: Select) -> Any:
        chosen = e.a if self.expr(e.cond) else e.b
        return convert(self.expr(chosen), e.dtype)

    def _load(self, e: Load) -> Any:
        arr = self._array(e.buffer, len(e.indices))
        idx = _checked(e.buffer, tuple(self.expr(i) for i in e.indices), arr.shape)
        return convert(arr[idx], e.buffer.dtype)

    def _array(self, buf: Buffer, nidx: int) -> np.ndarray:
        arr = self.arrays.get(buf)
        if arr is None:
            raise NameError(f"buffer {buf.name} is not bound")
        return arr.reshape(-1) if nidx == 1 and arr.ndim != 1 else arr

    # statements --------------------------------------------------------------------
    def stmt(self, s: Stmt) -> None:
        _STMT_EVAL[type(s)](self, s)

    def _store(self, s: Store) -> None:
        arr = self._array(s.buffer, len(s.indices))
        idx = _checked(s.buffer, tuple(self.expr(i) for i in s.indices), arr.shape)
        arr[idx] = self.expr(s.value)

    def _seq(self, s: Seq) -> None:
        for x in s.stmts:
            self.stmt(x)

    def _for(self, s: For) -> None:
        for i in range(self.expr(s.extent)):
            self.env[s.var] = i
            self.stmt(s.body)

    def _mapfor(self, s: MapFor) -> None:
        for task in s.mapping.tasks_of(self.expr(s.worker)):
            self.env.update(zip(s.vars, task))
            self.stmt(s.body)

    def _if(self, s: If) -> None:
        if self.expr(s.cond):
            self.stmt(s.then)
        elif s.else_ is not None:
            self.stmt(s.else_)

    def _declare(self, s: Declare) -> None:
        self.env[s.var] = None if s.init is None else convert(self.expr(s.init), s.var.dtype)

    def _assign(self, s: Assign) -> None:
        self.env[s.var] = convert(self.expr(s.value), s.var.dtype)

    def _alloc(self, s: Alloc) -> None:
        shape = tuple(self._dim(d) for d in s.buffer.shape)
        self.arrays[s.buffer] = np.zeros(shape, dtype=s.buffer.dtype)

    def _dim(self, d: Any) -> int:
        return int(self.expr(d)) if isinstance(d, Expr) else int(d)

    def bind_params(self, fn: Function, args: Sequence[Any]) -> None:
        if len(args) != len(fn.params):
            raise TypeError(f"{fn.name} takes {len(fn.params)} arguments, got {len(args)}")
        for p, a in zip(fn.params, args):
            if isinstance(p, Var):
                self.env[p] = convert(a, p.dtype)
        for p, a in zip(fn.params, args):
            if isinstance(p, Buffer):
                self._bind_buffer(p, a)

    def _bind_buffer(self, p: Buffer, a: Any) -> None:
        shape = tuple(self._dim(d) for d in p.shape)
        if not isinstance(a, np.ndarray) or a.shape != shape or a.dtype != np.dtype(p.dtype):
            got = (getattr(a, "dtype", type(a).__name__), getattr(a, "shape", None))
            raise TypeError(f"buffer {p.name} wants {p.dtype}{list(shape)}, got {got}")
        if not a.flags.c_contiguous:
            raise TypeError(f"buffer {p.name} must be C-contiguous")
        self.arrays[p] = a


_EXPR_EVAL: dict[type, Callable[[Interpreter, Any], Any]] = {
    Var: Interpreter._var,
    Const: lambda self, e: convert(e.value, e.dtype),
    BinOp: Interpreter._binop,
    UnOp: Interpreter._unop,
    Call: Interpreter._call,
    Cast: Interpreter._cast,
    Select: Interpreter._select,
    Load: Interpreter._load,
}

_STMT_EVAL: dict[type, Callable[[Interpreter, Any], None]] = {
    Store: Interpreter._store,
    Seq: Interpreter._seq,
    For: Interpreter._for,
    MapFor: Interpreter._mapfor,
    If: Interpreter._if,
    Declare: Interpreter._declare,
    Assign: Interpreter._assign,
    Alloc: Interpreter._alloc,
    Evaluate: lambda self, s: self.expr(s.expr),
}


def run_function(fn: Function, args: Sequence[Any]) -> None:
    """Execute `fn`; Buffer arguments (numpy arrays of the exact shape and dtype) are
    updated in place."""
    interp = Interpreter()
    interp.bind_params(fn, args)
    interp.stmt(fn.body)


def evaluate_expr(e: Expr, env: dict[Var, Any] | None = None) -> Any:
    """The value of `e` with variables bound by `env` (no buffers)."""
    interp = Interpreter()
    interp.env.update(env or {})
    return interp.expr(e)
