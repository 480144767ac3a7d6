"""CUDA C printer: lowered, flattened, verified Functions with target "cuda" -> one .cu.

The translation unit is `#include "hidetc_cuda.h"` (the device header in
`cuda_include/`, see CUDA_INCLUDE_DIR), the caller's prelude, every kernel, and, under
`#ifdef HIDETC_EMULATE`, one uniform entry per kernel for the emulator. A kernel prints as

    extern "C" __global__ void __launch_bounds__(THREADS)
    NAME(const float *__restrict__ a, float *__restrict__ out, int32_t n) { ... }

THREADS = prod(attr "block"). A Buffer parameter is a `__restrict__` pointer, `const`
unless the kernel stores to it or an intrinsic writes through it -- but for the
parameters the function's `may_alias` attr names (an output written over an input it
reads, `fusion.graft`), which lose `__restrict__`: nvcc turns a const restrict read
into `ld.global.nc`, which assumes the data does not change during the kernel. A
scalar is passed by value. The emulator entry is
`extern "C" void NAME_emu_entry(void **args)`: args[i] is the i-th parameter's pointer,
or a pointer to the scalar's value.

What the printer adds to the C printer (`hidetc.backends.codegen.c.CPrinter`, subclassed):
- built-ins: `Call("threadIdx.x")` etc. print as `(int32_t)threadIdx.x` (CUDA's are
  unsigned); the registered CUDA intrinsics (`hidetc.tir.intrinsics`, printer "cuda")
  print as calls (an unregistered `__`/`hidetc_`/`atomic` name is a ValueError); a void
  Call statement prints as `f(...);`.
- warp intrinsics (records with `warp_operands`): the IR gives the operands WITHOUT the mask
  and the printer passes the full mask `0xffffffffu`; with exactly one more operand,
  the first is the mask (and a shuffle's optional width needs an explicit mask).
- pointer operands (records' `address_args`): intrinsics that take addresses (atomics, vector
  copies, cp.async, ldmatrix, mma) get `&buf[i]` for the Load written at that position;
  `Call("address_of", (buf[i],))` is `&buf[i]` anywhere.
- buffers: shared Allocs print as `__shared__ __align__(16) T name[N];` (constant N)
  while a kernel's shared arrays fit static shared memory's 48 KiB; past that each is
  a pointer `T *name = (T *)(hidetc_smem + OFFSET)` into one dynamic shared array
  (`HIDETC_DYNAMIC_SHARED(hidetc_smem, BYTES)`, 16-byte aligned slices
  `HIDETC_SHARED_SLICE(T, name, N, hidetc_smem, OFFSET)`: a restrict pointer for nvcc,
  a reference to an array of N for the emulator, which bounds-checks it;
  `shared_layout`), and the launch passes BYTES (`dynamic_shared_bytes`: the manifest's
  `shared_bytes`; the runtime raises the kernel's limit above 48 KiB). Loads and stores
  of shared buffers print as `HIDETC_SLD(a, i)` / `HIDETC_SST(a, i, v)` (plain
  accesses for nvcc; the emulator's race check records them), address operands as
  plain `&a[i]`. Local Allocs
  print as `__align__(16) T name[N]; HIDETC_LOCAL_POISON(name);` (registers or local
  memory; the emulator fills them with poison, nvcc ignores it); loops of kind
  "unroll" get `#pragma unroll`, "rolled" `#pragma unroll 1`; kind "parallel" is a CPU
  notion and is rejected.
- float16 is `half` (cuda_fp16.h). Arithmetic on two halves uses the correctly rounded
  `__hadd_rn/__hsub_rn/__hmul_rn` and `hidetc_hdiv` (division in float, rounded once),
  comparisons `__hlt`... (`!=` is the unordered `__hneu`, like C), negation `__hneg`;
  math calls use the header's `hidetc_<fn>_float16`, which compute in float and round
  once. A half mixed with another dtype is converted explicitly to the promoted dtype
  (`__half2float`, `__float2half_rn`, `__double2half`); constants print as
  `__float2half_rn(<exact float>)`.
- bfloat16 is `__nv_bfloat16` (cuda_bf16.h). Every operation on it is computed in
  float and rounded once (`_in_float`): its operands widened by `__bfloat162float`
  (exact), the float operation, the result rounded by `__float2bfloat16_rn` (round to
  nearest even); comparisons compare the floats. For + - * / and sqrt that is the
  correctly rounded bfloat16 operation (float has more than twice bfloat16's 8 bits).
  Conversions: from float32 `__float2bfloat16_rn`, from float64 and the integers
  `__double2bfloat16` (one rounding; every int32 is a double), to other types through
  float; constants print as `__float2bfloat16_rn(<exact float>)`; BitCast through
  `__bfloat16_as_ushort` / `__ushort_as_bfloat16`.

Assumes `hidetc.tir.pipeline.lower` ran (flattened, verified). Guarantees: nvcc
(sm_80+) and the emulator (g++ -DHIDETC_EMULATE) compile the same text.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Sequence

import numpy as np

from hidetc.backends.codegen.c import (
    C_TYPES,
    MATH_FUNCTIONS,
    PREC_ATOM,
    PREC_UNARY,
    CPrinter,
    c_name,
    const_text,
)
from hidetc.compute.bitcast import bits_text
from hidetc.tir import intrinsics
from hidetc.tir.functor import Rewriter, collect
from hidetc.tir.ir import (
    CMP_OPS,
    CUDA_INDEX,
    LOGIC_OPS,
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
    Load,
    Select,
    Store,
    UnOp,
    promote,
)

CUDA_INCLUDE_DIR = Path(__file__).resolve().parent / "cuda_include"
HEADER_NAME = "hidetc_cuda.h"
FULL_MASK = "0xffffffffu"
SHARED_MEMORY_LIMIT = 48 * 1024  # bytes of static shared memory per kernel
# dynamic shared memory per block: the largest opt-in of any GPU (sm_90's 227 KiB); the
# templates keep to their target's own (`CudaTarget.shared_optin_bytes`)
DYNAMIC_SHARED_LIMIT = 227 * 1024
DYNAMIC_SHARED_NAME = "hidetc_smem"
SHARED_ALIGN = 16
CUDA_TYPES = {**C_TYPES, "float16": "half", "bfloat16": "__nv_bfloat16"}
F16, BF16, F32 = "float16", "bfloat16", "float32"
HALVES = (F16, BF16)

F16_MATH = frozenset({"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt",
                      "erf", "tanh", "sinh", "cosh", "asinh", "acosh", "atanh", "floor",
                      "ceil", "trunc", "sin", "cos", "tan", "asin", "acos", "atan", "abs",
                      "round", "sigmoid", "rsqrt", "pow", "atan2", "fmod", "fma", "isnan",
                      "isinf"})
_F16_BINOP = {"+": "__hadd_rn", "-": "__hsub_rn", "*": "__hmul_rn", "/": "hidetc_hdiv",
              "%": "hidetc_fmod_float16", "<": "__hlt", "<=": "__hle", ">": "__hgt",
              ">=": "__hge", "==": "__heq", "!=": "__hneu"}
_CUDA_RESERVED = frozenset("""threadIdx blockIdx blockDim gridDim warpSize half half2 dim3
uint3 float2 float4 int2 int4 uint2 uint4 new delete class template this namespace operator
private public protected virtual friend typename using try catch throw explicit mutable
export asm nullptr min max""".split())


def cuda_type(dtype: str) -> str:
    ctype = CUDA_TYPES.get(dtype)
    if ctype is None:
        raise NotImplementedError(f"dtype {dtype!r} is not supported by the CUDA printer")
    return ctype


def _to(e: Expr, dtype: str) -> Expr:
    """`e` converted to `dtype` when a half is involved (C++ converts the rest itself)."""
    if e.dtype == dtype or (e.dtype not in HALVES and dtype not in HALVES):
        return e
    return Cast(e, dtype)


def _in_float(e: Expr) -> Expr:
    """A BinOp, UnOp or math Call on bfloat16 operands as the float operation on the
    widened operands, rounded back to bfloat16 when its result is one (a comparison or
    a predicate stays bool)."""
    def wide(x: Expr) -> Expr:
        return Cast(x, F32) if x.dtype == BF16 else x

    if isinstance(e, BinOp):
        inner: Expr = BinOp(e.op, wide(e.a), wide(e.b))
    elif isinstance(e, UnOp):
        inner = UnOp(e.op, wide(e.a))
    else:
        inner = Call(e.func, tuple(wide(a) for a in e.args),
                     F32 if e.dtype == BF16 else e.dtype)
    return Cast(inner, BF16) if e.dtype == BF16 else inner


class _WrittenThrough(Rewriter):
    """Buffers an intrinsic writes through an address: operand 0 of every intrinsic with
    address operands is its destination (`address_of` counts as written: its use is unknown)."""

    def __init__(self) -> None:
        self.buffers: set[Buffer] = set()

    def visit_Call(self, e: Call) -> Expr:
        if intrinsics.address_args(e.func) and e.args and isinstance(e.args[0], Load):
            self.buffers.add(e.args[0].buffer)
        return super().visit_Call(e)


class CudaPrinter(CPrinter):
    """Prints one lowered cuda Function (see the module docstring)."""

    dynamic_bytes = 0                      # set by `check` (`shared_layout`)
    dynamic_offsets: dict[str, int] = {}

    # per-target hooks -------------------------------------------------------------------
    def ctype(self, dtype: str) -> str:
        return cuda_type(dtype)

    def ident(self, name: str) -> str:
        name = c_name(name)
        return name + "_" if name in _CUDA_RESERVED else name

    def const_str(self, c: Const) -> str:
        if c.dtype == F16:
            return f"__float2half_rn({const_text(Const(float(np.float16(c.value)), 'float32'))})"
        if c.dtype == BF16:   # the bfloat16 value (nearest even) is a float32: exact
            value = float(np.array(c.value, np.float32).astype(BF16))
            return f"__float2bfloat16_rn({const_text(Const(value, F32))})"
        cuda_type(c.dtype)
        return const_text(c)

    def loop_pragma(self, s: For, ind: str) -> list[str]:
        if s.kind == "parallel":
            raise ValueError(f"{self.fn.name}: loop {s.var.name} is 'parallel', a cpu loop "
                             "kind; CUDA kernels distribute work with thread/block indices")
        if s.kind == "rolled":
            return [f"{ind}#pragma unroll 1"]
        return [f"{ind}#pragma unroll"] if s.kind == "unroll" else []

    # expressions ------------------------------------------------------------------------
    def _binop(self, e: BinOp) -> tuple[str, int]:
        if e.op in LOGIC_OPS:
            return super()._binop(e)
        common = promote(e.a.dtype, e.b.dtype) if e.op in CMP_OPS else e.dtype
        a, b = _to(e.a, common), _to(e.b, common)
        if common == BF16:
            return self._expr(_in_float(BinOp(e.op, a, b)))
        if common != F16:
            return super()._binop(e if (a, b) == (e.a, e.b) else BinOp(e.op, a, b))
        if e.op in ("min", "max"):
            return f"hidetc_{e.op}_float16({self.expr(a)}, {self.expr(b)})", PREC_ATOM
        func = _F16_BINOP.get(e.op)
        if func is None:
            raise NotImplementedError(f"'{e.op}' on float16 is not defined in the IR")
        return f"{func}({self.expr(a)}, {self.expr(b)})", PREC_ATOM

    def _unop(self, e: UnOp) -> tuple[str, int]:
        if e.dtype == BF16:
            return self._expr(_in_float(e))
        if e.op == "neg" and e.dtype == F16:
            return f"__hneg({self.expr(e.a)})", PREC_ATOM
        return super()._unop(e)

    def _select(self, e: Select) -> tuple[str, int]:
        a, b = _to(e.a, e.dtype), _to(e.b, e.dtype)
        return super()._select(e if (a, b) == (e.a, e.b) else Select(e.cond, a, b))

    def _cast(self, e: Cast) -> tuple[str, int]:
        src, dst = e.value.dtype, e.dtype
        if src == dst:
            return self._expr(e.value)
        if src == BF16 and dst != F32:          # through float (exact)
            return self._cast(Cast(Cast(e.value, F32), dst))
        if dst == BF16 and src == F16:
            return self._cast(Cast(Cast(e.value, F32), dst))
        value = self.expr(e.value)
        if src == BF16:
            return f"__bfloat162float({value})", PREC_ATOM
        if dst == BF16:
            if src == F32:
                return f"__float2bfloat16_rn({value})", PREC_ATOM
            inner = value if src == "float64" else f"(double)({value})"
            return f"__double2bfloat16({inner})", PREC_ATOM
        if dst == F16:
            if src == "float64":
                return f"__double2half({value})", PREC_ATOM
            inner = value if src == "float32" else f"(float)({value})"
            return f"__float2half_rn({inner})", PREC_ATOM
        if src == F16:
            as_float = f"__half2float({value})"
            return (as_float, PREC_ATOM) if dst == "float32" else (
                f"({self.ctype(dst)}){as_float}", PREC_UNARY)
        return super()._cast(e)

    def _call(self, e: Call) -> tuple[str, int]:
        head, _, dim = e.func.partition(".")
        if head in CUDA_INDEX and dim in ("x", "y", "z"):
            return f"({self.ctype(e.dtype)}){e.func}", PREC_UNARY
        if e.func == "bitcast":
            return self._bitcast(e), PREC_ATOM
        record = intrinsics.lookup(e.func, "cuda")
        if record is None:
            if intrinsics.looks_intrinsic(e.func):
                intrinsics.require(e.func, "cuda")    # raises: unregistered
            return self._math_call(e)
        if record.warp_operands is not None:
            return self._warp_call(e, record.warp_operands), PREC_ATOM
        text = self._intrinsic_call(e, record.address_args)
        if e.func == "address_of":                    # `&buf[i]` itself, no call
            return text[len("address_of"):], PREC_ATOM
        return text, PREC_ATOM

    def _warp_call(self, e: Call, operands: tuple[int, int]) -> str:
        required, optional = operands
        args = [self.expr(a) for a in e.args]
        if len(args) == required:
            args.insert(0, FULL_MASK)
        elif not required + 1 <= len(args) <= required + 1 + optional:
            raise ValueError(f"{e.func} takes {required} operands (full mask) or a mask and "
                             f"{required}..{required + optional} operands, got {len(args)}")
        return f"{e.func}({', '.join(args)})"

    def _bitcast(self, e: Call) -> str:
        """BitCast with bfloat16 on either side: through its 16 bits as uint16."""
        (x,) = e.args
        if BF16 not in (x.dtype, e.dtype):
            return super()._bitcast(e)
        src, value = x.dtype, self.expr(x)
        if src == BF16:
            src, value = "uint16", f"__bfloat16_as_ushort({value})"
        if e.dtype != BF16:
            return bits_text(src, e.dtype, value, self.ctype)
        return f"__ushort_as_bfloat16({bits_text(src, 'uint16', value, self.ctype)})"

    def _math_call(self, e: Call) -> tuple[str, int]:
        dtype = e.args[0].dtype if e.args else e.dtype
        if BF16 in (dtype, e.dtype):
            return self._expr(_in_float(e))
        if dtype == F16 and e.func in F16_MATH:
            args = ", ".join(self.expr(_to(a, F16)) for a in e.args)
            return f"hidetc_{e.func}_float16({args})", PREC_ATOM
        name = MATH_FUNCTIONS.get(dtype, {}).get(e.func)
        if name is None:
            raise NotImplementedError(f"no CUDA function for {e.func!r} on {dtype}")
        return f"{name}({', '.join(self.expr(_to(a, dtype)) for a in e.args)})", PREC_ATOM

    # statements ------------------------------------------------------------------------
    def _evaluate(self, s: Evaluate, ind: str) -> list[str]:
        if isinstance(s.expr, Call) and s.expr.dtype == "void":
            return [f"{ind}{self.expr(s.expr)};"]
        return super()._evaluate(s, ind)

    def _declare(self, s: Declare, ind: str) -> list[str]:
        if s.init is not None and _to(s.init, s.var.dtype) is not s.init:
            s = Declare(s.var, _to(s.init, s.var.dtype))
        return super()._declare(s, ind)

    def _assign(self, s: Assign, ind: str) -> list[str]:
        return super()._assign(Assign(s.var, _to(s.value, s.var.dtype)), ind)

    # shared memory goes through HIDETC_SLD / HIDETC_SST (plain accesses for nvcc; the
    # emulator's sanitizer tracks them for races); addresses stay plain
    def _address(self, e: Load) -> str:
        return f"&{self.ident(e.buffer.name)}[{self._index(e.buffer, e.indices)}]"

    def _load(self, e: Load) -> tuple[str, int]:
        if e.buffer.scope != "shared":
            return super()._load(e)
        name, index = self.ident(e.buffer.name), self._index(e.buffer, e.indices)
        return f"HIDETC_SLD({name}, {index})", PREC_ATOM

    def _store(self, s: Store, ind: str) -> list[str]:
        if s.buffer.scope != "shared":
            return super()._store(s, ind)
        name, index = self.ident(s.buffer.name), self._index(s.buffer, s.indices)
        return [f"{ind}HIDETC_SST({name}, {index}, {self.expr(s.value)});"]

    def _alloc(self, s: Alloc, ind: str) -> list[str]:
        buf = s.buffer
        if not all(isinstance(d, int) or isinstance(d, Const) for d in buf.shape):
            raise NotImplementedError(f"{self.fn.name}: {buf.scope} buffer {buf.name} has a "
                                      "symbolic shape; CUDA arrays need constant sizes")
        numel = max(1, math.prod(int(getattr(d, "value", d)) for d in buf.shape))
        name, ctype = self.ident(buf.name), self.ctype(buf.dtype)
        if buf.scope == "shared" and buf.name in self.dynamic_offsets:
            return [f"{ind}HIDETC_SHARED_SLICE({ctype}, {name}, {numel}, "
                    f"{DYNAMIC_SHARED_NAME}, {self.dynamic_offsets[buf.name]});"]
        decl = f"__align__(16) {ctype} {name}[{numel}];"
        if buf.scope == "shared":
            return [f"{ind}__shared__ {decl}"]
        return [f"{ind}{decl}", f"{ind}HIDETC_LOCAL_POISON({name});"]

    # functions -------------------------------------------------------------------------
    def threads(self) -> int:
        block = self.fn.attr("block")
        if not (isinstance(block, tuple) and len(block) == 3
                and all(isinstance(b, int) and b > 0 for b in block)):
            raise ValueError(f"{self.fn.name}: attr 'block' must be a tuple of 3 positive "
                             f"ints, got {block!r}")
        if math.prod(block) > 1024:
            raise ValueError(f"{self.fn.name}: block {block} has more than 1024 threads")
        return math.prod(block)

    def written_buffers(self) -> set[Buffer]:
        through = _WrittenThrough()
        through(self.fn)
        return through.buffers | set(collect(self.fn).stores)

    def params(self) -> list[str]:
        written = self.written_buffers()
        shared = set(self.fn.attr("may_alias", ()))
        out = []
        for p in self.fn.params:
            name, ctype = self.ident(p.name), self.ctype(p.dtype)
            if isinstance(p, Buffer):
                const = "" if p in written else "const "
                qual = "" if p.name in shared else "__restrict__ "
                out.append(f"{const}{ctype} *{qual}{name}")
            else:
                out.append(f"{ctype} {name}")
        return out

    def check(self) -> None:
        fn = self.fn
        if fn.attr("target") != "cuda":
            raise ValueError(f"{fn.name}: the CUDA printer is for target cuda, got "
                             f"{fn.attr('target')!r}")
        if not fn.attr("flattened", False):
            raise ValueError(f"{fn.name} is not lowered: run hidetc.tir.pipeline.lower")
        if c_name(fn.name) != fn.name or self.ident(fn.name) != fn.name:
            raise ValueError(f"function name {fn.name!r} is not a usable C identifier")
        size, self.dynamic_offsets = shared_layout(fn)
        if size > DYNAMIC_SHARED_LIMIT:
            raise ValueError(f"{fn.name}: {size} bytes of shared memory; no GPU gives a "
                             f"block more than {DYNAMIC_SHARED_LIMIT} bytes")
        self.dynamic_bytes = size

    def function(self) -> str:
        self.check()
        head = (f'extern "C" __global__ void __launch_bounds__({self.threads()})\n'
                f"{self.fn.name}({', '.join(self.params()) or 'void'}) {{")
        first = ([f"  HIDETC_DYNAMIC_SHARED({DYNAMIC_SHARED_NAME}, {self.dynamic_bytes});"]
                 if self.dynamic_bytes else [])
        return "\n".join([head] + first + self.block(self.fn.body, "  ") + ["}"]) + "\n"

    def emu_entry(self) -> str:
        """The emulator's uniform entry (printed inside `#ifdef HIDETC_EMULATE`)."""
        written, args = self.written_buffers(), []
        for i, p in enumerate(self.fn.params):
            ctype = self.ctype(p.dtype)
            if isinstance(p, Buffer):
                const = "" if p in written else "const "
                args.append(f"({const}{ctype} *)args[{i}]")
            else:
                args.append(f"*({ctype} *)args[{i}]")
        return (f'extern "C" void {self.fn.name}_emu_entry(void **args) {{\n'
                f"  {self.fn.name}({', '.join(args)});\n}}\n")


def _constant_shape(b: Buffer) -> bool:
    return all(isinstance(d, (int, Const)) for d in b.shape)


def _nbytes(b: Buffer) -> int:
    return math.prod(int(getattr(d, "value", d)) for d in b.shape) * np.dtype(b.dtype).itemsize


def shared_layout(fn: Function) -> tuple[int, dict[str, int]]:
    """(dynamic shared bytes, {shared buffer name: byte offset}) of `fn`: when its shared
    arrays add up to more than SHARED_MEMORY_LIMIT (static shared memory's), every one
    is a 16-byte-aligned slice of one dynamic shared array, in order of allocation;
    else (0, {}): they stay static arrays."""
    shared = [b for b in collect(fn).allocs if b.scope == "shared" and _constant_shape(b)]
    if sum(_nbytes(b) for b in shared) <= SHARED_MEMORY_LIMIT:
        return 0, {}
    offsets, end = {}, 0
    for b in shared:
        offsets[b.name] = end
        end += -(-_nbytes(b) // SHARED_ALIGN) * SHARED_ALIGN
    return end, offsets


def dynamic_shared_bytes(fn: Function) -> int:
    """The dynamic shared memory a launch of `fn` needs (0: static only)."""
    return shared_layout(fn)[0]


_DECLARED = re.compile(r"\n(\w+)\([^)]*\) \{\n  HIDETC_DYNAMIC_SHARED\(\w+, (\d+)\);")


def declared_dynamic_shared(source: str) -> dict[str, int]:
    """{kernel: dynamic shared bytes} of the kernels of a printed translation unit that
    declare dynamic shared memory (for callers that hold sources, not Functions)."""
    return {name: int(size) for name, size in _DECLARED.findall(source)}


def print_cuda_function(fn: Function) -> str:
    """The CUDA C definition of one lowered cuda Function (see the module docstring)."""
    return CudaPrinter(fn).function()


def print_cuda_module(functions: Sequence[Function], prelude: str = "") -> str:
    """One .cu translation unit: the device header, `prelude`, every kernel, and the
    emulator entries under `#ifdef HIDETC_EMULATE`."""
    printers = [CudaPrinter(fn) for fn in functions]
    parts = [f'/* generated by hidetc (cuda target) */\n#include "{HEADER_NAME}"\n']
    if prelude:
        parts.append(prelude.rstrip("\n") + "\n")
    parts.extend(p.function() for p in printers)
    if printers:
        parts.append("#ifdef HIDETC_EMULATE\n" + "".join(p.emu_entry() for p in printers)
                     + "#endif\n")
    return "\n".join(parts)
