"""Tensor-program IR: expressions, statements, buffers and functions.

Nodes are frozen, slotted dataclasses with structural equality; children live in
tuples. Expressions overload arithmetic (`a + b`, `a * 4`, `a // b`, `a % b`, `-a`) and
ordering comparisons (`a < b`); equality and logic are functions (`eq`, `ne`,
`logical_and`, `logical_or`, `logical_not`) because `==` is structural equality.

Buffers are n-dimensional and row-major; `Load`/`Store` take one index per dimension
until the `flatten_buffers` pass rewrites them to one flat index. `MapFor` (a loop
over the tasks a task mapping assigns to one worker) exists until `lower_mappings`
turns it into `For` loops and index arithmetic.

Scalar dtypes are numpy dtype names ("float32", "int32", "bool", ...) plus "void".
Index arithmetic is int32 unless a buffer or an extent needs more: an int past int32's
range becomes an int64 Const (`as_expr`), a loop over such an extent gets an int64
variable (the builder), and flattening casts the indices of a buffer of 2**31 or more
elements to int64 (`flatten_buffers`); int64 then spreads by promotion.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from hidetc.graph.symbolic import SymDim

INDEX_DTYPE = "int32"
ARITH_OPS = ("+", "-", "*", "/", "//", "%", "min", "max")
CMP_OPS = ("<", "<=", ">", ">=", "==", "!=")
LOGIC_OPS = ("&&", "||")
FLOATS = ("float16", "bfloat16", "float32", "float64")
INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_RANK = {d: i for i, d in enumerate(("bool",) + INTS + FLOATS)}


class Expr:
    """Base of all expressions; gives operator sugar. Subclasses define `dtype`."""
    __slots__ = ()

    def __add__(self, o): return BinOp("+", self, as_expr(o, self))
    def __radd__(self, o): return BinOp("+", as_expr(o, self), self)
    def __sub__(self, o): return BinOp("-", self, as_expr(o, self))
    def __rsub__(self, o): return BinOp("-", as_expr(o, self), self)
    def __mul__(self, o): return BinOp("*", self, as_expr(o, self))
    def __rmul__(self, o): return BinOp("*", as_expr(o, self), self)
    def __truediv__(self, o): return BinOp("/", self, as_expr(o, self))
    def __rtruediv__(self, o): return BinOp("/", as_expr(o, self), self)
    def __floordiv__(self, o): return BinOp("//", self, as_expr(o, self))
    def __rfloordiv__(self, o): return BinOp("//", as_expr(o, self), self)
    def __mod__(self, o): return BinOp("%", self, as_expr(o, self))
    def __rmod__(self, o): return BinOp("%", as_expr(o, self), self)
    def __neg__(self): return UnOp("neg", self)
    def __lt__(self, o): return BinOp("<", self, as_expr(o, self))
    def __le__(self, o): return BinOp("<=", self, as_expr(o, self))
    def __gt__(self, o): return BinOp(">", self, as_expr(o, self))
    def __ge__(self, o): return BinOp(">=", self, as_expr(o, self))


ExprLike = Union[Expr, int, float, bool]


def promote(a: str, b: str) -> str:
    """The dtype of an arithmetic result: the higher of the two ranks (bool < ints < floats)."""
    return a if _RANK.get(a, 0) >= _RANK.get(b, 0) else b


@dataclass(frozen=True, slots=True)
class Var(Expr):
    name: str
    dtype: str = INDEX_DTYPE


@dataclass(frozen=True, slots=True)
class Const(Expr):
    value: Any
    dtype: str


@dataclass(frozen=True, slots=True)
class BinOp(Expr):
    op: str
    a: Expr
    b: Expr

    @property
    def dtype(self) -> str:
        if self.op in CMP_OPS or self.op in LOGIC_OPS:
            return "bool"
        return promote(self.a.dtype, self.b.dtype)


@dataclass(frozen=True, slots=True)
class UnOp(Expr):
    op: str  # "neg" | "not"
    a: Expr

    @property
    def dtype(self) -> str:
        return "bool" if self.op == "not" else self.a.dtype


@dataclass(frozen=True, slots=True)
class Call(Expr):
    """A math intrinsic or device function by name; the printer maps names per target."""
    func: str
    args: tuple[Expr, ...]
    dtype: str


@dataclass(frozen=True, slots=True)
class Cast(Expr):
    value: Expr
    dtype: str


@dataclass(frozen=True, slots=True)
class Select(Expr):
    cond: Expr
    a: Expr
    b: Expr

    @property
    def dtype(self) -> str:
        return promote(self.a.dtype, self.b.dtype)


@dataclass(frozen=True, slots=True)
class Buffer:
    """A named n-d array. scope: "global" (kernel parameter), "shared", or "local"."""
    name: str
    dtype: str
    shape: tuple[Any, ...]  # ints or index Exprs
    scope: str = "global"

    def __post_init__(self):
        if any(isinstance(d, SymDim) for d in self.shape):   # symbolic sizes: their Exprs
            object.__setattr__(self, "shape", tuple(
                size_expr(d) if isinstance(d, SymDim) else d for d in self.shape))

    def __getitem__(self, idx) -> "Load":
        idx = idx if isinstance(idx, tuple) else (idx,)
        return Load(self, tuple(as_expr(i) for i in idx))


@dataclass(frozen=True, slots=True)
class Load(Expr):
    buffer: Buffer
    indices: tuple[Expr, ...]

    @property
    def dtype(self) -> str:
        return self.buffer.dtype


class Stmt:
    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Store(Stmt):
    buffer: Buffer
    indices: tuple[Expr, ...]
    value: Expr


@dataclass(frozen=True, slots=True)
class Seq(Stmt):
    stmts: tuple[Stmt, ...]


@dataclass(frozen=True, slots=True)
class For(Stmt):
    """`for var in range(extent)`; kind: "serial" | "parallel" (OpenMP) | "unroll" |
    "rolled" (kept a loop though its extent is a constant: what bounds the loads a
    compiler may hoist from later iterations, and so the registers they take)."""
    var: Var
    extent: Expr
    body: Stmt
    kind: str = "serial"


@dataclass(frozen=True, slots=True)
class MapFor(Stmt):
    """`for vars in mapping.on(worker)`: the tasks `mapping` gives to `worker`."""
    vars: tuple[Var, ...]
    mapping: Any  # hidetc.tir.mapping.TaskMapping (kept untyped to avoid a cycle)
    worker: Expr
    body: Stmt


@dataclass(frozen=True, slots=True)
class If(Stmt):
    cond: Expr
    then: Stmt
    else_: Stmt | None = None


@dataclass(frozen=True, slots=True)
class Declare(Stmt):
    """Declare a mutable scalar variable, visible until the end of the enclosing block."""
    var: Var
    init: Expr | None = None


@dataclass(frozen=True, slots=True)
class Assign(Stmt):
    var: Var
    value: Expr


@dataclass(frozen=True, slots=True)
class Alloc(Stmt):
    """Declare a local or shared buffer, visible until the end of the enclosing block."""
    buffer: Buffer


@dataclass(frozen=True, slots=True)
class Evaluate(Stmt):
    expr: Expr


@dataclass(frozen=True, slots=True)
class Function:
    """A kernel. params: global Buffers and scalar Vars, in ABI order.
    attrs: ("target", "cpu"|"cuda"), and for CUDA ("grid", (x,y,z)), ("block", (x,y,z))."""
    name: str
    params: tuple[Union[Buffer, Var], ...]
    body: Stmt
    attrs: tuple[tuple[str, Any], ...] = ()

    def attr(self, key: str, default: Any = None) -> Any:
        return dict(self.attrs).get(key, default)


SIZE_PREFIX = "sym_"      # a symbolic size's variable: `sym_seq`, an int64 kernel parameter
SIZE_DTYPE = "int64"


def size_var(symbol: str) -> Var:
    """The kernel variable holding the symbolic size `symbol` at run time."""
    return Var(SIZE_PREFIX + symbol, SIZE_DTYPE)


def is_size_var(var: Var) -> bool:
    return var.name.startswith(SIZE_PREFIX) and var.dtype == SIZE_DTYPE


def size_expr(dim: SymDim) -> Expr:
    """A symbolic size (`hidetc.graph.symbolic.SymDim`) as an int64 expression of its
    size variables: the kernel computes its extents from the sizes it is passed."""
    total: Expr | None = None
    for mono, coef in dim.terms:
        term: Expr = Const(coef, SIZE_DTYPE)
        for atom in mono:
            factor = size_var(atom) if isinstance(atom, str) else \
                BinOp("//", size_expr(atom.num), Const(atom.den, SIZE_DTYPE))
            term = factor if coef == 1 and term == Const(1, SIZE_DTYPE) else \
                BinOp("*", term, factor)
        total = term if total is None else BinOp("+", total, term)
    return total if total is not None else Const(0, SIZE_DTYPE)


def size_dim(e: Any) -> Any:
    """The inverse of `size_expr`: an extent Expr built from size variables, int constants,
    `+`, `-`, `*` and `//` by a constant, as a `SymDim` (or an int); any other value is
    returned as it is (a caller comparing shapes then sees it equal only to itself)."""
    if isinstance(e, Const) and isinstance(e.value, int):
        return int(e.value)
    if isinstance(e, Var) and is_size_var(e):
        return SymDim.symbol(e.name[len(SIZE_PREFIX):])
    if isinstance(e, BinOp) and e.op in ("+", "-", "*", "//"):
        a, b = size_dim(e.a), size_dim(e.b)
        if isinstance(a, (int, SymDim)) and isinstance(b, (int, SymDim)):
            if e.op == "+":
                return a + b
            if e.op == "-":
                return a - b
            if e.op == "*":
                return a * b
            if isinstance(b, int) and b > 0:
                return a // b
    return e


def index_const(value: Any, dtype: str = INDEX_DTYPE) -> Expr:
    """A size as an index expression of `dtype`: a Const, or a symbolic size's
    expression cast to it."""
    if isinstance(value, SymDim):
        return cast(size_expr(value), dtype)
    return Const(value, dtype)


def as_expr(value: ExprLike, like: Expr | None = None) -> Expr:
    """Wrap a Python scalar as a Const; ints take the index dtype or `like`'s int dtype;
    a symbolic size becomes its int64 expression (`size_expr`)."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, SymDim):
        return size_expr(value)
    if isinstance(value, bool):
        return Const(value, "bool")
    if isinstance(value, int):
        dtype = like.dtype if like is not None and like.dtype in INTS else INDEX_DTYPE
        if like is not None and like.dtype in FLOATS:
            return Const(float(value), like.dtype)
        if dtype == INDEX_DTYPE and not -2 ** 31 <= value < 2 ** 31:
            dtype = "int64"            # an extent or offset past int32: index in int64
        return Const(value, dtype)
    if isinstance(value, float):
        dtype = like.dtype if like is not None and like.dtype in FLOATS else "float32"
        return Const(value, dtype)
    raise TypeError(f"cannot make an expression from {type(value).__name__}")


def const(value: Any, dtype: str) -> Const:
    return Const(value, dtype)


def eq(a: ExprLike, b: ExprLike) -> BinOp:
    a = as_expr(a)
    return BinOp("==", a, as_expr(b, a))


def ne(a: ExprLike, b: ExprLike) -> BinOp:
    a = as_expr(a)
    return BinOp("!=", a, as_expr(b, a))


def logical_and(*conds: ExprLike) -> Expr:
    exprs = [as_expr(c) for c in conds]
    if not exprs:
        return Const(True, "bool")
    out = exprs[0]
    for c in exprs[1:]:
        out = BinOp("&&", out, c)
    return out


def logical_or(a: ExprLike, b: ExprLike) -> BinOp:
    return BinOp("||", as_expr(a), as_expr(b))


def logical_not(a: ExprLike) -> UnOp:
    return UnOp("not", as_expr(a))


def minimum(a: ExprLike, b: ExprLike) -> BinOp:
    a = as_expr(a)
    return BinOp("min", a, as_expr(b, a))


def maximum(a: ExprLike, b: ExprLike) -> BinOp:
    a = as_expr(a)
    return BinOp("max", a, as_expr(b, a))


def call(func: str, *args: ExprLike, dtype: str | None = None) -> Call:
    exprs = tuple(as_expr(a) for a in args)
    return Call(func, exprs, dtype or (exprs[0].dtype if exprs else "void"))


def cast(value: ExprLike, dtype: str) -> Expr:
    value = as_expr(value)
    return value if value.dtype == dtype else Cast(value, dtype)


def select(cond: ExprLike, a: ExprLike, b: ExprLike) -> Select:
    a = as_expr(a)
    return Select(as_expr(cond), a, as_expr(b, a))


def seq(*stmts: Stmt) -> Stmt:
    flat: list[Stmt] = []
    for s in stmts:
        if isinstance(s, Seq):
            flat.extend(s.stmts)
        elif s is not None:
            flat.append(s)
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


# CUDA built-ins (functions with target "cuda"). Index registers and intrinsics are
# Calls with CUDA's own names; the CUDA printer prints them as CUDA C, and the emulator
# header provides every one of them on the CPU. CPU printers reject them.
CUDA_INDEX = ("threadIdx", "blockIdx", "blockDim", "gridDim")


def thread_idx(dim: str = "x") -> Call:
    return Call(f"threadIdx.{dim}", (), INDEX_DTYPE)


def block_idx(dim: str = "x") -> Call:
    return Call(f"blockIdx.{dim}", (), INDEX_DTYPE)


def block_dim(dim: str = "x") -> Call:
    return Call(f"blockDim.{dim}", (), INDEX_DTYPE)


def grid_dim(dim: str = "x") -> Call:
    return Call(f"gridDim.{dim}", (), INDEX_DTYPE)


def syncthreads() -> Evaluate:
    return Evaluate(Call("__syncthreads", (), "void"))
