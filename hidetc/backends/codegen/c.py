"""C printer for the cpu target: lowered, flattened, verified Functions -> one C99 unit.

ABI of each kernel `fn`:

    __attribute__((visibility("default")))
    void NAME(const float *restrict a, float *restrict out, int32_t n);

Parameters in `fn.params` order: a Buffer is a pointer to its first element (typed by
its dtype, `const` when the kernel never stores to it, `restrict`: callers must not
pass overlapping buffers -- except the parameters the function's `may_alias` attr names,
which may be one buffer: an in-place epilogue, `hidetc.fusion.graft`), a scalar Var is
passed by value in its C type. Kernels
return nothing. NAME is `fn.name` exactly (it must be a C identifier).

Lowering of the IR: `For(kind="parallel")` with a constant extent becomes an
`omp parallel` region on the shares-then-steal schedule of `c_types.PARALLEL_SOURCE`
(one contiguous share per thread, taken in chunks of extent / PARALLEL_CHUNKS, then
the others' leftovers from their back ends): the same thread gets the same rows in
kernel after kernel (cache locality a dynamic schedule loses), and a thread the OS
deschedules does not make the kernel wait for its share (as a static split would).
A run-time extent (an expression of size parameters) takes the same schedule with its
chunk computed at run time, in spans of 2^30 iterations (a share holds 32-bit bounds);
a constant extent of 2^31 or more gets `#pragma omp parallel for schedule(dynamic)`.
Kind "unroll" gets `#pragma GCC unroll N` (N = the constant extent, else 8), "rolled"
`#pragma GCC unroll 1`; `/`, `//` and `%` on
integers are C's (truncating); `%` on floats is fmod, `//` on floats is rejected;
`min`/`max` call static helpers that propagate NaN like numpy; a nested Seq is a
`{ }` block; a local Alloc is an aligned stack array when its size is a constant <=
STACK_ALLOC_LIMIT bytes (`c_scratch.stack_bytes` decides), else taken from the thread's
scratch stack (`hidetc_mem_NAME`, 63 bytes more; `c_scratch.SCRATCH_SOURCE`: kept across
calls, malloc where it does not fit yet) and given back at the end of its block, in
reverse order; both are 64-byte aligned (whole cache lines: the GEMM's packed rows must
not straddle lines).
Math Calls are mapped per argument dtype by `MATH_FUNCTIONS`, except float32 `exp`, `tanh`,
`erf` and `log`, which call the vectorizable inline helpers of `hidetc.backends.codegen.c_math`
(`FAST_FLOAT32`; their C is part of every module's helpers, and they are within 1-2 ulp,
see that module) instead of glibc's scalar functions, which keep a loop from
vectorizing; the float32 sigmoid helper uses `hidetc_expf` too. Constants print exactly:
float32 as the shortest decimal that round-trips with an `f` suffix, float64 as
Python's repr, non-finite values as INFINITY/NAN; int64/uint* with suffixes.

x86 vector intrinsics (the registry's printer "c" records, `hidetc.tir.intrinsics`, for
the CPU micro-kernels): the dtypes "float32x8" / "float32x16" are `__m256` / `__m512`; a
registered Call prints as that AVX2/FMA or AVX-512F intrinsic (or gcc built-in), its
pointer operands (the record's `address_args`) as `&buf[i]` of the Load written there
(an unregistered `_mm`/`__` name is a ValueError); a module using any gets `#include
<immintrin.h>` (gcc builds with the ISA's flags, `hidetc.cpu_isa`). They
compute exactly what they say (`_mm256_fmadd_ps` is the fused multiply-add,
`_mm256_add_ps` a rounded add), so `-ffp-contract=off` semantics hold.

Half types (`CPU_TYPES`, not in the `C_TYPES` shared with the CUDA printer): float16 is
gcc's `_Float16` (arithmetic emulated in float; gcc keeps the excess precision within an
expression, so each float16 BinOp is printed `((_Float16)(a op b))`, rounding every
operation as numpy does); bfloat16 is stored as its uint16_t bits, every operation
computed in float (`hidetc_bf2f`) and rounded back to nearest even (`hidetc_f2bf`, NaN
kept). Math Calls on either call the float32 function on widened arguments and round
the result; constants print exactly. Narrow types (`hidetc.compute.narrow_types`) are
uint8_t bytes: a Call of one of its conversion helpers prints as itself (their C is in
every module's helpers), a plain Cast from a narrow type decodes it, a plain Cast to one
is refused (it needs the ONNX Cast attributes: `narrow_types.convert`).
Types, constants and the helper functions every unit carries: `hidetc.backends.codegen.c_types`.
Identifiers that collide with C keywords or the library names used here get a `_`
suffix. Assumes `hidetc.tir.pipeline.lower` ran (it verifies).
"""
from __future__ import annotations

import math
import re
from typing import Optional, Sequence

import numpy as np

from hidetc.backends.codegen.c_amx import AMX_PRELUDE
from hidetc.backends.codegen.c_bf16 import BF16_SOURCE
from hidetc.backends.codegen.c_int8 import INT8_SOURCE
from hidetc.backends.codegen.c_math import FAST_FLOAT32
from hidetc.backends.codegen.c_scratch import stack_bytes
from hidetc.backends.codegen.c_types import (  # noqa: F401  (re-exported: the CUDA printer, tests)
    C_TYPES,
    CPU_TYPES,
    HALF,
    c_type,
    const_text,
    helpers_source,
)
from hidetc.compute.bitcast import bits_text
from hidetc.compute.narrow_types import C_FUNCTIONS as NARROW_FUNCTIONS
from hidetc.compute.narrow_types import NARROW_DTYPES, cast_function
from hidetc.compute.narrow_types import decode as narrow_decode
from hidetc.tir import intrinsics
from hidetc.tir.functor import collect
from hidetc.tir.ir import (
    FLOATS,
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
    Select,
    Seq,
    Stmt,
    Store,
    UnOp,
    Var,
)

UNROLL_DEFAULT = 8

_LIBM = ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "erf", "tanh",
         "sinh", "cosh", "asinh", "acosh", "atanh", "pow", "floor", "ceil", "trunc", "sin",
         "cos", "tan", "asin", "acos", "atan", "atan2", "fmod", "fma")
_FLOAT_EXTRA = {"abs": "fabs", "round": "rint", "sigmoid": "hidetc_sigmoid",
                "rsqrt": "hidetc_rsqrt"}
_CLASSIFY = {"isnan": "isnan", "isinf": "isinf"}  # type-generic macros


VECTOR_TYPES = {"float32x8": "__m256", "float32x16": "__m512"}


def _float_table(suffix: str, tag: str) -> dict[str, str]:
    table = {f: f + suffix for f in _LIBM}
    table.update({k: (v + "_" + tag if v.startswith("hidetc_") else v + suffix)
                  for k, v in _FLOAT_EXTRA.items()})
    table.update(_CLASSIFY)
    return table


# IR function name -> C function, per dtype of the first argument.
MATH_FUNCTIONS: dict[str, dict[str, str]] = {
    "float32": _float_table("f", "float32"),
    "float64": _float_table("", "float64"),
    "int8": {"abs": "abs"}, "int16": {"abs": "abs"}, "int32": {"abs": "abs"},
    "int64": {"abs": "llabs"},
}

_HEADER = """\
/* generated by hidetc (cpu target, C99) */
#include <stdint.h>
#include <stdbool.h>
#include <stdlib.h>
#include <math.h>
#include <pthread.h>
#ifdef _OPENMP
#include <omp.h>
#endif
"""

_C_KEYWORDS = frozenset("""auto break case char const continue default do double else enum
extern float for goto if inline int long register restrict return short signed sizeof
static struct switch typedef union unsigned void volatile while bool true false NULL
malloc free abs llabs size_t main INFINITY NAN""".split())
_RESERVED = _C_KEYWORDS | frozenset(C_TYPES.values()) | frozenset(
    v for table in MATH_FUNCTIONS.values() for v in table.values())
PARALLEL_CHUNKS = 16   # chunks of a parallel loop (see the module docstring)
PARALLEL_SPAN = 1 << 30  # iterations per parallel region of a run-time extent
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def c_name(name: str) -> str:
    """A C identifier for an IR name (keywords and library names get a `_` suffix)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", name)
    if not name or name[0].isdigit():
        name = "v_" + name
    if name in _RESERVED or name.startswith("hidetc_"):
        name += "_"
    return name


# expressions -----------------------------------------------------------------------------
_PREC = {"||": 1, "&&": 2, "==": 3, "!=": 3, "<": 4, "<=": 4, ">": 4, ">=": 4,
         "+": 5, "-": 5, "*": 6, "/": 6, "//": 6, "%": 6}
_UNARY, _ATOM = 7, 8
PREC_UNARY, PREC_ATOM = _UNARY, _ATOM  # for printers that subclass CPrinter
_C_OP = {"//": "/"}


class CPrinter:
    """Prints one Function; `malloced` remembers which local buffers were malloc'ed.

    Per-target printers subclass it: node types dispatch through the class tables
    EXPR_PRINTERS / STMT_PRINTERS (type -> method name, so overrides are picked up), and
    types, identifiers, constants and loop pragmas go through `ctype`, `ident`,
    `const_str` and `loop_pragma`."""

    def __init__(self, fn: Function):
        self.fn = fn
        self.malloced: set[Buffer] = set()
        self.uses_x86 = False  # set when a registered C intrinsic was printed
        self.uses_bf16 = False  # set when a bf16 GEMM block (c_bf16) was printed
        self.uses_int8 = False  # set when an int8 GEMM block (c_int8) was printed
        self.scalars: dict[Buffer, str] = {}   # one-element inputs read into locals

    # per-target hooks --------------------------------------------------------------------
    def ctype(self, dtype: str) -> str:
        return VECTOR_TYPES.get(dtype) or c_type(dtype)

    def ident(self, name: str) -> str:
        return c_name(name)

    def const_str(self, c: Const) -> str:
        return const_text(c)

    def loop_pragma(self, s: For, ind: str) -> list[str]:
        if s.kind == "parallel" and self.fn.attr("serial", False):
            return []               # a launch too small to share (schedules.cpu.finish_kernel)
        if s.kind == "parallel":    # a constant extent prints as `_parallel_for` instead
            return [f"{ind}#pragma omp parallel for schedule(dynamic)"]
        if s.kind == "unroll":
            n = int(s.extent.value) if isinstance(s.extent, Const) else UNROLL_DEFAULT
            return [f"{ind}#pragma GCC unroll {max(1, min(n, 65534))}"]
        if s.kind == "rolled":
            return [f"{ind}#pragma GCC unroll 1"]
        return []

    # expressions -----------------------------------------------------------------------
    def expr(self, e: Expr) -> str:
        return self._expr(e)[0]

    def _expr(self, e: Expr) -> tuple[str, int]:
        fmt = self.EXPR_PRINTERS.get(type(e))
        if fmt is None:
            raise NotImplementedError(f"the C printer cannot print {type(e).__name__}")
        return getattr(self, fmt)(e)

    def _wrap(self, e: Expr, min_prec: int) -> str:
        text, prec = self._expr(e)
        return text if prec >= min_prec else f"({text})"

    def _binop(self, e: BinOp) -> tuple[str, int]:
        if e.op in ("min", "max"):
            self.ctype(e.dtype)
            return f"hidetc_{e.op}_{e.dtype}({self.expr(e.a)}, {self.expr(e.b)})", _ATOM
        if e.dtype in FLOATS and e.op in ("%", "//"):
            if e.op == "//":
                raise NotImplementedError("'//' on floats is not defined in the IR; use "
                                          "call('floor', a / b) or call('trunc', a / b)")
            return self._call(Call("fmod", (e.a, e.b), e.dtype))
        prec = _PREC[e.op]
        op = _C_OP.get(e.op, e.op)
        if "bfloat16" in (e.a.dtype, e.b.dtype):   # compute in float
            text = f"{self._widened(e.a, prec)} {op} {self._widened(e.b, prec + 1)}"
            return (f"hidetc_f2bf({text})", _ATOM) if e.dtype == "bfloat16" else (text, prec)
        text = f"{self._wrap(e.a, prec)} {op} {self._wrap(e.b, prec + 1)}"
        if e.dtype == "float16":   # round each operation (gcc keeps excess precision)
            return f"((_Float16)({text}))", _ATOM
        return text, prec

    def _widened(self, e: Expr, min_prec: int) -> str:
        """`e` as a C float when it is a bfloat16 (kept as uint16_t bits), else as is."""
        if e.dtype == "bfloat16":
            return f"hidetc_bf2f({self.expr(e)})"
        return self._wrap(e, min_prec)

    def _unop(self, e: UnOp) -> tuple[str, int]:
        inner = self._wrap(e.a, _UNARY)
        if e.op == "not":
            return f"!{inner}", _UNARY
        if e.dtype == "bfloat16":
            return f"hidetc_f2bf(-hidetc_bf2f({self.expr(e.a)}))", _ATOM
        return (f"-({inner})" if inner.startswith("-") else f"-{inner}"), _UNARY

    def _call(self, e: Call) -> tuple[str, int]:
        if e.func == "bitcast":
            return self._bitcast(e), _ATOM
        record = intrinsics.lookup(e.func, "c")
        if record is not None:
            self.uses_x86 = True
            self.uses_bf16 |= record.defined_in == "c_bf16"
            self.uses_int8 |= record.defined_in == "c_int8"
            return self._intrinsic_call(e, record.address_args), _ATOM
        if e.func in NARROW_FUNCTIONS:
            return f"{e.func}({', '.join(self.expr(a) for a in e.args)})", _ATOM
        if intrinsics.looks_intrinsic(e.func):
            intrinsics.require(e.func, "c")            # raises: unregistered
        arg_dtype = e.args[0].dtype if e.args else e.dtype
        if arg_dtype in HALF:
            return self._half_call(e)
        table = MATH_FUNCTIONS.get(arg_dtype, {})
        name = FAST_FLOAT32.get(e.func) if arg_dtype == "float32" else None
        name = name or table.get(e.func)
        if name is None:
            self.ctype(arg_dtype)
            raise NotImplementedError(f"no C function for {e.func!r} on {arg_dtype} "
                                      f"(known: {sorted(table)})")
        args = ", ".join(self.expr(a) for a in e.args)
        return f"{name}({args})", _ATOM

    def _bitcast(self, e: Call) -> str:
        (x,) = e.args
        return bits_text(x.dtype, e.dtype, self.expr(x), self.ctype)

    def _half_call(self, e: Call) -> tuple[str, int]:
        """A math function on float16/bfloat16: the float32 function on the widened
        arguments, its result rounded back to the half type."""
        wide = Call(e.func, tuple(Cast(a, "float32") if a.dtype in HALF else a
                                  for a in e.args),
                    "float32" if e.dtype in HALF else e.dtype)
        text = self._call(wide)[0]
        if e.dtype == "float16":
            return f"((_Float16){text})", _ATOM
        if e.dtype == "bfloat16":
            return f"hidetc_f2bf({text})", _ATOM
        return text, _ATOM

    def _intrinsic_call(self, e: Call, positions: tuple[int, ...]) -> str:
        """`func(args)` of a registered intrinsic, the operands at `positions` (its
        record's `address_args`) printed as `&buf[i]` of the Load written there."""
        args = []
        for i, a in enumerate(e.args):
            if i not in positions:
                args.append(self.expr(a))
            elif isinstance(a, Load):
                args.append(self._address(a))
            else:
                raise ValueError(f"{self.fn.name}: operand {i} of {e.func} is passed by "
                                 f"address and must be a buffer element (a Load), got "
                                 f"{type(a).__name__}")
        return f"{e.func}({', '.join(args)})"

    def _cast(self, e: Cast) -> tuple[str, int]:
        src, dst = e.value.dtype, e.dtype
        if src in NARROW_DTYPES or dst in NARROW_DTYPES:
            helper = cast_function(src, dst)
            if helper is None:
                raise NotImplementedError(f"a plain cast from {src} to {dst}: use "
                                          "hidetc.compute.narrow_types.convert")
            return self._cast(Cast(narrow_decode(e.value), dst))
        if dst == "bfloat16":
            value = self._widened(e.value, _UNARY)
            return f"hidetc_f2bf((float){value})", _ATOM
        if src == "bfloat16":
            return f"({self.ctype(dst)})hidetc_bf2f({self.expr(e.value)})", _UNARY
        return f"({self.ctype(e.dtype)}){self._wrap(e.value, _UNARY)}", _UNARY

    def _select(self, e: Select) -> tuple[str, int]:
        c, a, b = (self._wrap(x, _PREC["||"]) for x in (e.cond, e.a, e.b))
        return f"({c} ? {a} : {b})", _ATOM

    def _address(self, e: Load) -> str:
        """`&buf[i]`: an intrinsic's address operand (the buffer itself, never a
        `_scalar_locals` copy)."""
        return f"&{self.ident(e.buffer.name)}[{self._index(e.buffer, e.indices)}]"

    def _load(self, e: Load) -> tuple[str, int]:
        if e.buffer in self.scalars and len(e.indices) == 1 and \
                isinstance(e.indices[0], Const) and e.indices[0].value == 0:
            return self.scalars[e.buffer], _ATOM
        return f"{self.ident(e.buffer.name)}[{self._index(e.buffer, e.indices)}]", _ATOM

    def _index(self, buf: Buffer, indices: tuple[Expr, ...]) -> str:
        if len(indices) != 1:
            raise ValueError(f"{self.fn.name}: access to {buf.name} has {len(indices)} "
                             "indices; run hidetc.tir.pipeline.lower (flatten_buffers) first")
        return self.expr(indices[0])

    # statements ------------------------------------------------------------------------
    def block(self, s: Stmt, ind: str) -> list[str]:
        """The lines of a block's contents; frees what the block malloc'ed at its end."""
        top = s.stmts if isinstance(s, Seq) else (s,)
        lines: list[str] = []
        for x in top:
            if isinstance(x, Seq):
                lines += [f"{ind}{{"] + self.block(x, ind + "  ") + [f"{ind}}}"]
            else:
                lines += self.stmt(x, ind)
        for x in reversed(top):     # LIFO: the scratch stack pops in reverse
            if isinstance(x, Alloc) and x.buffer in self.malloced:
                lines.append(f"{ind}hidetc_scratch_pop(hidetc_mem_{self.ident(x.buffer.name)});")
        return lines

    def stmt(self, s: Stmt, ind: str) -> list[str]:
        fmt = self.STMT_PRINTERS.get(type(s))
        if fmt is None:
            raise NotImplementedError(f"the C printer cannot print {type(s).__name__} "
                                      "(run hidetc.tir.pipeline.lower first)")
        return getattr(self, fmt)(s, ind)

    def _store(self, s: Store, ind: str) -> list[str]:
        target = f"{self.ident(s.buffer.name)}[{self._index(s.buffer, s.indices)}]"
        return [f"{ind}{target} = {self.expr(s.value)};"]

    def _for(self, s: For, ind: str) -> list[str]:
        pragma = self.loop_pragma(s, ind)     # (a target without parallel loops raises)
        if s.kind == "parallel" and not self.fn.attr("serial", False):
            if not isinstance(s.extent, Const):
                return self._parallel_for_runtime(s, ind)
            if 0 < int(s.extent.value) < 2 ** 31:
                return self._parallel_for(s, ind)
        v = self.ident(s.var.name)
        head = (f"{ind}for ({self.ctype(s.var.dtype)} {v} = 0; {v} < "
                f"{self._wrap(s.extent, _PREC['<'] + 1)}; ++{v}) {{")
        return pragma + [head] + self.block(s.body, ind + "  ") + [f"{ind}}}"]

    def _parallel_for(self, s: For, ind: str) -> list[str]:
        """A parallel loop of constant extent on the shares-then-steal schedule of
        `c_types.PARALLEL_SOURCE` (chunks of extent / PARALLEL_CHUNKS)."""
        extent = int(s.extent.value)
        return [f"{ind}{{", *self._par_region(
            s, ind + "  ", f"{extent}u", f"{max(1, extent // PARALLEL_CHUNKS)}u"), f"{ind}}}"]

    def _parallel_for_runtime(self, s: For, ind: str) -> list[str]:
        """A parallel loop whose extent is known at run time only (a size parameter's
        expression) on the same schedule, chunks of extent / PARALLEL_CHUNKS computed at
        run time; the iteration space is taken in spans of PARALLEL_SPAN (one parallel
        region each) because a share holds 32-bit bounds."""
        i2, i3 = ind + "  ", ind + "    "
        return [f"{ind}{{",
                f"{i2}const int64_t hidetc_n = {self.expr(s.extent)};",
                f"{i2}for (int64_t hidetc_base = 0; hidetc_base < hidetc_n; "
                f"hidetc_base += {PARALLEL_SPAN}LL) {{",
                f"{i3}const int64_t hidetc_span = hidetc_n - hidetc_base < {PARALLEL_SPAN}LL"
                f" ? hidetc_n - hidetc_base : {PARALLEL_SPAN}LL;",
                *self._par_region(s, i3, "(uint64_t)hidetc_span",
                                  f"(uint64_t)hidetc_span / {PARALLEL_CHUNKS}u",
                                  "hidetc_base"),
                f"{i2}}}", f"{ind}}}"]

    def _par_region(self, s: For, ind: str, extent: str, chunk: str, base: str = ""
                    ) -> list[str]:
        """One parallel region running `s`'s body over `extent` iterations (C text) in
        chunks of `chunk`, its loop variable offset by `base` (C text; none: 0)."""
        v, t = self.ident(s.var.name), self.ctype(s.var.dtype)
        i2 = ind + "  "
        lo, hi = (f"({base} + hidetc_lo)", f"({base} + hidetc_hi)") if base else \
            ("hidetc_lo", "hidetc_hi")
        return [f"{ind}hidetc_par_t hidetc_par;",
                f"{ind}hidetc_par_init(&hidetc_par, {extent}, {chunk});",
                f"{ind}#pragma omp parallel", f"{ind}{{",
                f"{i2}int64_t hidetc_lo, hidetc_hi;",
                f"{i2}while (hidetc_par_next(&hidetc_par, &hidetc_lo, &hidetc_hi)) {{",
                f"{i2}  for ({t} {v} = ({t}){lo}; {v} < ({t}){hi}; ++{v}) {{",
                *self.block(s.body, i2 + "    "),
                f"{i2}  }}", f"{i2}}}", f"{ind}}}"]

    def _if(self, s: If, ind: str) -> list[str]:
        lines = [f"{ind}if ({self.expr(s.cond)}) {{"] + self.block(s.then, ind + "  ")
        if s.else_ is not None:
            lines += [f"{ind}}} else {{"] + self.block(s.else_, ind + "  ")
        return lines + [f"{ind}}}"]

    def _declare(self, s: Declare, ind: str) -> list[str]:
        init = "" if s.init is None else f" = {self.expr(s.init)}"
        return [f"{ind}{self.ctype(s.var.dtype)} {self.ident(s.var.name)}{init};"]

    def _alloc(self, s: Alloc, ind: str) -> list[str]:
        buf = s.buffer
        if buf.scope != "local":
            raise NotImplementedError(f"{buf.scope}-scope buffer {buf.name} on the cpu target")
        ctype, name = self.ctype(buf.dtype), self.ident(buf.name)
        on_stack = stack_bytes(buf)
        if on_stack is not None:
            numel = on_stack // np.dtype(buf.dtype).itemsize
            return [f"{ind}{ctype} {name}[{max(numel, 1)}] __attribute__((aligned(64)));"]
        dims = [d if isinstance(d, Expr) else Const(int(d), "int64") for d in buf.shape]
        size = " * ".join(f"(size_t)({self.expr(d)})" for d in dims) or "1"
        self.malloced.add(buf)
        raw = f"hidetc_mem_{name}"
        return [f"{ind}char *{raw} = hidetc_scratch_push(sizeof({ctype}) * {size} + 63);",
                f"{ind}{ctype} *restrict {name} = ({ctype} *)(((uintptr_t){raw} + 63) & "
                "~(uintptr_t)63);"]

    def _var(self, e: Var) -> tuple[str, int]:
        return self.ident(e.name), _ATOM

    def _const(self, e: Const) -> tuple[str, int]:
        return self.const_str(e), _ATOM

    def _seq(self, s: Seq, ind: str) -> list[str]:
        return [f"{ind}{{"] + self.block(s, ind + "  ") + [f"{ind}}}"]

    def _assign(self, s: Assign, ind: str) -> list[str]:
        return [f"{ind}{self.ident(s.var.name)} = {self.expr(s.value)};"]

    def _evaluate(self, s: Evaluate, ind: str) -> list[str]:
        return [f"{ind}(void)({self.expr(s.expr)});"]

    # dispatch tables: node type -> method name -------------------------------------------
    EXPR_PRINTERS: dict[type, str] = {
        Var: "_var", Const: "_const", BinOp: "_binop", UnOp: "_unop", Call: "_call",
        Cast: "_cast", Select: "_select", Load: "_load",
    }
    STMT_PRINTERS: dict[type, str] = {
        Store: "_store", Seq: "_seq", For: "_for", If: "_if", Declare: "_declare",
        Assign: "_assign", Alloc: "_alloc", Evaluate: "_evaluate",
    }

    # functions -------------------------------------------------------------------------
    def signature(self) -> str:
        fn = self.fn
        if not _IDENT.match(fn.name) or fn.name in _RESERVED:
            raise ValueError(f"function name {fn.name!r} is not a usable C identifier")
        stored = set(collect(fn).stores)
        shared = set(fn.attr("may_alias", ()))
        params = []
        for p in fn.params:
            if isinstance(p, Buffer):
                const = "" if p in stored else "const "
                qual = "" if p.name in shared else "restrict "
                params.append(f"{const}{self.ctype(p.dtype)} *{qual}{self.ident(p.name)}")
            else:
                params.append(f"{self.ctype(p.dtype)} {self.ident(p.name)}")
        return f"void {fn.name}({', '.join(params) or 'void'})"

    def function(self) -> str:
        fn = self.fn
        if fn.attr("target", "cpu") != "cpu":
            raise ValueError(f"{fn.name}: the C printer is for target cpu, got "
                             f"{fn.attr('target')!r}")
        if not fn.attr("flattened", False):
            raise ValueError(f"{fn.name} is not lowered: run hidetc.tir.pipeline.lower")
        lines = ['__attribute__((visibility("default")))', self.signature() + " {"]
        body = self.block(fn.body, "  ")
        if self.uses_int8:            # (see `_scalar_locals`: int8 kernels only, for now)
            lines += self._scalar_locals("  ")
            body = self.block(fn.body, "  ")
        return "\n".join(lines + body + ["}"]) + "\n"

    def _scalar_locals(self, ind: str) -> list[str]:
        """Each one-element input buffer (never stored to, not aliased: a fused
        neighbour's scale, zero point or bound) read once into a local at entry, its
        `x[0]` loads printed as the local: gcc otherwise reloads it on every iteration
        of a loop that stores through a byte pointer (a char store may alias anything,
        and gcc honours `restrict` on parameters only), which kept such loops -- a
        quantized model's A packing with a grafted prologue -- from vectorizing.
        Printed only for the int8 GEMM kernels: everywhere, it let gcc 12 vectorize and
        fully unroll small `c ? s : x[i]` loops, which it then miscompiled (the masked
        loads of every unrolled block reused the first block's mask: ONNX's expanded
        Clip tests got zeros); a general fix (selects printed without conditional
        loads) is future work."""
        stored = set(collect(self.fn).stores)
        shared = set(self.fn.attr("may_alias", ()))
        lines = []
        for p in self.fn.params:
            if not isinstance(p, Buffer) or p in stored or p.name in shared:
                continue
            if not all(isinstance(d, int) for d in p.shape) or math.prod(p.shape) != 1:
                continue
            if p.dtype not in C_TYPES or p.dtype in ("bool",):
                continue
            local = f"hidetc_s_{self.ident(p.name)}"
            self.scalars[p] = local
            lines.append(f"{ind}const {self.ctype(p.dtype)} {local} = {self.ident(p.name)}[0];")
        return lines


def print_c_function(fn: Function) -> str:
    """The C definition of one lowered cpu Function (see the module docstring)."""
    return CPrinter(fn).function()


_X86_HEADER = "#include <immintrin.h>\n"


def print_c_module(functions: Sequence[Function], prelude: str = "",
                   header: Optional[str] = None) -> str:
    """One C99 translation unit: includes, helpers, `prelude`, then every function."""
    printers = [CPrinter(fn) for fn in functions]
    bodies = [p.function() for p in printers]
    head = _HEADER if header is None else header
    if any(p.uses_x86 for p in printers):
        head += _X86_HEADER
    parts = [head, helpers_source()]
    if any(p.uses_bf16 or p.uses_int8 for p in printers):
        parts.append(AMX_PRELUDE)
    if any(p.uses_bf16 for p in printers):
        parts.append(BF16_SOURCE)
    if any(p.uses_int8 for p in printers):
        parts.append(INT8_SOURCE)
    if prelude:
        parts.append(prelude.rstrip("\n") + "\n")
    parts.extend(bodies)
    return "\n".join(parts)
